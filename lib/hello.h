/* The guest handshake (SPEC §5): proof that the agent behind a guest socket
 * belongs to one activation of one execution. Shared by the guest agent
 * (src/guest, static), the host bridge (src/bridge) and the sbx-manager
 * (adoption), three binaries. Implementation: lib/hello.c.
 *
 * At activation the sbx-manager draws HELLO_SECRET_LEN random bytes and
 * hands them to the guest (inherited pipe, read once at start) and to the
 * bridge (same way); they live only in those processes' memory. On every
 * new bridge->guest connection, before any operation byte:
 *   bridge -> guest  HELLO {"v":1,"challenge":b64url(32 fresh bytes),
 *                           "sbx":ID,"generation":N,"activation":N}
 *   guest  -> bridge HELLO {"proof":b64url(HMAC-SHA256(secret, msg))}
 * with msg = "tether-guest-hello-v1" 0 sbx 0 gen 0 att 0 challenge, gen and
 * att as decimal text, challenge as the 32 decoded bytes. A guest of another
 * execution or activation answers ERROR "wrong_activation"; a guest without
 * the secret cannot answer a fresh challenge. */
#ifndef TT_HELLO_H
#define TT_HELLO_H

#include <jansson.h>
#include <sodium.h>
#include <stdint.h>

#define HELLO_VERSION 1
#define HELLO_SECRET_LEN 32
#define HELLO_CHALLENGE_LEN 32
#define HELLO_PROOF_LEN crypto_auth_hmacsha256_BYTES
#define HELLO_LABEL "tether-guest-hello-v1"
/* The guest must answer the challenge within this time. */
#define HELLO_TIMEOUT_MS 2000
/* Unpadded base64url of 32 bytes is 43 characters. */
#define HELLO_B64_LEN 43

/* hello_mac: out = HMAC-SHA256(key, label 0 sbx 0 gen 0 att 0 [challenge]),
 * gen and att as decimal text; no challenge part when challenge is NULL. */
void hello_mac(const uint8_t key[HELLO_SECRET_LEN], const char *label,
                             const char *sbx, uint64_t gen, uint32_t att,
                             const uint8_t *challenge, uint8_t out[HELLO_PROOF_LEN]);

/* hello_proof: the guest's answer: hello_mac(secret, HELLO_LABEL, ...). */
void hello_proof(const uint8_t secret[HELLO_SECRET_LEN], const char *sbx,
                               uint64_t gen, uint32_t att,
                               const uint8_t challenge[HELLO_CHALLENGE_LEN],
                               uint8_t out[HELLO_PROOF_LEN]);

/* Adoption of a bridge by a restarted sbx-manager. The bridge accepts only
 * the manager pinned at its start; once that process has exited, a peer of
 * the same uid may take its place by proving the activation's adoption key
 * K = hello_mac(secret, HELLO_ADOPT_KEY_LABEL, sbx, gen, att, no challenge),
 * which the manager derives at activation and keeps in its runtime.db (the
 * secret itself is never stored; K opens no guest):
 *   bridge  -> manager HELLO {"v":1,"adopt_challenge":b64url(32 fresh bytes)}
 *   manager -> bridge  HELLO {"proof":b64url(hello_mac(K, HELLO_ADOPT_LABEL,
 *                             sbx, gen, att, challenge))}
 *   bridge  -> manager HELLO {"adopted":true}, then it closes; the bridge
 *   now pins that peer as its manager. */
#define HELLO_ADOPT_KEY_LABEL "tether-adopt-key-v1"
#define HELLO_ADOPT_LABEL "tether-adopt-v1"

/* hello_adopt_key: K for one activation (see above). */
void hello_adopt_key(const uint8_t secret[HELLO_SECRET_LEN], const char *sbx,
                                   uint64_t gen, uint32_t att, uint8_t out[HELLO_PROOF_LEN]);

/* hello_b64_encode: unpadded base64url of 32 bytes into out (44 bytes). */
void hello_b64_encode(const uint8_t in[32], char out[HELLO_B64_LEN + 1]);

/* hello_b64_decode: exactly 32 bytes from a canonical 43-char encoding;
 * 0 or -1. */
int hello_b64_decode(const char *in, uint8_t out[32]);

/* hello_read_secret: reads exactly HELLO_SECRET_LEN bytes from fd (a pipe
 * the spawner filled and closed) within timeout_ms, then closes fd. Refuses
 * a short or a longer secret. 0, or -1 with errno (EPROTO for a bad size). */
int hello_read_secret(int fd, uint8_t out[HELLO_SECRET_LEN], int timeout_ms);

/* The decoders of HELLO payloads (objects from wire_frame_json), shared so
 * that fuzz/fuzz_hello.c runs the very code the guest and the bridge run. */

/* A bridge's challenge as the guest reads it (sbx borrowed from o). */
struct hello_challenge {
	const char *sbx;
	uint64_t gen;
	uint32_t att;
	uint8_t challenge[HELLO_CHALLENGE_LEN];
};

/* hello_challenge_parse: {"v":HELLO_VERSION,"challenge":b64url(32),
 * "sbx":S,"generation":N,"activation":N (< 2^32)}; 0, or -1 (malformed). */
int hello_challenge_parse(json_t *o, struct hello_challenge *out);

/* hello_proof_parse: exactly {"proof":b64url(32 bytes)} (the guest's
 * answer, a manager's adoption proof); 0, or -1 (malformed). */
int hello_proof_parse(json_t *o, uint8_t out[HELLO_PROOF_LEN]);

/* The encoders of the same payloads (new references, NULL when out of
 * memory). */
/* hello_challenge_json: the bridge's challenge (see hello_challenge_parse). */
json_t *hello_challenge_json(const char *sbx, uint64_t gen, uint32_t att,
                             const uint8_t challenge[HELLO_CHALLENGE_LEN]);
/* hello_proof_json: {"proof":b64url(proof)}. */
json_t *hello_proof_json(const uint8_t proof[HELLO_PROOF_LEN]);
/* hello_adopt_challenge_json: {"v":HELLO_VERSION,"adopt_challenge":b64url}. */
json_t *hello_adopt_challenge_json(const uint8_t challenge[HELLO_CHALLENGE_LEN]);
/* hello_adopt_challenge_parse: the challenge of a bridge's adoption HELLO;
 * 0, or -1 (malformed). */
int hello_adopt_challenge_parse(json_t *o, uint8_t out[HELLO_CHALLENGE_LEN]);

#endif

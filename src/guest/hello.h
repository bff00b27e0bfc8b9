/* The guest handshake (SPEC §5): proof that the agent behind a guest socket
 * belongs to one activation of one execution. Shared, header-only, by the
 * guest agent (src/guest) and the host bridge (src/bridge), which are built
 * into different binaries.
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
#ifndef TT_GUEST_HELLO_H
#define TT_GUEST_HELLO_H

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
static inline void hello_mac(const uint8_t key[HELLO_SECRET_LEN], const char *label,
                             const char *sbx, uint64_t gen, uint32_t att,
                             const uint8_t *challenge, uint8_t out[HELLO_PROOF_LEN])
{
	crypto_auth_hmacsha256_state st;
	char num[24];
	static const uint8_t zero = 0;

	crypto_auth_hmacsha256_init(&st, key, HELLO_SECRET_LEN);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)sbx, strlen(sbx));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	snprintf(num, sizeof(num), "%" PRIu64, gen);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)num, strlen(num));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	snprintf(num, sizeof(num), "%" PRIu32, att);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)num, strlen(num));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	if (challenge != NULL)
		crypto_auth_hmacsha256_update(&st, challenge, HELLO_CHALLENGE_LEN);
	crypto_auth_hmacsha256_final(&st, out);
	/* The state holds key-derived pads. */
	sodium_memzero(&st, sizeof(st));
}

/* hello_proof: the guest's answer: hello_mac(secret, HELLO_LABEL, ...). */
static inline void hello_proof(const uint8_t secret[HELLO_SECRET_LEN], const char *sbx,
                               uint64_t gen, uint32_t att,
                               const uint8_t challenge[HELLO_CHALLENGE_LEN],
                               uint8_t out[HELLO_PROOF_LEN])
{
	hello_mac(secret, HELLO_LABEL, sbx, gen, att, challenge, out);
}

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
static inline void hello_adopt_key(const uint8_t secret[HELLO_SECRET_LEN], const char *sbx,
                                   uint64_t gen, uint32_t att, uint8_t out[HELLO_PROOF_LEN])
{
	hello_mac(secret, HELLO_ADOPT_KEY_LABEL, sbx, gen, att, NULL, out);
}

/* hello_b64_encode: unpadded base64url of 32 bytes into out (44 bytes). */
static inline void hello_b64_encode(const uint8_t in[32], char out[HELLO_B64_LEN + 1])
{
	sodium_bin2base64(out, HELLO_B64_LEN + 1, in, 32,
	                  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

/* hello_b64_decode: exactly 32 bytes from a canonical 43-char encoding;
 * 0 or -1. */
static inline int hello_b64_decode(const char *in, uint8_t out[32])
{
	size_t n = 0;
	const char *end = NULL;
	char back[HELLO_B64_LEN + 1];

	if (in == NULL || strlen(in) != HELLO_B64_LEN ||
	    sodium_base642bin(out, 32, in, HELLO_B64_LEN, NULL, &n, &end,
	                      sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
	    n != 32 || end != in + HELLO_B64_LEN)
		return -1;
	/* Canonical only: one encoding per value (no stray trailing bits). */
	hello_b64_encode(out, back);
	return strcmp(back, in) == 0 ? 0 : -1;
}

/* hello_read_secret: reads exactly HELLO_SECRET_LEN bytes from fd (a pipe
 * the spawner filled and closed) within timeout_ms, then closes fd. Refuses
 * a short or a longer secret. 0, or -1 with errno (EPROTO for a bad size). */
static inline int hello_read_secret(int fd, uint8_t out[HELLO_SECRET_LEN], int timeout_ms)
{
	size_t got = 0;
	uint8_t extra;
	int rc = -1;

	for (;;) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t n;

		int pr = poll(&pf, 1, timeout_ms);

		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0) {
			if (pr == 0)
				errno = ETIMEDOUT;
			break;
		}
		n = got < HELLO_SECRET_LEN ? read(fd, out + got, HELLO_SECRET_LEN - got)
		                           : read(fd, &extra, 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		if (n == 0) {
			if (got == HELLO_SECRET_LEN)
				rc = 0;
			else
				errno = EPROTO;
			break;
		}
		if (got == HELLO_SECRET_LEN) {
			errno = EPROTO; /* more than a secret: refuse */
			break;
		}
		got += (size_t)n;
	}
	close(fd);
	if (rc < 0)
		sodium_memzero(out, HELLO_SECRET_LEN);
	return rc;
}

/* The decoders of HELLO payloads (objects from wire_frame_json), shared so
 * that fuzz/fuzz_hello.c runs the very code the guest and the bridge run. */

/* A bridge's challenge as the guest reads it (sbx borrowed from o). */
struct hello_challenge {
	const char *sbx;
	uint64_t gen;
	uint32_t att;
	uint8_t challenge[HELLO_CHALLENGE_LEN];
};

/* hello_u64_member: a non-negative integer member of o; 0 or -1. */
static inline int hello_u64_member(json_t *o, const char *key, uint64_t *out)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* hello_challenge_parse: {"v":HELLO_VERSION,"challenge":b64url(32),
 * "sbx":S,"generation":N,"activation":N (< 2^32)}; 0, or -1 (malformed). */
static inline int hello_challenge_parse(json_t *o, struct hello_challenge *out)
{
	uint64_t v = 0, gen = 0, att = 0;

	out->sbx = json_string_value(json_object_get(o, "sbx"));
	if (!json_is_object(o) || hello_u64_member(o, "v", &v) < 0 ||
	    v != HELLO_VERSION || out->sbx == NULL ||
	    hello_u64_member(o, "generation", &gen) < 0 ||
	    hello_u64_member(o, "activation", &att) < 0 || att > UINT32_MAX ||
	    hello_b64_decode(json_string_value(json_object_get(o, "challenge")),
	                     out->challenge) < 0)
		return -1;
	out->gen = gen;
	out->att = (uint32_t)att;
	return 0;
}

/* hello_proof_parse: exactly {"proof":b64url(32 bytes)} (the guest's
 * answer, a manager's adoption proof); 0, or -1 (malformed). */
static inline int hello_proof_parse(json_t *o, uint8_t out[HELLO_PROOF_LEN])
{
	if (!json_is_object(o) || json_object_size(o) != 1)
		return -1;
	return hello_b64_decode(json_string_value(json_object_get(o, "proof")), out);
}

#endif

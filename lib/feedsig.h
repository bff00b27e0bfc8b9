/* Signed update feed (SPEC §7): the envelope every feed update travels in
 * from the control plane to a worker's sbx-manager, and its verification.
 * Sign-free: the signing half is in the signer (src/signer/sign.c), which
 * alone holds the feed key; receivers hold only its public half, pinned
 * when the worker was provisioned.
 *
 * Envelope (one per update, as the cp serves it on GET /v1/feed):
 *   {"rev":N,"kind":K,"body":"<JSON text>","sig":"<b64url, 64 bytes>"}
 * sig = Ed25519(feed key, PAE("tether-feed-v1", body)) (PAE as in PASETO,
 * lib/paseto.h). body is the update itself, exactly as signed, with two
 * fields the cp adds for this receiver: "to" (the worker it is for: an
 * update for another worker is refused) and "prev" (the previous
 * revision this worker was sent, 0 for none: a withheld, dropped or
 * reordered update breaks the chain). The outer rev and kind are copies
 * for node-api, which relays and cannot change a byte of body.
 *
 * Receiver rules (feedsig_open): the signature verifies; body is one JSON
 * object (duplicates rejected, at most FEEDSIG_BODY_MAX bytes) with
 * rev > prev >= 0, a known kind, to = this worker, outer rev/kind equal.
 * rev > applied: prev must equal applied (FEEDSIG_APPLY). rev <= applied:
 * a replay (FEEDSIG_REPLAY), answered as before from the record, unless
 * this manager applied other content under that rev (its digest window),
 * then refused. Implementation: lib/feedsig.c. */
#ifndef TT_FEEDSIG_H
#define TT_FEEDSIG_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "claims.h"
#include "err.h"
#include "paseto.h"

#define FEEDSIG_DOMAIN "tether-feed-v1"
#define FEEDSIG_BODY_MAX 16384
#define FEEDSIG_SIG_B64_LEN 86 /* unpadded base64url of 64 bytes */
#define FEEDSIG_MSG_MAX (8 + 2 * 8 + sizeof(FEEDSIG_DOMAIN) + FEEDSIG_BODY_MAX)
#define FEEDSIG_DIGEST_BYTES 32
#define FEEDSIG_SEEN_MAX 1024  /* revisions whose digest a manager keeps */
/* An install's optional "cpu": the sandbox's CPU cap in millicores (1000 =
 * one CPU), as POST /v1/sandboxes took it (docs/API.md); absent or null =
 * the worker's own default (--cpu-millis). Any other value, or one out of
 * these bounds, makes the body malformed: the signer does not sign it and
 * the manager refuses it. */
#define FEEDSIG_CPU_MIN 100
#define FEEDSIG_CPU_MAX 64000

/* The fields of a body the rules look at. */
struct feedsig_head {
	uint64_t rev, prev;
	char kind[16];
	char to[TT_NAME_MAX + 1];
};

/* A receiver's verifier: the pinned key, who it is, and the digests of
 * the last FEEDSIG_SEEN_MAX revisions it accepted (memory only: after a
 * restart, replays older than that are answered as before). */
struct feedsig_state {
	uint8_t pk[PASETO_PK_BYTES];
	char worker[TT_NAME_MAX + 1];
	struct {
		uint64_t rev;
		uint8_t digest[FEEDSIG_DIGEST_BYTES];
	} seen[FEEDSIG_SEEN_MAX];
	size_t seen_next;
};

enum feedsig_verdict {
	FEEDSIG_REFUSED = -1,
	FEEDSIG_APPLY = 0,   /* the next revision in order: apply it */
	FEEDSIG_REPLAY = 1,  /* already applied: answer from the record */
};

/* feedsig_message: PAE(FEEDSIG_DOMAIN, body) into out (cap bytes): the
 * bytes the feed key signs. -1 when body is over FEEDSIG_BODY_MAX. */
int feedsig_message(const uint8_t *body, size_t len, uint8_t *out, size_t cap,
                    size_t *out_len);

/* feedsig_body_parse: body's JSON (new reference) when it is well formed
 * as above (rev, prev, kind, to; an install's cpu within its bounds);
 * NULL + err otherwise. The signer runs it before signing, the receiver
 * after verifying. */
json_t *feedsig_body_parse(const char *body, size_t len,
                           struct feedsig_head *h, struct tt_err *err);

/* feedsig_cpu: an install's "cpu" (u: the update): 0 when absent or
 * null, the millicores when an integer within FEEDSIG_CPU_MIN..MAX, else
 * -1. */
int64_t feedsig_cpu(json_t *u);

/* feedsig_init: a verifier for worker with the k4.public feed key. */
int feedsig_init(struct feedsig_state *st, const char *k4_public,
                 const char *worker, struct tt_err *err);

/* feedsig_open: checks env against the rules above, given the revision
 * the receiver applied last. On APPLY or REPLAY *update is the verified
 * body (new reference), the update to act on, and APPLY notes its
 * digest. On REFUSED *reason is a short code (unsigned, malformed,
 * bad_signature, wrong_worker, mismatch, out_of_order, replay_mismatch)
 * and err says why. */
enum feedsig_verdict feedsig_open(struct feedsig_state *st, json_t *env,
                                  uint64_t applied, json_t **update,
                                  const char **reason, struct tt_err *err);

/* feedsig_refused: logs and counts (tether_feed_refused_total{reason}) a
 * refusal; returns its result entry {"rev","ok":false,"refused","error"}
 * for the receiver's answer (the rev as the envelope claims it). */
json_t *feedsig_refused(json_t *env, const char *reason, const struct tt_err *err);

/* feedsig_pin: the worker's pinned feed key in path (mode 0600): written
 * when absent; when present it must equal k4_public (a worker is
 * provisioned for one control plane). */
int feedsig_pin(const char *path, const char *k4_public, struct tt_err *err);

#endif

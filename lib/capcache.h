/* Receiver-side admission with a bounded cache of verified capabilities
 * (SPEC §3): keyed by the exact token bytes, valid until the token's
 * expiry (+ skew). A hit skips only the signature check and claim parsing;
 * every identity and permission check of decision_decide still runs, and
 * the kid must still be in the key ring. Implementation: lib/capcache.c.
 * Not thread-safe: one cache per event loop. Memory is bounded by the
 * capacity: per entry ~0.7 KiB plus one copy of the token and implicit
 * assertion (at most PASETO_TOKEN_MAX + 1 KiB); only verified tokens are
 * ever inserted. */
#ifndef TT_CAPCACHE_H
#define TT_CAPCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "claims.h"
#include "decision.h"
#include "keyring.h"

struct capcache;

struct capcache_stats {
	uint64_t hits, misses, evictions, expired;
};

/* capcache_new: capacity entries (rounded up internally); NULL on ENOMEM. */
struct capcache *capcache_new(size_t capacity);
void capcache_free(struct capcache *cache);

/* cap_admit: full admission of one token. On a miss: bounds, footer kid,
 * key lookup, signature, claims; caches the verified claims. Then
 * decision_decide. claims_out (may be NULL) receives the claims whenever the
 * token verified. Always returns the decision (never fails). cache may be
 * NULL (no caching). implicit is the PASETO implicit assertion (may be NULL). */
struct tt_decision cap_admit(struct capcache *cache,
                             const struct tt_keyring *kr,
                             const char *token, size_t token_len,
                             const uint8_t *implicit, size_t implicit_len,
                             const struct tt_request *req,
                             const struct tt_installed *rec, int64_t now,
                             struct tt_claims *claims_out);

/* cap_verify: check 1 and claim parsing only (no identity checks), for
 * tools like "tether cap inspect". */
int cap_verify(const struct tt_keyring *kr, const char *token, size_t token_len,
               const uint8_t *implicit, size_t implicit_len,
               struct tt_claims *out, struct tt_err *err);

/* cap_token_kid: the kid the token's footer names ({"kid":"k4.pid.…"});
 * unverified, so it may only be used to pick the key. TT_ERR_MALFORMED
 * when the token or footer is malformed or names no valid kid. */
int cap_token_kid(const char *token, size_t token_len,
                  char kid[PASERK_K4_PID_LEN + 1], struct tt_err *err);

/* cap_mint: signs claims with sk under kid (footer {"kid":…}); caller frees
 * *token_out. Implemented in lib/capmint.c, which only the signer and
 * tests link (a receiver's binary holds no minting code). */
int cap_mint(const uint8_t sk[PASETO_SK_BYTES], const struct tt_claims *c,
             char **token_out, struct tt_err *err);

void capcache_stats(const struct capcache *cache, struct capcache_stats *out);

#endif

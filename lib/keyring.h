/* Verification key bundles: kid -> Ed25519 public key, with a validity
 * window. Receivers hold one; they can verify, never mint.
 * Rotation (SPEC §3): a key is published (and acknowledged) before it signs
 * anything; once it stops signing (not_after) it keeps verifying for
 * TT_CAP_LIFETIME + TT_CAP_SKEW seconds, then is dropped.
 * Implementation: lib/keyring.c. */
#ifndef TT_KEYRING_H
#define TT_KEYRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "paserk.h"

#define TT_KEYRING_MAX 8
#define TT_CAP_LIFETIME 120 /* seconds a capability lives */
#define TT_CAP_SKEW 15      /* seconds of clock skew a receiver allows */

struct tt_key {
	char kid[PASERK_K4_PID_LEN + 1];
	uint8_t pk[PASETO_PK_BYTES];
	int64_t not_before; /* unix seconds: may verify tokens from then on */
	int64_t not_after;  /* unix seconds it stops signing; 0 = still signing */
};

struct tt_keyring {
	struct tt_key keys[TT_KEYRING_MAX];
	size_t n;
};

/* keyring_add: adds or replaces (same kid) a key; computes the kid. */
int keyring_add(struct tt_keyring *kr, const uint8_t pk[PASETO_PK_BYTES],
                int64_t not_before, int64_t not_after, struct tt_err *err);
/* keyring_retire: marks kid as no longer signing from not_after on. */
int keyring_retire(struct tt_keyring *kr, const char *kid, int64_t not_after,
                   struct tt_err *err);
/* keyring_find: the key for kid if it may verify at time now, else NULL. */
const struct tt_key *keyring_find(const struct tt_keyring *kr, const char *kid,
                                  int64_t now);
/* keyring_prune: drops keys whose last token has expired; returns how many. */
size_t keyring_prune(struct tt_keyring *kr, int64_t now);
/* keyring_to_json / keyring_from_json: the bundle as shipped on the update
 * feed: {"keys":[{"kid","public":"k4.public…","not_before","not_after"}]}
 * with RFC 3339 times (null for open). from_json checks each kid. */
char *keyring_to_json(const struct tt_keyring *kr, struct tt_err *err);
int keyring_from_json(struct tt_keyring *kr, const char *json, size_t len,
                      struct tt_err *err);

#endif

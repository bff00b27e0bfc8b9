/* The signer (build/tether-signer): the only process that holds the
 * control plane's private keys, the capability key and the feed key
 * (SPEC §3, §7). Files: main.c (process, seccomp, request loop), sign.c
 * (what it signs and how it checks it first), keygen.c ("tether-signer
 * keygen"). Its client is the cp (src/cp/signer.c). */
#ifndef TT_SIGNER_H
#define TT_SIGNER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"
#include "feedsig.h"
#include "paserk.h"

#define SIGNER_ISS "tether-cp"

/* A key pair and its public forms (sk lives in sodium_malloc memory:
 * guarded, mlocked, zeroed when freed). */
struct signer_key {
	uint8_t *sk; /* 64 bytes */
	char pub[PASERK_K4_PUBLIC_LEN + 1];
	char kid[PASERK_K4_PID_LEN + 1];
};

/* signer_key_load: reads path (k4.secret, 0600), or creates it when
 * absent. */
int signer_key_load(const char *path, struct signer_key *k, struct tt_err *err);
/* signer_key_free: zeroes and frees the secret. */
void signer_key_free(struct signer_key *k);

/* signer_sign_claims: the RESULT {"token","expires_at"} of a "sign"
 * request: fills iss/iat/exp/jti, validates the whole claim set with the
 * receivers' parser, then mints. */
json_t *signer_sign_claims(const struct signer_key *k, json_t *req,
                           struct tt_err *err);
/* signer_feed_sig: sig (FEEDSIG_SIG_B64_LEN + 1) over one feed update
 * body (feedsig.h), after checking the body is one. Also used by tests. */
int signer_feed_sig(const uint8_t sk[PASETO_SK_BYTES], const char *body,
                    size_t len, char sig[FEEDSIG_SIG_B64_LEN + 1],
                    struct tt_err *err);
/* signer_feed_sign: the RESULT {"sig"} of a "feed.sign" {"body"} request. */
json_t *signer_feed_sign(const struct signer_key *k, json_t *req,
                         struct tt_err *err);

/* keygen_main: "tether-signer keygen FILE [--force]" (argv[0] "keygen"). */
int keygen_main(int argc, char **argv);

#endif

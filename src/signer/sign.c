/* What the signer signs (signer.h): capabilities and feed updates, each
 * checked first with the parser its receivers use. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "b64url.h"
#include "capcache.h"
#include "claims.h"
#include "cleanup.h"
#include "keyring.h"
#include "log.h"
#include "signer/signer.h"
#include "timefmt.h"

/* signer_key_load: a missing key is made here, so the secret is never
 * held by the cp process itself. */
int signer_key_load(const char *path, struct signer_key *k, struct tt_err *err)
{
	uint8_t pk[crypto_sign_PUBLICKEYBYTES];

	k->sk = sodium_malloc(PASETO_SK_BYTES);
	if (k->sk == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "sodium_malloc failed");
	if (access(path, F_OK) != 0) {
		crypto_sign_keypair(pk, k->sk);
		if (paserk_secret_file_write(path, k->sk, 0, err) < 0)
			return -1;
		log_info("created signing key %s", path);
	} else if (paserk_secret_file_read(path, k->sk, err) < 0) {
		return -1;
	}
	memcpy(pk, k->sk + 32, sizeof(pk)); /* k4.secret = seed || pk */
	if (paserk_k4_public_encode(pk, k->pub) < 0 ||
	    paserk_k4_pid(pk, k->kid) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "cannot encode public key");
	return 0;
}

/* signer_key_free: sodium_free zeroes before unmapping. */
void signer_key_free(struct signer_key *k)
{
	sodium_free(k->sk);
	k->sk = NULL;
}

/* signer_sign_claims: see signer.h. */
json_t *signer_sign_claims(const struct signer_key *k, json_t *req,
                           struct tt_err *err)
{
	static const char *const reserved[] = { "iss", "iat", "exp", "jti" };
	json_t *in = json_object_get(req, "claims"), *c;
	char iat[TT_RFC3339_MAX], exp[TT_RFC3339_MAX], jti[33];
	uint8_t rnd[16];
	_cleanup_free_ char *payload = NULL;
	_cleanup_free_ char *token = NULL;
	struct tt_claims claims;
	int64_t now = tt_now();

	if (!json_is_object(in)) {
		tt_err_set(err, TT_ERR_MALFORMED, "claims object expected");
		return NULL;
	}
	for (size_t i = 0; i < 4; i++) {
		if (json_object_get(in, reserved[i])) {
			tt_err_set(err, TT_ERR_INVALID, "claim %s is set by the signer",
			           reserved[i]);
			return NULL;
		}
	}
	randombytes_buf(rnd, sizeof(rnd));
	sodium_bin2hex(jti, sizeof(jti), rnd, sizeof(rnd));
	if (rfc3339_format(now, iat) < 0 ||
	    rfc3339_format(now + TT_CAP_LIFETIME, exp) < 0) {
		tt_err_set(err, TT_ERR_INVALID, "clock out of range");
		return NULL;
	}
	c = json_deep_copy(in);
	if (c == NULL || json_object_set_new(c, "iss", json_string(SIGNER_ISS)) ||
	    json_object_set_new(c, "iat", json_string(iat)) ||
	    json_object_set_new(c, "exp", json_string(exp)) ||
	    json_object_set_new(c, "jti", json_string(jti))) {
		json_decref(c);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	payload = json_dumps(c, JSON_COMPACT);
	json_decref(c);
	if (payload == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	if (claims_parse((const uint8_t *)payload, strlen(payload), &claims,
	                 err) < 0)
		return NULL;
	if (cap_mint(k->sk, &claims, &token, err) < 0)
		return NULL;
	return json_pack("{s:s,s:s}", "token", token, "expires_at", exp);
}

/* signer_feed_sig: the body must be an update a receiver would accept
 * the shape of (feedsig_body_parse); then Ed25519 over its PAE. */
int signer_feed_sig(const uint8_t sk[PASETO_SK_BYTES], const char *body,
                    size_t len, char sig[FEEDSIG_SIG_B64_LEN + 1],
                    struct tt_err *err)
{
	static uint8_t msg[FEEDSIG_MSG_MAX];
	uint8_t raw[crypto_sign_BYTES];
	struct feedsig_head h;
	size_t msg_len;
	json_t *o = feedsig_body_parse(body, len, &h, err);

	if (o == NULL)
		return -1;
	json_decref(o);
	if (feedsig_message((const uint8_t *)body, len, msg, sizeof(msg), &msg_len) < 0)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "feed update too large");
	if (crypto_sign_detached(raw, NULL, msg, msg_len, sk) != 0)
		return tt_err_set(err, TT_ERR_SIGNATURE, "Ed25519 failed");
	if (b64url_encode(raw, sizeof(raw), sig, FEEDSIG_SIG_B64_LEN + 1) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "encoding failed");
	return 0;
}

/* signer_feed_sign: {"op":"feed.sign","body":"…"} -> {"sig":"…"}. */
json_t *signer_feed_sign(const struct signer_key *k, json_t *req,
                         struct tt_err *err)
{
	json_t *b = json_object_get(req, "body");
	char sig[FEEDSIG_SIG_B64_LEN + 1];

	if (!json_is_string(b)) {
		tt_err_set(err, TT_ERR_MALFORMED, "body string expected");
		return NULL;
	}
	if (signer_feed_sig(k->sk, json_string_value(b), json_string_length(b), sig,
	                    err) < 0)
		return NULL;
	return json_pack("{s:s}", "sig", sig);
}

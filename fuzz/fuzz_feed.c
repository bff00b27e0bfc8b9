/* libFuzzer target: the manager's feed decoder with signatures
 * (feedsig_open, lib/feedsig.h), as feed.apply runs it: a JSON request
 * {"updates":[envelope…]} (duplicates rejected), each envelope opened in
 * order against the applied revision, which moves on APPLY only.
 * Inputs starting with 'S' are "sign, then open" cases: the rest is an
 * update body, signed with the fuzzer's feed key by the signer's own code
 * (signer_feed_sig) when the signer accepts it, so mutations reach the
 * rules behind the signature too.
 * Invariants: an accepted update verifies under the key, is for w1, its
 * envelope's rev and kind are the signed ones, APPLY names the applied
 * revision as prev and moves past it, REPLAY is at or below it; anything
 * refused carries a reason; a body signed with another key never opens. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "b64url.h"
#include "feedsig.h"
#include "paserk.h"
#include "signer/signer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint8_t fsk[64], fpk[32], osk[64];
static struct feedsig_state st;

/* setup: fixed keys (seed bytes 1 and 2), a verifier for w1. */
static void setup(void)
{
	static int done;
	uint8_t seed[32], opk[32];
	char pub[PASERK_K4_PUBLIC_LEN + 1];

	if (done)
		return;
	done = 1;
	if (sodium_init() < 0)
		abort();
	memset(seed, 1, sizeof(seed));
	crypto_sign_seed_keypair(fpk, fsk, seed);
	memset(seed, 2, sizeof(seed));
	crypto_sign_seed_keypair(opk, osk, seed);
	paserk_k4_public_encode(fpk, pub);
	if (feedsig_init(&st, pub, "w1", NULL) < 0)
		abort();
}

/* check_open: one envelope against applied; the invariants above. */
static void check_open(json_t *env, uint64_t *applied)
{
	struct tt_err err = { 0 };
	const char *why = NULL;
	json_t *u = NULL;
	enum feedsig_verdict v = feedsig_open(&st, env, *applied, &u, &why, &err);
	uint64_t rev, prev;

	if (v == FEEDSIG_REFUSED) {
		if (u != NULL || why == NULL || why[0] == '\0' || err.msg[0] == '\0')
			abort();
		json_decref(feedsig_refused(env, why, &err));
		return;
	}
	if (u == NULL)
		abort();
	{
		const char *body = json_string_value(json_object_get(env, "body"));
		const char *sig = json_string_value(json_object_get(env, "sig"));
		uint8_t raw[64], msg[FEEDSIG_MSG_MAX];
		size_t n = 0, mlen;

		if (body == NULL || sig == NULL ||
		    b64url_decode(sig, strlen(sig), raw, sizeof(raw), &n, NULL) < 0 || n != 64 ||
		    feedsig_message((const uint8_t *)body, json_string_length(json_object_get(env, "body")),
		                    msg, sizeof(msg), &mlen) < 0 ||
		    crypto_sign_verify_detached(raw, msg, mlen, fpk) != 0)
			abort();
	}
	rev = (uint64_t)json_integer_value(json_object_get(u, "rev"));
	prev = (uint64_t)json_integer_value(json_object_get(u, "prev"));
	if (strcmp(json_string_value(json_object_get(u, "to")), "w1") != 0 ||
	    rev != (uint64_t)json_integer_value(json_object_get(env, "rev")) ||
	    strcmp(json_string_value(json_object_get(u, "kind")),
	           json_string_value(json_object_get(env, "kind"))) != 0)
		abort();
	if (v == FEEDSIG_APPLY) {
		if (prev != *applied || rev <= *applied)
			abort();
		*applied = rev;
	} else if (rev > *applied) {
		abort();
	}
	json_decref(u);
}

/* sign_case: body signed with our key opens (or is refused by the rules);
 * signed with the other key it never opens. */
static void sign_case(const uint8_t *data, size_t size)
{
	char sig[FEEDSIG_SIG_B64_LEN + 1], bad[FEEDSIG_SIG_B64_LEN + 1];
	struct feedsig_head h;
	struct tt_err err = { 0 };
	json_t *o, *env;
	uint64_t applied;
	char *body = malloc(size + 1);

	if (body == NULL)
		return;
	memcpy(body, data, size);
	body[size] = '\0';
	if (signer_feed_sig(fsk, body, size, sig, &err) < 0 ||
	    (o = feedsig_body_parse(body, size, &h, &err)) == NULL) {
		free(body);
		return;
	}
	json_decref(o);
	if (signer_feed_sig(osk, body, size, bad, &err) < 0)
		abort();
	env = json_pack("{s:I,s:s,s:s%,s:s}", "rev", (json_int_t)h.rev, "kind", h.kind,
	                "body", body, size, "sig", sig);
	applied = h.prev;
	if (env != NULL)
		check_open(env, &applied);
	json_object_set_new(env, "sig", json_string(bad));
	applied = h.prev;
	if (env != NULL) {
		struct tt_err e2 = { 0 };
		const char *why;
		json_t *u = NULL;

		if (feedsig_open(&st, env, applied, &u, &why, &e2) != FEEDSIG_REFUSED)
			abort();
	}
	json_decref(env);
	free(body);
}

/* LLVMFuzzerTestOneInput: one input; aborts on a broken invariant. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *req, *ups, *env;
	uint64_t applied = 0;
	size_t i;

	setup();
	memset(st.seen, 0, sizeof(st.seen)); /* each input on its own */
	st.seen_next = 0;
	if (size > 0 && data[0] == 'S') {
		sign_case(data + 1, size - 1);
		return 0;
	}
	req = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
	ups = json_object_get(req, "updates");
	if (json_is_integer(json_object_get(req, "applied")))
		applied = (uint64_t)json_integer_value(json_object_get(req, "applied"));
	if (json_is_array(ups) && json_array_size(ups) <= 1000) {
		json_array_foreach(ups, i, env)
			check_open(env, &applied);
	}
	json_decref(req);
	return 0;
}

/* Signed feed updates (lib/feedsig.h): what a manager accepts, and what it
 * refuses: a flipped byte, another key, no signature, another worker's
 * update, a forged envelope, a revision out of order, a replay with other
 * content. Each refusal is set beside the honest update it was made from,
 * which is accepted, so a test cannot pass by refusing everything. The
 * signing half is the signer's own (src/signer/sign.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <sodium.h>

#include "feedsig.h"
#include "paserk.h"
#include "signer/signer.h"

static uint8_t fsk[64], fpk[32], other_sk[64];
static char fpub[PASERK_K4_PUBLIC_LEN + 1];

/* key_pair: a deterministic key pair from one seed byte. */
static void key_pair(uint8_t tag, uint8_t pk[32], uint8_t sk[64])
{
	uint8_t seed[32];

	memset(seed, tag, sizeof(seed));
	crypto_sign_seed_keypair(pk, sk, seed);
}

/* body_of: the body text of an update (malloc'd). */
static char *body_of(uint64_t rev, uint64_t prev, const char *to, const char *sbx)
{
	json_t *u = json_pack("{s:I,s:I,s:s,s:s,s:s,s:s,s:i}", "rev", (json_int_t)rev,
	                      "prev", (json_int_t)prev, "to", to, "kind", "retire",
	                      "worker", to, "sandbox", sbx, "generation", 1);
	char *s = json_dumps(u, JSON_COMPACT | JSON_SORT_KEYS);

	json_decref(u);
	assert_non_null(s);
	return s;
}

/* envelope: {rev,kind,body,sig} of body signed with sk. */
static json_t *envelope(const uint8_t *sk, uint64_t rev, const char *body)
{
	char sig[FEEDSIG_SIG_B64_LEN + 1];
	struct tt_err err = { 0 };

	assert_int_equal(signer_feed_sig(sk, body, strlen(body), sig, &err), 0);
	return json_pack("{s:I,s:s,s:s,s:s}", "rev", (json_int_t)rev, "kind", "retire",
	                 "body", body, "sig", sig);
}

/* open_env: feedsig_open of env (consumed); the verdict, reason in why. */
static int open_env(struct feedsig_state *st, json_t *env, uint64_t applied,
                    const char **why)
{
	struct tt_err err = { 0 };
	json_t *u = NULL;
	int v = feedsig_open(st, env, applied, &u, why, &err);

	if (v == FEEDSIG_REFUSED) {
		assert_null(u);
		assert_true(err.msg[0] != '\0');
	} else {
		assert_non_null(u);
	}
	json_decref(u);
	json_decref(env);
	return v;
}

/* verifier: a fresh state for worker w1 with the feed key. */
static void verifier(struct feedsig_state *st)
{
	struct tt_err err = { 0 };

	assert_int_equal(feedsig_init(st, fpub, "w1", &err), 0);
}

/* test_good: a signed update in order is accepted, with its body. */
static void test_good(void **state)
{
	static struct feedsig_state st;
	struct tt_err err = { 0 };
	char *b = body_of(5, 3, "w1", "sbx_a");
	json_t *u = NULL;
	const char *why;

	(void)state;
	verifier(&st);
	json_t *env = envelope(fsk, 5, b);
	assert_int_equal(feedsig_open(&st, env, 3, &u, &why, &err), FEEDSIG_APPLY);
	assert_string_equal(json_string_value(json_object_get(u, "sandbox")), "sbx_a");
	assert_int_equal(json_integer_value(json_object_get(u, "rev")), 5);
	json_decref(u);
	json_decref(env);
	free(b);
}

/* test_tampered: a flipped byte anywhere in body or sig, another key, or
 * no signature at all: refused; the untouched update still passes. */
static void test_tampered(void **state)
{
	static struct feedsig_state st;
	char *b = body_of(2, 1, "w1", "sbx_a");
	const char *why;
	size_t n = strlen(b);

	(void)state;
	verifier(&st);
	for (size_t i = 0; i < n; i++) { /* every byte of the body */
		char *t = strdup(b);
		json_t *env = envelope(fsk, 2, b);

		t[i] ^= 0x01;
		json_object_set_new(env, "body", json_string(t));
		assert_int_equal(open_env(&st, env, 1, &why), FEEDSIG_REFUSED);
		assert_true(strcmp(why, "bad_signature") == 0 || strcmp(why, "malformed") == 0);
		free(t);
	}
	for (size_t i = 0; i < FEEDSIG_SIG_B64_LEN; i += 7) { /* bytes of the sig */
		json_t *env = envelope(fsk, 2, b);
		char *sig = strdup(json_string_value(json_object_get(env, "sig")));

		sig[i] = sig[i] == 'A' ? 'B' : 'A';
		json_object_set_new(env, "sig", json_string(sig));
		assert_int_equal(open_env(&st, env, 1, &why), FEEDSIG_REFUSED);
		free(sig);
	}
	assert_int_equal(open_env(&st, envelope(other_sk, 2, b), 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "bad_signature");
	/* unsigned: the update as it travelled before the feed was signed */
	json_t *plain = json_loads(b, 0, NULL);
	assert_int_equal(open_env(&st, plain, 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "unsigned");
	/* a sig without its body, an extra field, a sig of the wrong size */
	json_t *env = envelope(fsk, 2, b);
	json_object_del(env, "body");
	assert_int_equal(open_env(&st, env, 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "malformed");
	env = envelope(fsk, 2, b);
	json_object_set_new(env, "keys", json_array());
	assert_int_equal(open_env(&st, env, 1, &why), FEEDSIG_REFUSED);
	env = envelope(fsk, 2, b);
	json_object_set_new(env, "sig", json_string("AAAA"));
	assert_int_equal(open_env(&st, env, 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "malformed");
	/* honest */
	assert_int_equal(open_env(&st, envelope(fsk, 2, b), 1, &why), FEEDSIG_APPLY);
	free(b);
}

/* test_relabelled: node-api may not change the envelope's rev or kind,
 * nor hand one worker's update to another. */
static void test_relabelled(void **state)
{
	static struct feedsig_state st;
	char *b = body_of(2, 1, "w1", "sbx_a"), *b2 = body_of(2, 1, "w2", "sbx_a");
	const char *why;
	json_t *env;

	(void)state;
	verifier(&st);
	env = envelope(fsk, 2, b);
	json_object_set_new(env, "rev", json_integer(9));
	assert_int_equal(open_env(&st, env, 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "mismatch");
	env = envelope(fsk, 2, b);
	json_object_set_new(env, "kind", json_string("keys"));
	assert_int_equal(open_env(&st, env, 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "mismatch");
	assert_int_equal(open_env(&st, envelope(fsk, 2, b2), 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "wrong_worker");
	assert_int_equal(open_env(&st, envelope(fsk, 2, b), 1, &why), FEEDSIG_APPLY);
	free(b);
	free(b2);
}

/* test_order: the chain: the next update must name the applied one as
 * prev (a skipped, withheld or reordered update breaks it). */
static void test_order(void **state)
{
	static struct feedsig_state st;
	char *b3 = body_of(3, 2, "w1", "sbx_a"), *b4 = body_of(4, 3, "w1", "sbx_a");
	const char *why;

	(void)state;
	verifier(&st);
	/* applied 2: rev 4 (prev 3) came before 3 */
	assert_int_equal(open_env(&st, envelope(fsk, 4, b4), 2, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "out_of_order");
	assert_int_equal(open_env(&st, envelope(fsk, 3, b3), 2, &why), FEEDSIG_APPLY);
	assert_int_equal(open_env(&st, envelope(fsk, 4, b4), 3, &why), FEEDSIG_APPLY);
	/* applied 1: rev 3 says it follows 2, which never came */
	static struct feedsig_state st2;
	verifier(&st2);
	assert_int_equal(open_env(&st2, envelope(fsk, 3, b3), 1, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "out_of_order");
	free(b3);
	free(b4);
}

/* test_replay: the same update again is a replay (answered from the
 * record); other content under an applied revision is refused. */
static void test_replay(void **state)
{
	static struct feedsig_state st;
	char *a = body_of(7, 6, "w1", "sbx_a"), *b = body_of(7, 6, "w1", "sbx_b");
	const char *why;

	(void)state;
	verifier(&st);
	assert_int_equal(open_env(&st, envelope(fsk, 7, a), 6, &why), FEEDSIG_APPLY);
	assert_int_equal(open_env(&st, envelope(fsk, 7, a), 7, &why), FEEDSIG_REPLAY);
	assert_int_equal(open_env(&st, envelope(fsk, 7, a), 9, &why), FEEDSIG_REPLAY);
	assert_int_equal(open_env(&st, envelope(fsk, 7, b), 9, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "replay_mismatch");
	/* a replay is still verified first */
	assert_int_equal(open_env(&st, envelope(other_sk, 7, a), 9, &why), FEEDSIG_REFUSED);
	assert_string_equal(why, "bad_signature");
	free(a);
	free(b);
}

/* test_signer_checks: the signer signs only well-formed update bodies. */
static void test_signer_checks(void **state)
{
	static const char *const bad[] = {
		"[]", "{}", "{\"rev\":1,\"prev\":0,\"kind\":\"x\"}",
		"{\"rev\":1,\"prev\":1,\"kind\":\"x\",\"to\":\"w1\"}",
		"{\"rev\":0,\"prev\":0,\"kind\":\"x\",\"to\":\"w1\"}",
		"{\"rev\":2,\"prev\":1,\"kind\":\"x\",\"to\":\"w 1\"}",
		"{\"rev\":2,\"rev\":3,\"prev\":1,\"kind\":\"x\",\"to\":\"w1\"}",
		"{\"rev\":2,\"prev\":1,\"kind\":\"x\",\"to\":\"w1\"} x",
	};
	char sig[FEEDSIG_SIG_B64_LEN + 1];
	struct tt_err err = { 0 };
	const char *ok = "{\"rev\":2,\"prev\":1,\"kind\":\"x\",\"to\":\"w1\"}";
	char *big = malloc(FEEDSIG_BODY_MAX + 64);

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(signer_feed_sig(fsk, bad[i], strlen(bad[i]), sig, &err), -1);
	snprintf(big, FEEDSIG_BODY_MAX + 64, "{\"rev\":2,\"prev\":1,\"kind\":\"x\","
	         "\"to\":\"w1\",\"pad\":\"%0*d\"}", FEEDSIG_BODY_MAX, 0);
	assert_int_equal(signer_feed_sig(fsk, big, strlen(big), sig, &err), -1);
	assert_int_equal(signer_feed_sig(fsk, ok, strlen(ok), sig, &err), 0);
	free(big);
}

/* install_body: an install body for w1 with cpu_json spliced in ("" =
 * none), into buf. */
static const char *install_body(char *buf, size_t cap, const char *cpu_json)
{
	snprintf(buf, cap, "{\"rev\":2,\"prev\":1,\"kind\":\"install\",\"to\":\"w1\","
	         "\"sandbox\":\"sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa\",\"generation\":1%s}",
	         cpu_json);
	return buf;
}

/* test_install_cpu: an install's cpu is signed and opened only within
 * its bounds (or absent, or null); the same body with a bad cpu is
 * refused by the signer, and by a receiver when signed anyway. */
static void test_install_cpu(void **state)
{
	static const char *const good[] = { "", ",\"cpu\":null", ",\"cpu\":100",
	                                    ",\"cpu\":250", ",\"cpu\":64000" };
	static const char *const bad[] = { ",\"cpu\":99", ",\"cpu\":0", ",\"cpu\":-250",
	                                   ",\"cpu\":64001", ",\"cpu\":0.5",
	                                   ",\"cpu\":\"250\"", ",\"cpu\":true",
	                                   ",\"cpu\":1e400" };
	char body[512], sig[FEEDSIG_SIG_B64_LEN + 1], msg[FEEDSIG_MSG_MAX];
	uint8_t raw[64];
	size_t mlen;
	struct feedsig_state st;
	struct tt_err err = { 0 };
	const char *why;
	json_t *u, *env;

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		install_body(body, sizeof(body), good[i]);
		assert_int_equal(signer_feed_sig(fsk, body, strlen(body), sig, &err), 0);
		verifier(&st);
		env = json_pack("{s:i,s:s,s:s,s:s}", "rev", 2, "kind", "install", "body",
		                body, "sig", sig);
		assert_int_equal(feedsig_open(&st, env, 1, &u, &why, &err), FEEDSIG_APPLY);
		assert_int_equal(feedsig_cpu(u), i < 2 ? 0 : atoi(good[i] + 7));
		json_decref(u);
		json_decref(env);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		install_body(body, sizeof(body), bad[i]);
		assert_int_equal(signer_feed_sig(fsk, body, strlen(body), sig, &err), -1);
		/* signed by the key all the same (a signer without the check):
		 * the receiver's own parse refuses it */
		assert_int_equal(feedsig_message((const uint8_t *)body, strlen(body),
		                                 (uint8_t *)msg, sizeof(msg), &mlen), 0);
		crypto_sign_detached(raw, NULL, (const uint8_t *)msg, mlen, fsk);
		sodium_bin2base64(sig, sizeof(sig), raw, sizeof(raw),
		                  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
		verifier(&st);
		assert_int_equal(open_env(&st, json_pack("{s:i,s:s,s:s,s:s}", "rev", 2, "kind",
		                 "install", "body", body, "sig", sig), 1, &why),
		                 FEEDSIG_REFUSED);
		assert_string_equal(why, "malformed");
	}
	/* the bound is the install's: another kind's cpu is not looked at */
	snprintf(body, sizeof(body), "{\"rev\":2,\"prev\":1,\"kind\":\"retire\","
	         "\"to\":\"w1\",\"cpu\":\"x\"}");
	assert_int_equal(signer_feed_sig(fsk, body, strlen(body), sig, &err), 0);
}

/* test_pin: the first key is pinned; the same one is accepted again,
 * another one refused. */
static void test_pin(void **state)
{
	char dir[] = "/tmp/tt-feedpin.XXXXXX", path[64], other[PASERK_K4_PUBLIC_LEN + 1];
	uint8_t pk2[32], sk2[64];
	struct tt_err err = { 0 };

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/feed.pub", dir);
	key_pair(9, pk2, sk2);
	paserk_k4_public_encode(pk2, other);
	assert_int_equal(feedsig_pin(path, fpub, &err), 0);
	assert_int_equal(feedsig_pin(path, fpub, &err), 0);
	assert_int_equal(feedsig_pin(path, other, &err), -1);
	assert_int_equal(err.code, TT_ERR_CONFLICT);
	assert_int_equal(feedsig_pin(path, "k4.public.nope", &err), -1);
	unlink(path);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_good),
		cmocka_unit_test(test_tampered),
		cmocka_unit_test(test_relabelled),
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_replay),
		cmocka_unit_test(test_signer_checks),
		cmocka_unit_test(test_install_cpu),
		cmocka_unit_test(test_pin),
	};
	uint8_t pk[32];

	if (sodium_init() < 0)
		return 1;
	key_pair(1, fpk, fsk);
	key_pair(2, pk, other_sk);
	paserk_k4_public_encode(fpk, fpub);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

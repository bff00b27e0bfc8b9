/* Key ring: validity windows, rotation (an old key verifies until
 * not_after + 135 s, then is dropped), the JSON bundle and its checks, and
 * end to end with real signatures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "keyring.h"
#include "paseto.h"

#define T0 1800000000LL /* 2027-01-15T08:00:00Z: an arbitrary "now" */
/* One bundle entry: kid, public, not_before, not_after (JSON literals). */
#define KEY_FMT "{\"kid\":\"%s\",\"public\":\"%s\",\"not_before\":%s,\"not_after\":%s}"
/* ONE: a bundle of one key, formatted into buf. */
#define ONE(kid, pub, nb, na) \
	(snprintf(buf, sizeof(buf), "{\"keys\":[" KEY_FMT "]}", kid, pub, nb, na), buf)

/* key_pair: a deterministic key pair from one seed byte. */
static void key_pair(uint8_t tag, uint8_t pk[32], uint8_t sk[64])
{
	uint8_t seed[32];

	memset(seed, tag, sizeof(seed));
	crypto_sign_seed_keypair(pk, sk, seed);
}

/* test_window: not_before - skew .. not_after + lifetime + skew. */
static void test_window(void **state)
{
	struct tt_keyring kr = { .n = 0 };
	uint8_t pk[32], sk[64];
	char kid[PASERK_K4_PID_LEN + 1];
	struct tt_err err = { 0 };

	(void)state;
	key_pair(1, pk, sk);
	assert_int_equal(paserk_k4_pid(pk, kid), 0);
	assert_int_equal(keyring_add(&kr, pk, T0, 0, &err), 0);
	assert_int_equal(kr.n, 1);
	assert_string_equal(kr.keys[0].kid, kid);
	assert_null(keyring_find(&kr, kid, T0 - TT_CAP_SKEW - 1));
	assert_non_null(keyring_find(&kr, kid, T0 - TT_CAP_SKEW));
	assert_non_null(keyring_find(&kr, kid, T0));
	assert_non_null(keyring_find(&kr, kid, T0 + 10 * 365 * 86400LL));
	assert_null(keyring_find(&kr, "k4.pid.nope", T0));
	assert_null(keyring_find(&kr, NULL, T0));
	/* retire: verifies up to not_after + 135 s inclusive, not a second more */
	assert_int_equal(keyring_retire(&kr, kid, T0 + 1000, &err), 0);
	assert_non_null(keyring_find(&kr, kid, T0 + 1000));
	assert_non_null(keyring_find(&kr, kid, T0 + 1000 + 135));
	assert_null(keyring_find(&kr, kid, T0 + 1000 + 136));
	assert_int_equal(keyring_retire(&kr, "k4.pid.nope", T0, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	assert_int_equal(keyring_retire(&kr, kid, T0 - 1, &err), -1);
	assert_int_equal(err.code, TT_ERR_INVALID);
	/* nonsense windows and times are refused */
	assert_int_equal(keyring_add(&kr, pk, T0, T0 - 1, &err), -1);
	assert_int_equal(keyring_add(&kr, pk, -1, 0, &err), -1);
	assert_int_equal(keyring_add(&kr, pk, INT64_MAX, 0, &err), -1);
	assert_int_equal(kr.n, 1);
	sodium_memzero(sk, sizeof(sk));
}

/* test_rotation: B published ahead, A retired when B starts signing; A's
 * tokens verify for 135 s more, then A is pruned and its tokens refused. */
static void test_rotation(void **state)
{
	struct tt_keyring kr = { .n = 0 };
	uint8_t pka[32], ska[64], pkb[32], skb[64];
	char kida[PASERK_K4_PID_LEN + 1], kidb[PASERK_K4_PID_LEN + 1];
	struct tt_err err = { 0 };
	char *tok_a = NULL, *tok_b = NULL;
	struct paseto_msg m;
	const int64_t switch_at = T0 + 600;

	(void)state;
	key_pair(1, pka, ska);
	key_pair(2, pkb, skb);
	paserk_k4_pid(pka, kida);
	paserk_k4_pid(pkb, kidb);
	assert_int_equal(keyring_add(&kr, pka, T0, 0, &err), 0);
	/* B is published 5 minutes before it signs */
	assert_int_equal(keyring_add(&kr, pkb, switch_at, 0, &err), 0);
	assert_null(keyring_find(&kr, kidb, switch_at - 300));
	assert_int_equal(keyring_prune(&kr, switch_at - 300), 0);
	assert_int_equal(kr.n, 2); /* pending keys are not pruned */
	assert_int_equal(keyring_retire(&kr, kida, switch_at, &err), 0);
	assert_int_equal(paseto_v4_sign(ska, (const uint8_t *)"a", 1, NULL, 0,
	                                NULL, 0, &tok_a, &err), 0);
	assert_int_equal(paseto_v4_sign(skb, (const uint8_t *)"b", 1, NULL, 0,
	                                NULL, 0, &tok_b, &err), 0);
	/* just after the switch both verify */
	for (int64_t now = switch_at; now <= switch_at + 135; now += 45) {
		const struct tt_key *ka = keyring_find(&kr, kida, now);
		const struct tt_key *kb = keyring_find(&kr, kidb, now);

		assert_non_null(ka);
		assert_non_null(kb);
		assert_int_equal(paseto_v4_verify(ka->pk, tok_a, strlen(tok_a), NULL,
		                                  0, &m, &err), 0);
		paseto_msg_free(&m);
		assert_int_equal(paseto_v4_verify(kb->pk, tok_b, strlen(tok_b), NULL,
		                                  0, &m, &err), 0);
		paseto_msg_free(&m);
		/* keys are not interchangeable */
		assert_int_equal(paseto_v4_verify(kb->pk, tok_a, strlen(tok_a), NULL,
		                                  0, &m, &err), -1);
		assert_int_equal(keyring_prune(&kr, now), 0);
	}
	/* 136 s after: A is gone, B stays */
	assert_null(keyring_find(&kr, kida, switch_at + 136));
	assert_int_equal(keyring_prune(&kr, switch_at + 136), 1);
	assert_int_equal(kr.n, 1);
	assert_string_equal(kr.keys[0].kid, kidb);
	assert_null(keyring_find(&kr, kida, switch_at));
	assert_non_null(keyring_find(&kr, kidb, switch_at + 136));
	free(tok_a);
	free(tok_b);
	sodium_memzero(ska, sizeof(ska));
	sodium_memzero(skb, sizeof(skb));
}

/* test_add_replace_full: same kid replaces; the ring has a fixed size. */
static void test_add_replace_full(void **state)
{
	struct tt_keyring kr = { .n = 0 };
	uint8_t pk[32], sk[64];
	struct tt_err err = { 0 };

	(void)state;
	for (int i = 0; i < TT_KEYRING_MAX; i++) {
		key_pair((uint8_t)(10 + i), pk, sk);
		assert_int_equal(keyring_add(&kr, pk, T0, 0, &err), 0);
	}
	assert_int_equal(kr.n, TT_KEYRING_MAX);
	key_pair(10, pk, sk);
	assert_int_equal(keyring_add(&kr, pk, T0 + 5, T0 + 10, &err), 0);
	assert_int_equal(kr.n, TT_KEYRING_MAX);
	assert_int_equal(kr.keys[0].not_before, T0 + 5);
	key_pair(99, pk, sk);
	assert_int_equal(keyring_add(&kr, pk, T0, 0, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	sodium_memzero(sk, sizeof(sk));
}

/* test_json_round_trip: to_json then from_json gives the same ring. */
static void test_json_round_trip(void **state)
{
	struct tt_keyring kr = { .n = 0 }, back;
	uint8_t pk[32], sk[64];
	struct tt_err err = { 0 };
	char *json;

	(void)state;
	key_pair(1, pk, sk);
	assert_int_equal(keyring_add(&kr, pk, T0, T0 + 600, &err), 0);
	key_pair(2, pk, sk);
	assert_int_equal(keyring_add(&kr, pk, T0 + 600, 0, &err), 0);
	json = keyring_to_json(&kr, &err);
	assert_non_null(json);
	assert_non_null(strstr(json, "\"not_after\":null"));
	assert_non_null(strstr(json, "\"not_before\":\"2027-01-15T08:00:00Z\""));
	memset(&back, 0xa5, sizeof(back));
	assert_int_equal(keyring_from_json(&back, json, strlen(json), &err), 0);
	assert_int_equal(back.n, 2);
	for (size_t i = 0; i < 2; i++) {
		assert_string_equal(back.keys[i].kid, kr.keys[i].kid);
		assert_memory_equal(back.keys[i].pk, kr.keys[i].pk, 32);
		assert_int_equal(back.keys[i].not_before, kr.keys[i].not_before);
		assert_int_equal(back.keys[i].not_after, kr.keys[i].not_after);
	}
	free(json);
	/* the empty ring */
	kr.n = 0;
	json = keyring_to_json(&kr, &err);
	assert_string_equal(json, "{\"keys\":[]}");
	assert_int_equal(keyring_from_json(&back, json, strlen(json), &err), 0);
	assert_int_equal(back.n, 0);
	free(json);
	sodium_memzero(sk, sizeof(sk));
}

/* bundle_fails: from_json refuses s and leaves the ring untouched. */
static void bundle_fails(const char *s, enum tt_errc code)
{
	struct tt_keyring kr = { .n = 0 };
	uint8_t pk[32], sk[64];
	struct tt_err err = { 0 };

	key_pair(3, pk, sk);
	assert_int_equal(keyring_add(&kr, pk, T0, 0, &err), 0);
	if (keyring_from_json(&kr, s, strlen(s), &err) == 0)
		fail_msg("accepted bundle: %s", s);
	assert_int_equal(err.code, code);
	assert_int_equal(kr.n, 1);
	assert_memory_equal(kr.keys[0].pk, pk, 32);
	sodium_memzero(sk, sizeof(sk));
}

/* test_json_refused: a kid that is not its key's, duplicates, bad types,
 * bad times, too many keys, oversized input. The honest bundle built from
 * the same parts is accepted first, so each refusal is for its one fault. */
static void test_json_refused(void **state)
{
	uint8_t pka[32], pkb[32], sk[64];
	char puba[PASERK_K4_PUBLIC_LEN + 1], pubb[PASERK_K4_PUBLIC_LEN + 1];
	char kida[PASERK_K4_PID_LEN + 1], kidb[PASERK_K4_PID_LEN + 1];
	char buf[8192];
	struct tt_keyring kr;
	struct tt_err err = { 0 };

	(void)state;
	key_pair(1, pka, sk);
	key_pair(2, pkb, sk);
	sodium_memzero(sk, sizeof(sk));
	paserk_k4_public_encode(pka, puba);
	paserk_k4_public_encode(pkb, pubb);
	paserk_k4_pid(pka, kida);
	paserk_k4_pid(pkb, kidb);

	/* honest */
	const char *ok = ONE(kida, puba, "\"2027-01-15T08:00:00Z\"", "null");
	assert_int_equal(keyring_from_json(&kr, ok, strlen(ok), &err), 0);
	assert_int_equal(kr.n, 1);
	assert_int_equal(kr.keys[0].not_before, T0);
	/* a kid that belongs to another key */
	bundle_fails(ONE(kidb, puba, "\"2027-01-15T08:00:00Z\"", "null"),
	             TT_ERR_MALFORMED);
	/* not a k4.public key; a secret-looking key; a wrong version */
	bundle_fails(ONE(kida, "k4.public.AAAA", "null", "null"), TT_ERR_MALFORMED);
	char v3[PASERK_K4_PUBLIC_LEN + 1];
	memcpy(v3, puba, sizeof(v3));
	v3[1] = '3';
	bundle_fails(ONE(kida, v3, "null", "null"), TT_ERR_MALFORMED);
	/* bad times, and a window that ends before it starts */
	bundle_fails(ONE(kida, puba, "\"yesterday\"", "null"), TT_ERR_MALFORMED);
	bundle_fails(ONE(kida, puba, "1800000000", "null"), TT_ERR_MALFORMED);
	bundle_fails(ONE(kida, puba, "\"2027-01-15T08:00:00Z\"",
	                 "\"2027-01-15T07:00:00Z\""), TT_ERR_INVALID);
	/* duplicate JSON member, duplicate kid, extra and missing members */
	snprintf(buf, sizeof(buf),
	         "{\"keys\":[{\"kid\":\"%s\",\"kid\":\"%s\",\"public\":\"%s\","
	         "\"not_before\":null,\"not_after\":null}]}", kida, kida, puba);
	bundle_fails(buf, TT_ERR_MALFORMED);
	snprintf(buf, sizeof(buf), "{\"keys\":[" KEY_FMT "," KEY_FMT "]}",
	         kida, puba, "null", "null", kida, puba, "null", "null");
	bundle_fails(buf, TT_ERR_MALFORMED);
	snprintf(buf, sizeof(buf),
	         "{\"keys\":[{\"kid\":\"%s\",\"public\":\"%s\",\"not_before\":null,"
	         "\"not_after\":null,\"admin\":true}]}", kida, puba);
	bundle_fails(buf, TT_ERR_MALFORMED);
	snprintf(buf, sizeof(buf),
	         "{\"keys\":[{\"kid\":\"%s\",\"public\":\"%s\",\"not_before\":null}]}",
	         kida, puba);
	bundle_fails(buf, TT_ERR_MALFORMED);
	/* shapes */
	bundle_fails("", TT_ERR_MALFORMED);
	bundle_fails("[]", TT_ERR_MALFORMED);
	bundle_fails("{\"keys\":{}}", TT_ERR_MALFORMED);
	bundle_fails("{\"keys\":[1]}", TT_ERR_MALFORMED);
	bundle_fails("{\"keys\":[]", TT_ERR_MALFORMED);
	bundle_fails("{\"keys\":[],\"keys\":[]}", TT_ERR_MALFORMED);
	/* more keys than the ring holds */
	size_t pos = (size_t)snprintf(buf, sizeof(buf), "{\"keys\":[");
	for (int i = 0; i <= TT_KEYRING_MAX; i++)
		pos += (size_t)snprintf(buf + pos, sizeof(buf) - pos, "%s{}",
		                        i ? "," : "");
	snprintf(buf + pos, sizeof(buf) - pos, "]}");
	bundle_fails(buf, TT_ERR_TOO_LARGE);
	/* oversized input is refused before parsing */
	static char huge[20000];
	memset(huge, ' ', sizeof(huge) - 1);
	memcpy(huge, "{\"keys\":[]}", 11);
	bundle_fails(huge, TT_ERR_TOO_LARGE);
}

/* main: runs the tests as one group (TAP via CMOCKA_MESSAGE_OUTPUT). */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_window),
		cmocka_unit_test(test_rotation),
		cmocka_unit_test(test_add_replace_full),
		cmocka_unit_test(test_json_round_trip),
		cmocka_unit_test(test_json_refused),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Admission with the verified-capability cache (lib/capcache.c), with real
 * Ed25519 keys and real PASETO tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "capcache.h"
#include "paseto.h"
#include "timefmt.h"
#include "testutil.h"

#define SBX   "sbx_abcdefghijklmnopqrstuvwxyz"
#define OTHER "sbx_zyxwvutsrqponmlkjihgfedcba"

struct env {
	uint8_t pk[PASETO_PK_BYTES], sk[PASETO_SK_BYTES];
	struct tt_keyring kr;
	struct tt_claims c;
	struct tt_request req;
	struct tt_installed rec;
	int64_t now;
};

/* setup: one signing key in the ring, a gen-7 control capability, a
 * matching record, an exec request. */
static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct tt_err err;

	if (e == NULL || sodium_init() < 0)
		return -1;
	crypto_sign_keypair(e->pk, e->sk);
	e->now = tt_now();
	if (keyring_add(&e->kr, e->pk, e->now - 1000, 0, &err) < 0)
		return -1;
	tu_claims_control(&e->c, SBX, e->now, 7, 1, TT_OP_EXEC);
	tu_request_exec(&e->req, SBX);
	e->rec.present = true;
	e->rec.id = e->c.id;
	*state = e;
	return 0;
}

/* teardown: zeroes the secret key. */
static int teardown(void **state)
{
	struct env *e = *state;

	sodium_memzero(e->sk, sizeof(e->sk));
	free(e);
	return 0;
}

/* mint: a token for c (caller frees). */
static char *mint(const struct env *e, const struct tt_claims *c)
{
	return tu_mint(e->sk, c);
}

/* admit: cap_admit on a NUL-terminated token. */
static struct tt_decision admit(struct capcache *cc, const struct env *e,
                                const char *tok, int64_t now,
                                struct tt_claims *out)
{
	return cap_admit(cc, &e->kr, tok, strlen(tok), NULL, 0, &e->req,
	                 &e->rec, now, out);
}

/* expect: verdict and reason. */
static void expect(struct tt_decision d, enum tt_verdict v, enum tt_reason r)
{
	if (d.verdict != v || d.reason != r)
		fail_msg("got %s/%s, want %s/%s", decision_verdict_name(d.verdict),
		         decision_reason_name(d.reason), decision_verdict_name(v),
		         decision_reason_name(r));
}

/* b64: unpadded base64url of len bytes (static buffer). */
static const char *b64(const uint8_t *b, size_t len)
{
	static char out[1024];

	sodium_bin2base64(out, sizeof(out), b, len,
	                  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	return out;
}

/* flip_char: swaps one base64url character for another valid one (a
 * middle character carries 6 full bits, so the encoding stays canonical). */
static void flip_char(char *tok, size_t pos)
{
	tok[pos] = tok[pos] == 'A' ? 'B' : 'A';
}

/* test_honest_allowed: miss, then hit, both Allow with the claims. */
static void test_honest_allowed(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(16);
	struct capcache_stats st;
	struct tt_claims out;
	char *tok = mint(e, &e->c);
	struct tt_decision d;

	assert_non_null(cc);
	assert_memory_equal(tok, "v4.public.", 10);
	memset(&out, 0, sizeof(out));
	d = admit(cc, e, tok, e->now, &out);
	expect(d, TT_ALLOW, TT_R_OK);
	assert_int_equal(d.installed_generation, 7);
	assert_string_equal(out.id.sbx, SBX);
	assert_int_equal(out.exp, e->c.exp);
	memset(&out, 0, sizeof(out));
	expect(admit(cc, e, tok, e->now, &out), TT_ALLOW, TT_R_OK);
	assert_string_equal(out.id.sbx, SBX);
	capcache_stats(cc, &st);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.hits, 1);
	/* No cache at all: same answer. */
	expect(admit(NULL, e, tok, e->now, NULL), TT_ALLOW, TT_R_OK);
	free(tok);
	capcache_free(cc);
}

/* test_tampered_payload: one changed payload byte -> bad_signature, and
 * the honest token still passes through the same cache. */
static void test_tampered_payload(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(16);
	char *tok = mint(e, &e->c), *bad = strdup(tok);

	flip_char(bad, 10 + 20);
	expect(admit(cc, e, bad, e->now, NULL), TT_DENY, TT_R_BAD_SIGNATURE);
	expect(admit(cc, e, bad, e->now, NULL), TT_DENY, TT_R_BAD_SIGNATURE);
	expect(admit(cc, e, tok, e->now, NULL), TT_ALLOW, TT_R_OK);
	free(bad);
	free(tok);
	capcache_free(cc);
}

/* test_tampered_signature: a changed signature byte -> bad_signature. */
static void test_tampered_signature(void **state)
{
	struct env *e = *state;
	char *tok = mint(e, &e->c), *bad = strdup(tok);
	char *dot = strrchr(bad, '.');

	/* A few characters before the footer separator are signature bytes. */
	flip_char(bad, (size_t)(dot - bad) - 5);
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_BAD_SIGNATURE);
	free(bad);
	free(tok);
}

/* with_footer: tok with its footer replaced by f (caller frees). */
static char *with_footer(const char *tok, const char *f)
{
	const char *dot = strrchr(tok, '.');
	const char *enc = b64((const uint8_t *)f, strlen(f));
	size_t head = (size_t)(dot - tok) + 1;
	char *out = malloc(head + strlen(enc) + 1);

	assert_non_null(out);
	memcpy(out, tok, head);
	strcpy(out + head, enc);
	return out;
}

/* test_tampered_footer: a footer naming the same kid but with different
 * bytes fails the signature (the footer is signed); broken footers are
 * malformed; a footer naming another kid is unknown_key. */
static void test_tampered_footer(void **state)
{
	struct env *e = *state;
	char *tok = mint(e, &e->c), *bad;
	char kid[PASERK_K4_PID_LEN + 1], f[256];
	struct paseto_msg m = { 0 };
	struct tt_err err = { 0 };

	assert_int_equal(paserk_k4_pid(e->pk, kid), 0);
	/* cap_mint's footer is exactly {"kid":"k4.pid.…"} */
	assert_int_equal(paseto_v4_footer(tok, strlen(tok), &m, &err), 0);
	snprintf(f, sizeof(f), "{\"kid\":\"%s\"}", kid);
	assert_string_equal((const char *)m.footer, f);
	paseto_msg_free(&m);

	snprintf(f, sizeof(f), "{\"kid\":\"%s\" }", kid);
	bad = with_footer(tok, f);
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_BAD_SIGNATURE);
	free(bad);

	snprintf(f, sizeof(f), "{\"kid\":\"%s\",\"kid\":\"%s\"}", kid, kid);
	bad = with_footer(tok, f);
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_MALFORMED);
	free(bad);

	bad = with_footer(tok, "{\"kod\":1}");
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_MALFORMED);
	free(bad);

	bad = with_footer(tok, "not json");
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_MALFORMED);
	free(bad);

	bad = with_footer(tok, "{\"kid\":\"k4.pid.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}");
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_UNKNOWN_KEY);
	free(bad);

	/* No footer at all. */
	bad = strdup(tok);
	*strrchr(bad, '.') = '\0';
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_MALFORMED);
	free(bad);
	free(tok);
}

/* test_unknown_kid: a token signed by a key the ring does not hold. */
static void test_unknown_kid(void **state)
{
	struct env *e = *state;
	struct env other = *e;
	char *tok;
	struct tt_err err = { 0 };
	struct tt_claims out;

	crypto_sign_keypair(other.pk, other.sk);
	tok = mint(&other, &e->c);
	expect(admit(NULL, e, tok, e->now, NULL), TT_DENY, TT_R_UNKNOWN_KEY);
	assert_int_equal(cap_verify(&e->kr, tok, strlen(tok), NULL, 0, &out, &err), -1);
	assert_int_equal(err.code, TT_ERR_UNKNOWN_KEY);
	/* A key outside its window is unknown too. */
	free(tok);
	tok = mint(e, &e->c);
	expect(admit(NULL, e, tok, e->now - 2000, NULL), TT_DENY, TT_R_UNKNOWN_KEY);
	free(tok);
	sodium_memzero(other.sk, sizeof(other.sk));
}

/* test_malformed_tokens: framing errors. */
static void test_malformed_tokens(void **state)
{
	struct env *e = *state;
	char *tok = mint(e, &e->c), *bad = strdup(tok), *big;

	memcpy(bad, "v3", 2);
	expect(admit(NULL, e, bad, e->now, NULL), TT_DENY, TT_R_MALFORMED);
	expect(admit(NULL, e, "", e->now, NULL), TT_DENY, TT_R_MALFORMED);
	expect(admit(NULL, e, "v4.public.", e->now, NULL), TT_DENY, TT_R_MALFORMED);
	big = malloc(PASETO_TOKEN_MAX + 2);
	memset(big, 'A', PASETO_TOKEN_MAX + 1);
	memcpy(big, "v4.public.", 10);
	big[PASETO_TOKEN_MAX + 1] = '\0';
	expect(admit(NULL, e, big, e->now, NULL), TT_DENY, TT_R_MALFORMED);
	free(big);
	free(bad);
	free(tok);
}

/* test_implicit_assertion_is_part_of_key: a token cached under one
 * implicit assertion is not a hit under another (the signature covers it). */
static void test_implicit_assertion_is_part_of_key(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(16);
	char kid[PASERK_K4_PID_LEN + 1], footer[128], *payload, *tok = NULL;
	struct tt_err err = { 0 };
	struct capcache_stats st;
	struct tt_decision d;

	assert_int_equal(paserk_k4_pid(e->pk, kid), 0);
	snprintf(footer, sizeof(footer), "{\"kid\":\"%s\"}", kid);
	payload = claims_to_json(&e->c, &err);
	assert_non_null(payload);
	assert_int_equal(paseto_v4_sign(e->sk, (uint8_t *)payload, strlen(payload),
	                                (uint8_t *)footer, strlen(footer),
	                                (const uint8_t *)"node-1", 6, &tok, &err), 0);
	d = cap_admit(cc, &e->kr, tok, strlen(tok), (const uint8_t *)"node-1", 6,
	              &e->req, &e->rec, e->now, NULL);
	expect(d, TT_ALLOW, TT_R_OK);
	d = cap_admit(cc, &e->kr, tok, strlen(tok), (const uint8_t *)"node-2", 6,
	              &e->req, &e->rec, e->now, NULL);
	expect(d, TT_DENY, TT_R_BAD_SIGNATURE);
	d = cap_admit(cc, &e->kr, tok, strlen(tok), NULL, 0, &e->req, &e->rec,
	              e->now, NULL);
	expect(d, TT_DENY, TT_R_BAD_SIGNATURE);
	d = cap_admit(cc, &e->kr, tok, strlen(tok), (const uint8_t *)"node-1", 6,
	              &e->req, &e->rec, e->now, NULL);
	expect(d, TT_ALLOW, TT_R_OK);
	capcache_stats(cc, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.misses, 3);
	free(payload);
	free(tok);
	capcache_free(cc);
}

/* test_hit_enforces_identity: the same cached token, judged against a
 * changed record or request, gets the changed answer. */
static void test_hit_enforces_identity(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(16);
	char *tok = mint(e, &e->c);
	struct capcache_stats st;
	struct tt_decision d;

	expect(admit(cc, e, tok, e->now, NULL), TT_ALLOW, TT_R_OK);
	e->rec.id.gen = 8; /* the receiver installed the next execution */
	d = admit(cc, e, tok, e->now, NULL);
	expect(d, TT_REFRESH_ROUTE, TT_R_STALE_EXECUTION);
	assert_int_equal(d.installed_generation, 8);
	e->rec.id.gen = 7;
	e->rec.retired = true;
	expect(admit(cc, e, tok, e->now, NULL), TT_REFRESH_ROUTE, TT_R_RETIRED);
	e->rec.retired = false;
	e->req.op = TT_OP_FS_WRITE;
	expect(admit(cc, e, tok, e->now, NULL), TT_DENY, TT_R_OP_NOT_PERMITTED);
	e->req.op = TT_OP_EXEC;
	e->req.sbx = OTHER;
	expect(admit(cc, e, tok, e->now, NULL), TT_DENY, TT_R_OTHER_SANDBOX);
	e->req.sbx = SBX;
	e->req.receiver = TT_RCV_GATEWAY;
	expect(admit(cc, e, tok, e->now, NULL), TT_DENY, TT_R_WRONG_AUDIENCE);
	e->req.receiver = TT_RCV_NODE;
	/* each remaining identity field of the record, alone */
	strcpy(e->rec.id.wrk, "w2");
	expect(admit(cc, e, tok, e->now, NULL), TT_REFRESH_ROUTE, TT_R_WRONG_WORKER);
	strcpy(e->rec.id.wrk, "w1");
	strcpy(e->rec.id.sst, "microvm");
	expect(admit(cc, e, tok, e->now, NULL), TT_REFRESH_ROUTE,
	       TT_R_WRONG_SUBSTRATE);
	strcpy(e->rec.id.sst, "ns");
	strcpy(e->rec.id.pod, "pod-1");
	expect(admit(cc, e, tok, e->now, NULL), TT_REFRESH_ROUTE, TT_R_WRONG_POD);
	e->rec.id.pod[0] = '\0';
	e->rec.id.att = 2;
	expect(admit(cc, e, tok, e->now, NULL), TT_REFRESH_ROUTE,
	       TT_R_STALE_ACTIVATION);
	e->rec.id.att = 1;
	e->rec.present = false;
	expect(admit(cc, e, tok, e->now, NULL), TT_REFRESH_ROUTE,
	       TT_R_NOT_INSTALLED);
	e->rec.present = true;
	/* expiry is judged on every hit, not only at insertion */
	expect(admit(cc, e, tok, e->c.exp + TT_CAP_SKEW + 1, NULL), TT_DENY,
	       TT_R_EXPIRED);
	expect(admit(cc, e, tok, e->now, NULL), TT_ALLOW, TT_R_OK);
	capcache_stats(cc, &st);
	assert_int_equal(st.misses, 3);
	assert_int_equal(st.hits, 10);
	assert_int_equal(st.expired, 1);
	free(tok);
	capcache_free(cc);
}

/* test_dropped_key_invalidates_hit: once the key leaves the ring, the
 * cached token is refused, and stays refused. */
static void test_dropped_key_invalidates_hit(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(16);
	char *tok = mint(e, &e->c);
	struct tt_err err = { 0 };

	expect(admit(cc, e, tok, e->now, NULL), TT_ALLOW, TT_R_OK);
	expect(admit(cc, e, tok, e->now, NULL), TT_ALLOW, TT_R_OK);
	assert_int_equal(keyring_retire(&e->kr, e->kr.keys[0].kid,
	                                e->now - 500, &err), 0);
	assert_int_equal(keyring_prune(&e->kr, e->now), 1);
	expect(admit(cc, e, tok, e->now, NULL), TT_DENY, TT_R_UNKNOWN_KEY);
	expect(admit(cc, e, tok, e->now, NULL), TT_DENY, TT_R_UNKNOWN_KEY);
	free(tok);
	capcache_free(cc);
}

/* test_eviction_at_capacity: a full cache evicts to admit a new token;
 * every honest token is still allowed. */
static void test_eviction_at_capacity(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(4);
	struct capcache_stats st;
	char *toks[6];

	for (int i = 0; i < 6; i++) {
		struct tt_claims c = e->c;

		snprintf(c.jti, sizeof(c.jti), "j%d", i);
		toks[i] = mint(e, &c);
		expect(admit(cc, e, toks[i], e->now, NULL), TT_ALLOW, TT_R_OK);
	}
	capcache_stats(cc, &st);
	assert_int_equal(st.misses, 6);
	assert_int_equal(st.evictions, 2);
	/* The newest is cached. */
	expect(admit(cc, e, toks[5], e->now, NULL), TT_ALLOW, TT_R_OK);
	capcache_stats(cc, &st);
	assert_int_equal(st.hits, 1);
	for (int i = 0; i < 6; i++)
		free(toks[i]);
	capcache_free(cc);
}

/* test_expired_evicted_first: when full, an expired entry goes before any
 * live one. */
static void test_expired_evicted_first(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(2);
	struct capcache_stats st;
	struct tt_claims old = e->c, live = e->c, next = e->c;
	char *a, *b, *c;
	int64_t later = e->now + 100;

	old.iat = e->now - 110;
	old.exp = e->now + 10;
	strcpy(old.jti, "old");
	strcpy(live.jti, "live");
	strcpy(next.jti, "next");
	a = mint(e, &old);
	b = mint(e, &live);
	c = mint(e, &next);
	expect(admit(cc, e, a, e->now, NULL), TT_ALLOW, TT_R_OK);
	expect(admit(cc, e, b, e->now, NULL), TT_ALLOW, TT_R_OK);
	/* Touch a so CLOCK alone would keep it. */
	expect(admit(cc, e, a, e->now, NULL), TT_ALLOW, TT_R_OK);
	expect(admit(cc, e, c, later, NULL), TT_ALLOW, TT_R_OK);
	capcache_stats(cc, &st);
	assert_int_equal(st.expired, 1);
	assert_int_equal(st.evictions, 0);
	/* b survived: a hit. */
	expect(admit(cc, e, b, later, NULL), TT_ALLOW, TT_R_OK);
	capcache_stats(cc, &st);
	assert_int_equal(st.hits, 2);
	free(a);
	free(b);
	free(c);
	capcache_free(cc);
}

/* test_expired_not_served: a cached token past exp + skew is denied as
 * expired, dropped, and not cached again; at exp + skew it is allowed. */
static void test_expired_not_served(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(16);
	char *tok = mint(e, &e->c);
	struct capcache_stats st;

	expect(admit(cc, e, tok, e->now, NULL), TT_ALLOW, TT_R_OK);
	expect(admit(cc, e, tok, e->c.exp + TT_CAP_SKEW, NULL), TT_ALLOW, TT_R_OK);
	expect(admit(cc, e, tok, e->c.exp + TT_CAP_SKEW + 1, NULL), TT_DENY,
	       TT_R_EXPIRED);
	expect(admit(cc, e, tok, e->c.exp + TT_CAP_SKEW + 1, NULL), TT_DENY,
	       TT_R_EXPIRED);
	capcache_stats(cc, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.expired, 1);
	assert_int_equal(st.misses, 3);
	free(tok);
	capcache_free(cc);
}

/* test_failures_not_cached: garbage and forged tokens take no entries: a
 * 2-entry cache holding two honest tokens keeps both. */
static void test_failures_not_cached(void **state)
{
	struct env *e = *state;
	struct capcache *cc = capcache_new(2);
	struct capcache_stats st;
	struct tt_claims c2 = e->c;
	char *a = mint(e, &e->c), *b;

	strcpy(c2.jti, "j2");
	b = mint(e, &c2);
	expect(admit(cc, e, a, e->now, NULL), TT_ALLOW, TT_R_OK);
	expect(admit(cc, e, b, e->now, NULL), TT_ALLOW, TT_R_OK);
	for (int i = 0; i < 200; i++) {
		char *bad = strdup(a);

		flip_char(bad, 10 + (size_t)(i % 100));
		admit(cc, e, bad, e->now, NULL);
		free(bad);
		admit(cc, e, "v4.public.garbage", e->now, NULL);
	}
	expect(admit(cc, e, a, e->now, NULL), TT_ALLOW, TT_R_OK);
	expect(admit(cc, e, b, e->now, NULL), TT_ALLOW, TT_R_OK);
	capcache_stats(cc, &st);
	assert_int_equal(st.evictions, 0);
	assert_int_equal(st.hits, 2);
	free(a);
	free(b);
	capcache_free(cc);
}

/* test_cap_verify: check 1 + parse, no identity checks. */
static void test_cap_verify(void **state)
{
	struct env *e = *state;
	char *tok = mint(e, &e->c), *bad = strdup(tok);
	struct tt_claims out;
	struct tt_err err = { 0 };

	assert_int_equal(cap_verify(&e->kr, tok, strlen(tok), NULL, 0, &out, &err), 0);
	assert_string_equal(out.id.sbx, SBX);
	assert_int_equal(out.id.gen, 7);
	flip_char(bad, 15);
	assert_int_equal(cap_verify(&e->kr, bad, strlen(bad), NULL, 0, &out, &err), -1);
	assert_int_equal(err.code, TT_ERR_SIGNATURE);
	free(bad);
	free(tok);
}

/* test_mint_refuses_bad_claims: nothing malformed gets signed. */
static void test_mint_refuses_bad_claims(void **state)
{
	struct env *e = *state;
	struct tt_claims c = e->c;
	struct tt_err err = { 0 };
	char *tok = NULL;

	c.exp = c.iat + 3600;
	assert_int_equal(cap_mint(e->sk, &c, &tok, &err), -1);
	assert_null(tok);
}

/* main: runs the cases, TAP output when CMOCKA_MESSAGE_OUTPUT=TAP. */
int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
		T(test_honest_allowed),
		T(test_tampered_payload),
		T(test_tampered_signature),
		T(test_tampered_footer),
		T(test_unknown_kid),
		T(test_malformed_tokens),
		T(test_implicit_assertion_is_part_of_key),
		T(test_hit_enforces_identity),
		T(test_dropped_key_invalidates_hit),
		T(test_eviction_at_capacity),
		T(test_expired_evicted_first),
		T(test_expired_not_served),
		T(test_failures_not_cached),
		T(test_cap_verify),
		T(test_mint_refuses_bad_claims),
#undef T
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

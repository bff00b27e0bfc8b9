/* PASETO v4.public and strict base64url: the official vectors (4-S-* must
 * verify and re-sign byte for byte, 4-F-* must fail) and hostile tokens. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <sodium.h>

#include "b64url.h"
#include "paseto.h"
#include "testutil.h"

/* hex: decodes a hex field of exactly len bytes. */
static void hex(json_t *t, const char *field, uint8_t *out, size_t len)
{
	assert_int_equal(tu_hex(t, field, out, len), len);
}

/* str: a string field, "" for null. */
static const char *str(json_t *t, const char *field)
{
	const char *s = json_string_value(json_object_get(t, field));

	return s != NULL ? s : "";
}

/* test_vectors_success: 4-S-* verify, give payload and footer, re-sign. */
static void test_vectors_success(void **state)
{
	json_t *root, *tests = tu_vectors_load("v4.json", &root), *t;
	size_t i;
	int seen = 0;

	(void)state;
	json_array_foreach(tests, i, t) {
		const char *name = str(t, "name");
		const char *tok = str(t, "token"), *payload = str(t, "payload");
		const char *footer = str(t, "footer"), *ia = str(t, "implicit-assertion");
		uint8_t pk[32], sk[64];
		struct paseto_msg m;
		struct tt_err err = { 0 };
		char *again = NULL;

		if (strncmp(name, "4-S-", 4) != 0)
			continue;
		seen++;
		hex(t, "public-key", pk, sizeof(pk));
		hex(t, "secret-key", sk, sizeof(sk));
		if (paseto_v4_verify(pk, tok, strlen(tok), (const uint8_t *)ia,
		                     strlen(ia), &m, &err) < 0)
			fail_msg("%s: %s", name, err.msg);
		assert_int_equal(m.payload_len, strlen(payload));
		assert_memory_equal(m.payload, payload, m.payload_len);
		assert_string_equal((char *)m.footer, footer);
		paseto_msg_free(&m);

		assert_int_equal(paseto_v4_sign(sk, (const uint8_t *)payload,
		                                strlen(payload), (const uint8_t *)footer,
		                                strlen(footer), (const uint8_t *)ia,
		                                strlen(ia), &again, &err), 0);
		assert_string_equal(again, tok);
		free(again);

		/* the footer alone, and the unverified decode, agree */
		assert_int_equal(paseto_v4_footer(tok, strlen(tok), &m, &err), 0);
		assert_null(m.payload);
		assert_string_equal((char *)m.footer, footer);
		paseto_msg_free(&m);
		assert_int_equal(paseto_v4_decode_unverified(tok, strlen(tok), &m, &err), 0);
		assert_memory_equal(m.payload, payload, m.payload_len);
		paseto_msg_free(&m);

		/* a wrong implicit assertion breaks the signature */
		assert_int_equal(paseto_v4_verify(pk, tok, strlen(tok),
		                                  (const uint8_t *)"x", 1, &m, &err), -1);
		assert_int_equal(err.code, TT_ERR_SIGNATURE);
		sodium_memzero(sk, sizeof(sk));
	}
	assert_int_equal(seen, 3);
	json_decref(root);
}

/* test_vectors_failure: every 4-F-* fails through the public API, with the
 * vector's own key when it has a public one, else with a fixed key. */
static void test_vectors_failure(void **state)
{
	json_t *root, *tests = tu_vectors_load("v4.json", &root), *t;
	size_t i;
	int seen = 0;

	(void)state;
	json_array_foreach(tests, i, t) {
		const char *name = str(t, "name"), *tok = str(t, "token");
		const char *ia = str(t, "implicit-assertion");
		uint8_t pk[32];
		struct paseto_msg m;
		struct tt_err err = { 0 };

		if (strncmp(name, "4-F-", 4) != 0)
			continue;
		seen++;
		if (json_object_get(t, "public-key") != NULL)
			hex(t, "public-key", pk, sizeof(pk));
		else
			hex(t, "key", pk, sizeof(pk));
		assert_true(json_is_true(json_object_get(t, "expect-fail")));
		if (paseto_v4_verify(pk, tok, strlen(tok), (const uint8_t *)ia,
		                     strlen(ia), &m, &err) == 0)
			fail_msg("%s verified", name);
		assert_true(err.code == TT_ERR_MALFORMED || err.code == TT_ERR_SIGNATURE);
		paseto_msg_free(&m);
	}
	assert_int_equal(seen, 5);
	json_decref(root);
}

/* The fixed key pair and a good token for the hostile cases. */
struct fixture {
	uint8_t pk[32], sk[64];
	char *tok;
};

static const char PAYLOAD[] = "{\"sub\":\"alice\",\"exp\":\"2030-01-01T00:00:00Z\"}";
static const char FOOTER[] = "{\"kid\":\"k4.pid.test\"}";
static const char IMPLICIT[] = "bind";

/* setup: a seed-derived key pair and a signed token. */
static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	uint8_t seed[32];
	struct tt_err err = { 0 };

	if (f == NULL)
		return -1;
	memset(seed, 7, sizeof(seed));
	crypto_sign_seed_keypair(f->pk, f->sk, seed);
	if (paseto_v4_sign(f->sk, (const uint8_t *)PAYLOAD, strlen(PAYLOAD),
	                   (const uint8_t *)FOOTER, strlen(FOOTER),
	                   (const uint8_t *)IMPLICIT, strlen(IMPLICIT), &f->tok,
	                   &err) < 0)
		return -1;
	*state = f;
	return 0;
}

/* teardown: frees the fixture, zeroing the secret key. */
static int teardown(void **state)
{
	struct fixture *f = *state;

	sodium_memzero(f->sk, sizeof(f->sk));
	free(f->tok);
	free(f);
	return 0;
}

/* verify_code: verifies tok with the fixture key; returns the error code. */
static enum tt_errc verify_code(struct fixture *f, const char *tok, size_t len)
{
	struct paseto_msg m;
	struct tt_err err = { 0 };
	int rc = paseto_v4_verify(f->pk, tok, len, (const uint8_t *)IMPLICIT,
	                          strlen(IMPLICIT), &m, &err);

	paseto_msg_free(&m);
	if (rc == 0)
		return TT_OK;
	assert_int_not_equal(err.code, TT_OK);
	assert_true(err.msg[0] != '\0');
	return err.code;
}

/* test_honest: the good token verifies and round-trips payload and footer. */
static void test_honest(void **state)
{
	struct fixture *f = *state;
	struct paseto_msg m;
	struct tt_err err = { 0 };

	assert_int_equal(paseto_v4_verify(f->pk, f->tok, strlen(f->tok),
	                                  (const uint8_t *)IMPLICIT,
	                                  strlen(IMPLICIT), &m, &err), 0);
	assert_string_equal((char *)m.payload, PAYLOAD);
	assert_string_equal((char *)m.footer, FOOTER);
	paseto_msg_free(&m);
	assert_null(m.payload);
}

/* test_structure: truncation, padding, prefixes, dots, empty footer. */
static void test_structure(void **state)
{
	struct fixture *f = *state;
	size_t len = strlen(f->tok);
	char buf[PASETO_TOKEN_MAX + 64];
	const char *dot = strrchr(f->tok, '.');
	size_t body_end = (size_t)(dot - f->tok);

	assert_int_equal(verify_code(f, f->tok, len), TT_OK);
	/* truncated: at every length the token must fail */
	for (size_t n = 0; n < len; n++)
		assert_int_not_equal(verify_code(f, f->tok, n), TT_OK);
	/* no footer (body only) breaks the signature, not the parser */
	assert_int_equal(verify_code(f, f->tok, body_end), TT_ERR_SIGNATURE);
	/* empty footer after the dot */
	assert_int_equal(verify_code(f, f->tok, body_end + 1), TT_ERR_MALFORMED);
	/* padding, trailing garbage, whitespace, extra sections */
	snprintf(buf, sizeof(buf), "%s=", f->tok);
	assert_int_equal(verify_code(f, buf, strlen(buf)), TT_ERR_MALFORMED);
	snprintf(buf, sizeof(buf), "%s\n", f->tok);
	assert_int_equal(verify_code(f, buf, strlen(buf)), TT_ERR_MALFORMED);
	snprintf(buf, sizeof(buf), "%s.", f->tok);
	assert_int_equal(verify_code(f, buf, strlen(buf)), TT_ERR_MALFORMED);
	snprintf(buf, sizeof(buf), "%s.e30", f->tok);
	assert_int_equal(verify_code(f, buf, strlen(buf)), TT_ERR_MALFORMED);
	snprintf(buf, sizeof(buf), "%.*s==.%s", (int)body_end, f->tok, dot + 1);
	assert_int_equal(verify_code(f, buf, strlen(buf)), TT_ERR_MALFORMED);
	/* NUL inside: the length says where the token ends, not the NUL */
	memcpy(buf, f->tok, len);
	buf[20] = '\0';
	assert_int_equal(verify_code(f, buf, len), TT_ERR_MALFORMED);
	/* wrong prefixes */
	const char *pfx[] = { "v4.local.", "v3.public.", "V4.public.", "v4.publi.",
	                      "v4public.", ".public." };
	for (size_t i = 0; i < sizeof(pfx) / sizeof(pfx[0]); i++) {
		snprintf(buf, sizeof(buf), "%s%s", pfx[i], f->tok + 10);
		assert_int_equal(verify_code(f, buf, strlen(buf)), TT_ERR_MALFORMED);
	}
	/* standard base64 characters instead of base64url */
	memcpy(buf, f->tok, len + 1);
	buf[15] = '+';
	assert_int_equal(verify_code(f, buf, len), TT_ERR_MALFORMED);
}

/* flip_spare: sets a spare trailing bit in the last character of the
 * encoded section [start, end); returns 0 if the section has no spare bits. */
static int flip_spare(char *tok, size_t start, size_t end)
{
	const char alpha[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
	size_t rem = (end - start) % 4;
	int v;

	if (rem == 0)
		return 0;
	v = (int)(strchr(alpha, tok[end - 1]) - alpha);
	assert_int_equal(v & (rem == 2 ? 0xf : 0x3), 0); /* canonical: zero */
	tok[end - 1] = alpha[v | 1];
	return 1;
}

/* test_noncanonical: body and footer whose last character has its unused
 * trailing bits set: the same bytes to a lax decoder, refused here. Payload
 * lengths 1 and 3 and footer lengths 1 and 2 leave 2 or 4 spare bits. */
static void test_noncanonical(void **state)
{
	struct fixture *f = *state;
	const size_t plens[] = { 1, 3 }, flens[] = { 1, 2 };
	int tested = 0;

	for (size_t a = 0; a < 2; a++) {
		for (size_t b = 0; b < 2; b++) {
			char *tok = NULL, buf[256];
			struct tt_err err = { 0 };
			struct paseto_msg m;

			assert_int_equal(paseto_v4_sign(f->sk, (const uint8_t *)"abc",
			                                plens[a], (const uint8_t *)"xy",
			                                flens[b], NULL, 0, &tok, &err), 0);
			size_t len = strlen(tok);
			size_t dot = (size_t)(strrchr(tok, '.') - tok);

			assert_int_equal(paseto_v4_verify(f->pk, tok, len, NULL, 0, &m,
			                                  &err), 0);
			paseto_msg_free(&m);
			memcpy(buf, tok, len + 1);
			tested += flip_spare(buf, 10, dot);
			assert_int_equal(paseto_v4_verify(f->pk, buf, len, NULL, 0, &m,
			                                  &err), -1);
			assert_int_equal(err.code, TT_ERR_MALFORMED);
			memcpy(buf, tok, len + 1);
			tested += flip_spare(buf, dot + 1, len);
			assert_int_equal(paseto_v4_footer(buf, len, &m, &err), -1);
			assert_int_equal(err.code, TT_ERR_MALFORMED);
			free(tok);
		}
	}
	assert_int_equal(tested, 8);
}

/* test_high_bytes: a '_' in a real token replaced by a byte >= 0x80 (the
 * same bits to libsodium 1.0.18) is refused; the original verifies. */
static void test_high_bytes(void **state)
{
	struct fixture *f = *state;
	struct tt_err err = { 0 };
	int found = 0;

	for (int i = 0; i < 200 && !found; i++) {
		char payload[16], *tok = NULL, *us;

		snprintf(payload, sizeof(payload), "p%d", i);
		assert_int_equal(paseto_v4_sign(f->sk, (const uint8_t *)payload,
		                                strlen(payload), NULL, 0, NULL, 0,
		                                &tok, &err), 0);
		us = strchr(tok + 10, '_');
		if (us != NULL) {
			struct paseto_msg m;
			size_t len = strlen(tok);

			assert_int_equal(paseto_v4_verify(f->pk, tok, len, NULL, 0, &m,
			                                  &err), 0);
			paseto_msg_free(&m);
			for (int c = 0x80; c <= 0xff; c += 0x3f) {
				*us = (char)c;
				assert_int_equal(paseto_v4_verify(f->pk, tok, len, NULL, 0,
				                                  &m, &err), -1);
				assert_int_equal(err.code, TT_ERR_MALFORMED);
			}
			found = 1;
		}
		free(tok);
	}
	assert_true(found);
}

/* test_tamper: any flipped bit in payload, signature or footer fails, as do
 * a wrong key and a wrong or missing implicit assertion. */
static void test_tamper(void **state)
{
	struct fixture *f = *state;
	size_t len = strlen(f->tok);
	char buf[PASETO_TOKEN_MAX];
	uint8_t other_pk[32], other_sk[64];
	struct paseto_msg m;
	struct tt_err err = { 0 };
	const char alpha[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

	for (size_t pos = 10; pos < len; pos++) {
		if (f->tok[pos] == '.')
			continue;
		memcpy(buf, f->tok, len + 1);
		/* swap for another alphabet character: changes the bytes */
		int v = (int)(strchr(alpha, buf[pos]) - alpha);
		buf[pos] = alpha[v ^ 0x20];
		enum tt_errc c = verify_code(f, buf, len);
		assert_true(c == TT_ERR_SIGNATURE || c == TT_ERR_MALFORMED);
	}
	crypto_sign_keypair(other_pk, other_sk);
	sodium_memzero(other_sk, sizeof(other_sk));
	assert_int_equal(paseto_v4_verify(other_pk, f->tok, len,
	                                  (const uint8_t *)IMPLICIT,
	                                  strlen(IMPLICIT), &m, &err), -1);
	assert_int_equal(err.code, TT_ERR_SIGNATURE);
	assert_int_equal(paseto_v4_verify(f->pk, f->tok, len, NULL, 0, &m, &err), -1);
	assert_int_equal(err.code, TT_ERR_SIGNATURE);
	assert_int_equal(paseto_v4_verify(f->pk, f->tok, len,
	                                  (const uint8_t *)"bind2", 5, &m, &err), -1);
	assert_int_equal(err.code, TT_ERR_SIGNATURE);
	paseto_msg_free(&m);
}

/* test_bounds: oversized tokens, payloads and footers are refused before
 * decoding; the largest allowed payload and footer work. */
static void test_bounds(void **state)
{
	struct fixture *f = *state;
	static uint8_t big[PASETO_PAYLOAD_MAX + 1];
	static char huge[PASETO_TOKEN_MAX * 2];
	char *tok = NULL;
	struct paseto_msg m;
	struct tt_err err = { 0 };

	memset(big, 'a', sizeof(big));
	assert_int_equal(paseto_v4_sign(f->sk, big, sizeof(big), NULL, 0, NULL, 0,
	                                &tok, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	assert_null(tok);
	assert_int_equal(paseto_v4_sign(f->sk, big, 10, big, PASETO_FOOTER_MAX + 1,
	                                NULL, 0, &tok, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	/* the maxima themselves are fine */
	assert_int_equal(paseto_v4_sign(f->sk, big, PASETO_PAYLOAD_MAX, big,
	                                PASETO_FOOTER_MAX, NULL, 0, &tok, &err), 0);
	assert_true(strlen(tok) <= PASETO_TOKEN_MAX);
	assert_int_equal(paseto_v4_verify(f->pk, tok, strlen(tok), NULL, 0, &m,
	                                  &err), 0);
	assert_int_equal(m.payload_len, PASETO_PAYLOAD_MAX);
	assert_int_equal(m.footer_len, PASETO_FOOTER_MAX);
	paseto_msg_free(&m);
	free(tok);
	/* a token over the bound, made of valid characters */
	memcpy(huge, "v4.public.", 10);
	memset(huge + 10, 'A', sizeof(huge) - 11);
	huge[sizeof(huge) - 1] = '\0';
	assert_int_equal(verify_code(f, huge, PASETO_TOKEN_MAX + 1), TT_ERR_TOO_LARGE);
	assert_int_equal(paseto_v4_footer(huge, strlen(huge), &m, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	/* under the token bound, but a body longer than payload + signature */
	assert_int_equal(verify_code(f, huge, PASETO_TOKEN_MAX), TT_ERR_TOO_LARGE);
	/* a footer over its bound */
	snprintf(huge, sizeof(huge), "v4.public.%.86s.", f->tok + 10);
	memset(huge + 97, 'A', 400);
	huge[497] = '\0';
	assert_int_equal(verify_code(f, huge, strlen(huge)), TT_ERR_TOO_LARGE);
}

/* test_odd_payloads: non-UTF-8 / non-JSON / empty payloads are just bytes
 * to PASETO: they sign and verify, and nothing crashes. */
static void test_odd_payloads(void **state)
{
	struct fixture *f = *state;
	const uint8_t junk[] = { 0xff, 0xfe, 0x00, 0xc3, 0x28, '{', '"' };
	char *tok = NULL;
	struct paseto_msg m;
	struct tt_err err = { 0 };

	assert_int_equal(paseto_v4_sign(f->sk, junk, sizeof(junk), junk,
	                                sizeof(junk), NULL, 0, &tok, &err), 0);
	assert_int_equal(paseto_v4_verify(f->pk, tok, strlen(tok), NULL, 0, &m,
	                                  &err), 0);
	assert_int_equal(m.payload_len, sizeof(junk));
	assert_memory_equal(m.payload, junk, sizeof(junk));
	assert_int_equal(m.payload[m.payload_len], 0);
	paseto_msg_free(&m);
	free(tok);
	/* empty payload, no footer */
	assert_int_equal(paseto_v4_sign(f->sk, NULL, 0, NULL, 0, NULL, 0, &tok,
	                                &err), 0);
	assert_null(strchr(tok + 10, '.'));
	assert_int_equal(paseto_v4_verify(f->pk, tok, strlen(tok), NULL, 0, &m,
	                                  &err), 0);
	assert_int_equal(m.payload_len, 0);
	assert_int_equal(m.footer_len, 0);
	paseto_msg_free(&m);
	free(tok);
}

/* test_pae: the spec's examples of PAE. */
static void test_pae(void **state)
{
	uint8_t out[64];
	size_t len = 0;
	const uint8_t *p1[] = { (const uint8_t *)"" };
	const size_t l1[] = { 0 };
	const uint8_t *p2[] = { (const uint8_t *)"test" };
	const size_t l2[] = { 4 };

	(void)state;
	assert_int_equal(paseto_pae(NULL, NULL, 0, out, sizeof(out), &len), 0);
	assert_int_equal(len, 8);
	assert_memory_equal(out, "\0\0\0\0\0\0\0\0", 8);
	assert_int_equal(paseto_pae(p1, l1, 1, out, sizeof(out), &len), 0);
	assert_int_equal(len, 16);
	assert_memory_equal(out, "\x01\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 16);
	assert_int_equal(paseto_pae(p2, l2, 1, out, sizeof(out), &len), 0);
	assert_int_equal(len, 20);
	assert_memory_equal(out, "\x01\0\0\0\0\0\0\0\x04\0\0\0\0\0\0\0test", 20);
	assert_int_equal(paseto_pae(p2, l2, 1, out, 19, &len), -1);
}

/* test_b64url: strictness of the decoder itself. */
static void test_b64url(void **state)
{
	uint8_t out[16];
	char enc[32];
	size_t n = 0;
	struct tt_err err = { 0 };

	(void)state;
	assert_int_equal(b64url_encode((const uint8_t *)"A", 1, enc, sizeof(enc)), 2);
	assert_string_equal(enc, "QQ");
	assert_int_equal(b64url_encode((const uint8_t *)"\xfb\xff", 2, enc, sizeof(enc)), 3);
	assert_string_equal(enc, "-_8");
	assert_int_equal(b64url_encode((const uint8_t *)"A", 1, enc, 2), -1);
	assert_int_equal(b64url_decode("QQ", 2, out, sizeof(out), &n, &err), 0);
	assert_int_equal(n, 1);
	assert_int_equal(out[0], 'A');
	assert_int_equal(b64url_decode("", 0, out, sizeof(out), &n, &err), 0);
	assert_int_equal(n, 0);
	assert_int_equal(b64url_decode("-_8", 3, out, sizeof(out), &n, &err), 0);
	assert_memory_equal(out, "\xfb\xff", 2);
	/* non-canonical: "QR" and "QUF" carry non-zero spare bits */
	const char *bad[] = { "QR", "QUF", "Q", "QQ==", "QQ=", "Q Q", "Q+Q",
	                      "Q/Q", "QQ\n", " QQ", "QUFBQ", "Q=Q=", "\xc3\xa9",
	                      /* libsodium 1.0.18 reads bytes >= 0x80 as '_' */
	                      "MQ\xe4" "F", "MQ\x80" "F", "MQ\xff" "F" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err.code = TT_OK;
		if (b64url_decode(bad[i], strlen(bad[i]), out, sizeof(out), &n,
		                  &err) == 0)
			fail_msg("accepted \"%s\"", bad[i]);
		assert_int_equal(err.code, TT_ERR_MALFORMED);
	}
	/* ... while the real '_' is fine */
	assert_int_equal(b64url_decode("MQ_F", 4, out, sizeof(out), &n, &err), 0);
	/* the bound applies before decoding */
	assert_int_equal(b64url_decode("QUFBQUFB", 8, out, 5, &n, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	assert_int_equal(b64url_decode("QUFBQUFB", 8, out, 6, &n, &err), 0);
	assert_int_equal(n, 6);
}

/* main: runs the tests as one group (TAP via CMOCKA_MESSAGE_OUTPUT). */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_vectors_success),
		cmocka_unit_test(test_vectors_failure),
		cmocka_unit_test(test_pae),
		cmocka_unit_test(test_b64url),
		cmocka_unit_test_setup_teardown(test_honest, setup, teardown),
		cmocka_unit_test_setup_teardown(test_structure, setup, teardown),
		cmocka_unit_test_setup_teardown(test_noncanonical, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tamper, setup, teardown),
		cmocka_unit_test_setup_teardown(test_high_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bounds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_odd_payloads, setup, teardown),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}

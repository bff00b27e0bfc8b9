/* Capability claims parsing and encoding (lib/claims.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "claims.h"
#include "paseto.h"

#define SBX "sbx_abcdefghijklmnopqrstuvwxyz"
#define IAT "2026-11-29T23:09:12Z"
#define EXP "2026-11-29T23:11:12Z" /* iat + 120 s */
#define IAT_S 1795993752

/* base_control: a valid control claim set (owner: caller, json_decref). */
static json_t *base_control(void)
{
	json_error_t jerr;
	json_t *o = json_loads(
		"{\"iss\":\"tether-cp\",\"sub\":\"tenant-1\",\"jti\":\"j1\","
		"\"iat\":\"" IAT "\",\"exp\":\"" EXP "\",\"aud\":\"node\","
		"\"sbx\":\"" SBX "\",\"gen\":7,\"wrk\":\"w-1.a_b\",\"sst\":\"ns\","
		"\"pod\":\"\",\"att\":1,\"pur\":\"control\","
		"\"ops\":[\"exec\",\"fs.read\"]}", JSON_REJECT_DUPLICATES, &jerr);

	assert_non_null(o);
	return o;
}

/* base_port: a valid port claim set (owner: caller). */
static json_t *base_port(void)
{
	json_t *o = base_control();

	json_object_del(o, "ops");
	json_object_set_new(o, "pur", json_string("port"));
	json_object_set_new(o, "aud", json_string("gateway"));
	json_object_set_new(o, "port", json_integer(8080));
	json_object_set_new(o, "proto", json_string("http"));
	return o;
}

/* parse_obj: dumps o and parses it; returns claims_parse's result. */
static int parse_obj(json_t *o, struct tt_claims *c, struct tt_err *err)
{
	char *s = json_dumps(o, JSON_COMPACT);
	int rc;

	assert_non_null(s);
	rc = claims_parse((const uint8_t *)s, strlen(s), c, err);
	free(s);
	return rc;
}

/* parse_str: parses a literal payload. */
static int parse_str(const char *s, struct tt_claims *c, struct tt_err *err)
{
	return claims_parse((const uint8_t *)s, strlen(s), c, err);
}

/* expect_malformed: o is refused as malformed, the message naming what. */
static void expect_malformed(json_t *o, const char *what)
{
	struct tt_claims c;
	struct tt_err err = { 0 };

	if (parse_obj(o, &c, &err) == 0) {
		char *s = json_dumps(o, JSON_COMPACT);

		fail_msg("accepted: %s", s);
	}
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	if (what != NULL && strstr(err.msg, what) == NULL)
		fail_msg("message '%s' does not name '%s'", err.msg, what);
}

/* test_valid_control: every field lands where it should. */
static void test_valid_control(void **state)
{
	json_t *o = base_control();
	struct tt_claims c;
	struct tt_err err = { 0 };

	(void)state;
	assert_int_equal(parse_obj(o, &c, &err), 0);
	assert_string_equal(c.iss, "tether-cp");
	assert_string_equal(c.sub, "tenant-1");
	assert_string_equal(c.jti, "j1");
	assert_int_equal(c.iat, IAT_S);
	assert_int_equal(c.exp, IAT_S + 120);
	assert_int_equal(c.aud, TT_AUD_NODE);
	assert_string_equal(c.id.sbx, SBX);
	assert_int_equal(c.id.gen, 7);
	assert_string_equal(c.id.wrk, "w-1.a_b");
	assert_string_equal(c.id.sst, "ns");
	assert_string_equal(c.id.pod, "");
	assert_int_equal(c.id.att, 1);
	assert_int_equal(c.pur, TT_PUR_CONTROL);
	assert_int_equal(c.ops, TT_OP_EXEC | TT_OP_FS_READ);
	json_decref(o);
}

/* test_valid_port: a port capability. */
static void test_valid_port(void **state)
{
	json_t *o = base_port();
	struct tt_claims c;
	struct tt_err err = { 0 };

	(void)state;
	assert_int_equal(parse_obj(o, &c, &err), 0);
	assert_int_equal(c.pur, TT_PUR_PORT);
	assert_int_equal(c.aud, TT_AUD_GATEWAY);
	assert_int_equal(c.port, 8080);
	assert_int_equal(c.proto, TT_PROTO_HTTP);
	assert_int_equal(c.ops, 0);
	json_decref(o);
}

/* test_missing_each: removing any required claim is malformed, naming it. */
static void test_missing_each(void **state)
{
	static const char *const ctl[] = { "iss", "sub", "jti", "iat", "exp",
	                                   "aud", "sbx", "gen", "wrk", "sst",
	                                   "pod", "att", "pur", "ops" };
	static const char *const prt[] = { "port", "proto" };

	(void)state;
	for (size_t i = 0; i < sizeof(ctl) / sizeof(ctl[0]); i++) {
		json_t *o = base_control();

		json_object_del(o, ctl[i]);
		expect_malformed(o, ctl[i]);
		json_decref(o);
	}
	for (size_t i = 0; i < sizeof(prt) / sizeof(prt[0]); i++) {
		json_t *o = base_port();

		json_object_del(o, prt[i]);
		expect_malformed(o, prt[i]);
		json_decref(o);
	}
}

struct bad_case {
	const char *key;
	const char *value; /* JSON text */
};

/* test_mistyped_each: wrong types and out-of-range values per claim. */
static void test_mistyped_each(void **state)
{
	static const struct bad_case ctl[] = {
		{ "iss", "1" }, { "iss", "\"\"" }, { "iss", "\"a\\nb\"" },
		{ "sub", "null" }, { "sub", "\"\"" }, { "jti", "[]" },
		{ "iat", "1795993752" }, { "iat", "\"2026-13-01T00:00:00Z\"" },
		{ "iat", "\"2026-11-29T23:09Z\"" }, { "exp", "true" },
		{ "exp", "\"" IAT "\"" },                 /* exp == iat */
		{ "exp", "\"2026-11-29T23:09:11Z\"" },    /* exp < iat */
		{ "aud", "\"edge\"" }, { "aud", "1" }, { "aud", "\"Node\"" },
		{ "sbx", "\"sbx_short\"" }, { "sbx", "1" },
		{ "sbx", "\"SBX_abcdefghijklmnopqrstuvwxyz\"" },
		{ "sbx", "\"sbx_abcdefghijklmnopqrstuvwxy1\"" }, /* 1 not base32 */
		{ "sbx", "\"sbx_abcdefghijklmnopqrstuvwxyza\"" }, /* too long */
		{ "gen", "0" }, { "gen", "-1" }, { "gen", "1.5" }, { "gen", "\"7\"" },
		{ "gen", "null" }, { "att", "0" }, { "att", "4294967296" },
		{ "att", "\"1\"" }, { "att", "1.0" },
		{ "wrk", "\"\"" }, { "wrk", "\"a b\"" }, { "wrk", "\"a/b\"" },
		{ "wrk", "7" }, { "sst", "\"\"" }, { "sst", "\"NS\"" },
		{ "sst", "\"micro.vm\"" }, { "pod", "\"a/b\"" }, { "pod", "null" },
		{ "pur", "\"admin\"" }, { "pur", "2" },
		{ "ops", "\"exec\"" }, { "ops", "[1]" }, { "ops", "{}" },
		{ "ops", "[\"exec\",null]" },
		{ "port", "80" },   /* port on a control capability */
		{ "proto", "\"tcp\"" },
		{ "nbf", "\"" IAT "\"" }, /* unknown claim */
	};
	static const struct bad_case prt[] = {
		{ "port", "0" }, { "port", "65536" }, { "port", "\"80\"" },
		{ "port", "-1" }, { "port", "80.0" },
		{ "proto", "\"udp\"" }, { "proto", "\"TCP\"" }, { "proto", "1" },
		{ "ops", "[\"exec\"]" }, /* ops on a port capability */
	};

	(void)state;
	for (size_t i = 0; i < sizeof(ctl) / sizeof(ctl[0]); i++) {
		json_t *o = base_control();

		json_object_set_new(o, ctl[i].key,
		                    json_loads(ctl[i].value, JSON_DECODE_ANY, NULL));
		expect_malformed(o, ctl[i].key);
		json_decref(o);
	}
	for (size_t i = 0; i < sizeof(prt) / sizeof(prt[0]); i++) {
		json_t *o = base_port();

		json_object_set_new(o, prt[i].key,
		                    json_loads(prt[i].value, JSON_DECODE_ANY, NULL));
		expect_malformed(o, prt[i].key);
		json_decref(o);
	}
}

/* test_duplicate_each: a duplicated key is refused even with equal values
 * (and the honest single-key payload is accepted). */
static void test_duplicate_each(void **state)
{
	json_t *o = base_control();
	char *base = json_dumps(o, JSON_COMPACT);
	const char *key;
	json_t *val;

	(void)state;
	assert_non_null(base);
	json_object_foreach(o, key, val) {
		struct tt_claims c;
		struct tt_err err = { 0 };
		char *v = json_dumps(val, JSON_COMPACT | JSON_ENCODE_ANY);
		char buf[2048];

		assert_non_null(v);
		/* {"key":value, + the rest of the base object */
		snprintf(buf, sizeof(buf), "{\"%s\":%s,%s", key, v, base + 1);
		free(v);
		assert_int_equal(parse_str(buf, &c, &err), -1);
		assert_int_equal(err.code, TT_ERR_MALFORMED);
	}
	{
		struct tt_claims c;
		struct tt_err err = { 0 };

		assert_int_equal(parse_str(base, &c, &err), 0);
	}
	free(base);
	json_decref(o);
}

/* set_len: sets key to a string of n copies of ch. */
static void set_len(json_t *o, const char *key, size_t n, char ch)
{
	char *s = malloc(n + 1);

	assert_non_null(s);
	memset(s, ch, n);
	s[n] = '\0';
	json_object_set_new(o, key, json_string(s));
	free(s);
}

/* test_string_bounds: each string claim at its bound is accepted, one
 * byte over is refused. */
static void test_string_bounds(void **state)
{
	static const struct {
		const char *key;
		size_t max;
		char ch;
	} b[] = {
		{ "iss", TT_NAME_MAX, 'i' }, { "sub", TT_SUB_MAX, 's' },
		{ "jti", TT_NAME_MAX, 'j' }, { "wrk", TT_NAME_MAX, 'w' },
		{ "sst", TT_NAME_MAX, 'n' }, { "pod", TT_NAME_MAX, 'p' },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++) {
		json_t *o = base_control();
		struct tt_claims c;
		struct tt_err err = { 0 };

		set_len(o, b[i].key, b[i].max, b[i].ch);
		if (parse_obj(o, &c, &err) != 0)
			fail_msg("%s at %zu refused: %s", b[i].key, b[i].max,
			         err.msg);
		set_len(o, b[i].key, b[i].max + 1, b[i].ch);
		expect_malformed(o, b[i].key);
		json_decref(o);
	}
}

/* test_not_object: non-object roots and broken JSON. */
static void test_not_object(void **state)
{
	static const char *const bad[] = {
		"[]", "\"x\"", "1", "null", "", "{", "{}x", "{\"iss\":}",
		"{\"iss\":\"a\"}{}",
	};
	struct tt_claims c;
	struct tt_err err = { 0 };

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(parse_str(bad[i], &c, &err), -1);
		assert_int_equal(err.code, TT_ERR_MALFORMED);
	}
	assert_int_equal(claims_parse(NULL, 0, &c, &err), -1);
}

/* test_invalid_utf8: bytes that are not UTF-8 inside a string claim, and
 * an escaped NUL, are refused; the same payload with ASCII is accepted. */
static void test_invalid_utf8(void **state)
{
	json_t *o = base_control();
	char *s, *p;
	struct tt_claims c;
	struct tt_err err = { 0 };

	(void)state;
	s = json_dumps(o, JSON_COMPACT);
	assert_non_null(s);
	assert_int_equal(parse_str(s, &c, &err), 0);
	p = strstr(s, "tenant-1");
	assert_non_null(p);
	p[0] = (char)0xff;
	assert_int_equal(parse_str(s, &c, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	p[0] = (char)0xc3; /* truncated 2-byte sequence: 0xc3 'e' */
	assert_int_equal(parse_str(s, &c, &err), -1);
	/* valid UTF-8 but a C1 control (U+009B, CSI: a terminal escape) */
	p[0] = (char)0xc2;
	p[1] = (char)0x9b;
	assert_int_equal(parse_str(s, &c, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	/* ... while U+00A0..U+00FF are printable and fine */
	p[1] = (char)0xa0;
	assert_int_equal(parse_str(s, &c, &err), 0);
	free(s);
	json_decref(o);
	assert_int_equal(parse_str("{\"iss\":\"a\\u0000b\"}", &c, &err), -1);
}

/* test_too_large: over PASETO_PAYLOAD_MAX is TOO_LARGE before parsing. */
static void test_too_large(void **state)
{
	uint8_t *big = malloc(PASETO_PAYLOAD_MAX + 1);
	struct tt_claims c;
	struct tt_err err = { 0 };

	(void)state;
	assert_non_null(big);
	memset(big, ' ', PASETO_PAYLOAD_MAX + 1);
	big[0] = '{';
	big[PASETO_PAYLOAD_MAX] = '}';
	assert_int_equal(claims_parse(big, PASETO_PAYLOAD_MAX + 1, &c, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	free(big);
}

/* test_lifetime: 120 s is the longest lifetime; 121 s is malformed. */
static void test_lifetime(void **state)
{
	json_t *o = base_control();
	struct tt_claims c;
	struct tt_err err = { 0 };

	(void)state;
	json_object_set_new(o, "exp", json_string("2026-11-29T23:11:12Z"));
	assert_int_equal(parse_obj(o, &c, &err), 0);
	json_object_set_new(o, "exp", json_string("2026-11-29T23:11:13Z"));
	expect_malformed(o, "lifetime");
	/* An offset that makes a long-looking span short is fine. */
	json_object_set_new(o, "exp", json_string("2026-11-30T00:11:12+01:00"));
	assert_int_equal(parse_obj(o, &c, &err), 0);
	assert_int_equal(c.exp - c.iat, 120);
	json_decref(o);
}

/* test_unknown_ops_ignored: unknown operation names grant nothing. */
static void test_unknown_ops_ignored(void **state)
{
	json_t *o = base_control();
	struct tt_claims c;
	struct tt_err err = { 0 };

	(void)state;
	json_object_set_new(o, "ops", json_loads("[\"exec\",\"rm-rf\",\"*\"]",
	                                         0, NULL));
	assert_int_equal(parse_obj(o, &c, &err), 0);
	assert_int_equal(c.ops, TT_OP_EXEC);
	json_object_set_new(o, "ops", json_array());
	assert_int_equal(parse_obj(o, &c, &err), 0);
	assert_int_equal(c.ops, 0);
	json_decref(o);
}

/* claims_same: field-wise equality. */
static void claims_same(const struct tt_claims *a, const struct tt_claims *b)
{
	assert_string_equal(a->iss, b->iss);
	assert_string_equal(a->sub, b->sub);
	assert_string_equal(a->jti, b->jti);
	assert_int_equal(a->iat, b->iat);
	assert_int_equal(a->exp, b->exp);
	assert_int_equal(a->aud, b->aud);
	assert_string_equal(a->id.sbx, b->id.sbx);
	assert_int_equal(a->id.gen, b->id.gen);
	assert_string_equal(a->id.wrk, b->id.wrk);
	assert_string_equal(a->id.sst, b->id.sst);
	assert_string_equal(a->id.pod, b->id.pod);
	assert_int_equal(a->id.att, b->id.att);
	assert_int_equal(a->pur, b->pur);
	assert_int_equal(a->ops, b->ops);
	assert_int_equal(a->port, b->port);
	assert_int_equal(a->proto, b->proto);
}

/* test_round_trip: to_json gives the fixed key order and parses back to
 * the same claims, for both purposes. */
static void test_round_trip(void **state)
{
	json_t *o = base_control(), *p = base_port();
	struct tt_claims c, back;
	struct tt_err err = { 0 };
	char *s;

	(void)state;
	assert_int_equal(parse_obj(o, &c, &err), 0);
	s = claims_to_json(&c, &err);
	assert_non_null(s);
	assert_string_equal(s,
		"{\"iss\":\"tether-cp\",\"sub\":\"tenant-1\",\"jti\":\"j1\","
		"\"iat\":\"" IAT "\",\"exp\":\"" EXP "\",\"aud\":\"node\","
		"\"sbx\":\"" SBX "\",\"gen\":7,\"wrk\":\"w-1.a_b\",\"sst\":\"ns\","
		"\"pod\":\"\",\"att\":1,\"pur\":\"control\","
		"\"ops\":[\"exec\",\"fs.read\"]}");
	assert_int_equal(parse_str(s, &back, &err), 0);
	claims_same(&c, &back);
	free(s);

	assert_int_equal(parse_obj(p, &c, &err), 0);
	s = claims_to_json(&c, &err);
	assert_non_null(s);
	assert_non_null(strstr(s, "\"pur\":\"port\",\"port\":8080,\"proto\":\"http\"}"));
	assert_null(strstr(s, "\"ops\""));
	assert_int_equal(parse_str(s, &back, &err), 0);
	claims_same(&c, &back);
	free(s);
	json_decref(o);
	json_decref(p);
}

/* test_to_json_refuses_invalid: nothing a receiver would refuse is
 * emitted (so it is never signed). */
static void test_to_json_refuses_invalid(void **state)
{
	json_t *o = base_control();
	struct tt_claims c, bad;
	struct tt_err err = { 0 };
	char *s;

	(void)state;
	assert_int_equal(parse_obj(o, &c, &err), 0);
	bad = c;
	strcpy(bad.id.sbx, "sbx_NOPE");
	assert_null(claims_to_json(&bad, &err));
	assert_int_equal(err.code, TT_ERR_INVALID);
	bad = c;
	bad.exp = bad.iat + 121;
	assert_null(claims_to_json(&bad, &err));
	bad = c;
	bad.id.gen = 0;
	assert_null(claims_to_json(&bad, &err));
	bad = c;
	bad.pur = TT_PUR_PORT; /* port 0, no proto */
	assert_null(claims_to_json(&bad, &err));
	s = claims_to_json(&c, &err);
	assert_non_null(s);
	free(s);
	json_decref(o);
}

/* test_sbx_ids: new ids are valid and distinct; the validator refuses
 * near misses. */
static void test_sbx_ids(void **state)
{
	char ids[256][TT_SBX_ID_LEN + 1];

	(void)state;
	for (size_t i = 0; i < 256; i++) {
		sbx_id_new(ids[i]);
		assert_true(sbx_id_valid(ids[i]));
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(ids[i], ids[j]);
	}
	assert_true(sbx_id_valid(SBX));
	assert_false(sbx_id_valid(NULL));
	assert_false(sbx_id_valid(""));
	assert_false(sbx_id_valid("sbx_abcdefghijklmnopqrstuvwxy"));
	assert_false(sbx_id_valid("sbx_abcdefghijklmnopqrstuvwxyz2"));
	assert_false(sbx_id_valid("sbx_abcdefghijklmnopqrstuvwxy0"));
	assert_false(sbx_id_valid("sbx_abcdefghijklmnopqrstuvwxyZ"));
	assert_false(sbx_id_valid("sbx-abcdefghijklmnopqrstuvwxyz"));
}

/* test_ops_helpers: operator-side ops parsing is strict, formatting is
 * canonical. */
static void test_ops_helpers(void **state)
{
	struct tt_err err = { 0 };
	uint32_t ops = 99;
	char buf[64];

	(void)state;
	assert_int_equal(ops_parse("exec,fs.read,pty", &ops, &err), 0);
	assert_int_equal(ops, TT_OP_EXEC | TT_OP_FS_READ | TT_OP_PTY);
	assert_int_equal(ops_parse("", &ops, &err), 0);
	assert_int_equal(ops, 0);
	assert_int_equal(ops_parse("exec,rm", &ops, &err), -1);
	assert_int_equal(ops_parse("exec,", &ops, &err), -1);
	assert_int_equal(ops_parse(",exec", &ops, &err), -1);
	assert_int_equal(ops_parse("exec,,pty", &ops, &err), -1);
	assert_int_equal(ops_format(TT_OP_WATCH | TT_OP_EXEC | TT_OP_FS_WRITE,
	                            buf, sizeof(buf)), 0);
	assert_string_equal(buf, "exec,fs.write,watch");
	assert_int_equal(ops_format(TT_OP_EXEC | TT_OP_FS_READ, buf, 8), -1);
	assert_int_equal(ops_format(TT_OP_EXEC | TT_OP_FS_READ, buf, 13), 0);
	assert_string_equal(buf, "exec,fs.read");
	assert_int_equal(ops_format(0, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "");
	assert_string_equal(wireop_name(wireop_of_cap(TT_OP_FS_WRITE)), "fs.write");
	assert_null(wireop_name(wireop_of_cap(TT_OP_EXEC | TT_OP_PTY)));
	assert_int_equal(wireop_cap(wireop_parse("watch")), TT_OP_WATCH);
	assert_int_equal(wireop_cap(wireop_parse("Watch")), 0);
	/* Wire-only operations name no capability: refused in config, ignored
	 * in a token, and each needs the capability that covers it. */
	assert_int_equal(ops_parse("fs.stat", &ops, &err), -1);
	assert_int_equal(wireop_cap(wireop_parse("fs.stat")), 0);
	assert_int_equal(wireop_needs(wireop_parse("fs.stat")), TT_OP_FS_READ);
	assert_int_equal(wireop_needs(wireop_parse("fs.remove")), TT_OP_FS_WRITE);
	assert_int_equal(wireop_needs(wireop_parse("status")), 0);
	assert_int_equal(wireop_needs(wireop_parse("pty")), 0);
	assert_true(wireop_control(wireop_parse("feed.apply")));
	assert_false(wireop_control(wireop_parse("exec")));
	assert_true(wireop_input(wireop_parse("fs.write")));
	assert_false(wireop_input(wireop_parse("fs.read")));
	assert_int_equal(wireop_parse(NULL), WIRE_OP_UNKNOWN);
	assert_null(wireop_name(WIRE_OP_UNKNOWN));
	assert_null(wireop_name(WIRE_OP_COUNT));
	for (int i = 1; i < WIRE_OP_COUNT; i++)
		assert_int_equal(wireop_parse(wireop_name((enum wire_op)i)), i);
}

/* main: runs the cases, TAP output when CMOCKA_MESSAGE_OUTPUT=TAP. */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid_control),
		cmocka_unit_test(test_valid_port),
		cmocka_unit_test(test_missing_each),
		cmocka_unit_test(test_mistyped_each),
		cmocka_unit_test(test_duplicate_each),
		cmocka_unit_test(test_string_bounds),
		cmocka_unit_test(test_not_object),
		cmocka_unit_test(test_invalid_utf8),
		cmocka_unit_test(test_too_large),
		cmocka_unit_test(test_lifetime),
		cmocka_unit_test(test_unknown_ops_ignored),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_to_json_refuses_invalid),
		cmocka_unit_test(test_sbx_ids),
		cmocka_unit_test(test_ops_helpers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

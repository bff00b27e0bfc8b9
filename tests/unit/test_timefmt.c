/* RFC 3339 parsing and formatting (lib/timefmt.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "timefmt.h"

/* parse_ok: s parses to want. */
static void parse_ok(const char *s, int64_t want)
{
	struct tt_err err = { 0 };
	int64_t t = -1;

	if (rfc3339_parse(s, strlen(s), &t, &err) != 0)
		fail_msg("'%s' refused: %s", s, err.msg);
	if (t != want)
		fail_msg("'%s' -> %lld, want %lld", s, (long long)t,
		         (long long)want);
}

/* parse_bad: s is refused as malformed. */
static void parse_bad(const char *s)
{
	struct tt_err err = { 0 };
	int64_t t = 0;

	if (rfc3339_parse(s, strlen(s), &t, &err) == 0)
		fail_msg("'%s' accepted as %lld", s, (long long)t);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
}

/* test_valid_forms: Z, fractions, offsets, lowercase t/z, leap day. */
static void test_valid_forms(void **state)
{
	(void)state;
	parse_ok("1970-01-01T00:00:00Z", 0);
	parse_ok("2026-11-29T23:09:12Z", 1795993752);
	parse_ok("2026-11-29t23:09:12z", 1795993752);
	parse_ok("2026-11-29T23:09:12.999999Z", 1795993752); /* truncated */
	parse_ok("2026-11-29T23:09:12.5+00:00", 1795993752);
	parse_ok("2026-11-30T01:39:12+02:30", 1795993752);  /* offset applied */
	parse_ok("2026-11-29T20:09:12-03:00", 1795993752);
	parse_ok("2024-02-29T00:00:00Z", 1709164800);       /* leap day */
	parse_ok("2000-02-29T12:00:00Z", 951825600);        /* 400-year leap */
	parse_ok("1969-12-31T23:59:59Z", -1);
	parse_ok("2016-12-31T23:59:60Z", 1483228800);       /* leap second */
	/* RFC 3339 §5.7: the same leap second, in Pacific time */
	parse_ok("2016-12-31T15:59:60-08:00", 1483228800);
	parse_ok("2017-01-01T05:29:60+05:30", 1483228800);
	parse_ok("9999-12-31T23:59:59Z", 253402300799);
}

/* test_invalid_forms: every kind of refusal. */
static void test_invalid_forms(void **state)
{
	(void)state;
	parse_bad("2026-13-01T00:00:00Z");     /* month 13 */
	parse_bad("2026-00-01T00:00:00Z");     /* month 0 */
	parse_bad("2026-02-29T00:00:00Z");     /* not a leap year */
	parse_bad("1900-02-29T00:00:00Z");     /* century, not leap */
	parse_bad("2026-04-31T00:00:00Z");     /* April has 30 */
	parse_bad("2026-01-00T00:00:00Z");
	parse_bad("2026-01-01T24:00:00Z");
	parse_bad("2026-01-01T23:60:00Z");
	parse_bad("2026-01-01T12:00:60Z");     /* leap second not at 23:59 */
	parse_bad("2016-12-31T23:59:60+01:00"); /* 22:59:60 UTC */
	parse_bad("2016-12-31T23:59:60-00:30"); /* 00:29:60 UTC */
	parse_bad("2026-01-01T12:00Z");        /* missing seconds */
	parse_bad("2026-01-01T12:00:00");      /* missing zone */
	parse_bad("2026-01-01 12:00:00Z");     /* space separator */
	parse_bad("2026-01-01T12:00:00ZZ");    /* trailing garbage */
	parse_bad("2026-01-01T12:00:00Z ");
	parse_bad("2026-01-01T12:00:00.Z");    /* empty fraction */
	parse_bad("2026-01-01T12:00:00+0100"); /* offset without colon */
	parse_bad("2026-01-01T12:00:00+24:00");
	parse_bad("2026-01-01T12:00:00+01:60");
	parse_bad("2026-01-01T12:00:00+01:00x");
	parse_bad("26-01-01T12:00:00Z");
	parse_bad("+2026-01-01T12:00:00Z");
	parse_bad("2026-1-01T12:00:00Z");
	parse_bad("2026-01-01T12:00:00.123456789012345678901234Z"); /* too long */
	parse_bad("");
}

/* test_embedded_nul: the length, not the NUL, bounds the input. */
static void test_embedded_nul(void **state)
{
	static const char s[] = "2026-01-01T12:00:00Z\0junk";
	struct tt_err err = { 0 };
	int64_t t;

	(void)state;
	assert_int_equal(rfc3339_parse(s, sizeof(s) - 1, &t, &err), -1);
	assert_int_equal(rfc3339_parse(s, 20, &t, &err), 0);
}

/* test_format_round_trip: format then parse gives the same second, and the
 * output matches gmtime's reading. */
static void test_format_round_trip(void **state)
{
	static const int64_t ts[] = { 0, 1, -1, 951782400, 1795993752,
	                              253402300799, -2208988800 };
	(void)state;
	for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
		char buf[TT_RFC3339_MAX], ref[64];
		struct tt_err err;
		time_t tt = (time_t)ts[i];
		struct tm tm;
		int64_t back;

		assert_int_equal(rfc3339_format(ts[i], buf), 0);
		gmtime_r(&tt, &tm);
		strftime(ref, sizeof(ref), "%Y-%m-%dT%H:%M:%SZ", &tm);
		assert_string_equal(buf, ref);
		assert_int_equal(rfc3339_parse(buf, strlen(buf), &back, &err), 0);
		assert_int_equal(back, ts[i]);
	}
}

/* test_format_out_of_range: year 0000 is the first RFC 3339 can write;
 * years outside 0000..9999 are refused. */
static void test_format_out_of_range(void **state)
{
	char buf[TT_RFC3339_MAX];

	(void)state;
	assert_int_equal(rfc3339_format(-62167219200, buf), 0);
	assert_string_equal(buf, "0000-01-01T00:00:00Z");
	assert_int_equal(rfc3339_format(253402300800, buf), -1); /* year 10000 */
	assert_int_equal(rfc3339_format(-62167219201, buf), -1); /* year -1 */
}

/* test_now: tt_now is the wall clock. */
static void test_now(void **state)
{
	int64_t a = (int64_t)time(NULL), n = tt_now();

	(void)state;
	assert_true(n >= a && n <= a + 2);
}

/* main: runs the cases, TAP output when CMOCKA_MESSAGE_OUTPUT=TAP. */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid_forms),
		cmocka_unit_test(test_invalid_forms),
		cmocka_unit_test(test_embedded_nul),
		cmocka_unit_test(test_format_round_trip),
		cmocka_unit_test(test_format_out_of_range),
		cmocka_unit_test(test_now),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* RFC 3339 date-times for capability claims (see timefmt.h).
 *
 * Grammar accepted (RFC 3339 §5.6, nothing looser):
 *   YYYY-MM-DD ("T" | "t") hh:mm:ss [ "." 1*DIGIT ] ("Z" | "z" | ("+"|"-") hh:mm)
 * Lowercase "t" and "z" are accepted because RFC 3339 §5.6 explicitly allows
 * them and the signature, not the spelling, is what makes a token trusted.
 * A space separator (an RFC 3339 "may" for readability, not ISO 8601) is
 * refused, as are missing seconds, out-of-range fields and trailing bytes.
 * A leap second (ss = 60) is accepted only where it can occur, at 23:59 UTC
 * (so at 15:59:60-08:00, RFC 3339 §5.7), and counts as the next second, as
 * POSIX time does. Arithmetic is done here
 * (proleptic Gregorian calendar), never through the process time zone. */
#include "timefmt.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* digits_read: n ASCII digits at s as a number, or -1 if any is not a digit. */
static int digits_read(const char *s, int n)
{
	int v = 0;

	for (int i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v;
}

/* is_leap: Gregorian leap year. */
static int is_leap(int64_t y)
{
	return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* days_in_month: length of month m (1..12) of year y. */
static int days_in_month(int64_t y, int m)
{
	static const int mdays[12] = { 31, 28, 31, 30, 31, 30,
	                               31, 31, 30, 31, 30, 31 };

	return m == 2 && is_leap(y) ? 29 : mdays[m - 1];
}

/* days_from_civil: days since 1970-01-01 of y-m-d (H. Hinnant's algorithm;
 * exact for every proleptic Gregorian date). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
	y -= m <= 2;
	int64_t era = (y >= 0 ? y : y - 399) / 400;
	int64_t yoe = y - era * 400;
	int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;

	return era * 146097 + doe - 719468;
}

/* civil_from_days: inverse of days_from_civil. */
static void civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
	z += 719468;
	int64_t era = (z >= 0 ? z : z - 146096) / 146097;
	int64_t doe = z - era * 146097;
	int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	int64_t mp = (5 * doy + 2) / 153;

	*d = (int)(doy - (153 * mp + 2) / 5 + 1);
	*m = (int)(mp < 10 ? mp + 3 : mp - 9);
	*y = yoe + era * 400 + (*m <= 2);
}

/* rfc3339_parse: strict RFC 3339 date-time to unix seconds. */
int rfc3339_parse(const char *s, size_t len, int64_t *out, struct tt_err *err)
{
	char buf[TT_RFC3339_MAX + 1];
	size_t i;
	int year, mon, day, hh, mm, ss, off = 0;

	/* Shortest form is "YYYY-MM-DDThh:mm:ssZ" (20 bytes); a bound on the
	 * longest keeps fraction digits from being unbounded. */
	if (s == NULL || len < 20 || len > TT_RFC3339_MAX)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "time: not an RFC 3339 date-time (length %zu)", len);
	memcpy(buf, s, len);
	buf[len] = '\0';
	if (memchr(buf, '\0', len) != NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "time: embedded NUL");

	year = digits_read(buf, 4);
	mon = digits_read(buf + 5, 2);
	day = digits_read(buf + 8, 2);
	hh = digits_read(buf + 11, 2);
	mm = digits_read(buf + 14, 2);
	ss = digits_read(buf + 17, 2);
	if (year < 0 || mon < 0 || day < 0 || hh < 0 || mm < 0 || ss < 0 ||
	    buf[4] != '-' || buf[7] != '-' ||
	    (buf[10] != 'T' && buf[10] != 't') ||
	    buf[13] != ':' || buf[16] != ':')
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "time: expected YYYY-MM-DDThh:mm:ss");
	if (mon < 1 || mon > 12 || day < 1 || day > days_in_month(year, mon) ||
	    hh > 23 || mm > 59 || ss > 60)
		return tt_err_set(err, TT_ERR_MALFORMED, "time: field out of range");

	i = 19;
	if (buf[i] == '.') {
		size_t start = ++i;

		while (i < len && buf[i] >= '0' && buf[i] <= '9')
			i++;
		if (i == start)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "time: empty fraction");
		/* Fraction truncated toward the past: seconds are floored. */
	}
	if (i < len && (buf[i] == 'Z' || buf[i] == 'z')) {
		i++;
	} else if (i < len && (buf[i] == '+' || buf[i] == '-')) {
		int oh, om;

		if (len - i < 6 || buf[i + 3] != ':')
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "time: bad offset");
		oh = digits_read(buf + i + 1, 2);
		om = digits_read(buf + i + 4, 2);
		if (oh < 0 || om < 0 || oh > 23 || om > 59)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "time: bad offset");
		off = (oh * 60 + om) * 60 * (buf[i] == '-' ? -1 : 1);
		i += 6;
	} else {
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "time: missing Z or offset");
	}
	if (i != len)
		return tt_err_set(err, TT_ERR_MALFORMED, "time: trailing bytes");
	/* Minutes of the day in UTC must be 23:59 for a leap second. */
	if (ss == 60 && ((hh * 60 + mm - off / 60) % 1440 + 1440) % 1440 != 1439)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "time: leap second outside 23:59 UTC");

	/* Local time minus its offset is UTC. */
	*out = days_from_civil(year, mon, day) * 86400 +
	       (int64_t)hh * 3600 + mm * 60 + ss - off;
	return 0;
}

/* rfc3339_format: unix seconds as "YYYY-MM-DDTHH:MM:SSZ"; -1 outside the
 * years 0000..9999, which RFC 3339 cannot express. */
int rfc3339_format(int64_t t, char out[TT_RFC3339_MAX])
{
	int64_t days, secs, y;
	int m, d;

	/* Floor division so times before 1970 land on the right day. */
	days = t / 86400;
	secs = t % 86400;
	if (secs < 0) {
		secs += 86400;
		days--;
	}
	civil_from_days(days, &y, &m, &d);
	if (y < 0 || y > 9999) {
		out[0] = '\0';
		return -1;
	}
	snprintf(out, TT_RFC3339_MAX, "%04d-%02d-%02dT%02d:%02d:%02dZ", (int)y,
	         m, d, (int)(secs / 3600), (int)(secs / 60 % 60),
	         (int)(secs % 60));
	return 0;
}

/* tt_now: wall-clock unix seconds (CLOCK_REALTIME: capabilities carry wall
 * times, so receivers compare against the wall clock). */
int64_t tt_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec;
}

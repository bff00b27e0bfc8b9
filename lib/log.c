/* Line-oriented logging to stderr, rate-limited per call site (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/uio.h>

static char log_role[32] = "tether";
static enum tt_log_level log_min = TT_LOG_INFO;

#define LOG_LINE_MAX 1024
#define LOG_SLOTS 64   /* call sites tracked at once (a power of two) */
#define LOG_PROBE 4    /* slots tried per site before one is evicted */
#define LOG_SHOWN_MAX 240 /* what a summary shows of a suppressed line */

/* One call site (its format string) and its current window. */
struct log_site {
	const char *fmt;           /* NULL: free slot */
	enum tt_log_level level;   /* of the last line seen */
	uint64_t window_ms;        /* start of the current window */
	unsigned emitted;          /* lines written in the window */
	unsigned suppressed;       /* lines counted, not written */
	bool varied;               /* the suppressed lines were not all one */
	uint64_t last_hash;        /* of the last message seen */
	char last[LOG_SHOWN_MAX];  /* the last message seen (cut) */
};

static struct log_site log_sites[LOG_SLOTS];
static unsigned log_pending;   /* sites with suppressed > 0 */
static uint64_t log_window_ms; /* the process-wide window */
static unsigned log_window_emitted;
/* Held while the tables are used. A thread (or a child forked while a
 * thread held it) that finds it taken writes its line unlimited instead of
 * waiting: logging never blocks. */
static atomic_flag log_busy = ATOMIC_FLAG_INIT;

/* tt_log_init: sets role name and minimum level. */
void tt_log_init(const char *role, enum tt_log_level min)
{
	const char *env = getenv("TETHER_LOG");

	snprintf(log_role, sizeof(log_role), "%s", role);
	log_min = min;
	if (env == NULL)
		return;
	if (strcmp(env, "debug") == 0)
		log_min = TT_LOG_DEBUG;
	else if (strcmp(env, "info") == 0)
		log_min = TT_LOG_INFO;
	else if (strcmp(env, "warn") == 0)
		log_min = TT_LOG_WARN;
	else if (strcmp(env, "error") == 0)
		log_min = TT_LOG_ERROR;
}

/* log_now_ms: the monotonic clock in milliseconds. */
static uint64_t log_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* log_hash: FNV-1a of a message, to tell repeats apart cheaply. */
static uint64_t log_hash(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

/* log_stamp: the wall-clock time as RFC 3339 UTC with milliseconds
 * ("2026-12-02T00:50:56.123Z") into buf; its length, or -1. */
static int log_stamp(char *buf, size_t cap)
{
	struct timespec ts;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	return snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
	                tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
	                tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
}

/* log_write: one whole line, "time role[pid] level: message"; a single
 * write(2) keeps lines from several processes on one terminal whole. */
static void log_write(enum tt_log_level level, const char *msg, size_t mlen)
{
	static const char *names[] = { "debug", "info", "warn", "error" };
	char line[LOG_LINE_MAX + 96];
	int n;

	n = log_stamp(line, sizeof(line));
	if (n < 0)
		return;
	n += snprintf(line + n, sizeof(line) - (size_t)n, " %s[%d] %s: ",
	              log_role, (int)getpid(), names[level]);
	if (n < 0)
		return;
	if (mlen > sizeof(line) - (size_t)n - 1)
		mlen = sizeof(line) - (size_t)n - 1;
	memcpy(line + n, msg, mlen);
	n += (int)mlen;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, (size_t)n);
}

/* log_summarize: writes what a site suppressed and clears it. A single
 * suppressed line is written as itself. */
static void log_summarize(struct log_site *s, uint64_t now)
{
	char msg[LOG_SHOWN_MAX + 96];
	double secs = (double)(now - s->window_ms) / 1000.0;
	int n;

	if (s->suppressed == 0)
		return;
	if (s->suppressed == 1)
		n = snprintf(msg, sizeof(msg), "%s", s->last);
	else if (!s->varied)
		n = snprintf(msg, sizeof(msg), "%s [… repeated %u times in %.1f s]",
		             s->last, s->suppressed, secs);
	else
		n = snprintf(msg, sizeof(msg),
		             "%s [… and %u lines like it in %.1f s, not shown]",
		             s->last, s->suppressed, secs);
	if (n > 0)
		log_write(s->level, msg, strlen(msg));
	s->suppressed = 0;
	s->varied = false;
	log_pending--;
}

/* log_flush_expired: summarizes every site whose window has ended. */
static void log_flush_expired(uint64_t now)
{
	for (size_t i = 0; i < LOG_SLOTS && log_pending > 0; i++) {
		struct log_site *s = &log_sites[i];

		if (s->fmt != NULL && s->suppressed > 0 &&
		    now - s->window_ms >= TT_LOG_WINDOW_MS)
			log_summarize(s, now);
	}
}

/* log_site_of: the slot of a call site, taken over from an older site when
 * every probed slot is in use (its pending summary is written first). */
static struct log_site *log_site_of(const char *fmt, uint64_t now)
{
	size_t h = (size_t)(((uintptr_t)fmt >> 3) * 2654435761u);
	struct log_site *victim = NULL;

	for (size_t i = 0; i < LOG_PROBE; i++) {
		struct log_site *s = &log_sites[(h + i) & (LOG_SLOTS - 1)];

		if (s->fmt == fmt)
			return s;
		if (s->fmt == NULL) {
			victim = s;
			break;
		}
		if (victim == NULL || s->window_ms < victim->window_ms)
			victim = s;
	}
	log_summarize(victim, now);
	memset(victim, 0, sizeof(*victim));
	victim->fmt = fmt;
	victim->window_ms = now;
	return victim;
}

/* log_admit: whether a message from site fmt is written now (else it is
 * counted for the site's summary). Caller holds log_busy. */
static bool log_admit(const char *fmt, enum tt_log_level level,
                      const char *msg, size_t mlen, uint64_t now)
{
	uint64_t h = log_hash(msg, mlen);
	struct log_site *s;
	bool repeat;

	if (log_pending > 0)
		log_flush_expired(now);
	if (now - log_window_ms >= TT_LOG_WINDOW_MS) {
		log_window_ms = now;
		log_window_emitted = 0;
	}
	s = log_site_of(fmt, now);
	if (now - s->window_ms >= TT_LOG_WINDOW_MS) {
		log_summarize(s, now);
		s->window_ms = now;
		s->emitted = 0;
	}
	repeat = s->emitted > 0 && h == s->last_hash;
	s->level = level;
	if (!repeat && s->emitted < TT_LOG_SITE_BURST &&
	    log_window_emitted < TT_LOG_TOTAL_BURST) {
		s->emitted++;
		log_window_emitted++;
		s->last_hash = h;
		snprintf(s->last, sizeof(s->last), "%.*s", (int)mlen, msg);
		return true;
	}
	if (s->suppressed++ == 0)
		log_pending++;
	if (h != s->last_hash)
		s->varied = true;
	s->last_hash = h;
	snprintf(s->last, sizeof(s->last), "%.*s", (int)mlen, msg);
	return false;
}

/* tt_log: formats the message, then writes it unless its call site is over
 * its budget (see log.h). */
void tt_log(enum tt_log_level level, const char *fmt, ...)
{
	char msg[LOG_LINE_MAX];
	va_list ap;
	size_t mlen;
	int m;

	if (level < log_min)
		return;
	va_start(ap, fmt);
	m = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	mlen = (size_t)m < sizeof(msg) ? (size_t)m : sizeof(msg) - 1;
	if (atomic_flag_test_and_set(&log_busy)) {
		log_write(level, msg, mlen);
		return;
	}
	if (log_admit(fmt, level, msg, mlen, log_now_ms()))
		log_write(level, msg, mlen);
	atomic_flag_clear(&log_busy);
}

/* tt_log_flush: see log.h. */
void tt_log_flush(void)
{
	if (atomic_flag_test_and_set(&log_busy))
		return;
	if (log_pending > 0)
		log_flush_expired(log_now_ms());
	atomic_flag_clear(&log_busy);
}

static uint64_t access_window_ms;
static unsigned access_emitted;
static uint64_t access_dropped;

/* tt_log_access: see log.h. */
void tt_log_access(const char *fields, size_t len)
{
	char head[160], stamp[40];
	struct iovec iov[3];
	uint64_t now = log_now_ms();
	int n;

	if (len < 2 || fields[0] != '{')
		return;
	if (now - access_window_ms >= TT_LOG_WINDOW_MS) {
		access_window_ms = now;
		access_emitted = 0;
	}
	if (access_emitted >= TT_LOG_ACCESS_BURST) {
		access_dropped++;
		return;
	}
	access_emitted++;
	if (log_stamp(stamp, sizeof(stamp)) < 0)
		return;
	n = snprintf(head, sizeof(head), "{\"ts\":\"%s\",\"role\":\"%s\",", stamp,
	             log_role);
	if (access_dropped > 0 && n > 0 && (size_t)n < sizeof(head))
		n += snprintf(head + n, sizeof(head) - (size_t)n,
		              "\"dropped_before\":%llu,",
		              (unsigned long long)access_dropped);
	if (n < 0 || (size_t)n >= sizeof(head))
		return;
	access_dropped = 0;
	if (len == 2) /* "{}": no fields */
		n--;
	iov[0] = (struct iovec){ head, (size_t)n };
	iov[1] = (struct iovec){ (void *)(fields + 1), len - 1 };
	iov[2] = (struct iovec){ "\n", 1 };
	(void)!writev(STDERR_FILENO, iov, 3);
}

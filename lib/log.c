/* Line-oriented logging to stderr (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char log_role[32] = "tether";
static enum tt_log_level log_min = TT_LOG_INFO;

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

/* tt_log: writes one line with a UTC timestamp; a single write(2) keeps
 * lines from several processes on one terminal whole. */
void tt_log(enum tt_log_level level, const char *fmt, ...)
{
	static const char *names[] = { "debug", "info", "warn", "error" };
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n, m;

	if (level < log_min)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld %s[%d] %s: ",
	             tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
	             log_role, (int)getpid(), names[level]);
	if (n < 0)
		return;
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	n += m;
	if ((size_t)n > sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, (size_t)n);
}

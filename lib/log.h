/* Logging to stderr: one line per event, "time role[pid] level: message",
 * time in RFC 3339 UTC with milliseconds; access records as JSON lines.
 * Never pass key material or tokens' signatures to these functions.
 *
 * Rate-limited, so that nobody can fill a disk through a log line they can
 * trigger (a refused token, an accept error): each call site (its format
 * string) writes at most TT_LOG_SITE_BURST lines per TT_LOG_WINDOW_MS, and
 * never the same message twice in a row within that window; all sites
 * together at most TT_LOG_TOTAL_BURST. What is held back is counted and
 * summarized once the window is over, on the next log call or
 * tt_log_flush(): "<last message> [… repeated N times in 1.0 s]", or
 * "[… and N lines like it …]" when they differed. */
#ifndef TT_LOG_H
#define TT_LOG_H

#include <stddef.h>

enum tt_log_level { TT_LOG_DEBUG, TT_LOG_INFO, TT_LOG_WARN, TT_LOG_ERROR };

#define TT_LOG_WINDOW_MS 1000
#define TT_LOG_SITE_BURST 10
#define TT_LOG_TOTAL_BURST 200

/* tt_log_init: sets the role name shown on each line and the minimum level
 * (TETHER_LOG=debug|info|warn|error overrides). */
void tt_log_init(const char *role, enum tt_log_level min);
void tt_log(enum tt_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* tt_log_flush: writes the summaries of windows that have ended; the
 * daemons' HTTP servers call it every second (lib/http.c). */
void tt_log_flush(void);

/* tt_log_access: an access-log record: fields is a compact JSON object
 * ("{...}", len bytes); the line written is that object with "ts" (RFC
 * 3339 UTC, milliseconds) and "role" first. Not rate-limited per site but
 * bounded in all (TT_LOG_ACCESS_BURST a second); the next line written
 * says how many were dropped ("dropped_before"). */
#define TT_LOG_ACCESS_BURST 2000
void tt_log_access(const char *fields, size_t len);

#define log_debug(...) tt_log(TT_LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  tt_log(TT_LOG_INFO, __VA_ARGS__)
#define log_warn(...)  tt_log(TT_LOG_WARN, __VA_ARGS__)
#define log_error(...) tt_log(TT_LOG_ERROR, __VA_ARGS__)

#endif

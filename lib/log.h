/* Logging to stderr: one line per event, "time role[pid] level: message".
 * Never pass key material or tokens' signatures to these functions. */
#ifndef TT_LOG_H
#define TT_LOG_H

enum tt_log_level { TT_LOG_DEBUG, TT_LOG_INFO, TT_LOG_WARN, TT_LOG_ERROR };

/* tt_log_init: sets the role name shown on each line and the minimum level
 * (TETHER_LOG=debug|info|warn|error overrides). */
void tt_log_init(const char *role, enum tt_log_level min);
void tt_log(enum tt_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define log_debug(...) tt_log(TT_LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  tt_log(TT_LOG_INFO, __VA_ARGS__)
#define log_warn(...)  tt_log(TT_LOG_WARN, __VA_ARGS__)
#define log_error(...) tt_log(TT_LOG_ERROR, __VA_ARGS__)

#endif

/* Error objects (see err.h). */
#include "err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* tt_err_vset: shared body of the setters. */
static void tt_err_vset(struct tt_err *err, enum tt_errc code, int sys_errno,
                        const char *fmt, va_list ap)
{
	err->code = code;
	err->sys_errno = sys_errno;
	err->detail = 0;
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
}

/* tt_err_set: records code and message; returns -1. */
int tt_err_set(struct tt_err *err, enum tt_errc code, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL)
		return -1;
	va_start(ap, fmt);
	tt_err_vset(err, code, 0, fmt, ap);
	va_end(ap);
	return -1;
}

/* tt_err_verify: records a failed verification and what failed. */
int tt_err_verify(struct tt_err *err, int detail, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL)
		return -1;
	va_start(ap, fmt);
	tt_err_vset(err, TT_ERR_VERIFY, 0, fmt, ap);
	va_end(ap);
	err->detail = detail;
	return -1;
}

/* tt_err_sys: records code, message and strerror(errno); returns -1. */
int tt_err_sys(struct tt_err *err, enum tt_errc code, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	size_t len;

	if (err == NULL)
		return -1;
	va_start(ap, fmt);
	tt_err_vset(err, code, saved, fmt, ap);
	va_end(ap);
	len = strlen(err->msg);
	if (len < sizeof(err->msg))
		snprintf(err->msg + len, sizeof(err->msg) - len, ": %s",
		         strerror(saved));
	errno = saved;
	return -1;
}

/* tt_err_clear: resets an error to TT_OK. */
void tt_err_clear(struct tt_err *err)
{
	if (err == NULL)
		return;
	err->code = TT_OK;
	err->sys_errno = 0;
	err->detail = 0;
	err->msg[0] = '\0';
}

/* tt_errc_name: stable short name of an error code. */
const char *tt_errc_name(enum tt_errc code)
{
	switch (code) {
	case TT_OK: return "ok";
	case TT_ERR_INVALID: return "invalid";
	case TT_ERR_MALFORMED: return "malformed";
	case TT_ERR_SIGNATURE: return "bad_signature";
	case TT_ERR_UNKNOWN_KEY: return "unknown_key";
	case TT_ERR_TOO_LARGE: return "too_large";
	case TT_ERR_NOMEM: return "out_of_memory";
	case TT_ERR_IO: return "io";
	case TT_ERR_SYS: return "system";
	case TT_ERR_NOT_FOUND: return "not_found";
	case TT_ERR_CONFLICT: return "conflict";
	case TT_ERR_TRANSPORT: return "transport";
	case TT_ERR_VERIFY: return "verify";
	case TT_ERR_DENIED: return "denied";
	}
	return "unknown";
}

/* Errors as values: library code never exits, it fills a tt_err and returns
 * -1 (or NULL). The caller decides what to print or answer. */
#ifndef TT_ERR_H
#define TT_ERR_H

#include <stddef.h>

enum tt_errc {
	TT_OK = 0,
	TT_ERR_INVALID,     /* bad argument or usage */
	TT_ERR_MALFORMED,   /* input does not parse (token, claims, frame, JSON) */
	TT_ERR_SIGNATURE,   /* signature does not verify */
	TT_ERR_UNKNOWN_KEY, /* kid not in the key bundle (or outside its window) */
	TT_ERR_TOO_LARGE,   /* input over a fixed bound */
	TT_ERR_NOMEM,
	TT_ERR_IO,          /* file or socket I/O */
	TT_ERR_SYS,         /* other system call failure (errno in sys_errno) */
	TT_ERR_NOT_FOUND,
	TT_ERR_CONFLICT,
	TT_ERR_TRANSPORT,   /* a peer went away or broke the protocol */
	TT_ERR_VERIFY,      /* a peer failed identity verification */
	TT_ERR_DENIED,      /* refused by a policy decision */
};

struct tt_err {
	enum tt_errc code;
	int sys_errno;      /* errno when code is TT_ERR_SYS/IO, else 0 */
	int detail;         /* TT_ERR_VERIFY: what failed, an enum refusal
	                     * (lib/refusal.h); else 0 */
	char msg[256];
};

/* tt_err_set: records code and message; always returns -1. err may be NULL. */
int tt_err_set(struct tt_err *err, enum tt_errc code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* tt_err_sys: like tt_err_set, appends strerror(errno) and keeps errno. */
int tt_err_sys(struct tt_err *err, enum tt_errc code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* tt_err_verify: TT_ERR_VERIFY with its detail (enum refusal); returns
 * -1. err may be NULL. */
int tt_err_verify(struct tt_err *err, int detail, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* tt_err_clear: resets to TT_OK. */
void tt_err_clear(struct tt_err *err);
/* tt_errc_name: short stable name of a code ("malformed", ...). */
const char *tt_errc_name(enum tt_errc code);

#endif

/* RFC 3339 times for capability claims. Implementation: lib/timefmt.c. */
#ifndef TT_TIMEFMT_H
#define TT_TIMEFMT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define TT_RFC3339_MAX 40

/* rfc3339_parse: strict RFC 3339 date-time ("2026-11-29T23:09:12Z",
 * optional fraction, "Z" or ±hh:mm offset) to unix seconds (fraction
 * truncated toward the past). Rejects out-of-range fields, missing parts,
 * trailing bytes. */
int rfc3339_parse(const char *s, size_t len, int64_t *out, struct tt_err *err);
/* rfc3339_format: unix seconds as "YYYY-MM-DDTHH:MM:SSZ". */
int rfc3339_format(int64_t t, char out[TT_RFC3339_MAX]);
/* tt_now: wall-clock unix seconds. */
int64_t tt_now(void);

#endif

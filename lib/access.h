/* Access records: one JSON line per answered request or ended stream,
 * written by the edge and node-api through lib/log.c (tt_log_access),
 * carrying the request id that follows an operation across the hops. */
#ifndef TT_ACCESS_H
#define TT_ACCESS_H

#include <stddef.h>
#include <stdint.h>

struct tt_access {
	const char *rid;       /* X-Request-Id, as sent on to the cp and node */
	const char *method;
	const char *route;     /* a receiver's route name (node-api), or NULL */
	const char *path;      /* no query string: it may carry file names */
	const char *sbx;
	long status;           /* 0: the client went away before an answer */
	const char *result;    /* an exec stream's end (exit, deny, …) */
	const char *decision;  /* the last refusal a receiver answered for it:
	                        * refresh_route | deny */
	const char *reason;
	int rebuilt;           /* the one rebuilt attempt after RefreshRoute */
	uint64_t generation;   /* the execution that served it, 0 none */
	uint64_t dur_us;
	uint64_t bytes_in;
	uint64_t bytes_out;
};
/* access_log: one JSON line for a (lib/log.h tt_log_access). */
void access_log(const struct tt_access *a);
/* access_refusal_note: decision and reason of a §4 refusal body (copied
 * into dec/reason, "" when body is not one). */
void access_refusal_note(const char *body, size_t len, char *dec, size_t dcap,
                         char *reason, size_t rcap);

#endif

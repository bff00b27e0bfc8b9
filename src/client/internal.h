/* libtether internals: the one request layer (src/client/client.c) that
 * every call uses, so the recovery rules and error semantics are the same
 * for operations and lifecycle calls alike. Not part of the public API. */
#ifndef TT_CLIENT_INTERNAL_H
#define TT_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "client/tether.h"
#include "err.h"

#define TETHER_JSON_MAX (4u << 20)    /* lifecycle answers */
#define TETHER_ERROR_MAX (64u * 1024) /* error bodies of streamed calls */

/* Where an answer's body goes: memory (bounded) or, for a 2xx file
 * download, a file descriptor. */
struct sink {
	CURL *easy;
	char *buf;     /* owned by the sink; the caller frees it */
	size_t len;
	size_t cap;
	size_t max;
	int fd;        /* >= 0: 2xx bodies go here */
	uint64_t fd_bytes;
	int overflow;  /* body exceeded max */
	int io_errno;  /* write to fd failed */
};

/* Upload source: a file descriptor read in order. */
struct source {
	int fd;
	uint64_t left;
	int io_errno;
};

/* One call. path must be URL-safe (see tether_id_path); body (borrowed) is
 * sent as JSON, or src streamed instead; timeout_s bounds the whole call
 * (0: no bound). */
struct tether_call {
	const char *method;
	const char *path;
	json_t *body;
	struct source *src;
	long timeout_s;
};

/* tether_request: one call with the recovery rules of client.c. The answer
 * goes to sink; returns the HTTP status (2xx) or -1 with err filled. */
long tether_request(struct tether *t, const struct tether_call *c,
                    struct sink *sink, struct tt_err *err);
/* tether_json_call: a call whose answer is a JSON object of at most max
 * bytes (caller decrefs), or NULL with err. */
json_t *tether_json_call(struct tether *t, const struct tether_call *c,
                         size_t max, struct tt_err *err);
/* tether_id_path: "/v1/sandboxes/ID[suffix]" with ID escaped (caller
 * frees), or NULL with err. suffix must be URL-safe. */
char *tether_id_path(struct tether *t, const char *id, const char *suffix,
                     struct tt_err *err);

#endif

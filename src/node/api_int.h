/* node-api: what the pieces of its HTTP front door share (api.c, api_op.c,
 * api_stream.c, node.c): one operation in flight and the calls between
 * them. Private to src/node/. */
#ifndef TT_NODE_API_INT_H
#define TT_NODE_API_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libwebsockets.h>

#include "claims.h"
#include "err.h"
#include "http.h"
#include "node/mgrconn.h"
#include "wirecode.h"
#include "node/node.h"
#include "wire.h"

#define API_PATH_MAX 4096
#define API_OUT_MAX (16u << 20)      /* exec stdout / stderr each */
#define API_STREAM_HIGH (1u << 20)   /* GET: pause the manager above this */
#define API_STREAM_LOW (256u << 10)
#define API_WHOLE_MAX (64u << 10)    /* GET: complete this small: one write */
/* A small read is held until RESULT (no writes before), so it must never
 * need the backpressure pause to drain. */
_Static_assert(API_WHOLE_MAX < API_STREAM_HIGH, "small reads never pause");
#define API_PENDING_MAX (1u << 20)   /* PUT bytes held before admission */
#define API_LIST_MAX 10000           /* entries in one listing */
#define API_LIST_BYTES_MAX (4u << 20) /* NDJSON bytes of one listing */

enum api_route {
	R_EXEC, R_FILES_GET, R_FILES_PUT, R_FILES_DELETE, R_STAT, R_LIST,
	R_MKDIR, R_METRICS, R_HEALTHZ, R_OTHER, R_COUNT
};

/* Route names for logs and metric labels (api.c). */
extern const char *const api_route_names[R_COUNT];
/* The HTTP protocols node-api serves (api.c; streamed exec: ws_exec.c). */
extern const struct lws_protocols api_protocols[];

/* A growable byte buffer with a cap (owner: the op). */
struct api_buf {
	uint8_t *p;
	size_t len;
	bool truncated;
};

/* One queued chunk of a streamed GET body. */
struct api_chunk {
	struct api_chunk *next;
	size_t len;
	uint8_t data[];
};

/* OP_DRAIN: an upload answered before its body was in; the rest of the
 * body is dropped, then the transaction completes (lib/http.h). */
enum op_state { OP_BODY, OP_DECISION, OP_RUNNING, OP_REPLY, OP_STREAM, OP_DRAIN };

/* One HTTP operation in flight. Owner: the lws session (pss->op); freed
 * when the reply is complete or the HTTP connection goes away. */
struct api_op {
	struct node *n;
	struct lws *wsi;
	struct wireconn *mc;
	enum api_route route;
	enum op_state state;
	char sbx[TT_SBX_ID_LEN + 1];
	char rid[HTTP_RID_MAX + 1];  /* X-Request-Id, for the access line */
	uint64_t t0_us;
	json_t *req;                /* REQUEST being built (owned) */
	struct http_body body;      /* exec JSON body */
	/* exec */
	char *stdin_data;
	size_t stdin_len;
	struct api_buf out, err;
	/* the reply, once known */
	unsigned status;
	char *reply;
	size_t reply_len;
	bool close_after;           /* request body not fully read */
	/* GET stream: META gives content_len; got counts bytes from the
	 * manager, sent bytes handed to lws */
	struct api_chunk *q_head, *q_tail;
	size_t q_bytes;
	uint64_t content_len, got, sent;
	bool have_meta, headers_sent, stream_end, stream_abort, mc_paused;
	/* list: NDJSON entries are collected in out; lines counted */
	size_t list_lines;
	/* PUT */
	bool allowed, body_done, rx_paused, eof_sent;
	/* "Expect: 100-continue" (the edge's uploads): the client holds the
	 * body until admission, answered 100 Continue on Allow */
	bool expect;
	uint64_t drained;           /* OP_DRAIN: body bytes dropped */
	struct api_buf pending;
	/* bodiless requests: client bytes after the request (http.h) */
	struct http_rxguard *rxg;
};

struct api_pss {
	struct api_op *op;
};

/* ---- api_op.c --------------------------------------------------------- */

/* api_now_us: monotonic microseconds for latency metrics. */
uint64_t api_now_us(void);
/* buf_append: appends up to cap bytes in total; the rest is dropped and
 * marked truncated. */
int buf_append(struct api_buf *b, const void *data, size_t len,
               size_t cap);
/* What one answered request was, for its metrics and its access line. */
struct api_done {
	enum api_route route;
	unsigned status;             /* 599: a stream broken after its 200 */
	uint64_t t0_us;
	const char *rid;             /* X-Request-Id (the edge's), or ours */
	const char *sbx;             /* NULL when refused before it was known */
	const char *body;            /* the answer when it is JSON, else NULL */
	size_t body_len;
	uint64_t bytes_in, bytes_out;
};
/* api_count: request metrics by route and status, latency, and one
 * access line (lib/access.h) with the request id the edge sent. */
void api_count(const struct api_done *d);
/* api_op_count: api_count for an operation as it is answered. */
void api_op_count(const struct api_op *op, unsigned status);
/* op_free: releases everything the op owns, including its manager
 * connection (no callbacks after this). */
void op_free(struct api_op *op);
/* op_reply_error: the uniform {"error","message"} body, with the status
 * of code (lib/wirecode.h). */
void op_reply_error(struct api_op *op, enum wire_code code, const char *msg);
/* deny_malformed_json: the §4 Deny body for an unusable capability header. */
char *deny_malformed_json(const char *sbx);
/* op_send: queues bytes to the manager (an empty payload is one empty
 * frame, e.g. EOF_IN); a failure ends the op. */
bool op_send(struct api_op *op, uint8_t type, const void *data,
             size_t len);
/* put_flush: forwards held PUT bytes once admitted, then EOF_IN when the
 * body is complete; resumes reading the client while the pipe is short.
 * A body can be complete while rx is still paused: lws hands over the rest
 * of a read it already made, after the pause, and with a large service
 * buffer (pt_serv_buf_size) a small body arrives in the read that carried
 * the headers. rx is resumed then too: nothing is left to hold back, and a
 * paused wsi never gets its reply written (op_rx_resume). */
void put_flush(struct api_op *op);
/* op_start: opens the manager connection with the REQUEST. */
void op_start(struct api_op *op);

/* ---- api_stream.c ----------------------------------------------------- */

/* stream_fail: a file read went wrong. Before the headers are out the
 * client gets an error answer; after, only a connection closed short of
 * Content-Length tells it the file is incomplete. */
void stream_fail(struct api_op *op, enum wire_code code, const char *msg);
/* stream_on_meta: META {"size":N} of a file read: the headers can go out
 * with Content-Length N. Exactly one META, before any byte. */
void stream_on_meta(struct api_op *op, const struct wire_frame *f);
/* stream_push: queues one GET body chunk; pauses the manager when the
 * client is slower than the sandbox. More bytes than announced is a
 * protocol violation, never passed on. */
void stream_push(struct api_op *op, const uint8_t *data, size_t len);
/* list_feed: NDJSON bytes of a listing, bounded in entries and bytes (the
 * guest is not trusted to keep its own limit). */
void list_feed(struct api_op *op, const uint8_t *data, size_t len);
/* list_build: the collected NDJSON -> an "entries" array of objects; NULL
 * when a line is not a JSON object or the count differs from the guest's
 * entries_total. */
json_t *list_build(struct api_op *op, json_t *total);
/* stream_write: one step of a streamed GET: the headers with
 * Content-Length, one body piece, or an abort (closing the connection short
 * of the announced length). The last piece goes out, marked final, only
 * once the guest's RESULT confirmed the read. */
int stream_write(struct lws *wsi, struct api_pss *pss, struct api_op *op);

#endif

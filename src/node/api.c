/* node-api: the worker's HTTP front door (docs/API.md "Node-api").
 * Every operation opens its own connection to the sbx-manager, which admits
 * it (SPEC §4) before anything reaches the sandbox; refusals are passed on
 * unchanged. Exec output is collected into one JSON answer; file reads are
 * streamed with Content-Length (the guest announces the size in META before
 * the bytes; a broken stream closes the connection short of that length, so
 * the client sees it) and file writes are streamed in with backpressure both
 * ways. Directory listings arrive as newline-delimited JSON entries and are
 * answered as one bounded JSON body.
 *
 * Exec stdout/stderr are JSON strings: bytes that are not valid UTF-8 are
 * replaced by U+FFFD (binary output belongs in a file read). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "claims.h"
#include "cleanup.h"
#include "decision.h"
#include "http.h"
#include "paseto.h"
#include "log.h"
#include "metrics.h"
#include "node/mgrconn.h"
#include "node/node.h"
#include "node/paths.h"
#include "node/ws_exec.h"
#include "tetherd/roles.h"
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
#define API_READY_TIMEOUT_MS 10000
#define API_READY_RETRY_MS 50

enum api_route {
	R_EXEC, R_FILES_GET, R_FILES_PUT, R_FILES_DELETE, R_STAT, R_LIST,
	R_MKDIR, R_METRICS, R_HEALTHZ, R_OTHER, R_COUNT
};

static const char *const route_names[R_COUNT] = {
	"exec", "files_get", "files_put", "files_delete", "stat", "list",
	"mkdir", "metrics", "healthz", "other",
};

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
	struct mgrconn *mc;
	enum api_route route;
	enum op_state state;
	char sbx[TT_SBX_ID_LEN + 1];
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

/* ---- small helpers ----------------------------------------------------- */

/* now_us: monotonic microseconds for latency metrics. */
static uint64_t now_us(void)
{
	return uv_hrtime() / 1000u;
}

/* buf_append: appends up to cap bytes in total; the rest is dropped and
 * marked truncated. */
static int buf_append(struct api_buf *b, const void *data, size_t len,
                      size_t cap)
{
	uint8_t *nb;

	if (b->len + len > cap) {
		b->truncated = true;
		len = cap - b->len;
	}
	if (len == 0)
		return 0;
	nb = realloc(b->p, b->len + len);
	if (nb == NULL)
		return -1;
	b->p = nb;
	memcpy(b->p + b->len, data, len);
	b->len += len;
	return 0;
}

/* utf8_seq_len: length of the valid UTF-8 sequence at s, 0 if invalid. */
static size_t utf8_seq_len(const uint8_t *s, size_t n)
{
	uint8_t c = s[0];
	size_t len;
	uint32_t cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, cp = c & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates and values past U+10FFFF are invalid. */
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

/* utf8_json_string: bytes -> JSON string, invalid bytes as U+FFFD. */
static json_t *utf8_json_string(const uint8_t *s, size_t n)
{
	_cleanup_free_ char *o = malloc(n * 3 + 1);
	size_t i = 0, w = 0;

	if (o == NULL)
		return NULL;
	while (i < n) {
		size_t l = utf8_seq_len(s + i, n - i);

		if (l == 0) {
			memcpy(o + w, "\xef\xbf\xbd", 3);
			w += 3;
			i++;
			continue;
		}
		memcpy(o + w, s + i, l);
		w += l;
		i += l;
	}
	return json_stringn(o, w);
}

/* api_count: request metrics by route and status, and latency. */
static void api_count(enum api_route r, unsigned status, uint64_t t0_us)
{
	char labels[96];

	snprintf(labels, sizeof(labels), "route=\"%s\",code=\"%u\"",
	         route_names[r], status);
	metrics_inc("tether_node_requests_total", labels);
	snprintf(labels, sizeof(labels), "route=\"%s\"", route_names[r]);
	metrics_observe_us("tether_node_request_duration_us", labels,
	                   now_us() - t0_us);
}

/* guest_error_status: HTTP status for a guest/manager ERROR code. */
static unsigned guest_error_status(const char *code)
{
	static const struct { const char *code; unsigned status; } map[] = {
		{ "not_found", 404 }, { "path_invalid", 400 },
		{ "bad_request", 400 }, { "exists", 409 }, { "not_dir", 409 },
		{ "is_dir", 409 }, { "permission", 403 }, { "too_large", 413 },
		{ "no_space", 507 }, { "transport", 502 },
	};

	for (size_t i = 0; code != NULL && i < sizeof(map) / sizeof(map[0]); i++)
		if (strcmp(code, map[i].code) == 0)
			return map[i].status;
	return 500;
}

/* ---- op lifetime ------------------------------------------------------- */

/* op_free: releases everything the op owns, including its manager
 * connection (no callbacks after this). */
static void op_free(struct api_op *op)
{
	struct api_chunk *c, *next;

	if (op == NULL)
		return;
	mgrconn_close(op->mc);
	http_rxguard_stop(op->rxg);
	json_decref(op->req);
	http_body_free(&op->body);
	if (op->stdin_data != NULL)
		sodium_memzero(op->stdin_data, op->stdin_len);
	free(op->stdin_data);
	free(op->out.p);
	free(op->err.p);
	free(op->pending.p);
	free(op->reply);
	for (c = op->q_head; c != NULL; c = next) {
		next = c->next;
		free(c);
	}
	free(op);
}

/* op_rx_resume: lets lws read the client again. lws 4.1's h1 handler
 * returns early for a wsi whose rx is flow-controlled, POLLOUT included:
 * a writable request made while paused is never served and never cleared,
 * so the level-triggered EPOLLOUT wakes the loop forever (a 100 % CPU spin)
 * and the reply never goes out. Every reply therefore resumes rx first. */
static void op_rx_resume(struct api_op *op)
{
	if (!op->rx_paused || op->wsi == NULL)
		return;
	op->rx_paused = false;
	lws_rx_flow_control(op->wsi, 1);
}

/* op_reply: records the final answer and asks lws for a write slot
 * (replies are written from LWS_CALLBACK_HTTP_WRITEABLE). body is taken. */
static void op_reply(struct api_op *op, unsigned status, char *body)
{
	mgrconn_close(op->mc);
	op->mc = NULL;
	free(op->reply);
	op->status = status;
	op->reply = body;
	op->reply_len = body ? strlen(body) : 0;
	op->state = OP_REPLY;
	/* An upload answered before its body is in (a refusal, a guest
	 * error, no space): answered, then drained (OP_DRAIN). */
	op_rx_resume(op);
	if (op->wsi != NULL)
		lws_callback_on_writable(op->wsi);
}

/* op_reply_json: steals obj. */
static void op_reply_json(struct api_op *op, unsigned status, json_t *obj)
{
	char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;

	json_decref(obj);
	if (s == NULL) {
		op_reply(op, 500, strdup("{\"error\":\"internal\",\"message\":\"out of memory\"}"));
		return;
	}
	op_reply(op, status, s);
}

/* op_reply_error: the uniform {"error","message"} body. */
static void op_reply_error(struct api_op *op, unsigned status,
                           const char *code, const char *msg)
{
	op_reply_json(op, status, json_pack("{s:s,s:s}", "error", code,
	                                    "message", msg));
}

/* deny_malformed_json: the §4 Deny body for an unusable capability header. */
static char *deny_malformed_json(const char *sbx)
{
	json_t *o = json_pack("{s:s,s:s,s:s}", "decision", "deny", "reason",
	                      "malformed", "sandbox", sbx);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

/* ---- manager side ------------------------------------------------------ */

/* op_send: queues bytes to the manager (an empty payload is one empty
 * frame, e.g. EOF_IN); a failure ends the op. */
static bool op_send(struct api_op *op, uint8_t type, const void *data,
                    size_t len)
{
	struct tt_err err = { 0 };
	int rc = len == 0 ? mgrconn_send(op->mc, type, data, 0, &err)
	                  : mgrconn_send_data(op->mc, type, data, len, &err);

	if (rc == 0)
		return true;
	log_warn("%s %s: %s", route_names[op->route], op->sbx, err.msg);
	op_reply_error(op, 502, "transport", "lost the manager connection");
	return false;
}

/* put_flush: forwards held PUT bytes once admitted, then EOF_IN when the
 * body is complete; resumes reading the client while the pipe is short.
 * A body can be complete while rx is still paused: lws hands over the rest
 * of a read it already made, after the pause, and with a large service
 * buffer (pt_serv_buf_size) a small body arrives in the read that carried
 * the headers. rx is resumed then too: nothing is left to hold back, and a
 * paused wsi never gets its reply written (op_rx_resume). */
static void put_flush(struct api_op *op)
{
	if (op->pending.len > 0) {
		if (!op_send(op, WIRE_DATA_IN, op->pending.p, op->pending.len))
			return;
		free(op->pending.p);
		op->pending.p = NULL;
		op->pending.len = 0;
	}
	if (op->body_done) {
		uint8_t none = 0;

		/* once: a drain after the last bytes calls here again */
		if (!op->eof_sent && !op_send(op, WIRE_EOF_IN, &none, 0))
			return;
		op->eof_sent = true;
		op_rx_resume(op);
		return;
	}
	if (mgrconn_queued(op->mc) < MGRCONN_HIGH_WATER)
		op_rx_resume(op);
}

/* op_on_decision: Allow continues the operation; anything else is the
 * answer, passed on unchanged. */
static void op_on_decision(struct api_op *op, const struct wire_frame *f)
{
	enum tt_verdict v;
	json_t *obj = mgrconn_decision(f, &v);

	if (obj == NULL) {
		op_reply_error(op, 502, "transport", "manager sent an invalid decision");
		return;
	}
	json_decref(obj);
	if (v != TT_ALLOW) {
		op_reply(op, (unsigned)decision_http_status(v),
		         strndup((const char *)f->payload, f->len));
		return;
	}
	op->state = OP_RUNNING;
	op->allowed = true;
	if (op->route == R_EXEC && op->stdin_data != NULL) {
		uint8_t none = 0;

		if (!op_send(op, WIRE_DATA_IN, op->stdin_data, op->stdin_len) ||
		    !op_send(op, WIRE_EOF_IN, &none, 0))
			return;
	}
	if (op->route == R_FILES_PUT) {
		if (op->expect && !op->body_done && op->wsi != NULL &&
		    http_continue(op->wsi) < 0)
			log_warn("%s %s: cannot send 100 Continue", route_names[op->route],
			         op->sbx);
		put_flush(op);
	}
}

/* stream_fail: a file read went wrong. Before the headers are out the
 * client gets an error answer; after, only a connection closed short of
 * Content-Length tells it the file is incomplete. */
static void stream_fail(struct api_op *op, unsigned status, const char *code,
                        const char *msg)
{
	if (!op->headers_sent) {
		op_reply_error(op, status, code, msg);
		return;
	}
	log_warn("files_get %s: broken after the headers: %s", op->sbx, msg);
	mgrconn_close(op->mc);
	op->mc = NULL;
	op->stream_abort = true;
	op->state = OP_STREAM;
	if (op->wsi != NULL)
		lws_callback_on_writable(op->wsi);
}

/* stream_on_meta: META {"size":N} of a file read: the headers can go out
 * with Content-Length N. Exactly one META, before any byte. */
static void stream_on_meta(struct api_op *op, const struct wire_frame *f)
{
	json_error_t jerr;
	json_t *m = json_loadb((const char *)f->payload, f->len,
	                       JSON_REJECT_DUPLICATES, &jerr);
	json_t *size = json_object_get(m, "size");

	if (op->have_meta || !json_is_integer(size) ||
	    json_integer_value(size) < 0) {
		json_decref(m);
		stream_fail(op, 502, "transport", "the sandbox sent an invalid META");
		return;
	}
	op->content_len = (uint64_t)json_integer_value(size);
	op->have_meta = true;
	op->state = OP_STREAM;
	json_decref(m);
	/* A small read waits for RESULT and then goes out whole (headers and
	 * body in one write, stream_write_whole); it never reaches
	 * API_STREAM_HIGH, so the manager is never paused waiting on it. */
	if (op->content_len > API_WHOLE_MAX)
		lws_callback_on_writable(op->wsi);
}

/* stream_push: queues one GET body chunk; pauses the manager when the
 * client is slower than the sandbox. More bytes than announced is a
 * protocol violation, never passed on. */
static void stream_push(struct api_op *op, const uint8_t *data, size_t len)
{
	struct api_chunk *c;

	if (!op->have_meta || len > op->content_len - op->got) {
		stream_fail(op, 502, "transport",
		            op->have_meta ? "the sandbox sent more bytes than announced"
		                          : "the sandbox sent bytes before META");
		return;
	}
	c = malloc(sizeof(*c) + len);
	if (c == NULL) {
		stream_fail(op, 500, "internal", "out of memory");
		return;
	}
	op->got += len;
	c->next = NULL;
	c->len = len;
	memcpy(c->data, data, len);
	if (op->q_tail)
		op->q_tail->next = c;
	else
		op->q_head = c;
	op->q_tail = c;
	op->q_bytes += len;
	op->state = OP_STREAM;
	if (op->q_bytes > API_STREAM_HIGH && !op->mc_paused) {
		op->mc_paused = true;
		mgrconn_pause(op->mc);
	}
}

/* list_feed: NDJSON bytes of a listing, bounded in entries and bytes (the
 * guest is not trusted to keep its own limit). */
static void list_feed(struct api_op *op, const uint8_t *data, size_t len)
{
	for (size_t i = 0; i < len; i++)
		op->list_lines += data[i] == '\n';
	if (op->list_lines > API_LIST_MAX) {
		op_reply_error(op, 413, "too_large",
		               "the directory has more than 10000 entries");
		return;
	}
	if (buf_append(&op->out, data, len, API_LIST_BYTES_MAX) < 0) {
		op_reply_error(op, 500, "internal", "out of memory");
		return;
	}
	if (op->out.truncated)
		op_reply_error(op, 413, "too_large", "the listing is over 4 MiB");
}

/* list_build: the collected NDJSON -> an "entries" array of objects; NULL
 * when a line is not a JSON object or the count differs from the guest's
 * entries_total. */
static json_t *list_build(struct api_op *op, json_t *total)
{
	json_t *arr = json_array();
	size_t off = 0;

	if (arr == NULL || !json_is_integer(total) ||
	    json_integer_value(total) != (json_int_t)op->list_lines ||
	    (op->out.len > 0 && op->out.p[op->out.len - 1] != '\n'))
		goto bad;
	while (off < op->out.len) {
		const uint8_t *nl = memchr(op->out.p + off, '\n', op->out.len - off);
		size_t l = (size_t)(nl - (op->out.p + off));
		json_error_t jerr;
		json_t *e = json_loadb((const char *)op->out.p + off, l,
		                       JSON_REJECT_DUPLICATES, &jerr);

		if (!json_is_object(e) || json_array_append_new(arr, e) < 0) {
			json_decref(e);
			goto bad;
		}
		off += l + 1;
	}
	return arr;
bad:
	json_decref(arr);
	return NULL;
}

/* op_on_result: RESULT ends the operation successfully. */
static void op_on_result(struct api_op *op, const struct wire_frame *f)
{
	json_error_t jerr;
	json_t *res = json_loadb((const char *)f->payload, f->len,
	                         JSON_REJECT_DUPLICATES, &jerr);
	json_t *entries;

	if (!json_is_object(res)) {
		json_decref(res);
		if (op->route == R_FILES_GET) {
			stream_fail(op, 502, "transport", "manager sent an invalid result");
			return;
		}
		op_reply_error(op, 502, "transport", "manager sent an invalid result");
		return;
	}
	switch (op->route) {
	case R_EXEC:
		json_object_set_new(res, "stdout", utf8_json_string(op->out.p, op->out.len));
		json_object_set_new(res, "stderr", utf8_json_string(op->err.p, op->err.len));
		if (op->out.truncated || op->err.truncated)
			json_object_set_new(res, "truncated", json_true());
		op_reply_json(op, 200, res);
		return;
	case R_FILES_GET:
		/* Only the announced length, complete, ends a read well. */
		if (!op->have_meta || op->got != op->content_len ||
		    !json_is_integer(json_object_get(res, "size")) ||
		    (uint64_t)json_integer_value(json_object_get(res, "size")) !=
		            op->content_len) {
			json_decref(res);
			stream_fail(op, 502, "transport",
			            "the sandbox ended the read short of its size");
			return;
		}
		json_decref(res);
		mgrconn_close(op->mc);
		op->mc = NULL;
		op->stream_end = true;
		op->state = OP_STREAM;
		lws_callback_on_writable(op->wsi);
		return;
	case R_LIST:
		entries = list_build(op, json_object_get(res, "entries_total"));
		if (entries == NULL) {
			json_decref(res);
			op_reply_error(op, 502, "transport",
			               "the sandbox sent an invalid listing");
			return;
		}
		json_object_del(res, "entries_total");
		json_object_set_new(res, "entries", entries);
		op_reply_json(op, 200, res);
		return;
	default:
		op_reply_json(op, 200, res);
		return;
	}
}

/* op_on_error: ERROR from the manager, bridge or guest. */
static void op_on_error(struct api_op *op, const struct wire_frame *f)
{
	json_error_t jerr;
	json_t *obj = json_loadb((const char *)f->payload, f->len,
	                         JSON_REJECT_DUPLICATES, &jerr);
	const char *code = json_string_value(json_object_get(obj, "error"));
	const char *msg = json_string_value(json_object_get(obj, "message"));

	if (op->route == R_FILES_GET && op->headers_sent) {
		/* The headers promised a length: only a broken transfer tells
		 * the client the file is incomplete. */
		log_warn("files_get %s: error after the headers: %s: %s", op->sbx,
		         code ? code : "?", msg ? msg : "");
		json_decref(obj);
		stream_fail(op, 500, "internal", "error after the headers");
		return;
	}
	/* A stream that got no byte yet answers like any other error. */
	op->state = OP_RUNNING;
	if (code != NULL && strcmp(code, "refresh_route") == 0) {
		/* admitted, then its execution was retired while it ran: it may
		 * have run, so it is a transport failure to the caller (a read
		 * is retried, a write or exec never repeated), not a refusal */
		op_reply_error(op, 502, "transport", "the execution was retired while "
		               "this operation ran: it may or may not have run");
		json_decref(obj);
		return;
	}
	op_reply_error(op, guest_error_status(code), code ? code : "internal",
	               msg ? msg : "operation failed");
	json_decref(obj);
}

/* op_on_frame: frames from the manager, by operation state. */
static void op_on_frame(void *arg, const struct wire_frame *f)
{
	struct api_op *op = arg;

	if (op->state == OP_REPLY)
		return;
	if (!op->allowed) {
		if (f->type == WIRE_DECISION)
			op_on_decision(op, f);
		else if (f->type == WIRE_ERROR)
			op_on_error(op, f);
		else
			op_reply_error(op, 502, "transport",
			               "manager answered before its decision");
		return;
	}
	switch (f->type) {
	case WIRE_META:
		if (op->route == R_FILES_GET)
			stream_on_meta(op, f);
		break;
	case WIRE_DATA_OUT:
		if (op->route == R_EXEC) {
			if (buf_append(&op->out, f->payload, f->len, API_OUT_MAX) < 0)
				op_reply_error(op, 500, "internal", "out of memory");
		} else if (op->route == R_FILES_GET && f->len > 0) {
			stream_push(op, f->payload, f->len);
			if (op->state == OP_STREAM && !op->stream_abort &&
			    op->content_len > API_WHOLE_MAX) /* else: on RESULT */
				lws_callback_on_writable(op->wsi);
		} else if (op->route == R_LIST) {
			list_feed(op, f->payload, f->len);
		}
		break;
	case WIRE_STDERR:
		if (op->route == R_EXEC &&
		    buf_append(&op->err, f->payload, f->len, API_OUT_MAX) < 0)
			op_reply_error(op, 500, "internal", "out of memory");
		break;
	case WIRE_RESULT:
		op_on_result(op, f);
		break;
	case WIRE_ERROR:
		op_on_error(op, f);
		break;
	default:
		break; /* nothing else is meaningful here; ignore */
	}
}

/* op_on_end: the manager connection ended without RESULT/ERROR. */
static void op_on_end(void *arg, const struct tt_err *err)
{
	struct api_op *op = arg;

	if (op->state == OP_REPLY || op->stream_end)
		return;
	log_warn("%s %s: %s", route_names[op->route], op->sbx, err->msg);
	if (op->route == R_FILES_GET && op->headers_sent) {
		stream_fail(op, 502, "transport", "lost the manager connection");
		return;
	}
	if (err->code == TT_ERR_IO)
		op_reply_error(op, 503, "unavailable", "the sandbox manager is not reachable");
	else
		op_reply_error(op, 502, "transport", "lost the manager connection");
}

/* op_on_drain: PUT bytes went out to the manager; read the client again. */
static void op_on_drain(void *arg)
{
	struct api_op *op = arg;

	if (op->route == R_FILES_PUT && op->allowed)
		put_flush(op);
}

/* op_start: opens the manager connection with the REQUEST. */
static void op_start(struct api_op *op)
{
	static const struct mgrconn_cbs cbs = {
		.on_frame = op_on_frame,
		.on_end = op_on_end,
		.on_drain = op_on_drain,
	};
	struct tt_err err = { 0 };

	op->state = OP_DECISION;
	op->mc = mgrconn_open(op->n->loop, op->n->sock_path, op->req, &cbs, op, &err);
	if (op->mc == NULL)
		op_reply_error(op, err.code == TT_ERR_TOO_LARGE ? 413 : 500,
		               err.code == TT_ERR_TOO_LARGE ? "too_large" : "internal",
		               err.msg);
}

/* ---- HTTP side --------------------------------------------------------- */

/* exec_build: validates the exec body and builds the guest REQUEST. */
static int exec_build(struct api_op *op, json_t *body, struct tt_err *err)
{
	json_t *cmd = json_object_get(body, "cmd");
	json_t *env = json_object_get(body, "env");
	json_t *cwd = json_object_get(body, "cwd");
	json_t *in = json_object_get(body, "stdin");
	const char *k;
	size_t i;
	json_t *v;

	if (!json_is_array(cmd) || json_array_size(cmd) == 0 ||
	    json_array_size(cmd) > 1024)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "\"cmd\" must be a non-empty array of strings");
	json_array_foreach(cmd, i, v)
		if (!json_is_string(v))
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "\"cmd\" must be a non-empty array of strings");
	if (env != NULL) {
		if (!json_is_object(env))
			return tt_err_set(err, TT_ERR_MALFORMED, "\"env\" must be an object");
		json_object_foreach(env, k, v)
			if (!json_is_string(v))
				return tt_err_set(err, TT_ERR_MALFORMED,
				                  "\"env\" values must be strings");
	}
	if (cwd != NULL && !json_is_string(cwd))
		return tt_err_set(err, TT_ERR_MALFORMED, "\"cwd\" must be a string");
	if (in != NULL && !json_is_string(in))
		return tt_err_set(err, TT_ERR_MALFORMED, "\"stdin\" must be a string");
	json_object_set(op->req, "cmd", cmd);
	if (env != NULL)
		json_object_set(op->req, "env", env);
	if (cwd != NULL)
		json_object_set(op->req, "cwd", cwd);
	if (in != NULL) {
		op->stdin_len = json_string_length(in);
		op->stdin_data = malloc(op->stdin_len + 1);
		if (op->stdin_data == NULL)
			return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		memcpy(op->stdin_data, json_string_value(in), op->stdin_len);
		json_object_set_new(op->req, "stdin", json_true());
	} else {
		/* Nothing to send after the Allow: it may come with the answer
		 * (one wake-up here instead of two). */
		json_object_set_new(op->req, "allow_with_answer", json_true());
	}
	return 0;
}

/* api_method: the request method as a route-matching tag. */
static const char *api_method(struct lws *wsi)
{
	if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI) > 0)
		return "GET";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0)
		return "POST";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_PUT_URI) > 0)
		return "PUT";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI) > 0)
		return "DELETE";
	return "";
}

/* api_route_of: (method, "/v1/sandboxes/{id}/{verb}") -> route + id. */
static enum api_route api_route_of(const char *method, const char *uri,
                                   char *sbx, size_t cap, bool *bad_method)
{
	static const struct { const char *m, *verb; enum api_route r; } t[] = {
		{ "POST", "exec", R_EXEC }, { "GET", "files", R_FILES_GET },
		{ "PUT", "files", R_FILES_PUT }, { "DELETE", "files", R_FILES_DELETE },
		{ "GET", "stat", R_STAT }, { "GET", "list", R_LIST },
		{ "POST", "mkdir", R_MKDIR },
	};
	const char *p, *slash;
	size_t idlen;

	*bad_method = false;
	sbx[0] = '\0';
	if (strcmp(uri, "/healthz") == 0)
		return R_HEALTHZ;
	if (strcmp(uri, "/metrics") == 0)
		return R_METRICS;
	if (strncmp(uri, "/v1/sandboxes/", 14) != 0)
		return R_OTHER;
	p = uri + 14;
	slash = strchr(p, '/');
	if (slash == NULL)
		return R_OTHER;
	idlen = (size_t)(slash - p);
	if (idlen >= cap)
		idlen = cap - 1; /* too long: fails sbx_id_valid */
	memcpy(sbx, p, idlen);
	sbx[idlen] = '\0';
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (strcmp(slash + 1, t[i].verb) != 0)
			continue;
		if (strcmp(method, t[i].m) == 0)
			return t[i].r;
		*bad_method = true;
	}
	return R_OTHER;
}

/* api_has_body: whether the request announces a body (a length, or one
 * refused: chunked, or two lengths); *fr says how (lib/http.h). */
static bool api_has_body(struct lws *wsi, long long *clen,
                         enum http_framing *fr)
{
	*fr = http_body_framing(wsi, clen);
	return *fr == HTTP_BODY_UNSIZED || *fr == HTTP_BODY_BAD || *clen > 0;
}

/* api_reply_now: a synchronous reply from within an lws callback. */
static int api_reply_now(struct lws *wsi, enum api_route r, uint64_t t0,
                         unsigned status, const char *ctype, const char *body,
                         bool close_after)
{
	int rc = http_reply(wsi, status, ctype, body, strlen(body));

	api_count(r, status, t0);
	return close_after ? -1 : rc;
}

/* api_error_now: {"error","message"} from within an lws callback. */
static int api_error_now(struct lws *wsi, enum api_route r, uint64_t t0,
                         unsigned status, const char *code, const char *msg,
                         bool close_after)
{
	json_t *o = json_pack("{s:s,s:s}", "error", code, "message", msg);
	_cleanup_free_ char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return api_reply_now(wsi, r, t0, status, "application/json",
	                     s ? s : "{\"error\":\"internal\"}", close_after);
}

/* api_on_http: a new request: route, check, and start the operation. */
static int api_on_http(struct lws *wsi, struct api_pss *pss, const char *uri)
{
	struct node *n = lws_context_user(lws_get_context(wsi));
	uint64_t t0 = now_us();
	char sbx[TT_SBX_ID_LEN + 2], path[API_PATH_MAX], v[32];
	char tok[PASETO_TOKEN_MAX + 1];
	const char *op_name_s = NULL;
	bool bad_method, has_body;
	enum http_framing framing;
	long long clen;
	enum api_route r;
	struct api_op *op;

	r = api_route_of(api_method(wsi), uri, sbx, sizeof(sbx), &bad_method);
	has_body = api_has_body(wsi, &clen, &framing);
	/* as the cp and the edge: a body only with one Content-Length (the
	 * unread body closes the connection) */
	if (framing == HTTP_BODY_UNSIZED)
		return api_error_now(wsi, r, t0, 411, "length_required",
		                     "request bodies need a Content-Length", true);
	if (framing == HTTP_BODY_BAD)
		return api_error_now(wsi, r, t0, 400, "bad_request",
		                     "bad Content-Length", true);
	if (r == R_HEALTHZ)
		return api_reply_now(wsi, r, t0, 200, "application/json",
		                     "{\"ok\":true}", has_body);
	if (r == R_METRICS) {
		_cleanup_free_ char *m = metrics_render();

		return api_reply_now(wsi, r, t0, 200,
		                     "text/plain; version=0.0.4",
		                     m ? m : "", has_body);
	}
	if (r == R_OTHER)
		return api_error_now(wsi, r, t0, bad_method ? 405 : 404,
		                     bad_method ? "method_not_allowed" : "not_found",
		                     bad_method ? "method not allowed" : "no such endpoint",
		                     has_body);
	if (!sbx_id_valid(sbx))
		return api_error_now(wsi, r, t0, 404, "not_found",
		                     "no such sandbox", has_body);
	if (http_capability_token(wsi, tok, sizeof(tok)) < 0) {
		_cleanup_free_ char *d = deny_malformed_json(sbx);

		metrics_inc("tether_node_admission_total",
		            "decision=\"deny\",reason=\"malformed\"");
		return api_reply_now(wsi, r, t0, 403, "application/json",
		                     d ? d : "{\"decision\":\"deny\"}", has_body);
	}
	if (r == R_EXEC && !has_body)
		return api_error_now(wsi, r, t0, 400, "bad_request",
		                     "a JSON body is required", false);
	if (r == R_EXEC && clen > (long long)HTTP_BODY_MAX_DEFAULT)
		return api_error_now(wsi, r, t0, 413, "too_large",
		                     "request body over 1 MiB", true);
	if (r != R_EXEC && http_query(wsi, "path", path, sizeof(path)) < 0)
		return api_error_now(wsi, r, t0, 400, "bad_request",
		                     "query parameter path is required", has_body);

	op = calloc(1, sizeof(*op));
	if (op == NULL)
		return -1;
	op->n = n;
	op->wsi = wsi;
	op->route = r;
	op->t0_us = t0;
	op->body.max = HTTP_BODY_MAX_DEFAULT;
	memcpy(op->sbx, sbx, TT_SBX_ID_LEN + 1); /* validated above */
	switch (r) {
	case R_EXEC: op_name_s = "exec"; break;
	case R_FILES_GET: op_name_s = "fs.read"; break;
	case R_FILES_PUT: op_name_s = "fs.write"; break;
	case R_FILES_DELETE: op_name_s = "fs.remove"; break;
	case R_STAT: op_name_s = "fs.stat"; break;
	case R_LIST: op_name_s = "fs.list"; break;
	default: op_name_s = "fs.mkdir"; break;
	}
	op->req = json_pack("{s:s,s:s,s:s}", "token", tok, "sbx", sbx, "op",
	                    op_name_s);
	sodium_memzero(tok, sizeof(tok));
	pss->op = op;
	if (op->req == NULL)
		return -1;
	/* A long exec must not be cut by lws' idle timeouts; the manager ends
	 * every operation with RESULT or ERROR. */
	lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
	if (r != R_EXEC)
		json_object_set_new(op->req, "path", json_string(path));
	if (r == R_FILES_DELETE && http_query(wsi, "recursive", v, sizeof(v)) >= 0)
		json_object_set_new(op->req, "recursive", json_boolean(strcmp(v, "1") == 0 || strcmp(v, "true") == 0));
	if (r == R_MKDIR && http_query(wsi, "parents", v, sizeof(v)) >= 0)
		json_object_set_new(op->req, "parents", json_boolean(strcmp(v, "1") == 0 || strcmp(v, "true") == 0));
	if (r == R_FILES_PUT && http_query(wsi, "mode", v, sizeof(v)) >= 0) {
		char *end;
		unsigned long mode = strtoul(v, &end, 8);

		if (*end != '\0' || v[0] == '\0' || mode > 07777) {
			op->close_after = has_body;
			op_reply_error(op, 400, "bad_request", "mode must be octal, at most 07777");
			return 0;
		}
		json_object_set_new(op->req, "mode", json_integer((json_int_t)mode));
	}
	if (r == R_EXEC) {
		op->state = OP_BODY;
		return 0; /* the REQUEST goes out once the body is complete */
	}
	if (r == R_FILES_PUT) {
		op->body_done = !has_body;
		op->expect = has_body && http_expects_continue(wsi);
		/* Hold the body until the manager admits the request. */
		if (has_body) {
			op->rx_paused = true;
			lws_rx_flow_control(wsi, 0);
		}
	} else {
		op->close_after = has_body; /* a body we will not read */
	}
	/* lws reads nothing more for a bodiless request until its reply is
	 * complete; the guard keeps a client's extra bytes or half-close from
	 * spinning the loop meanwhile (http.h). Without it (no fd), only that
	 * protection is lost. */
	if (!has_body) {
		struct tt_err gerr = { 0 };

		op->rxg = http_rxguard_start(n->loop, wsi, &gerr);
		if (op->rxg == NULL)
			log_warn("%s: %s", route_names[r], gerr.msg);
	}
	op_start(op);
	return 0;
}

/* api_on_body: request body bytes (exec JSON, or PUT file content). */
static int api_on_body(struct lws *wsi, struct api_op *op, const void *in,
                       size_t len)
{
	struct tt_err err = { 0 };

	if (op != NULL && op->state == OP_DRAIN) {
		op->drained += len;
		return op->drained > HTTP_DRAIN_MAX ? -1 : 0;
	}
	if (op == NULL || op->state == OP_REPLY)
		return 0;
	if (op->route == R_EXEC) {
		if (http_body_append(&op->body, in, len, &err) < 0) {
			op->close_after = true;
			op_reply_error(op, 413, "too_large", "request body over 1 MiB");
		}
		return 0;
	}
	if (op->route != R_FILES_PUT)
		return 0; /* ignored */
	op->close_after = false;
	if (!op->allowed) {
		if (buf_append(&op->pending, in, len, API_PENDING_MAX) < 0 ||
		    op->pending.truncated) {
			op->close_after = true;
			op_reply_error(op, 500, "internal", "cannot hold the body");
			return 0;
		}
		if (!op->rx_paused) {
			op->rx_paused = true;
			lws_rx_flow_control(wsi, 0);
		}
		return 0;
	}
	if (!op_send(op, WIRE_DATA_IN, in, len))
		return 0;
	if (mgrconn_queued(op->mc) > MGRCONN_HIGH_WATER && !op->rx_paused) {
		op->rx_paused = true;
		lws_rx_flow_control(wsi, 0);
	}
	return 0;
}

/* api_on_body_done: the request body is complete. */
static int api_on_body_done(struct lws *wsi, struct api_pss *pss)
{
	struct api_op *op = pss->op;
	struct tt_err err = { 0 };
	json_t *body;

	if (op != NULL && op->state == OP_DRAIN) {
		/* answered and drained: the connection can serve the next one */
		pss->op = NULL;
		op_free(op);
		return lws_http_transaction_completed(wsi) ? -1 : 0;
	}
	if (op != NULL && op->state == OP_REPLY && op->route == R_FILES_PUT)
		op->body_done = true; /* all in before the answer went out */
	if (op == NULL || op->state == OP_REPLY)
		return 0;
	if (op->route == R_EXEC) {
		body = http_body_json(&op->body, &err);
		http_body_free(&op->body);
		if (body == NULL) {
			op_reply_error(op, 400, "bad_request", err.msg);
			return 0;
		}
		if (exec_build(op, body, &err) < 0) {
			json_decref(body);
			op_reply_error(op, 400, "bad_request", err.msg);
			return 0;
		}
		json_decref(body);
		op_start(op);
		return 0;
	}
	if (op->route == R_FILES_PUT) {
		op->body_done = true;
		if (op->allowed)
			put_flush(op);
	}
	op->close_after = false;
	return 0;
}

/* stream_done: the whole announced length is out: count, free, and finish
 * the HTTP transaction (keep-alive). */
static int stream_done(struct lws *wsi, struct api_pss *pss, struct api_op *op)
{
	bool extra = http_rxguard_stop(op->rxg);

	op->rxg = NULL;
	api_count(op->route, 200, op->t0_us);
	pss->op = NULL;
	op_free(op);
	/* bytes after the request were dropped: close, never keep alive */
	return extra || lws_http_transaction_completed(wsi) ? -1 : 0;
}

/* download_headers: a file download's status line and headers, finalized,
 * at *p (advanced); 0 or -1 when they do not fit before end. */
static int download_headers(struct lws *wsi, uint64_t content_len, uint8_t **p,
                            uint8_t *end)
{
	if (lws_add_http_header_status(wsi, 200 | LWSAHH_FLAG_NO_SERVER_NAME, p, end) ||
	    lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE,
	            (const uint8_t *)"application/octet-stream", 24, p, end) ||
	    lws_add_http_header_content_length(wsi, content_len, p, end) ||
	    lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
	            (const uint8_t *)"no-store", 8, p, end) ||
	    lws_finalize_http_header(wsi, p, end))
		return -1;
	return 0;
}

/* stream_write_whole: a small read already complete (RESULT confirmed it):
 * headers and the whole body in one lws_write, as small replies go, instead
 * of a headers write, a writeable round trip and a body write. */
static int stream_write_whole(struct lws *wsi, struct api_pss *pss, struct api_op *op)
{
	const size_t head_room = 512;
	_cleanup_free_ uint8_t *buf = malloc(LWS_PRE + head_room + op->content_len);
	uint8_t *start, *p, *end;

	if (buf == NULL)
		return -1;
	start = p = buf + LWS_PRE;
	end = start + head_room;
	if (download_headers(wsi, op->content_len, &p, end) < 0)
		return -1;
	while (op->q_head != NULL) {
		struct api_chunk *c = op->q_head;

		memcpy(p, c->data, c->len);
		p += c->len;
		op->sent += c->len;
		op->q_head = c->next;
		op->q_bytes -= c->len;
		free(c);
	}
	op->q_tail = NULL;
	op->headers_sent = true;
	if (lws_write(wsi, start, (size_t)(p - start), LWS_WRITE_HTTP_FINAL) < (int)(p - start))
		return -1;
	return stream_done(wsi, pss, op);
}

/* stream_write: one step of a streamed GET: the headers with
 * Content-Length, one body piece, or an abort (closing the connection short
 * of the announced length). The last piece goes out, marked final, only
 * once the guest's RESULT confirmed the read. */
static int stream_write(struct lws *wsi, struct api_pss *pss, struct api_op *op)
{
	if (op->stream_abort) {
		api_count(op->route, 599, op->t0_us); /* broken after 200 */
		pss->op = NULL;
		op_free(op);
		return -1;
	}
	if (!op->have_meta)
		return 0;
	if (!op->headers_sent && op->stream_end && op->sent == 0 &&
	    op->q_bytes == op->content_len && op->content_len <= API_WHOLE_MAX)
		return stream_write_whole(wsi, pss, op);
	if (!op->headers_sent) {
		uint8_t hb[LWS_PRE + 512], *start = hb + LWS_PRE, *p = start,
		        *end = hb + sizeof(hb);

		if (download_headers(wsi, op->content_len, &p, end) < 0 ||
		    lws_write(wsi, start, (size_t)(p - start), LWS_WRITE_HTTP_HEADERS) !=
		            (int)(p - start))
			return -1;
		op->headers_sent = true;
		if (op->q_head != NULL || op->stream_end)
			lws_callback_on_writable(wsi);
		return 0;
	}
	if (op->q_head != NULL) {
		struct api_chunk *c = op->q_head;
		bool last = op->sent + c->len == op->content_len;
		_cleanup_free_ uint8_t *b = NULL;

		if (last && !op->stream_end)
			return 0; /* wait for RESULT; it asks for a write again */
		b = malloc(LWS_PRE + c->len);
		if (b == NULL)
			return -1;
		memcpy(b + LWS_PRE, c->data, c->len);
		if (lws_write(wsi, b + LWS_PRE, c->len,
		              last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)c->len)
			return -1;
		op->sent += c->len;
		op->q_head = c->next;
		if (op->q_head == NULL)
			op->q_tail = NULL;
		op->q_bytes -= c->len;
		free(c);
		if (last)
			return stream_done(wsi, pss, op);
		if (op->mc_paused && op->q_bytes < API_STREAM_LOW && op->mc != NULL) {
			op->mc_paused = false;
			mgrconn_resume(op->mc);
		}
		if (op->q_head != NULL)
			lws_callback_on_writable(wsi);
		return 0;
	}
	if (op->stream_end && op->sent == op->content_len)
		return stream_done(wsi, pss, op); /* an empty file */
	return 0;
}

/* api_on_writeable: writes a pending reply or the next stream step. */
static int api_on_writeable(struct lws *wsi, struct api_pss *pss)
{
	struct api_op *op = pss->op;
	unsigned status;
	bool close_after;
	int rc;

	if (op == NULL)
		return 0;
	if (op->state == OP_STREAM)
		return stream_write(wsi, pss, op);
	if (op->state != OP_REPLY)
		return 0;
	status = op->status;
	if (op->route == R_FILES_PUT && !op->body_done && !op->close_after) {
		/* before the body is in: drained, completed at its end */
		rc = http_reply_early(wsi, status, "application/json", op->reply,
		                      op->reply_len);
		api_count(op->route, status, op->t0_us);
		op->state = OP_DRAIN;
		return rc;
	}
	close_after = op->close_after | http_rxguard_stop(op->rxg);
	op->rxg = NULL;
	/* Detach first: completing the transaction may drop the session
	 * (LWS_CALLBACK_HTTP_DROP_PROTOCOL) from inside http_reply. */
	pss->op = NULL;
	rc = http_reply(wsi, status, "application/json", op->reply, op->reply_len);
	api_count(op->route, status, op->t0_us);
	op_free(op);
	return close_after ? -1 : rc;
}

/* api_callback: the lws HTTP protocol handler. Upgrades are not served
 * here: streamed exec is its own protocol (src/node/ws_exec.c). */
static int api_callback(struct lws *wsi, enum lws_callback_reasons reason,
                        void *user, void *in, size_t len)
{
	struct api_pss *pss = user;

	switch (reason) {
	case LWS_CALLBACK_HTTP:
		http_request_started(wsi);
		if (pss->op != NULL) { /* a pipelined request on a busy session */
			pss->op->wsi = NULL;
			op_free(pss->op);
			pss->op = NULL;
		}
		return api_on_http(wsi, pss, in ? (const char *)in : "");
	case LWS_CALLBACK_HTTP_BODY:
		return api_on_body(wsi, pss->op, in, len);
	case LWS_CALLBACK_HTTP_BODY_COMPLETION:
		return api_on_body_done(wsi, pss);
	case LWS_CALLBACK_HTTP_WRITEABLE:
		return api_on_writeable(wsi, pss);
	case LWS_CALLBACK_CLOSED_HTTP:
	case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
		if (pss != NULL && pss->op != NULL) {
			pss->op->wsi = NULL;
			op_free(pss->op);
			pss->op = NULL;
		}
		return 0;
	default: /* upgrades refused, bounds, HTTP/2 (lib/http.h) */
		return http_callback_default(wsi, reason, user, in, len);
	}
}

static const struct lws_protocols api_protocols[] = {
	/* tx_packet_size: lws 4.1 caps one send() at this + LWS_PRE + 4
	 * (0 = rx_buffer_size, default 4096): a whole small read (headers
	 * room 512 + API_WHOLE_MAX) then goes in one send, no POLLOUT trip. */
	{ "http", api_callback, sizeof(struct api_pss), 0, 0, NULL,
	  API_WHOLE_MAX + 512 },
	/* streamed exec (src/node/ws_exec.c) */
	{ WSEXEC_PROTOCOL, wsexec_callback, sizeof(struct wsexec_pss),
	  WSEXEC_RX_BUFFER, 0, NULL, 0 },
	{ NULL, NULL, 0, 0, 0, NULL, 0 },
};

/* ---- process: arguments, manager, startup, shutdown -------------------- */

/* How long an orderly stop waits for this worker's sandboxes to pause. */
#define API_DRAIN_MS (120u * 1000u)

static const char *const usage_text =
	"usage: tetherd node --id W --listen 127.0.0.1:PORT --cp URL "
	"--node-token-file FILE --feed-key-file FILE --state DIR [--guest-bin PATH]\n"
	"       [--snapshots DIR]  (--feed-key-file: the control plane's feed key,\n"
	"       k4.public, given at provisioning; tether up passes STATE/cp/feed.pub)\n"
	"       [--disk-mb N] [--disk-inodes N]  (each sandbox's disk and inode cap;\n"
	"       default 1024 MiB, one inode per 16 KiB)\n"
	"       [--user NAME]  (when started as root; default nobody)\n";

/* node_read_token: the node token file (first line, bounded). */
static int node_read_token(struct node *n, const char *file, struct tt_err *err)
{
	_cleanup_close_ int fd = open(file, O_RDONLY | O_CLOEXEC);
	char buf[NODE_TOKEN_MAX + 2];
	ssize_t got;
	size_t len;

	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot open %s", file);
	got = read(fd, buf, sizeof(buf) - 1);
	if (got < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot read %s", file);
	len = (size_t)got;
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' ||
	                   buf[len - 1] == ' '))
		len--;
	if (len == 0 || len > NODE_TOKEN_MAX || memchr(buf, '\n', len) != NULL) {
		sodium_memzero(buf, sizeof(buf));
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "%s: expected one token line of at most %d bytes",
		                  file, NODE_TOKEN_MAX);
	}
	memcpy(n->node_token, buf, len);
	n->node_token[len] = '\0';
	sodium_memzero(buf, sizeof(buf));
	return 0;
}

/* node_read_feed_key: the feed key file: one k4.public line. */
static int node_read_feed_key(struct node *n, const char *file, struct tt_err *err)
{
	_cleanup_close_ int fd = open(file, O_RDONLY | O_CLOEXEC);
	char buf[PASERK_K4_PUBLIC_LEN + 3];
	uint8_t pk[PASETO_PK_BYTES];
	ssize_t got;

	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot open %s", file);
	got = read(fd, buf, sizeof(buf) - 1);
	if (got < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot read %s", file);
	buf[got] = '\0';
	if (got > PASERK_K4_PUBLIC_LEN && buf[PASERK_K4_PUBLIC_LEN] == '\n')
		buf[PASERK_K4_PUBLIC_LEN] = '\0';
	if (paserk_k4_public_decode(buf, pk, err) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: expected one k4.public line",
		                  file);
	memcpy(n->feed_key, buf, PASERK_K4_PUBLIC_LEN + 1);
	return 0;
}

/* node_id_valid: worker ids are short [a-z0-9_-] names (they go into URLs). */
static bool node_id_valid(const char *s)
{
	size_t len = strlen(s);

	if (len == 0 || len > TT_NAME_MAX)
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
		      *s == '_' || *s == '-'))
			return false;
	return true;
}

/* node_parse: command line -> n; -1 with err on a usage error. */
static int node_parse(struct node *n, int argc, char **argv, struct tt_err *err)
{
	static const struct option opts[] = {
		{ "id", required_argument, NULL, 'i' },
		{ "listen", required_argument, NULL, 'l' },
		{ "cp", required_argument, NULL, 'c' },
		{ "node-token-file", required_argument, NULL, 't' },
		{ "feed-key-file", required_argument, NULL, 'F' },
		{ "state", required_argument, NULL, 's' },
		{ "guest-bin", required_argument, NULL, 'g' },
		{ "snapshots", required_argument, NULL, 'S' },
		{ "user", required_argument, NULL, 'u' },
		{ "disk-mb", required_argument, NULL, 'D' },
		{ "disk-inodes", required_argument, NULL, 'I' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *listen = NULL, *token_file = NULL, *feed_file = NULL, *colon;
	char *end;
	long port;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'i': n->id = optarg; break;
		case 'l': listen = optarg; break;
		case 'c': n->cp_url = optarg; break;
		case 't': token_file = optarg; break;
		case 'F': feed_file = optarg; break;
		case 's': n->state_dir = optarg; break;
		case 'g': n->guest_bin = optarg; break;
		case 'S': n->snap_dir = optarg; break;
		case 'u': n->user = optarg; break;
		case 'D': n->disk_mb = optarg; break;
		case 'I': n->disk_inodes = optarg; break;
		default:
			return tt_err_set(err, TT_ERR_INVALID, "%s", usage_text);
		}
	}
	if (optind != argc || !n->id || !listen || !n->cp_url || !token_file ||
	    !feed_file || !n->state_dir)
		return tt_err_set(err, TT_ERR_INVALID, "%s", usage_text);
	if (!node_id_valid(n->id))
		return tt_err_set(err, TT_ERR_INVALID, "invalid worker id '%s'", n->id);
	colon = strrchr(listen, ':');
	if (colon == NULL || (size_t)(colon - listen) >= sizeof(n->listen_host) ||
	    colon == listen)
		return tt_err_set(err, TT_ERR_INVALID, "--listen wants HOST:PORT");
	port = strtol(colon + 1, &end, 10);
	if (*end != '\0' || port < 1 || port > 65535)
		return tt_err_set(err, TT_ERR_INVALID, "invalid port in --listen");
	memcpy(n->listen_host, listen, (size_t)(colon - listen));
	n->listen_host[colon - listen] = '\0';
	n->port = (int)port;
	snprintf(n->node_url, sizeof(n->node_url), "http://%s:%d", n->listen_host,
	         n->port);
	if (strncmp(n->cp_url, "http://", 7) != 0 &&
	    strncmp(n->cp_url, "https://", 8) != 0)
		return tt_err_set(err, TT_ERR_INVALID, "--cp wants an http(s) URL");
	/* Unix socket paths may be of any length (unixaddr.h); the state
	 * dir's own limit is the manager's (node/paths.h). */
	if (strlen(n->state_dir) > TT_WORKER_STATE_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "--state is %zu bytes long; at most %d",
		                  strlen(n->state_dir), TT_WORKER_STATE_MAX);
	snprintf(n->sock_path, sizeof(n->sock_path), "%s/manager.sock", n->state_dir);
	if (node_read_feed_key(n, feed_file, err) < 0)
		return -1;
	return node_read_token(n, token_file, err);
}

/* node_on_manager_exit: the manager is part of the worker; without it
 * nothing can be admitted, so node-api exits and its supervisor restarts
 * both. */
static void node_on_manager_exit(uv_process_t *p, int64_t status, int sig)
{
	struct node *n = p->data;

	n->manager_running = false;
	uv_close((uv_handle_t *)p, NULL);
	if (n->exit_code >= 0) { /* our own shutdown */
		uv_stop(n->loop);
		return;
	}
	log_error("sbx-manager exited (status %" PRId64 ", signal %d); stopping",
	          status, sig);
	n->exit_code = 1;
	uv_stop(n->loop);
}

/* node_spawn_manager: fork + exec of our own binary as "manager"; it
 * accepts only our pid and uid on its socket (protocol.md). */
static int node_spawn_manager(struct node *n, struct tt_err *err)
{
	char pid[24], uid[24];
	char *args[32];
	uv_process_options_t o;
	uv_stdio_container_t stdio[3];
	int i = 0, rc;

	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	/* The uid node-api will have when it connects (after the drop). */
	snprintf(uid, sizeof(uid), "%u", (unsigned)n->run_uid);
	args[i++] = (char *)"tetherd";
	args[i++] = (char *)"manager";
	args[i++] = (char *)"--state";
	args[i++] = (char *)n->state_dir;
	args[i++] = (char *)"--socket";
	args[i++] = n->sock_path;
	args[i++] = (char *)"--worker-id";
	args[i++] = (char *)n->id;
	args[i++] = (char *)"--peer-pid";
	args[i++] = pid;
	args[i++] = (char *)"--peer-uid";
	args[i++] = uid;
	args[i++] = (char *)"--lifeline";
	args[i++] = (char *)"0";
	if (n->run_dir[0] != '\0')
		args[i++] = (char *)"--private-socket-dir";
	if (n->guest_bin != NULL) {
		args[i++] = (char *)"--guest-bin";
		args[i++] = (char *)n->guest_bin;
	}
	if (n->snap_dir != NULL) { /* the snapshot store, passed through */
		args[i++] = (char *)"--snapshots";
		args[i++] = (char *)n->snap_dir;
	}
	if (n->disk_mb != NULL) { /* the layer caps, checked by the manager */
		args[i++] = (char *)"--disk-mb";
		args[i++] = (char *)n->disk_mb;
	}
	if (n->disk_inodes != NULL) {
		args[i++] = (char *)"--disk-inodes";
		args[i++] = (char *)n->disk_inodes;
	}
	args[i++] = (char *)"--feed-key"; /* the manager pins and verifies with it */
	args[i++] = n->feed_key;
	args[i] = NULL;
	memset(&o, 0, sizeof(o));
	memset(stdio, 0, sizeof(stdio));
	for (int k = 1; k < 3; k++) {
		stdio[k].flags = UV_INHERIT_FD;
		stdio[k].data.fd = k;
	}
	/* stdin is the lifeline: a socketpair end we never write to. */
	uv_pipe_init(n->loop, &n->lifeline, 0);
	n->lifeline_open = true;
	stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
	stdio[0].data.stream = (uv_stream_t *)&n->lifeline;
	o.file = "/proc/self/exe"; /* the same tetherd binary */
	o.args = args;
	o.exit_cb = node_on_manager_exit;
	/* Its own session and process group: a signal to ours (a terminal's
	 * Ctrl-C, `tether up` or a supervisor stopping us) must not stop the
	 * sandboxes behind our back: we pause them first, then ask the
	 * manager to stop over the lifeline, which is all it obeys. */
	o.flags = UV_PROCESS_DETACHED;
	o.stdio = stdio;
	o.stdio_count = 3;
	n->manager.data = n;
	rc = uv_spawn(n->loop, &n->manager, &o);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_SYS, "cannot start the manager: %s",
		                  uv_strerror(rc));
	n->manager_running = true;
	log_info("started sbx-manager (pid %d)", n->manager.pid);
	return 0;
}

/* node_stop_manager: asks the manager to stop. Once unprivileged we may
 * not signal it (it stays root), so the lifeline is what counts: "stop"
 * on it, then EOF, is an orderly stop (its sandboxes stop too); EOF alone
 * — we died, or stop on an error — makes it leave them running for the
 * manager our successor starts, which adopts them. The signal is for a
 * node-api that never dropped (EPERM is expected). */
static void node_stop_manager(struct node *n, bool orderly)
{
	uv_os_fd_t fd;

	if (n->lifeline_open) {
		if (orderly && uv_fileno((uv_handle_t *)&n->lifeline, &fd) == 0 &&
		    write(fd, "stop\n", 5) != 5)
			log_warn("cannot ask the manager to stop: %s", strerror(errno));
		uv_close((uv_handle_t *)&n->lifeline, NULL);
		n->lifeline_open = false;
	}
	if (orderly && n->manager_running)
		uv_process_kill(&n->manager, SIGTERM);
}

/* node_fatal: logs, stops the manager and the loop with status 1. */
static void node_fatal(struct node *n, const char *msg)
{
	log_error("%s", msg);
	n->exit_code = 1;
	node_stop_manager(n, false);
	uv_stop(n->loop);
}

/* node_serv_buf_env: TETHER_NODE_SERV_BUF (bytes, 4096..1 MiB) sets lws'
 * per-thread service buffer, which sizes each read from a client: the
 * request-body paths must be correct whatever it is, and the regression
 * test (tests/integration/test_upload_flow.sh) runs them at 32 KiB. */
static void node_serv_buf_env(void)
{
	const char *v = getenv("TETHER_NODE_SERV_BUF");
	char *end;
	unsigned long b;

	if (v == NULL || v[0] == '\0')
		return;
	errno = 0;
	b = strtoul(v, &end, 10);
	if (errno != 0 || *end != '\0' || b < 4096 || b > (1ul << 20)) {
		log_warn("TETHER_NODE_SERV_BUF=%s ignored: want 4096..1048576", v);
		return;
	}
	http_server_set_serv_buf(b);
	log_info("node-api: lws service buffer %lu bytes", b);
}

/* node_serve: the manager answered: start HTTP and the feed. */
static void node_serve(struct node *n)
{
	struct tt_err err = { 0 };

	node_serv_buf_env();
	/* a client, its manager connection and an rxguard dup */
	http_server_set_fds_per_conn(3);
	n->lws = http_server_new(n->loop, n->listen_host, n->port, api_protocols,
	                         n, &err);
	if (n->lws == NULL) {
		node_fatal(n, err.msg);
		return;
	}
	n->httpc = httpc_new(n->loop, &err);
	if (n->httpc == NULL || node_feed_start(n, &err) < 0 ||
	    node_events_start(n, &err) < 0) {
		node_fatal(n, err.msg);
		return;
	}
	log_info("node-api %s listening on %s", n->id, n->node_url);
}

static uv_timer_t ready_timer;
static uint64_t ready_deadline;

static void node_ready_try(uv_timer_t *t);

/* node_on_status: the manager's status answer (readiness + feed resume). */
static void node_on_status(void *arg, json_t *result, const struct tt_err *err)
{
	struct node *n = arg;
	json_t *rev;

	if (n->exit_code >= 0)
		goto out;
	if (result == NULL) {
		if (err->code == TT_ERR_IO && uv_now(n->loop) < ready_deadline &&
		    n->manager_running) {
			uv_timer_start(&ready_timer, node_ready_try, API_READY_RETRY_MS, 0);
			goto out;
		}
		log_error("manager status: %s", err->msg);
		node_fatal(n, "the sbx-manager did not come up");
		goto out;
	}
	rev = json_object_get(result, "applied_rev");
	if (!json_is_integer(rev) || json_integer_value(rev) < 0) {
		node_fatal(n, "manager status has no applied_rev");
		goto out;
	}
	n->applied_rev = (uint64_t)json_integer_value(rev);
	node_serve(n);
out:
	json_decref(result);
}

/* node_ready_try: asks the manager for its status (retried until ready). */
static void node_ready_try(uv_timer_t *t)
{
	struct node *n = t->data;
	struct tt_err err = { 0 };
	json_t *req = json_pack("{s:s}", "op", "status");

	if (req == NULL ||
	    mgrconn_call(n->loop, n->sock_path, req, node_on_status, n, &err) < 0)
		node_fatal(n, "cannot ask the manager for its status");
	json_decref(req);
}

/* node_drained: the sandboxes are paused (or that was given up): the
 * manager stops, and its exit callback stops the loop. */
static void node_drained(struct node *n)
{
	if (n->manager_running)
		node_stop_manager(n, true);
	else
		uv_stop(n->loop);
}

/* node_on_signal: SIGTERM/SIGINT: an orderly stop: the cp pauses this
 * worker's sandboxes (to resume here when we are back), then the manager
 * stops, then we exit; a second signal skips the wait. The feed stops
 * after the loop (node_main), so that no transfer outlives it. */
static void node_on_signal(uv_signal_t *s, int signum)
{
	struct node *n = s->data;

	log_info("signal %d: shutting down", signum);
	if (n->exit_code < 0)
		n->exit_code = 0;
	if (n->manager_running)
		node_drain(n, API_DRAIN_MS, node_drained);
	else
		uv_stop(n->loop);
}

/* node_user_resolve: who we run as. As root: --user (default "nobody"),
 * which must not be root; otherwise no change (and --user is refused, since
 * it could not be honoured). */
static int node_user_resolve(struct node *n, struct tt_err *err)
{
	const char *name = n->user != NULL ? n->user : "nobody";
	struct passwd *pw;

	n->run_uid = getuid();
	n->run_gid = getgid();
	if (geteuid() != 0) {
		if (n->user != NULL)
			return tt_err_set(err, TT_ERR_INVALID,
			                  "--user needs tetherd node to start as root");
		return 0;
	}
	errno = 0;
	pw = getpwnam(name);
	if (pw == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "unknown user '%s'%s%s", name,
		                  errno ? ": " : "", errno ? strerror(errno) : "");
	if (pw->pw_uid == 0 || pw->pw_gid == 0)
		return tt_err_set(err, TT_ERR_INVALID,
		                  "--user %s: node-api must not run with uid or gid 0", name);
	n->run_uid = pw->pw_uid;
	n->run_gid = pw->pw_gid;
	n->drop = true;
	return 0;
}

/* node_run_dir: a fresh directory for manager.sock that the unprivileged
 * node-api can reach (the state dir's ancestors, e.g. /root, may not be).
 * Root-owned, mode 0711: others may pass through but not list it or put
 * anything in it; the manager chowns the 0600 socket inside to run_uid. */
static int node_run_dir(struct node *n, struct tt_err *err)
{
	static const char *const bases[] = { "/run", "/tmp" };

	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		snprintf(n->run_dir, sizeof(n->run_dir), "%s/tether-node.XXXXXX", bases[i]);
		/* Privileged: /run is writable only by root; that is the point,
		 * since no unprivileged user can pre-create or swap this dir. */
		if (mkdtemp(n->run_dir) == NULL)
			continue;
		if (chmod(n->run_dir, 0711) < 0) {
			tt_err_sys(err, TT_ERR_IO, "chmod %s", n->run_dir);
			rmdir(n->run_dir);
			n->run_dir[0] = '\0';
			return -1;
		}
		snprintf(n->sock_path, sizeof(n->sock_path), "%s/manager.sock", n->run_dir);
		return 0;
	}
	n->run_dir[0] = '\0';
	return tt_err_sys(err, TT_ERR_IO, "cannot create a runtime dir in /run or /tmp");
}

/* node_drop: becomes run_uid/run_gid for good (OpenBSD style privsep):
 * the manager is spawned and the token read, nothing privileged is left to
 * do. Verified after the fact: a half-done drop is a fatal error. */
static int node_drop(struct node *n, struct tt_err *err)
{
	uid_t ru, eu, su;
	gid_t rg, eg, sg;

	/* Privileged, and the last privileged calls node-api makes: shed the
	 * supplementary groups (root's), then gid before uid (afterwards we
	 * could no longer change gids). */
	if (setgroups(0, NULL) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "setgroups");
	if (setresgid(n->run_gid, n->run_gid, n->run_gid) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "setresgid %u", (unsigned)n->run_gid);
	if (setresuid(n->run_uid, n->run_uid, n->run_uid) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "setresuid %u", (unsigned)n->run_uid);
	/* No way back through a setuid binary either. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "PR_SET_NO_NEW_PRIVS");
	if (getresuid(&ru, &eu, &su) < 0 || getresgid(&rg, &eg, &sg) < 0 ||
	    ru != n->run_uid || eu != n->run_uid || su != n->run_uid ||
	    rg != n->run_gid || eg != n->run_gid || sg != n->run_gid ||
	    getgroups(0, NULL) != 0)
		return tt_err_set(err, TT_ERR_SYS, "privilege drop did not take");
	if (setuid(0) == 0 || setgid(0) == 0)
		return tt_err_set(err, TT_ERR_SYS, "privilege drop is reversible; refusing to run");
	log_info("running as uid %u gid %u", (unsigned)n->run_uid, (unsigned)n->run_gid);
	return 0;
}

/* node_main: see roles.h. */
int node_main(int argc, char **argv)
{
	static struct node node;
	struct node *n = &node;
	struct tt_err err = { 0 };
	uv_signal_t sigterm, sigint;
	uv_loop_t *loop;

	tt_log_init("node", TT_LOG_INFO);
	if (sodium_init() < 0) {
		fprintf(stderr, "tetherd node: libsodium init failed\n");
		return 1;
	}
	n->exit_code = -1;
	if (node_parse(n, argc, argv, &err) < 0) {
		fprintf(stderr, "tetherd node: %s%s", err.msg,
		        err.code == TT_ERR_INVALID && strncmp(err.msg, "usage", 5) == 0 ? "" : "\n");
		sodium_memzero(n->node_token, sizeof(n->node_token));
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	if (mkdir(n->state_dir, 0700) < 0 && errno != EEXIST) {
		log_error("cannot create %s: %s", n->state_dir, strerror(errno));
		return 1;
	}
	loop = uv_default_loop();
	n->loop = loop;
	/* Order: everything root-only first (token read in node_parse, run
	 * dir, manager spawn), then the drop, then the loop. */
	if (node_user_resolve(n, &err) < 0 || (n->drop && node_run_dir(n, &err) < 0) ||
	    node_spawn_manager(n, &err) < 0) {
		log_error("%s", err.msg);
		if (n->run_dir[0] != '\0' && !n->manager_running)
			rmdir(n->run_dir);
		sodium_memzero(n->node_token, sizeof(n->node_token));
		return 1;
	}
	if (n->drop && node_drop(n, &err) < 0) {
		log_error("%s", err.msg);
		node_stop_manager(n, false); /* still root here if setresuid failed */
		sodium_memzero(n->node_token, sizeof(n->node_token));
		return 1;
	}
	uv_signal_init(loop, &sigterm);
	uv_signal_init(loop, &sigint);
	sigterm.data = sigint.data = n;
	uv_signal_start(&sigterm, node_on_signal, SIGTERM);
	uv_signal_start(&sigint, node_on_signal, SIGINT);
	uv_timer_init(loop, &ready_timer);
	ready_timer.data = n;
	ready_deadline = uv_now(loop) + API_READY_TIMEOUT_MS;
	uv_timer_start(&ready_timer, node_ready_try, API_READY_RETRY_MS, 0);

	uv_run(loop, UV_RUN_DEFAULT);

	/* an error exit: the manager leaves its sandboxes to our successor */
	if (n->manager_running || n->lifeline_open)
		node_stop_manager(n, false);
	node_events_stop(n);
	/* Order matters: the feed is marked stopping before httpc_free runs
	 * its aborted-transfer callbacks; the loop does not run again, so
	 * nothing is freed under a pending callback (the process exits). */
	node_feed_stop(n);
	if (n->httpc != NULL)
		httpc_free(n->httpc);
	sodium_memzero(n->node_token, sizeof(n->node_token));
	log_info("node-api %s exiting (%d)", n->id, n->exit_code < 0 ? 1 : n->exit_code);
	return n->exit_code < 0 ? 1 : n->exit_code;
}

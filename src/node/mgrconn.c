/* Async client of the sbx-manager socket (see mgrconn.h). */
#include "node/mgrconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "log.h"
#include "metrics.h"

#define MGRCONN_READ_CHUNK (64u * 1024u)

struct mgrconn {
	uv_pipe_t pipe;
	uv_connect_t connect_req;
	struct mgrconn_cbs cbs;
	void *arg;
	char *req;        /* encoded REQUEST, sent once connected (owned) */
	size_t req_len;
	bool connected, closed, ended, paused, want_drain;
	uint8_t *pend;    /* read bytes not yet decoded (owned) */
	size_t pend_len, pend_off;
	struct wire_reader rd;
};

/* One queued write; the frame bytes follow the struct (owned by it). */
struct mgrconn_wreq {
	uv_write_t req;
	struct mgrconn *c;
	size_t len;
	uint8_t data[];
};

/* mgrconn_end: reports the end of the connection once (unless closed). */
static void mgrconn_end(struct mgrconn *c, const struct tt_err *err)
{
	if (c->closed || c->ended)
		return;
	c->ended = true;
	uv_read_stop((uv_stream_t *)&c->pipe);
	if (c->cbs.on_end != NULL)
		c->cbs.on_end(c->arg, err);
}

/* mgrconn_closed: last step, once libuv has released the handle. */
static void mgrconn_closed(uv_handle_t *h)
{
	struct mgrconn *c = h->data;

	free(c->pend);
	free(c->req);
	free(c);
}

/* mgrconn_close: see mgrconn.h. */
void mgrconn_close(struct mgrconn *c)
{
	if (c == NULL || c->closed)
		return;
	c->closed = true;
	uv_close((uv_handle_t *)&c->pipe, mgrconn_closed);
}

/* mgrconn_process: decodes buffered bytes into frames until they run out,
 * the owner pauses, or the owner closes. */
static void mgrconn_process(struct mgrconn *c)
{
	struct tt_err err = { 0 };

	while (c->pend != NULL && c->pend_off < c->pend_len && !c->paused &&
	       !c->closed && !c->ended) {
		struct wire_frame f;
		size_t used = 0;
		int rc = wire_reader_feed(&c->rd, c->pend + c->pend_off,
		                          c->pend_len - c->pend_off, &used, &f, &err);

		c->pend_off += used;
		if (rc < 0) {
			mgrconn_end(c, &err);
			return;
		}
		if (rc == 1 && c->cbs.on_frame != NULL)
			c->cbs.on_frame(c->arg, &f);
		if (rc == 0 && used == 0)
			break; /* cannot happen with bytes left; stay safe */
	}
	if (c->pend != NULL && c->pend_off >= c->pend_len) {
		free(c->pend);
		c->pend = NULL;
		c->pend_len = c->pend_off = 0;
	}
}

/* mgrconn_alloc: a fresh buffer per read; ownership moves to c->pend. */
static void mgrconn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	(void)h;
	(void)hint;
	buf->base = malloc(MGRCONN_READ_CHUNK);
	buf->len = buf->base ? MGRCONN_READ_CHUNK : 0;
}

/* mgrconn_on_read: bytes or EOF from the manager. */
static void mgrconn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct mgrconn *c = s->data;
	struct tt_err err = { 0 };

	if (nread <= 0 || c->closed || c->ended) {
		free(buf->base);
		if (nread == 0 || c->closed || c->ended)
			return;
		if (nread == UV_EOF)
			tt_err_set(&err, TT_ERR_TRANSPORT,
			           "manager closed the connection");
		else
			tt_err_set(&err, TT_ERR_TRANSPORT, "manager connection: %s",
			           uv_strerror((int)nread));
		mgrconn_end(c, &err);
		return;
	}
	/* Reads are stopped while bytes are pending, so pend is empty here. */
	free(c->pend);
	c->pend = (uint8_t *)buf->base;
	c->pend_len = (size_t)nread;
	c->pend_off = 0;
	mgrconn_process(c);
}

/* mgrconn_on_write: frees the request; reports failures and drains. */
static void mgrconn_on_write(uv_write_t *req, int status)
{
	struct mgrconn_wreq *w = (struct mgrconn_wreq *)req;
	struct mgrconn *c = w->c;
	struct tt_err err = { 0 };

	free(w);
	if (c->closed || c->ended)
		return;
	if (status < 0) {
		tt_err_set(&err, TT_ERR_TRANSPORT, "write to manager: %s",
		           uv_strerror(status));
		mgrconn_end(c, &err);
		return;
	}
	if (c->want_drain && mgrconn_queued(c) < MGRCONN_LOW_WATER) {
		c->want_drain = false;
		if (c->cbs.on_drain != NULL)
			c->cbs.on_drain(c->arg);
	}
}

/* mgrconn_send: see mgrconn.h. */
int mgrconn_send(struct mgrconn *c, uint8_t type, const void *payload,
                 size_t len, struct tt_err *err)
{
	struct mgrconn_wreq *w;
	uv_buf_t b;
	int rc;

	if (c->closed || c->ended || !c->connected)
		return tt_err_set(err, TT_ERR_TRANSPORT, "manager connection not open");
	if (len > WIRE_PAYLOAD_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "frame over %u bytes",
		                  WIRE_PAYLOAD_MAX);
	w = malloc(sizeof(*w) + WIRE_HDR_LEN + len);
	if (w == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	w->c = c;
	w->len = WIRE_HDR_LEN + len;
	wire_hdr_encode(w->data, type, (uint32_t)len);
	if (len > 0)
		memcpy(w->data + WIRE_HDR_LEN, payload, len);
	b = uv_buf_init((char *)w->data, (unsigned)w->len);
	rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, mgrconn_on_write);
	if (rc < 0) {
		free(w);
		return tt_err_set(err, TT_ERR_TRANSPORT, "write to manager: %s",
		                  uv_strerror(rc));
	}
	if (mgrconn_queued(c) > MGRCONN_HIGH_WATER)
		c->want_drain = true;
	return 0;
}

/* mgrconn_send_data: splits data into frames of at most the payload bound. */
int mgrconn_send_data(struct mgrconn *c, uint8_t type, const void *data,
                      size_t len, struct tt_err *err)
{
	const uint8_t *p = data;

	while (len > 0) {
		size_t n = len > WIRE_PAYLOAD_MAX ? WIRE_PAYLOAD_MAX : len;

		if (mgrconn_send(c, type, p, n, err) < 0)
			return -1;
		p += n;
		len -= n;
	}
	return 0;
}

/* mgrconn_queued: libuv's count of bytes not yet written. */
size_t mgrconn_queued(const struct mgrconn *c)
{
	return uv_stream_get_write_queue_size((const uv_stream_t *)&c->pipe);
}

/* mgrconn_pause: stops reading; bytes already read stay buffered. */
void mgrconn_pause(struct mgrconn *c)
{
	if (c->paused || c->closed)
		return;
	c->paused = true;
	if (c->connected && !c->ended)
		uv_read_stop((uv_stream_t *)&c->pipe);
}

/* mgrconn_resume: delivers buffered frames first, then reads again. */
void mgrconn_resume(struct mgrconn *c)
{
	if (!c->paused || c->closed)
		return;
	c->paused = false;
	mgrconn_process(c);
	if (!c->paused && !c->closed && !c->ended && c->connected &&
	    c->pend == NULL)
		uv_read_start((uv_stream_t *)&c->pipe, mgrconn_alloc, mgrconn_on_read);
}

/* mgrconn_on_connect: sends the REQUEST and starts reading. */
static void mgrconn_on_connect(uv_connect_t *req, int status)
{
	struct mgrconn *c = req->data;
	struct tt_err err = { 0 };

	if (c->closed)
		return;
	if (status < 0) {
		tt_err_set(&err, TT_ERR_IO, "cannot reach the manager: %s",
		           uv_strerror(status));
		mgrconn_end(c, &err);
		return;
	}
	c->connected = true;
	if (mgrconn_send(c, WIRE_REQUEST, c->req, c->req_len, &err) < 0) {
		mgrconn_end(c, &err);
		return;
	}
	free(c->req);
	c->req = NULL;
	if (!c->paused)
		uv_read_start((uv_stream_t *)&c->pipe, mgrconn_alloc, mgrconn_on_read);
}

/* mgrconn_open: see mgrconn.h. */
struct mgrconn *mgrconn_open(uv_loop_t *loop, const char *path, json_t *req,
                             const struct mgrconn_cbs *cbs, void *arg,
                             struct tt_err *err)
{
	struct mgrconn *c;
	char *enc;

	enc = json_dumps(req, JSON_COMPACT);
	if (enc == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "cannot encode the request");
		return NULL;
	}
	if (strlen(enc) > WIRE_PAYLOAD_MAX) {
		free(enc);
		tt_err_set(err, TT_ERR_TOO_LARGE, "request over %u bytes",
		           WIRE_PAYLOAD_MAX);
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		free(enc);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	c->req = enc;
	c->req_len = strlen(enc);
	c->cbs = *cbs;
	c->arg = arg;
	wire_reader_init(&c->rd);
	if (uv_pipe_init(loop, &c->pipe, 0) < 0) {
		free(c->req);
		free(c);
		tt_err_set(err, TT_ERR_SYS, "uv_pipe_init failed");
		return NULL;
	}
	c->pipe.data = c;
	c->connect_req.data = c;
	/* Connect errors (absent socket, refused) arrive in the callback. */
	uv_pipe_connect(&c->connect_req, &c->pipe, path, mgrconn_on_connect);
	return c;
}

/* ---- whole control calls ---------------------------------------------- */

struct mgrconn_callst {
	struct mgrconn *c;
	mgrconn_call_fn done;
	void *arg;
};

/* call_finish: reports once, closes the connection, frees the call. */
static void call_finish(struct mgrconn_callst *st, json_t *result,
                        const struct tt_err *err)
{
	st->done(st->arg, result, err);
	mgrconn_close(st->c);
	free(st);
}

/* call_on_frame: waits for RESULT or ERROR; data frames are ignored. */
static void call_on_frame(void *arg, const struct wire_frame *f)
{
	struct mgrconn_callst *st = arg;
	struct tt_err err = { 0 };
	json_error_t jerr;
	json_t *obj;

	if (f->type != WIRE_RESULT && f->type != WIRE_ERROR &&
	    f->type != WIRE_DECISION)
		return;
	obj = json_loadb((const char *)f->payload, f->len,
	                 JSON_REJECT_DUPLICATES, &jerr);
	if (obj == NULL || !json_is_object(obj)) {
		json_decref(obj);
		tt_err_set(&err, TT_ERR_MALFORMED, "manager sent invalid JSON");
		call_finish(st, NULL, &err);
		return;
	}
	if (f->type == WIRE_RESULT) {
		call_finish(st, obj, NULL);
		return;
	}
	if (f->type == WIRE_ERROR)
		tt_err_set(&err, TT_ERR_TRANSPORT, "manager: %s: %s",
		           json_string_value(json_object_get(obj, "error")) ?: "error",
		           json_string_value(json_object_get(obj, "message")) ?: "");
	else
		tt_err_set(&err, TT_ERR_DENIED, "manager refused a control call");
	json_decref(obj);
	call_finish(st, NULL, &err);
}

/* call_on_end: the connection ended before a RESULT. */
static void call_on_end(void *arg, const struct tt_err *err)
{
	call_finish(arg, NULL, err);
}

/* mgrconn_call: see mgrconn.h. */
int mgrconn_call(uv_loop_t *loop, const char *path, json_t *req,
                 mgrconn_call_fn done, void *arg, struct tt_err *err)
{
	static const struct mgrconn_cbs cbs = {
		.on_frame = call_on_frame,
		.on_end = call_on_end,
	};
	struct mgrconn_callst *st = calloc(1, sizeof(*st));

	if (st == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	st->done = done;
	st->arg = arg;
	st->c = mgrconn_open(loop, path, req, &cbs, st, err);
	if (st->c == NULL) {
		free(st);
		return -1;
	}
	return 0;
}

/* label_safe: keeps a metric label value to [a-z0-9_] (values come from
 * peers and must not inject label syntax). */
static void label_safe(char *dst, size_t cap, const char *src)
{
	size_t i = 0;

	for (; src != NULL && *src != '\0' && i + 1 < cap; src++) {
		char c = *src;

		dst[i++] = ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		            c == '_') ? c : '_';
	}
	dst[i] = '\0';
}

/* mgrconn_decision: parses and counts one DECISION frame. */
json_t *mgrconn_decision(const struct wire_frame *f, enum tt_verdict *verdict)
{
	json_error_t jerr;
	json_t *obj = json_loadb((const char *)f->payload, f->len,
	                         JSON_REJECT_DUPLICATES, &jerr);
	const char *d = json_string_value(json_object_get(obj, "decision"));
	char labels[128], reason[48];

	if (d == NULL) {
		json_decref(obj);
		return NULL;
	}
	*verdict = strcmp(d, "allow") == 0 ? TT_ALLOW :
	           strcmp(d, "refresh_route") == 0 ? TT_REFRESH_ROUTE : TT_DENY;
	label_safe(reason, sizeof(reason),
	           json_string_value(json_object_get(obj, "reason")));
	snprintf(labels, sizeof(labels), "decision=\"%s\",reason=\"%s\"",
	         decision_verdict_name(*verdict), reason);
	metrics_inc("tether_node_admission_total", labels);
	return obj;
}

/* An opener's connection to the next hop (see wireconn.h). */
#include "wireconn.h"

#include <stdlib.h>
#include <string.h>

#include "relay.h"
#include "wireop.h"

#define WIRECONN_READ_CHUNK (64u * 1024u)

/* One operation's connection. Owned by the user between wireconn_open and
 * wireconn_close; then its stream goes to the pool (and the struct with
 * it, once no frame delivery is under way) or is closed, the struct going
 * in the close callback. */
struct wireconn {
	uv_pipe_t *pipe;          /* heap (the pool takes it); NULL once handed back */
	uv_connect_t connect_req;
	struct uvutil_pool *pool; /* held; NULL: never pooled */
	struct wireconn_cbs cbs;
	void *arg;
	char *req;                /* encoded REQUEST, sent once connected (owned) */
	size_t req_len;
	bool connected, closed, ended, paused, want_drain, reused;
	bool reading;             /* uv_read_start in effect (wireconn_read_set) */
	bool released;            /* the stream went back to the pool */
	unsigned busy;            /* frame deliveries under way (wireconn_process) */
	struct relay_judge judge; /* may the connection be reused */
	uint8_t *pend;            /* read bytes not yet decoded (owned) */
	size_t pend_len, pend_off;
	struct wire_reader rd;
};

/* One queued write; the frame bytes follow the struct (owned by it). */
struct wireconn_wreq {
	uv_write_t req;
	struct wireconn *c;
	uint8_t data[];
};

static void wireconn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void wireconn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* wireconn_free: the struct and what it owns (not the stream). */
static void wireconn_free(struct wireconn *c)
{
	uvutil_pool_release(c->pool);
	free(c->pend);
	free(c->req);
	free(c);
}

/* wireconn_read_set: starts or stops reading, remembering which. 0 or -1. */
static int wireconn_read_set(struct wireconn *c, bool on)
{
	if (c->reading == on)
		return 0;
	if (!on) {
		uv_read_stop((uv_stream_t *)c->pipe);
		c->reading = false;
		return 0;
	}
	if (uv_read_start((uv_stream_t *)c->pipe, wireconn_alloc, wireconn_on_read) < 0)
		return -1;
	c->reading = true;
	return 0;
}

/* wireconn_closed: libuv released the stream: the struct goes with it. */
static void wireconn_closed(uv_handle_t *h)
{
	struct wireconn *c = h->data;

	free(h);
	wireconn_free(c);
}

/* wireconn_destroy: closes the connection for good. */
static void wireconn_destroy(struct wireconn *c)
{
	if (c->closed)
		return;
	c->closed = true;
	uv_close((uv_handle_t *)c->pipe, wireconn_closed);
}

/* wireconn_reusable: the operation ended cleanly (relay_judge_clean) and
 * every byte read was decoded. Called from wireconn_close, possibly inside
 * on_frame of the RESULT: pend_off is already past it. */
static bool wireconn_reusable(const struct wireconn *c)
{
	return c->pool != NULL && c->connected && !c->ended &&
	       (c->pend == NULL || c->pend_off >= c->pend_len) &&
	       relay_judge_clean(&c->judge, &c->rd);
}

/* wireconn_park: hands the stream back to the pool (reading stopped,
 * nothing queued: relay_judge_clean); the struct goes now, or when the
 * frame delivery that closed it returns. */
static void wireconn_park(struct wireconn *c)
{
	uv_stream_t *s = (uv_stream_t *)c->pipe;

	wireconn_read_set(c, false);
	c->closed = true;
	c->released = true;
	c->pipe = NULL;
	s->data = NULL;
	uvutil_pool_put(c->pool, s);
	if (c->busy == 0)
		wireconn_free(c);
}

/* wireconn_end: reports the end of the connection once (unless closed). */
static void wireconn_end(struct wireconn *c, const struct tt_err *err)
{
	if (c->closed || c->ended)
		return;
	c->ended = true;
	relay_judge_taint(&c->judge);
	wireconn_read_set(c, false);
	if (c->cbs.on_end != NULL)
		c->cbs.on_end(c->arg, err);
}

/* wireconn_close: see wireconn.h. */
void wireconn_close(struct wireconn *c)
{
	if (c == NULL || c->closed)
		return;
	if (wireconn_reusable(c))
		wireconn_park(c);
	else
		wireconn_destroy(c);
}

/* wireconn_process: decodes buffered bytes into frames until they run out,
 * the owner pauses, or the owner closes. Returns false when c is gone. */
static bool wireconn_process(struct wireconn *c)
{
	struct tt_err err = { 0 };

	c->busy++;
	while (c->pend != NULL && c->pend_off < c->pend_len && !c->paused &&
	       !c->closed && !c->ended) {
		struct wire_frame f;
		size_t used = 0;
		int rc = wire_reader_feed(&c->rd, c->pend + c->pend_off,
		                          c->pend_len - c->pend_off, &used, &f, &err);

		c->pend_off += used;
		if (rc < 0) {
			wireconn_end(c, &err);
			break;
		}
		if (rc == 1) {
			relay_judge_frame(&c->judge, &f);
			if (c->cbs.on_frame != NULL)
				c->cbs.on_frame(c->arg, &f);
		}
		if (rc == 0 && used == 0)
			break; /* cannot happen with bytes left; stay safe */
	}
	c->busy--;
	if (c->released) {
		if (c->busy == 0)
			wireconn_free(c);
		return false;
	}
	if (c->pend != NULL && c->pend_off >= c->pend_len) {
		free(c->pend);
		c->pend = NULL;
		c->pend_len = c->pend_off = 0;
	}
	return true;
}

/* wireconn_alloc: a fresh buffer per read; ownership moves to c->pend. */
static void wireconn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	(void)h;
	(void)hint;
	buf->base = malloc(WIRECONN_READ_CHUNK);
	buf->len = buf->base ? WIRECONN_READ_CHUNK : 0;
}

/* wireconn_on_read: bytes or EOF from the far side. */
static void wireconn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct wireconn *c = s->data;
	struct tt_err err = { 0 };

	if (nread <= 0 || c->closed || c->ended) {
		free(buf->base);
		if (nread == 0 || c->closed || c->ended)
			return;
		if (nread == UV_EOF)
			tt_err_set(&err, TT_ERR_TRANSPORT, "the far side closed the connection");
		else
			tt_err_set(&err, TT_ERR_TRANSPORT, "connection: %s",
			           uv_strerror((int)nread));
		wireconn_end(c, &err);
		return;
	}
	if (c->judge.ended)
		relay_judge_taint(&c->judge); /* bytes after the operation's end */
	/* Reads are stopped while bytes are pending, so pend is empty here. */
	free(c->pend);
	c->pend = (uint8_t *)buf->base;
	c->pend_len = (size_t)nread;
	c->pend_off = 0;
	wireconn_process(c);
}

/* wireconn_on_write: frees the request; reports failures and drains. */
static void wireconn_on_write(uv_write_t *req, int status)
{
	struct wireconn_wreq *w = (struct wireconn_wreq *)req;
	struct wireconn *c = w->c;
	struct tt_err err = { 0 };

	free(w);
	c->judge.writes--;
	if (status < 0)
		relay_judge_taint(&c->judge);
	if (c->closed || c->ended)
		return;
	if (status < 0) {
		tt_err_set(&err, TT_ERR_TRANSPORT, "write: %s", uv_strerror(status));
		wireconn_end(c, &err);
		return;
	}
	if (c->want_drain && wireconn_queued(c) < WIRECONN_LOW_WATER) {
		c->want_drain = false;
		if (c->cbs.on_drain != NULL)
			c->cbs.on_drain(c->arg); /* may close c: not touched after */
	}
}

/* wireconn_send: see wireconn.h. */
int wireconn_send(struct wireconn *c, uint8_t type, const void *payload,
                  size_t len, struct tt_err *err)
{
	struct wireconn_wreq *w;
	uv_buf_t b;
	int rc;

	if (c->closed || c->ended || !c->connected)
		return tt_err_set(err, TT_ERR_TRANSPORT, "connection not open");
	if (len > WIRE_PAYLOAD_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "frame over %u bytes",
		                  WIRE_PAYLOAD_MAX);
	w = malloc(sizeof(*w) + WIRE_HDR_LEN + len);
	if (w == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	w->c = c;
	wire_hdr_encode(w->data, type, (uint32_t)len);
	if (len > 0)
		memcpy(w->data + WIRE_HDR_LEN, payload, len);
	b = uv_buf_init((char *)w->data, (unsigned)(WIRE_HDR_LEN + len));
	rc = uv_write(&w->req, (uv_stream_t *)c->pipe, &b, 1, wireconn_on_write);
	if (rc < 0) {
		free(w);
		relay_judge_taint(&c->judge);
		return tt_err_set(err, TT_ERR_TRANSPORT, "write: %s", uv_strerror(rc));
	}
	c->judge.writes++;
	if (wireconn_queued(c) > WIRECONN_HIGH_WATER)
		c->want_drain = true;
	return 0;
}

/* wireconn_send_data: splits data into frames of at most the payload bound. */
int wireconn_send_data(struct wireconn *c, uint8_t type, const void *data,
                       size_t len, struct tt_err *err)
{
	const uint8_t *p = data;

	while (len > 0) {
		size_t n = len > WIRE_PAYLOAD_MAX ? WIRE_PAYLOAD_MAX : len;

		if (wireconn_send(c, type, p, n, err) < 0)
			return -1;
		p += n;
		len -= n;
	}
	return 0;
}

/* wireconn_queued: libuv's count of bytes not yet written. */
size_t wireconn_queued(const struct wireconn *c)
{
	return c->pipe != NULL ? uv_stream_get_write_queue_size((const uv_stream_t *)c->pipe)
	                       : 0;
}

/* wireconn_reused: see wireconn.h. */
bool wireconn_reused(const struct wireconn *c)
{
	return c->reused;
}

/* wireconn_pause: stops reading; bytes already read stay buffered. */
void wireconn_pause(struct wireconn *c)
{
	if (c->paused || c->closed)
		return;
	c->paused = true;
	if (c->connected && !c->ended)
		wireconn_read_set(c, false);
}

/* wireconn_resume: delivers buffered frames first, then reads again (unless
 * the user closed the connection meanwhile). */
void wireconn_resume(struct wireconn *c)
{
	if (!c->paused || c->closed)
		return;
	c->paused = false;
	if (!wireconn_process(c))
		return;
	if (!c->paused && !c->closed && !c->ended && c->connected && c->pend == NULL)
		wireconn_read_set(c, true);
}

/* wireconn_start: the connection is up: sends the REQUEST and reads. */
static int wireconn_start(struct wireconn *c, struct tt_err *err)
{
	c->connected = true;
	if (wireconn_send(c, WIRE_REQUEST, c->req, c->req_len, err) < 0)
		return -1;
	free(c->req);
	c->req = NULL;
	if (!c->paused && wireconn_read_set(c, true) < 0)
		return tt_err_set(err, TT_ERR_TRANSPORT, "cannot read the connection");
	return 0;
}

/* wireconn_on_connect: a new connection is up, or failed. */
static void wireconn_on_connect(uv_connect_t *req, int status)
{
	struct wireconn *c = req->data;
	struct tt_err err = { 0 };

	if (c->closed)
		return;
	if (status < 0) {
		tt_err_set(&err, TT_ERR_IO, "cannot connect: %s",
		           uv_strerror(status));
		wireconn_end(c, &err);
		return;
	}
	if (wireconn_start(c, &err) < 0)
		wireconn_end(c, &err);
}

/* wireconn_new: a connection struct for the encoded REQUEST enc (taken). */
static struct wireconn *wireconn_new(char *enc, const struct wireconn_cbs *cbs, void *arg,
                                     struct uvutil_pool *pool)
{
	struct wireconn *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return NULL;
	c->req = enc;
	c->req_len = strlen(enc);
	c->cbs = *cbs;
	c->arg = arg;
	c->pool = uvutil_pool_hold(pool);
	wire_reader_init(&c->rd);
	return c;
}

/* wireconn_take: the REQUEST goes out on an idle pooled connection; NULL
 * when the pool has none that takes it (each that fails is closed: nothing
 * was sent on it). */
static struct wireconn *wireconn_take(struct uvutil_pool *pool, const char *enc,
                                      const struct wireconn_cbs *cbs, void *arg)
{
	uv_stream_t *s;

	while ((s = uvutil_pool_get(pool)) != NULL) {
		char *copy = strdup(enc);
		struct wireconn *c = copy ? wireconn_new(copy, cbs, arg, pool) : NULL;
		struct tt_err err = { 0 };

		if (c == NULL) {
			free(copy);
			relay_close_free(s);
			return NULL;
		}
		c->pipe = (uv_pipe_t *)s;
		s->data = c;
		c->reused = true;
		if (wireconn_start(c, &err) == 0)
			return c;
		wireconn_destroy(c);
	}
	return NULL;
}

/* wireconn_open: see wireconn.h. */
struct wireconn *wireconn_open(uv_loop_t *loop, struct uvutil_pool *pool,
                               const char *path, json_t *req,
                               const struct wireconn_cbs *cbs, void *arg,
                               struct tt_err *err)
{
	struct wireconn *c;
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
	/* The far side closes after a control request: never pooled. */
	if (wireop_control(wireop_parse(json_string_value(json_object_get(req, "op")))))
		pool = NULL;
	c = wireconn_take(pool, enc, cbs, arg);
	if (c != NULL) {
		free(enc);
		return c;
	}
	c = wireconn_new(enc, cbs, arg, pool);
	if (c == NULL || (c->pipe = malloc(sizeof(*c->pipe))) == NULL) {
		if (c != NULL)
			wireconn_free(c);
		else
			free(enc);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	if (uv_pipe_init(loop, c->pipe, 0) < 0) {
		free(c->pipe);
		wireconn_free(c);
		tt_err_set(err, TT_ERR_SYS, "uv_pipe_init failed");
		return NULL;
	}
	c->pipe->data = c;
	c->connect_req.data = c;
	/* Connect errors (absent socket, refused) arrive in the callback; a
	 * socket path of any length (unixaddr.h). */
	uvutil_pipe_connect(&c->connect_req, c->pipe, path, wireconn_on_connect);
	return c;
}

/* Async client of the sbx-manager socket (see mgrconn.h). */
#include "node/mgrconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "log.h"
#include "metrics.h"
#include "uvutil.h"
#include "wire_json.h"
#include "wireop.h"

#define MGRCONN_READ_CHUNK (64u * 1024u)

/* Idle connections to one socket path on one loop. Owned by the global list
 * below; it lives as long as the loop unless mgrconn_pool_shutdown ends it,
 * and then goes when the last connection that points at it is freed. */
struct mgrpool {
	struct mgrpool *next;
	uv_loop_t *loop;
	char *path;            /* owned */
	struct mgrconn *idle;  /* idle connections, most recent first (owned) */
	size_t n_idle;
	size_t refs;           /* connections pointing here */
	bool closing;
};

/* All pools; the node-api runs one loop on one thread, so no lock. */
static struct mgrpool *pools;
static uint64_t pool_idle_ms = MGRCONN_IDLE_MS;

/* One connection. Owned by the user between mgrconn_open and mgrconn_close,
 * by its pool while idle, by libuv's close callbacks while closing. */
struct mgrconn {
	uv_pipe_t pipe;
	uv_connect_t connect_req;
	uv_timer_t idle_timer; /* closes the connection after pool_idle_ms idle */
	struct mgrconn_cbs cbs;
	void *arg;
	char *req;        /* encoded REQUEST, sent once connected (owned) */
	size_t req_len;
	bool connected, closed, ended, paused, want_drain;
	bool reading;     /* uv_read_start in effect (mgrconn_read_set) */
	/* Per operation: the first frame was DECISION allow; the RESULT/ERROR
	 * that ends it arrived; something made the connection unfit for reuse
	 * (bytes after the end, a write error, a malformed frame). */
	bool seen_first, allowed, done, dirty;
	bool idle;        /* parked in pool->idle */
	unsigned gen;     /* bumped when the connection changes hands */
	int handles;      /* libuv handles still to be closed before free */
	struct mgrpool *pool;    /* NULL for control calls (never pooled) */
	struct mgrconn *idle_next;
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

static void mgrconn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void mgrconn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* mgrconn_read_set: starts or stops reading, remembering which: a
 * connection parked in its pool must read (pool_park), and whether it
 * still does depends on every pause, resume and end before. 0 or -1. */
static int mgrconn_read_set(struct mgrconn *c, bool on)
{
	if (c->reading == on)
		return 0;
	if (!on) {
		uv_read_stop((uv_stream_t *)&c->pipe);
		c->reading = false;
		return 0;
	}
	if (uv_read_start((uv_stream_t *)&c->pipe, mgrconn_alloc, mgrconn_on_read) < 0)
		return -1;
	c->reading = true;
	return 0;
}

/* ---- pool --------------------------------------------------------------- */

/* pool_get: the pool of loop + path, created on first use (NULL when out of
 * memory: the connection is then simply not pooled). */
static struct mgrpool *pool_get(uv_loop_t *loop, const char *path)
{
	struct mgrpool *p;

	for (p = pools; p != NULL; p = p->next)
		if (p->loop == loop && strcmp(p->path, path) == 0)
			return p;
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return NULL;
	p->path = strdup(path);
	if (p->path == NULL) {
		free(p);
		return NULL;
	}
	p->loop = loop;
	p->next = pools;
	pools = p;
	return p;
}

/* pool_unref: a connection let go of p; a shut-down pool goes with its last
 * connection (it is already off the global list). */
static void pool_unref(struct mgrpool *p)
{
	if (p == NULL)
		return;
	p->refs--;
	if (p->closing && p->refs == 0) {
		free(p->path);
		free(p);
	}
}

/* pool_unlink: takes c off its pool's idle list. */
static void pool_unlink(struct mgrconn *c)
{
	struct mgrconn **pp;

	if (!c->idle)
		return;
	for (pp = &c->pool->idle; *pp != NULL; pp = &(*pp)->idle_next) {
		if (*pp == c) {
			*pp = c->idle_next;
			break;
		}
	}
	c->idle_next = NULL;
	c->idle = false;
	c->pool->n_idle--;
}

/* mgrconn_closed: last step, once libuv has released both handles. */
static void mgrconn_closed(uv_handle_t *h)
{
	struct mgrconn *c = h->data;

	if (--c->handles > 0)
		return;
	pool_unref(c->pool);
	free(c->pend);
	free(c->req);
	free(c);
}

/* mgrconn_destroy: closes the connection for good (idle or not). */
static void mgrconn_destroy(struct mgrconn *c)
{
	if (c->closed)
		return;
	pool_unlink(c);
	c->closed = true;
	c->gen++;
	uv_close((uv_handle_t *)&c->pipe, mgrconn_closed);
	uv_close((uv_handle_t *)&c->idle_timer, mgrconn_closed);
}

/* pool_on_idle_timeout: an idle connection unused for pool_idle_ms. */
static void pool_on_idle_timeout(uv_timer_t *t)
{
	mgrconn_destroy(t->data);
}

/* mgrconn_reusable: the operation ended cleanly: allowed, its RESULT/ERROR
 * was the last thing received (nothing buffered after it, no partial
 * frame), nothing failed, and the pool has room. Called from mgrconn_close,
 * possibly inside on_frame of that RESULT: pend_off is already past it. */
static bool mgrconn_reusable(const struct mgrconn *c)
{
	return c->pool != NULL && !c->pool->closing &&
	       c->pool->n_idle < MGRCONN_POOL_MAX && c->connected &&
	       !c->ended && !c->dirty && c->allowed && c->done &&
	       (c->pend == NULL || c->pend_off >= c->pend_len) &&
	       c->rd.hdr_have == 0 && c->rd.have == 0;
}

/* pool_park: moves a clean connection into its pool: no user callbacks,
 * reading on (EOF or any byte while idle drops it), idle timer running,
 * handles unreferenced so an idle pool never keeps the loop alive. */
static void pool_park(struct mgrconn *c)
{
	c->gen++;
	memset(&c->cbs, 0, sizeof(c->cbs));
	c->arg = NULL;
	free(c->pend);
	c->pend = NULL;
	c->pend_len = c->pend_off = 0;
	c->want_drain = false;
	/* Usually still reading: a stop + start would cost two epoll_ctl
	 * calls on every operation. */
	if (mgrconn_read_set(c, true) < 0 ||
	    uv_timer_start(&c->idle_timer, pool_on_idle_timeout, pool_idle_ms,
	                   0) < 0) {
		c->paused = false;
		mgrconn_destroy(c);
		return;
	}
	c->paused = false;
	uv_unref((uv_handle_t *)&c->pipe);
	uv_unref((uv_handle_t *)&c->idle_timer);
	c->idle = true;
	c->idle_next = c->pool->idle;
	c->pool->idle = c;
	c->pool->n_idle++;
}

/* pool_take: an idle connection of loop + path, handed to a new user with
 * a fresh per-operation state, or NULL. */
static struct mgrconn *pool_take(struct mgrpool *p)
{
	struct mgrconn *c = p != NULL ? p->idle : NULL;

	if (c == NULL)
		return NULL;
	pool_unlink(c);
	uv_timer_stop(&c->idle_timer);
	uv_ref((uv_handle_t *)&c->pipe);
	uv_ref((uv_handle_t *)&c->idle_timer);
	c->gen++;
	c->seen_first = c->allowed = c->done = c->dirty = false;
	return c;
}

/* mgrconn_pool_idle: see mgrconn.h. */
size_t mgrconn_pool_idle(uv_loop_t *loop, const char *path)
{
	for (struct mgrpool *p = pools; p != NULL; p = p->next)
		if (p->loop == loop && strcmp(p->path, path) == 0)
			return p->n_idle;
	return 0;
}

/* mgrconn_pool_shutdown: see mgrconn.h. */
void mgrconn_pool_shutdown(uv_loop_t *loop)
{
	struct mgrpool **pp = &pools;

	while (*pp != NULL) {
		struct mgrpool *p = *pp;

		if (p->loop != loop) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		p->closing = true;
		while (p->idle != NULL)
			mgrconn_destroy(p->idle);
		if (p->refs == 0) {
			free(p->path);
			free(p);
		}
	}
}

/* mgrconn_pool_set_idle_ms: see mgrconn.h. */
void mgrconn_pool_set_idle_ms(uint64_t ms)
{
	pool_idle_ms = ms;
}

/* ---- one connection ------------------------------------------------------ */

/* mgrconn_end: reports the end of the connection once (unless closed). */
static void mgrconn_end(struct mgrconn *c, const struct tt_err *err)
{
	if (c->closed || c->ended)
		return;
	c->ended = true;
	mgrconn_read_set(c, false);
	if (c->cbs.on_end != NULL)
		c->cbs.on_end(c->arg, err);
}

/* mgrconn_close: see mgrconn.h. A clean connection goes back to the pool,
 * anything else is closed as before. */
void mgrconn_close(struct mgrconn *c)
{
	if (c == NULL || c->closed || c->idle)
		return;
	if (mgrconn_reusable(c))
		pool_park(c);
	else
		mgrconn_destroy(c);
}

/* frame_is_allow: the frame is a DECISION whose verdict is allow. */
static bool frame_is_allow(const struct wire_frame *f)
{
	json_error_t jerr;
	json_t *obj;
	bool allow;

	if (f->type != WIRE_DECISION)
		return false;
	obj = json_loadb((const char *)f->payload, f->len, JSON_REJECT_DUPLICATES,
	                 &jerr);
	allow = json_is_object(obj) &&
	        json_is_string(json_object_get(obj, "decision")) &&
	        strcmp(json_string_value(json_object_get(obj, "decision")),
	               "allow") == 0;
	json_decref(obj);
	return allow;
}

/* mgrconn_track: follows the operation's frames to judge reuse: DECISION
 * allow first, then frames until RESULT/ERROR, then nothing. */
static void mgrconn_track(struct mgrconn *c, const struct wire_frame *f)
{
	if (c->done) {
		c->dirty = true; /* the manager must send nothing after the end */
		return;
	}
	if (!c->seen_first) {
		c->seen_first = true;
		c->allowed = frame_is_allow(f);
		return;
	}
	if (c->allowed && (f->type == WIRE_RESULT || f->type == WIRE_ERROR)) {
		c->done = true;
		if (wire_error_closing(f))
			c->dirty = true; /* the manager closes after it: not pooled */
	}
}

/* mgrconn_process: decodes buffered bytes into frames until they run out,
 * the owner pauses, or the owner closes (or hands the connection back to
 * the pool: gen changes, and it may already serve someone else). */
static void mgrconn_process(struct mgrconn *c)
{
	struct tt_err err = { 0 };
	unsigned gen = c->gen;

	while (c->pend != NULL && c->pend_off < c->pend_len && !c->paused &&
	       !c->closed && !c->ended && c->gen == gen) {
		struct wire_frame f;
		size_t used = 0;
		int rc = wire_reader_feed(&c->rd, c->pend + c->pend_off,
		                          c->pend_len - c->pend_off, &used, &f, &err);

		c->pend_off += used;
		if (rc < 0) {
			c->dirty = true;
			mgrconn_end(c, &err);
			return;
		}
		if (rc == 1) {
			mgrconn_track(c, &f);
			if (c->cbs.on_frame != NULL)
				c->cbs.on_frame(c->arg, &f);
		}
		if (rc == 0 && used == 0)
			break; /* cannot happen with bytes left; stay safe */
	}
	if (c->gen == gen && c->pend != NULL && c->pend_off >= c->pend_len) {
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

	if (c->idle) {
		/* The manager sends nothing on an idle connection: EOF, an error
		 * or a stray byte all mean it is unusable. */
		free(buf->base);
		if (nread != 0)
			mgrconn_destroy(c);
		return;
	}
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
	if (c->done)
		c->dirty = true; /* bytes after the operation's end */
	/* Reads are stopped while bytes are pending, so pend is empty here. */
	free(c->pend);
	c->pend = (uint8_t *)buf->base;
	c->pend_len = (size_t)nread;
	c->pend_off = 0;
	mgrconn_process(c);
}

/* mgrconn_on_write: frees the request; reports failures and drains. A
 * failed write also rules out reuse, and drops an idle connection. */
static void mgrconn_on_write(uv_write_t *req, int status)
{
	struct mgrconn_wreq *w = (struct mgrconn_wreq *)req;
	struct mgrconn *c = w->c;
	struct tt_err err = { 0 };

	free(w);
	if (c->closed)
		return;
	if (status < 0)
		c->dirty = true;
	if (c->idle) {
		if (status < 0)
			mgrconn_destroy(c);
		return;
	}
	if (c->ended)
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

	if (c->closed || c->ended || c->idle || !c->connected)
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
		c->dirty = true;
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
	if (c->paused || c->closed || c->idle)
		return;
	c->paused = true;
	if (c->connected && !c->ended)
		mgrconn_read_set(c, false);
}

/* mgrconn_resume: delivers buffered frames first, then reads again (unless
 * the user closed or released the connection meanwhile). */
void mgrconn_resume(struct mgrconn *c)
{
	unsigned gen = c->gen;

	if (!c->paused || c->closed || c->idle)
		return;
	c->paused = false;
	mgrconn_process(c);
	if (c->gen == gen && !c->paused && !c->closed && !c->ended &&
	    c->connected && c->pend == NULL)
		mgrconn_read_set(c, true);
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
		mgrconn_read_set(c, true);
}

/* req_is_control: control requests (lib/wireop.h) get no DECISION and
 * the manager closes their connection after the RESULT (a watch never
 * ends): they never use the pool. */
static bool req_is_control(json_t *req)
{
	return wireop_control(wireop_parse(json_string_value(json_object_get(req, "op"))));
}

/* mgrconn_reuse: sends the REQUEST on an idle pooled connection, which
 * then serves the user like a fresh one (frames arrive from the loop, never
 * inside this call). Returns false when the write cannot even be queued:
 * nothing was sent, the connection is closed, the caller tries another. */
static bool mgrconn_reuse(struct mgrconn *c, const char *enc, size_t len,
                          const struct mgrconn_cbs *cbs, void *arg)
{
	struct tt_err err = { 0 };

	c->cbs = *cbs;
	c->arg = arg;
	if (mgrconn_send(c, WIRE_REQUEST, enc, len, &err) < 0) {
		mgrconn_destroy(c);
		return false;
	}
	return true;
}

/* mgrconn_open: see mgrconn.h. */
struct mgrconn *mgrconn_open(uv_loop_t *loop, const char *path, json_t *req,
                             const struct mgrconn_cbs *cbs, void *arg,
                             struct tt_err *err)
{
	struct mgrpool *pool = NULL;
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
	if (!req_is_control(req))
		pool = pool_get(loop, path);
	while ((c = pool_take(pool)) != NULL) {
		if (mgrconn_reuse(c, enc, strlen(enc), cbs, arg)) {
			free(enc);
			metrics_inc("tether_node_manager_connections_total",
			            "conn=\"reused\"");
			return c;
		}
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
	uv_timer_init(loop, &c->idle_timer); /* cannot fail on a live loop */
	c->handles = 2;
	c->pipe.data = c;
	c->idle_timer.data = c;
	c->connect_req.data = c;
	c->pool = pool;
	if (pool != NULL)
		pool->refs++;
	metrics_inc("tether_node_manager_connections_total", "conn=\"new\"");
	/* Connect errors (absent socket, refused) arrive in the callback; a
	 * socket path of any length (unixaddr.h). */
	uvutil_pipe_connect(&c->connect_req, &c->pipe, path, mgrconn_on_connect);
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

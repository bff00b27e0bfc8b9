/* libuv plumbing shared by the sbx-manager and the host bridge (see
 * uvutil.h). */
#include <errno.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "relay.h"
#include "unixaddr.h"
#include "uvutil.h"

/* uvutil_listen: bound by us (unixaddr_bind: a path of any length, under
 * umask 077 so the socket is never reachable by others, not even between
 * bind and chmod), then handed to libuv. Not uv_pipe_bind: it cannot bind
 * a path past sun_path, and it unlinks the name it was given when the
 * handle closes (our owners remove their socket files themselves). */
int uvutil_listen(uv_loop_t *loop, uv_pipe_t *server, const char *path, int backlog,
                  uv_connection_cb cb, void *data, struct tt_err *err)
{
	int fd, rc;

	uv_pipe_init(loop, server, 0);
	server->data = data;
	fd = unixaddr_bind(path, err);
	if (fd < 0)
		return -1;
	rc = uv_pipe_open(server, fd);
	if (rc < 0) {
		close(fd);
		return tt_err_set(err, TT_ERR_IO, "listen on %s: %s", path, uv_strerror(rc));
	}
	rc = uv_listen((uv_stream_t *)server, backlog, cb);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_IO, "listen on %s: %s", path, uv_strerror(rc));
	return 0;
}

/* uvutil_pipe_connect: uv_pipe_connect through unixaddr_dir (libuv would
 * cut a long path short at sun_path's size and connect to whatever that
 * prefix names). A directory that cannot be opened fails like a missing
 * socket, in cb, with ENOENT: "/proc/self/fd/-1" names nothing. */
void uvutil_pipe_connect(uv_connect_t *req, uv_pipe_t *pipe, const char *path,
                         uv_connect_cb cb)
{
	struct unixaddr ua;

	if (unixaddr_dir(path, &ua, NULL) < 0)
		snprintf(ua.sa.sun_path, sizeof(ua.sa.sun_path), "%s", "/proc/self/fd/-1/gone");
	uv_pipe_connect(req, pipe, ua.sa.sun_path, cb);
	unixaddr_done(&ua);
}

/* uvutil_accept: a failed accept frees what it allocated. */
uv_pipe_t *uvutil_accept(uv_stream_t *server, uv_loop_t *loop)
{
	uv_pipe_t *p = malloc(sizeof(*p));

	if (p == NULL || uv_pipe_init(loop, p, 0) < 0) {
		free(p);
		return NULL;
	}
	if (uv_accept(server, (uv_stream_t *)p) < 0) {
		relay_close_free((uv_stream_t *)p);
		return NULL;
	}
	return p;
}

/* uvutil_signals_start: both handles get data, so cb finds its owner. */
void uvutil_signals_start(uv_loop_t *loop, uv_signal_t *term, uv_signal_t *intr,
                          uv_signal_cb cb, void *data)
{
	uv_signal_init(loop, term);
	uv_signal_init(loop, intr);
	term->data = data;
	intr->data = data;
	uv_signal_start(term, cb, SIGTERM);
	uv_signal_start(intr, cb, SIGINT);
}

/* request_take: the REQUEST frame f is complete after used bytes of buf:
 * the rest is copied to *pending. */
static enum uvutil_req request_take(const uint8_t *buf, size_t nread, size_t used,
                                    uint8_t **pending, size_t *pending_len)
{
	if (nread > used) {
		*pending_len = nread - used;
		*pending = malloc(*pending_len);
		if (*pending == NULL) {
			*pending_len = 0;
			return UVUTIL_REQ_NOMEM;
		}
		memcpy(*pending, buf + used, *pending_len);
	}
	return UVUTIL_REQ_READY;
}

/* request_scan: decodes the frames of one read up to the REQUEST; stray
 * input frames are dropped when skip_input. The reader is bounded
 * (wire.h), so a peer can neither grow a frame past WIRE_PAYLOAD_MAX nor
 * skip the REQUEST. */
static enum uvutil_req request_scan(uv_stream_t *s, struct wire_reader *rd,
                                    const uint8_t *buf, ssize_t nread,
                                    struct wire_frame *f, uint8_t **pending,
                                    size_t *pending_len, bool skip_input,
                                    struct tt_err *err)
{
	size_t off = 0;

	if (nread == 0)
		return UVUTIL_REQ_MORE;
	if (nread < 0) { /* closed before a whole REQUEST */
		uv_read_stop(s);
		return UVUTIL_REQ_CLOSED;
	}
	while (off < (size_t)nread) {
		size_t used = 0;
		int rc = wire_reader_feed(rd, buf + off, (size_t)nread - off, &used, f, err);

		off += used;
		if (rc == 0)
			return UVUTIL_REQ_MORE;
		if (rc < 0) {
			uv_read_stop(s);
			return UVUTIL_REQ_BAD;
		}
		if (f->type == WIRE_REQUEST) {
			uv_read_stop(s);
			return request_take(buf, (size_t)nread, off, pending, pending_len);
		}
		if (!skip_input || (f->type != WIRE_DATA_IN && f->type != WIRE_EOF_IN)) {
			uv_read_stop(s);
			tt_err_set(err, TT_ERR_MALFORMED, "%s frame where a REQUEST belongs",
			           wire_type_name(f->type));
			return UVUTIL_REQ_BAD;
		}
	}
	return UVUTIL_REQ_MORE; /* only stray input so far */
}

/* uvutil_read_request: stray input is dropped after the first operation. */
enum uvutil_req uvutil_read_request(uv_stream_t *s, uint64_t served,
                                    struct wire_reader *rd, const uint8_t *buf,
                                    ssize_t nread, struct wire_frame *f,
                                    uint8_t **pending, size_t *pending_len,
                                    struct tt_err *err)
{
	return request_scan(s, rd, buf, nread, f, pending, pending_len, served > 0, err);
}

/* ---- server skeleton ----------------------------------------------------- */

/* reqconn_alloc: reads land in the role's buffer. */
static void reqconn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct uvutil_reqconn *rc = h->data;

	(void)hint;
	*buf = uv_buf_init((char *)rc->buf, (unsigned)rc->cap);
}

/* reqconn_read: waits for the connection's next REQUEST frame. */
static void reqconn_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct uvutil_reqconn *rc = s->data;
	struct wire_frame f;
	struct tt_err err = { 0 };

	(void)buf;
	switch (uvutil_read_request(s, rc->served, &rc->rd, rc->buf, nread, &f, &rc->pending,
	                            &rc->pending_len, &err)) {
	case UVUTIL_REQ_MORE:
		return;
	case UVUTIL_REQ_READY:
		rc->ops->request(rc, &f);
		return;
	case UVUTIL_REQ_BAD:
		log_warn("closing a connection: %s", err.msg);
		rc->ops->gone(rc, &err);
		return;
	case UVUTIL_REQ_NOMEM:
		rc->ops->fail(rc, WIRE_E_INTERNAL, "out of memory");
		return;
	case UVUTIL_REQ_CLOSED:
		break;
	}
	rc->ops->gone(rc, NULL);
}

/* uvutil_server_accept: accept, the peer hook, the role's connection,
 * then its first REQUEST. */
void uvutil_server_accept(uv_stream_t *server, int status)
{
	struct uvutil_server *srv = server->data;
	struct uvutil_reqconn *rc;
	uv_pipe_t *p;

	if (status < 0 || (p = uvutil_accept(server, srv->loop)) == NULL)
		return;
	if (!srv->ops->peer(srv->data, p))
		return;
	rc = srv->ops->conn(srv->data, p);
	if (rc == NULL) {
		relay_close_free((uv_stream_t *)p);
		return;
	}
	rc->ops = srv->ops;
	wire_reader_init(&rc->rd);
	if (uv_read_start((uv_stream_t *)p, reqconn_alloc, reqconn_read) < 0)
		rc->ops->gone(rc, NULL);
}

/* uvutil_reqconn_next: see uvutil.h. */
int uvutil_reqconn_next(struct uvutil_reqconn *rc, struct relay_kept *kept,
                        uv_pipe_t **conn)
{
	free(rc->pending);
	rc->pending = NULL;
	rc->pending_len = 0;
	rc->served++;
	*conn = (uv_pipe_t *)kept->opener;
	relay_kept_reader(kept, &rc->rd);
	kept->opener->data = rc;
	return uv_read_start(kept->opener, reqconn_alloc, reqconn_read) < 0 ? -1 : 0;
}

/* ---- idle connection pool ------------------------------------------------ */

/* One idle connection: the stream, its deadline, and a scrap buffer for the
 * read that only ever detects EOF or a protocol breach. Owned by the pool
 * while listed; freed by the timer's close callback. */
struct pool_ent {
	struct uvutil_pool *pool;
	uv_stream_t *s;
	uv_timer_t timer;
	struct pool_ent *next;
	char scrap[64];
};

struct uvutil_pool {
	uv_loop_t *loop;
	unsigned max_idle, n;
	uint64_t idle_ms;
	struct pool_ent *head;   /* most recently idle first */
	unsigned holds;          /* uvutil_pool_hold without its release */
	bool closing;            /* uvutil_pool_free ran: takes nothing more */
};

/* uvutil_pool_new: an empty pool. */
struct uvutil_pool *uvutil_pool_new(uv_loop_t *loop, unsigned max_idle,
                                    uint64_t idle_ms)
{
	struct uvutil_pool *p = calloc(1, sizeof(*p));

	if (p != NULL) {
		p->loop = loop;
		p->max_idle = max_idle;
		p->idle_ms = idle_ms;
	}
	return p;
}

/* pool_unlink: takes e off its pool's list. */
static void pool_unlink(struct pool_ent *e)
{
	struct pool_ent **pp;

	if (e->pool == NULL)
		return;
	for (pp = &e->pool->head; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			e->pool->n--;
			break;
		}
	e->pool = NULL;
}

/* ent_timer_closed: the last handle of an entry is gone. */
static void ent_timer_closed(uv_handle_t *h)
{
	free(h->data);
}

/* ent_drop: closes an idle connection and releases its entry. */
static void ent_drop(struct pool_ent *e)
{
	pool_unlink(e);
	uv_read_stop(e->s);
	relay_close_free(e->s);
	uv_close((uv_handle_t *)&e->timer, ent_timer_closed);
}

/* ent_alloc: reads of an idle connection land in the scrap buffer. */
static void ent_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct pool_ent *e = h->data;

	(void)hint;
	*buf = uv_buf_init(e->scrap, sizeof(e->scrap));
}

/* ent_read: the far side may send nothing between operations: bytes, EOF
 * or an error all end this connection. */
static void ent_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	(void)buf;
	if (nread == 0)
		return;
	ent_drop(s->data);
}

/* ent_expired: idle for too long. */
static void ent_expired(uv_timer_t *t)
{
	ent_drop(t->data);
}

/* uvutil_pool_put: the newest idle connection goes first. */
void uvutil_pool_put(struct uvutil_pool *p, uv_stream_t *s)
{
	struct pool_ent *e;

	if (p == NULL || p->closing || p->n >= p->max_idle ||
	    (e = calloc(1, sizeof(*e))) == NULL) {
		relay_close_free(s);
		return;
	}
	e->pool = p;
	e->s = s;
	s->data = e;
	uv_timer_init(p->loop, &e->timer);
	e->timer.data = e;
	uv_timer_start(&e->timer, ent_expired, p->idle_ms, 0);
	if (uv_read_start(s, ent_alloc, ent_read) < 0) {
		ent_drop(e);
		return;
	}
	/* An idle pool never keeps the loop running on its own. */
	uv_unref((uv_handle_t *)s);
	uv_unref((uv_handle_t *)&e->timer);
	e->next = p->head;
	p->head = e;
	p->n++;
}

/* uvutil_pool_get: hands the stream over; the entry itself goes. */
uv_stream_t *uvutil_pool_get(struct uvutil_pool *p)
{
	struct pool_ent *e;
	uv_stream_t *s;

	if (p == NULL || (e = p->head) == NULL)
		return NULL;
	pool_unlink(e);
	s = e->s;
	uv_read_stop(s);
	uv_ref((uv_handle_t *)s);
	s->data = NULL;
	uv_close((uv_handle_t *)&e->timer, ent_timer_closed);
	return s;
}

/* uvutil_pool_size: for tests and metrics. */
unsigned uvutil_pool_size(const struct uvutil_pool *p)
{
	return p != NULL ? p->n : 0;
}

/* uvutil_pool_free: every entry closes on its own after this; the pool
 * itself goes with its last hold. */
void uvutil_pool_free(struct uvutil_pool *p)
{
	if (p == NULL)
		return;
	while (p->head != NULL)
		ent_drop(p->head);
	p->closing = true;
	if (p->holds == 0)
		free(p);
}

/* uvutil_pool_hold: see uvutil.h. */
struct uvutil_pool *uvutil_pool_hold(struct uvutil_pool *p)
{
	if (p != NULL)
		p->holds++;
	return p;
}

/* uvutil_pool_release: see uvutil.h. */
void uvutil_pool_release(struct uvutil_pool *p)
{
	if (p == NULL)
		return;
	p->holds--;
	if (p->closing && p->holds == 0)
		free(p);
}

/* The bridge's microVM channel: see vmchan.h. One libuv pipe to the VMM's
 * chardev socket, lib/mux.h frames on it, and per stream one socketpair
 * whose far end the bridge's ordinary code uses as a guest connection. */
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bridge/vmchan.h"
#include "claims.h"
#include "log.h"
#include "mux.h"

/* Bytes queued on the channel above which streams stop being read, and
 * below which they resume. */
#define VMCHAN_Q_HIGH (1024u * 1024u)
#define VMCHAN_Q_LOW (256u * 1024u)

enum vstate { V_DOWN, V_CONNECTING, V_SYNCING, V_UP };

struct bstream {
	struct vmchan *v;
	uint32_t id;
	uv_pipe_t pipe;          /* our end of the socketpair */
	struct mux_credit cr;
	size_t wq;               /* bytes from the guest not yet written to pipe */
	bool reading, eof_in, shut, eof_out, closing;
	struct bstream *next;
};

struct pending {
	vmchan_open_cb cb;
	void *arg;
	struct pending *next;
};

struct vmchan {
	uv_loop_t *loop;
	const struct proc_identity *owner;
	char sbx[TT_SBX_ID_LEN + 1];
	uint64_t gen;
	uint32_t att;
	uint8_t secret[HELLO_SECRET_LEN];
	enum vstate state;
	uv_pipe_t *chan;         /* NULL when down */
	uv_connect_t connect;
	uv_timer_t timer;        /* the session's deadline */
	uint8_t nonce[MUX_NONCE_LEN];
	bool sync_ok;
	struct mux_reader *rd;
	struct pending *pend;
	struct bstream *streams;
	unsigned nstreams;
	uint32_t next_id;
	size_t chan_q;
	bool throttled;
	uint8_t rbuf[65536];
};

struct chan_write {
	uv_write_t req;
	struct vmchan *v;        /* NULL once the channel it went to is gone */
	uv_pipe_t *chan;
	size_t len;
	uint8_t data[];
};

static void chan_down(struct vmchan *v, enum refusal reason, const char *why);
static void stream_read_start(struct bstream *s);

/* handle_free_cb: frees a closed heap handle. */
static void handle_free_cb(uv_handle_t *h)
{
	free(h);
}

/* chan_write_cb: a frame left; resume the streams once the queue drained. */
static void chan_write_cb(uv_write_t *req, int status)
{
	struct chan_write *w = (struct chan_write *)req;
	struct vmchan *v = w->v;

	if (v != NULL && v->chan == w->chan) {
		v->chan_q -= w->len;
		if (status < 0) {
			free(w);
			chan_down(v, REFUSAL_NONE, "the channel to the VMM failed");
			return;
		}
		if (v->throttled && v->chan_q < VMCHAN_Q_LOW) {
			v->throttled = false;
			for (struct bstream *s = v->streams; s; s = s->next)
				stream_read_start(s);
		}
	}
	free(w);
}

/* chan_send_buf: sends a frame whose payload already sits after room for
 * the header in w->data; takes w. */
static void chan_send_buf(struct vmchan *v, struct chan_write *w, uint8_t type, uint32_t id,
                          uint32_t len)
{
	uv_buf_t b;

	mux_hdr_encode(w->data, type, id, len);
	w->v = v;
	w->chan = v->chan;
	w->len = MUX_HDR_LEN + len;
	b = uv_buf_init((char *)w->data, (unsigned)w->len);
	v->chan_q += w->len;
	if (uv_write(&w->req, (uv_stream_t *)v->chan, &b, 1, chan_write_cb) < 0) {
		v->chan_q -= w->len;
		free(w);
		chan_down(v, REFUSAL_NONE, "the channel to the VMM failed");
		return;
	}
	if (v->chan_q > VMCHAN_Q_HIGH)
		v->throttled = true;
}

/* chan_send: one frame with a copy of payload. */
static void chan_send(struct vmchan *v, uint8_t type, uint32_t id, const void *payload,
                      uint32_t len)
{
	struct chan_write *w;

	if (v->chan == NULL)
		return;
	w = malloc(sizeof(*w) + MUX_HDR_LEN + len);
	if (w == NULL) {
		chan_down(v, REFUSAL_NONE, "out of memory");
		return;
	}
	if (len > 0)
		memcpy(w->data + MUX_HDR_LEN, payload, len);
	chan_send_buf(v, w, type, id, len);
}

/* stream_close_cb: the stream's pipe is closed: free it. */
static void stream_close_cb(uv_handle_t *h)
{
	free(h->data);
}

/* stream_close: the stream goes (the bridge's end then reads EOF); RST
 * tells the guest unless it is the one that ended it. */
static void stream_close(struct bstream *s, bool rst)
{
	struct vmchan *v = s->v;
	struct bstream **pp;

	if (s->closing)
		return;
	s->closing = true;
	for (pp = &v->streams; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	v->nstreams--;
	if (rst && v->state == V_UP)
		chan_send(v, MUX_RST, s->id, NULL, 0);
	uv_close((uv_handle_t *)&s->pipe, stream_close_cb);
}

/* stream_find: the open stream id, or NULL. */
static struct bstream *stream_find(struct vmchan *v, uint32_t id)
{
	for (struct bstream *s = v->streams; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

/* stream_maybe_done: both directions ended: the stream goes. */
static void stream_maybe_done(struct bstream *s)
{
	if (s->eof_out && s->shut && s->wq == 0)
		stream_close(s, false);
}

/* stream_alloc_cb: a frame buffer with room for the header, holding at
 * most the stream's credit. */
static void stream_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct bstream *s = h->data;
	size_t n = s->cr.send < MUX_PAYLOAD_MAX ? s->cr.send : MUX_PAYLOAD_MAX;
	struct chan_write *w = n ? malloc(sizeof(*w) + MUX_HDR_LEN + n) : NULL;

	(void)suggested;
	*buf = w ? uv_buf_init((char *)w->data + MUX_HDR_LEN, (unsigned)n) : uv_buf_init(NULL, 0);
}

/* stream_read_cb: bytes from the bridge's side become one DATA frame. */
static void stream_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct bstream *s = st->data;
	struct vmchan *v = s->v;
	struct chan_write *w = buf->base ? (struct chan_write *)(void *)
	                       ((uint8_t *)buf->base - MUX_HDR_LEN - offsetof(struct chan_write, data))
	                       : NULL;

	if (nread <= 0) {
		free(w);
		if (nread == 0)
			return;
		uv_read_stop(st);
		s->reading = false;
		if (nread == UV_EOF) {
			s->eof_out = true;
			chan_send(v, MUX_EOF, s->id, NULL, 0);
			stream_maybe_done(s);
		} else {
			stream_close(s, true);
		}
		return;
	}
	s->cr.send -= (uint32_t)nread;
	chan_send_buf(v, w, MUX_DATA, s->id, (uint32_t)nread);
	if ((s->cr.send == 0 || v->throttled) && s->reading && !s->closing) {
		uv_read_stop(st);
		s->reading = false;
	}
}

/* stream_read_start: reads the bridge's side while there is credit. */
static void stream_read_start(struct bstream *s)
{
	if (s->reading || s->closing || s->eof_out || s->cr.send == 0 || s->v->throttled)
		return;
	if (uv_read_start((uv_stream_t *)&s->pipe, stream_alloc_cb, stream_read_cb) == 0)
		s->reading = true;
}

struct stream_write {
	uv_write_t req;
	struct bstream *s;
	uint32_t len;
	uint8_t data[];
};

/* stream_shutdown_cb: the guest's EOF reached the bridge's side. */
static void stream_shutdown_cb(uv_shutdown_t *req, int status)
{
	struct bstream *s = req->data;

	(void)status;
	free(req);
	if (!s->closing)
		stream_maybe_done(s);
}

/* stream_pass_eof: the guest's EOF goes on once its bytes are written. */
static void stream_pass_eof(struct bstream *s)
{
	uv_shutdown_t *req;

	if (!s->eof_in || s->shut || s->wq > 0 || s->closing)
		return;
	s->shut = true;
	req = malloc(sizeof(*req));
	if (req == NULL) {
		stream_close(s, true);
		return;
	}
	req->data = s;
	if (uv_shutdown(req, (uv_stream_t *)&s->pipe, stream_shutdown_cb) < 0) {
		free(req);
		stream_close(s, true);
	}
}

/* stream_write_cb: bytes from the guest were taken by the bridge's side:
 * their credit goes back (batched; all of it once the pipe drained). */
static void stream_write_cb(uv_write_t *req, int status)
{
	struct stream_write *w = (struct stream_write *)req;
	struct bstream *s = w->s;
	uint32_t grant, len = w->len;

	s->wq -= len;
	free(w);
	if (s->closing)
		return;
	if (status < 0) {
		stream_close(s, true);
		return;
	}
	grant = mux_credit_consumed(&s->cr, len, s->wq == 0);
	if (grant > 0) {
		uint8_t g[4] = { (uint8_t)(grant >> 24), (uint8_t)(grant >> 16),
		                 (uint8_t)(grant >> 8), (uint8_t)grant };

		chan_send(s->v, MUX_CREDIT, s->id, g, 4);
	}
	stream_pass_eof(s);
	stream_maybe_done(s);
}

/* on_data: a DATA frame for s: written to the bridge's side. */
static int on_data(struct bstream *s, const struct mux_frame *f)
{
	struct stream_write *w;
	uv_buf_t b;

	if (s->eof_in || mux_credit_on_data(&s->cr, f->len) < 0)
		return -1;
	w = malloc(sizeof(*w) + f->len);
	if (w == NULL)
		return -1;
	memcpy(w->data, f->payload, f->len);
	w->s = s;
	w->len = f->len;
	b = uv_buf_init((char *)w->data, f->len);
	s->wq += f->len;
	if (uv_write(&w->req, (uv_stream_t *)&s->pipe, &b, 1, stream_write_cb) < 0) {
		s->wq -= f->len;
		free(w);
		stream_close(s, true);
		return 0;
	}
	return 0;
}

/* stream_open: a new stream for the caller, the session being up. */
static void stream_open(struct vmchan *v, vmchan_open_cb cb, void *arg)
{
	struct bstream *s;
	int sp[2];

	if (v->nstreams >= MUX_STREAMS_MAX) {
		cb(arg, -1, REFUSAL_NONE, "too many streams open on the VM's channel");
		return;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp) < 0) {
		free(s);
		cb(arg, -1, REFUSAL_NONE, "no resources for a stream");
		return;
	}
	uv_pipe_init(v->loop, &s->pipe, 0);
	if (uv_pipe_open(&s->pipe, sp[1]) < 0) {
		close(sp[0]);
		close(sp[1]);
		s->closing = true;
		s->pipe.data = s;
		uv_close((uv_handle_t *)&s->pipe, stream_close_cb);
		cb(arg, -1, REFUSAL_NONE, "no resources for a stream");
		return;
	}
	s->v = v;
	s->id = ++v->next_id;
	s->pipe.data = s;
	mux_credit_init(&s->cr);
	s->next = v->streams;
	v->streams = s;
	v->nstreams++;
	chan_send(v, MUX_OPEN, s->id, NULL, 0);
	stream_read_start(s);
	cb(arg, sp[0], REFUSAL_NONE, NULL);
}

/* pending_fail: every waiting open fails with reason and why. */
static void pending_fail(struct vmchan *v, enum refusal reason, const char *why)
{
	struct pending *p;

	while ((p = v->pend) != NULL) {
		v->pend = p->next;
		p->cb(p->arg, -1, reason, why);
		free(p);
	}
}

/* chan_down: the channel ends: its streams and waiting opens fail; the
 * next open connects again (verified in full). */
static void chan_down(struct vmchan *v, enum refusal reason, const char *why)
{
	if (v->state == V_DOWN)
		return;
	log_warn("channel to the VM of %s generation %" PRIu64 " down: %s", v->sbx, v->gen, why);
	v->state = V_DOWN;
	uv_timer_stop(&v->timer);
	while (v->streams != NULL)
		stream_close(v->streams, false);
	if (v->chan != NULL) {
		uv_close((uv_handle_t *)v->chan, handle_free_cb);
		v->chan = NULL;
	}
	v->chan_q = 0;
	v->throttled = false;
	pending_fail(v, reason, why);
}

/* session_up: the guest took this activation: the waiting opens go. */
static void session_up(struct vmchan *v)
{
	struct pending *p;

	v->state = V_UP;
	uv_timer_stop(&v->timer);
	log_info("channel to the VM of %s generation %" PRIu64 " activation %" PRIu32 " up",
	         v->sbx, v->gen, v->att);
	while ((p = v->pend) != NULL && v->state == V_UP) {
		v->pend = p->next;
		stream_open(v, p->cb, p->arg);
		free(p);
	}
}

/* on_frame: one frame from the guest; -1 ends the channel. */
static int on_frame(struct vmchan *v, const struct mux_frame *f, char *why, size_t cap)
{
	struct bstream *s;
	uint32_t n;

	if (v->state == V_SYNCING) {
		if (f->type == MUX_SYNC_OK && !v->sync_ok) {
			v->sync_ok = true;
			return 0;
		}
		if (f->type == MUX_ASSIGN_OK && v->sync_ok) {
			session_up(v);
			return 0;
		}
		snprintf(why, cap, "guest refused the activation: %.*s", (int)(f->len < 64 ? f->len : 64),
		         f->type == MUX_RST ? (const char *)f->payload : "unexpected frame");
		return -1;
	}
	s = f->id != 0 ? stream_find(v, f->id) : NULL;
	switch (f->type) {
	case MUX_DATA:
		if (s == NULL)
			return f->id <= v->next_id ? 0 : -1;
		return on_data(s, f);
	case MUX_CREDIT:
		if (s == NULL)
			return 0;
		n = (uint32_t)f->payload[0] << 24 | (uint32_t)f->payload[1] << 16 |
		    (uint32_t)f->payload[2] << 8 | f->payload[3];
		if (mux_credit_on_grant(&s->cr, n) < 0)
			return -1;
		stream_read_start(s);
		return 0;
	case MUX_EOF:
		if (s != NULL) {
			s->eof_in = true;
			stream_pass_eof(s);
		}
		return 0;
	case MUX_RST:
		if (s != NULL)
			stream_close(s, false);
		return 0;
	default:
		snprintf(why, cap, "unexpected %s from the guest", mux_type_name(f->type));
		return -1;
	}
}

/* chan_alloc_cb: the channel's read buffer. */
static void chan_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct vmchan *v = h->data;

	(void)suggested;
	*buf = uv_buf_init((char *)v->rbuf, sizeof(v->rbuf));
}

/* chan_read_cb: frames from the guest. */
static void chan_read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
	struct vmchan *v = st->data;
	struct tt_err err = { 0 };
	struct mux_frame f;
	size_t at = 0, used;
	char why[160];

	(void)buf;
	if (nread == 0)
		return;
	if (nread < 0) {
		chan_down(v, REFUSAL_NONE, "the VMM closed the channel");
		return;
	}
	while (at < (size_t)nread && v->chan == (uv_pipe_t *)st) {
		int rc = mux_reader_feed(v->rd, v->rbuf + at, (size_t)nread - at, &used, &f, &err);

		at += used;
		if (rc == 0)
			break;
		why[0] = '\0';
		if (rc < 0 || on_frame(v, &f, why, sizeof(why)) < 0) {
			bool refused = v->state == V_SYNCING && rc > 0;

			chan_down(v, refused ? REFUSAL_GUEST_REFUSED : REFUSAL_NONE,
			          rc < 0 ? err.msg : why[0] ? why : "protocol violation");
			return;
		}
	}
}

/* chan_timeout_cb: the guest did not answer the session in time. */
static void chan_timeout_cb(uv_timer_t *t)
{
	chan_down(t->data, REFUSAL_HANDSHAKE_TIMEOUT,
	          "the guest did not answer on the VM's channel within 60 s");
}

/* chan_connected: the peer must be the pinned VMM; then SYNC + ASSIGN. */
static void chan_connected(uv_connect_t *req, int status)
{
	struct vmchan *v = req->data;
	struct tt_err err = { 0 };
	uint8_t assign[MUX_ASSIGN_MAX];
	uv_os_fd_t fd;
	char msg[256];
	int n;

	if (v->state != V_CONNECTING)
		return;
	if (status < 0) {
		snprintf(msg, sizeof(msg), "cannot reach the VM's channel: %s", uv_strerror(status));
		chan_down(v, REFUSAL_NONE, msg);
		return;
	}
	if (uv_fileno((uv_handle_t *)v->chan, &fd) < 0 || verify_peer(fd, v->owner, &err) < 0) {
		snprintf(msg, sizeof(msg), "VM channel peer: %.200s", err.msg);
		chan_down(v, refusal_of(&err), msg);
		return;
	}
	randombytes_buf(v->nonce, sizeof(v->nonce));
	v->sync_ok = false;
	mux_reader_sync(v->rd, MUX_SYNC_OK, v->nonce);
	v->state = V_SYNCING;
	chan_send(v, MUX_SYNC, 0, v->nonce, MUX_NONCE_LEN);
	memcpy(assign, v->secret, HELLO_SECRET_LEN);
	n = snprintf((char *)assign + HELLO_SECRET_LEN, sizeof(assign) - HELLO_SECRET_LEN,
	             "%s%c%" PRIu64 "%c%" PRIu32, v->sbx, 0, v->gen, 0, v->att);
	if (v->state == V_SYNCING)
		chan_send(v, MUX_ASSIGN, 0, assign, (uint32_t)(HELLO_SECRET_LEN + n + 1));
	sodium_memzero(assign, sizeof(assign));
	if (v->state == V_SYNCING)
		uv_read_start((uv_stream_t *)v->chan, chan_alloc_cb, chan_read_cb);
}

/* vmchan_open: see vmchan.h. */
void vmchan_open(struct vmchan *v, const char *path, vmchan_open_cb cb, void *arg)
{
	struct pending *p;
	struct tt_err err = { 0 };
	uv_os_fd_t fd;

	if (v->state == V_UP) {
		/* The channel's peer again, before every stream. */
		if (uv_fileno((uv_handle_t *)v->chan, &fd) == 0 && verify_peer(fd, v->owner, &err) == 0) {
			stream_open(v, cb, arg);
			return;
		}
		chan_down(v, refusal_of(&err), err.msg);
		cb(arg, -1, refusal_of(&err), err.msg[0] ? err.msg : "VM channel peer changed");
		return;
	}
	p = malloc(sizeof(*p));
	if (p == NULL) {
		cb(arg, -1, REFUSAL_NONE, "out of memory");
		return;
	}
	*p = (struct pending){ .cb = cb, .arg = arg, .next = v->pend };
	v->pend = p;
	if (v->state != V_DOWN)
		return;
	v->chan = malloc(sizeof(*v->chan));
	if (v->chan == NULL || uv_pipe_init(v->loop, v->chan, 0) < 0) {
		free(v->chan);
		v->chan = NULL;
		pending_fail(v, REFUSAL_NONE, "out of memory");
		return;
	}
	v->chan->data = v;
	v->state = V_CONNECTING;
	v->next_id = 0;
	v->connect.data = v;
	uv_timer_start(&v->timer, chan_timeout_cb, VMCHAN_SESSION_MS, 0);
	/* resolved within the call: path's fd may go after */
	uv_pipe_connect(&v->connect, v->chan, path, chan_connected);
}

/* vmchan_new: see vmchan.h. */
struct vmchan *vmchan_new(uv_loop_t *loop, const struct proc_identity *owner,
                          const char *sbx, uint64_t gen, uint32_t att,
                          const uint8_t secret[HELLO_SECRET_LEN])
{
	struct vmchan *v = calloc(1, sizeof(*v));

	if (v == NULL || (v->rd = malloc(sizeof(*v->rd))) == NULL) {
		free(v);
		return NULL;
	}
	v->loop = loop;
	v->owner = owner;
	snprintf(v->sbx, sizeof(v->sbx), "%s", sbx);
	v->gen = gen;
	v->att = att;
	memcpy(v->secret, secret, HELLO_SECRET_LEN);
	mux_reader_init(v->rd);
	uv_timer_init(loop, &v->timer);
	v->timer.data = v;
	return v;
}

/* vmchan_free: see vmchan.h (the process exits right after: the timer
 * handle is left to the loop's end). */
void vmchan_free(struct vmchan *v)
{
	if (v == NULL)
		return;
	chan_down(v, REFUSAL_NONE, "bridge exiting");
	sodium_memzero(v->secret, sizeof(v->secret));
}

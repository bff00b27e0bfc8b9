/* The guest's end of the microVM channel (vm.h, lib/mux.h): one
 * virtio-serial port, kept open for the VM's whole life, carrying the
 * host's streams. Each stream is served exactly as a connection to the
 * `ns` agent's unix socket is: a handler process (guest_serve: the HELLO
 * handshake with this activation's secret, then operations in sequence)
 * on one end of a socketpair, whose other end this loop pumps to and from
 * the port under per-stream credit (a stream whose reader stalls holds
 * only its own window, never the port).
 *
 * The host's side may go away at any time (the bridge dropped, the VM
 * paused into a snapshot and resumed on another worker): the port then
 * reports POLLHUP, every stream goes (their handlers see EOF), and the
 * next session starts at the host's SYNC; whatever an earlier session left
 * in the port is skipped by the reader's resynchronisation. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "guest/vm.h"
#include "log.h"
#include "mux.h"

/* The port's output buffer: streams are read only while it holds less
 * than VMCHAN_OUT_READ; the port is read only while it holds less than
 * VMCHAN_OUT_PORT (control answers always fit below VMCHAN_OUT_CAP). */
#define VMCHAN_OUT_CAP (256u * 1024u)
#define VMCHAN_OUT_READ (64u * 1024u)
#define VMCHAN_OUT_PORT (192u * 1024u)
#define VMCHAN_HUP_SLEEP_MS 20

struct gstream {
	uint32_t id;
	int fd;                  /* our end of the handler's socketpair */
	struct mux_credit cr;
	uint8_t *in;             /* from the host, not yet written to fd */
	size_t in_len;
	bool eof_in;             /* the host sent EOF */
	bool shut;               /* ... and we passed it on (SHUT_WR) */
	bool eof_out;            /* we sent EOF */
};

struct vmchan {
	int port;
	int sfd;
	struct guest_ctx *g;
	struct mux_reader rd;
	uint8_t *out;
	size_t out_len;
	bool session, assigned;
	uint32_t last_id;
	struct guest_assignment as;
	struct gstream *st[MUX_STREAMS_MAX];
};

/* out_frame: appends one frame to the port's buffer; -1 when it does not
 * fit (the caller ends the session). */
static int out_frame(struct vmchan *v, uint8_t type, uint32_t id, const void *p, uint32_t len)
{
	if (v->out_len + MUX_HDR_LEN + len > VMCHAN_OUT_CAP)
		return -1;
	mux_hdr_encode(v->out + v->out_len, type, id, len);
	if (len > 0)
		memcpy(v->out + v->out_len + MUX_HDR_LEN, p, len);
	v->out_len += MUX_HDR_LEN + len;
	return 0;
}

/* stream_find: the open stream id, or NULL. */
static struct gstream *stream_find(struct vmchan *v, uint32_t id, size_t *slot)
{
	for (size_t i = 0; i < MUX_STREAMS_MAX; i++)
		if (v->st[i] != NULL && v->st[i]->id == id) {
			if (slot)
				*slot = i;
			return v->st[i];
		}
	return NULL;
}

/* stream_free: closes our end (the handler sees EOF) and forgets it. */
static void stream_free(struct vmchan *v, size_t slot)
{
	struct gstream *s = v->st[slot];

	close(s->fd);
	free(s->in);
	free(s);
	v->st[slot] = NULL;
}

/* stream_rst: the stream goes, and the host is told (when it can be). */
static void stream_rst(struct vmchan *v, size_t slot, const char *why)
{
	uint32_t id = v->st[slot]->id;

	stream_free(v, slot);
	(void)out_frame(v, MUX_RST, id, why, (uint32_t)strlen(why));
}

/* session_reset: every stream goes; the next session starts at a SYNC. */
static void session_reset(struct vmchan *v, const char *why)
{
	size_t n = 0;

	for (size_t i = 0; i < MUX_STREAMS_MAX; i++)
		if (v->st[i] != NULL) {
			stream_free(v, i);
			n++;
		}
	if (v->session)
		log_info("channel session ended (%s): %zu stream(s) closed", why, n);
	v->session = false;
	v->out_len = 0;
	v->last_id = 0;
	mux_reader_sync(&v->rd, MUX_SYNC, NULL);
}

/* handler_start: forks the process serving one stream as a connection:
 * it holds its socketpair end and nothing else of ours. */
static int handler_start(struct vmchan *v, int conn, int other)
{
	struct guest_ctx g = *v->g;
	sigset_t none;
	pid_t pid = fork();

	if (pid != 0)
		return pid < 0 ? -1 : 0;
	close(other);
	close(v->port);
	close(v->sfd);
	for (size_t i = 0; i < MUX_STREAMS_MAX; i++)
		if (v->st[i] != NULL)
			close(v->st[i]->fd);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGCHLD, SIG_DFL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	guest_drop_ptrace();
	g.sbx = v->as.sbx;
	g.gen = v->as.gen;
	g.att = v->as.att;
	g.secret = v->as.secret;
	g.is_init = false; /* streams come from the host only (no socket here) */
	guest_serve(&g, conn);
	_exit(0);
}

/* on_open: a new stream: a handler on a fresh socketpair, or RST. */
static int on_open(struct vmchan *v, uint32_t id)
{
	struct gstream *s;
	size_t slot = MUX_STREAMS_MAX;
	int sp[2];

	if (id <= v->last_id)
		return -1; /* ids only grow within a session */
	v->last_id = id;
	for (size_t i = 0; i < MUX_STREAMS_MAX && slot == MUX_STREAMS_MAX; i++)
		if (v->st[i] == NULL)
			slot = i;
	if (!v->assigned || slot == MUX_STREAMS_MAX)
		return out_frame(v, MUX_RST, id, v->assigned ? "too many streams" : "unassigned",
		                 v->assigned ? 16 : 10);
	s = calloc(1, sizeof(*s));
	if (s != NULL)
		s->in = malloc(MUX_WINDOW);
	if (s == NULL || s->in == NULL ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
		if (s)
			free(s->in);
		free(s);
		return out_frame(v, MUX_RST, id, "no resources", 12);
	}
	if (handler_start(v, sp[1], sp[0]) < 0) {
		close(sp[0]);
		close(sp[1]);
		free(s->in);
		free(s);
		return out_frame(v, MUX_RST, id, "fork failed", 11);
	}
	close(sp[1]);
	(void)fcntl(sp[0], F_SETFL, O_NONBLOCK);
	s->id = id;
	s->fd = sp[0];
	mux_credit_init(&s->cr);
	v->st[slot] = s;
	return 0;
}

/* on_assign: this session's activation; never an older one than the one
 * we serve (a bridge of a retired generation cannot take the VM back). */
static int on_assign(struct vmchan *v, const struct mux_frame *f)
{
	struct guest_assignment a;
	struct tt_err err = { 0 };
	const char *why = NULL;

	if (guest_assignment_parse(f->payload, f->len, &a, &err) < 0)
		why = "malformed assignment";
	else if (v->assigned && strcmp(a.sbx, v->as.sbx) != 0)
		why = "another sandbox";
	else if (v->assigned && (a.gen < v->as.gen || (a.gen == v->as.gen && a.att < v->as.att)))
		why = "older activation";
	if (why != NULL) {
		sodium_memzero(&a, sizeof(a));
		log_warn("assignment refused: %s", why);
		return out_frame(v, MUX_RST, 0, why, (uint32_t)strlen(why));
	}
	if (!v->assigned || a.gen != v->as.gen || a.att != v->as.att)
		log_info("serving %s generation %llu activation %u", a.sbx,
		         (unsigned long long)a.gen, a.att);
	v->as = a;
	sodium_memzero(&a, sizeof(a));
	v->assigned = true;
	return out_frame(v, MUX_ASSIGN_OK, 0, NULL, 0);
}

/* on_frame: one frame from the host; -1: protocol violation. */
static int on_frame(struct vmchan *v, const struct mux_frame *f)
{
	struct gstream *s;
	size_t slot;
	uint32_t n;

	switch (f->type) {
	case MUX_SYNC:
		session_reset(v, "new session");
		v->session = true;
		mux_reader_init(&v->rd);
		return out_frame(v, MUX_SYNC_OK, 0, f->payload, MUX_NONCE_LEN);
	case MUX_ASSIGN:
		return on_assign(v, f);
	case MUX_OPEN:
		return on_open(v, f->id);
	case MUX_DATA:
		s = stream_find(v, f->id, &slot);
		if (s == NULL)
			return f->id <= v->last_id ? 0 : -1; /* raced our RST */
		if (s->eof_in || mux_credit_on_data(&s->cr, f->len) < 0 ||
		    s->in_len + f->len > MUX_WINDOW)
			return -1;
		memcpy(s->in + s->in_len, f->payload, f->len);
		s->in_len += f->len;
		return 0;
	case MUX_CREDIT:
		s = stream_find(v, f->id, NULL);
		n = (uint32_t)f->payload[0] << 24 | (uint32_t)f->payload[1] << 16 |
		    (uint32_t)f->payload[2] << 8 | f->payload[3];
		return s == NULL ? 0 : mux_credit_on_grant(&s->cr, n);
	case MUX_EOF:
		s = stream_find(v, f->id, NULL);
		if (s != NULL)
			s->eof_in = true;
		return 0;
	case MUX_RST:
		if (f->id != 0 && stream_find(v, f->id, &slot) != NULL)
			stream_free(v, slot);
		return 0;
	default:
		return -1; /* SYNC_OK, ASSIGN_OK: the guest's own */
	}
}

/* port_read: frames from the host; -1 on HUP/EOF (the host is gone). */
static int port_read(struct vmchan *v)
{
	uint8_t buf[16384];
	struct tt_err err = { 0 };
	ssize_t n = read(v->port, buf, sizeof(buf));
	size_t at = 0, used;
	struct mux_frame f;

	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
		return -1;
	while (n > 0 && at < (size_t)n) {
		int rc = mux_reader_feed(&v->rd, buf + at, (size_t)n - at, &used, &f, &err);

		at += used;
		if (rc == 1 && on_frame(v, &f) == 0)
			continue;
		if (rc == 0)
			break;
		log_warn("channel: %s: resynchronising", rc < 0 ? err.msg : "protocol violation");
		session_reset(v, "protocol violation");
		err.msg[0] = '\0';
	}
	return 0;
}

/* stream_pump: moves one stream's bytes both ways; frees it when done. */
static void stream_pump(struct vmchan *v, size_t slot, short revents)
{
	struct gstream *s = v->st[slot];
	uint8_t buf[MUX_PAYLOAD_MAX];
	ssize_t n;
	uint32_t grant;

	if ((revents & (POLLOUT | POLLERR | POLLHUP)) && s->in_len > 0) {
		n = write(s->fd, s->in, s->in_len);
		if (n < 0 && errno != EAGAIN && errno != EINTR) {
			stream_rst(v, slot, "handler gone");
			return;
		}
		if (n > 0) {
			memmove(s->in, s->in + n, s->in_len - (size_t)n);
			s->in_len -= (size_t)n;
			grant = mux_credit_consumed(&s->cr, (uint32_t)n, s->in_len == 0);
			if (grant > 0) {
				uint8_t g[4] = { (uint8_t)(grant >> 24), (uint8_t)(grant >> 16),
				                 (uint8_t)(grant >> 8), (uint8_t)grant };

				(void)out_frame(v, MUX_CREDIT, s->id, g, 4);
			}
		}
	}
	if (s->eof_in && s->in_len == 0 && !s->shut) {
		shutdown(s->fd, SHUT_WR);
		s->shut = true;
	}
	if ((revents & (POLLIN | POLLHUP | POLLERR)) && !s->eof_out && s->cr.send > 0 &&
	    v->out_len < VMCHAN_OUT_READ) {
		size_t want = s->cr.send < sizeof(buf) ? s->cr.send : sizeof(buf);

		n = read(s->fd, buf, want);
		if (n > 0) {
			s->cr.send -= (uint32_t)n;
			(void)out_frame(v, MUX_DATA, s->id, buf, (uint32_t)n);
		} else if (n == 0) {
			s->eof_out = true;
			(void)out_frame(v, MUX_EOF, s->id, NULL, 0);
		} else if (errno != EAGAIN && errno != EINTR) {
			stream_rst(v, slot, "read failed");
			return;
		}
	}
	if (s->eof_out && s->shut)
		stream_free(v, slot);
}

/* port_flush: writes what the port takes; -1 when the host is gone. */
static int port_flush(struct vmchan *v)
{
	ssize_t n = write(v->port, v->out, v->out_len);

	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -1;
	memmove(v->out, v->out + n, v->out_len - (size_t)n);
	v->out_len -= (size_t)n;
	return 0;
}

/* sleep_ms: a short pause while the host is away. */
static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* vmchan_serve: see vm.h. */
int vmchan_serve(int port, struct guest_ctx *g)
{
	static struct vmchan vc;
	struct vmchan *v = &vc;
	struct pollfd pf[2 + MUX_STREAMS_MAX];
	size_t map[MUX_STREAMS_MAX];
	sigset_t mask;

	v->port = port;
	v->g = g;
	v->out = malloc(VMCHAN_OUT_CAP);
	if (v->out == NULL)
		return -1;
	sigemptyset(&mask);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	v->sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (v->sfd < 0)
		return -1;
	session_reset(v, "start");
	for (;;) {
		struct signalfd_siginfo si;
		nfds_t n = 2;
		int rc;

		pf[0] = (struct pollfd){ .fd = port, .events = (short)(
			(v->out_len < VMCHAN_OUT_PORT ? POLLIN : 0) | (v->out_len ? POLLOUT : 0)) };
		pf[1] = (struct pollfd){ .fd = v->sfd, .events = POLLIN };
		for (size_t i = 0; i < MUX_STREAMS_MAX; i++) {
			struct gstream *s = v->st[i];

			if (s == NULL)
				continue;
			pf[n] = (struct pollfd){ .fd = s->fd, .events = (short)(
				(s->in_len ? POLLOUT : 0) |
				(!s->eof_out && s->cr.send > 0 && v->out_len < VMCHAN_OUT_READ
				 ? POLLIN : 0)) };
			if (pf[n].events == 0)
				pf[n].fd = -1; /* nothing to do: no HUP to spin on either */
			map[n - 2] = i;
			n++;
		}
		rc = poll(pf, n, -1);
		if (rc < 0 && errno != EINTR)
			return -1;
		while (read(v->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
			;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		if (rc <= 0)
			continue;
		if ((pf[0].revents & POLLHUP) && !(pf[0].revents & POLLIN)) {
			/* No host on the other side (yet, or any more). */
			session_reset(v, "host disconnected");
			sleep_ms(VMCHAN_HUP_SLEEP_MS);
			continue;
		}
		if ((pf[0].revents & POLLIN) && port_read(v) < 0) {
			session_reset(v, "host disconnected");
			sleep_ms(VMCHAN_HUP_SLEEP_MS);
			continue;
		}
		for (nfds_t i = 2; i < n; i++)
			if (v->st[map[i - 2]] != NULL && pf[i].revents)
				stream_pump(v, map[i - 2], pf[i].revents);
		/* Streams whose EOF/credit state changed without an event. */
		for (size_t i = 0; i < MUX_STREAMS_MAX; i++)
			if (v->st[i] != NULL && v->st[i]->eof_in && v->st[i]->in_len == 0 &&
			    !v->st[i]->shut)
				stream_pump(v, i, 0);
		if (v->out_len > 0 && port_flush(v) < 0) {
			session_reset(v, "host disconnected");
			sleep_ms(VMCHAN_HUP_SLEEP_MS);
		}
	}
}

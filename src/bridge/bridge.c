/* tether-bridge: the host bridge, one process per execution, spawned by
 * the sbx-manager. Its own lean binary (libuv, libsodium, jansson and a few
 * lib/ objects): it is exec'd on the create path, where tetherd's 40-odd
 * shared libraries would cost milliseconds.
 *
 * SPEC §5, both hops, every connection verified in full, nothing forwarded
 * before:
 *  - manager -> bridge: the peer must be the manager that spawned us
 *    (verify_peer: SO_PEERCRED + SO_PEERPIDFD, start time, executable, uid
 *    against the identity pinned at start from --manager-pid), or, once
 *    that process has exited, a successor of our uid that proves the
 *    activation's adoption key (adopt.c; lib/hello.h) and is pinned in
 *    its place;
 *  - bridge -> guest: every new connection is verified: verify_listener
 *    (socket file owner + inode, sock_diag UDIAG_SHOW_VFS inside the
 *    sandbox's network namespace, on a netlink socket created there once at
 *    start, the listening inode held by the sandbox
 *    init pinned at start), connect, verify_peer on the connection, then the
 *    handshake of lib/hello.h (per-activation secret from the manager on
 *    --secret-fd, fresh challenge). Only then the REQUEST and the relay.
 * Connections carry operations in sequence: the manager's, and the guest
 * connections, which go back to a small idle pool after a clean end
 * (lib/uvutil.h) so the next operation skips the verification and the
 * guest's fork of a handler. No reconnect: a dropped guest connection
 * fails the operation (ERROR transport); the next operation takes another
 * idle one or opens a new connection, verified again.
 * Started with its execution on the command line, or (what the manager
 * does, src/manager/bridgectl.c) as a spare: --assign-fd only, so its exec,
 * library loading and libsodium are done ahead of the create; it waits
 * (named "bridge-spare") for the activation secret and the execution's
 * options on that pipe, and exits quietly at EOF without them (the
 * manager died or dropped it).
 * Refusals: a specific log line and tether_bridge_refusals_total{reason}
 * (in-process only: the bridge serves no /metrics). Readiness: "ready\n" on
 * --ready-fd once listening. Exits when the sandbox init dies or on
 * SIGTERM. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "bridge/adopt.h"
#include "bridge/args.h"
#include "bridge/drop.h"
#include "bridge/guestsock.h"
#include "bridge/vmchan.h"
#include "claims.h"
#include "cleanup.h"
#include "hello.h"
#include "log.h"
#include "metrics.h"
#include "procid.h"
#include "refusal.h"
#include "relay.h"
#include "sockdiag.h"
#include "unixaddr.h"
#include "uvutil.h"
#include "wire.h"
#include "wire_json.h"

/* Idle guest connections kept, and for how long: each is a handler process
 * in the sandbox (counted by its pids limit). */
#define BRIDGE_POOL_IDLE_MAX 4
#define BRIDGE_POOL_IDLE_MS 30000

struct bridge {
	uv_loop_t *loop;
	struct bridge_args arg;           /* the command line / assignment */
	uint8_t secret[HELLO_SECRET_LEN]; /* memory only; zeroed at exit */
	/* Pinned once at start (pidfd + recheck) and compared on every
	 * connection: the sandbox init that must hold the guest listener,
	 * and the manager that alone may connect to us. */
	struct proc_identity init_id, mgr_id;
	int init_pidfd;
	int mgr_pidfd;                    /* the pinned manager's: has it exited? */
	uid_t mgr_uid;                    /* the first manager's uid: a successor
	                                   * adopting us must have it too */
	/* Proven by a restarted manager to take over once the pinned one has
	 * exited (lib/hello.h, "Adoption"); derived from the secret. */
	uint8_t adopt_key[HELLO_PROOF_LEN];
	int netns_fd;                     /* the init's network namespace */
	/* A sock_diag socket created once inside that namespace (a socket
	 * stays bound to the namespace it was created in): each listener
	 * check is then a plain send/recv, no thread + setns per operation.
	 * -1 after a failed query: replaced on the next operation by the
	 * reserve made beside it (after the privilege drop no new one can be
	 * made in that namespace: setns needs CAP_SYS_ADMIN), else reopened. */
	int diag_nl;
	int diag_reserve;
	/* The guest socket's directory, held from start (guestsock.h). */
	struct guestsock gsock;
	/* Idle guest connections, verified when they were opened. */
	struct uvutil_pool *pool;
	/* --transport vmchan: the microVM's channel (vmchan.h), whose
	 * streams are the guest connections; NULL on a unix transport. */
	struct vmchan *chan;
	uv_pipe_t server;
	struct uvutil_server srv;  /* server.data: the skeleton's hooks */
	uv_poll_t init_poll;
	uv_signal_t sigterm, sigint;
	bool stopping;
};

/* One connection from the manager, serving its operations in sequence; a
 * relay holds both streams while an operation runs. The two read buffers
 * come last: bconn_new clears only what precedes them (they are always
 * filled before being read). */
struct bconn {
	/* First: the server skeleton's part (lib/uvutil.h): served, the
	 * REQUEST decoder, the bytes after the REQUEST (owned). */
	struct uvutil_reqconn rc;
	struct bridge *b;
	uv_pipe_t *conn;          /* owned until the relay */
	uv_pipe_t *guest;         /* owned until the relay */
	uint8_t *req;             /* REQUEST payload copy (owned) */
	uint32_t req_len;
	uv_connect_t connect;
	/* Handshake phase: the challenge sent, the guest's answer being read
	 * into hbuf, and its deadline (heap, freed by its close callback). */
	uint8_t challenge[HELLO_CHALLENGE_LEN];
	struct wire_reader hrd;
	uv_timer_t *htimer;
	uint8_t buf[WIRE_PAYLOAD_MAX + WIRE_HDR_LEN];
	uint8_t hbuf[WIRE_PAYLOAD_MAX + WIRE_HDR_LEN];
};

/* timer_free_cb: the handshake timer is closed: free it. */
static void timer_free_cb(uv_handle_t *h)
{
	free(h);
}

/* htimer_close: stops and releases the handshake deadline, if any. */
static void htimer_close(struct bconn *c)
{
	if (c->htimer == NULL)
		return;
	uv_close((uv_handle_t *)c->htimer, timer_free_cb);
	c->htimer = NULL;
}

/* bconn_free: releases what the operation still owns. */
static void bconn_free(struct bconn *c)
{
	htimer_close(c);
	if (c->conn)
		relay_close_free((uv_stream_t *)c->conn);
	if (c->guest)
		relay_close_free((uv_stream_t *)c->guest);
	free(c->req);
	free(c->rc.pending);
	free(c);
}

/* bconn_fail: ERROR to the manager, then close. */
static void bconn_fail(struct bconn *c, enum wire_code code, const char *msg)
{
	log_warn("operation failed: %s: %s", wirecode_name(code), msg);
	relay_error_close((uv_stream_t *)c->conn, code, msg);
	c->conn = NULL;
	bconn_free(c);
}

/* bconn_refuse: a verification refusal: specific log line, counted by
 * reason, ERROR verify_failed to the manager; nothing was forwarded. */
static void bconn_refuse(struct bconn *c, enum refusal reason, const char *msg)
{
	refusal_count(reason);
	log_warn("refused guest of %s generation %" PRIu64 " activation %" PRIu32
	         " (%s): %s", c->b->arg.sbx, c->b->arg.gen, c->b->arg.att,
	         refusal_name(reason), msg);
	relay_error_close((uv_stream_t *)c->conn, WIRE_E_VERIFY_FAILED, msg);
	c->conn = NULL;
	bconn_free(c);
}

/* bconn_next: the operation ended cleanly: wait for the next REQUEST on
 * the same connection (kept->opener_rd holds a frame the manager began). */
static void bconn_next(struct bconn *c, struct relay_kept *kept)
{
	free(c->req);
	c->req = NULL;
	c->req_len = 0;
	if (uvutil_reqconn_next(&c->rc, kept, &c->conn) < 0)
		bconn_free(c);
}

/* relay_kept: the operation ended; after a clean end the guest connection
 * goes back to the pool and the manager's connection waits for the next
 * REQUEST, else the relay closed both. */
static void relay_kept(struct relay *r, enum relay_end how, const char *msg,
                       struct relay_kept *kept, void *data)
{
	struct bconn *c = data;

	(void)r;
	if (kept == NULL) {
		if (how != RELAY_DONE)
			log_info("operation ended: %s: %s", relay_end_name(how), msg);
		free(c->req);
		free(c->rc.pending);
		free(c);
		return;
	}
	if (kept->far != NULL)
		uvutil_pool_put(c->b->pool, kept->far);
	bconn_next(c, kept);
}

/* forward_and_relay: the guest is verified: send the REQUEST, relay. */
static void forward_and_relay(struct bconn *c)
{
	struct tt_err err = { 0 };
	struct relay *r;

	if (relay_write_frame((uv_stream_t *)c->guest, WIRE_REQUEST, c->req, c->req_len,
	                      &err) < 0) {
		bconn_fail(c, WIRE_E_TRANSPORT, err.msg);
		return;
	}
	r = relay_start_keep((uv_stream_t *)c->conn, (uv_stream_t *)c->guest, c->rc.pending,
	                     c->rc.pending_len, NULL, relay_kept, c, &err);
	if (r == NULL) {
		bconn_fail(c, WIRE_E_INTERNAL, err.msg);
		return;
	}
	c->conn = NULL;
	c->guest = NULL;
}

/* hello_check: judges the guest's first frame. 0 = valid proof; else -1
 * with the refusal reason (metric label) and a message. */
static int hello_check(struct bconn *c, const struct wire_frame *f, enum refusal *reason,
                       char *msg, size_t cap)
{
	const struct bridge *b = c->b;
	uint8_t got[HELLO_PROOF_LEN], want[HELLO_PROOF_LEN];
	struct tt_err err = { 0 };
	json_t *o = wire_frame_json(f, &err);
	const char *code;
	int rc = -1;

	*reason = REFUSAL_HANDSHAKE_MALFORMED;
	if (o == NULL) {
		snprintf(msg, cap, "guest handshake: %.160s", err.msg);
		return -1;
	}
	if (f->type == WIRE_ERROR) {
		/* e.g. wrong_activation: an agent of another execution or
		 * activation behind this socket. */
		code = json_string_value(json_object_get(o, "error"));
		*reason = wirecode_parse(code) == WIRE_E_WRONG_ACTIVATION
		              ? REFUSAL_WRONG_ACTIVATION : REFUSAL_GUEST_REFUSED;
		snprintf(msg, cap, "guest handshake: guest refused: %.64s",
		         code ? code : "?");
	} else if (f->type != WIRE_HELLO) {
		snprintf(msg, cap, "guest handshake: expected HELLO, got %s",
		         wire_type_name(f->type));
	} else if (hello_proof_parse(o, got) < 0) {
		snprintf(msg, cap, "guest handshake: malformed proof");
	} else {
		hello_proof(b->secret, b->arg.sbx, b->arg.gen, b->arg.att, c->challenge, want);
		if (sodium_memcmp(got, want, HELLO_PROOF_LEN) == 0) {
			rc = 0;
		} else {
			*reason = REFUSAL_BAD_PROOF;
			snprintf(msg, cap, "guest handshake: wrong proof for this activation");
		}
		sodium_memzero(want, sizeof(want));
	}
	json_decref(o);
	return rc;
}

/* hello_alloc_cb: the guest's answer lands in the handshake buffer. */
static void hello_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct bconn *c = h->data;

	(void)suggested;
	*buf = uv_buf_init((char *)c->hbuf, sizeof(c->hbuf));
}

/* hello_read_cb: exactly one frame, the HELLO with the proof, and nothing
 * after it (the guest waits for the REQUEST). */
static void hello_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct bconn *c = s->data;
	struct tt_err err = { 0 };
	struct wire_frame f;
	enum refusal reason;
	char msg[200];
	size_t used = 0;
	int rc;

	(void)buf;
	if (nread == 0)
		return;
	if (nread < 0) {
		uv_read_stop(s);
		snprintf(msg, sizeof(msg), "guest handshake: connection closed (%s)",
		         uv_strerror((int)nread));
		bconn_refuse(c, REFUSAL_HANDSHAKE_CLOSED, msg);
		return;
	}
	rc = wire_reader_feed(&c->hrd, c->hbuf, (size_t)nread, &used, &f, &err);
	if (rc == 0)
		return;
	uv_read_stop(s);
	if (rc < 0) {
		snprintf(msg, sizeof(msg), "guest handshake: %.160s", err.msg);
		bconn_refuse(c, REFUSAL_HANDSHAKE_MALFORMED, msg);
		return;
	}
	if ((size_t)nread > used) {
		bconn_refuse(c, REFUSAL_HANDSHAKE_MALFORMED, "guest handshake: bytes after HELLO");
		return;
	}
	if (hello_check(c, &f, &reason, msg, sizeof(msg)) < 0) {
		bconn_refuse(c, reason, msg);
		return;
	}
	htimer_close(c);
	forward_and_relay(c);
}

/* hello_timeout_cb: the guest did not answer the challenge in time. */
static void hello_timeout_cb(uv_timer_t *t)
{
	struct bconn *c = t->data;

	uv_read_stop((uv_stream_t *)c->guest);
	bconn_refuse(c, REFUSAL_HANDSHAKE_TIMEOUT, "guest handshake: no answer within 2 s");
}

/* hello_start: sends the HELLO with a fresh challenge and waits (bounded)
 * for the proof. */
static void hello_start(struct bconn *c)
{
	const struct bridge *b = c->b;
	struct tt_err err = { 0 };
	json_t *hello;
	int rc;

	randombytes_buf(c->challenge, sizeof(c->challenge));
	hello = hello_challenge_json(b->arg.sbx, b->arg.gen, b->arg.att, c->challenge);
	rc = hello ? relay_write_json((uv_stream_t *)c->guest, WIRE_HELLO, hello, &err) : -1;
	json_decref(hello);
	if (rc < 0) {
		bconn_fail(c, WIRE_E_TRANSPORT, hello ? err.msg : "out of memory");
		return;
	}
	c->htimer = malloc(sizeof(*c->htimer));
	if (c->htimer == NULL) {
		bconn_fail(c, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	uv_timer_init(b->loop, c->htimer);
	c->htimer->data = c;
	uv_timer_start(c->htimer, hello_timeout_cb, HELLO_TIMEOUT_MS, 0);
	wire_reader_init(&c->hrd);
	c->guest->data = c;
	uv_read_start((uv_stream_t *)c->guest, hello_alloc_cb, hello_read_cb);
}

/* guest_connected: the connected peer must be the pinned init (SO_PEERCRED
 * of a connection names the process that listened), then the handshake. */
static void guest_connected(uv_connect_t *req, int status)
{
	struct bconn *c = req->data;
	struct tt_err err = { 0 };
	uv_os_fd_t fd;
	char msg[300];

	if (status < 0) {
		snprintf(msg, sizeof(msg), "cannot reach the guest: %s", uv_strerror(status));
		bconn_fail(c, WIRE_E_TRANSPORT, msg);
		return;
	}
	if (uv_fileno((uv_handle_t *)c->guest, &fd) < 0) {
		bconn_fail(c, WIRE_E_INTERNAL, "guest connection has no fd");
		return;
	}
	if (verify_peer(fd, &c->b->init_id, &err) < 0) {
		snprintf(msg, sizeof(msg), "guest peer: %s", err.msg);
		bconn_refuse(c, refusal_of(&err), msg);
		return;
	}
	hello_start(c);
}

static void bridge_stop(struct bridge *b, const char *why);

/* listener_verified: verify_listener on the bridge's sock_diag socket of
 * the sandbox's namespace (opened again if an earlier query broke it), of
 * the socket file file_fd holds: the one the connect then reaches. A
 * failure other than a refusal may leave the socket mid-dump: drop it. */
static int listener_verified(struct bridge *b, int file_fd, struct tt_err *err)
{
	bool stuck = false;
	int rc;

	if (b->diag_nl < 0 && b->diag_reserve >= 0) {
		b->diag_nl = b->diag_reserve;
		b->diag_reserve = -1;
	}
	if (b->diag_nl < 0)
		b->diag_nl = sockdiag_open_in_netns(b->netns_fd, &stuck, err);
	if (stuck) {
		/* Our one thread could not leave the sandbox's namespace:
		 * nothing here may run on in it. */
		log_error("%s", err != NULL ? err->msg : "stuck in the sandbox netns");
		bridge_stop(b, "stuck in the sandbox's network namespace");
		return -1;
	}
	if (b->diag_nl < 0)
		return -1;
	rc = verify_listener_fd_nl(file_fd, b->gsock.via_fd, b->diag_nl, &b->init_id, err);
	if (rc < 0 && (err == NULL || err->code != TT_ERR_VERIFY)) {
		close(b->diag_nl);
		b->diag_nl = -1;
	}
	return rc;
}

/* stream_opened: a stream on the microVM's channel (vmchan.h), its
 * listener and channel peer verified: the handshake runs on it as on a
 * unix connection (its peer is this process: no SO_PEERCRED check). */
static void stream_opened(void *arg, int fd, enum refusal reason, const char *msg)
{
	struct bconn *c = arg;
	char m[300];

	if (fd < 0) {
		snprintf(m, sizeof(m), "guest channel: %.250s", msg ? msg : "failed");
		if (reason == REFUSAL_NONE)
			bconn_fail(c, WIRE_E_TRANSPORT, m);
		else
			bconn_refuse(c, reason, m);
		return;
	}
	if (uv_pipe_open(c->guest, fd) < 0) {
		close(fd);
		bconn_fail(c, WIRE_E_INTERNAL, "cannot use the stream");
		return;
	}
	hello_start(c);
}

/* handle_request: checks the REQUEST and opens the guest connection. */
static void handle_request(struct bconn *c, const struct wire_frame *f)
{
	struct unixaddr ua;
	uv_stream_t *pooled;
	struct tt_err err = { 0 };
	json_t *o = wire_frame_json(f, &err);
	const char *sbx = o ? json_string_value(json_object_get(o, "sbx")) : NULL;
	bool has_op = o && json_is_string(json_object_get(o, "op"));
	/* This bridge serves exactly one sandbox. */
	bool other = sbx != NULL && strcmp(sbx, c->b->arg.sbx) != 0;

	if (!has_op) {
		bconn_fail(c, WIRE_E_BAD_REQUEST, o ? "request without op" : err.msg);
		json_decref(o);
		return;
	}
	json_decref(o);
	if (other) {
		bconn_fail(c, WIRE_E_OTHER_SANDBOX, "this bridge serves another sandbox");
		return;
	}
	c->req = malloc(f->len ? f->len : 1);
	if (c->req == NULL) {
		bconn_fail(c, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	memcpy(c->req, f->payload, f->len);
	c->req_len = f->len;
	/* An idle connection was verified in full when it was opened, and its
	 * peer cannot change while it is open. */
	pooled = uvutil_pool_get(c->b->pool);
	if (pooled != NULL) {
		c->guest = (uv_pipe_t *)pooled;
		forward_and_relay(c);
		return;
	}
	c->guest = malloc(sizeof(*c->guest));
	if (c->guest == NULL || uv_pipe_init(c->b->loop, c->guest, 0) < 0) {
		free(c->guest);
		c->guest = NULL;
		bconn_fail(c, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	/* The listener first: whoever now listens at the path must be the
	 * init's socket, seen from inside the sandbox's network namespace. A
	 * replacement never even gets a connection. The socket file is held
	 * (an O_PATH fd opened in the directory held since start, no symlink
	 * followed) from the check to the connect, which goes through that
	 * fd: it reaches the very file checked, and works whatever the length
	 * of the path (guestsock.h). */
	if (guestsock_file(&c->b->gsock, &ua, &err) < 0) {
		char msg[300];

		snprintf(msg, sizeof(msg), "guest listener: no socket file: %.200s", err.msg);
		bconn_refuse(c, REFUSAL_LISTENER_REPLACED, msg);
		return;
	}
	if (listener_verified(c->b, ua.fd, &err) < 0) {
		char msg[300];

		unixaddr_done(&ua);
		snprintf(msg, sizeof(msg), "guest listener: %s", err.msg);
		bconn_refuse(c, refusal_of(&err), msg);
		return;
	}
	if (c->b->chan != NULL) {
		/* A microVM: a stream on its channel (connected, verified,
		 * when need be, within this call). */
		vmchan_open(c->b->chan, ua.sa.sun_path, stream_opened, c);
		unixaddr_done(&ua);
		return;
	}
	c->connect.data = c;
	/* A unix connect is resolved within the call: the fd may go after. */
	uv_pipe_connect(&c->connect, c->guest, ua.sa.sun_path, guest_connected);
	unixaddr_done(&ua);
}

/* bconn_request: the connection's next REQUEST (server skeleton hook). */
static void bconn_request(struct uvutil_reqconn *rc, const struct wire_frame *f)
{
	handle_request((struct bconn *)rc, f);
}

/* bconn_turn_down: the skeleton turns the connection down (no memory). */
static void bconn_turn_down(struct uvutil_reqconn *rc, enum wire_code code, const char *msg)
{
	bconn_fail((struct bconn *)rc, code, msg);
}

/* bconn_gone: the manager closed the connection or broke the protocol. */
static void bconn_gone(struct uvutil_reqconn *rc, const struct tt_err *err)
{
	(void)err;
	bconn_free((struct bconn *)rc);
}

/* bconn_new: an operation with every field but the read buffers zeroed
 * (clearing 128 KiB per operation showed in profiles). */
static struct bconn *bconn_new(void)
{
	struct bconn *c = malloc(sizeof(*c));

	if (c != NULL)
		memset(c, 0, offsetof(struct bconn, buf));
	return c;
}

/* adopt_accept: a valid adoption proof from peer: if the pinned manager is
 * still gone, pin peer (pidfd + recheck, the manager's uid) as the manager. */
static int adopt_accept(void *data, int conn_fd, pid_t peer, char *msg, size_t cap)
{
	struct bridge *b = data;
	struct proc_identity id;
	struct tt_err err = { 0 };
	int pidfd = -1;

	if (procid_pidfd_alive(b->mgr_pidfd, NULL) != 0) {
		snprintf(msg, cap, "adoption: manager pid %d is not known to have exited",
		         (int)b->mgr_id.pid);
		return -1;
	}
	/* The connection's own peer (SO_PEERPIDFD where the kernel has it,
	 * else pidfd_open + start-time recheck): not whatever process holds
	 * its pid by now. */
	if (peer_identity(conn_fd, &id, &pidfd, NULL, &err) < 0 || id.pid != peer) {
		if (pidfd >= 0)
			close(pidfd);
		snprintf(msg, cap, "adoption: %.160s",
		         err.msg[0] ? err.msg : "the peer changed during the challenge");
		return -1;
	}
	if (id.uid != b->mgr_uid) {
		close(pidfd);
		snprintf(msg, cap, "adoption: pid %d runs as uid %u", (int)peer, (unsigned)id.uid);
		return -1;
	}
	close(b->mgr_pidfd);
	b->mgr_pidfd = pidfd;
	b->mgr_id = id;
	return 0;
}

/* adopt_done: logs and counts how an adoption ended. */
static void adopt_done(void *data, pid_t peer, enum refusal reason, const char *msg)
{
	struct bridge *b = data;

	if (reason == REFUSAL_NONE) {
		log_info("bridge for %s generation %" PRIu64 " adopted by manager pid %d",
		         b->arg.sbx, b->arg.gen, (int)peer);
		return;
	}
	refusal_count(reason);
	log_warn("refused adoption by pid %d (%s): %s", (int)peer, refusal_name(reason), msg);
}

/* may_adopt: the connection on fd may try to adopt us: the pinned manager
 * has exited and the peer runs as its uid (its proof decides). *peer gets
 * its pid. */
static bool may_adopt(struct bridge *b, int fd, pid_t *peer)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (b->mgr_pidfd < 0 || procid_pidfd_alive(b->mgr_pidfd, NULL) != 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid <= 0 ||
	    cred.uid != b->mgr_uid)
		return false;
	*peer = cred.pid;
	return true;
}

/* bridge_peer: only the manager pinned at start (pid, start time,
 * executable, uid); anyone else is refused before a byte is read, except
 * a successor once that manager has exited, which must prove the
 * adoption key first (adopt.c). */
static bool bridge_peer(void *data, uv_pipe_t *p)
{
	struct bridge *b = data;
	struct tt_err err = { 0 };
	uv_os_fd_t fd = -1;
	enum refusal reason;
	pid_t peer = 0;

	if (uv_fileno((uv_handle_t *)p, &fd) == 0 && verify_peer(fd, &b->mgr_id, &err) == 0)
		return true;
	reason = refusal_of(&err);
	if (fd >= 0 && may_adopt(b, fd, &peer)) {
		adopt_start(p, peer, &(struct adopt_spec){
			.loop = b->loop, .sbx = b->arg.sbx, .gen = b->arg.gen,
			.att = b->arg.att, .key = b->adopt_key,
			.accept = adopt_accept, .done = adopt_done, .data = b });
		return false;
	}
	refusal_count(reason);
	log_warn("refused peer (%s): not the manager pid %d: %s", refusal_name(reason),
	         (int)b->mgr_id.pid, err.msg[0] ? err.msg : "no fd");
	relay_close_free((uv_stream_t *)p);
	return false;
}

/* bridge_conn: a connection from the manager, waiting for its REQUEST. */
static struct uvutil_reqconn *bridge_conn(void *data, uv_pipe_t *p)
{
	struct bconn *c = bconn_new();

	if (c == NULL)
		return NULL;
	c->b = data;
	c->conn = p;
	p->data = c;
	c->rc.buf = c->buf;
	c->rc.cap = sizeof(c->buf);
	return &c->rc;
}

/* The manager's connections on the server skeleton (lib/uvutil.h). */
static const struct uvutil_server_ops bridge_server_ops = {
	.peer = bridge_peer,
	.conn = bridge_conn,
	.request = bconn_request,
	.fail = bconn_turn_down,
	.gone = bconn_gone,
};

/* bridge_stop: ends the loop; in-flight operations die with the process
 * (their openers see the connection drop: never a silent retry). */
static void bridge_stop(struct bridge *b, const char *why)
{
	if (b->stopping)
		return;
	b->stopping = true;
	log_info("bridge for %s generation %" PRIu64 " exiting: %s", b->arg.sbx, b->arg.gen, why);
	unlink(b->arg.listen_path);
	uv_stop(b->loop);
}

/* init_exit_cb: the sandbox init is gone: so is this execution. */
static void init_exit_cb(uv_poll_t *p, int status, int events)
{
	struct bridge *b = p->data;

	(void)status;
	(void)events;
	bridge_stop(b, "sandbox init exited");
}

/* on_signal: SIGTERM / SIGINT. */
static void on_signal(uv_signal_t *s, int signum)
{
	(void)signum;
	bridge_stop(s->data, "signal");
}

/* pin_peers: pins the manager and the sandbox init (pidfd + recheck), checks
 * the init is the process the manager recorded (its start time) and opens
 * the init's network namespace, where its listener lives (sock_diag only
 * sees the caller's namespace). */
static int pin_peers(struct bridge *b, struct tt_err *err)
{
	char path[64];
	unsigned long long again = 0;

	if (procid_pin(b->arg.manager_pid, &b->mgr_id, &b->mgr_pidfd, err) < 0)
		return -1;
	if (b->mgr_id.uid != geteuid())
		return tt_err_verify(err, REFUSAL_UID, "manager pid %d runs as uid %u, not ours",
		                  (int)b->arg.manager_pid, (unsigned)b->mgr_id.uid);
	b->mgr_uid = b->mgr_id.uid;
	if (procid_pin(b->arg.init_pid, &b->init_id, &b->init_pidfd, err) < 0)
		return -1;
	if (b->init_id.start_time != b->arg.init_start)
		return tt_err_verify(err, REFUSAL_PID_REUSED, "sandbox init pid %d: pid reused: start "
		                  "time %llu, recorded %llu", (int)b->arg.init_pid,
		                  b->init_id.start_time, b->arg.init_start);
	snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)b->arg.init_pid);
	b->netns_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (b->netns_fd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "open %s", path);
	b->diag_nl = sockdiag_open_in_netns(b->netns_fd, NULL, err);
	if (b->diag_nl < 0)
		return -1; /* stuck or not: we refuse to start */
	b->diag_reserve = sockdiag_open_in_netns(b->netns_fd, NULL, err);
	if (b->diag_reserve < 0)
		return -1;
	if (guestsock_open(&b->gsock, b->arg.guest_socket, err) < 0)
		return -1;
	/* The pid named the pinned init while we opened it: still alive, same
	 * start time. */
	if (procid_pidfd_alive(b->init_pidfd, err) != 1 ||
	    procid_start_time(b->arg.init_pid, &again, NULL) < 0 || again != b->arg.init_start)
		return tt_err_verify(err, REFUSAL_PEER_EXITED, "sandbox init pid %d exited at start",
		                  (int)b->arg.init_pid);
	return 0;
}

/* listen_ready: the manager's socket (0600), the privilege drop (with
 * --run-as), then "ready\n" on the readiness fd so the manager stops
 * waiting (and pins us as we will stay: uid included). */
static int listen_ready(struct bridge *b, struct tt_err *err)
{
	b->srv = (struct uvutil_server){ .loop = b->loop, .ops = &bridge_server_ops,
	                                 .data = b };
	b->server.data = &b->srv;
	if (bridge_listen_as(b->loop, &b->server, b->arg.listen_path, b->arg.run_as,
	                     uvutil_server_accept, err) < 0)
		return -1;
	if (b->arg.ready_fd >= 0) {
		/* 6 bytes into an empty pipe: never blocks, never short. */
		if (write(b->arg.ready_fd, "ready\n", 6) != 6)
			return tt_err_sys(err, TT_ERR_IO, "readiness fd %d", b->arg.ready_fd);
		close(b->arg.ready_fd);
		b->arg.ready_fd = -1;
	}
	return 0;
}

/* main: pin the peers, listen, signal readiness, serve until the init dies. */
int main(int argc, char **argv)
{
	static struct bridge br; /* large; one per process */
	struct bridge *b = &br;
	struct tt_err err = { 0 };

	tt_log_init("bridge", TT_LOG_INFO);
	signal(SIGPIPE, SIG_IGN);
	b->init_pidfd = -1;
	b->mgr_pidfd = -1;
	b->netns_fd = -1;
	b->diag_nl = -1;
	b->diag_reserve = -1;
	b->gsock.dir_fd = -1;
	bridge_args_init(&b->arg);
	if (bridge_args_parse(&b->arg, argc, argv, false) < 0)
		return 1;
	/* The activation secret: not dumpable, so no other process of our
	 * uid can read it from /proc/<pid>/mem. */
	prctl(PR_SET_DUMPABLE, 0);
	if (sodium_init() < 0) {
		log_error("%s", "libsodium failed to initialize");
		return 1;
	}
	if (b->arg.assign_fd >= 0) {
		/* A spare: everything above is done ahead; now wait, named
		 * so in ps/top (every bridge has the same arguments now). */
		int rc;

		prctl(PR_SET_NAME, "bridge-spare");
		rc = bridge_assignment_read(b->arg.assign_fd, &b->arg, b->secret, &err);
		b->arg.assign_fd = -1; /* closed */
		prctl(PR_SET_NAME, "tether-bridge");
		if (rc != 0) {
			if (rc < 0)
				log_error("refusing to start: %s", err.msg);
			return rc < 0;
		}
	} else if (hello_read_secret(b->arg.secret_fd, b->secret, 5000) < 0) {
		log_error("reading the activation secret from fd %d: %s", b->arg.secret_fd,
		          strerror(errno));
		return 1;
	}
	hello_adopt_key(b->secret, b->arg.sbx, b->arg.gen, b->arg.att, b->adopt_key);
	b->loop = uv_default_loop();
	/* NULL when out of memory: every connection is then closed after its
	 * operation, as before pooling. */
	b->pool = uvutil_pool_new(b->loop, BRIDGE_POOL_IDLE_MAX, BRIDGE_POOL_IDLE_MS);
	if (pin_peers(b, &err) < 0) {
		log_error("refusing to start: %s", err.msg);
		goto fail;
	}
	if (b->arg.vmchan) {
		b->chan = vmchan_new(b->loop, &b->init_id, b->arg.sbx, b->arg.gen, b->arg.att,
		                     b->secret);
		if (b->chan == NULL) {
			log_error("%s", "out of memory");
			goto fail;
		}
	}
	if (listen_ready(b, &err) < 0) {
		log_error("%s", err.msg);
		goto fail;
	}
	uv_poll_init(b->loop, &b->init_poll, b->init_pidfd);
	b->init_poll.data = b;
	uv_poll_start(&b->init_poll, UV_READABLE, init_exit_cb);
	uvutil_signals_start(b->loop, &b->sigterm, &b->sigint, on_signal, b);
	log_info("bridge for %s generation %" PRIu64 " activation %" PRIu32
	         " listening on %s (manager pid %d, init pid %d)", b->arg.sbx, b->arg.gen, b->arg.att,
	         b->arg.listen_path, (int)b->mgr_id.pid, (int)b->init_id.pid);
	uv_run(b->loop, UV_RUN_DEFAULT);
	if (!b->stopping)
		bridge_stop(b, "loop ended");
	vmchan_free(b->chan);
	sodium_memzero(b->secret, sizeof(b->secret));
	sodium_memzero(b->adopt_key, sizeof(b->adopt_key));
	/* The process ends here: open handles and in-flight operations go
	 * with it, and their peers see the connections drop. */
	return 0;
fail:
	sodium_memzero(b->secret, sizeof(b->secret));
	sodium_memzero(b->adopt_key, sizeof(b->adopt_key));
	return 1;
}

/* libuv plumbing shared by the two wire-protocol servers on a node: the
 * sbx-manager (src/manager/) and the host bridge (src/bridge/). Both
 * listen on a private Unix socket and serve operations in sequence on each
 * connection, each starting with a REQUEST frame, on one skeleton
 * (uvutil_server_accept); the one pool of idle connections every hop keeps
 * towards the next is here too.
 * Implementation: lib/uvutil.c. */
#ifndef TT_UVUTIL_H
#define TT_UVUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "err.h"
#include "relay.h"
#include "wire.h"
#include "wirecode.h"

/* uvutil_listen: a Unix socket server at path (any length: see
 * unixaddr.h), mode 0600, a stale file replaced; server->data = data,
 * connections go to cb. Closing the server leaves the file: the owner
 * unlinks it. */
int uvutil_listen(uv_loop_t *loop, uv_pipe_t *server, const char *path, int backlog,
                  uv_connection_cb cb, void *data, struct tt_err *err);
/* uvutil_pipe_connect: uv_pipe_connect to the socket at path, of any
 * length (unixaddr_dir); every error arrives in cb, as with libuv's. */
void uvutil_pipe_connect(uv_connect_t *req, uv_pipe_t *pipe, const char *path,
                         uv_connect_cb cb);
/* uvutil_accept: the next connection as a heap uv_pipe_t, or NULL. The
 * caller owns it (release with relay_close_free). */
uv_pipe_t *uvutil_accept(uv_stream_t *server, uv_loop_t *loop);
/* uvutil_signals_start: SIGTERM and SIGINT go to cb, with data. */
void uvutil_signals_start(uv_loop_t *loop, uv_signal_t *term, uv_signal_t *intr,
                          uv_signal_cb cb, void *data);

enum uvutil_req {
	UVUTIL_REQ_MORE = 0,     /* no whole frame yet: keep reading */
	UVUTIL_REQ_READY = 1,    /* *f is the REQUEST */
	UVUTIL_REQ_CLOSED = -1,  /* the peer closed or failed first */
	UVUTIL_REQ_BAD = -2,     /* not a frame, or not a REQUEST (err says) */
	UVUTIL_REQ_NOMEM = -3,   /* no memory for the bytes after it */
};
/* uvutil_read_request: feeds one read (buf, nread as libuv passed them)
 * of a connection waiting for a REQUEST. For its first operation
 * (served == 0) the REQUEST must be the first frame; after that, DATA_IN /
 * EOF_IN before it are input the previous operation did not take, and are
 * dropped. On READY, bytes read after the frame are copied to *pending
 * (heap, the caller owns it; untouched when there are none). Reading is
 * stopped on anything but MORE. */
enum uvutil_req uvutil_read_request(uv_stream_t *s, uint64_t served,
                                    struct wire_reader *rd, const uint8_t *buf,
                                    ssize_t nread, struct wire_frame *f,
                                    uint8_t **pending, size_t *pending_len,
                                    struct tt_err *err);

/* The server skeleton of the sbx-manager (node-api's connections) and the
 * host bridge (the manager's): an accept loop with a peer check hook, then
 * per connection the read of one REQUEST at a time (uvutil_read_request)
 * handed to the role. The role's connection struct begins with a struct
 * uvutil_reqconn, so its stream's data points to both. */
struct uvutil_reqconn;
struct uvutil_server_ops {
	/* peer: true to serve the accepted p; false when the hook refused it
	 * (and closed it) or took it over (the bridge's adoption). */
	bool (*peer)(void *data, uv_pipe_t *p);
	/* conn: the role's connection around p (p->data = it, its reqconn's
	 * buf and cap set); NULL when out of memory (p is closed). */
	struct uvutil_reqconn *(*conn)(void *data, uv_pipe_t *p);
	/* request: the REQUEST f of the connection's next operation (reading
	 * is stopped; pending holds what came after it). */
	void (*request)(struct uvutil_reqconn *rc, const struct wire_frame *f);
	/* fail: turn the connection down with an ERROR (no memory). */
	void (*fail)(struct uvutil_reqconn *rc, enum wire_code code, const char *msg);
	/* gone: the peer closed or failed (err NULL) or broke the protocol
	 * (err says how; logged already): free it. */
	void (*gone)(struct uvutil_reqconn *rc, const struct tt_err *err);
};
struct uvutil_reqconn {
	const struct uvutil_server_ops *ops;
	uint64_t served;          /* operations done on this connection */
	struct wire_reader rd;
	uint8_t *pending;         /* bytes read after the REQUEST (owned) */
	size_t pending_len;
	uint8_t *buf;             /* the role's read buffer */
	size_t cap;
};
/* A listener's data: the hooks and what they get. */
struct uvutil_server {
	uv_loop_t *loop;
	const struct uvutil_server_ops *ops;
	void *data;
};
/* uvutil_server_accept: the connection callback of a listener whose data
 * is a struct uvutil_server. */
void uvutil_server_accept(uv_stream_t *server, int status);
/* uvutil_reqconn_next: the operation ended cleanly (relay keep mode): the
 * opener's stream kept->opener (*conn) waits for its next REQUEST, with
 * the bytes the relay had begun; -1 when it cannot read (the caller frees
 * the connection, *conn included). */
int uvutil_reqconn_next(struct uvutil_reqconn *rc, struct relay_kept *kept,
                        uv_pipe_t **conn);

/* A bounded set of idle, verified connections towards one next hop, the
 * one pool of every hop: node-api -> manager (lib/wireconn), manager ->
 * bridge and bridge -> guest (lib/relay keep mode). What goes in is decided
 * by one rule (struct relay_judge, relay.h). An idle connection is read:
 * any byte or EOF from it (the far side may send nothing between
 * operations) closes it, as does its idle deadline. Idle connections are
 * unreferenced: they never keep uv_run going on their own. */
struct uvutil_pool;
/* uvutil_pool_new: at most max_idle connections, each kept idle_ms. */
struct uvutil_pool *uvutil_pool_new(uv_loop_t *loop, unsigned max_idle,
                                    uint64_t idle_ms);
/* uvutil_pool_put: takes s (a heap uv_pipe_t, reading stopped, nothing
 * queued); closes it instead when the pool is full or p is NULL. */
void uvutil_pool_put(struct uvutil_pool *p, uv_stream_t *s);
/* uvutil_pool_get: the most recently idle connection (reading stopped,
 * data NULL; the caller owns it), or NULL. */
uv_stream_t *uvutil_pool_get(struct uvutil_pool *p);
/* uvutil_pool_size: idle connections held now. */
unsigned uvutil_pool_size(const struct uvutil_pool *p);
/* uvutil_pool_free: closes every idle connection and takes no more; p
 * may be NULL. The memory goes now, or with the last hold. */
void uvutil_pool_free(struct uvutil_pool *p);
/* uvutil_pool_hold / uvutil_pool_release: a connection in use that may
 * come back keeps its pool alive (p may be NULL; hold returns p). */
struct uvutil_pool *uvutil_pool_hold(struct uvutil_pool *p);
void uvutil_pool_release(struct uvutil_pool *p);

#endif

/* Async client of the sbx-manager socket (protocol.md "node-api <->
 * sbx-manager"): lib/wire.h frames on the node-api's libuv loop.
 * Implementation: src/node/mgrconn.c.
 *
 * Operations run in sequence on a connection (notes/seq.md): a connection
 * whose operation ended cleanly (DECISION allow, then RESULT or ERROR as the
 * last bytes received, no write failure) goes back to a small idle pool per
 * loop + socket path when the user calls mgrconn_close, and the next
 * mgrconn_open takes it instead of connecting. Anything else is closed as
 * before. Control calls (op "status" / "feed.apply") always get their own
 * connection and are never pooled. No transparent retry: an operation sent
 * on a pooled connection that turns out dead ends with on_end (transport). */
#ifndef TT_NODE_MGRCONN_H
#define TT_NODE_MGRCONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "err.h"
#include "decision.h"
#include "wire.h"

struct mgrconn;

struct mgrconn_cbs {
	/* on_frame: one complete frame from the manager (payload valid only
	 * during the call). The callee may call mgrconn_close from here. */
	void (*on_frame)(void *arg, const struct wire_frame *f);
	/* on_end: the connection failed or the manager closed it. err->code is
	 * TT_ERR_IO when the connect itself failed (manager not reachable),
	 * TT_ERR_TRANSPORT / TT_ERR_MALFORMED afterwards. Not called after
	 * mgrconn_close. */
	void (*on_end)(void *arg, const struct tt_err *err);
	/* on_drain: the write queue fell below MGRCONN_LOW_WATER (may be NULL). */
	void (*on_drain)(void *arg);
};

#define MGRCONN_HIGH_WATER (1u << 20) /* pause the producer above this */
#define MGRCONN_LOW_WATER (256u << 10)

/* mgrconn_open: connects to path and sends req as the REQUEST frame once
 * connected (req is not stolen). Returns NULL + err only when req cannot be
 * encoded or memory runs out; connect errors arrive via on_end.
 * Owner: the caller, until mgrconn_close. */
struct mgrconn *mgrconn_open(uv_loop_t *loop, const char *path, json_t *req,
                             const struct mgrconn_cbs *cbs, void *arg,
                             struct tt_err *err);
/* mgrconn_send: queues one frame (payload copied; len <= WIRE_PAYLOAD_MAX). */
int mgrconn_send(struct mgrconn *c, uint8_t type, const void *payload,
                 size_t len, struct tt_err *err);
/* mgrconn_send_data: queues bytes as as many frames of type as needed. */
int mgrconn_send_data(struct mgrconn *c, uint8_t type, const void *data,
                      size_t len, struct tt_err *err);
/* mgrconn_queued: bytes written but not yet taken by the kernel. */
size_t mgrconn_queued(const struct mgrconn *c);
/* mgrconn_pause / mgrconn_resume: stop and restart delivering frames
 * (backpressure towards the manager). */
void mgrconn_pause(struct mgrconn *c);
void mgrconn_resume(struct mgrconn *c);
/* mgrconn_close: no further callbacks; c must not be used again (a clean
 * connection may already serve the next operation; otherwise the memory
 * goes when libuv has closed the handles). May be called from on_frame.
 * NULL is accepted. */
void mgrconn_close(struct mgrconn *c);

#define MGRCONN_POOL_MAX 4            /* idle connections per loop + path */
#define MGRCONN_IDLE_MS (30u * 1000u) /* an idle connection is closed after */

/* mgrconn_pool_idle: idle connections kept for loop + path (tests, stats). */
size_t mgrconn_pool_idle(uv_loop_t *loop, const char *path);
/* mgrconn_pool_shutdown: closes the idle connections of loop and stops
 * pooling on it (connections still in use are closed when released); call
 * it before uv_loop_close. Idle connections are unreferenced, so they never
 * keep uv_run alive on their own. */
void mgrconn_pool_shutdown(uv_loop_t *loop);
/* mgrconn_pool_set_idle_ms: the idle timeout for connections pooled from
 * now on (default MGRCONN_IDLE_MS; tests shorten it). */
void mgrconn_pool_set_idle_ms(uint64_t ms);
/* mgrconn_decision: parses the manager's DECISION frame (JSON_REJECT_
 * DUPLICATES), counts it in tether_node_admission_total{decision,reason}
 * and returns the object (caller decrefs) with *verdict set; NULL when the
 * frame is not a decision (a protocol error: answer "transport"). */
json_t *mgrconn_decision(const struct wire_frame *f, enum tt_verdict *verdict);


/* A whole control call (status, feed.apply): request -> the final RESULT
 * object (or an error). result is owned by the callee (decref it). */
typedef void (*mgrconn_call_fn)(void *arg, json_t *result,
                                const struct tt_err *err);
int mgrconn_call(uv_loop_t *loop, const char *path, json_t *req,
                 mgrconn_call_fn done, void *arg, struct tt_err *err);

#endif

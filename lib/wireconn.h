/* An opener's connection to the next hop on a libuv loop, for a process
 * that is itself the end of the path (node-api towards its sbx-manager):
 * one REQUEST, then the frames of that operation both ways, with
 * backpressure. Implementation: lib/wireconn.c.
 *
 * Operations run in sequence on a connection (docs/ARCHITECTURE.md,
 * "Connections"). The connections come from a struct uvutil_pool (the one
 * pool of every hop, lib/uvutil.h): wireconn_open takes an idle one when
 * there is one, else connects; wireconn_close hands the stream back to the
 * pool after a clean end (the one reuse rule, struct relay_judge in
 * lib/relay.h) and closes it otherwise. Control requests (lib/wireop.h)
 * never use the pool: the far side closes after them. No transparent
 * retry: an operation sent on a pooled connection that turns out dead ends
 * with on_end (transport). */
#ifndef TT_WIRECONN_H
#define TT_WIRECONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "err.h"
#include "uvutil.h"
#include "wire.h"

struct wireconn;

struct wireconn_cbs {
	/* on_frame: one complete frame from the far side (payload valid only
	 * during the call). The callee may call wireconn_close from here. */
	void (*on_frame)(void *arg, const struct wire_frame *f);
	/* on_end: the connection failed or the far side closed it. err->code
	 * is TT_ERR_IO when the connect itself failed (not reachable),
	 * TT_ERR_TRANSPORT / TT_ERR_MALFORMED afterwards. Not called after
	 * wireconn_close. */
	void (*on_end)(void *arg, const struct tt_err *err);
	/* on_drain: the write queue fell below WIRECONN_LOW_WATER (may be
	 * NULL). */
	void (*on_drain)(void *arg);
};

#define WIRECONN_HIGH_WATER (1u << 20) /* pause the producer above this */
#define WIRECONN_LOW_WATER (256u << 10)

/* wireconn_open: sends req (not stolen) as the REQUEST on an idle
 * connection of pool, else on a new connection to path once connected.
 * pool may be NULL (never pooled). Returns NULL + err only when req cannot
 * be encoded or memory runs out; connect errors arrive via on_end. Owner:
 * the caller, until wireconn_close. */
struct wireconn *wireconn_open(uv_loop_t *loop, struct uvutil_pool *pool,
                               const char *path, json_t *req,
                               const struct wireconn_cbs *cbs, void *arg,
                               struct tt_err *err);
/* wireconn_reused: c was taken from the pool (for metrics). */
bool wireconn_reused(const struct wireconn *c);
/* wireconn_send: queues one frame (payload copied; len <=
 * WIRE_PAYLOAD_MAX). */
int wireconn_send(struct wireconn *c, uint8_t type, const void *payload,
                  size_t len, struct tt_err *err);
/* wireconn_send_data: queues bytes as as many frames of type as needed. */
int wireconn_send_data(struct wireconn *c, uint8_t type, const void *data,
                       size_t len, struct tt_err *err);
/* wireconn_queued: bytes written but not yet taken by the kernel. */
size_t wireconn_queued(const struct wireconn *c);
/* wireconn_pause / wireconn_resume: stop and restart delivering frames
 * (backpressure towards the far side). */
void wireconn_pause(struct wireconn *c);
void wireconn_resume(struct wireconn *c);
/* wireconn_close: no further callbacks; c must not be used again (a clean
 * connection goes back to its pool at once; otherwise the memory goes when
 * libuv has closed the handle). May be called from on_frame. NULL is
 * accepted. */
void wireconn_close(struct wireconn *c);

#endif

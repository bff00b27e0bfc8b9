/* A wire-frame relay between two connected libuv streams, used by the
 * sbx-manager (node-api <-> bridge) and the host bridge (manager <-> guest).
 *
 * The "opener" side started the operation; the "far" side answers it. Each
 * direction is parsed with a struct wire_reader (bounded) and frames are
 * re-encoded before they are forwarded, so a peer can never push bytes that
 * are not a well-formed frame. Opener -> far carries only DATA_IN / EOF_IN;
 * far -> opener carries DATA_OUT / STDERR and ends with RESULT or ERROR.
 * Anything else is a protocol violation: both sides are closed and the
 * opener gets an ERROR when it is still there.
 *
 * Backpressure: a side stops being read while the other side's write queue
 * holds more than RELAY_HIGH_WATER bytes, and resumes below RELAY_LOW_WATER.
 * The relay ends when the RESULT/ERROR has been written to the opener, when
 * either side goes away (the opener then gets ERROR {"error":"transport"}:
 * never a silent retry), or on relay_abort. The done callback runs once,
 * after both streams were closed and freed.
 *
 * Keep mode (relay_start_keep): connections carry operations in sequence
 * (docs/ARCHITECTURE.md, "Connections"). After a clean end (RELAY_DONE:
 * the far side's RESULT/ERROR written to the opener) the opener stream is
 * handed back, with its decoder state, to read the next REQUEST; the far
 * stream too when it is clean: nothing after its RESULT/ERROR, no partial
 * frame, no write to it still queued. Every other end closes both, as
 * relay_start does. Implementation: lib/relay.c. */
#ifndef TT_RELAY_H
#define TT_RELAY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "err.h"
#include "wire.h"
#include "wirecode.h"

#define RELAY_HIGH_WATER (256u * 1024u)
#define RELAY_LOW_WATER (64u * 1024u)

enum relay_end {
	RELAY_DONE = 0,    /* RESULT or ERROR delivered to the opener */
	RELAY_FAR_GONE,    /* far side closed or failed first; opener told */
	RELAY_OPENER_GONE, /* opener closed or failed; far side dropped */
	RELAY_MALFORMED,   /* a side broke the frame protocol */
	RELAY_ABORTED,     /* relay_abort (e.g. epoch lease cancelled) */
};

struct relay;

/* how: why it ended; msg: one line for the log. */
typedef void (*relay_done_fn)(struct relay *r, enum relay_end how,
                              const char *msg, void *data);

/* relay_start: takes ownership of both streams (heap-allocated uv_pipe_t /
 * uv_tcp_t, freed with free() after uv_close) and starts relaying. pending
 * holds bytes already read from the opener after its REQUEST (copied).
 * Writes queued on the streams before the call keep their order. Returns
 * NULL (streams still the caller's) only when out of memory. */
struct relay *relay_start(uv_stream_t *opener, uv_stream_t *far,
                          const uint8_t *pending, size_t pending_len,
                          relay_done_fn done, void *data, struct tt_err *err);
/* What a keep-mode relay hands back after a clean end. Reading is stopped
 * on both streams and nothing is queued on them; the receiver owns all
 * three and must set each stream's data before using it. */
struct relay_kept {
	uv_stream_t *opener;
	/* bytes of a frame the opener already began (input the finished
	 * operation did not take): give it to relay_kept_reader */
	struct wire_reader *opener_rd;
	uv_stream_t *far;              /* NULL: not reusable, the relay closed it */
};
/* kept: non-NULL only when how == RELAY_DONE; the callee takes what it
 * holds. */
typedef void (*relay_keep_fn)(struct relay *r, enum relay_end how,
                              const char *msg, struct relay_kept *kept,
                              void *data);
/* relay_kept_reader: moves kept->opener_rd's decoder state into rd (the
 * reader of the opener's next REQUEST) and frees it. */
void relay_kept_reader(struct relay_kept *kept, struct wire_reader *rd);
/* relay_start_keep: relay_start in keep mode; keep runs once instead of a
 * done callback: synchronously at a clean end, else after both streams
 * were closed. first (or NULL): a frame for the opener that goes out with
 * the far side's first answer (or the relay's own ERROR), in one write,
 * e.g. the DECISION of an operation whose opener waits for the answer
 * anyway: it then wakes once, not twice. */
struct relay *relay_start_keep(uv_stream_t *opener, uv_stream_t *far,
                               const uint8_t *pending, size_t pending_len,
                               const struct wire_out *first,
                               relay_keep_fn keep, void *data,
                               struct tt_err *err);
/* relay_abort: stops both directions at once, sends the opener ERROR
 * {"error":code,"message":message}, then ends (RELAY_ABORTED). */
void relay_abort(struct relay *r, enum wire_code code, const char *message);
/* relay_end_name: "done", "far_gone", ... for logs. */
const char *relay_end_name(enum relay_end how);

/* The reuse rule, one for every hop (docs/ARCHITECTURE.md,
 * "Connections"): an opener's connection to the far side goes back to its
 * pool only after a clean end: the far side's RESULT/ERROR was the last
 * thing it sent (no byte or partial frame after it), it was not an ERROR
 * its sender closes after, no DECISION other than allow came before it,
 * and no write to it is still queued. Anything else (an abort, a protocol
 * violation, a write error: relay_judge_taint) closes it. Used by the relay
 * for its far side and by lib/wireconn for node-api's connections. */
struct relay_judge {
	bool ended;       /* the far side's RESULT/ERROR arrived */
	bool dirty;       /* something ruled reuse out */
	unsigned writes;  /* writes to the far side not yet completed */
};
/* relay_judge_frame: one frame from the far side. */
void relay_judge_frame(struct relay_judge *j, const struct wire_frame *f);
/* relay_judge_taint: the connection is unfit for reuse. */
void relay_judge_taint(struct relay_judge *j);
/* relay_judge_clean: the operation ended cleanly and rd (the far side's
 * decoder) holds no part of a frame. */
bool relay_judge_clean(const struct relay_judge *j, const struct wire_reader *rd);

/* Helpers for the phases before a relay starts. Each write owns a copy of
 * its bytes and needs nothing else alive (the stream aside). */
/* relay_write_frame: queues one frame on s. */
int relay_write_frame(uv_stream_t *s, uint8_t type, const void *payload,
                      uint32_t len, struct tt_err *err);
/* relay_write_json: queues obj (compact) as one frame (does not steal). */
int relay_write_json(uv_stream_t *s, uint8_t type, json_t *obj,
                     struct tt_err *err);
/* relay_write_error: queues ERROR {"error":code,"message":message}. */
int relay_write_error(uv_stream_t *s, enum wire_code code, const char *message);
/* relay_close_free: uv_close + free() of a heap-allocated stream; pending
 * writes are flushed or cancelled by libuv first. */
void relay_close_free(uv_stream_t *s);
/* relay_close_after_writes: closes s once what was queued so far was
 * written (for "send DECISION, then close"). */
void relay_close_after_writes(uv_stream_t *s);
/* relay_error_close: relay_write_error, then relay_close_after_writes (the
 * usual way to turn an operation down before a relay starts). */
void relay_error_close(uv_stream_t *s, enum wire_code code, const char *message);

#endif

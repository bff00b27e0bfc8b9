/* Frame relay between two libuv streams (see relay.h). */
#include "relay.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "decision.h"
#include "wire.h"
#include "wire_json.h"

enum { SIDE_OPENER = 0, SIDE_FAR = 1 };

#define RELAY_READ_CHUNK (64u * 1024u)

struct relay_side {
	struct relay *r;
	uv_stream_t *s;           /* owned by the relay from relay_start on */
	struct wire_reader *rd;   /* owned; decodes what this side sends */
	bool bp_paused;           /* reading stopped for backpressure */
	uint8_t buf[RELAY_READ_CHUNK];
};

struct relay {
	struct relay_side side[2];
	relay_done_fn done;
	relay_keep_fn keep;       /* keep mode: instead of done */
	void *data;
	struct relay_judge far;   /* may the far connection be reused */
	bool have_kept;           /* kept: handed back once the far side closed */
	struct relay_kept kept;
	/* Frames decoded from one read, gathered per destination and written
	 * with one write, so the next hop wakes once for them (owned; NULL
	 * when empty). */
	struct relay_wreq *batch[2];
	size_t batch_cap[2];
	bool finishing;           /* last frame queued or ending: read no more */
	bool ending;              /* handles are being closed */
	int open_handles;
	enum relay_end how;
	char msg[200];
};

/* One queued write: owns its bytes. r is NULL for standalone writes. */
struct relay_wreq {
	uv_write_t req;
	struct relay *r;
	int dst;                  /* side index written to */
	bool final;               /* ends the relay once written */
	enum relay_end how;
	uv_buf_t buf;
	uint8_t bytes[];
};

/* Spare relays and readers, kept instead of freed: each relay is ~130 KiB
 * and each reader 64 KiB, and freeing them after every operation let
 * malloc hand the heap top back to the kernel, so the next operation
 * faulted fresh pages in again (3 page faults per operation in the bridge).
 * A process uses relays from its one loop thread, so no lock. */
#define RELAY_SPARES 4
static struct relay *spare_relays[RELAY_SPARES];
static struct wire_reader *spare_readers[2 * RELAY_SPARES];
static size_t n_spare_relays, n_spare_readers;

/* reader_get: a reset reader, from the spares when there is one. */
static struct wire_reader *reader_get(void)
{
	struct wire_reader *rd = n_spare_readers > 0 ? spare_readers[--n_spare_readers]
	                                             : malloc(sizeof(*rd));

	if (rd != NULL)
		wire_reader_init(rd);
	return rd;
}

/* reader_put: keeps rd as a spare, or frees it; NULL is fine. */
static void reader_put(struct wire_reader *rd)
{
	if (rd == NULL)
		return;
	if (n_spare_readers < 2 * RELAY_SPARES)
		spare_readers[n_spare_readers++] = rd;
	else
		free(rd);
}

static void relay_end(struct relay *r, enum relay_end how, const char *msg);
static void side_resume(struct relay_side *sd);
static void finish_with_error(struct relay *r, enum relay_end how,
                              enum wire_code code, const char *message);

/* relay_end_name: stable names for logs. */
const char *relay_end_name(enum relay_end how)
{
	switch (how) {
	case RELAY_DONE: return "done";
	case RELAY_FAR_GONE: return "far_gone";
	case RELAY_OPENER_GONE: return "opener_gone";
	case RELAY_MALFORMED: return "malformed";
	case RELAY_ABORTED: return "aborted";
	}
	return "unknown";
}

/* wreq_new: one allocation holding header + payload. */
static struct relay_wreq *wreq_new(uint8_t type, const void *payload, uint32_t len)
{
	struct relay_wreq *w = malloc(sizeof(*w) + WIRE_HDR_LEN + len);

	if (w == NULL)
		return NULL;
	memset(w, 0, sizeof(*w));
	wire_hdr_encode(w->bytes, type, len);
	if (len > 0)
		memcpy(w->bytes + WIRE_HDR_LEN, payload, len);
	w->buf = uv_buf_init((char *)w->bytes, WIRE_HDR_LEN + len);
	return w;
}

/* standalone_write_cb: frees a helper write; nothing else to do. */
static void standalone_write_cb(uv_write_t *req, int status)
{
	(void)status;
	free(req);
}

/* relay_write_frame: queues one self-contained frame write. */
int relay_write_frame(uv_stream_t *s, uint8_t type, const void *payload,
                      uint32_t len, struct tt_err *err)
{
	struct relay_wreq *w;
	int rc;

	if (len > WIRE_PAYLOAD_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "frame of %u bytes", len);
	w = wreq_new(type, payload, len);
	if (w == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	rc = uv_write(&w->req, s, &w->buf, 1, standalone_write_cb);
	if (rc < 0) {
		free(w);
		return tt_err_set(err, TT_ERR_TRANSPORT, "write: %s", uv_strerror(rc));
	}
	return 0;
}

/* relay_write_json: serializes and queues obj. */
int relay_write_json(uv_stream_t *s, uint8_t type, json_t *obj, struct tt_err *err)
{
	char *text = json_dumps(obj, JSON_COMPACT);
	int rc;

	if (text == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "cannot serialize JSON");
	rc = relay_write_frame(s, type, text, (uint32_t)strlen(text), err);
	free(text);
	return rc;
}

/* error_json: {"error":code,"message":message}; caller decrefs. */
static json_t *error_json(enum wire_code code, const char *message)
{
	return json_pack("{s:s,s:s}", "error", wirecode_name(code), "message", message);
}

/* closing_error_json: the same, for an ERROR the connection's end follows
 * (see wire_error_closing): the receiver does not pool the connection. */
static json_t *closing_error_json(enum wire_code code, const char *message)
{
	return json_pack("{s:s,s:s,s:b}", "error", wirecode_name(code), "message", message, "closing", 1);
}

/* relay_write_error: queues an ERROR frame. */
int relay_write_error(uv_stream_t *s, enum wire_code code, const char *message)
{
	json_t *o = error_json(code, message);
	int rc;

	if (o == NULL)
		return -1;
	rc = relay_write_json(s, WIRE_ERROR, o, NULL);
	json_decref(o);
	return rc;
}

/* close_free_cb: the stream was heap-allocated by its owner. */
static void close_free_cb(uv_handle_t *h)
{
	free(h);
}

/* relay_close_free: closes and frees a stream not owned by a relay. */
void relay_close_free(uv_stream_t *s)
{
	if (!uv_is_closing((uv_handle_t *)s))
		uv_close((uv_handle_t *)s, close_free_cb);
}

/* shutdown_cb: the queued writes went out (or failed): close now. */
static void shutdown_cb(uv_shutdown_t *req, int status)
{
	(void)status;
	relay_close_free(req->handle);
	free(req);
}

/* relay_close_after_writes: shutdown (flushes the queue), then close. */
void relay_close_after_writes(uv_stream_t *s)
{
	uv_shutdown_t *req = malloc(sizeof(*req));

	if (req == NULL || uv_shutdown(req, s, shutdown_cb) < 0) {
		free(req);
		relay_close_free(s);
	}
}

/* relay_error_close: the ERROR is queued before the shutdown, so it goes
 * out first. */
void relay_error_close(uv_stream_t *s, enum wire_code code, const char *message)
{
	json_t *o = closing_error_json(code, message);

	if (o != NULL)
		relay_write_json(s, WIRE_ERROR, o, NULL);
	json_decref(o);
	relay_close_after_writes(s);
}

/* relay_write_cb: frees the write, releases backpressure, and ends the
 * relay after a final frame. */
static void relay_write_cb(uv_write_t *req, int status)
{
	struct relay_wreq *w = (struct relay_wreq *)req;
	struct relay *r = w->r;
	bool final = w->final;
	enum relay_end how = w->how;
	int dst = w->dst;
	struct relay_side *src = &r->side[1 - dst];

	free(w);
	if (dst == SIDE_FAR)
		r->far.writes--;
	if (r->ending)
		return;
	if (status < 0) {
		if (dst == SIDE_OPENER)
			relay_end(r, RELAY_OPENER_GONE, uv_strerror(status));
		else
			finish_with_error(r, RELAY_FAR_GONE, WIRE_E_TRANSPORT,
			                  "the far side stopped reading");
		return;
	}
	if (final) {
		relay_end(r, how, r->msg[0] ? r->msg : relay_end_name(how));
		return;
	}
	/* The other side was paused because this queue was long. */
	if (src->bp_paused &&
	    uv_stream_get_write_queue_size(r->side[dst].s) <= RELAY_LOW_WATER)
		side_resume(src);
}

/* batch_flush: writes what was gathered for dst in one write; final: the
 * relay ends once it is written. Applies backpressure on the other side
 * when dst's queue is long. */
static int batch_flush(struct relay *r, int dst, bool final, enum relay_end how)
{
	struct relay_wreq *w = r->batch[dst];
	struct relay_side *src = &r->side[1 - dst];

	if (w == NULL)
		return 0;
	r->batch[dst] = NULL;
	w->r = r;
	w->dst = dst;
	w->final = final;
	w->how = how;
	if (uv_write(&w->req, r->side[dst].s, &w->buf, 1, relay_write_cb) < 0) {
		free(w);
		return -1;
	}
	if (dst == SIDE_FAR)
		r->far.writes++;
	if (!final && !src->bp_paused &&
	    uv_stream_get_write_queue_size(r->side[dst].s) > RELAY_HIGH_WATER) {
		uv_read_stop(src->s);
		src->bp_paused = true;
	}
	return 0;
}

/* side_write: adds a frame for side dst to its batch; a final frame is
 * written at once with what precedes it, the rest when the read that
 * produced them is done (side_feed). */
static int side_write(struct relay *r, int dst, uint8_t type, const void *payload,
                      uint32_t len, bool final, enum relay_end how)
{
	struct relay_wreq *w = r->batch[dst];
	size_t used = w != NULL ? w->buf.len : 0;
	size_t need = used + WIRE_HDR_LEN + len;

	if (w == NULL || need > r->batch_cap[dst]) {
		/* A new batch starts at what it needs (at least 4 KiB); a
		 * growing one doubles. */
		size_t cap = w == NULL ? (need > 4096 ? need : 4096) :
		             (need > 2 * r->batch_cap[dst] ? need : 2 * r->batch_cap[dst]);
		struct relay_wreq *grown = realloc(w, sizeof(*w) + cap);

		if (grown == NULL)
			return -1;
		if (w == NULL)
			memset(grown, 0, sizeof(*grown));
		w = grown;
		r->batch[dst] = w;
		r->batch_cap[dst] = cap;
	}
	wire_hdr_encode(w->bytes + used, type, len);
	if (len > 0)
		memcpy(w->bytes + used + WIRE_HDR_LEN, payload, len);
	w->buf = uv_buf_init((char *)w->bytes, (unsigned)need);
	return final ? batch_flush(r, dst, true, how) : 0;
}

/* finish_with_error: stops reading and sends the opener a last ERROR; the
 * relay ends when it is written (or at once if it cannot be queued). */
static void finish_with_error(struct relay *r, enum relay_end how,
                              enum wire_code code, const char *message)
{
	json_t *o;
	char *text = NULL;

	if (r->finishing || r->ending)
		return;
	r->finishing = true;
	snprintf(r->msg, sizeof(r->msg), "%s", message);
	uv_read_stop(r->side[SIDE_OPENER].s);
	uv_read_stop(r->side[SIDE_FAR].s);
	o = closing_error_json(code, message); /* the relay ends: both close */
	if (o != NULL)
		text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (text == NULL || side_write(r, SIDE_OPENER, WIRE_ERROR, text,
	                               (uint32_t)strlen(text), true, how) < 0)
		relay_end(r, how, message);
	free(text);
}

/* handle_frame: forwards one decoded frame from side src, or ends the relay
 * on a frame that may not travel in that direction. */
static void handle_frame(struct relay *r, int src, const struct wire_frame *f)
{
	char msg[96];

	if (src == SIDE_OPENER) {
		if (f->type != WIRE_DATA_IN && f->type != WIRE_EOF_IN) {
			snprintf(msg, sizeof(msg), "unexpected %s frame from the opener",
			         wire_type_name(f->type));
			finish_with_error(r, RELAY_MALFORMED, WIRE_E_BAD_REQUEST, msg);
			return;
		}
		if (side_write(r, SIDE_FAR, f->type, f->payload, f->len, false, RELAY_DONE) < 0)
			finish_with_error(r, RELAY_FAR_GONE, WIRE_E_TRANSPORT, "cannot forward input");
		return;
	}
	switch (f->type) {
	case WIRE_META: /* e.g. fs.read's size, ahead of the bytes */
	case WIRE_DATA_OUT:
	case WIRE_STDERR:
		if (side_write(r, SIDE_OPENER, f->type, f->payload, f->len, false,
		               RELAY_DONE) < 0)
			relay_end(r, RELAY_OPENER_GONE, "cannot write to the opener");
		return;
	case WIRE_RESULT:
	case WIRE_ERROR:
		/* An ERROR its sender closes after: the operation ended
		 * cleanly, the far connection did not (relay_judge_frame). */
		relay_judge_frame(&r->far, f);
		r->finishing = true;
		uv_read_stop(r->side[SIDE_OPENER].s);
		uv_read_stop(r->side[SIDE_FAR].s);
		if (side_write(r, SIDE_OPENER, f->type, f->payload, f->len, true,
		               RELAY_DONE) < 0)
			relay_end(r, RELAY_OPENER_GONE, "cannot write to the opener");
		return;
	default:
		snprintf(msg, sizeof(msg), "unexpected %s frame from the far side",
		         wire_type_name(f->type));
		finish_with_error(r, RELAY_MALFORMED, WIRE_E_TRANSPORT, msg);
	}
}

/* side_feed: decodes bytes from side src and handles every complete frame. */
static void side_feed(struct relay *r, int src, const uint8_t *data, size_t len)
{
	struct relay_side *sd = &r->side[src];

	while (len > 0 && !r->finishing && !r->ending) {
		struct wire_frame f;
		struct tt_err err = { 0 };
		size_t used = 0;
		int rc = wire_reader_feed(sd->rd, data, len, &used, &f, &err);

		if (rc < 0) {
			char msg[300];

			snprintf(msg, sizeof(msg), "%s sent a bad frame: %s",
			         src == SIDE_OPENER ? "opener" : "far side", err.msg);
			finish_with_error(r, RELAY_MALFORMED,
			                  src == SIDE_OPENER ? WIRE_E_BAD_REQUEST : WIRE_E_TRANSPORT, msg);
			return;
		}
		data += used;
		len -= used;
		if (rc == 1)
			handle_frame(r, src, &f);
	}
	/* The far side sent more after its RESULT/ERROR: it breaks the
	 * sequence, so its connection is not reused. */
	if (src == SIDE_FAR && len > 0)
		relay_judge_taint(&r->far);
	if (r->ending)
		return;
	if (batch_flush(r, 1 - src, false, RELAY_DONE) < 0) {
		if (src == SIDE_OPENER)
			finish_with_error(r, RELAY_FAR_GONE, WIRE_E_TRANSPORT, "cannot forward input");
		else
			relay_end(r, RELAY_OPENER_GONE, "cannot write to the opener");
	}
}

/* relay_alloc_cb: each side reads into its own buffer (frames are copied
 * out before the next read). */
static void relay_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct relay_side *sd = h->data;

	(void)suggested;
	*buf = uv_buf_init((char *)sd->buf, sizeof(sd->buf));
}

/* relay_read_cb: bytes, EOF or an error from one side. */
static void relay_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct relay_side *sd = s->data;
	struct relay *r = sd->r;
	int src = sd == &r->side[SIDE_OPENER] ? SIDE_OPENER : SIDE_FAR;

	(void)buf;
	if (nread > 0) {
		side_feed(r, src, sd->buf, (size_t)nread);
		return;
	}
	if (nread == 0)
		return;
	if (src == SIDE_FAR)
		finish_with_error(r, RELAY_FAR_GONE, WIRE_E_TRANSPORT,
		                  nread == UV_EOF ? "the far side closed before the result"
		                                  : uv_strerror((int)nread));
	else
		relay_end(r, RELAY_OPENER_GONE,
		          nread == UV_EOF ? "the opener closed" : uv_strerror((int)nread));
}

/* side_resume: restarts reading a side paused for backpressure. */
static void side_resume(struct relay_side *sd)
{
	sd->bp_paused = false;
	if (!sd->r->finishing && !sd->r->ending)
		uv_read_start(sd->s, relay_alloc_cb, relay_read_cb);
}

/* relay_finish: reports the end once and frees the relay; kept is what
 * a keep-mode relay hands back (NULL: everything was closed). */
static void relay_finish(struct relay *r, struct relay_kept *kept)
{
	reader_put(r->side[0].rd);
	reader_put(r->side[1].rd);
	free(r->batch[0]);
	free(r->batch[1]);
	if (r->keep)
		r->keep(r, r->how, r->msg, kept, r->data);
	else if (r->done)
		r->done(r, r->how, r->msg, r->data);
	if (n_spare_relays < RELAY_SPARES)
		spare_relays[n_spare_relays++] = r;
	else
		free(r);
}

/* relay_close_cb: frees a stream; the last one completes the relay. */
static void relay_close_cb(uv_handle_t *h)
{
	struct relay *r = ((struct relay_side *)h->data)->r;

	free(h);
	if (--r->open_handles > 0)
		return;
	relay_finish(r, r->have_kept ? &r->kept : NULL);
}

/* decision_frame_allows: f is a DECISION whose verdict is allow. */
static bool decision_frame_allows(const struct wire_frame *f)
{
	json_t *o = wire_frame_json(f, NULL);
	const char *d = json_string_value(json_object_get(o, "decision"));
	bool allow = d != NULL && strcmp(d, decision_verdict_name(TT_ALLOW)) == 0;

	json_decref(o);
	return allow;
}

/* relay_judge_frame: see relay.h. */
void relay_judge_frame(struct relay_judge *j, const struct wire_frame *f)
{
	if (j->ended) {
		j->dirty = true; /* the far side sends nothing after the end */
		return;
	}
	if (f->type == WIRE_DECISION && !decision_frame_allows(f))
		j->dirty = true; /* the manager closes after a refusal */
	if (f->type == WIRE_RESULT || f->type == WIRE_ERROR) {
		j->ended = true;
		if (wire_error_closing(f))
			j->dirty = true;
	}
}

/* relay_judge_taint: see relay.h. */
void relay_judge_taint(struct relay_judge *j)
{
	j->dirty = true;
}

/* relay_judge_clean: see relay.h. */
bool relay_judge_clean(const struct relay_judge *j, const struct wire_reader *rd)
{
	return j->ended && !j->dirty && j->writes == 0 && rd->hdr_have == 0 &&
	       rd->have == 0;
}

/* relay_kept_reader: copies the 64 KiB reader only when it holds part of a
 * frame (rare: input the operation did not take). */
void relay_kept_reader(struct relay_kept *kept, struct wire_reader *rd)
{
	if (kept->opener_rd->hdr_have > 0)
		memcpy(rd, kept->opener_rd, sizeof(*rd));
	else
		wire_reader_init(rd);
	reader_put(kept->opener_rd);
	kept->opener_rd = NULL;
}

/* relay_end_keep: a clean end in keep mode: hands the opener (and a clean
 * far side) back instead of closing them. */
static void relay_end_keep(struct relay *r)
{
	struct relay_kept kept = { .opener = r->side[SIDE_OPENER].s,
	                           .opener_rd = r->side[SIDE_OPENER].rd };

	r->side[SIDE_OPENER].rd = NULL;
	uv_read_stop(r->side[SIDE_OPENER].s);
	uv_read_stop(r->side[SIDE_FAR].s);
	if (relay_judge_clean(&r->far, r->side[SIDE_FAR].rd)) {
		kept.far = r->side[SIDE_FAR].s;
		relay_finish(r, &kept);
		return;
	}
	/* The far stream closes first; the opener goes back once it did. */
	r->kept = kept;
	r->have_kept = true;
	r->open_handles = 1;
	uv_close((uv_handle_t *)r->side[SIDE_FAR].s, relay_close_cb);
}

/* relay_end: closes both streams (cancelling queued writes); the done
 * callback follows from the close callbacks. */
static void relay_end(struct relay *r, enum relay_end how, const char *msg)
{
	if (r->ending)
		return;
	r->ending = true;
	r->finishing = true;
	r->how = how;
	if (msg != r->msg)
		snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : "");
	if (r->keep != NULL && how == RELAY_DONE) {
		relay_end_keep(r);
		return;
	}
	for (int i = 0; i < 2; i++) {
		uv_read_stop(r->side[i].s);
		uv_close((uv_handle_t *)r->side[i].s, relay_close_cb);
	}
}

/* relay_abort: cancels the operation and tells the opener why. */
void relay_abort(struct relay *r, enum wire_code code, const char *message)
{
	finish_with_error(r, RELAY_ABORTED, code, message);
}

/* relay_alloc: a relay with every field zeroed except the two 64 KiB read
 * buffers, which libuv fills before anything reads them: clearing 128 KiB
 * per operation showed in profiles of the request path. */
static struct relay *relay_alloc(void)
{
	struct relay *r = n_spare_relays > 0 ? spare_relays[--n_spare_relays]
	                                     : malloc(sizeof(*r));

	if (r == NULL)
		return NULL;
	for (int i = 0; i < 2; i++)
		memset(&r->side[i], 0, offsetof(struct relay_side, buf));
	memset((char *)r + offsetof(struct relay, done), 0,
	       sizeof(*r) - offsetof(struct relay, done));
	return r;
}

static struct relay *relay_begin(uv_stream_t *opener, uv_stream_t *far,
                                 const uint8_t *pending, size_t pending_len,
                                 const struct wire_out *first,
                                 relay_done_fn done, relay_keep_fn keep,
                                 void *data, struct tt_err *err);

/* relay_start: wires both sides and begins reading. */
struct relay *relay_start(uv_stream_t *opener, uv_stream_t *far,
                          const uint8_t *pending, size_t pending_len,
                          relay_done_fn done, void *data, struct tt_err *err)
{
	return relay_begin(opener, far, pending, pending_len, NULL, done, NULL, data, err);
}

/* relay_start_keep: the same, handing clean connections back. */
struct relay *relay_start_keep(uv_stream_t *opener, uv_stream_t *far,
                               const uint8_t *pending, size_t pending_len,
                               const struct wire_out *first,
                               relay_keep_fn keep, void *data,
                               struct tt_err *err)
{
	return relay_begin(opener, far, pending, pending_len, first, NULL, keep, data,
	                   err);
}

/* relay_begin: wires both sides and begins reading. */
static struct relay *relay_begin(uv_stream_t *opener, uv_stream_t *far,
                                 const uint8_t *pending, size_t pending_len,
                                 const struct wire_out *first,
                                 relay_done_fn done, relay_keep_fn keep,
                                 void *data, struct tt_err *err)
{
	struct relay *r = relay_alloc();
	uv_stream_t *streams[2] = { opener, far };

	if (r == NULL)
		goto nomem;
	r->done = done;
	r->keep = keep;
	r->data = data;
	r->open_handles = 2;
	for (int i = 0; i < 2; i++) {
		r->side[i].r = r;
		r->side[i].s = streams[i];
		r->side[i].rd = reader_get();
		if (r->side[i].rd == NULL)
			goto nomem;
	}
	/* Held in the opener's batch until the far side's first answer. */
	if (first != NULL &&
	    side_write(r, SIDE_OPENER, first->type, first->payload, first->len, false,
	               RELAY_DONE) < 0)
		goto nomem;
	for (int i = 0; i < 2; i++) {
		streams[i]->data = &r->side[i];
		uv_read_stop(streams[i]);
		uv_read_start(streams[i], relay_alloc_cb, relay_read_cb);
	}
	if (pending_len > 0)
		side_feed(r, SIDE_OPENER, pending, pending_len);
	return r;
nomem:
	if (r != NULL) {
		reader_put(r->side[0].rd);
		reader_put(r->side[1].rd);
		free(r->batch[SIDE_OPENER]);
		free(r);
	}
	tt_err_set(err, TT_ERR_NOMEM, "relay: out of memory");
	return NULL;
}

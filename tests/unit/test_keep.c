/* Sequential operations on one connection: lib/relay's keep mode, the
 * next-REQUEST reader and the idle pool of lib/uvutil, on a real libuv
 * loop over real socketpairs (the test's ends are plain sockets). */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cmocka.h>

#include "relay.h"
#include "uvutil.h"
#include "wire.h"

static uint8_t rbuf[WIRE_PAYLOAD_MAX + 1];
static struct wire_reader next_rd;

struct harness {
	uv_loop_t loop;
	int a0, b0;               /* test ends: opener peer, far peer */
	uv_pipe_t *a1, *b1;       /* relay ends */
	uv_timer_t timer;
	const char *late_far;     /* frames (raw bytes) the far peer sends late */
	size_t late_len;
	bool called, kept_seen, far_kept;
	enum relay_end how;
	size_t opener_partial;    /* hdr_have of the handed-back reader */
	uv_stream_t *kept_opener, *kept_far;
	const struct wire_out *first; /* relay_start_keep's first frame */
};

/* pair: a socketpair, one end wrapped in a heap uv_pipe_t. */
static void pair(uv_loop_t *loop, int *test_end, uv_pipe_t **loop_end)
{
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	*test_end = sv[0];
	*loop_end = malloc(sizeof(**loop_end));
	assert_non_null(*loop_end);
	assert_int_equal(uv_pipe_init(loop, *loop_end, 0), 0);
	assert_int_equal(uv_pipe_open(*loop_end, sv[1]), 0);
}

/* frame_bytes: one encoded frame into out; returns its length. */
static size_t frame_bytes(uint8_t *out, uint8_t type, const char *payload)
{
	size_t len = strlen(payload);

	wire_hdr_encode(out, type, (uint32_t)len);
	memcpy(out + WIRE_HDR_LEN, payload, len);
	return WIRE_HDR_LEN + len;
}

/* expect_frame: the next frame on fd is of type; its payload (in rbuf). */
static const char *expect_frame(int fd, uint8_t type)
{
	struct wire_frame f;

	assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL), 1);
	assert_int_equal(f.type, type);
	return (const char *)f.payload;
}

/* kept_cb: records what the relay handed back, then closes it all. */
static void kept_cb(struct relay *r, enum relay_end how, const char *msg,
                    struct relay_kept *kept, void *data)
{
	struct harness *h = data;

	(void)r;
	(void)msg;
	h->called = true;
	h->how = how;
	if (!uv_is_closing((uv_handle_t *)&h->timer))
		uv_close((uv_handle_t *)&h->timer, NULL);
	if (kept == NULL)
		return;
	h->kept_seen = true;
	h->far_kept = kept->far != NULL;
	h->opener_partial = kept->opener_rd->hdr_have;
	/* The next reader continues exactly where the relay's stopped. */
	relay_kept_reader(kept, &next_rd);
	assert_null(kept->opener_rd);
	assert_int_equal(next_rd.hdr_have, h->opener_partial);
	/* The handed-back opener still works: a frame goes out on it. */
	assert_int_equal(relay_write_frame(kept->opener, WIRE_RESULT, "{\"next\":1}", 10,
	                                   NULL), 0);
	h->kept_opener = kept->opener;
	h->kept_far = kept->far;
}

/* late_cb: the far peer answers only now (after the opener's bytes were
 * read), then the kept streams are closed once their writes went out. */
static void late_cb(uv_timer_t *t)
{
	struct harness *h = t->data;

	assert_int_equal(write(h->b0, h->late_far, h->late_len), (ssize_t)h->late_len);
}

/* h_run: relay in keep mode; the far peer sends late_far after 30 ms. */
static void h_run(struct harness *h, const char *late_far, size_t late_len)
{
	h->late_far = late_far;
	h->late_len = late_len;
	uv_timer_init(&h->loop, &h->timer);
	h->timer.data = h;
	uv_timer_start(&h->timer, late_cb, 30, 0);
	assert_non_null(relay_start_keep((uv_stream_t *)h->a1, (uv_stream_t *)h->b1,
	                                 NULL, 0, h->first, kept_cb, h, NULL));
	while (!h->called)
		uv_run(&h->loop, UV_RUN_ONCE);
	/* Let the write on the kept opener go out, then close what was kept. */
	uv_run(&h->loop, UV_RUN_NOWAIT);
	if (h->kept_opener != NULL)
		relay_close_after_writes(h->kept_opener);
	if (h->kept_far != NULL)
		relay_close_free(h->kept_far);
	uv_run(&h->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&h->loop), 0);
}

/* h_init: a loop and both socketpairs. */
static void h_init(struct harness *h)
{
	memset(h, 0, sizeof(*h));
	assert_int_equal(uv_loop_init(&h->loop), 0);
	pair(&h->loop, &h->a0, &h->a1);
	pair(&h->loop, &h->b0, &h->b1);
}

/* test_keep_clean: RESULT as the far side's last frame: both streams come
 * back, the opener's is still usable, the far peer sees no close. */
static void test_keep_clean(void **state)
{
	struct harness h;
	uint8_t far[256];
	size_t n;

	(void)state;
	h_init(&h);
	n = frame_bytes(far, WIRE_DATA_OUT, "out");
	n += frame_bytes(far + n, WIRE_RESULT, "{\"exit_code\":0}");
	h_run(&h, (const char *)far, n);
	assert_true(h.kept_seen);
	assert_int_equal(h.how, RELAY_DONE);
	assert_true(h.far_kept);
	assert_int_equal(h.opener_partial, 0);
	assert_string_equal(expect_frame(h.a0, WIRE_DATA_OUT), "out");
	assert_string_equal(expect_frame(h.a0, WIRE_RESULT), "{\"exit_code\":0}");
	/* The frame written on the handed-back opener. */
	assert_string_equal(expect_frame(h.a0, WIRE_RESULT), "{\"next\":1}");
	close(h.a0);
	close(h.b0);
}

/* test_keep_first: the frame given at start reaches the opener with the
 * far side's answer, in one write (one read on the opener's end), and
 * before it; also when the relay's own ERROR is the answer. */
static void test_keep_first(void **state)
{
	static const struct wire_out decision = { WIRE_DECISION, "{\"decision\":\"allow\"}", 21 };
	struct harness h;
	uint8_t far[256], got[512];
	size_t n;
	ssize_t r;

	(void)state;
	h_init(&h);
	h.first = &decision;
	n = frame_bytes(far, WIRE_DATA_OUT, "out");
	n += frame_bytes(far + n, WIRE_RESULT, "{}");
	h_run(&h, (const char *)far, n);
	assert_true(h.kept_seen);
	/* DECISION + DATA_OUT + RESULT + the kept opener's own frame: the
	 * first three in one write, so one read has them all. */
	r = read(h.a0, got, sizeof(got));
	assert_true(r >= (ssize_t)(3 * WIRE_HDR_LEN + 21 + 3 + 2));
	assert_int_equal(got[5], WIRE_DECISION);
	assert_int_equal(got[WIRE_HDR_LEN + 21 + 5], WIRE_DATA_OUT);
	close(h.a0);
	close(h.b0);

	/* The far side goes away: DECISION, then the relay's ERROR. */
	h_init(&h);
	h.first = &decision;
	shutdown(h.b0, SHUT_WR);
	h_run(&h, "", 0);
	assert_false(h.kept_seen);
	assert_string_equal(expect_frame(h.a0, WIRE_DECISION), "{\"decision\":\"allow\"}");
	assert_non_null(strstr(expect_frame(h.a0, WIRE_ERROR), "transport"));
	close(h.a0);
	close(h.b0);
}

/* test_keep_far_trailing: bytes after the far side's RESULT: that
 * connection breaks the sequence and is closed, the opener still comes
 * back. */
static void test_keep_far_trailing(void **state)
{
	struct harness h;
	uint8_t far[256];
	size_t n;

	(void)state;
	h_init(&h);
	n = frame_bytes(far, WIRE_RESULT, "{}");
	n += frame_bytes(far + n, WIRE_DATA_OUT, "late");
	h_run(&h, (const char *)far, n);
	assert_true(h.kept_seen);
	assert_false(h.far_kept);
	assert_string_equal(expect_frame(h.a0, WIRE_RESULT), "{}");
	close(h.a0);
	close(h.b0);
}

/* test_keep_opener_partial: the opener had begun another frame (input the
 * operation never took): its decoder state is handed back with it. */
static void test_keep_opener_partial(void **state)
{
	struct harness h;
	uint8_t in[64], far[64];
	size_t n, f;

	(void)state;
	h_init(&h);
	n = frame_bytes(in, WIRE_DATA_IN, "0123456789");
	assert_int_equal(write(h.a0, in, n - 4), (ssize_t)(n - 4));
	f = frame_bytes(far, WIRE_ERROR, "{\"error\":\"not_found\"}");
	h_run(&h, (const char *)far, f);
	assert_true(h.kept_seen);
	assert_true(h.far_kept);
	assert_int_equal(h.opener_partial, WIRE_HDR_LEN);
	close(h.a0);
	close(h.b0);
}

/* test_keep_far_gone: the far side closes before its RESULT: nothing is
 * kept, the opener gets ERROR transport. */
static void test_keep_far_gone(void **state)
{
	struct harness h;

	(void)state;
	h_init(&h);
	shutdown(h.b0, SHUT_WR);
	h_run(&h, "", 0);
	assert_true(h.called);
	assert_false(h.kept_seen);
	assert_int_equal(h.how, RELAY_FAR_GONE);
	assert_non_null(strstr(expect_frame(h.a0, WIRE_ERROR), "transport"));
	close(h.a0);
	close(h.b0);
}

/* feed: one uvutil_read_request step over bytes; next: a later operation. */
static enum uvutil_req feed(bool next, const uint8_t *bytes, size_t n,
                            struct wire_reader *rd, struct wire_frame *f,
                            uint8_t **pending, size_t *pending_len)
{
	uv_loop_t loop;
	uv_pipe_t *p;
	int fd;
	struct tt_err err = { 0 };
	enum uvutil_req rc;

	assert_int_equal(uv_loop_init(&loop), 0);
	pair(&loop, &fd, &p);
	rc = uvutil_read_request((uv_stream_t *)p, next ? 1 : 0, rd, bytes, (ssize_t)n, f,
	                         pending, pending_len, &err);
	relay_close_free((uv_stream_t *)p);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
	close(fd);
	return rc;
}

/* test_next_request: stray input before a later REQUEST is dropped; the
 * first REQUEST of a connection admits no such thing, and nothing but
 * input may come before a REQUEST. */
static void test_next_request(void **state)
{
	static struct wire_reader rd;
	uint8_t b[256];
	struct wire_frame f;
	uint8_t *pending = NULL;
	size_t n, pending_len = 0;

	(void)state;
	n = frame_bytes(b, WIRE_DATA_IN, "stale stdin");
	n += frame_bytes(b + n, WIRE_EOF_IN, "");
	n += frame_bytes(b + n, WIRE_REQUEST, "{\"op\":\"fs.read\"}");
	n += frame_bytes(b + n, WIRE_DATA_IN, "x");
	wire_reader_init(&rd);
	assert_int_equal(feed(true, b, n, &rd, &f, &pending, &pending_len),
	                 UVUTIL_REQ_READY);
	assert_int_equal(f.type, WIRE_REQUEST);
	assert_int_equal(pending_len, WIRE_HDR_LEN + 1);
	free(pending);
	pending = NULL;
	pending_len = 0;
	/* Only stray input so far: keep reading. */
	wire_reader_init(&rd);
	assert_int_equal(feed(true, b, WIRE_HDR_LEN + 11, &rd, &f, &pending,
	                      &pending_len), UVUTIL_REQ_MORE);
	/* The first REQUEST of a connection: input before it is a violation. */
	wire_reader_init(&rd);
	assert_int_equal(feed(false, b, n, &rd, &f, &pending, &pending_len),
	                 UVUTIL_REQ_BAD);
	/* A RESULT (or a second HELLO) where a REQUEST belongs. */
	n = frame_bytes(b, WIRE_RESULT, "{}");
	wire_reader_init(&rd);
	assert_int_equal(feed(true, b, n, &rd, &f, &pending, &pending_len),
	                 UVUTIL_REQ_BAD);
	n = frame_bytes(b, WIRE_HELLO, "{}");
	wire_reader_init(&rd);
	assert_int_equal(feed(true, b, n, &rd, &f, &pending, &pending_len),
	                 UVUTIL_REQ_BAD);
	assert_null(pending);
}

/* peer_closed: the test end of a pooled connection saw EOF. */
static bool peer_closed(int fd)
{
	char c;

	return read(fd, &c, 1) == 0;
}

/* tick_noop: nothing; the timer only keeps the loop alive. */
static void tick_noop(uv_timer_t *t)
{
	(void)t;
}

/* test_pool: get returns what was put (newest first); a peer that sends a
 * byte or closes is dropped; the pool is bounded; idle ones expire. */
static void test_pool(void **state)
{
	uv_loop_t loop;
	uv_timer_t tick;
	struct uvutil_pool *p;
	uv_pipe_t *s[6];
	int fd[6];

	(void)state;
	assert_int_equal(uv_loop_init(&loop), 0);
	p = uvutil_pool_new(&loop, 4, 200);
	assert_non_null(p);
	for (int i = 0; i < 6; i++) {
		pair(&loop, &fd[i], &s[i]);
		uvutil_pool_put(p, (uv_stream_t *)s[i]);
	}
	/* Bounded: the 5th and 6th were closed at once. */
	assert_int_equal(uvutil_pool_size(p), 4);
	uv_run(&loop, UV_RUN_NOWAIT);
	assert_true(peer_closed(fd[4]));
	assert_true(peer_closed(fd[5]));
	/* Idle connections do not keep the loop running on their own; a
	 * timer keeps this one turning. */
	assert_false(uv_loop_alive(&loop));
	uv_timer_init(&loop, &tick);
	uv_timer_start(&tick, tick_noop, 5, 5);
	/* A byte from an idle peer (it may send nothing between operations)
	 * and an EOF each drop their connection. */
	assert_int_equal(write(fd[1], "x", 1), 1);
	shutdown(fd[2], SHUT_WR);
	for (int i = 0; i < 10 && uvutil_pool_size(p) > 2; i++)
		uv_run(&loop, UV_RUN_ONCE);
	assert_int_equal(uvutil_pool_size(p), 2);
	/* Newest first: s[3], then s[0]; the stream is the caller's now. */
	assert_ptr_equal(uvutil_pool_get(p), s[3]);
	assert_int_equal(uvutil_pool_size(p), 1);
	relay_close_free((uv_stream_t *)s[3]);
	/* s[0] expires after 200 ms idle. */
	while (uvutil_pool_size(p) > 0)
		uv_run(&loop, UV_RUN_ONCE);
	assert_null(uvutil_pool_get(p));
	uvutil_pool_free(p);
	/* A held pool outlives its free, and takes nothing more: a
	 * connection in use that ends cleanly after it is closed. */
	p = uvutil_pool_hold(uvutil_pool_new(&loop, 4, 200));
	assert_non_null(p);
	uvutil_pool_free(p);
	close(fd[0]);
	pair(&loop, &fd[0], &s[0]);
	uvutil_pool_put(p, (uv_stream_t *)s[0]);
	assert_int_equal(uvutil_pool_size(p), 0);
	uv_run(&loop, UV_RUN_NOWAIT);
	assert_true(peer_closed(fd[0]));
	uvutil_pool_release(p);
	uv_close((uv_handle_t *)&tick, NULL);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop), 0);
	for (int i = 0; i < 6; i++)
		close(fd[i]);
}

/* test_keep_error_closing: an ERROR its sender closes after
 * ({"closing":true}: a bridge that failed the operation, a manager
 * aborting it) ends the operation cleanly for the opener, but the far
 * connection is not handed back for reuse; a plain ERROR's is. */
static void test_keep_error_closing(void **state)
{
	struct harness h;
	uint8_t far[256];
	size_t n;

	(void)state;
	h_init(&h);
	n = frame_bytes(far, WIRE_ERROR,
	                "{\"error\":\"transport\",\"message\":\"x\",\"closing\":true}");
	assert_int_equal(write(h.b0, far, n), (ssize_t)n);
	close(h.b0);
	h_run(&h, "", 0);
	assert_true(h.kept_seen);
	assert_int_equal(h.how, RELAY_DONE);
	assert_false(h.far_kept);
	close(h.a0);

	h_init(&h);
	n = frame_bytes(far, WIRE_ERROR, "{\"error\":\"not_found\",\"message\":\"x\"}");
	h_run(&h, (const char *)far, n);
	assert_true(h.kept_seen);
	assert_true(h.far_kept);
	close(h.a0);
	close(h.b0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keep_clean),
		cmocka_unit_test(test_keep_first),
		cmocka_unit_test(test_keep_far_trailing),
		cmocka_unit_test(test_keep_opener_partial),
		cmocka_unit_test(test_keep_far_gone),
		cmocka_unit_test(test_next_request),
		cmocka_unit_test(test_pool),
		cmocka_unit_test(test_keep_error_closing),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

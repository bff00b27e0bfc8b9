/* lib/relay: a real libuv loop relaying between real socketpairs; the
 * opener and far peers are plain blocking sockets (threads where they must
 * act while the loop runs). */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cmocka.h>

#include "relay.h"
#include "wire.h"

struct harness {
	uv_loop_t loop;
	int a0, b0;              /* test ends: opener peer, far peer */
	uv_pipe_t *a1, *b1;      /* relay ends (owned by the relay once started) */
	struct relay *r;
	bool done;
	enum relay_end how;
	size_t max_queue;        /* largest opener write queue seen */
	uv_check_t check;
	uv_timer_t timer;
	bool use_timer;
};

static uint8_t rbuf[WIRE_PAYLOAD_MAX + 1];

/* check_cb: samples the opener queue every loop iteration. */
static void check_cb(uv_check_t *c)
{
	struct harness *h = c->data;
	size_t q;

	if (h->done)
		return;
	q = uv_stream_get_write_queue_size((uv_stream_t *)h->a1);
	if (q > h->max_queue)
		h->max_queue = q;
}

/* done_cb: records the outcome and lets the loop end. */
static void done_cb(struct relay *r, enum relay_end how, const char *msg, void *data)
{
	struct harness *h = data;

	(void)r;
	(void)msg;
	h->done = true;
	h->how = how;
	uv_close((uv_handle_t *)&h->check, NULL);
	if (h->use_timer && !uv_is_closing((uv_handle_t *)&h->timer))
		uv_close((uv_handle_t *)&h->timer, NULL);
}

/* setup_pair: a socketpair, one end wrapped in a heap uv_pipe_t. */
static void setup_pair(struct harness *h, int *test_end, uv_pipe_t **relay_end)
{
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	*test_end = sv[0];
	*relay_end = malloc(sizeof(**relay_end));
	assert_non_null(*relay_end);
	assert_int_equal(uv_pipe_init(&h->loop, *relay_end, 0), 0);
	assert_int_equal(uv_pipe_open(*relay_end, sv[1]), 0);
}

/* h_init: loop plus both pairs. */
static void h_init(struct harness *h)
{
	memset(h, 0, sizeof(*h));
	assert_int_equal(uv_loop_init(&h->loop), 0);
	setup_pair(h, &h->a0, &h->a1);
	setup_pair(h, &h->b0, &h->b1);
	uv_check_init(&h->loop, &h->check);
	h->check.data = h;
	uv_check_start(&h->check, check_cb);
}

/* h_run: starts the relay and runs the loop to its end. */
static void h_run(struct harness *h, const uint8_t *pending, size_t plen)
{
	h->r = relay_start((uv_stream_t *)h->a1, (uv_stream_t *)h->b1, pending, plen,
	                   done_cb, h, NULL);
	assert_non_null(h->r);
	uv_run(&h->loop, UV_RUN_DEFAULT);
	assert_true(h->done);
	assert_int_equal(uv_loop_close(&h->loop), 0);
}

/* h_fini: closes the test ends. */
static void h_fini(struct harness *h)
{
	if (h->a0 >= 0)
		close(h->a0);
	if (h->b0 >= 0)
		close(h->b0);
}

/* send_str: one frame with a string payload. */
static void send_str(int fd, uint8_t type, const char *s)
{
	assert_int_equal(wire_send(fd, type, s, (uint32_t)strlen(s), NULL), 0);
}

/* expect_frame: reads one frame of type; returns its payload (in rbuf). */
static const char *expect_frame(int fd, uint8_t type)
{
	struct wire_frame f;
	struct tt_err err = { 0 };

	assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), &err), 1);
	assert_int_equal(f.type, type);
	return (const char *)f.payload;
}

/* expect_eof: the peer closed without sending anything more. */
static void expect_eof(int fd)
{
	struct wire_frame f;

	assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL), 0);
}

/* expect_error_code: reads ERROR and checks its "error" member. */
static void expect_error_code(int fd, const char *code)
{
	const char *p = expect_frame(fd, WIRE_ERROR);
	json_t *o = json_loads(p, 0, NULL);

	assert_non_null(o);
	assert_string_equal(json_string_value(json_object_get(o, "error")), code);
	json_decref(o);
}

/* far_echo: far peer that answers a full exchange. */
static void *far_echo(void *arg)
{
	int fd = *(int *)arg;
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	struct wire_frame f;
	intptr_t ok = 1;

	ok &= wire_recv(fd, &f, buf, sizeof(buf), NULL) == 1 && f.type == WIRE_DATA_IN &&
	      strcmp((char *)f.payload, "abc") == 0;
	ok &= wire_recv(fd, &f, buf, sizeof(buf), NULL) == 1 && f.type == WIRE_DATA_IN &&
	      strcmp((char *)f.payload, "def") == 0;
	ok &= wire_recv(fd, &f, buf, sizeof(buf), NULL) == 1 && f.type == WIRE_EOF_IN;
	wire_send(fd, WIRE_DATA_OUT, "out", 3, NULL);
	wire_send(fd, WIRE_STDERR, "err", 3, NULL);
	wire_send(fd, WIRE_RESULT, "{\"exit_code\":0}", 15, NULL);
	/* The relay ends after the result: nothing more arrives. */
	ok &= wire_recv(fd, &f, buf, sizeof(buf), NULL) == 0;
	return (void *)ok;
}

/* test_full_exchange: input down, output up, RESULT ends it; pending
 * bytes read before the relay started are forwarded first. */
static void test_full_exchange(void **state)
{
	struct harness h;
	pthread_t th;
	void *ok;
	uint8_t pending[WIRE_HDR_LEN + 3];

	(void)state;
	h_init(&h);
	wire_hdr_encode(pending, WIRE_DATA_IN, 3);
	memcpy(pending + WIRE_HDR_LEN, "abc", 3);
	send_str(h.a0, WIRE_DATA_IN, "def");
	send_str(h.a0, WIRE_EOF_IN, "");
	pthread_create(&th, NULL, far_echo, &h.b0);
	h_run(&h, pending, sizeof(pending));
	pthread_join(th, &ok);
	assert_true((intptr_t)ok);
	assert_int_equal(h.how, RELAY_DONE);
	assert_string_equal(expect_frame(h.a0, WIRE_DATA_OUT), "out");
	assert_string_equal(expect_frame(h.a0, WIRE_STDERR), "err");
	assert_string_equal(expect_frame(h.a0, WIRE_RESULT), "{\"exit_code\":0}");
	expect_eof(h.a0);
	h_fini(&h);
}

/* test_far_closes_early: the far side goes away mid-operation -> the opener
 * gets ERROR transport, never silence. */
static void test_far_closes_early(void **state)
{
	struct harness h;

	(void)state;
	h_init(&h);
	send_str(h.b0, WIRE_DATA_OUT, "partial");
	close(h.b0);
	h.b0 = -1;
	h_run(&h, NULL, 0);
	assert_int_equal(h.how, RELAY_FAR_GONE);
	assert_string_equal(expect_frame(h.a0, WIRE_DATA_OUT), "partial");
	expect_error_code(h.a0, "transport");
	expect_eof(h.a0);
	h_fini(&h);
}

/* test_far_garbage: bytes that are not a frame from the far side. */
static void test_far_garbage(void **state)
{
	struct harness h;

	(void)state;
	h_init(&h);
	assert_int_equal(write(h.b0, "GET / HTTP/1.1\r\n\r\n", 18), 18);
	h_run(&h, NULL, 0);
	assert_int_equal(h.how, RELAY_MALFORMED);
	expect_error_code(h.a0, "transport");
	expect_eof(h.a0);
	expect_eof(h.b0);
	h_fini(&h);
}

/* test_opener_garbage: an oversized length from the opener is refused
 * before any payload, nothing reaches the far side. */
static void test_opener_garbage(void **state)
{
	struct harness h;
	uint8_t hdr[WIRE_HDR_LEN];

	(void)state;
	h_init(&h);
	wire_hdr_encode(hdr, WIRE_DATA_IN, 16);
	hdr[8] = 0x7f; /* len high byte: ~2 GiB */
	assert_int_equal(write(h.a0, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
	h_run(&h, NULL, 0);
	assert_int_equal(h.how, RELAY_MALFORMED);
	expect_error_code(h.a0, "bad_request");
	expect_eof(h.b0);
	h_fini(&h);
}

/* test_wrong_direction: a RESULT from the opener or a REQUEST from the far
 * side is a violation; an honest frame before it still went through. */
static void test_wrong_direction(void **state)
{
	struct harness h;

	(void)state;
	h_init(&h);
	send_str(h.a0, WIRE_DATA_IN, "ok");
	send_str(h.a0, WIRE_RESULT, "{}");
	h_run(&h, NULL, 0);
	assert_int_equal(h.how, RELAY_MALFORMED);
	assert_string_equal(expect_frame(h.b0, WIRE_DATA_IN), "ok");
	expect_eof(h.b0);
	expect_error_code(h.a0, "bad_request");
	h_fini(&h);

	h_init(&h);
	send_str(h.b0, WIRE_REQUEST, "{\"op\":\"exec\"}");
	h_run(&h, NULL, 0);
	assert_int_equal(h.how, RELAY_MALFORMED);
	expect_error_code(h.a0, "transport");
	h_fini(&h);
}

/* test_opener_gone: the opener hangs up -> the far side is dropped. */
static void test_opener_gone(void **state)
{
	struct harness h;

	(void)state;
	h_init(&h);
	close(h.a0);
	h.a0 = -1;
	h_run(&h, NULL, 0);
	assert_int_equal(h.how, RELAY_OPENER_GONE);
	expect_eof(h.b0);
	h_fini(&h);
}

#define BIG_TOTAL (8u << 20)

/* far_flood: the far side writes 8 MiB of output then a RESULT. */
static void *far_flood(void *arg)
{
	int fd = *(int *)arg;
	static uint8_t chunk[WIRE_PAYLOAD_MAX];
	intptr_t ok = 1;

	for (size_t i = 0; i < sizeof(chunk); i++)
		chunk[i] = (uint8_t)(i * 7);
	for (size_t sent = 0; sent < BIG_TOTAL && ok; sent += sizeof(chunk))
		ok = wire_send(fd, WIRE_DATA_OUT, chunk, sizeof(chunk), NULL) == 0;
	ok = ok && wire_send(fd, WIRE_RESULT, "{}", 2, NULL) == 0;
	return (void *)ok;
}

/* slow_reader: waits, then reads and checks everything byte-exact. */
static void *slow_reader(void *arg)
{
	int fd = *(int *)arg;
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	struct wire_frame f;
	size_t got = 0;
	intptr_t ok = 1;

	usleep(300 * 1000);
	while (ok && wire_recv(fd, &f, buf, sizeof(buf), NULL) == 1) {
		if (f.type == WIRE_RESULT)
			return (void *)(intptr_t)(got == BIG_TOTAL);
		ok = f.type == WIRE_DATA_OUT;
		for (uint32_t i = 0; ok && i < f.len; i++)
			ok = f.payload[i] == (uint8_t)(((got + i) % WIRE_PAYLOAD_MAX) * 7);
		got += f.len;
	}
	return (void *)0;
}

/* test_backpressure: a fast producer and a slow consumer: the relay's
 * queue toward the opener stays bounded and every byte arrives. */
static void test_backpressure(void **state)
{
	struct harness h;
	pthread_t far, rd;
	void *ok_far, *ok_rd;

	(void)state;
	h_init(&h);
	pthread_create(&far, NULL, far_flood, &h.b0);
	pthread_create(&rd, NULL, slow_reader, &h.a0);
	h_run(&h, NULL, 0);
	pthread_join(far, &ok_far);
	pthread_join(rd, &ok_rd);
	assert_true((intptr_t)ok_far);
	assert_true((intptr_t)ok_rd);
	assert_int_equal(h.how, RELAY_DONE);
	assert_true(h.max_queue > RELAY_HIGH_WATER / 2); /* the pause was needed */
	assert_true(h.max_queue <= RELAY_HIGH_WATER + 2 * (WIRE_PAYLOAD_MAX + WIRE_HDR_LEN));
	h_fini(&h);
}

/* abort_cb: cancels the relay as an epoch bump would. */
static void abort_cb(uv_timer_t *t)
{
	struct harness *h = t->data;

	uv_close((uv_handle_t *)t, NULL);
	h->use_timer = false;
	relay_abort(h->r, WIRE_E_REFRESH_ROUTE, "execution retired");
}

/* test_abort: a stream cancelled by its owner: the opener learns why and
 * the far side is dropped. */
static void test_abort(void **state)
{
	struct harness h;

	(void)state;
	h_init(&h);
	uv_timer_init(&h.loop, &h.timer);
	h.timer.data = &h;
	h.use_timer = true;
	uv_timer_start(&h.timer, abort_cb, 50, 0);
	h_run(&h, NULL, 0);
	assert_int_equal(h.how, RELAY_ABORTED);
	expect_error_code(h.a0, "refresh_route");
	expect_eof(h.b0);
	h_fini(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_full_exchange),
		cmocka_unit_test(test_far_closes_early),
		cmocka_unit_test(test_far_garbage),
		cmocka_unit_test(test_opener_garbage),
		cmocka_unit_test(test_wrong_direction),
		cmocka_unit_test(test_opener_gone),
		cmocka_unit_test(test_backpressure),
		cmocka_unit_test(test_abort),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Wire protocol: header codec, every header violation, blocking send and
 * receive over real socketpairs, the incremental reader fed byte by byte,
 * and the JSON helpers. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "wire.h"
#include "wire_json.h"
#include "wirecode.h"

/* mk_pair: a connected unix stream socketpair. */
static void mk_pair(int sv[2])
{
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
}

/* write_raw: writes bytes without framing. */
static void write_raw(int fd, const void *p, size_t n)
{
	assert_int_equal(write(fd, p, n), (ssize_t)n);
}

static void test_hdr_roundtrip(void **state)
{
	uint8_t h[WIRE_HDR_LEN];
	struct tt_err err = { 0 };
	uint8_t type;
	uint32_t len;
	static const uint8_t expect[WIRE_HDR_LEN] = {
		0x54, 0x54, 0x57, 0x00, 1, WIRE_RESULT, 0, 0, 0x00, 0x00, 0xf1, 0x02,
	};

	(void)state;
	wire_hdr_encode(h, WIRE_RESULT, 0xf102);
	assert_memory_equal(h, expect, sizeof(expect)); /* big-endian */
	assert_int_equal(wire_hdr_decode(h, &type, &len, &err), 0);
	assert_int_equal(type, WIRE_RESULT);
	assert_int_equal(len, 0xf102);
	for (uint8_t t = WIRE_REQUEST; t <= WIRE_TYPE_MAX; t++) {
		wire_hdr_encode(h, t, WIRE_PAYLOAD_MAX);
		assert_int_equal(wire_hdr_decode(h, &type, &len, &err), 0);
		assert_int_equal(type, t);
		assert_int_equal(len, WIRE_PAYLOAD_MAX);
		assert_string_not_equal(wire_type_name(t), "UNKNOWN");
	}
	assert_string_equal(wire_type_name(0), "UNKNOWN");
}

/* expect_bad_hdr: a header with byte i set to v must be refused with code. */
static void expect_bad_hdr(size_t i, uint8_t v, enum tt_errc code)
{
	uint8_t h[WIRE_HDR_LEN];
	struct tt_err err = { 0 };
	uint8_t type = 0xee;
	uint32_t len = 0xeeee;

	wire_hdr_encode(h, WIRE_REQUEST, 10);
	h[i] = v;
	assert_int_equal(wire_hdr_decode(h, &type, &len, &err), -1);
	assert_int_equal(err.code, code);
	assert_int_equal(type, 0xee); /* outputs untouched */
	assert_int_equal(len, 0xeeee);
}

static void test_hdr_violations(void **state)
{
	uint8_t h[WIRE_HDR_LEN];
	struct tt_err err = { 0 };
	uint8_t type;
	uint32_t len;

	(void)state;
	expect_bad_hdr(0, 0x55, TT_ERR_MALFORMED); /* magic */
	expect_bad_hdr(3, 0x01, TT_ERR_MALFORMED); /* magic, last byte */
	expect_bad_hdr(4, 0, TT_ERR_MALFORMED);    /* version */
	expect_bad_hdr(4, 2, TT_ERR_MALFORMED);
	expect_bad_hdr(5, 0, TT_ERR_MALFORMED);    /* type */
	expect_bad_hdr(5, WIRE_TYPE_MAX + 1, TT_ERR_MALFORMED);
	expect_bad_hdr(5, 0xff, TT_ERR_MALFORMED);
	expect_bad_hdr(6, 1, TT_ERR_MALFORMED);    /* reserved */
	expect_bad_hdr(7, 0x80, TT_ERR_MALFORMED);
	expect_bad_hdr(8, 0x80, TT_ERR_TOO_LARGE); /* len 2^31+10 */
	wire_hdr_encode(h, WIRE_DATA_IN, WIRE_PAYLOAD_MAX + 1);
	assert_int_equal(wire_hdr_decode(h, &type, &len, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
}

/* test_meta_frame: META (10) is the last type: its header decodes, it has
 * a name, it travels as JSON over a socket, and 11 is still refused. */
static void test_meta_frame(void **state)
{
	static const char meta[] = "{\"size\":123456789012}";
	static uint8_t rbuf[WIRE_PAYLOAD_MAX + 1];
	uint8_t h[WIRE_HDR_LEN];
	struct tt_err err = { 0 };
	struct wire_frame f;
	uint8_t type;
	uint32_t len;
	int sv[2];

	(void)state;
	assert_int_equal(WIRE_META, 10);
	assert_int_equal(WIRE_TYPE_MAX, WIRE_META);
	assert_string_equal(wire_type_name(WIRE_META), "META");
	assert_string_equal(wire_type_name(WIRE_META + 1), "UNKNOWN");
	wire_hdr_encode(h, WIRE_META, 21);
	assert_int_equal(h[5], 10);
	assert_int_equal(wire_hdr_decode(h, &type, &len, &err), 0);
	assert_int_equal(type, WIRE_META);
	h[5] = WIRE_META + 1;
	assert_int_equal(wire_hdr_decode(h, &type, &len, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(wire_send(sv[0], WIRE_META, meta, sizeof(meta) - 1, &err), 0);
	assert_int_equal(wire_send(sv[0], WIRE_DATA_OUT, "ab", 2, &err), 0);
	assert_int_equal(wire_recv(sv[1], &f, rbuf, sizeof(rbuf), &err), 1);
	assert_int_equal(f.type, WIRE_META);
	assert_string_equal((char *)f.payload, meta);
	assert_int_equal(wire_recv(sv[1], &f, rbuf, sizeof(rbuf), &err), 1);
	assert_int_equal(f.type, WIRE_DATA_OUT);
	assert_int_equal(wire_send(sv[0], WIRE_META + 1, "{}", 2, &err), -1);
	close(sv[0]);
	close(sv[1]);
}

static void test_send_recv(void **state)
{
	static uint8_t big[WIRE_PAYLOAD_MAX], buf[WIRE_PAYLOAD_MAX + 1];
	struct tt_err err = { 0 };
	struct wire_frame f;
	int sv[2];

	(void)state;
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 7 + 3);
	mk_pair(sv);
	/* Sender in a child so a full socket buffer cannot deadlock. */
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		if (wire_send(sv[1], WIRE_EOF_IN, NULL, 0, NULL) < 0 ||
		    wire_send(sv[1], WIRE_DATA_IN, "x", 1, NULL) < 0 ||
		    wire_send(sv[1], WIRE_DATA_OUT, big, sizeof(big), NULL) < 0)
			_exit(1);
		_exit(0);
	}
	close(sv[1]);
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), 1);
	assert_int_equal(f.type, WIRE_EOF_IN);
	assert_int_equal(f.len, 0);
	assert_int_equal(f.payload[0], 0);
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), 1);
	assert_int_equal(f.type, WIRE_DATA_IN);
	assert_int_equal(f.len, 1);
	assert_string_equal((char *)f.payload, "x");
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), 1);
	assert_int_equal(f.type, WIRE_DATA_OUT);
	assert_int_equal(f.len, WIRE_PAYLOAD_MAX);
	assert_memory_equal(f.payload, big, sizeof(big));
	assert_int_equal(f.payload[f.len], 0); /* NUL-terminated */
	/* Clean EOF between frames. */
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), 0);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(status, 0);
	close(sv[0]);
}

static void test_send_refuses(void **state)
{
	struct tt_err err = { 0 };
	int sv[2];

	(void)state;
	mk_pair(sv);
	assert_int_equal(wire_send(sv[0], 0, "x", 1, &err), -1);
	assert_int_equal(err.code, TT_ERR_INVALID);
	assert_int_equal(wire_send(sv[0], WIRE_TYPE_MAX + 1, "x", 1, &err), -1);
	assert_int_equal(wire_send(sv[0], WIRE_DATA_IN, "x", WIRE_PAYLOAD_MAX + 1, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	/* A vanished peer is an error value, not SIGPIPE. */
	close(sv[1]);
	assert_int_equal(wire_send(sv[0], WIRE_DATA_IN, "x", 1, &err), -1);
	assert_int_equal(err.code, TT_ERR_TRANSPORT);
	close(sv[0]);
}

/* recv_expect_fail: writes raw bytes (keeping the writer open unless
 * close_writer) and expects wire_recv to fail with code, without blocking
 * on payload that never comes. */
static void recv_expect_fail(const uint8_t *raw, size_t n, int close_writer,
                             enum tt_errc code)
{
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	struct tt_err err = { 0 };
	struct wire_frame f;
	int sv[2];

	mk_pair(sv);
	/* If wire_recv wrongly waited for payload, this makes it fail the test
	 * with a timeout error instead of hanging. */
	struct timeval tv = { .tv_sec = 2 };
	setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	write_raw(sv[1], raw, n);
	if (close_writer)
		close(sv[1]);
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), -1);
	assert_int_equal(err.code, code);
	close(sv[0]);
	if (!close_writer)
		close(sv[1]);
}

static void test_recv_violations(void **state)
{
	uint8_t h[WIRE_HDR_LEN + 4];

	(void)state;
	/* Oversized len: refused on the header alone, writer still open. */
	wire_hdr_encode(h, WIRE_DATA_IN, WIRE_PAYLOAD_MAX + 1);
	recv_expect_fail(h, WIRE_HDR_LEN, 0, TT_ERR_TOO_LARGE);
	wire_hdr_encode(h, WIRE_DATA_IN, 0xffffffffu);
	recv_expect_fail(h, WIRE_HDR_LEN, 0, TT_ERR_TOO_LARGE);
	/* Bad magic / version / type / reserved. */
	wire_hdr_encode(h, WIRE_REQUEST, 2);
	h[1] = 'X';
	recv_expect_fail(h, WIRE_HDR_LEN, 0, TT_ERR_MALFORMED);
	wire_hdr_encode(h, WIRE_REQUEST, 2);
	h[4] = 9;
	recv_expect_fail(h, WIRE_HDR_LEN, 0, TT_ERR_MALFORMED);
	wire_hdr_encode(h, 77, 2);
	recv_expect_fail(h, WIRE_HDR_LEN, 0, TT_ERR_MALFORMED);
	wire_hdr_encode(h, WIRE_REQUEST, 2);
	h[6] = 1;
	recv_expect_fail(h, WIRE_HDR_LEN, 0, TT_ERR_MALFORMED);
	/* Truncated header and truncated payload. */
	wire_hdr_encode(h, WIRE_REQUEST, 4);
	recv_expect_fail(h, 5, 1, TT_ERR_TRANSPORT);
	memcpy(h + WIRE_HDR_LEN, "ab", 2);
	recv_expect_fail(h, WIRE_HDR_LEN + 2, 1, TT_ERR_TRANSPORT);
}

static void test_recv_small_buffer(void **state)
{
	uint8_t buf[8];
	struct tt_err err = { 0 };
	struct wire_frame f;
	int sv[2];

	(void)state;
	mk_pair(sv);
	assert_int_equal(wire_send(sv[1], WIRE_DATA_IN, "12345678", 8, &err), 0);
	/* 8 bytes + NUL do not fit in 8. */
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	close(sv[0]);
	close(sv[1]);
}

/* build_stream: three frames back to back into out; returns the length. */
static size_t build_stream(uint8_t *out)
{
	size_t n = 0;

	wire_hdr_encode(out + n, WIRE_REQUEST, 13);
	memcpy(out + n + WIRE_HDR_LEN, "{\"op\":\"exec\"}", 13);
	n += WIRE_HDR_LEN + 13;
	wire_hdr_encode(out + n, WIRE_EOF_IN, 0);
	n += WIRE_HDR_LEN;
	wire_hdr_encode(out + n, WIRE_DATA_OUT, 3);
	memcpy(out + n + WIRE_HDR_LEN, "abc", 3);
	n += WIRE_HDR_LEN + 3;
	return n;
}

/* check_frame_k: the k-th frame of build_stream. */
static void check_frame_k(int k, const struct wire_frame *f)
{
	switch (k) {
	case 0:
		assert_int_equal(f->type, WIRE_REQUEST);
		assert_string_equal((char *)f->payload, "{\"op\":\"exec\"}");
		break;
	case 1:
		assert_int_equal(f->type, WIRE_EOF_IN);
		assert_int_equal(f->len, 0);
		assert_string_equal((char *)f->payload, "");
		break;
	case 2:
		assert_int_equal(f->type, WIRE_DATA_OUT);
		assert_int_equal(f->len, 3);
		assert_string_equal((char *)f->payload, "abc");
		break;
	default:
		fail();
	}
}

static void test_reader_bytewise(void **state)
{
	struct wire_reader *r = malloc(sizeof(*r));
	struct tt_err err = { 0 };
	struct wire_frame f;
	uint8_t s[128];
	size_t n = build_stream(s), used;
	int k = 0;

	(void)state;
	assert_non_null(r);
	wire_reader_init(r);
	for (size_t i = 0; i < n; i++) {
		int rc = wire_reader_feed(r, s + i, 1, &used, &f, &err);

		assert_int_equal(used, 1);
		assert_true(rc == 0 || rc == 1);
		if (rc == 1)
			check_frame_k(k++, &f);
	}
	assert_int_equal(k, 3);
	/* Empty feed needs more, consumes nothing. */
	assert_int_equal(wire_reader_feed(r, s, 0, &used, &f, &err), 0);
	assert_int_equal(used, 0);
	free(r);
}

static void test_reader_whole_buffer(void **state)
{
	struct wire_reader *r = malloc(sizeof(*r));
	struct tt_err err = { 0 };
	struct wire_frame f;
	uint8_t s[128];
	size_t n = build_stream(s), off = 0, used;
	int k = 0;

	(void)state;
	assert_non_null(r);
	wire_reader_init(r);
	/* One feed stops at each frame boundary. */
	while (off < n) {
		int rc = wire_reader_feed(r, s + off, n - off, &used, &f, &err);

		assert_int_equal(rc, 1);
		check_frame_k(k++, &f);
		off += used;
	}
	assert_int_equal(k, 3);
	assert_int_equal(off, n);
	free(r);
}

static void test_reader_violations(void **state)
{
	struct wire_reader *r = malloc(sizeof(*r));
	struct tt_err err = { 0 };
	struct wire_frame f;
	uint8_t h[WIRE_HDR_LEN + 8];
	size_t used;

	(void)state;
	assert_non_null(r);
	/* Oversized len: refused once the header is complete, before any
	 * payload byte is consumed. */
	wire_reader_init(r);
	wire_hdr_encode(h, WIRE_DATA_IN, WIRE_PAYLOAD_MAX + 1);
	memset(h + WIRE_HDR_LEN, 'z', 8);
	assert_int_equal(wire_reader_feed(r, h, sizeof(h), &used, &f, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	assert_true(used <= WIRE_HDR_LEN);
	/* Byte by byte: the failure comes exactly with the 12th byte. */
	wire_reader_init(r);
	wire_hdr_encode(h, WIRE_REQUEST, 1);
	h[0] = 'G';
	for (size_t i = 0; i < WIRE_HDR_LEN - 1; i++)
		assert_int_equal(wire_reader_feed(r, h + i, 1, &used, &f, &err), 0);
	assert_int_equal(wire_reader_feed(r, h + WIRE_HDR_LEN - 1, 1, &used, &f, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	/* Reserved bytes and unknown type. */
	wire_reader_init(r);
	wire_hdr_encode(h, WIRE_REQUEST, 1);
	h[7] = 1;
	assert_int_equal(wire_reader_feed(r, h, WIRE_HDR_LEN, &used, &f, &err), -1);
	wire_reader_init(r);
	wire_hdr_encode(h, 0, 1);
	assert_int_equal(wire_reader_feed(r, h, WIRE_HDR_LEN, &used, &f, &err), -1);
	free(r);
}

static void test_json_roundtrip(void **state)
{
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	struct tt_err err = { 0 };
	struct wire_frame f;
	json_t *obj, *back;
	int sv[2];

	(void)state;
	mk_pair(sv);
	obj = json_pack("{s:s, s:[s,s]}", "op", "exec", "cmd", "echo", "hi");
	assert_int_equal(wire_send_json(sv[1], WIRE_REQUEST, obj, &err), 0);
	assert_int_equal(obj->refcount, 1); /* not stolen */
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), 1);
	back = wire_frame_json(&f, &err);
	assert_non_null(back);
	assert_true(json_equal(obj, back));
	json_decref(back);
	json_decref(obj);
	assert_int_equal(wire_send_error(sv[1], WIRE_E_NOT_FOUND, "no %s", "file"), 0);
	assert_int_equal(wire_recv(sv[0], &f, buf, sizeof(buf), &err), 1);
	assert_int_equal(f.type, WIRE_ERROR);
	back = wire_frame_json(&f, &err);
	assert_non_null(back);
	assert_string_equal(json_string_value(json_object_get(back, "error")), "not_found");
	assert_string_equal(json_string_value(json_object_get(back, "message")), "no file");
	json_decref(back);
	/* Too large to serialize into one frame. */
	obj = json_object();
	json_object_set_new(obj, "x", json_stringn((char *)buf, 0));
	char *big = malloc(WIRE_PAYLOAD_MAX + 1);
	assert_non_null(big);
	memset(big, 'a', WIRE_PAYLOAD_MAX);
	big[WIRE_PAYLOAD_MAX] = 0;
	json_object_set_new(obj, "x", json_string(big));
	assert_int_equal(wire_send_json(sv[1], WIRE_RESULT, obj, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
	free(big);
	json_decref(obj);
	close(sv[0]);
	close(sv[1]);
}

/* frame_of: a frame struct over a C string. */
static struct wire_frame frame_of(const char *s)
{
	return (struct wire_frame){ .type = WIRE_REQUEST, .len = (uint32_t)strlen(s),
	                            .payload = (uint8_t *)s };
}

static void test_json_strict(void **state)
{
	struct tt_err err = { 0 };
	struct wire_frame f;
	json_t *o;

	(void)state;
	f = frame_of("{\"op\":\"a\",\"op\":\"b\"}");
	assert_null(wire_frame_json(&f, &err));
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	f = frame_of("[1,2]");
	assert_null(wire_frame_json(&f, &err));
	f = frame_of("\"op\"");
	assert_null(wire_frame_json(&f, &err));
	f = frame_of("{\"op\":");
	assert_null(wire_frame_json(&f, &err));
	f = frame_of("");
	assert_null(wire_frame_json(&f, &err));
	f = frame_of("{\"a\":\"\\u0000\"}");
	assert_null(wire_frame_json(&f, &err));
	/* An embedded NUL byte in the payload is not ignored. */
	f = (struct wire_frame){ .type = WIRE_REQUEST, .len = 10,
	                         .payload = (uint8_t *)"{\"a\":1}\0{}" };
	assert_null(wire_frame_json(&f, &err));
	f = frame_of("{\"op\":\"exec\"}");
	o = wire_frame_json(&f, &err);
	assert_non_null(o);
	json_decref(o);
}

/* test_codes: every code's name parses back to it, names are distinct,
 * and what the table does not know (or no code at all) is "internal". */
static void test_codes(void **state)
{
	(void)state;
	for (int i = 0; i < WIRE_E_COUNT; i++) {
		const char *n = wirecode_name((enum wire_code)i);

		assert_non_null(n);
		assert_int_equal(wirecode_parse(n), i);
		for (int j = 0; j < i; j++)
			assert_string_not_equal(n, wirecode_name((enum wire_code)j));
		assert_true(wirecode_status((enum wire_code)i) >= 400);
	}
	assert_int_equal(wirecode_parse("no_such_code"), WIRE_E_INTERNAL);
	assert_int_equal(wirecode_parse(""), WIRE_E_INTERNAL);
	assert_int_equal(wirecode_parse(NULL), WIRE_E_INTERNAL);
	assert_int_equal(wirecode_parse("Transport"), WIRE_E_INTERNAL);
	assert_string_equal(wirecode_name(WIRE_E_TRANSPORT), "transport");
	assert_string_equal(wirecode_name(WIRE_E_REFRESH_ROUTE), "refresh_route");
	assert_string_equal(wirecode_name((enum wire_code)WIRE_E_COUNT), "internal");
	assert_int_equal(wirecode_status(WIRE_E_NOT_FOUND), 404);
	assert_int_equal(wirecode_status(WIRE_E_TRANSPORT), 502);
	assert_int_equal(wirecode_status((enum wire_code)-1), 500);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hdr_roundtrip),
		cmocka_unit_test(test_hdr_violations),
		cmocka_unit_test(test_meta_frame),
		cmocka_unit_test(test_send_recv),
		cmocka_unit_test(test_send_refuses),
		cmocka_unit_test(test_recv_violations),
		cmocka_unit_test(test_recv_small_buffer),
		cmocka_unit_test(test_reader_bytewise),
		cmocka_unit_test(test_reader_whole_buffer),
		cmocka_unit_test(test_reader_violations),
		cmocka_unit_test(test_json_roundtrip),
		cmocka_unit_test(test_json_strict),
		cmocka_unit_test(test_codes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

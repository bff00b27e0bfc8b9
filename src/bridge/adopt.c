/* The bridge's side of an adoption (adopt.h, lib/hello.h): a fresh
 * challenge, one HELLO back within HELLO_TIMEOUT_MS holding the proof and
 * nothing else, then {"adopted":true} or ERROR, and the connection closes
 * either way: operations come on new connections, verified against the
 * re-pinned manager. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/adopt.h"
#include "hello.h"
#include "log.h"
#include "relay.h"
#include "wire.h"
#include "wire_json.h"

struct adopt {
	struct adopt_spec spec;
	uv_pipe_t *conn;             /* owned until handed to a close */
	pid_t peer;
	uint8_t challenge[HELLO_CHALLENGE_LEN];
	struct wire_reader rd;
	uv_timer_t timer;
	bool ended;
	uint8_t buf[1024 + WIRE_HDR_LEN];
};

/* adopt_free_cb: the timer is closed: nothing else refers to a. */
static void adopt_free_cb(uv_handle_t *h)
{
	struct adopt *a = h->data;

	sodium_memzero(a->challenge, sizeof(a->challenge));
	free(a);
}

/* adopt_end: reports the outcome once, answers the peer and closes. */
static void adopt_end(struct adopt *a, enum refusal reason, const char *msg)
{
	struct tt_err err = { 0 };
	json_t *ok;

	if (a->ended)
		return;
	a->ended = true;
	uv_read_stop((uv_stream_t *)a->conn);
	uv_timer_stop(&a->timer);
	if (reason == REFUSAL_NONE) {
		ok = json_pack("{s:b}", "adopted", 1);
		if (ok == NULL || relay_write_json((uv_stream_t *)a->conn, WIRE_HELLO, ok, &err) < 0)
			log_warn("adoption by pid %d: the answer was not sent: %s", (int)a->peer,
			         ok ? err.msg : "out of memory");
		json_decref(ok);
		relay_close_free((uv_stream_t *)a->conn);
	} else {
		relay_error_close((uv_stream_t *)a->conn, WIRE_E_VERIFY_FAILED, msg);
	}
	a->conn = NULL;
	a->spec.done(a->spec.data, a->peer, reason, msg);
	uv_close((uv_handle_t *)&a->timer, adopt_free_cb);
}

/* adopt_judge: the peer's HELLO: exactly {"proof":b64url(32 bytes)}, the
 * MAC of our challenge under the adoption key. */
static void adopt_judge(struct adopt *a, const struct wire_frame *f)
{
	uint8_t got[HELLO_PROOF_LEN], want[HELLO_PROOF_LEN];
	struct tt_err err = { 0 };
	json_t *o = f->type == WIRE_HELLO ? wire_frame_json(f, &err) : NULL;
	uv_os_fd_t fd = -1;
	char msg[200];
	bool good;

	if (o == NULL || hello_proof_parse(o, got) < 0) {
		json_decref(o);
		adopt_end(a, REFUSAL_ADOPT_MALFORMED, "adoption: expected HELLO {\"proof\": …}");
		return;
	}
	json_decref(o);
	hello_mac(a->spec.key, HELLO_ADOPT_LABEL, a->spec.sbx, a->spec.gen, a->spec.att,
	          a->challenge, want);
	good = sodium_memcmp(got, want, HELLO_PROOF_LEN) == 0;
	sodium_memzero(want, sizeof(want));
	if (!good) {
		adopt_end(a, REFUSAL_ADOPT_BAD_PROOF, "adoption: wrong proof for this activation");
		return;
	}
	msg[0] = '\0';
	if (uv_fileno((uv_handle_t *)a->conn, &fd) < 0 ||
	    a->spec.accept(a->spec.data, fd, a->peer, msg, sizeof(msg)) < 0) {
		adopt_end(a, REFUSAL_ADOPT_REFUSED, msg);
		return;
	}
	adopt_end(a, REFUSAL_NONE, NULL);
}

/* adopt_alloc_cb: reads land in the connection's buffer. */
static void adopt_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct adopt *a = h->data;

	(void)suggested;
	*buf = uv_buf_init((char *)a->buf, sizeof(a->buf));
}

/* adopt_read_cb: one frame and nothing after it. */
static void adopt_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct adopt *a = s->data;
	struct tt_err err = { 0 };
	struct wire_frame f;
	size_t used = 0;
	int rc;

	(void)buf;
	if (nread == 0 || a->ended)
		return;
	if (nread < 0) {
		adopt_end(a, REFUSAL_ADOPT_CLOSED, "adoption: the peer closed the connection");
		return;
	}
	rc = wire_reader_feed(&a->rd, a->buf, (size_t)nread, &used, &f, &err);
	if (rc == 0)
		return;
	if (rc < 0 || (size_t)nread > used) {
		adopt_end(a, REFUSAL_ADOPT_MALFORMED, rc < 0 ? err.msg : "adoption: bytes after HELLO");
		return;
	}
	adopt_judge(a, &f);
}

/* adopt_timeout_cb: no proof in time. */
static void adopt_timeout_cb(uv_timer_t *t)
{
	adopt_end(t->data, REFUSAL_ADOPT_TIMEOUT, "adoption: no proof within 2 s");
}

/* adopt_start: see adopt.h. */
void adopt_start(uv_pipe_t *conn, pid_t peer, const struct adopt_spec *spec)
{
	struct adopt *a = calloc(1, sizeof(*a));
	struct tt_err err = { 0 };
	json_t *hello;

	if (a == NULL) {
		relay_close_free((uv_stream_t *)conn);
		spec->done(spec->data, peer, REFUSAL_ADOPT_INTERNAL, "out of memory");
		return;
	}
	a->spec = *spec;
	a->conn = conn;
	a->peer = peer;
	conn->data = a;
	wire_reader_init(&a->rd);
	uv_timer_init(spec->loop, &a->timer);
	a->timer.data = a;
	randombytes_buf(a->challenge, sizeof(a->challenge));
	hello = hello_adopt_challenge_json(a->challenge);
	if (hello == NULL || relay_write_json((uv_stream_t *)conn, WIRE_HELLO, hello, &err) < 0) {
		json_decref(hello);
		adopt_end(a, REFUSAL_ADOPT_INTERNAL, hello ? err.msg : "out of memory");
		return;
	}
	json_decref(hello);
	uv_timer_start(&a->timer, adopt_timeout_cb, HELLO_TIMEOUT_MS, 0);
	uv_read_start((uv_stream_t *)conn, adopt_alloc_cb, adopt_read_cb);
}

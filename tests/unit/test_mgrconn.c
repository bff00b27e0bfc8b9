/* node-api -> sbx-manager connection reuse (lib/wireconn.c on the
 * lib/uvutil.c pool, as src/node/mgrconn.c opens them):
 * a real unix-socket server in a child process speaks lib/wire.h like the
 * manager (one handler process per accepted connection, operations in
 * sequence) and counts connections and REQUESTs in shared memory. The
 * REQUEST's "mode" picks the server's behaviour for that operation. */
#include "testutil.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <uv.h>

#include "node/mgrconn.h"
#include "node/node.h"
#include "uvutil.h"
#include "wireconn.h"
#include "wire.h"

/* Counters shared with the server processes (MAP_SHARED). */
struct srv_counts {
	int accepted;  /* connections accepted */
	int requests;  /* REQUEST frames read, all connections */
	int died;      /* "die" REQUESTs read */
	int eofs;      /* handlers that saw EOF between operations */
};

struct fixture {
	struct tu_scratch s;
	pid_t srv;
	struct srv_counts *cnt;
	uv_loop_t loop;
	uv_timer_t tick; /* keeps uv_run turning while only idle pipes exist */
	struct uvutil_pool *pool; /* node-api's pool of manager connections */
};

/* ---- the server (child processes) --------------------------------------- */

/* srv_send_json: one JSON frame. */
static int srv_send_json(int fd, uint8_t type, const char *json)
{
	struct tt_err err = { 0 };

	return wire_send(fd, type, json, (uint32_t)strlen(json), &err);
}

/* srv_handle: serves operations in sequence on one connection, like the
 * manager: skip stray DATA_IN/EOF_IN, anything but REQUEST ends it. */
static void srv_handle(int fd, struct srv_counts *cnt)
{
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	struct tt_err err = { 0 };
	struct wire_frame f;

	for (;;) {
		int rc = wire_recv(fd, &f, buf, sizeof(buf), &err);
		json_t *req;
		const char *mode;

		if (rc == 0)
			__atomic_add_fetch(&cnt->eofs, 1, __ATOMIC_SEQ_CST);
		if (rc <= 0)
			return;
		if (f.type == WIRE_DATA_IN || f.type == WIRE_EOF_IN)
			continue;
		if (f.type != WIRE_REQUEST)
			return;
		__atomic_add_fetch(&cnt->requests, 1, __ATOMIC_SEQ_CST);
		req = json_loadb((const char *)f.payload, f.len, 0, NULL);
		mode = json_string_value(json_object_get(req, "mode"));
		if (mode == NULL)
			mode = json_string_value(json_object_get(req, "op"));
		if (mode == NULL)
			mode = "allow";
		if (strcmp(mode, "die") == 0) {
			__atomic_add_fetch(&cnt->died, 1, __ATOMIC_SEQ_CST);
			_exit(0);
		}
		if (strcmp(mode, "status") == 0) { /* control: RESULT, close */
			srv_send_json(fd, WIRE_RESULT, "{\"records\":[]}");
			_exit(0);
		}
		if (strcmp(mode, "deny") == 0) {
			srv_send_json(fd, WIRE_DECISION,
			              "{\"decision\":\"deny\",\"reason\":\"test\"}");
			_exit(0);
		}
		if (strcmp(mode, "burst") == 0) {
			/* DECISION, DATA_OUT and RESULT in ONE write: the client
			 * has the RESULT pending when it pauses on the data. */
			static const char dec[] = "{\"decision\":\"allow\"}";
			static const char res[] = "{\"exit_code\":0}";
			uint8_t out[3 * WIRE_HDR_LEN + sizeof(dec) - 1 + 2 + sizeof(res) - 1];
			size_t n = 0;

			wire_hdr_encode(out + n, WIRE_DECISION, sizeof(dec) - 1);
			memcpy(out + n + WIRE_HDR_LEN, dec, sizeof(dec) - 1);
			n += WIRE_HDR_LEN + sizeof(dec) - 1;
			wire_hdr_encode(out + n, WIRE_DATA_OUT, 2);
			memcpy(out + n + WIRE_HDR_LEN, "hi", 2);
			n += WIRE_HDR_LEN + 2;
			wire_hdr_encode(out + n, WIRE_RESULT, sizeof(res) - 1);
			memcpy(out + n + WIRE_HDR_LEN, res, sizeof(res) - 1);
			n += WIRE_HDR_LEN + sizeof(res) - 1;
			if (write(fd, out, n) != (ssize_t)n)
				_exit(1);
			json_decref(req);
			continue;
		}
		srv_send_json(fd, WIRE_DECISION, "{\"decision\":\"allow\"}");
		wire_send(fd, WIRE_DATA_OUT, "hi", 2, &err);
		if (strcmp(mode, "errclose") == 0) { /* as conn_fail, a relay abort */
			srv_send_json(fd, WIRE_ERROR, "{\"error\":\"refresh_route\","
			                              "\"message\":\"x\",\"closing\":true}");
			_exit(0);
		}
		if (strcmp(mode, "error") == 0) {
			srv_send_json(fd, WIRE_ERROR,
			              "{\"error\":\"not_found\",\"message\":\"x\"}");
		} else if (strcmp(mode, "extra") == 0 ||
		           strcmp(mode, "partial") == 0) {
			/* RESULT and a stray frame in ONE write: the client sees
			 * bytes pending right after the RESULT it delivers. */
			static const char res[] = "{\"exit_code\":0}";
			uint8_t out[2 * WIRE_HDR_LEN + sizeof(res)]; /* + 1 payload byte */

			wire_hdr_encode(out, WIRE_RESULT, sizeof(res) - 1);
			memcpy(out + WIRE_HDR_LEN, res, sizeof(res) - 1);
			wire_hdr_encode(out + WIRE_HDR_LEN + sizeof(res) - 1,
			                WIRE_DATA_OUT, 1);
			out[sizeof(out) - 1] = 'x';
			/* "partial": only 5 bytes of the stray frame's header */
			size_t n = mode[0] == 'p' ? WIRE_HDR_LEN + sizeof(res) - 1 + 5
			                          : sizeof(out);

			if (write(fd, out, n) != (ssize_t)n)
				_exit(1);
		} else {
			srv_send_json(fd, WIRE_RESULT, "{\"exit_code\":0}");
		}
		if (strcmp(mode, "linger") == 0) { /* close the now idle conn */
			usleep(100 * 1000);
			_exit(0);
		}
		json_decref(req); /* mode points into req: last use above */
	}
}

/* srv_run: accepts forever; one handler process per connection, killed
 * with the acceptor (PDEATHSIG). */
static void srv_run(int l, struct srv_counts *cnt)
{
	signal(SIGCHLD, SIG_IGN); /* handlers are reaped automatically */
	for (;;) {
		int fd = accept(l, NULL, NULL);

		if (fd < 0)
			continue;
		__atomic_add_fetch(&cnt->accepted, 1, __ATOMIC_SEQ_CST);
		if (fork() == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			close(l);
			srv_handle(fd, cnt);
			_exit(0);
		}
		close(fd);
	}
}

/* ---- client side ---------------------------------------------------------- */

/* One operation as node-api runs it: closes the connection on the end
 * frame (from inside on_frame), on a non-allow DECISION, or on_end. */
struct op {
	struct wireconn *c;
	bool close_on_allow; /* abandon it mid-operation */
	bool pause_on_data;  /* pause at DATA_OUT, resume from a timer */
	uv_timer_t resume;
	bool defer_close;    /* keep it open after the end frame */
	int late_frames;     /* frames after the end frame */
	bool allowed, denied, result, error, ended, finished;
	int data_frames;
	int end_code;
};

/* op_resume_cb: the slow reader caught up. */
static void op_resume_cb(uv_timer_t *t)
{
	struct op *o = t->data;

	if (o->c != NULL)
		wireconn_resume(o->c);
}

/* op_frame: records the frame; closes the connection where api_op.c does. */
static void op_frame(void *arg, const struct wire_frame *f)
{
	struct op *o = arg;
	enum tt_verdict v;
	json_t *obj;

	if (o->finished) {
		o->late_frames++;
		return;
	}
	switch (f->type) {
	case WIRE_DECISION:
		obj = mgrconn_decision(f, &v);
		assert_non_null(obj);
		json_decref(obj);
		if (v == TT_ALLOW && !o->close_on_allow) {
			o->allowed = true;
			return;
		}
		o->denied = v != TT_ALLOW;
		break;
	case WIRE_DATA_OUT:
		o->data_frames++;
		if (o->pause_on_data) {
			/* as node-api does when the HTTP client reads slowly */
			wireconn_pause(o->c);
			uv_timer_start(&o->resume, op_resume_cb, 20, 0);
		}
		return;
	case WIRE_RESULT:
		o->result = true;
		break;
	case WIRE_ERROR:
		o->error = true;
		break;
	default:
		return;
	}
	o->finished = true;
	if (o->defer_close && !o->denied)
		return;
	wireconn_close(o->c);
	o->c = NULL;
}

/* op_end: the connection failed. */
static void op_end(void *arg, const struct tt_err *err)
{
	struct op *o = arg;

	o->ended = true;
	o->end_code = err->code;
	wireconn_close(o->c);
	o->c = NULL;
	o->finished = true;
}

static const struct wireconn_cbs op_cbs = { .on_frame = op_frame,
	                                   .on_end = op_end };

/* op_start: opens one operation with the server behaviour mode. */
static void op_start(struct fixture *fx, struct op *o, const char *mode)
{
	struct tt_err err = { 0 };
	json_t *req = json_pack("{s:s,s:s,s:s,s:s}", "token", "t", "sbx", "s1",
	                        "op", "exec", "mode", mode);

	memset(o, 0, sizeof(*o));
	o->c = wireconn_open(&fx->loop, fx->pool, fx->s.path, req, &op_cbs, o, &err);
	json_decref(req);
	assert_non_null(o->c);
}

/* tick_cb: nothing; the timer only keeps the loop alive. */
static void tick_cb(uv_timer_t *t)
{
	(void)t;
}

/* run_until: turns the loop until *flag or 5 s pass. */
static void run_until(struct fixture *fx, const bool *flag)
{
	uint64_t end = uv_now(&fx->loop) + 5000;

	while (!*flag && uv_now(&fx->loop) < end)
		uv_run(&fx->loop, UV_RUN_ONCE);
	assert_true(*flag);
}

/* run_ms: turns the loop for ms. */
static void run_ms(struct fixture *fx, uint64_t ms)
{
	uint64_t end;

	uv_update_time(&fx->loop);
	end = uv_now(&fx->loop) + ms;
	while (uv_now(&fx->loop) < end)
		uv_run(&fx->loop, UV_RUN_ONCE);
}

/* run_op: one whole operation. */
static void run_op(struct fixture *fx, struct op *o, const char *mode)
{
	op_start(fx, o, mode);
	run_until(fx, &o->finished);
}

/* count: reads a shared counter. */
static int count(const int *p)
{
	return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

/* ---- fixture ----------------------------------------------------------- */

/* fx_setup: listener bound before the fork (no probe connection counts),
 * server child, a private loop (so a private pool). */
static int fx_setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	int l;

	assert_non_null(fx);
	tu_scratch_new(&fx->s, "tt-mgrconn");
	fx->cnt = mmap(NULL, sizeof(*fx->cnt), PROT_READ | PROT_WRITE,
	               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(fx->cnt != MAP_FAILED);
	l = tu_unix_listen(fx->s.path, 64, SOCK_CLOEXEC);
	assert_true(l >= 0);
	fx->srv = fork();
	assert_true(fx->srv >= 0);
	if (fx->srv == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		srv_run(l, fx->cnt);
	}
	close(l);
	assert_int_equal(uv_loop_init(&fx->loop), 0);
	uv_timer_init(&fx->loop, &fx->tick);
	uv_timer_start(&fx->tick, tick_cb, 5, 5);
	fx->pool = uvutil_pool_new(&fx->loop, MGRCONN_POOL_MAX, MGRCONN_IDLE_MS);
	assert_non_null(fx->pool);
	*state = fx;
	return 0;
}

/* fx_teardown: the pool shutdown must leave no handle behind:
 * uv_loop_close fails with EBUSY otherwise. */
static int fx_teardown(void **state)
{
	struct fixture *fx = *state;

	uvutil_pool_free(fx->pool);
	uv_close((uv_handle_t *)&fx->tick, NULL);
	uv_run(&fx->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&fx->loop), 0);
	tu_kill_reap(&fx->srv);
	munmap(fx->cnt, sizeof(*fx->cnt));
	tu_scratch_free(&fx->s);
	free(fx);
	return 0;
}

/* ---- tests ---------------------------------------------------------------- */

/* N sequential operations share one connection; every one succeeds. */
static void test_sequential_one_connection(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	for (int i = 0; i < 10; i++) {
		run_op(fx, &o, i % 3 == 2 ? "error" : "allow");
		assert_false(o.ended);
		assert_int_equal(o.data_frames, 1);
		assert_true(i % 3 == 2 ? o.error : o.result);
		assert_int_equal(uvutil_pool_size(fx->pool), 1);
	}
	assert_int_equal(count(&fx->cnt->accepted), 1);
	assert_int_equal(count(&fx->cnt->requests), 10);
}

/* An operation paused (backpressure) with its RESULT already read ends
 * inside wireconn_resume: the connection goes back to the pool still
 * reading, and the next operation on it is answered (it hung when the
 * pool skipped restarting reads after such a pause). */
static void test_paused_end_keeps_reading(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	memset(&o, 0, sizeof(o));
	uv_timer_init(&fx->loop, &o.resume);
	o.resume.data = &o;
	{
		struct tt_err err = { 0 };
		json_t *req = json_pack("{s:s,s:s,s:s,s:s}", "token", "t", "sbx", "s1",
		                        "op", "exec", "mode", "burst");

		o.pause_on_data = true;
		o.c = wireconn_open(&fx->loop, fx->pool, fx->s.path, req, &op_cbs, &o, &err);
		json_decref(req);
		assert_non_null(o.c);
	}
	run_until(fx, &o.finished);
	assert_true(o.result);
	assert_int_equal(o.data_frames, 1);
	assert_int_equal(uvutil_pool_size(fx->pool), 1);
	uv_close((uv_handle_t *)&o.resume, NULL);
	for (int i = 0; i < 3; i++) {
		struct op next;

		run_op(fx, &next, "allow");
		assert_true(next.result);
	}
	assert_int_equal(count(&fx->cnt->accepted), 1);
	assert_int_equal(count(&fx->cnt->requests), 4);
}

/* A deny DECISION ends the connection: the next op connects anew (and
 * works); so does an op whose user abandoned it after the allow. */
static void test_deny_and_abandon_not_reused(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	run_op(fx, &o, "allow");
	assert_int_equal(count(&fx->cnt->accepted), 1);
	run_op(fx, &o, "deny"); /* takes the pooled connection */
	assert_true(o.denied);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);
	run_op(fx, &o, "allow");
	assert_true(o.result);
	assert_int_equal(count(&fx->cnt->accepted), 2);

	op_start(fx, &o, "allow");
	o.close_on_allow = true; /* user leaves before the RESULT */
	run_until(fx, &o.finished);
	assert_false(o.result);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);
	run_op(fx, &o, "allow");
	assert_true(o.result);
	assert_int_equal(count(&fx->cnt->accepted), 3);
	assert_int_equal(count(&fx->cnt->requests), 5);
}

/* Bytes right behind the RESULT (same read) make the connection unfit,
 * even though the user closes inside on_frame of that RESULT. */
static void test_bytes_after_result_not_reused(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	run_op(fx, &o, "extra");
	assert_true(o.result);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);
	run_op(fx, &o, "allow");
	assert_true(o.result);
	assert_int_equal(count(&fx->cnt->accepted), 2);
	/* honest path: that clean one is pooled and reused */
	run_op(fx, &o, "allow");
	assert_int_equal(count(&fx->cnt->accepted), 2);
}

/* The user closes later, outside on_frame: a frame that came after the
 * RESULT meanwhile rules out reuse; without one the connection is reused. */
static void test_late_close(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	op_start(fx, &o, "extra");
	o.defer_close = true;
	run_until(fx, &o.finished);
	run_ms(fx, 50);
	assert_int_equal(o.late_frames, 1);
	wireconn_close(o.c);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);

	op_start(fx, &o, "partial"); /* half a header stays in the reader */
	o.defer_close = true;
	run_until(fx, &o.finished);
	run_ms(fx, 50);
	assert_int_equal(o.late_frames, 0);
	wireconn_close(o.c);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);

	op_start(fx, &o, "allow");
	o.defer_close = true;
	run_until(fx, &o.finished);
	run_ms(fx, 50);
	assert_int_equal(o.late_frames, 0);
	wireconn_close(o.c);
	assert_int_equal(uvutil_pool_size(fx->pool), 1);
	run_op(fx, &o, "allow");
	assert_true(o.result);
	assert_int_equal(count(&fx->cnt->accepted), 3);
}

/* The server closes an idle connection: the pool notices (EOF while idle)
 * and drops it; the next op connects anew and succeeds. */
static void test_idle_closed_by_server_dropped(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	run_op(fx, &o, "linger");
	assert_true(o.result);
	assert_int_equal(uvutil_pool_size(fx->pool), 1);
	run_ms(fx, 400);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);
	run_op(fx, &o, "allow");
	assert_true(o.result);
	assert_false(o.ended);
	assert_int_equal(count(&fx->cnt->accepted), 2);
}

/* The server dies after reading the REQUEST sent on a pooled connection:
 * on_end with a transport error, and no resend (one "die" REQUEST). */
static void test_dead_pooled_no_retry(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	run_op(fx, &o, "allow");
	run_op(fx, &o, "die");
	assert_true(o.ended);
	assert_int_equal(o.end_code, TT_ERR_TRANSPORT);
	assert_false(o.allowed);
	run_ms(fx, 100);
	assert_int_equal(count(&fx->cnt->died), 1);
	assert_int_equal(count(&fx->cnt->requests), 2);
	assert_int_equal(count(&fx->cnt->accepted), 1);
	run_op(fx, &o, "allow");
	assert_true(o.result);
	assert_int_equal(count(&fx->cnt->accepted), 2);
}

/* Concurrent operations use separate connections; at most 4 stay idle and
 * later sequential operations reuse them without connecting. */
static void test_concurrent_and_bound(void **state)
{
	struct fixture *fx = *state;
	struct op ops[6];

	for (int i = 0; i < 6; i++)
		op_start(fx, &ops[i], "allow");
	for (int i = 0; i < 6; i++) {
		run_until(fx, &ops[i].finished);
		assert_true(ops[i].result);
	}
	assert_int_equal(count(&fx->cnt->accepted), 6);
	assert_int_equal(uvutil_pool_size(fx->pool), MGRCONN_POOL_MAX);
	run_ms(fx, 50);
	assert_int_equal(count(&fx->cnt->eofs), 2); /* the two closed ones */
	for (int i = 0; i < 4; i++)
		op_start(fx, &ops[i], "allow");
	assert_int_equal(uvutil_pool_size(fx->pool), 0);
	for (int i = 0; i < 4; i++) {
		run_until(fx, &ops[i].finished);
		assert_true(ops[i].result);
	}
	assert_int_equal(count(&fx->cnt->accepted), 6);
	assert_int_equal(count(&fx->cnt->requests), 10);
}

/* An idle connection is closed after the idle timeout. */
static void test_idle_timeout(void **state)
{
	struct fixture *fx = *state;
	struct op o;

	uvutil_pool_free(fx->pool);
	fx->pool = uvutil_pool_new(&fx->loop, MGRCONN_POOL_MAX, 100);
	run_op(fx, &o, "allow");
	assert_int_equal(uvutil_pool_size(fx->pool), 1);
	run_ms(fx, 300);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);
	assert_int_equal(count(&fx->cnt->eofs), 1); /* the server saw it go */
	run_op(fx, &o, "allow");
	assert_true(o.result);
	assert_int_equal(count(&fx->cnt->accepted), 2);
}

/* call_done: a control call's answer. */
static void call_done(void *arg, json_t *result, const struct tt_err *err)
{
	int *n = arg;

	assert_null(err);
	assert_non_null(json_object_get(result, "records"));
	json_decref(result);
	(*n)++;
}

/* Control calls never take a pooled connection and are never pooled. */
static void test_control_calls_not_pooled(void **state)
{
	struct fixture *fx = *state;
	struct tt_err err = { 0 };
	json_t *req = json_pack("{s:s}", "op", "status");
	struct node n = { .loop = &fx->loop, .mgr_pool = fx->pool };
	struct op o;
	int done = 0;

	snprintf(n.sock_path, sizeof(n.sock_path), "%s", fx->s.path);
	run_op(fx, &o, "allow");
	assert_int_equal(uvutil_pool_size(fx->pool), 1);
	for (int i = 0; i < 2; i++) {
		int want = i + 1;

		assert_int_equal(mgrconn_call(&n, req, call_done, &done, &err), 0);
		while (done < want)
			uv_run(&fx->loop, UV_RUN_ONCE);
	}
	json_decref(req);
	assert_int_equal(count(&fx->cnt->accepted), 3);
	assert_int_equal(uvutil_pool_size(fx->pool), 1);
	run_op(fx, &o, "allow"); /* the exec connection is still there */
	assert_int_equal(count(&fx->cnt->accepted), 3);
}

/* An unreachable manager: on_end TT_ERR_IO, as before pooling. */
static void test_unreachable(void **state)
{
	struct fixture *fx = *state;
	struct tt_err err = { 0 };
	json_t *req = json_pack("{s:s}", "op", "exec");
	struct op o;

	memset(&o, 0, sizeof(o));
	o.c = wireconn_open(&fx->loop, fx->pool, "/nonexistent/tt-mgr.sock", req,
	                    &op_cbs, &o, &err);
	json_decref(req);
	assert_non_null(o.c);
	run_until(fx, &o.finished);
	assert_true(o.ended);
	assert_int_equal(o.end_code, TT_ERR_IO);
}

/* test_error_closing: the manager answers Allow, then an ERROR it closes
 * after: not pooled, so the next operation gets a connection that works
 * (before, it took the closing one and failed with transport). */
static void test_error_closing(void **state)
{
	struct fixture *fx = *state;
	struct op o, o2;

	run_op(fx, &o, "errclose");
	assert_true(o.error);
	assert_int_equal(uvutil_pool_size(fx->pool), 0);
	run_op(fx, &o2, "allow");
	assert_true(o2.result);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_paused_end_keeps_reading, fx_setup,
		                                fx_teardown),
		cmocka_unit_test_setup_teardown(test_sequential_one_connection, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_deny_and_abandon_not_reused, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_bytes_after_result_not_reused, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_late_close, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_idle_closed_by_server_dropped, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_dead_pooled_no_retry, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_concurrent_and_bound, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_idle_timeout, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_control_calls_not_pooled, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_error_closing, fx_setup, fx_teardown),
		cmocka_unit_test_setup_teardown(test_unreachable, fx_setup, fx_teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Tests of lib/unixaddr (unix sockets at paths of any length) and what is
 * built on it: uvutil_listen / uvutil_pipe_connect (the manager's and the
 * bridge's servers, node-api's and the manager's clients) and the
 * bridge's check-then-connect through an O_PATH fd of the socket file
 * (verify_listener_fd_nl). Paths past sun_path's 108 bytes are the point:
 * before, they failed ("bridge socket path too long"), or libuv cut them
 * short and connected to whatever the prefix named. Real sockets, real
 * processes; the sock_diag check needs root (else skipped). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "procid.h"
#include "sockdiag.h"
#include "testutil.h"
#include "unixaddr.h"
#include "uvutil.h"

/* A scratch directory whose path is about 300 bytes long. */
static char top[64], deep[1024];

/* setup: top = /tmp/tt-unixaddr.XXXXXX, deep = three 90-byte levels in it. */
static int setup(void **state)
{
	(void)state;
	snprintf(top, sizeof(top), "/tmp/tt-unixaddr.XXXXXX");
	if (mkdtemp(top) == NULL)
		return -1;
	snprintf(deep, sizeof(deep), "%s", top);
	for (int i = 0; i < 3; i++) {
		size_t len = strlen(deep);

		deep[len++] = '/';
		memset(deep + len, 'a' + i, 90);
		deep[len + 90] = '\0';
		if (mkdir(deep, 0755) < 0)
			return -1;
	}
	return strlen(deep) > 250 ? 0 : -1;
}

/* teardown: the scratch tree goes. */
static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
	return system(cmd) == 0 ? 0 : -1;
}

/* at: deep/name. */
static const char *at(const char *name)
{
	static char path[PATH_MAX];

	snprintf(path, sizeof(path), "%.1023s/%.64s", deep, name);
	return path;
}

/* accept_one: accepts a pending connection on l within 2 s (-1 if none). */
static int accept_one(int l, int ms)
{
	struct pollfd pf = { .fd = l, .events = POLLIN };

	if (poll(&pf, 1, ms) != 1)
		return -1;
	return accept4(l, NULL, NULL, SOCK_CLOEXEC);
}

/* Bind and connect at a 300-byte path; a short path is used as it is. */
static void test_long_path(void **state)
{
	struct tt_err err = { 0 };
	struct unixaddr ua;
	struct stat st;
	int l, c, a;

	(void)state;
	assert_true(strlen(at("s.sock")) >= sizeof(ua.sa.sun_path));
	l = unixaddr_bind(at("s.sock"), &err);
	if (l < 0)
		fail_msg("bind: %s", err.msg);
	assert_int_equal(listen(l, 4), 0);
	assert_int_equal(lstat(at("s.sock"), &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0600);
	c = unixaddr_connect(at("s.sock"), 1000, &err);
	if (c < 0)
		fail_msg("connect: %s", err.msg);
	a = accept_one(l, 2000);
	assert_true(a >= 0);
	assert_int_equal(write(c, "x", 1), 1);
	{
		char b;

		assert_int_equal(read(a, &b, 1), 1);
		assert_int_equal(b, 'x');
	}
	close(a);
	close(c);
	/* A stale file is replaced by the next bind. */
	close(l);
	l = unixaddr_bind(at("s.sock"), &err);
	assert_true(l >= 0);
	close(l);
	/* Nothing there: ENOENT, no truncated name reached. */
	assert_int_equal(unixaddr_connect(at("none.sock"), 1000, &err), -1);
	assert_int_equal(errno, ENOENT);
	/* Short paths go as they are. */
	assert_int_equal(unixaddr_dir("/tmp/x.sock", &ua, &err), 0);
	assert_int_equal(ua.fd, -1);
	assert_string_equal(ua.sa.sun_path, "/tmp/x.sock");
	unixaddr_done(&ua);
	/* A long one goes through its directory's fd. */
	assert_int_equal(unixaddr_dir(at("s.sock"), &ua, &err), 0);
	assert_true(ua.fd >= 0);
	assert_int_equal(strncmp(ua.sa.sun_path, "/proc/self/fd/", 14), 0);
	unixaddr_done(&ua);
	assert_int_equal(ua.fd, -1);
	/* A directory that is not there. */
	assert_int_equal(unixaddr_dir(at("nodir/s.sock"), &ua, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	unlink(at("s.sock"));
}

/* The uv loop's side of a connection test. */
struct uvt {
	uv_pipe_t server, client;
	uv_connect_t req;
	int status;      /* the connect callback's, 1 until it ran */
	int accepted;
};

/* uvt_on_conn: accepts one and stops listening. */
static void uvt_on_conn(uv_stream_t *s, int status)
{
	struct uvt *t = s->data;
	uv_pipe_t *p = uvutil_accept(s, s->loop);

	(void)status;
	if (p != NULL) {
		t->accepted++;
		uv_close((uv_handle_t *)p, (uv_close_cb)free);
	}
	uv_close((uv_handle_t *)&t->server, NULL);
}

/* uvt_on_connect: records the status, closes the client. */
static void uvt_on_connect(uv_connect_t *req, int status)
{
	struct uvt *t = req->data;

	t->status = status;
	uv_close((uv_handle_t *)&t->client, NULL);
}

/* uvutil_listen and uvutil_pipe_connect at a 300-byte path: connected and
 * accepted; the socket file is left for its owner to remove. A socket that
 * is not there fails in the callback with ENOENT, as with libuv's own. */
static void test_uv_long_path(void **state)
{
	struct tt_err err = { 0 };
	uv_loop_t loop;
	struct uvt t = { .status = 1 };
	struct stat st;

	(void)state;
	assert_int_equal(uv_loop_init(&loop), 0);
	if (uvutil_listen(&loop, &t.server, at("uv.sock"), 8, uvt_on_conn, &t, &err) < 0)
		fail_msg("listen: %s", err.msg);
	assert_int_equal(uv_pipe_init(&loop, &t.client, 0), 0);
	t.req.data = &t;
	uvutil_pipe_connect(&t.req, &t.client, at("uv.sock"), uvt_on_connect);
	assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
	assert_int_equal(t.status, 0);
	assert_int_equal(t.accepted, 1);
	assert_int_equal(lstat(at("uv.sock"), &st), 0);
	assert_int_equal(unlink(at("uv.sock")), 0);

	t.status = 1;
	assert_int_equal(uv_pipe_init(&loop, &t.client, 0), 0);
	uvutil_pipe_connect(&t.req, &t.client, at("uv.sock"), uvt_on_connect);
	assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
	assert_int_equal(t.status, UV_ENOENT);
	t.status = 1;
	assert_int_equal(uv_pipe_init(&loop, &t.client, 0), 0);
	uvutil_pipe_connect(&t.req, &t.client, at("nodir/uv.sock"), uvt_on_connect);
	assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
	assert_int_equal(t.status, UV_ENOENT);
	assert_int_equal(uv_loop_close(&loop), 0);
}

/* A connect through unixaddr_file reaches the socket file that was
 * opened, even after the name was taken by another listener; a symlink
 * is refused, not followed. */
static void test_file_fd(void **state)
{
	struct tt_err err = { 0 };
	struct unixaddr ua;
	int a1, a2, l1, l2, c;

	(void)state;
	l1 = unixaddr_bind(at("g.sock"), &err);
	assert_true(l1 >= 0);
	assert_int_equal(listen(l1, 4), 0);
	assert_int_equal(unixaddr_file(at("g.sock"), &ua, &err), 0);
	/* Replaced under the name. */
	assert_int_equal(rename(at("g.sock"), at("old.sock")), 0);
	l2 = unixaddr_bind(at("g.sock"), &err);
	assert_true(l2 >= 0);
	assert_int_equal(listen(l2, 4), 0);
	c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(c, (struct sockaddr *)&ua.sa, sizeof(ua.sa)), 0);
	unixaddr_done(&ua);
	a1 = accept_one(l1, 2000);
	a2 = accept_one(l2, 200);
	assert_true(a1 >= 0);
	assert_int_equal(a2, -1);
	close(a1);
	close(c);
	/* A symlink planted at the name. */
	assert_int_equal(unlink(at("g.sock")), 0);
	{
		char target[PATH_MAX];

		snprintf(target, sizeof(target), "%s", at("old.sock"));
		assert_int_equal(symlink(target, at("g.sock")), 0);
	}
	assert_int_equal(unixaddr_file(at("g.sock"), &ua, &err), -1);
	assert_int_equal(errno, ELOOP);
	close(l1);
	close(l2);
	unlink(at("g.sock"));
	unlink(at("old.sock"));
}

/* listen_child: a child listening at path (bound here, listen() called
 * by the child: SO_PEERCRED names the process that listened); it exits
 * when the pipe *stop_wr closes. */
static pid_t listen_child(const char *path, int *stop_wr)
{
	struct tt_err err = { 0 };
	int l = unixaddr_bind(path, &err), p[2], ready[2];
	pid_t pid;
	char b;

	assert_true(l >= 0);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[1]);
		close(ready[0]);
		if (listen(l, 4) < 0 || write(ready[1], "r", 1) != 1)
			_exit(1);
		while (read(p[0], &b, 1) > 0)
			;
		_exit(0);
	}
	close(l);
	close(p[0]);
	close(ready[1]);
	assert_int_equal(read(ready[0], &b, 1), 1);
	close(ready[0]);
	*stop_wr = p[1];
	return pid;
}

/* The bridge's check (verify_listener_fd_nl) at a 300-byte path: the
 * honest listener passes and is reached through the checked fd; a
 * replacement is refused, whether the fd was opened before it came or
 * after. */
static void test_verify_fd(void **state)
{
	struct proc_identity exp;
	struct tt_err err = { 0 };
	struct unixaddr ua, before;
	int nl, stop1, stop2, c;
	pid_t p1, p2;

	(void)state;
	tu_skip_unless_root();
	nl = sockdiag_open_in_netns(-1, NULL, &err);
	assert_true(nl >= 0);
	p1 = listen_child(at("v.sock"), &stop1);
	assert_int_equal(proc_identity_read(p1, &exp, &err), 0);
	assert_int_equal(unixaddr_file(at("v.sock"), &ua, &err), 0);
	if (verify_listener_fd_nl(ua.fd, at("v.sock"), nl, &exp, &err) != 0)
		fail_msg("honest listener refused: %s", err.msg);
	c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(c, (struct sockaddr *)&ua.sa, sizeof(ua.sa)), 0);
	assert_int_equal(verify_peer(c, &exp, &err), 0);
	close(c);
	assert_int_equal(unixaddr_file(at("v.sock"), &before, &err), 0);
	unixaddr_done(&ua);

	/* Another process takes the name (p1 lives on). */
	p2 = listen_child(at("v.sock"), &stop2);
	assert_int_equal(unixaddr_file(at("v.sock"), &ua, &err), 0);
	assert_int_equal(verify_listener_fd_nl(ua.fd, at("v.sock"), nl, &exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	assert_non_null(strstr(err.msg, "not held by expected pid"));
	unixaddr_done(&ua);
	assert_int_equal(verify_listener_fd_nl(before.fd, at("v.sock"), nl, &exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	if (strstr(err.msg, "replaced during check") == NULL)
		fail_msg("refused for %s", err.msg);
	unixaddr_done(&before);
	close(stop1);
	close(stop2);
	waitpid(p1, NULL, 0);
	waitpid(p2, NULL, 0);
	close(nl);
	unlink(at("v.sock"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_long_path),
		cmocka_unit_test(test_uv_long_path),
		cmocka_unit_test(test_file_fd),
		cmocka_unit_test(test_verify_fd),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, setup, teardown);
}

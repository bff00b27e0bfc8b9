/* Tests of lib/sockdiag (kernel socket evidence, SPEC §5) against real
 * listener processes: the listener at a path found by sock_diag and mapped
 * to its owner, a replaced listener refused (owner alive or dead), a socket
 * file with the wrong owner refused, and network-namespace scoping. Refused
 * listeners report how many bytes they received (must be 0); each refusal
 * is paired with the honest listener passing. Needs root (else skipped). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "procid.h"
#include "sockdiag.h"
#include "testutil.h"

#define L_NEWNET  1 /* listener unshares a network namespace first */
#define L_REPLACE 2 /* listener unlinks the path first (a replacement) */

/* listener_run: child body: binds path (per flags), says ready, accepts one
 * connection within 10 s and exits with the bytes it received. */
static _Noreturn void listener_run(const char *path, int flags, int ready_wr)
{
	struct pollfd pf;
	int l, a;

	/* Privileged: a network namespace of its own, as a sandbox has. */
	if ((flags & L_NEWNET) && unshare(CLONE_NEWNET) < 0)
		_exit(250);
	if (flags & L_REPLACE)
		unlink(path);
	if ((l = tu_unix_listen(path, 8, SOCK_CLOEXEC)) < 0)
		_exit(251);
	if (write(ready_wr, "r", 1) != 1)
		_exit(252);
	pf = (struct pollfd){ .fd = l, .events = POLLIN };
	if (poll(&pf, 1, 10000) != 1 || (a = accept(l, NULL, NULL)) < 0)
		_exit(253);
	_exit(tu_count_until_eof(a));
}

/* spawn_listener: forks a listener_run child and waits until it listens. */
static pid_t spawn_listener(const char *path, int flags)
{
	int rd[2];
	char c;
	pid_t p;

	assert_int_equal(pipe2(rd, O_CLOEXEC), 0);
	p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		close(rd[0]);
		listener_run(path, flags, rd[1]);
	}
	close(rd[1]);
	struct pollfd pf = { .fd = rd[0], .events = POLLIN };
	assert_int_equal(poll(&pf, 1, 3000), 1);
	assert_int_equal(read(rd[0], &c, 1), 1);
	close(rd[0]);
	return p;
}

/* stop: kills and reaps pid. */
static void stop(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* expect_refused: verify_listener refuses with a message containing why. */
static void expect_refused(const char *path, int netns_fd,
                           const struct proc_identity *exp, const char *why)
{
	struct tt_err err = { 0 };

	assert_int_equal(verify_listener(path, netns_fd, exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	if (strstr(err.msg, why) == NULL)
		fail_msg("refused for '%s', expected '%s'", err.msg, why);
}

/* expect_passes: verify_listener accepts. */
static void expect_passes(const char *path, int netns_fd,
                          const struct proc_identity *exp)
{
	struct tt_err err = { 0 };

	if (verify_listener(path, netns_fd, exp, &err) != 0)
		fail_msg("honest listener refused: %s", err.msg);
}

/* ---- tests ------------------------------------------------------------ */

/* The kernel-internal dev_t encoding (major << 20 | minor). */
static void test_kdev(void **state)
{
	(void)state;
	assert_int_equal(sockdiag_kdev(makedev(8, 1)), (8u << 20) | 1u);
	assert_int_equal(sockdiag_kdev(makedev(259, 0x12345)), (259u << 20) | 0x12345u);
	assert_int_equal(sockdiag_kdev(makedev(0, 27)), 27u);
}

/* The listener at a path is found by sock_diag (file inode + converted
 * dev) and mapped to the process holding it, and only that one. */
static void test_listener_found_and_owned(void **state)
{
	struct tu_scratch s;
	struct unix_listener_info info;
	struct tt_err err = { 0 };
	struct stat st;
	pid_t p;
	int fd;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-sockdiag");
	p = spawn_listener(s.path, 0);
	assert_int_equal(stat(s.path, &st), 0);
	if (sockdiag_unix_listener(s.path, &info, &err) != 0)
		fail_msg("listener not found: %s", err.msg);
	assert_int_equal(info.vfs_ino, (uint32_t)st.st_ino);
	assert_int_equal(info.vfs_dev, sockdiag_kdev(st.st_dev));
	assert_int_equal(info.state, 10);
	assert_string_equal(info.name, s.path);
	assert_true(info.has_uid);
	assert_int_equal(info.uid, 0);
	assert_true(info.ino != 0 && info.ino != (uint32_t)st.st_ino);
	assert_int_equal(sockdiag_inode_owned_by(p, info.ino, &err), 0);
	assert_int_equal(sockdiag_inode_owned_by(getpid(), info.ino, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	stop(p);
	/* Its file remains, but nothing listens on it now. */
	assert_int_equal(sockdiag_unix_listener(s.path, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	/* Bound but not listening: not a listener either. */
	unlink(s.path);
	assert_true((fd = tu_unix_listen(s.path, 0, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(sockdiag_unix_listener(s.path, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	close(fd);
	/* Not a socket at all. */
	assert_int_equal(sockdiag_unix_listener("/proc/self/stat", &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_INVALID);
	tu_scratch_free(&s);
}

/* A listener replaced at the same path is refused, whether the expected
 * owner is still alive or dead; a client that checks the connected peer
 * first sends the impostor nothing; the honest listener passes. */
static void test_listener_replaced(void **state)
{
	struct tu_scratch s;
	struct proc_identity exp1, exp3;
	struct tt_err err = { 0 };
	pid_t l1, l2, l3;
	int c;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-sockdiag");
	l1 = spawn_listener(s.path, 0);
	assert_int_equal(proc_identity_read(l1, &exp1, &err), 0);
	expect_passes(s.path, -1, &exp1);

	/* An impostor unlinks and rebinds the path while l1 lives on. */
	l2 = spawn_listener(s.path, L_REPLACE);
	expect_refused(s.path, -1, &exp1, "not held by expected pid");
	assert_true((c = tu_unix_connect(s.path, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(verify_peer(c, &exp1, &err), -1);
	assert_non_null(strstr(err.msg, "peer pid differs"));
	close(c); /* refused: nothing written */
	assert_int_equal(tu_exit_code(l2), 0);

	/* The expected owner dies; another listener takes the path. */
	stop(l1);
	l3 = spawn_listener(s.path, L_REPLACE);
	expect_refused(s.path, -1, &exp1, "listener owner exited");

	/* l3 is the honest one for its own expectation. */
	assert_int_equal(proc_identity_read(l3, &exp3, &err), 0);
	expect_passes(s.path, -1, &exp3);
	/* ... but not if its socket file has another owner. */
	assert_int_equal(chown(s.path, 65534, 65534), 0);
	expect_refused(s.path, -1, &exp3, "socket file owner differs");
	assert_int_equal(chown(s.path, 0, 0), 0);
	expect_passes(s.path, -1, &exp3);
	assert_true((c = tu_unix_connect(s.path, SOCK_CLOEXEC)) >= 0);
	if (verify_peer(c, &exp3, &err) != 0)
		fail_msg("honest listener refused as peer: %s", err.msg);
	assert_int_equal(write(c, "hello", 5), 5);
	close(c);
	assert_int_equal(tu_exit_code(l3), 5);
	tu_scratch_free(&s);
}

/* sock_diag is scoped to the caller's network namespace: a listener in
 * another netns is invisible from here and found from inside it. */
static void test_netns_scope(void **state)
{
	struct tu_scratch s;
	struct unix_listener_info info;
	struct proc_identity exp;
	struct tt_err err = { 0 };
	char nspath[64];
	int nsfd;
	pid_t p;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-sockdiag");
	p = spawn_listener(s.path, L_NEWNET);
	assert_int_equal(proc_identity_read(p, &exp, &err), 0);
	assert_int_equal(sockdiag_unix_listener(s.path, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	expect_refused(s.path, -1, &exp, "no listener bound");

	snprintf(nspath, sizeof(nspath), "/proc/%d/ns/net", (int)p);
	assert_true((nsfd = open(nspath, O_RDONLY | O_CLOEXEC)) >= 0);
	if (sockdiag_unix_listener_in_netns(nsfd, s.path, &info, &err) != 0)
		fail_msg("not found in its netns: %s", err.msg);
	assert_int_equal(sockdiag_inode_owned_by(p, info.ino, &err), 0);
	expect_passes(s.path, nsfd, &exp);
	/* Our own thread stayed in the host namespace. */
	assert_int_equal(sockdiag_unix_listener(s.path, &info, &err), -1);
	/* A bad namespace fd is an error, not a pass. */
	assert_int_equal(sockdiag_unix_listener_in_netns(0 + 1000, s.path, &info, &err), -1);
	close(nsfd);
	stop(p);
	tu_scratch_free(&s);
}

/* main: runs the suite. */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kdev),
		cmocka_unit_test(test_listener_found_and_owned),
		cmocka_unit_test(test_listener_replaced),
		cmocka_unit_test(test_netns_scope),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

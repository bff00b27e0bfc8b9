/* Tests of lib/procid (process identity evidence, SPEC §5) against real
 * processes: pid reuse inside a fresh pid namespace (clone3 set_tid), an
 * execve() at the same pid, a peer with the wrong uid, exited peers. Every
 * refusal is paired with the honest peer passing, and refused peers report
 * how many bytes they received (must be 0). Needs root (skipped otherwise). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "procid.h"
#include "refusal.h"
#include "testutil.h"

/* ---- helpers ---------------------------------------------------------- */

/* peer_run: child body: connect to path and exit with the number of bytes
 * received before EOF (255: could not connect). */
static _Noreturn void peer_run(const char *path)
{
	int fd = tu_unix_connect(path, 0);

	if (fd < 0)
		_exit(255);
	_exit(tu_count_until_eof(fd));
}

/* gate_wait: child side: blocks until the parent writes one byte. */
static void gate_wait(int fd)
{
	char c;

	if (read(fd, &c, 1) != 1)
		_exit(254);
}

/* gate_open: parent side: lets the child go. */
static void gate_open(int fd)
{
	assert_int_equal(write(fd, "g", 1), 1);
}

/* ---- the parser ------------------------------------------------------- */

/* parse_ok: buf parses to want. */
static void parse_ok(const char *buf, unsigned long long want)
{
	struct tt_err err = { 0 };
	unsigned long long v = 0;

	if (proc_stat_parse_start_time(buf, strlen(buf), &v, &err) != 0)
		fail_msg("'%s' refused: %s", buf, err.msg);
	assert_true(v == want);
}

/* parse_bad: buf[0..len) is refused as malformed. */
static void parse_bad(const char *buf, size_t len)
{
	struct tt_err err = { 0 };
	unsigned long long v = 0;

	assert_int_equal(proc_stat_parse_start_time(buf, len, &v, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
}

/* parse_bad_str: the NUL-terminated s is refused as malformed. */
static void parse_bad_str(const char *s)
{
	parse_bad(s, strlen(s));
}

#define STAT_TAIL " S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 "

/* Field 22 after the last ')', with hostile comm values. */
static void test_stat_parser(void **state)
{
	(void)state;
	parse_ok("1234 (sleep)" STAT_TAIL "98765 4096 100 0\n", 98765);
	/* comm with spaces and parentheses, including a fake tail. */
	parse_ok("77 (a) S 1 2 3 (x y)" STAT_TAIL "42 9 9\n", 42);
	parse_ok("77 ()))" STAT_TAIL "18446744073709551615 1\n",
	         18446744073709551615ULL);
	/* The last field, without newline or trailing space. */
	parse_ok("5 (z)" STAT_TAIL "7", 7);
	parse_bad("", 0);
	parse_bad_str("1234 sleep S 1 2 3");
	parse_bad_str("1 (a) S 1 2 3\n"); /* too few */
	parse_bad_str("1 (a)" STAT_TAIL "18446744073709551616 1"); /* overflow */
	parse_bad_str("1 (a)" STAT_TAIL "-5 1\n");
	parse_bad_str("1 (a)" STAT_TAIL "12x 1\n");
	parse_bad_str("1 (a)" STAT_TAIL " 12 1\n");
	/* Bounded by len, not by a NUL: the digits past len are not read. */
	{
		const char *s = "9 (q)" STAT_TAIL "123 1\n";
		size_t cut = strlen("9 (q)" STAT_TAIL);
		struct tt_err err = { 0 };
		unsigned long long v = 0;

		assert_int_equal(proc_stat_parse_start_time(s, cut, &v, &err), -1);
		assert_int_equal(proc_stat_parse_start_time(s, cut + 2, &v, &err), 0);
		assert_true(v == 12);
	}
}

/* proc_identity_read of ourselves, equality and the diff order. */
static void test_identity_self(void **state)
{
	struct proc_identity a, b;
	struct tt_err err = { 0 };
	struct stat st;

	(void)state;
	assert_int_equal(proc_identity_read(getpid(), &a, &err), 0);
	assert_int_equal(stat("/proc/self/exe", &st), 0);
	assert_int_equal(a.pid, getpid());
	assert_int_equal(a.uid, geteuid());
	assert_int_equal(a.gid, getegid());
	assert_true(a.exe_dev == st.st_dev && a.exe_ino == st.st_ino);
	assert_true(a.start_time > 0);
	assert_int_equal(proc_identity_read(getpid(), &b, &err), 0);
	assert_true(proc_identity_equal(&a, &b));
	assert_null(proc_identity_diff(&a, &b));
	b.uid++;
	assert_string_equal(proc_identity_diff(&a, &b), "uid");
	b.exe_ino++;
	assert_string_equal(proc_identity_diff(&a, &b), "exe");
	b.start_time++;
	assert_string_equal(proc_identity_diff(&a, &b), "start_time");
	b.pid++;
	assert_string_equal(proc_identity_diff(&a, &b), "pid");
	assert_false(proc_identity_equal(&a, &b));
	/* A pid that cannot exist. */
	assert_int_equal(proc_identity_read(4194304 + 7, &b, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
}

/* An honest peer passes (with SO_PEERPIDFD on this kernel); a live peer
 * that is not the expected process is refused and receives nothing. */
static void test_peer_honest_and_other(void **state)
{
	struct tu_scratch s;
	struct proc_identity exp, other;
	struct tt_err err = { 0 };
	int l, a, gate[2], pidfd = -1;
	bool exact = false;
	pid_t p;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-procid");
	assert_true((l = tu_unix_listen(s.path, 8, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(pipe2(gate, O_CLOEXEC), 0);
	p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		gate_wait(gate[0]);
		peer_run(s.path);
	}
	assert_int_equal(proc_identity_read(p, &exp, &err), 0);
	gate_open(gate[1]);
	assert_true((a = tu_accept_within(l, 3000)) >= 0);
	/* Someone else (ourselves) expected: refused, nothing written. */
	assert_int_equal(proc_identity_read(getpid(), &other, &err), 0);
	assert_int_equal(verify_peer(a, &other, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	assert_non_null(strstr(err.msg, "peer pid differs"));
	assert_int_equal(refusal_of(&err), REFUSAL_WRONG_PEER);
	/* The expected one passes; the kernel hands the exact pidfd. */
	if (verify_peer(a, &exp, &err) != 0)
		fail_msg("honest peer refused: %s", err.msg);
	assert_int_equal(peer_identity(a, &other, &pidfd, &exact, &err), 0);
	{
		/* exact iff the kernel has SO_PEERPIDFD (6.5+; this one does). */
		int probe = -1;
		socklen_t plen = sizeof(probe);
		bool has = getsockopt(a, SOL_SOCKET, SO_PEERPIDFD, &probe, &plen) == 0;

		if (probe >= 0)
			close(probe);
		assert_true(exact == has);
	}
	assert_true(pidfd >= 0);
	assert_true(proc_identity_equal(&exp, &other));
	assert_int_equal(procid_pidfd_alive(pidfd, &err), 1);
	assert_int_equal(write(a, "hello", 5), 5);
	close(a);
	assert_int_equal(tu_exit_code(p), 5);
	/* The pidfd now tells the peer is gone. */
	assert_int_equal(procid_pidfd_alive(pidfd, &err), 0);
	close(pidfd);
	close(gate[0]);
	close(gate[1]);
	close(l);
	tu_scratch_free(&s);
}

/* A peer that exited (zombie, then reaped) is refused as "peer exited",
 * although SO_PEERCRED still reports its pid. */
static void test_peer_exited(void **state)
{
	struct tu_scratch s;
	struct proc_identity exp;
	struct tt_err err = { 0 };
	struct ucred cr;
	socklen_t len = sizeof(cr);
	int l, a, gate[2], pidfd;
	pid_t p;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-procid");
	assert_true((l = tu_unix_listen(s.path, 8, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(pipe2(gate, O_CLOEXEC), 0);
	p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		gate_wait(gate[0]);
		if (tu_unix_connect(s.path, 0) < 0)
			_exit(255);
		_exit(0);
	}
	assert_int_equal(proc_identity_read(p, &exp, &err), 0);
	pidfd = (int)syscall(SYS_pidfd_open, p, 0);
	assert_true(pidfd >= 0);
	gate_open(gate[1]);
	assert_true((a = tu_accept_within(l, 3000)) >= 0);
	/* Wait until it has exited (zombie, not reaped yet). */
	struct pollfd pf = { .fd = pidfd, .events = POLLIN };
	assert_int_equal(poll(&pf, 1, 3000), 1);
	assert_int_equal(verify_peer(a, &exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	if (strstr(err.msg, "peer exited") == NULL)
		fail_msg("zombie peer: %s", err.msg);
	assert_int_equal(refusal_of(&err), REFUSAL_PEER_EXITED);
	assert_int_equal(tu_exit_code(p), 0);
	assert_int_equal(getsockopt(a, SOL_SOCKET, SO_PEERCRED, &cr, &len), 0);
	assert_int_equal(cr.pid, p); /* the kernel fact SPEC §5 notes */
	assert_int_equal(verify_peer(a, &exp, &err), -1);
	if (strstr(err.msg, "peer exited") == NULL)
		fail_msg("reaped peer: %s", err.msg);
	close(pidfd);
	close(a);
	close(gate[0]);
	close(gate[1]);
	close(l);
	tu_scratch_free(&s);
}

/* ---- pid reuse in a fresh pid namespace -------------------------------- */

/* Results of the pid-reuse scenario, shared with the forked verifier. */
struct reuse_res {
	char step[400];
	int honest_rc, honest_bytes;
	char honest_msg[256];
	int impostor_rc, impostor_bytes;
	char impostor_msg[256];
	pid_t first_pid, impostor_pid;
	unsigned long long first_start, impostor_start;
};

/* reuse_fail: records which step failed; returns 1. */
static int reuse_fail(struct reuse_res *r, const char *step)
{
	snprintf(r->step, sizeof(r->step), "%.256s: %.100s", step, strerror(errno));
	return 1;
}

/* reuse_scenario: runs as pid 1 of a new pid namespace with its own /proc:
 * the expected peer connects and passes, exits, an impostor is created at
 * the SAME pid and connects; verify_peer must refuse it. */
static int reuse_scenario(const char *path, struct reuse_res *r)
{
	struct proc_identity exp, imp;
	struct tt_err err = { 0 };
	const char *step;
	int l, a, gate[2];
	pid_t p1, p2;

	/* Privileged (in our own mount namespace): a /proc that shows this
	 * pid namespace's pids. */
	if ((step = tu_own_proc()) != NULL)
		return reuse_fail(r, step);
	if ((l = tu_unix_listen(path, 8, SOCK_CLOEXEC)) < 0)
		return reuse_fail(r, "listen");
	if (pipe2(gate, O_CLOEXEC) < 0)
		return reuse_fail(r, "pipe");
	p1 = fork();
	if (p1 < 0)
		return reuse_fail(r, "fork");
	if (p1 == 0) {
		gate_wait(gate[0]);
		peer_run(path);
	}
	/* What the manager records at spawn. */
	if (proc_identity_read(p1, &exp, &err) < 0)
		return reuse_fail(r, err.msg);
	if (write(gate[1], "g", 1) != 1)
		return reuse_fail(r, "gate");
	if ((a = tu_accept_within(l, 3000)) < 0)
		return reuse_fail(r, "accept honest");
	r->honest_rc = verify_peer(a, &exp, &err);
	snprintf(r->honest_msg, sizeof(r->honest_msg), "%s", err.msg);
	if (r->honest_rc == 0 && write(a, "hello", 5) != 5)
		return reuse_fail(r, "write honest");
	close(a);
	r->honest_bytes = tu_exit_code(p1);
	/* Start times count clock ticks: let a few pass. */
	usleep(50 * 1000);
	p2 = tu_clone3_at(p1);
	if (p2 < 0)
		return reuse_fail(r, "clone3 set_tid");
	if (p2 == 0)
		peer_run(path);
	r->first_pid = p1;
	r->impostor_pid = p2;
	if ((a = tu_accept_within(l, 3000)) < 0)
		return reuse_fail(r, "accept impostor");
	if (proc_identity_read(p2, &imp, &err) < 0)
		return reuse_fail(r, err.msg);
	r->first_start = exp.start_time;
	r->impostor_start = imp.start_time;
	memset(&err, 0, sizeof(err));
	r->impostor_rc = verify_peer(a, &exp, &err);
	snprintf(r->impostor_msg, sizeof(r->impostor_msg), "%s", err.msg);
	if (r->impostor_rc == 0 && write(a, "hello", 5) != 5)
		return reuse_fail(r, "write impostor");
	close(a);
	r->impostor_bytes = tu_exit_code(p2);
	close(l);
	return 0;
}

/* The expected process exits and an impostor gets the same pid: refused
 * (start time differs), receives nothing; the honest one passed. */
static void test_pid_reuse(void **state)
{
	struct tu_scratch s;
	struct reuse_res *r;
	pid_t c;
	int code;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-procid");
	r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	         -1, 0);
	assert_true(r != MAP_FAILED);
	memset(r, 0, sizeof(*r));
	c = fork();
	assert_true(c >= 0);
	if (c == 0) {
		pid_t v;

		/* Privileged: a new pid namespace (our next child is its pid
		 * 1) and mount namespace (for its /proc). */
		if (unshare(CLONE_NEWPID | CLONE_NEWNS) < 0)
			_exit(reuse_fail(r, "unshare") + 10);
		v = fork();
		if (v < 0)
			_exit(11);
		if (v == 0)
			_exit(reuse_scenario(s.path, r));
		_exit(tu_exit_code(v));
	}
	code = tu_exit_code(c);
	if (code != 0)
		fail_msg("scenario failed (%d): %s", code, r->step);
	if (r->honest_rc != 0)
		fail_msg("honest peer refused: %s", r->honest_msg);
	assert_int_equal(r->honest_bytes, 5);
	assert_int_equal(r->impostor_pid, r->first_pid);
	assert_true(r->impostor_start != r->first_start);
	assert_int_equal(r->impostor_rc, -1);
	if (strstr(r->impostor_msg, "pid reused: start time differs") == NULL)
		fail_msg("impostor refused for the wrong reason: %s", r->impostor_msg);
	assert_int_equal(r->impostor_bytes, 0);
	munmap(r, sizeof(*r));
	tu_scratch_free(&s);
}

/* ---- exec at the same pid ---------------------------------------------- */

/* The peer execve()s another binary on the same connection: same pid, same
 * start time, so only the executable check refuses it. */
static void test_exec_same_pid(void **state)
{
	struct tu_scratch s;
	struct proc_identity exp;
	struct tt_err err = { 0 };
	unsigned long long start = 0;
	int l, a, gate[2], out[2];
	char line[16] = { 0 };
	pid_t p;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-procid");
	assert_true((l = tu_unix_listen(s.path, 8, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(pipe2(gate, O_CLOEXEC), 0);
	assert_int_equal(pipe(out), 0);
	p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		int fd;

		gate_wait(gate[0]);
		if ((fd = tu_unix_connect(s.path, 0)) < 0)
			_exit(255);
		gate_wait(gate[0]);
		dup2(out[1], 1);
		execl("/bin/sh", "sh", "-c", "echo ready; exec sleep 10", (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	assert_int_equal(proc_identity_read(p, &exp, &err), 0);
	gate_open(gate[1]);
	assert_true((a = tu_accept_within(l, 3000)) >= 0);
	if (verify_peer(a, &exp, &err) != 0)
		fail_msg("honest peer refused: %s", err.msg);
	gate_open(gate[1]);
	struct pollfd pf = { .fd = out[0], .events = POLLIN };
	assert_int_equal(poll(&pf, 1, 3000), 1);
	assert_true(read(out[0], line, sizeof(line) - 1) > 0);
	assert_int_equal(verify_peer(a, &exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	if (strstr(err.msg, "executable differs") == NULL)
		fail_msg("exec'd peer refused for the wrong reason: %s", err.msg);
	assert_int_equal(refusal_of(&err), REFUSAL_EXE_CHANGED);
	/* exec keeps pid and start time: only dev+ino told them apart. */
	assert_int_equal(procid_start_time(p, &start, &err), 0);
	assert_true(start == exp.start_time);
	kill(p, SIGKILL);
	assert_int_equal(tu_exit_code(p), -1);
	close(a);
	close(out[0]);
	close(gate[0]);
	close(gate[1]);
	close(l);
	tu_scratch_free(&s);
}

/* ---- wrong uid --------------------------------------------------------- */

/* spawn_uid_peer: a child that waits for the gate, switches to uid (unless
 * 0), connects and counts bytes. */
static pid_t spawn_uid_peer(const char *path, int gate_rd, uid_t uid)
{
	pid_t p = fork();

	if (p != 0)
		return p;
	gate_wait(gate_rd);
	/* Privileged: drop to an unprivileged uid, as a hostile peer would
	 * be. Groups first, while still allowed to. */
	if (uid != 0 && (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
	                 setresuid(uid, uid, uid) < 0))
		_exit(253);
	peer_run(path);
}

/* A peer that connects with another uid than expected is refused and gets
 * nothing; the honest root peer passes. */
static void test_wrong_uid(void **state)
{
	struct tu_scratch s;
	struct proc_identity exp;
	struct tt_err err = { 0 };
	int l, a, gate[2];
	pid_t p;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-procid");
	assert_int_equal(chmod(s.dir, 0755), 0);
	assert_true((l = tu_unix_listen(s.path, 8, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(chmod(s.path, 0777), 0);
	assert_int_equal(pipe2(gate, O_CLOEXEC), 0);

	/* The expected process, recorded as root, then it turns 65534. */
	p = spawn_uid_peer(s.path, gate[0], 65534);
	assert_true(p > 0);
	assert_int_equal(proc_identity_read(p, &exp, &err), 0);
	assert_int_equal(exp.uid, 0);
	gate_open(gate[1]);
	assert_true((a = tu_accept_within(l, 3000)) >= 0);
	assert_int_equal(verify_peer(a, &exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	if (strstr(err.msg, "uid differs") == NULL)
		fail_msg("wrong-uid peer refused for the wrong reason: %s", err.msg);
	assert_int_equal(refusal_of(&err), REFUSAL_UID);
	close(a);
	assert_int_equal(tu_exit_code(p), 0);

	/* Honest: stays root. */
	p = spawn_uid_peer(s.path, gate[0], 0);
	assert_true(p > 0);
	assert_int_equal(proc_identity_read(p, &exp, &err), 0);
	gate_open(gate[1]);
	assert_true((a = tu_accept_within(l, 3000)) >= 0);
	if (verify_peer(a, &exp, &err) != 0)
		fail_msg("honest peer refused: %s", err.msg);
	assert_int_equal(write(a, "hello", 5), 5);
	close(a);
	assert_int_equal(tu_exit_code(p), 5);
	close(gate[0]);
	close(gate[1]);
	close(l);
	tu_scratch_free(&s);
}

/* procid_pin: a live pid pinned; a gone one NOT_FOUND. */
static void test_pin(void **state)
{
	struct proc_identity a, b;
	struct tt_err err = { 0 };
	int pidfd = -1;
	pid_t p;

	(void)state;
	tu_skip_unless_root();
	p = fork();
	assert_true(p >= 0);
	if (p == 0) {
		pause();
		_exit(0);
	}
	assert_int_equal(proc_identity_read(p, &a, &err), 0);
	assert_int_equal(procid_pin(p, &b, &pidfd, &err), 0);
	assert_true(proc_identity_equal(&a, &b));
	assert_int_equal(procid_pidfd_alive(pidfd, &err), 1);
	kill(p, SIGKILL);
	assert_int_equal(tu_exit_code(p), -1);
	assert_int_equal(procid_pidfd_alive(pidfd, &err), 0);
	close(pidfd);
	assert_int_equal(procid_pin(p, &b, NULL, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
}

/* main: runs the suite. */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stat_parser),
		cmocka_unit_test(test_identity_self),
		cmocka_unit_test(test_peer_honest_and_other),
		cmocka_unit_test(test_peer_exited),
		cmocka_unit_test(test_pid_reuse),
		cmocka_unit_test(test_exec_same_pid),
		cmocka_unit_test(test_wrong_uid),
		cmocka_unit_test(test_pin),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

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
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
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
#include "refusal.h"
#include "sockdiag.h"
#include "testutil.h"

#define L_NEWNET  1 /* listener unshares a network namespace first */
#define L_REPLACE 2 /* listener unlinks the path first (a replacement) */
#define L_JOINNET 4 /* listener joins join_netns_fd's network namespace */

/* The namespace an L_JOINNET listener joins (another sandbox process). */
static int join_netns_fd = -1;

/* listener_run: child body: binds path (per flags), says ready, accepts one
 * connection within 10 s and exits with the bytes it received. */
static _Noreturn void listener_run(const char *path, int flags, int ready_wr)
{
	struct pollfd pf;
	int l, a;

	/* Privileged: a network namespace of its own, as a sandbox has. */
	if ((flags & L_NEWNET) && unshare(CLONE_NEWNET) < 0)
		_exit(250);
	/* Privileged: joins an existing sandbox's network namespace. */
	if ((flags & L_JOINNET) && setns(join_netns_fd, CLONE_NEWNET) < 0)
		_exit(254);
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
                           const struct proc_identity *exp, const char *why,
                           enum refusal reason)
{
	struct tt_err err = { 0 };

	assert_int_equal(verify_listener(path, netns_fd, exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	if (strstr(err.msg, why) == NULL)
		fail_msg("refused for '%s', expected '%s'", err.msg, why);
	assert_int_equal(refusal_of(&err), reason);
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
	expect_refused(s.path, -1, &exp1, "not held by expected pid", REFUSAL_LISTENER_REPLACED);
	assert_true((c = tu_unix_connect(s.path, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(verify_peer(c, &exp1, &err), -1);
	assert_non_null(strstr(err.msg, "peer pid differs"));
	close(c); /* refused: nothing written */
	assert_int_equal(tu_exit_code(l2), 0);

	/* The expected owner dies; another listener takes the path. */
	stop(l1);
	l3 = spawn_listener(s.path, L_REPLACE);
	expect_refused(s.path, -1, &exp1, "listener owner exited", REFUSAL_PEER_EXITED);

	/* l3 is the honest one for its own expectation. */
	assert_int_equal(proc_identity_read(l3, &exp3, &err), 0);
	expect_passes(s.path, -1, &exp3);
	/* ... but not if its socket file has another owner. */
	assert_int_equal(chown(s.path, 65534, 65534), 0);
	expect_refused(s.path, -1, &exp3, "socket file owner differs", REFUSAL_OWNER_CHANGED);
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
	expect_refused(s.path, -1, &exp, "no listener bound", REFUSAL_LISTENER_REPLACED);

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

/* netns_ino: the inode of the calling thread's network namespace. */
static ino_t netns_ino(void)
{
	struct stat st;

	assert_int_equal(stat("/proc/thread-self/ns/net", &st), 0);
	return st.st_ino;
}

/* find_on: sockdiag_unix_find_vfs_on for the file at path; 0 or -1. */
static int find_on(int nl, const char *path, struct unix_listener_info *info,
                   struct tt_err *err)
{
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	return sockdiag_unix_find_vfs_on(nl, sockdiag_kdev(st.st_dev), (uint32_t)st.st_ino,
	                                 info, err);
}

/* expect_refused_nl: verify_listener_nl refuses with a message naming why. */
static void expect_refused_nl(const char *path, int nl, const struct proc_identity *exp,
                              const char *why, enum refusal reason)
{
	struct tt_err err = { 0 };

	assert_int_equal(verify_listener_nl(path, nl, exp, &err), -1);
	assert_int_equal(err.code, TT_ERR_VERIFY);
	if (strstr(err.msg, why) == NULL)
		fail_msg("refused for '%s', expected '%s'", err.msg, why);
	assert_int_equal(refusal_of(&err), reason);
}

/* expect_passes_nl: verify_listener_nl accepts. */
static void expect_passes_nl(const char *path, int nl, const struct proc_identity *exp)
{
	struct tt_err err = { 0 };

	if (verify_listener_nl(path, nl, exp, &err) != 0)
		fail_msg("honest listener refused: %s", err.msg);
}

/* The persistent-socket API (as the bridge uses it): one sock_diag socket
 * opened once in a sandbox-like netns answers many queries, and the
 * calling thread is back in its own namespace; a listener that replaced
 * the expected one in that netns is refused on the same socket (and sent
 * nothing), which keeps answering afterwards; query sockets of the host
 * netns or of another sandbox's netns do not see the listener at all. */
static void test_persistent_socket(void **state)
{
	struct tu_scratch s, s2;
	struct unix_listener_info info;
	struct proc_identity exp1, exp2, exp_other;
	struct tt_err err = { 0 };
	char nspath[64];
	uint32_t first_ino;
	bool stuck = true;
	ino_t own_ns;
	pid_t l1, l2, other;
	int nsfd, nl, nl_host, nl_other, c;

	(void)state;
	tu_skip_unless_root();
	tu_scratch_new(&s, "tt-sockdiag");
	tu_scratch_new(&s2, "tt-sockdiag");
	own_ns = netns_ino();
	l1 = spawn_listener(s.path, L_NEWNET);
	assert_int_equal(proc_identity_read(l1, &exp1, &err), 0);
	snprintf(nspath, sizeof(nspath), "/proc/%d/ns/net", (int)l1);
	assert_true((nsfd = open(nspath, O_RDONLY | O_CLOEXEC)) >= 0);

	nl = sockdiag_open_in_netns(nsfd, &stuck, &err);
	if (nl < 0)
		fail_msg("sockdiag_open_in_netns: %s", err.msg);
	assert_false(stuck);
	assert_true(netns_ino() == own_ns);
	/* Many queries on the one socket, all answered from the sandbox's
	 * netns (our thread is not in it). */
	assert_int_equal(find_on(nl, s.path, &info, &err), 0);
	first_ino = info.ino;
	assert_int_equal(info.state, 10);
	assert_int_equal(sockdiag_inode_owned_by(l1, info.ino, &err), 0);
	for (int i = 0; i < 200; i++) {
		memset(&info, 0, sizeof(info));
		if (find_on(nl, s.path, &info, &err) != 0)
			fail_msg("query %d on the reused socket: %s", i, err.msg);
		assert_int_equal(info.ino, first_ino);
	}
	for (int i = 0; i < 20; i++)
		expect_passes_nl(s.path, nl, &exp1);

	/* Query sockets from the wrong namespace do not find it. */
	nl_host = sockdiag_open_in_netns(-1, NULL, &err);
	assert_true(nl_host >= 0);
	assert_int_equal(find_on(nl_host, s.path, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	expect_refused_nl(s.path, nl_host, &exp1, "no listener bound", REFUSAL_LISTENER_REPLACED);
	other = spawn_listener(s2.path, L_NEWNET);
	assert_int_equal(proc_identity_read(other, &exp_other, &err), 0);
	snprintf(nspath, sizeof(nspath), "/proc/%d/ns/net", (int)other);
	{
		int ofd = open(nspath, O_RDONLY | O_CLOEXEC);

		assert_true(ofd >= 0);
		nl_other = sockdiag_open_in_netns(ofd, NULL, &err);
		close(ofd);
	}
	assert_true(nl_other >= 0);
	assert_int_equal(find_on(nl_other, s.path, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	expect_refused_nl(s.path, nl_other, &exp1, "no listener bound", REFUSAL_LISTENER_REPLACED);
	/* ... and each socket still answers for its own namespace. */
	expect_passes_nl(s2.path, nl_other, &exp_other);
	assert_int_equal(find_on(nl, s2.path, &info, &err), -1);
	expect_passes_nl(s.path, nl, &exp1);

	/* A replacement in the same netns while l1 lives: refused on the
	 * same socket, and a client that checks the peer sends nothing. */
	join_netns_fd = nsfd;
	l2 = spawn_listener(s.path, L_JOINNET | L_REPLACE);
	join_netns_fd = -1;
	assert_int_equal(find_on(nl, s.path, &info, &err), 0);
	assert_true(info.ino != first_ino);
	assert_int_equal(sockdiag_inode_owned_by(l2, info.ino, &err), 0);
	expect_refused_nl(s.path, nl, &exp1, "not held by expected pid", REFUSAL_LISTENER_REPLACED);
	assert_true((c = tu_unix_connect(s.path, SOCK_CLOEXEC)) >= 0);
	assert_int_equal(verify_peer(c, &exp1, &err), -1);
	close(c); /* refused: nothing written */
	assert_int_equal(tu_exit_code(l2), 0);
	/* The socket keeps working after the refusals: l2 is gone, nothing
	 * listens at the path any more. */
	assert_int_equal(find_on(nl, s.path, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);

	/* The honest counterpart on the same socket: a listener verified as
	 * itself passes, and receives what the client sends. */
	join_netns_fd = nsfd;
	l2 = spawn_listener(s.path, L_JOINNET | L_REPLACE);
	join_netns_fd = -1;
	assert_int_equal(proc_identity_read(l2, &exp2, &err), 0);
	expect_passes_nl(s.path, nl, &exp2);
	expect_refused_nl(s.path, nl, &exp1, "not held by expected pid", REFUSAL_LISTENER_REPLACED);
	assert_true((c = tu_unix_connect(s.path, SOCK_CLOEXEC)) >= 0);
	if (verify_peer(c, &exp2, &err) != 0)
		fail_msg("honest listener refused as peer: %s", err.msg);
	assert_int_equal(write(c, "hello", 5), 5);
	close(c);
	assert_int_equal(tu_exit_code(l2), 5);

	close(nl);
	close(nl_host);
	close(nl_other);
	close(nsfd);
	stop(l1);
	stop(other);
	tu_scratch_free(&s);
	tu_scratch_free(&s2);
}

/* main: runs the suite. */
/* A reply buffer as the kernel writes it: nlmsghdr-aligned messages. */
struct nlbuf {
	uint32_t w[256];
	size_t len;
};

/* nl_add: appends one message of type (seq) with payload, 4-aligned. */
static void nl_add(struct nlbuf *b, uint16_t type, uint32_t seq, const void *pl,
                   size_t n)
{
	struct nlmsghdr h = { .nlmsg_len = (uint32_t)(sizeof(h) + n),
	                      .nlmsg_type = type, .nlmsg_seq = seq };
	char *p = (char *)b->w + b->len;

	memcpy(p, &h, sizeof(h));
	memcpy(p + sizeof(h), pl, n);
	b->len += NLMSG_ALIGN(sizeof(h) + n);
}

/* diag_listener: a unix_diag_msg in state with a VFS attribute. */
static size_t diag_listener(uint8_t *out, uint8_t state, uint32_t kdev, uint32_t ino)
{
	struct unix_diag_msg d = { .udiag_family = AF_UNIX, .udiag_state = state,
	                           .udiag_ino = 77 };
	struct rtattr a = { .rta_len = RTA_LENGTH(sizeof(struct unix_diag_vfs)),
	                    .rta_type = UNIX_DIAG_VFS };
	struct unix_diag_vfs v = { .udiag_vfs_ino = ino, .udiag_vfs_dev = kdev };

	memcpy(out, &d, sizeof(d));
	memcpy(out + NLMSG_ALIGN(sizeof(d)), &a, sizeof(a));
	memcpy(out + NLMSG_ALIGN(sizeof(d)) + RTA_LENGTH(0), &v, sizeof(v));
	return NLMSG_ALIGN(sizeof(d)) + RTA_LENGTH(sizeof(v));
}

/* The reply parser (the fuzzer's target): a match, a dump without one,
 * the kernel's error, a length past the buffer, another query's seq. */
static void test_reply_parse(void **state)
{
	struct unix_listener_info info;
	struct tt_err err = { 0 };
	struct nlbuf b = { 0 };
	uint8_t pl[64];
	int32_t zero = 0, eacces[5] = { -EACCES };
	bool found = false;

	(void)state;
	nl_add(&b, SOCK_DIAG_BY_FAMILY, 9, pl, diag_listener(pl, 10, 5, 6));
	/* not to the end: the match answers at once */
	assert_int_equal(sockdiag_reply_parse(b.w, b.len, 9, false, 5, 6, &info, &found,
	                                      &err), 1);
	assert_true(found);
	assert_int_equal(info.ino, 77);
	/* to the end: only at NLMSG_DONE */
	found = false;
	assert_int_equal(sockdiag_reply_parse(b.w, b.len, 9, true, 5, 6, &info, &found,
	                                      &err), 0);
	assert_true(found);
	nl_add(&b, NLMSG_DONE, 9, &zero, sizeof(zero));
	found = false;
	assert_int_equal(sockdiag_reply_parse(b.w, b.len, 9, true, 5, 6, &info, &found,
	                                      &err), 1);
	/* another file, or not listening: not found at the end */
	found = false;
	assert_int_equal(sockdiag_reply_parse(b.w, b.len, 9, true, 5, 7, &info, &found,
	                                      &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	b.len = 0;
	nl_add(&b, SOCK_DIAG_BY_FAMILY, 9, pl, diag_listener(pl, 1, 5, 6));
	nl_add(&b, NLMSG_DONE, 9, &zero, sizeof(zero));
	found = false;
	assert_int_equal(sockdiag_reply_parse(b.w, b.len, 9, false, 5, 6, &info, &found,
	                                      &err), -1);
	/* another query's messages are skipped */
	b.len = 0;
	nl_add(&b, SOCK_DIAG_BY_FAMILY, 8, pl, diag_listener(pl, 10, 5, 6));
	found = false;
	assert_int_equal(sockdiag_reply_parse(b.w, b.len, 9, false, 5, 6, &info, &found,
	                                      &err), 0);
	assert_false(found);
	/* the kernel's error */
	b.len = 0;
	nl_add(&b, NLMSG_ERROR, 9, eacces, sizeof(eacces));
	assert_int_equal(sockdiag_reply_parse(b.w, b.len, 9, false, 5, 6, &info, &found,
	                                      &err), -1);
	assert_int_equal(err.sys_errno, EACCES);
	/* a length past the buffer */
	b.len = 0;
	nl_add(&b, SOCK_DIAG_BY_FAMILY, 9, pl, diag_listener(pl, 10, 5, 6));
	assert_int_equal(sockdiag_reply_parse(b.w, b.len - 4, 9, false, 5, 6, &info,
	                                      &found, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kdev),
		cmocka_unit_test(test_reply_parse),
		cmocka_unit_test(test_listener_found_and_owned),
		cmocka_unit_test(test_listener_replaced),
		cmocka_unit_test(test_netns_scope),
		cmocka_unit_test(test_persistent_socket),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

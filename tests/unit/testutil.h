/* Shared fixtures for tests/unit/test_*.c. Header-only and static inline:
 * every test file is its own binary, so each one compiles the helpers it
 * uses and nothing else is linked. Helpers fail the current test through
 * cmocka where a broken fixture leaves nothing to test. */
#ifndef TT_TESTUTIL_H
#define TT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "capcache.h"
#include "claims.h"
#include "decision.h"

/* ---- processes ------------------------------------------------------------ */

/* tu_skip_unless_root: namespaces, set_tid, setuid and other uids need
 * root; elsewhere the test is skipped, not failed. */
static inline void tu_skip_unless_root(void)
{
	if (geteuid() != 0)
		skip();
}

/* tu_exit_code: waits for pid; its exit code, or -1 if it did not exit. */
static inline int tu_exit_code(pid_t pid)
{
	int st;

	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

/* tu_kill_reap: SIGKILL and reap pid (if any); *pid becomes 0. */
static inline void tu_kill_reap(pid_t *pid)
{
	if (*pid <= 0)
		return;
	kill(*pid, SIGKILL);
	waitpid(*pid, NULL, 0);
	*pid = 0;
}

/* tu_term_reap: SIGTERM, up to 3 s to exit, then SIGKILL; reaps, *pid
 * becomes 0. */
static inline void tu_term_reap(pid_t *pid)
{
	if (*pid <= 0)
		return;
	kill(*pid, SIGTERM);
	for (int i = 0; i < 300; i++) {
		if (waitpid(*pid, NULL, WNOHANG) == *pid) {
			*pid = 0;
			return;
		}
		usleep(10000);
	}
	tu_kill_reap(pid);
}

/* tu_read_within: one read() from fd once it is readable within ms; the
 * bytes read, 0 on EOF or timeout (readiness lines: "ready\n", "r"). */
static inline ssize_t tu_read_within(int fd, void *buf, size_t cap, int ms)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };

	if (poll(&pf, 1, ms) != 1)
		return 0;
	return read(fd, buf, cap);
}

/* tu_secret_pipe: a pipe holding len bytes of secret, write end closed;
 * returns the read end (the child reads its secret from it, as from the
 * manager). */
static inline int tu_secret_pipe(const uint8_t *secret, size_t len)
{
	int p[2];

	assert_int_equal(pipe(p), 0);
	assert_int_equal(write(p[1], secret, len), (ssize_t)len);
	close(p[1]);
	return p[0];
}

/* tu_clone3_at: fork-like clone3 whose child gets pid want in the caller's
 * pid namespace (set_tid, Linux 5.5+; needs CAP_SYS_ADMIN over it). The
 * pid-reuse attacks are built on it. */
static inline pid_t tu_clone3_at(pid_t want)
{
	struct {
		uint64_t flags, pidfd, child_tid, parent_tid, exit_signal;
		uint64_t stack, stack_size, tls, set_tid, set_tid_size;
	} args;
	pid_t tid[1] = { want };

	memset(&args, 0, sizeof(args));
	args.exit_signal = SIGCHLD;
	args.set_tid = (uint64_t)(uintptr_t)tid;
	args.set_tid_size = 1;
	return (pid_t)syscall(SYS_clone3, &args, sizeof(args));
}

/* tu_own_proc: in a fresh mount + pid namespace (pid 1 of it), a /proc
 * that shows this pid namespace's pids. NULL on success, else the step
 * that failed (errno set). */
static inline const char *tu_own_proc(void)
{
	/* Privileged, in our own mount namespace only: / stops propagating
	 * so the new /proc stays ours. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return "make / private";
	/* Privileged: procfs of the current pid namespace over /proc. */
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		return "mount proc";
	return NULL;
}

/* ---- unix sockets ------------------------------------------------------------ */

/* A scratch dir holding one socket path per test. */
struct tu_scratch {
	char dir[64];
	char path[96];
};

/* tu_scratch_new: a fresh dir /tmp/PREFIX.XXXXXX and a socket path in it. */
static inline void tu_scratch_new(struct tu_scratch *s, const char *prefix)
{
	snprintf(s->dir, sizeof(s->dir), "/tmp/%.40s.XXXXXX", prefix);
	assert_non_null(mkdtemp(s->dir));
	snprintf(s->path, sizeof(s->path), "%s/s", s->dir);
}

/* tu_scratch_free: removes the socket file and the dir. */
static inline void tu_scratch_free(struct tu_scratch *s)
{
	unlink(s->path);
	rmdir(s->dir);
}

/* tu_unix_addr: path into sa; false (errno ENAMETOOLONG) when it does not
 * fit, rather than binding a truncated path. */
static inline bool tu_unix_addr(struct sockaddr_un *sa, const char *path)
{
	size_t len = strlen(path);

	if (len >= sizeof(sa->sun_path)) {
		errno = ENAMETOOLONG;
		return false;
	}
	memcpy(sa->sun_path, path, len + 1);
	return true;
}

/* tu_unix_listen: a unix stream socket bound at path, listening with
 * backlog when backlog > 0; flags 0 or SOCK_CLOEXEC (0 keeps it across
 * exec, for listeners handed to a child). The fd or -1. */
static inline int tu_unix_listen(const char *path, int backlog, int flags)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (!tu_unix_addr(&sa, path))
		return -1;
	fd = socket(AF_UNIX, SOCK_STREAM | flags, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    (backlog > 0 && listen(fd, backlog) < 0)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* tu_unix_connect: a unix stream connection to path (flags 0 or
 * SOCK_CLOEXEC), or -1. */
static inline int tu_unix_connect(const char *path, int flags)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (!tu_unix_addr(&sa, path))
		return -1;
	fd = socket(AF_UNIX, SOCK_STREAM | flags, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* tu_wait_listening: polls until path accepts connections (5 s), else
 * fails the test. */
static inline void tu_wait_listening(const char *path)
{
	for (int i = 0; i < 500; i++) {
		int fd = tu_unix_connect(path, SOCK_CLOEXEC);

		if (fd >= 0) {
			close(fd);
			return;
		}
		usleep(10000);
	}
	fail_msg("%s never listened", path);
}

/* tu_accept_within: accept on l within ms, or -1. */
static inline int tu_accept_within(int l, int ms)
{
	struct pollfd pf = { .fd = l, .events = POLLIN };

	if (poll(&pf, 1, ms) != 1)
		return -1;
	return accept4(l, NULL, NULL, SOCK_CLOEXEC);
}

/* tu_count_until_eof: bytes read from fd until EOF (3 s bound per read),
 * capped at 200 so a child can report it as its exit code. */
static inline int tu_count_until_eof(int fd)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	char b[64];
	int total = 0;

	while (poll(&pf, 1, 3000) == 1) {
		ssize_t r = read(fd, b, sizeof(b));

		if (r <= 0)
			break;
		total += (int)r;
	}
	return total > 200 ? 200 : total;
}

/* ---- PASETO / PASERK vectors --------------------------------------------------- */

/* tu_vectors_load: the "tests" array of an official vector file in
 * $TETHER_PASETO_VECTORS (default beside the clone); the caller decrefs
 * *root. */
static inline json_t *tu_vectors_load(const char *file, json_t **root)
{
	const char *dir = getenv("TETHER_PASETO_VECTORS");
	char path[4096];
	json_error_t jerr;

	snprintf(path, sizeof(path), "%s/%s",
	         dir != NULL ? dir : "../shared/testdata/paseto", file);
	*root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (*root == NULL)
		fail_msg("cannot load %s: %s", path, jerr.text);
	assert_true(json_is_array(json_object_get(*root, "tests")));
	return json_object_get(*root, "tests");
}

/* tu_hex: decodes the hex string field of t into out (at most cap bytes);
 * returns the length. */
static inline size_t tu_hex(json_t *t, const char *field, uint8_t *out, size_t cap)
{
	const char *s = json_string_value(json_object_get(t, field));
	size_t got = 0;

	assert_non_null(s);
	assert_int_equal(sodium_hex2bin(out, cap, s, strlen(s), NULL, &got, NULL), 0);
	return got;
}

/* ---- capabilities ------------------------------------------------------------- */

/* tu_claims_control: a control capability for sbx, generation gen on w1
 * (substrate ns, attempt att), issued 10 s before now for 120 s, with ops,
 * as the cp mints it. */
static inline void tu_claims_control(struct tt_claims *c, const char *sbx, int64_t now,
                                     uint64_t gen, uint32_t att, uint32_t ops)
{
	memset(c, 0, sizeof(*c));
	strcpy(c->iss, "tether-cp");
	strcpy(c->sub, "tenant-1");
	strcpy(c->jti, "j1");
	c->iat = now - 10;
	c->exp = now + 110;
	c->aud = TT_AUD_NODE;
	snprintf(c->id.sbx, sizeof(c->id.sbx), "%s", sbx);
	c->id.gen = gen;
	strcpy(c->id.wrk, "w1");
	strcpy(c->id.sst, "ns");
	c->id.att = att;
	c->pur = TT_PUR_CONTROL;
	c->ops = ops;
}

/* tu_request_exec: a new exec request for sbx at a node. sbx is borrowed
 * (the request points at it). */
static inline void tu_request_exec(struct tt_request *req, const char *sbx)
{
	memset(req, 0, sizeof(*req));
	req->receiver = TT_RCV_NODE;
	req->sbx = sbx;
	req->op = TT_OP_EXEC;
	req->new_open = true;
}

/* tu_mint: c signed with sk (cap_mint); the caller frees the token. */
static inline char *tu_mint(const uint8_t *sk, const struct tt_claims *c)
{
	struct tt_err err = { 0 };
	char *tok = NULL;

	if (cap_mint(sk, c, &tok, &err) < 0)
		fail_msg("cap_mint: %s", err.msg);
	return tok;
}

#endif

/* Bridge verification (SPEC §5) with real processes: the real
 * build/tether-bridge in front of the real build/tether-guest, this test
 * playing the sbx-manager (its pid is the bridge's --manager-pid). Each
 * attack is refused with its specific reason (bridge log line), the
 * attacker never sees an operation byte (impostors record what they
 * receive; the marker command would create a file if it ever ran), and the
 * honest path succeeds afterwards:
 *  - listener replacement: another process binds the guest socket path
 *    (same uid, then another uid);
 *  - a different executable at the expected pid (exec in place, keeping
 *    the listening socket);
 *  - PID reuse of the bridge's expected manager (clone3 set_tid in a pid
 *    namespace);
 *  - a process that is not the manager connects to the bridge;
 *  - a bridge started for an init whose pid was reused refuses to start.
 * Needs root (pid namespaces, set_tid, another uid). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "hello.h"
#include "manager/bridgectl.h"
#include "procid.h"
#include "wire.h"
#include "wire_json.h"
#include "testutil.h"

#define SBX "sbx_vvvvvvvvvvvvvvvvvvvvvvvvvv"
#define SECRET_LEN 32

static char dir[] = "/tmp/tt-bv.XXXXXX";
static char root_dir[256], guest_bin[4096], bridge_bin[4096];
static uint8_t secret[SECRET_LEN];
static uint8_t rbuf[WIRE_PAYLOAD_MAX + 1];
static int seq;

/* A started process and the paths it uses. */
struct proc {
	pid_t pid;
	char sock[320];
	char log[320];
};

/* The end of one operation through the bridge. */
struct answer {
	uint8_t end_type;     /* WIRE_RESULT, WIRE_ERROR or 0 (EOF) */
	char error[64];
	char message[256];
	char out[1024];
	size_t out_len;
	int frames;
};

/* Results of the pid-namespace scenario, shared with the parent. */
struct reuse_res {
	char step[400];
	char bridge_sock[320];     /* for the manager child, set before its gate */
	pid_t manager_pid, impostor_pid;
	unsigned long long manager_start, impostor_start;
	struct answer honest, impostor, after;
	bool bridge_started, after_started;
};

/* ---- helpers ------------------------------------------------------------ */

/* secret_fd: a pipe holding the secret, write end closed; the read end. */
static int secret_fd(void)
{
	return tu_secret_pipe(secret, SECRET_LEN);
}

/* guest_start: the real agent on path (root_dir as its root), 0 on
 * readiness. */
static int guest_start(struct proc *g, const char *path)
{
	char sfd[16], rfd[16], line[8];
	int s = secret_fd(), r[2];
	ssize_t n;

	snprintf(g->sock, sizeof(g->sock), "%s", path);
	assert_int_equal(pipe(r), 0);
	snprintf(sfd, sizeof(sfd), "%d", s);
	snprintf(rfd, sizeof(rfd), "%d", r[1]);
	g->pid = fork();
	assert_true(g->pid >= 0);
	if (g->pid == 0) {
		/* Nothing outlives a failed test. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(r[0]);
		execl(guest_bin, guest_bin, "--listen", path, "--sbx", SBX, "--gen", "1",
		      "--att", "1", "--root", root_dir, "--secret-fd", sfd, "--ready-fd", rfd,
		      (char *)NULL);
		_exit(127);
	}
	close(s);
	close(r[1]);
	n = tu_read_within(r[0], line, sizeof(line), 5000);
	close(r[0]);
	return n == 6 && memcmp(line, "ready\n", 6) == 0 ? 0 : -1;
}

/* bridge_start_at: the real bridge for the listener at guest_sock owned by
 * init (start time init_start), accepting only manager. 0 once it said
 * ready, -1 if it exited instead (b->log says why). */
static int bridge_start_at(struct proc *b, const char *guest_sock, pid_t init,
                           unsigned long long init_start, pid_t manager)
{
	char ipid[16], istart[32], mpid[16], line[8];
	int s = secret_fd(), r[2];
	ssize_t n;

	snprintf(b->sock, sizeof(b->sock), "%s/bridge-%d.sock", dir, ++seq);
	snprintf(b->log, sizeof(b->log), "%s/bridge-%d.log", dir, seq);
	snprintf(ipid, sizeof(ipid), "%d", (int)init);
	snprintf(istart, sizeof(istart), "%llu", init_start);
	snprintf(mpid, sizeof(mpid), "%d", (int)manager);
	assert_int_equal(pipe(r), 0);
	b->pid = fork();
	assert_true(b->pid >= 0);
	if (b->pid == 0) {
		int lfd;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		lfd = open(b->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		/* Secret on 3 and readiness on 4, exactly as the manager. */
		if (lfd < 0 || dup2(lfd, 2) < 0 || dup2(s, 3) < 0 || dup2(r[1], 4) < 0)
			_exit(126);
		execl(bridge_bin, "tether-bridge", "--sbx", SBX, "--gen", "1", "--att", "1",
		      "--listen", b->sock, "--guest-socket", guest_sock, "--init-pid", ipid,
		      "--init-start", istart, "--manager-pid", mpid, "--secret-fd", "3",
		      "--ready-fd", "4", (char *)NULL);
		_exit(127);
	}
	close(s);
	close(r[1]);
	n = tu_read_within(r[0], line, sizeof(line), 5000);
	close(r[0]);
	return n == 6 && memcmp(line, "ready\n", 6) == 0 ? 0 : -1;
}

/* bridge_start: bridge_start_at with init's current start time and this
 * process as the manager. */
static int bridge_start(struct proc *b, const char *guest_sock, pid_t init)
{
	unsigned long long start = 0;

	assert_int_equal(procid_start_time(init, &start, NULL), 0);
	return bridge_start_at(b, guest_sock, init, start, getpid());
}

/* proc_stop: SIGKILL and reap. */
static void proc_stop(struct proc *p)
{
	tu_kill_reap(&p->pid);
}

/* read_all: frames until RESULT, ERROR or EOF (10 s bound per read). */
static void read_all(int fd, struct answer *a)
{
	struct timeval tv = { .tv_sec = 10 };
	struct wire_frame f;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (;;) {
		json_t *o;

		if (wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL) != 1)
			return;
		a->frames++;
		if (f.type == WIRE_DATA_OUT && a->out_len + f.len < sizeof(a->out)) {
			memcpy(a->out + a->out_len, f.payload, f.len);
			a->out_len += f.len;
			a->out[a->out_len] = '\0';
		} else if (f.type == WIRE_RESULT || f.type == WIRE_ERROR) {
			a->end_type = f.type;
			o = wire_frame_json(&f, NULL);
			snprintf(a->error, sizeof(a->error), "%s",
			         o && json_string_value(json_object_get(o, "error")) ?
			         json_string_value(json_object_get(o, "error")) : "");
			snprintf(a->message, sizeof(a->message), "%s",
			         o && json_string_value(json_object_get(o, "message")) ?
			         json_string_value(json_object_get(o, "message")) : "");
			json_decref(o);
			return;
		}
	}
}

/* bridge_exec: one exec of sh -c script through the bridge at sock, as
 * the manager forwards it (no token). */
static void bridge_exec(const char *sock, const char *script, struct answer *a)
{
	json_t *req = json_pack("{s:s,s:s,s:[s,s,s]}", "sbx", SBX, "op", "exec", "cmd", "sh",
	                        "-c", script);
	int fd = tu_unix_connect(sock, SOCK_CLOEXEC);

	memset(a, 0, sizeof(*a));
	if (fd >= 0 && wire_send_json(fd, WIRE_REQUEST, req, NULL) == 0)
		read_all(fd, a);
	json_decref(req);
	if (fd >= 0)
		close(fd);
}

/* bridge_hold: starts an exec that prints "start", sleeps, then prints
 * "held", and returns once "start" came back: the operation then runs on
 * the guest connection the bridge had idle (verified when opened), so the
 * next operation must open a new one. The caller reads the rest. */
static int bridge_hold(const char *sock)
{
	json_t *req = json_pack("{s:s,s:s,s:[s,s,s]}", "sbx", SBX, "op", "exec", "cmd", "sh",
	                        "-c", "echo start; sleep 0.5; echo held");
	int fd = tu_unix_connect(sock, SOCK_CLOEXEC);
	struct wire_frame f;

	assert_true(fd >= 0);
	assert_int_equal(wire_send_json(fd, WIRE_REQUEST, req, NULL), 0);
	json_decref(req);
	assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL), 1);
	assert_int_equal(f.type, WIRE_DATA_OUT);
	assert_int_equal(f.len, 6);
	return fd;
}

/* expect_refused_outright: another process of our uid (a child) sends the
 * exec of script to the bridge at sock: closed with no frame at all. */
static void expect_refused_outright(const char *sock, const char *script)
{
	pid_t other = fork();
	int st;

	assert_true(other >= 0);
	if (other == 0) {
		struct answer oa;

		bridge_exec(sock, script, &oa);
		_exit(oa.frames == 0 && oa.end_type == 0 ? 0 : 1);
	}
	assert_int_equal(waitpid(other, &st, 0), other);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* expect_ok: the exec ran and printed want. */
static void expect_ok(const struct answer *a, const char *want)
{
	if (a->end_type != WIRE_RESULT)
		fail_msg("honest exec failed: %s: %s", a->error, a->message);
	assert_string_equal(a->out, want);
}

/* log_has: the file at path contains needle (bounded read). */
static bool log_has(const char *path, const char *needle)
{
	char text[16384] = { 0 };
	FILE *f;

	for (int i = 0; i < 50; i++) { /* the line may trail the answer */
		f = fopen(path, "r");
		if (f != NULL) {
			(void)!fread(text, 1, sizeof(text) - 1, f);
			fclose(f);
			if (strstr(text, needle) != NULL)
				return true;
		}
		usleep(10000);
	}
	return false;
}

/* expect_refused: ERROR verify_failed naming part, the bridge's log line
 * with (reason), and no operation output. */
static void expect_refused(const struct answer *a, const struct proc *b, const char *part,
                           const char *reason)
{
	char tag[64];

	if (a->end_type != WIRE_ERROR || strcmp(a->error, "verify_failed") != 0)
		fail_msg("not refused: end %d error \"%s\" out \"%s\"", a->end_type, a->error,
		         a->out);
	if (strstr(a->message, part) == NULL)
		fail_msg("message \"%s\" lacks \"%s\"", a->message, part);
	assert_int_equal(a->out_len, 0);
	snprintf(tag, sizeof(tag), "(%s): ", reason);
	if (!log_has(b->log, tag))
		fail_msg("bridge log %s lacks the refusal line with %s", b->log, tag);
}

/* marker_path: the file the marker command of name would create. */
static void marker_path(const char *name, char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s", root_dir, name);
}

/* marker_script: a command that proves it ran by creating root/name. */
static void marker_script(const char *name, char *out, size_t cap)
{
	char p[512];

	marker_path(name, p, sizeof(p));
	snprintf(out, cap, "echo tt-op-marker > %s", p);
}

/* ---- the recording impostor -------------------------------------------- */

/* rec_open: the impostor's record file, created empty. */
static int rec_open(const char *rec)
{
	return open(rec, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
}

/* impostor_serve: accepts on lfd forever, appending every received byte
 * (and a mark per connection) to out; never answers. Killed by the test. */
static _Noreturn void impostor_serve(int lfd, int out)
{
	if (out < 0)
		_exit(2);
	for (;;) {
		uint8_t buf[4096];
		ssize_t n;
		int c = accept(lfd, NULL, NULL);

		if (c < 0)
			continue;
		(void)!write(out, "<conn>", 6);
		while ((n = read(c, buf, sizeof(buf))) > 0)
			(void)!write(out, buf, (size_t)n);
		close(c);
	}
}

/* impostor_start: a process of uid that binds path and records (rec). */
static void impostor_start(struct proc *p, const char *path, uid_t uid, const char *rec)
{
	int r[2];
	char c;

	snprintf(p->sock, sizeof(p->sock), "%s", path);
	snprintf(p->log, sizeof(p->log), "%s", rec);
	assert_int_equal(pipe(r), 0);
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		int l, out;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(r[0]);
		/* Privileged: becomes another user, as a sandbox process of
		 * another uid would be. */
		if (uid != 0 && (setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0))
			_exit(3);
		l = tu_unix_listen(path, 16, 0);
		out = rec_open(rec);
		if (l < 0 || out < 0)
			_exit(2);
		(void)!write(r[1], "r", 1);
		impostor_serve(l, out);
	}
	close(r[1]);
	assert_int_equal(read(r[0], &c, 1), 1);
	close(r[0]);
}

/* rec_size: bytes the impostor recorded (-1: no record file). */
static off_t rec_size(const char *rec)
{
	struct stat st;

	return stat(rec, &st) < 0 ? -1 : st.st_size;
}

/* ---- tests --------------------------------------------------------------- */

/* The honest path: readiness pipe, full verification, handshake, exec. */
static void test_honest(void **state)
{
	struct proc g, b;
	struct answer a;
	char path[256];

	(void)state;
	tu_skip_unless_root();
	snprintf(path, sizeof(path), "%s/honest.sock", dir);
	assert_int_equal(guest_start(&g, path), 0);
	assert_int_equal(bridge_start(&b, path, g.pid), 0);
	for (int i = 0; i < 3; i++) { /* every connection verified anew */
		bridge_exec(b.sock, "echo hello", &a);
		expect_ok(&a, "hello\n");
	}
	proc_stop(&b);
	proc_stop(&g);
}

/* Another process takes over the guest socket path while the init still
 * runs (moves its file aside, binds its own): refused before any
 * connection, by uid (owner_changed) or by kernel evidence
 * (listener_replaced); the honest listener works again once restored. */
static void test_listener_replaced(void **state)
{
	struct proc g, b, imp;
	struct answer a;
	char sub[256], path[300], aside[320], rec[300], script[600], mark[600];

	(void)state;
	tu_skip_unless_root();
	/* A directory another uid may bind in (like the sandbox's /run). */
	snprintf(sub, sizeof(sub), "%s/run", dir);
	assert_int_equal(mkdir(sub, 0755), 0);
	assert_int_equal(chmod(sub, 0777), 0);
	snprintf(path, sizeof(path), "%s/guest.sock", sub);
	snprintf(aside, sizeof(aside), "%s/guest.sock.orig", sub);
	assert_int_equal(guest_start(&g, path), 0);
	assert_int_equal(bridge_start(&b, path, g.pid), 0);
	bridge_exec(b.sock, "echo before", &a);
	expect_ok(&a, "before\n");

	for (int round = 0; round < 2; round++) {
		uid_t uid = round == 0 ? 0 : 65534;
		char name[32];
		int held = bridge_hold(b.sock);

		snprintf(name, sizeof(name), "pwned-replaced-%d", round);
		snprintf(rec, sizeof(rec), "%s/imp-replaced-%d.rec", sub, round);
		marker_script(name, script, sizeof(script));
		marker_path(name, mark, sizeof(mark));
		assert_int_equal(rename(path, aside), 0);
		impostor_start(&imp, path, uid, rec);
		bridge_exec(b.sock, script, &a);
		if (uid == 0)
			expect_refused(&a, &b, "not held by expected pid", "listener_replaced");
		else
			expect_refused(&a, &b, "socket file owner differs", "owner_changed");
		/* Not one byte, not even a connection, reached the impostor;
		 * the marker command never ran anywhere. */
		assert_int_equal(rec_size(rec), 0);
		assert_int_equal(access(mark, F_OK), -1);
		/* The held operation ran on its verified connection to the real
		 * guest all along, replacement or not. */
		memset(&a, 0, sizeof(a));
		read_all(held, &a);
		close(held);
		expect_ok(&a, "held\n");
		proc_stop(&imp);
		/* Honest afterwards: the init's own listener is back. */
		assert_int_equal(rename(aside, path), 0);
		bridge_exec(b.sock, "echo after", &a);
		expect_ok(&a, "after\n");
	}
	proc_stop(&b);
	proc_stop(&g);
}

/* copy_self: this test binary copied to path (another inode, so another
 * executable identity), mode 0755. */
static void copy_self(const char *path)
{
	int in = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
	char buf[65536];
	ssize_t n;

	assert_true(in >= 0 && out >= 0);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		assert_int_equal(write(out, buf, (size_t)n), n);
	close(in);
	close(out);
}

/* The expected listener owner execve()s another binary in place, keeping
 * its listening socket: same pid, same start time, same socket; only the
 * executable differs -> refused (exe_changed), nothing reaches it; a real
 * guest behind its own bridge works. */
static void test_exe_changed(void **state)
{
	struct proc h = { 0 }, b, g, b2;
	struct answer a;
	char path[256], bin[256], rec[256], script[600], mark[600], lfds[16], c;
	int r[2], gate[2];
	struct proc_identity before, after;

	(void)state;
	tu_skip_unless_root();
	snprintf(path, sizeof(path), "%s/exec.sock", dir);
	snprintf(bin, sizeof(bin), "%s/impostor-bin", dir);
	snprintf(rec, sizeof(rec), "%s/imp-exec.rec", dir);
	copy_self(bin);
	assert_int_equal(pipe(r), 0);
	assert_int_equal(pipe2(gate, O_CLOEXEC), 0);
	h.pid = fork();
	assert_true(h.pid >= 0);
	if (h.pid == 0) {
		int l;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(r[0]);
		l = tu_unix_listen(path, 16, 0);
		if (l < 0)
			_exit(2);
		(void)!write(r[1], "r", 1);
		if (read(gate[0], &c, 1) != 1)
			_exit(3);
		snprintf(lfds, sizeof(lfds), "%d", l);
		execl(bin, bin, "--tt-impostor", lfds, rec, (char *)NULL);
		_exit(127);
	}
	close(r[1]);
	assert_int_equal(read(r[0], &c, 1), 1);
	close(r[0]);
	/* The bridge pins the owner as it is now (this test's binary). */
	assert_int_equal(bridge_start(&b, path, h.pid), 0);
	assert_int_equal(proc_identity_read(h.pid, &before, NULL), 0);
	assert_int_equal(write(gate[1], "g", 1), 1);
	for (int i = 0; i < 500; i++) {
		assert_int_equal(proc_identity_read(h.pid, &after, NULL), 0);
		if (after.exe_ino != before.exe_ino && rec_size(rec) == 0)
			break;
		usleep(10000);
	}
	assert_true(after.exe_ino != before.exe_ino);
	assert_int_equal(after.start_time, before.start_time);
	marker_script("pwned-exec", script, sizeof(script));
	marker_path("pwned-exec", mark, sizeof(mark));
	bridge_exec(b.sock, script, &a);
	expect_refused(&a, &b, "executable differs", "exe_changed");
	assert_int_equal(rec_size(rec), 0);
	assert_int_equal(access(mark, F_OK), -1);
	proc_stop(&b);
	proc_stop(&h);
	close(gate[0]);
	close(gate[1]);
	/* Honest: a real guest behind a bridge pinned to it. */
	snprintf(path, sizeof(path), "%s/exec-honest.sock", dir);
	assert_int_equal(guest_start(&g, path), 0);
	assert_int_equal(bridge_start(&b2, path, g.pid), 0);
	bridge_exec(b2.sock, "echo honest", &a);
	expect_ok(&a, "honest\n");
	proc_stop(&b2);
	proc_stop(&g);
}

/* A process that is not the manager (same uid, same executable, another
 * pid) connects to the bridge: closed unanswered (wrong_peer), the marker
 * never runs; the manager's own request succeeds right after. */
static void test_not_manager(void **state)
{
	struct proc g, b;
	struct answer a;
	char path[256], script[600], mark[600];

	(void)state;
	tu_skip_unless_root();
	snprintf(path, sizeof(path), "%s/notmgr.sock", dir);
	assert_int_equal(guest_start(&g, path), 0);
	assert_int_equal(bridge_start(&b, path, g.pid), 0);
	marker_script("pwned-notmgr", script, sizeof(script));
	marker_path("pwned-notmgr", mark, sizeof(mark));
	expect_refused_outright(b.sock, script);
	assert_true(log_has(b.log, "refused peer (wrong_peer)"));
	assert_int_equal(access(mark, F_OK), -1);
	bridge_exec(b.sock, "echo manager", &a);
	expect_ok(&a, "manager\n");
	proc_stop(&b);
	proc_stop(&g);
}

/* reuse_fail: records the failed step; returns 1. */
static int reuse_fail(struct reuse_res *r, const char *step)
{
	snprintf(r->step, sizeof(r->step), "%.200s: %.100s", step, strerror(errno));
	return 1;
}

/* reuse_scenario: pid 1 of a new pid namespace with its own /proc. The
 * manager M the bridge was started for does an honest exec and exits; an
 * impostor gets M's pid (set_tid) and sends the marker exec: the bridge
 * must not take it for M (its start time differs): M being gone, it is
 * only offered the adoption challenge, and its exec instead of a proof is
 * refused (adopt_malformed). Then a bridge for the live manager (us)
 * serves again. */
static int reuse_scenario(struct reuse_res *r, const char *script)
{
	struct proc g, b, b2;
	unsigned long long gstart = 0;
	const char *step;
	char path[256], c;
	int gate[2];
	pid_t m, imp;

	/* Privileged (in our own mount namespace): a /proc that shows this
	 * pid namespace's pids. */
	if ((step = tu_own_proc()) != NULL)
		return reuse_fail(r, step);
	snprintf(path, sizeof(path), "%s/reuse.sock", dir);
	if (guest_start(&g, path) < 0)
		return reuse_fail(r, "guest start");
	if (pipe2(gate, O_CLOEXEC) < 0)
		return reuse_fail(r, "pipe");
	m = fork();
	if (m < 0)
		return reuse_fail(r, "fork manager");
	if (m == 0) {
		if (read(gate[0], &c, 1) != 1)
			_exit(2);
		bridge_exec(r->bridge_sock, "echo from-manager", &r->honest);
		_exit(0);
	}
	if (procid_start_time(m, &r->manager_start, NULL) < 0 ||
	    procid_start_time(g.pid, &gstart, NULL) < 0)
		return reuse_fail(r, "start times");
	r->bridge_started = bridge_start_at(&b, path, g.pid, gstart, m) == 0;
	if (!r->bridge_started)
		return reuse_fail(r, "bridge start");
	/* The bridge's path exists only now: handed to the manager child
	 * through the shared page, read after the gate. */
	snprintf(r->bridge_sock, sizeof(r->bridge_sock), "%s", b.sock);
	if (write(gate[1], "g", 1) != 1 || waitpid(m, NULL, 0) != m)
		return reuse_fail(r, "manager run");
	r->manager_pid = m;
	/* Start times count clock ticks: let a few pass. */
	usleep(50 * 1000);
	imp = tu_clone3_at(m);
	if (imp < 0)
		return reuse_fail(r, "clone3 set_tid");
	if (imp == 0) {
		bridge_exec(b.sock, script, &r->impostor);
		_exit(0);
	}
	r->impostor_pid = imp;
	if (procid_start_time(imp, &r->impostor_start, NULL) < 0)
		r->impostor_start = 0;
	waitpid(imp, NULL, 0);
	if (!log_has(b.log, "(adopt_malformed)"))
		return reuse_fail(r, "bridge log lacks the adopt_malformed refusal");
	/* Honest afterwards: a bridge started for the live manager (us). */
	r->after_started = bridge_start(&b2, path, g.pid) == 0;
	if (r->after_started)
		bridge_exec(b2.sock, "echo after-reuse", &r->after);
	proc_stop(&b2);
	proc_stop(&b);
	proc_stop(&g);
	return 0;
}

/* The manager the bridge was started for exits and an impostor gets its
 * pid: the bridge does not take it for the manager (start time differs)
 * and, without the adoption key, refuses it; nothing runs. */
static void test_manager_pid_reuse(void **state)
{
	struct reuse_res *r;
	char script[600], mark[600];
	pid_t c;
	int st;

	(void)state;
	tu_skip_unless_root();
	marker_script("pwned-reuse", script, sizeof(script));
	marker_path("pwned-reuse", mark, sizeof(mark));
	r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
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
			_exit(reuse_scenario(r, script));
		waitpid(v, &st, 0);
		_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 12);
	}
	assert_int_equal(waitpid(c, &st, 0), c);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail_msg("scenario failed: %s", r->step);
	expect_ok(&r->honest, "from-manager\n");
	assert_int_equal(r->impostor_pid, r->manager_pid);
	assert_true(r->impostor_start != r->manager_start);
	/* Challenged, then refused: no output, nothing ran. */
	assert_int_equal(r->impostor.end_type, WIRE_ERROR);
	assert_string_equal(r->impostor.error, "verify_failed");
	assert_int_equal(r->impostor.out_len, 0);
	assert_int_equal(access(mark, F_OK), -1);
	assert_true(r->after_started);
	expect_ok(&r->after, "after-reuse\n");
	munmap(r, sizeof(*r));
}

/* A bridge told to serve an init whose pid now names another process (the
 * recorded start time no longer matches) refuses to start; with the right
 * start time it starts. */
static void test_init_reused_at_start(void **state)
{
	struct proc g, b;
	unsigned long long start = 0;
	char path[256];

	(void)state;
	tu_skip_unless_root();
	snprintf(path, sizeof(path), "%s/start.sock", dir);
	assert_int_equal(guest_start(&g, path), 0);
	assert_int_equal(procid_start_time(g.pid, &start, NULL), 0);
	assert_int_equal(bridge_start_at(&b, path, g.pid, start - 1, getpid()), -1);
	waitpid(b.pid, NULL, 0);
	assert_true(log_has(b.log, "refusing to start"));
	assert_true(log_has(b.log, "pid reused"));
	assert_int_equal(bridge_start_at(&b, path, g.pid, start, getpid()), 0);
	proc_stop(&b);
	proc_stop(&g);
}

/* spare_refused: a spare given raw assignment bytes (len may exceed the
 * pipe's atomic size: written whole) refuses them: no readiness, exit
 * status 1, nothing listening at bsock. */
static void spare_refused(const char *bsock, const void *bytes, size_t len)
{
	struct bridge_proc bp;
	struct tt_err err = { 0 };
	int st = 0;

	assert_int_equal(bridgectl_spawn(bridge_bin, &bp, &err), 0);
	assert_int_equal(write(bp.assign_fd, bytes, len), (ssize_t)len);
	close(bp.assign_fd);
	bp.assign_fd = -1;
	assert_int_equal(bridgectl_wait_ready(&bp, 5000, &err), -1);
	assert_int_equal(waitpid(bp.pid, &st, 0), bp.pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	bp.pid = 0;
	bridgectl_discard(&bp);
	assert_int_equal(access(bsock, F_OK), -1);
}

/* assignment_bytes: the secret s, then the words (NULL-terminated list),
 * each with its NUL; returns the length. */
static size_t assignment_bytes(char *out, size_t cap, const uint8_t *s, ...)
{
	size_t len = SECRET_LEN;
	const char *w;
	va_list ap;

	memcpy(out, s, SECRET_LEN);
	va_start(ap, s);
	while ((w = va_arg(ap, const char *)) != NULL) {
		assert_true(len + strlen(w) + 1 <= cap);
		memcpy(out + len, w, strlen(w) + 1);
		len += strlen(w) + 1;
	}
	va_end(ap);
	return len;
}

/* A spare bridge, spawned waiting as the manager keeps one (bridgectl.c),
 * serves the execution its assignment names, with the secret it carries:
 * the honest assignment works; one with a wrong secret starts but every
 * operation fails the guest's handshake; an assignment that names a
 * process option (--manager-pid: the manager is fixed at spawn), lacks
 * one, is truncated, bare or oversized is refused before anything
 * listens; EOF before any byte (the manager went away) exits quietly. */
static void test_spare_assignment(void **state)
{
	struct proc g;
	struct answer a;
	struct bridge_proc bp;
	struct tt_err err = { 0 };
	unsigned long long start = 0;
	uint8_t wrong[SECRET_LEN];
	char path[256], bsock[320], ipid[16], istart[32], buf[6000];
	struct bridge_assignment as;
	size_t len;
	int st = 0;

	(void)state;
	tu_skip_unless_root();
	snprintf(path, sizeof(path), "%s/spare.sock", dir);
	snprintf(bsock, sizeof(bsock), "%s/spare-bridge.sock", dir);
	assert_int_equal(guest_start(&g, path), 0);
	assert_int_equal(procid_start_time(g.pid, &start, NULL), 0);
	as = (struct bridge_assignment){ .sbx = SBX, .gen = 1, .att = 1,
	                                 .listen_path = bsock, .guest_socket = path,
	                                 .init_pid = g.pid, .init_start = start,
	                                 .secret = secret };
	/* Honest. */
	assert_int_equal(bridgectl_spawn(bridge_bin, &bp, &err), 0);
	assert_true(bridgectl_runs(&bp, bridge_bin));
	assert_int_equal(bridgectl_assign(&bp, &as, &err), 0);
	assert_int_equal(bridgectl_wait_ready(&bp, 5000, &err), 0);
	bridge_exec(bsock, "echo spare", &a);
	expect_ok(&a, "spare\n");
	bridgectl_discard(&bp);
	unlink(bsock);
	/* A wrong secret: it listens, the guest refuses its proof. */
	memcpy(wrong, secret, sizeof(wrong));
	wrong[0] ^= 1;
	as.secret = wrong;
	assert_int_equal(bridgectl_spawn(bridge_bin, &bp, &err), 0);
	assert_int_equal(bridgectl_assign(&bp, &as, &err), 0);
	assert_int_equal(bridgectl_wait_ready(&bp, 5000, &err), 0);
	bridge_exec(bsock, "echo never", &a);
	assert_int_equal(a.end_type, WIRE_ERROR);
	assert_int_equal(a.out_len, 0);
	bridgectl_discard(&bp);
	unlink(bsock);
	/* Malformed assignments. */
	snprintf(ipid, sizeof(ipid), "%d", (int)g.pid);
	snprintf(istart, sizeof(istart), "%llu", start);
	len = assignment_bytes(buf, sizeof(buf), secret, "--sbx", SBX, "--gen", "1", "--att", "1",
	                       "--listen", bsock, "--guest-socket", path, "--init-pid", ipid,
	                       "--init-start", istart, "--manager-pid", ipid, NULL);
	spare_refused(bsock, buf, len);
	len = assignment_bytes(buf, sizeof(buf), secret, "--sbx", SBX, "--gen", "1", "--att", "1",
	                       "--listen", bsock, "--guest-socket", path, "--init-pid", ipid,
	                       NULL);
	spare_refused(bsock, buf, len);
	len = assignment_bytes(buf, sizeof(buf), secret, "--sbx", SBX, "--gen", "1", "--att", "1",
	                       "--listen", bsock, "--guest-socket", path, "--init-pid", ipid,
	                       "--init-start", istart, NULL);
	spare_refused(bsock, buf, len - 1); /* the last word's NUL cut off */
	spare_refused(bsock, secret, SECRET_LEN);
	memset(buf, 'x', sizeof(buf));
	spare_refused(bsock, buf, sizeof(buf));
	/* The same words, whole: served (the cases above differ only in
	 * what they break). */
	assert_int_equal(bridgectl_spawn(bridge_bin, &bp, &err), 0);
	assert_int_equal(write(bp.assign_fd, buf, assignment_bytes(buf, sizeof(buf), secret,
	                       "--sbx", SBX, "--gen", "1", "--att", "1", "--listen", bsock,
	                       "--guest-socket", path, "--init-pid", ipid, "--init-start",
	                       istart, NULL)) > 0, 1);
	close(bp.assign_fd);
	bp.assign_fd = -1;
	assert_int_equal(bridgectl_wait_ready(&bp, 5000, &err), 0);
	bridge_exec(bsock, "echo whole", &a);
	expect_ok(&a, "whole\n");
	bridgectl_discard(&bp);
	unlink(bsock);
	/* Never assigned: EOF, exit 0, nothing logged as an error. */
	assert_int_equal(bridgectl_spawn(bridge_bin, &bp, &err), 0);
	close(bp.assign_fd);
	bp.assign_fd = -1;
	assert_int_equal(waitpid(bp.pid, &st, 0), bp.pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	bp.pid = 0;
	bridgectl_discard(&bp);
	proc_stop(&g);
}

/* adopt_try: connects to sock as a would-be manager: if the bridge offers
 * an adoption challenge (*offered), answers with the proof made under key
 * (or, key NULL, sends an exec REQUEST of script instead); returns the
 * answer's type (WIRE_HELLO with "adopted", WIRE_ERROR, or 0 for EOF). */
static int adopt_try(const char *sock, const uint8_t *key, const char *script, bool *offered)
{
	uint8_t chal[HELLO_CHALLENGE_LEN], proof[HELLO_PROOF_LEN];
	char b64[HELLO_B64_LEN + 1];
	struct wire_frame f;
	json_t *o;
	int fd = tu_unix_connect(sock, SOCK_CLOEXEC), type = 0;
	struct timeval tv = { .tv_sec = 10 };

	*offered = false;
	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL) != 1)
		goto out;
	assert_int_equal(f.type, WIRE_HELLO);
	o = wire_frame_json(&f, NULL);
	assert_int_equal(hello_b64_decode(json_string_value(json_object_get(o,
	                                  "adopt_challenge")), chal), 0);
	json_decref(o);
	*offered = true;
	if (key != NULL) {
		hello_mac(key, HELLO_ADOPT_LABEL, SBX, 1, 1, chal, proof);
		hello_b64_encode(proof, b64);
		o = json_pack("{s:s}", "proof", b64);
		assert_int_equal(wire_send_json(fd, WIRE_HELLO, o, NULL), 0);
	} else {
		o = json_pack("{s:s,s:s,s:[s,s,s]}", "sbx", SBX, "op", "exec", "cmd", "sh",
		              "-c", script);
		assert_int_equal(wire_send_json(fd, WIRE_REQUEST, o, NULL), 0);
	}
	json_decref(o);
	if (wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL) == 1) {
		type = f.type;
		o = wire_frame_json(&f, NULL);
		if (type == WIRE_HELLO && !json_is_true(json_object_get(o, "adopted")))
			type = -1;
		json_decref(o);
	}
out:
	close(fd);
	return type;
}

/* A manager restarted after a crash adopts the bridges of the executions
 * it finds (lib/hello.h, "Adoption"). While the pinned manager lives,
 * another process of our uid is refused before any byte: no challenge is
 * even offered. Once it has exited, a peer is challenged: a wrong proof,
 * or an operation sent instead of a proof, is refused and nothing runs;
 * the proof made with the adoption key (derived from the activation
 * secret, as the manager records it) makes that peer the manager, whose
 * operations are then served, and from then on the old rule holds again:
 * another process is refused without a challenge. */
static void test_adoption(void **state)
{
	struct proc g, b;
	struct answer a;
	uint8_t key[HELLO_PROOF_LEN], wrong[HELLO_PROOF_LEN];
	unsigned long long start = 0;
	char path[256], script[600], mark[600], line[96];
	bool offered;
	pid_t fake;

	(void)state;
	tu_skip_unless_root();
	snprintf(path, sizeof(path), "%s/adopt.sock", dir);
	assert_int_equal(guest_start(&g, path), 0);
	assert_int_equal(procid_start_time(g.pid, &start, NULL), 0);
	fake = fork(); /* the manager that "started" the bridge */
	assert_true(fake >= 0);
	if (fake == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		pause();
		_exit(0);
	}
	assert_int_equal(bridge_start_at(&b, path, g.pid, start, fake), 0);
	hello_adopt_key(secret, SBX, 1, 1, key);
	/* Its manager lives: not even a challenge. */
	assert_int_equal(adopt_try(b.sock, key, NULL, &offered), 0);
	assert_false(offered);
	assert_int_equal(kill(fake, SIGKILL), 0);
	assert_int_equal(waitpid(fake, NULL, 0), fake);
	/* A wrong proof. */
	memcpy(wrong, key, sizeof(wrong));
	wrong[5] ^= 0x40;
	assert_int_equal(adopt_try(b.sock, wrong, NULL, &offered), WIRE_ERROR);
	assert_true(offered);
	assert_true(log_has(b.log, "(adopt_bad_proof)"));
	/* An operation instead of a proof: refused, it never runs. */
	marker_script("pwned-adopt", script, sizeof(script));
	marker_path("pwned-adopt", mark, sizeof(mark));
	assert_int_equal(adopt_try(b.sock, NULL, script, &offered), WIRE_ERROR);
	assert_true(offered);
	assert_true(log_has(b.log, "(adopt_malformed)"));
	assert_int_equal(access(mark, F_OK), -1);
	/* The honest successor: adopted, then served. */
	assert_int_equal(adopt_try(b.sock, key, NULL, &offered), WIRE_HELLO);
	snprintf(line, sizeof(line), "adopted by manager pid %d", (int)getpid());
	assert_true(log_has(b.log, line));
	bridge_exec(b.sock, "echo adopted", &a);
	expect_ok(&a, "adopted\n");
	/* The successor lives: anyone else is refused outright again. */
	expect_refused_outright(b.sock, script);
	assert_int_equal(access(mark, F_OK), -1);
	proc_stop(&b);
	proc_stop(&g);
}

/* group_teardown: removes the scratch directory. */
static int group_teardown(void **state)
{
	char cmd[300];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* group_setup: scratch dir, guest root, binaries, the activation secret. */
static int group_setup(void **state)
{
	const char *g = getenv("TETHER_GUEST_BIN"), *b = getenv("TETHER_BRIDGE_BIN");

	(void)state;
	if (sodium_init() < 0 || mkdtemp(dir) == NULL || chmod(dir, 0755) < 0)
		return -1;
	snprintf(root_dir, sizeof(root_dir), "%s/root", dir);
	if (mkdir(root_dir, 0755) < 0)
		return -1;
	/* Absolute paths: the pid-namespace scenario runs the same files. */
	if (realpath(g ? g : "build/tether-guest", guest_bin) == NULL ||
	    realpath(b ? b : "build/tether-bridge", bridge_bin) == NULL)
		return -1;
	randombytes_buf(secret, sizeof(secret));
	return 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_honest),
		cmocka_unit_test(test_listener_replaced),
		cmocka_unit_test(test_exe_changed),
		cmocka_unit_test(test_not_manager),
		cmocka_unit_test(test_manager_pid_reuse),
		cmocka_unit_test(test_init_reused_at_start),
		cmocka_unit_test(test_spare_assignment),
		cmocka_unit_test(test_adoption),
	};

	/* test_exe_changed re-executes a copy of this binary as the
	 * impostor that took over the listener. */
	if (argc == 4 && strcmp(argv[1], "--tt-impostor") == 0)
		impostor_serve(atoi(argv[2]), rec_open(argv[3]));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

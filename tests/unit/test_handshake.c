/* The guest handshake and the no-reconnect rule (SPEC §5), with real
 * processes: this test plays the sbx-manager (its pid is the bridge's
 * --manager-pid), build/tetherd bridge is the real host bridge, and behind
 * it runs either the real build/tether-guest (on a temp root, with its own
 * activation secret) or an impostor listener, forked here, that records
 * every byte it receives. Secrets go to both over pipes, as the manager
 * does. Needs root only because the bridge insists on its peer's uid being
 * its own (same uid here). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
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
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "hello.h"
#include "substrate/ns/ns.h"
#include "wire.h"
#include "wire_json.h"
#include "testutil.h"

#define SBX "sbx_hhhhhhhhhhhhhhhhhhhhhhhhhh"
#define GEN 3
/* Marks the operation bytes: must never reach an unverified listener. */
#define MARKER "tt-op-marker-4242"

static char dir[] = "/tmp/tt-hs.XXXXXX";
static char root_dir[256];
static uint8_t secret_a[HELLO_SECRET_LEN], secret_b[HELLO_SECRET_LEN];
static uint8_t rbuf[WIRE_PAYLOAD_MAX + 1];
static int seq;

/* A started process and the paths it uses. */
struct proc {
	pid_t pid;
	char sock[256];
	char log[256];
};

/* The end of one operation through the bridge. */
struct answer {
	uint8_t end_type;     /* WIRE_RESULT, WIRE_ERROR or 0 (EOF) */
	json_t *end;
	char out[4096];
	size_t out_len;
};

/* answer_free: drops the JSON. */
static void answer_free(struct answer *a)
{
	json_decref(a->end);
	memset(a, 0, sizeof(*a));
}

/* secret_fd: a pipe holding secret, write end closed; returns the read end. */
static int secret_fd(const uint8_t *secret)
{
	return tu_secret_pipe(secret, HELLO_SECRET_LEN);
}

/* guest_start: the real agent for SBX/GEN/att with secret. */
static void guest_start(struct proc *g, uint32_t att, const uint8_t *secret)
{
	const char *bin = getenv("TETHER_GUEST_BIN") ? getenv("TETHER_GUEST_BIN")
	                                             : "build/tether-guest";
	char attv[16], sfd[16];
	int fd = secret_fd(secret);

	snprintf(g->sock, sizeof(g->sock), "%s/guest-%d.sock", dir, ++seq);
	snprintf(attv, sizeof(attv), "%u", att);
	snprintf(sfd, sizeof(sfd), "%d", fd);
	g->pid = fork();
	assert_true(g->pid >= 0);
	if (g->pid == 0) {
		/* Nothing outlives a failed test. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execl(bin, bin, "--listen", g->sock, "--sbx", SBX, "--gen", "3", "--att", attv,
		      "--root", root_dir, "--secret-fd", sfd, (char *)NULL);
		_exit(127);
	}
	close(fd);
	tu_wait_listening(g->sock);
}

/* bridge_start: the real bridge for SBX/GEN/att with secret, in front of
 * the listener at guest_sock owned by init (pid and start time). */
static void bridge_start(struct proc *b, uint32_t att, const uint8_t *secret,
                         const char *guest_sock, pid_t init)
{
	const char *bin = getenv("TETHER_BRIDGE_BIN") ? getenv("TETHER_BRIDGE_BIN") : "build/tether-bridge";
	char attv[16], ipid[16], istart[32], mpid[16];
	unsigned long long start = 0;
	struct tt_err err = { 0 };
	int fd = secret_fd(secret);

	assert_int_equal(proc_start_time(init, &start, &err), 0);
	snprintf(b->sock, sizeof(b->sock), "%s/bridge-%d.sock", dir, ++seq);
	snprintf(b->log, sizeof(b->log), "%s/bridge-%d.log", dir, seq);
	snprintf(attv, sizeof(attv), "%u", att);
	snprintf(ipid, sizeof(ipid), "%d", (int)init);
	snprintf(istart, sizeof(istart), "%llu", start);
	snprintf(mpid, sizeof(mpid), "%d", (int)getpid());
	b->pid = fork();
	assert_true(b->pid >= 0);
	if (b->pid == 0) {
		int lfd;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		lfd = open(b->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		/* The secret on fd 3 exactly as the manager hands it. */
		if (lfd < 0 || dup2(lfd, 2) < 0 || dup2(fd, 3) < 0)
			_exit(126);
		execl(bin, "tether-bridge", "--sbx", SBX, "--gen", "3", "--att", attv,
		      "--listen", b->sock, "--guest-socket", guest_sock, "--init-pid", ipid,
		      "--init-start", istart, "--manager-pid", mpid, "--secret-fd", "3",
		      (char *)NULL);
		_exit(127);
	}
	close(fd);
	tu_wait_listening(b->sock);
}

/* proc_stop: SIGTERM, 3 s to go, then SIGKILL; reaped. */
static void proc_stop(struct proc *p)
{
	tu_term_reap(&p->pid);
}

/* read_all: frames until RESULT, ERROR or EOF (10 s bound per read). */
static void read_all(int fd, struct answer *a)
{
	struct timeval tv = { .tv_sec = 10 };
	struct wire_frame f;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (;;) {
		if (wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL) != 1)
			return;
		if (f.type == WIRE_DATA_OUT && a->out_len + f.len < sizeof(a->out)) {
			memcpy(a->out + a->out_len, f.payload, f.len);
			a->out_len += f.len;
			a->out[a->out_len] = '\0';
		} else if (f.type == WIRE_RESULT || f.type == WIRE_ERROR) {
			a->end_type = f.type;
			a->end = wire_frame_json(&f, NULL);
			return;
		}
	}
}

/* bridge_open: connects to the bridge and sends an exec REQUEST for
 * sh -c script (as the manager forwards it: no token). */
static int bridge_open(const struct proc *b, const char *script)
{
	json_t *req = json_pack("{s:s,s:s,s:[s,s,s]}", "sbx", SBX, "op", "exec", "cmd", "sh",
	                        "-c", script);
	int fd = tu_unix_connect(b->sock, SOCK_CLOEXEC);

	assert_true(fd >= 0);
	assert_int_equal(wire_send_json(fd, WIRE_REQUEST, req, NULL), 0);
	json_decref(req);
	return fd;
}

/* bridge_exec: one whole exec through the bridge. */
static void bridge_exec(const struct proc *b, const char *script, struct answer *a)
{
	int fd = bridge_open(b, script);

	memset(a, 0, sizeof(*a));
	read_all(fd, a);
	close(fd);
}

/* err_code: the ERROR's code. */
static const char *err_code(const struct answer *a)
{
	assert_int_equal(a->end_type, WIRE_ERROR);
	return json_string_value(json_object_get(a->end, "error"));
}

/* expect_refused: ERROR verify_failed whose message names the handshake
 * failure, and the bridge's log line names the reason. */
static void expect_refused(const struct answer *a, const struct proc *b, const char *msg_part,
                           const char *reason)
{
	const char *msg;
	char logtext[8192] = { 0 }, tag[64];
	FILE *f;

	assert_string_equal(err_code(a), "verify_failed");
	msg = json_string_value(json_object_get(a->end, "message"));
	assert_non_null(msg);
	if (strstr(msg, msg_part) == NULL)
		fail_msg("message \"%s\" lacks \"%s\"", msg, msg_part);
	usleep(50000);
	f = fopen(b->log, "r");
	assert_non_null(f);
	(void)!fread(logtext, 1, sizeof(logtext) - 1, f);
	fclose(f);
	snprintf(tag, sizeof(tag), "(%s): ", reason);
	if (strstr(logtext, "refused guest") == NULL || strstr(logtext, tag) == NULL)
		fail_msg("bridge log lacks the refusal line with %s:\n%s", tag, logtext);
}

/* file_exists: a path inside the guest root (the default cwd of execs:
 * outside a sandbox the guest's root only confines file operations). */
static bool file_exists(const char *rel)
{
	char p[512];

	snprintf(p, sizeof(p), "%s/%s", root_dir, rel);
	return access(p, F_OK) == 0;
}

/* ---- the impostor: a listener that records everything it receives ---- */

enum imp_mode {
	IMP_OTHER_ACTIVATION, /* a valid proof, but for activation 1 */
	IMP_SILENT,           /* never answers */
	IMP_GARBAGE,          /* answers bytes that are not a frame */
	IMP_EARLY_RESULT,     /* answers a RESULT instead of a HELLO */
};

/* imp_answer: the impostor's reply to the HELLO payload it received. */
static void imp_answer(int c, enum imp_mode mode, const struct wire_frame *f)
{
	uint8_t chal[HELLO_CHALLENGE_LEN], proof[HELLO_PROOF_LEN];
	char b64[HELLO_B64_LEN + 1];
	json_t *h, *a;

	switch (mode) {
	case IMP_OTHER_ACTIVATION:
		/* It holds a real secret (A) and answers the fresh challenge,
		 * but as the agent of activation 1. */
		h = wire_frame_json(f, NULL);
		if (h == NULL ||
		    hello_b64_decode(json_string_value(json_object_get(h, "challenge")), chal) < 0)
			_exit(3);
		json_decref(h);
		hello_proof(secret_a, SBX, GEN, 1, chal, proof);
		hello_b64_encode(proof, b64);
		a = json_pack("{s:s}", "proof", b64);
		wire_send_json(c, WIRE_HELLO, a, NULL);
		json_decref(a);
		break;
	case IMP_SILENT:
		break;
	case IMP_GARBAGE:
		(void)!write(c, "HTTP/1.1 200 OK\r\n\r\n", 19);
		break;
	case IMP_EARLY_RESULT:
		a = json_pack("{s:i,s:i}", "exit_code", 0, "generation", GEN);
		wire_send_json(c, WIRE_RESULT, a, NULL);
		json_decref(a);
		break;
	}
}

/* impostor_main: listens at sock, serves one connection: records every
 * byte to rec, answers the first frame per mode, reads on until EOF. */
__attribute__((noreturn)) static void impostor_main(const char *sock, const char *rec,
                                                    enum imp_mode mode, int ready)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	static uint8_t all[WIRE_PAYLOAD_MAX * 2];
	size_t have = 0;
	bool answered = false;
	int l = socket(AF_UNIX, SOCK_STREAM, 0), c, out;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 4) < 0)
		_exit(2);
	(void)!write(ready, "r", 1);
	close(ready);
	/* The first connection is the readiness probe of the test itself. */
	for (int probe = 0; probe < 2; probe++) {
		c = accept(l, NULL, NULL);
		if (c < 0)
			_exit(2);
		if (probe == 0)
			close(c);
	}
	for (;;) {
		struct pollfd pf = { .fd = c, .events = POLLIN };
		ssize_t n;

		if (poll(&pf, 1, 8000) <= 0)
			break;
		n = read(c, all + have, sizeof(all) - have);
		if (n <= 0)
			break;
		have += (size_t)n;
		if (!answered && have >= WIRE_HDR_LEN) {
			uint8_t type;
			uint32_t len;

			if (wire_hdr_decode(all, &type, &len, NULL) == 0 &&
			    have >= WIRE_HDR_LEN + len) {
				struct wire_frame f = { .type = type, .len = len };
				uint8_t copy[WIRE_PAYLOAD_MAX + 1];

				memcpy(copy, all + WIRE_HDR_LEN, len);
				copy[len] = '\0';
				f.payload = copy;
				imp_answer(c, mode, &f);
				answered = true;
			}
		}
	}
	out = open(rec, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (out < 0 || write(out, all, have) != (ssize_t)have)
		_exit(4);
	close(out);
	_exit(0);
}

/* impostor_start: forks the impostor; returns once it listens. */
static void impostor_start(struct proc *p, enum imp_mode mode)
{
	int r[2];
	char c;

	snprintf(p->sock, sizeof(p->sock), "%s/imp-%d.sock", dir, ++seq);
	snprintf(p->log, sizeof(p->log), "%s/imp-%d.rec", dir, seq);
	assert_int_equal(pipe(r), 0);
	p->pid = fork();
	assert_true(p->pid >= 0);
	if (p->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(r[0]);
		impostor_main(p->sock, p->log, mode, r[1]);
	}
	close(r[1]);
	assert_int_equal(read(r[0], &c, 1), 1);
	close(r[0]);
	{
		int fd = tu_unix_connect(p->sock, SOCK_CLOEXEC); /* the probe it expects */

		assert_true(fd >= 0);
		close(fd);
	}
}

/* impostor_check: the impostor received exactly one frame, the bridge's
 * HELLO for our identity, and none of the operation's bytes. */
static void impostor_check(struct proc *p)
{
	static uint8_t all[WIRE_PAYLOAD_MAX * 2];
	struct wire_frame f;
	uint8_t type;
	uint32_t len;
	json_t *h;
	ssize_t n;
	int st, fd;

	assert_int_equal(waitpid(p->pid, &st, 0), p->pid);
	p->pid = 0;
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	fd = open(p->log, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, all, sizeof(all));
	close(fd);
	assert_true(n >= WIRE_HDR_LEN);
	assert_int_equal(wire_hdr_decode(all, &type, &len, NULL), 0);
	assert_int_equal(type, WIRE_HELLO);
	/* Nothing after the HELLO: no REQUEST, no input. */
	assert_int_equal((size_t)n, WIRE_HDR_LEN + len);
	assert_null(memmem(all, (size_t)n, MARKER, strlen(MARKER)));
	all[WIRE_HDR_LEN + len] = '\0';
	f = (struct wire_frame){ .type = type, .len = len, .payload = all + WIRE_HDR_LEN };
	h = wire_frame_json(&f, NULL);
	assert_non_null(h);
	assert_string_equal(json_string_value(json_object_get(h, "sbx")), SBX);
	assert_int_equal(json_integer_value(json_object_get(h, "activation")), 2);
	json_decref(h);
}

/* ---- tests -------------------------------------------------------------- */

static int group_setup(void **state)
{
	(void)state;
	if (geteuid() != 0 || sodium_init() < 0 || mkdtemp(dir) == NULL)
		return -1;
	snprintf(root_dir, sizeof(root_dir), "%s/root", dir);
	if (mkdir(root_dir, 0755) < 0)
		return -1;
	randombytes_buf(secret_a, sizeof(secret_a));
	randombytes_buf(secret_b, sizeof(secret_b));
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

static int group_teardown(void **state)
{
	char cmd[300];

	(void)state;
	sodium_memzero(secret_a, sizeof(secret_a));
	sodium_memzero(secret_b, sizeof(secret_b));
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* cmp_double: qsort order. */
static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return (a > b) - (a < b);
}

/* test_honest: the matching guest answers the challenge; the exec runs,
 * every time on a new, fully verified connection (median time printed). */
static void test_honest(void **state)
{
	enum { N = 21 };
	struct proc g = { 0 }, b = { 0 };
	struct timespec t0, t1;
	double ms[N];
	struct answer a;

	(void)state;
	guest_start(&g, 1, secret_a);
	bridge_start(&b, 1, secret_a, g.sock, g.pid);
	for (int i = 0; i < N; i++) {
		clock_gettime(CLOCK_MONOTONIC, &t0);
		bridge_exec(&b, "echo honest", &a);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		ms[i] = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
		assert_int_equal(a.end_type, WIRE_RESULT);
		assert_string_equal(a.out, "honest\n");
		answer_free(&a);
	}
	qsort(ms, N, sizeof(ms[0]), cmp_double);
	print_message("# exec through bridge (listener check + handshake + run): "
	              "median %.2f ms over %d\n", ms[N / 2], N);
	proc_stop(&b);
	proc_stop(&g);
}

/* test_other_activation: a real guest of activation 1 behind a bridge for
 * activation 2 refuses the handshake; the operation never runs there. Then
 * the right bridge on the same guest succeeds. */
static void test_other_activation(void **state)
{
	struct proc g = { 0 }, b = { 0 };
	struct answer a;

	(void)state;
	guest_start(&g, 1, secret_a);
	bridge_start(&b, 2, secret_a, g.sock, g.pid);
	bridge_exec(&b, "touch other-activation # " MARKER, &a);
	expect_refused(&a, &b, "guest handshake: guest refused: wrong_activation",
	               "wrong_activation");
	answer_free(&a);
	assert_false(file_exists("other-activation"));
	proc_stop(&b);

	bridge_start(&b, 1, secret_a, g.sock, g.pid);
	bridge_exec(&b, "touch other-activation; echo done", &a);
	assert_int_equal(a.end_type, WIRE_RESULT);
	assert_string_equal(a.out, "done\n");
	answer_free(&a);
	assert_true(file_exists("other-activation"));
	proc_stop(&b);
	proc_stop(&g);
}

/* test_wrong_secret: the right activation but another secret: the proof
 * does not verify, the operation never runs; the right secret works. */
static void test_wrong_secret(void **state)
{
	struct proc g = { 0 }, b = { 0 };
	struct answer a;

	(void)state;
	guest_start(&g, 1, secret_b);
	bridge_start(&b, 1, secret_a, g.sock, g.pid);
	bridge_exec(&b, "touch wrong-secret", &a);
	expect_refused(&a, &b, "guest handshake: wrong proof", "bad_proof");
	answer_free(&a);
	assert_false(file_exists("wrong-secret"));
	proc_stop(&b);

	bridge_start(&b, 1, secret_b, g.sock, g.pid);
	bridge_exec(&b, "echo right secret", &a);
	assert_int_equal(a.end_type, WIRE_RESULT);
	assert_string_equal(a.out, "right secret\n");
	answer_free(&a);
	proc_stop(&b);
	proc_stop(&g);
}

/* run_impostor: one impostor mode behind a bridge for activation 2 with
 * secret A: refused with reason, and the impostor saw only the HELLO. */
static void run_impostor(enum imp_mode mode, const char *msg_part, const char *reason)
{
	struct proc imp = { 0 }, b = { 0 };
	struct answer a;

	impostor_start(&imp, mode);
	bridge_start(&b, 2, secret_a, imp.sock, imp.pid);
	bridge_exec(&b, "echo " MARKER, &a);
	expect_refused(&a, &b, msg_part, reason);
	answer_free(&a);
	proc_stop(&b);
	impostor_check(&imp);
}

/* test_impostors: a listener that passes the pid/start-time check (it IS
 * the recorded process) but is not the agent of this activation: answering
 * with another activation's valid proof, not answering, answering garbage
 * or a premature RESULT. Each is refused and receives no operation byte.
 * The honest pair still works afterwards. */
static void test_impostors(void **state)
{
	struct timespec t0, t1;

	(void)state;
	run_impostor(IMP_OTHER_ACTIVATION, "guest handshake: wrong proof", "bad_proof");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	run_impostor(IMP_SILENT, "guest handshake: no answer within 2 s", "handshake_timeout");
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* Bounded by the handshake deadline, not by the impostor. */
	assert_true(t1.tv_sec - t0.tv_sec < 6);
	run_impostor(IMP_GARBAGE, "guest handshake: wire: bad magic", "handshake_malformed");
	run_impostor(IMP_EARLY_RESULT, "guest handshake: expected HELLO, got RESULT",
	             "handshake_malformed");
	test_honest(state);
}

/* test_listener_refused: a bridge whose recorded init is not the process
 * listening (here: the test itself) refuses before any byte goes out. */
static void test_listener_refused(void **state)
{
	struct proc g = { 0 }, b = { 0 };
	struct answer a;

	(void)state;
	guest_start(&g, 1, secret_a);
	bridge_start(&b, 1, secret_a, g.sock, getpid());
	bridge_exec(&b, "touch wrong-listener", &a);
	expect_refused(&a, &b, "not held by expected pid", "listener_replaced");
	answer_free(&a);
	assert_false(file_exists("wrong-listener"));
	proc_stop(&b);
	proc_stop(&g);
}

/* child_of: the single child pid of parent (from /proc), or 0. */
static pid_t child_of(pid_t parent)
{
	char path[64], buf[256] = { 0 };
	FILE *f;
	int pid = 0;

	snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)parent, (int)parent);
	f = fopen(path, "r");
	if (f == NULL)
		return 0;
	if (fgets(buf, sizeof(buf), f) == NULL || sscanf(buf, "%d", &pid) != 1)
		pid = 0;
	fclose(f);
	return pid;
}

/* test_no_reconnect: the guest's handler for a running exec is killed:
 * that exec fails with ERROR transport (no retry on another connection);
 * the next exec succeeds on a new, freshly verified connection, served by
 * a different handler. */
static void test_no_reconnect(void **state)
{
	struct proc g = { 0 }, b = { 0 };
	struct answer a = { 0 };
	struct wire_frame f;
	pid_t handler, cmd, handler2;
	int fd;

	(void)state;
	guest_start(&g, 1, secret_a);
	bridge_start(&b, 1, secret_a, g.sock, g.pid);
	fd = bridge_open(&b, "echo $PPID $$; exec sleep 30");
	assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL), 1);
	assert_int_equal(f.type, WIRE_DATA_OUT);
	assert_int_equal(sscanf((char *)f.payload, "%d %d", &handler, &cmd), 2);
	assert_int_equal(child_of(g.pid), handler);
	assert_int_equal(kill(handler, SIGKILL), 0);
	read_all(fd, &a);
	close(fd);
	assert_string_equal(err_code(&a), "transport");
	answer_free(&a);
	kill(cmd, SIGKILL); /* the orphaned sleep */

	bridge_exec(&b, "echo $PPID", &a);
	assert_int_equal(a.end_type, WIRE_RESULT);
	handler2 = (pid_t)atoi(a.out);
	assert_true(handler2 > 0 && handler2 != handler);
	answer_free(&a);
	proc_stop(&b);
	proc_stop(&g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_honest),
		cmocka_unit_test(test_other_activation),
		cmocka_unit_test(test_wrong_secret),
		cmocka_unit_test(test_impostors),
		cmocka_unit_test(test_listener_refused),
		cmocka_unit_test(test_no_reconnect),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/* tether-guest end to end: starts the real static agent (TETHER_GUEST_BIN,
 * default build/tether-guest) on a temp root with an activation secret and
 * drives every operation over its unix socket with the wire protocol, each
 * connection opened with the bridge's handshake (lib/hello.h). Most tests
 * use one operation per connection; the test_seq_* ones run operations in
 * sequence on one connection (notes/seq.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "hello.h"
#include "wire.h"
#include "wire_json.h"

#define GEN 7
#define SBX "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa"

static char root_dir[] = "/tmp/tt-guest-root.XXXXXX";
static char sock_dir[] = "/tmp/tt-guest-sock.XXXXXX";
static char sock_path[256];
static pid_t guest_pid = -1;
static uint8_t rbuf[WIRE_PAYLOAD_MAX + 1];
static uint8_t secret[HELLO_SECRET_LEN];

/* What one operation produced. */
struct op_out {
	char *out, *err;        /* malloc'd, NUL-terminated */
	size_t out_len, err_len;
	uint8_t end_type;       /* WIRE_RESULT, WIRE_ERROR, or 0 on EOF */
	json_t *end;            /* the final JSON */
	json_t *meta;           /* the META, if one came (before any byte) */
	size_t out_frames;      /* DATA_OUT frames */
};

/* now_ms: monotonic milliseconds. */
static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* rpath: a host path inside the guest root. */
static const char *rpath(const char *rel)
{
	static char buf[4][512];
	static int i;

	i = (i + 1) % 4;
	snprintf(buf[i], sizeof(buf[i]), "%s%s", root_dir, rel);
	return buf[i];
}

/* write_file: creates a host file with content. */
static void write_file(const char *path, const char *content)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(content, f);
	fclose(f);
}

/* guest_launch: runs the guest binary on sock over root_dir with the
 * test's secret (extra: one more option and its value, or NULL) and waits
 * for "ready"; its pid, or -1. */
static pid_t guest_launch(const char *sock, const char *extra, const char *extra_val)
{
	const char *bin = getenv("TETHER_GUEST_BIN");
	char fdarg[16], sfdarg[16], line[16] = { 0 };
	int p[2], sp[2];
	pid_t pid;

	/* The secret's pipe: filled and closed, the guest reads it then EOF. */
	if (pipe(sp) < 0 || write(sp[1], secret, sizeof(secret)) != (ssize_t)sizeof(secret))
		return -1;
	close(sp[1]);
	if (bin == NULL)
		bin = "build/tether-guest";
	if (pipe(p) < 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		close(p[0]);
		snprintf(fdarg, sizeof(fdarg), "%d", p[1]);
		snprintf(sfdarg, sizeof(sfdarg), "%d", sp[0]);
		execl(bin, bin, "--listen", sock, "--sbx", SBX, "--gen", "7", "--att", "1",
		      "--root", root_dir, "--ready-fd", fdarg, "--secret-fd", sfdarg,
		      extra, extra_val, (char *)NULL);
		fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	close(p[1]);
	close(sp[0]);
	struct pollfd pf = { .fd = p[0], .events = POLLIN };
	if (poll(&pf, 1, 5000) != 1 || read(p[0], line, sizeof(line) - 1) != 6 ||
	    strcmp(line, "ready\n") != 0) {
		fprintf(stderr, "guest did not become ready\n");
		close(p[0]);
		return -1;
	}
	close(p[0]);
	return pid;
}

static int group_setup(void **state)
{
	(void)state;
	if (sodium_init() < 0)
		return -1;
	randombytes_buf(secret, sizeof(secret));
	if (mkdtemp(root_dir) == NULL || mkdtemp(sock_dir) == NULL)
		return -1;
	snprintf(sock_path, sizeof(sock_path), "%s/guest.sock", sock_dir);
	/* A host variable that must not leak into exec'd commands. */
	setenv("TT_LEAK_CHECK", "leaked", 1);
	guest_pid = guest_launch(sock_path, NULL, NULL);
	return guest_pid < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	char cmd[600];
	int status;

	(void)state;
	if (guest_pid > 0) {
		kill(guest_pid, SIGTERM);
		waitpid(guest_pid, &status, 0);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", root_dir, sock_dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* g_connect_raw_at: a new connection to the guest on sock, no handshake. */
static int g_connect_raw_at(const char *sock)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	strcpy(sa.sun_path, sock);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* g_connect_raw: a new connection to the test's guest, no handshake. */
static int g_connect_raw(void)
{
	return g_connect_raw_at(sock_path);
}

/* g_hello: sends a HELLO for (sbx, gen, att) with a fresh challenge and
 * reads the answer frame into rbuf; fills the challenge. Returns the
 * answer's type (0 on EOF). */
static uint8_t g_hello(int fd, const char *sbx, uint64_t gen, uint32_t att,
                       uint8_t chal[HELLO_CHALLENGE_LEN], struct wire_frame *f)
{
	char b64[HELLO_B64_LEN + 1];
	struct tt_err err = { 0 };
	json_t *h;

	randombytes_buf(chal, HELLO_CHALLENGE_LEN);
	hello_b64_encode(chal, b64);
	h = json_pack("{s:i,s:s,s:s,s:I,s:I}", "v", 1, "challenge", b64, "sbx", sbx,
	              "generation", (json_int_t)gen, "activation", (json_int_t)att);
	assert_int_equal(wire_send_json(fd, WIRE_HELLO, h, &err), 0);
	json_decref(h);
	return wire_recv(fd, f, rbuf, sizeof(rbuf), &err) == 1 ? f->type : 0;
}

/* g_connect_at: a new connection to the guest on sock with the handshake
 * done, as the bridge opens it; checks the guest's proof. */
static int g_connect_at(const char *sock)
{
	uint8_t chal[HELLO_CHALLENGE_LEN], want[HELLO_PROOF_LEN], got[HELLO_PROOF_LEN];
	struct tt_err err = { 0 };
	struct wire_frame f;
	int fd = g_connect_raw_at(sock);
	json_t *a;

	assert_int_equal(g_hello(fd, SBX, GEN, 1, chal, &f), WIRE_HELLO);
	a = wire_frame_json(&f, &err);
	assert_non_null(a);
	assert_int_equal(hello_b64_decode(json_string_value(json_object_get(a, "proof")), got), 0);
	json_decref(a);
	hello_proof(secret, SBX, GEN, 1, chal, want);
	assert_memory_equal(got, want, HELLO_PROOF_LEN);
	return fd;
}

/* g_connect: a handshaken connection to the test's guest. */
static int g_connect(void)
{
	return g_connect_at(sock_path);
}

/* append: grows a malloc'd buffer by n bytes. */
static void append(char **buf, size_t *len, const uint8_t *p, size_t n)
{
	*buf = realloc(*buf, *len + n + 1);
	assert_non_null(*buf);
	memcpy(*buf + *len, p, n);
	*len += n;
	(*buf)[*len] = '\0';
}

/* op_collect_more: reads frames into o until RESULT, ERROR or EOF; at most
 * one META, and only before any DATA_OUT. */
static void op_collect_more(int fd, struct op_out *o)
{
	struct tt_err err = { 0 };
	struct wire_frame f;

	for (;;) {
		int rc = wire_recv(fd, &f, rbuf, sizeof(rbuf), &err);

		if (rc <= 0)
			return;
		if (f.type == WIRE_DATA_OUT) {
			append(&o->out, &o->out_len, f.payload, f.len);
			o->out_frames++;
		} else if (f.type == WIRE_META) {
			assert_null(o->meta);
			assert_int_equal(o->out_len, 0);
			o->meta = wire_frame_json(&f, &err);
			assert_non_null(o->meta);
		} else if (f.type == WIRE_STDERR)
			append(&o->err, &o->err_len, f.payload, f.len);
		else if (f.type == WIRE_RESULT || f.type == WIRE_ERROR) {
			o->end_type = f.type;
			o->end = wire_frame_json(&f, &err);
			assert_non_null(o->end);
			return;
		} else
			fail_msg("unexpected frame %s", wire_type_name(f.type));
	}
}

/* op_collect: reads frames until RESULT, ERROR or EOF. */
static void op_collect(int fd, struct op_out *o)
{
	memset(o, 0, sizeof(*o));
	append(&o->out, &o->out_len, (const uint8_t *)"", 0);
	append(&o->err, &o->err_len, (const uint8_t *)"", 0);
	op_collect_more(fd, o);
}

/* op_run: one operation: REQUEST (raw JSON text), optional input as
 * DATA_IN frames, optional EOF_IN, then the answer. */
static void op_run(const char *req, const void *in, size_t in_len, int eof,
                   struct op_out *o)
{
	int fd = g_connect(), sent_ok = 1;
	struct tt_err err = { 0 };

	assert_int_equal(wire_send(fd, WIRE_REQUEST, req, (uint32_t)strlen(req), &err), 0);
	/* The guest may answer ERROR and close before taking the input (e.g.
	 * a write to a directory): then sending fails and the answer is read. */
	for (size_t off = 0; off < in_len && sent_ok;) {
		size_t n = in_len - off > WIRE_PAYLOAD_MAX ? WIRE_PAYLOAD_MAX : in_len - off;

		sent_ok = wire_send(fd, WIRE_DATA_IN, (const uint8_t *)in + off,
		                    (uint32_t)n, &err) == 0;
		off += n;
	}
	if (eof && sent_ok)
		sent_ok = wire_send(fd, WIRE_EOF_IN, NULL, 0, &err) == 0;
	op_collect(fd, o);
	if (!sent_ok)
		assert_int_equal(o->end_type, WIRE_ERROR);
	close(fd);
}

/* opf: op_run with a printf-formatted request and no input. */
static void opf(struct op_out *o, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void opf(struct op_out *o, const char *fmt, ...)
{
	char req[8192];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(req, sizeof(req), fmt, ap);
	va_end(ap);
	op_run(req, NULL, 0, 0, o);
}

/* op_free: releases an op_out. */
static void op_free(struct op_out *o)
{
	free(o->out);
	free(o->err);
	json_decref(o->end);
	json_decref(o->meta);
	memset(o, 0, sizeof(*o));
}

/* jint: integer member of the final JSON. */
static long long jint(const struct op_out *o, const char *key)
{
	json_t *v = json_object_get(o->end, key);

	assert_true(json_is_integer(v));
	return json_integer_value(v);
}

/* expect_result: the op ended with RESULT carrying our generation. */
static void expect_result(const struct op_out *o)
{
	if (o->end_type != WIRE_RESULT) {
		char *s = o->end ? json_dumps(o->end, 0) : NULL;

		fail_msg("expected RESULT, got %s", s ? s : "EOF");
	}
	assert_int_equal(jint(o, "generation"), GEN);
}

/* expect_error: the op ended with ERROR code. */
static void expect_error(const struct op_out *o, const char *code)
{
	assert_int_equal(o->end_type, WIRE_ERROR);
	assert_string_equal(json_string_value(json_object_get(o->end, "error")), code);
	assert_true(json_is_string(json_object_get(o->end, "message")));
}

static void test_exec_basic(void **state)
{
	struct op_out o;
	char script[64];
	int fd;

	(void)state;
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"echo hi; echo err >&2; exit 3\"]}");
	expect_result(&o);
	assert_string_equal(o.out, "hi\n");
	assert_string_equal(o.err, "err\n");
	assert_int_equal(jint(&o, "exit_code"), 3);
	assert_null(json_object_get(o.end, "signal"));
	op_free(&o);

	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"kill -9 $$\"]}");
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 137);
	assert_int_equal(jint(&o, "signal"), 9);
	op_free(&o);

	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"/no/such/command\"]}");
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 127);
	assert_non_null(strstr(o.err, "/no/such/command"));
	op_free(&o);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"no-such-command-tt\"]}");
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 127);
	op_free(&o);
	/* found but not runnable: 126, as sh says */
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"/etc/passwd\"]}");
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 126);
	op_free(&o);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"/tmp\"]}");
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 126);
	op_free(&o);
	/* A script without #! is what posix_spawn refuses (ENOEXEC) and
	 * execvp hands to sh: the agent's spawn keeps execvp's behaviour. */
	snprintf(script, sizeof(script), "/tmp/tt-noshebang-%d", (int)getpid());
	fd = open(script, O_WRONLY | O_CREAT | O_TRUNC, 0700);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "echo from-script $1\n", 20), 20);
	close(fd);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"%s\",\"arg\"]}", script);
	unlink(script);
	expect_result(&o);
	assert_string_equal(o.out, "from-script arg\n");
	assert_int_equal(jint(&o, "exit_code"), 0);
	op_free(&o);
}

static void test_exec_stdin(void **state)
{
	static const char in[] = "hello stdin\nsecond line\n";
	struct op_out o;

	(void)state;
	op_run("{\"op\":\"exec\",\"cmd\":[\"cat\"],\"stdin\":true}", in,
	       strlen(in), 1, &o);
	expect_result(&o);
	assert_string_equal(o.out, in);
	assert_int_equal(jint(&o, "exit_code"), 0);
	op_free(&o);
	/* Without "stdin", the command reads EOF at once. */
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"wc\",\"-c\"]}");
	expect_result(&o);
	assert_string_equal(o.out, "0\n");
	op_free(&o);
}

/* script_put: an executable file at path holding text. */
static void script_put(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0755);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static void test_exec_env_cwd(void **state)
{
	char expect[1024];
	struct op_out o;

	(void)state;
	assert_int_equal(mkdir(rpath("/sub"), 0755), 0);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"echo \\\"$FOO|$HOME|$LANG|$TT_LEAK_CHECK|$PATH\\\"; pwd\"],"
	        "\"env\":{\"FOO\":\"bar\"},\"cwd\":\"/sub\"}");
	expect_result(&o);
	snprintf(expect, sizeof(expect),
	         "bar|/home|C.UTF-8||/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n%s/sub\n",
	         root_dir);
	assert_string_equal(o.out, expect);
	op_free(&o);
	/* Default cwd: /workspace once it exists, else the root. */
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"pwd\"]}");
	snprintf(expect, sizeof(expect), "%s\n", root_dir);
	assert_string_equal(o.out, expect);
	op_free(&o);
	assert_int_equal(mkdir(rpath("/workspace"), 0755), 0);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"pwd\"]}");
	snprintf(expect, sizeof(expect), "%s/workspace\n", root_dir);
	assert_string_equal(o.out, expect);
	op_free(&o);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"pwd\"],\"cwd\":\"/missing\"}");
	expect_error(&o, "not_found");
	op_free(&o);
	/* A relative PATH element names a directory under the command's cwd,
	 * as execvp reads it: sub/bin/tt-which wins over the absolute
	 * directory after it (PATH=bin:<root>/abs, cwd /sub). */
	assert_int_equal(mkdir(rpath("/sub/bin"), 0755), 0);
	assert_int_equal(mkdir(rpath("/abs"), 0755), 0);
	script_put(rpath("/sub/bin/tt-which"), "#!/bin/sh\necho relative\n");
	script_put(rpath("/abs/tt-which"), "#!/bin/sh\necho absolute\n");
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"tt-which\"],\"env\":{\"PATH\":\"bin:%s/abs\"},"
	        "\"cwd\":\"/sub\"}", root_dir);
	expect_result(&o);
	assert_string_equal(o.out, "relative\n");
	op_free(&o);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"tt-which\"],\"env\":{\"PATH\":\"/nonexistent:%s/abs\"}}",
	    root_dir);
	expect_result(&o);
	assert_string_equal(o.out, "absolute\n");
	op_free(&o);
}

static void test_exec_background(void **state)
{
	struct op_out o;
	double t0 = now_ms();
	char proc[64];
	pid_t bg;

	(void)state;
	/* sleep keeps stdout/stderr open: RESULT must not wait for EOF. */
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"sleep 30 & echo $!\"]}");
	expect_result(&o);
	assert_true(now_ms() - t0 < 3000);
	assert_int_equal(jint(&o, "exit_code"), 0);
	bg = (pid_t)atoi(o.out);
	assert_true(bg > 1);
	op_free(&o);
	usleep(200 * 1000);
	assert_int_equal(kill(bg, 0), 0); /* still running after exec returned */
	snprintf(proc, sizeof(proc), "/proc/%d/stat", (int)bg);
	FILE *f = fopen(proc, "r");
	assert_non_null(f);
	char st = 0;
	assert_int_equal(fscanf(f, "%*d (%*[^)]) %c", &st), 1);
	fclose(f);
	assert_true(st == 'S' || st == 'R');
	/* Once it ends, the agent (its reaper) collects it. */
	kill(bg, SIGKILL);
	for (int i = 0; i < 100 && access(proc, F_OK) == 0; i++)
		usleep(20 * 1000);
	assert_int_not_equal(access(proc, F_OK), 0);
}

/* proc_gone: waits up to 3 s for /proc/PID to disappear (exited and reaped). */
static int proc_gone(pid_t pid)
{
	char proc[64];

	snprintf(proc, sizeof(proc), "/proc/%d", (int)pid);
	for (int i = 0; i < 150 && access(proc, F_OK) == 0; i++)
		usleep(20 * 1000);
	return access(proc, F_OK) != 0;
}

static void test_exec_background_output(void **state)
{
	struct op_out o;
	pid_t bg;

	(void)state;
	/* A background process that writes after exec returned must not die
	 * of SIGPIPE: its output is discarded, it keeps running. */
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\","
	        "\"(sleep 0.3; echo late; echo late >&2; exec sleep 30) & echo $!\"]}");
	expect_result(&o);
	bg = (pid_t)atoi(o.out);
	assert_true(bg > 1);
	op_free(&o);
	usleep(700 * 1000);
	assert_int_equal(kill(bg, 0), 0);
	kill(bg, SIGKILL);
	assert_true(proc_gone(bg));
}

static void test_exec_hangup(void **state)
{
	static const char req[] =
		"{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"echo $$; exec sleep 30\"]}";
	struct tt_err err = { 0 };
	struct wire_frame f;
	int fd = g_connect();
	pid_t child;

	(void)state;
	assert_int_equal(wire_send(fd, WIRE_REQUEST, req, sizeof(req) - 1, &err), 0);
	assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), &err), 1);
	assert_int_equal(f.type, WIRE_DATA_OUT);
	child = (pid_t)atoi((char *)f.payload);
	assert_true(child > 1);
	assert_int_equal(kill(child, 0), 0);
	/* The caller goes away: the operation's command is stopped. */
	close(fd);
	assert_true(proc_gone(child));
}

static void test_exec_bad_requests(void **state)
{
	static const char *bad[] = {
		"{\"op\":\"exec\"}",
		"{\"op\":\"exec\",\"cmd\":[]}",
		"{\"op\":\"exec\",\"cmd\":\"ls\"}",
		"{\"op\":\"exec\",\"cmd\":[1]}",
		"{\"op\":\"exec\",\"cmd\":[\"\"]}",
		"{\"op\":\"exec\",\"cmd\":[\"ls\"],\"stdin\":\"yes\"}",
		"{\"op\":\"exec\",\"cmd\":[\"ls\"],\"env\":{\"A=B\":\"c\"}}",
		"{\"op\":\"exec\",\"cmd\":[\"ls\"],\"env\":{\"A\":1}}",
	};
	char big[4096];
	size_t n = 0;
	struct op_out o;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		op_run(bad[i], NULL, 0, 0, &o);
		expect_error(&o, "bad_request");
		op_free(&o);
	}
	/* 257 arguments is one too many; 256 is fine. */
	n = (size_t)snprintf(big, sizeof(big), "{\"op\":\"exec\",\"cmd\":[\"true\"");
	for (int i = 1; i < 257; i++)
		n += (size_t)snprintf(big + n, sizeof(big) - n, ",\"a\"");
	snprintf(big + n, sizeof(big) - n, "]}");
	op_run(big, NULL, 0, 0, &o);
	expect_error(&o, "bad_request");
	op_free(&o);
	snprintf(big + n - 4, sizeof(big) - n + 4, "]}");
	op_run(big, NULL, 0, 0, &o);
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 0);
	op_free(&o);
}

static void test_fs_large_roundtrip(void **state)
{
	const size_t size = 5 * 1024 * 1024 + 123;
	uint8_t *data = malloc(size);
	struct op_out o;
	uint64_t x = 88172645463325252ull;
	struct stat st;

	(void)state;
	assert_non_null(data);
	for (size_t i = 0; i < size; i++) { /* xorshift: incompressible */
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		data[i] = (uint8_t)x;
	}
	op_run("{\"op\":\"fs.write\",\"path\":\"/big.bin\",\"mode\":384}", data,
	       size, 1, &o);
	expect_result(&o);
	assert_int_equal(jint(&o, "bytes"), (long long)size);
	op_free(&o);
	assert_int_equal(stat(rpath("/big.bin"), &st), 0);
	assert_int_equal(st.st_size, (off_t)size);
	assert_int_equal(st.st_mode & 07777, 0600);
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/big.bin\"}");
	expect_result(&o);
	assert_int_equal(jint(&o, "size"), (long long)size);
	assert_non_null(o.meta); /* the size came first */
	assert_int_equal(json_integer_value(json_object_get(o.meta, "size")),
	                 (long long)size);
	assert_int_equal(o.out_len, size);
	assert_memory_equal(o.out, data, size);
	op_free(&o);
	free(data);
}

/* tmp_count: how many .tether-*.tmp files are in the root. */
static int tmp_count(void)
{
	DIR *d = opendir(root_dir);
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		n += strncmp(de->d_name, ".tether-", 8) == 0;
	closedir(d);
	return n;
}

static void test_fs_write_aborted(void **state)
{
	static const char req[] = "{\"op\":\"fs.write\",\"path\":\"/keep.txt\"}";
	struct tt_err err = { 0 };
	struct op_out o;
	char buf[64] = { 0 };
	int fd, i;

	(void)state;
	op_run(req, "original", 8, 1, &o);
	expect_result(&o);
	assert_int_equal(jint(&o, "bytes"), 8);
	op_free(&o);
	/* Start a replacement, send part of it, then drop the connection. */
	fd = g_connect();
	assert_int_equal(wire_send(fd, WIRE_REQUEST, req, sizeof(req) - 1, &err), 0);
	assert_int_equal(wire_send(fd, WIRE_DATA_IN, "partial new cont", 16, &err), 0);
	for (i = 0; i < 100 && tmp_count() == 0; i++)
		usleep(10 * 1000);
	assert_int_equal(tmp_count(), 1); /* the write was under way */
	close(fd);
	for (i = 0; i < 200 && tmp_count() != 0; i++)
		usleep(10 * 1000);
	assert_int_equal(tmp_count(), 0);
	int hf = open(rpath("/keep.txt"), O_RDONLY);
	assert_true(hf >= 0);
	assert_int_equal(read(hf, buf, sizeof(buf)), 8);
	close(hf);
	assert_string_equal(buf, "original");
	/* A protocol violation mid-write also leaves the target alone. */
	fd = g_connect();
	assert_int_equal(wire_send(fd, WIRE_REQUEST, req, sizeof(req) - 1, &err), 0);
	assert_int_equal(wire_send(fd, WIRE_DATA_IN, "xx", 2, &err), 0);
	assert_int_equal(wire_send(fd, WIRE_RESULT, "{}", 2, &err), 0);
	op_collect(fd, &o);
	close(fd);
	expect_error(&o, "bad_request");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/keep.txt\"}");
	assert_string_equal(o.out, "original");
	op_free(&o);
	assert_int_equal(tmp_count(), 0);
}

/* list_entries: the entries of a fs.list answer: newline-delimited JSON
 * objects in DATA_OUT, whose count RESULT states as entries_total. */
static json_t *list_entries(const struct op_out *o)
{
	json_t *arr = json_array();
	const char *p = o->out;

	assert_non_null(arr);
	while (*p != '\0') {
		const char *nl = strchr(p, '\n');
		json_error_t jerr;
		json_t *e;

		assert_non_null(nl); /* every entry ends with a newline */
		e = json_loadb(p, (size_t)(nl - p), JSON_REJECT_DUPLICATES, &jerr);
		assert_true(json_is_object(e));
		json_array_append_new(arr, e);
		p = nl + 1;
	}
	assert_int_equal(jint(o, "entries_total"), (long long)json_array_size(arr));
	return arr;
}

/* entry_names: "a,b,c" from a fs.list answer. */
static void entry_names(const struct op_out *o, char *out, size_t cap)
{
	json_t *arr = list_entries(o), *e;
	size_t i;

	out[0] = '\0';
	json_array_foreach(arr, i, e) {
		if (i > 0)
			strncat(out, ",", cap - strlen(out) - 1);
		strncat(out, json_string_value(json_object_get(e, "name")),
		        cap - strlen(out) - 1);
	}
	json_decref(arr);
}

static void test_fs_ops(void **state)
{
	struct op_out o;
	char names[256];

	(void)state;
	opf(&o, "{\"op\":\"fs.mkdir\",\"path\":\"/d/e/f\",\"parents\":true}");
	expect_result(&o);
	assert_true(json_is_true(json_object_get(o.end, "ok")));
	op_free(&o);
	opf(&o, "{\"op\":\"fs.mkdir\",\"path\":\"/d/e/f\",\"parents\":true}");
	expect_result(&o); /* mkdir -p is idempotent */
	op_free(&o);
	opf(&o, "{\"op\":\"fs.mkdir\",\"path\":\"/d\"}");
	expect_error(&o, "exists");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.mkdir\",\"path\":\"/x/y\"}");
	expect_error(&o, "not_found");
	op_free(&o);
	op_run("{\"op\":\"fs.write\",\"path\":\"/d/file\"}", "abc", 3, 1, &o);
	expect_result(&o);
	op_free(&o);
	opf(&o, "{\"op\":\"fs.mkdir\",\"path\":\"/d/file/sub\",\"parents\":true}");
	expect_error(&o, "not_dir");
	op_free(&o);
	assert_int_equal(symlink("file", rpath("/d/link")), 0);

	opf(&o, "{\"op\":\"fs.stat\",\"path\":\"/d\"}");
	expect_result(&o);
	assert_string_equal(json_string_value(json_object_get(o.end, "type")), "dir");
	assert_string_equal(json_string_value(json_object_get(o.end, "path")), "/d");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.stat\",\"path\":\"/d/file\"}");
	expect_result(&o);
	assert_string_equal(json_string_value(json_object_get(o.end, "type")), "file");
	assert_int_equal(jint(&o, "size"), 3);
	assert_int_equal(jint(&o, "mode"), 0644);
	assert_true(llabs(jint(&o, "mtime") - (long long)time(NULL)) < 60);
	op_free(&o);
	opf(&o, "{\"op\":\"fs.stat\",\"path\":\"/d/link\"}");
	expect_result(&o);
	assert_string_equal(json_string_value(json_object_get(o.end, "type")), "symlink");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.stat\",\"path\":\"/d/nope\"}");
	expect_error(&o, "not_found");
	op_free(&o);

	opf(&o, "{\"op\":\"fs.list\",\"path\":\"/d\"}");
	expect_result(&o);
	entry_names(&o, names, sizeof(names));
	assert_string_equal(names, "e,file,link");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.list\",\"path\":\"/d/file\"}");
	expect_error(&o, "not_dir");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/d\"}");
	expect_error(&o, "is_dir");
	op_free(&o);
	op_run("{\"op\":\"fs.write\",\"path\":\"/d/e\"}", "x", 1, 1, &o);
	expect_error(&o, "is_dir");
	op_free(&o);

	opf(&o, "{\"op\":\"fs.remove\",\"path\":\"/d\"}");
	expect_error(&o, "exists"); /* not empty */
	op_free(&o);
	opf(&o, "{\"op\":\"fs.remove\",\"path\":\"/d/link\"}");
	expect_result(&o);
	op_free(&o);
	opf(&o, "{\"op\":\"fs.stat\",\"path\":\"/d/file\"}");
	expect_result(&o); /* removing the link left its target */
	op_free(&o);
	opf(&o, "{\"op\":\"fs.remove\",\"path\":\"/d\",\"recursive\":true}");
	expect_result(&o);
	op_free(&o);
	assert_int_not_equal(access(rpath("/d"), F_OK), 0);
	opf(&o, "{\"op\":\"fs.remove\",\"path\":\"/d\"}");
	expect_error(&o, "not_found");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.remove\",\"path\":\"/\",\"recursive\":true}");
	expect_error(&o, "path_invalid");
	op_free(&o);
	assert_int_equal(access(rpath("/keep.txt"), F_OK), 0);
}

/* fill_file: a host file of size bytes of pattern (byte i = i % 251). */
static void fill_file(const char *path, size_t size)
{
	uint8_t chunk[65536];
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	for (size_t off = 0; off < size;) {
		size_t n = size - off < sizeof(chunk) ? size - off : sizeof(chunk);

		for (size_t i = 0; i < n; i++)
			chunk[i] = (uint8_t)((off + i) % 251);
		assert_int_equal(fwrite(chunk, 1, n, f), n);
		off += n;
	}
	assert_int_equal(fclose(f), 0);
}

/* read_open: starts an fs.read of path and returns the connection once the
 * META arrived (the guest then blocks on the full socket for big files). */
static int read_open(const char *path, struct op_out *o, uint64_t *size)
{
	char req[512];
	struct tt_err err = { 0 };
	struct wire_frame f;
	int fd = g_connect();
	int sz = 4096;

	/* A small receive buffer so the guest is mid-file when we act. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	snprintf(req, sizeof(req), "{\"op\":\"fs.read\",\"path\":\"%s\"}", path);
	assert_int_equal(wire_send(fd, WIRE_REQUEST, req, (uint32_t)strlen(req), &err), 0);
	assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), &err), 1);
	assert_int_equal(f.type, WIRE_META);
	memset(o, 0, sizeof(*o));
	append(&o->out, &o->out_len, (const uint8_t *)"", 0);
	append(&o->err, &o->err_len, (const uint8_t *)"", 0);
	o->meta = wire_frame_json(&f, &err);
	assert_non_null(o->meta);
	*size = (uint64_t)json_integer_value(json_object_get(o->meta, "size"));
	return fd;
}

/* test_fs_read_meta: META {"size":N} comes before the bytes; an empty file
 * is META 0 and no DATA_OUT; a file that grows during the read is cut at
 * the announced size, byte-exact. */
static void test_fs_read_meta(void **state)
{
	const size_t size = 8u << 20;
	struct op_out o;
	uint64_t announced;
	int fd, hf;

	(void)state;
	write_file(rpath("/empty"), "");
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/empty\"}");
	expect_result(&o);
	assert_int_equal(json_integer_value(json_object_get(o.meta, "size")), 0);
	assert_int_equal(o.out_frames, 0);
	assert_int_equal(jint(&o, "size"), 0);
	op_free(&o);

	fill_file(rpath("/grow.bin"), size);
	fd = read_open("/grow.bin", &o, &announced);
	assert_int_equal(announced, size);
	hf = open(rpath("/grow.bin"), O_WRONLY | O_APPEND);
	assert_true(hf >= 0);
	assert_int_equal(write(hf, "MORE BYTES THAT CAME LATER", 26), 26);
	close(hf);
	op_collect_more(fd, &o);
	close(fd);
	expect_result(&o);
	assert_int_equal(o.out_len, size);
	assert_int_equal(jint(&o, "size"), (long long)size);
	for (size_t i = 0; i < size; i += 4093)
		assert_int_equal((uint8_t)o.out[i], (uint8_t)(i % 251));
	assert_int_equal((uint8_t)o.out[size - 1], (uint8_t)((size - 1) % 251));
	op_free(&o);
}

/* test_fs_read_shrinks: a file truncated while it is being read ends in
 * ERROR "changed" with fewer bytes than announced (never a short file
 * presented as whole); the honest read afterwards is complete. */
static void test_fs_read_shrinks(void **state)
{
	const size_t size = 8u << 20;
	struct op_out o;
	uint64_t announced;
	int fd;

	(void)state;
	fill_file(rpath("/shrink.bin"), size);
	fd = read_open("/shrink.bin", &o, &announced);
	assert_int_equal(announced, size);
	assert_int_equal(truncate(rpath("/shrink.bin"), 100), 0);
	op_collect_more(fd, &o);
	close(fd);
	expect_error(&o, "changed");
	assert_true(o.out_len < size);
	op_free(&o);
	/* The honest request on the now-short file: META 100, 100 bytes. */
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/shrink.bin\"}");
	expect_result(&o);
	assert_int_equal(json_integer_value(json_object_get(o.meta, "size")), 100);
	assert_int_equal(o.out_len, 100);
	op_free(&o);
}

/* test_fs_list_stream: a listing far over one 64 KiB frame streams as
 * whole NDJSON lines, sorted; over GUEST_LIST_MAX entries is too_large
 * before any entry is sent. */
static void test_fs_list_stream(void **state)
{
	const int count = 3000;
	char name[300], pad[201];
	struct op_out o;
	json_t *arr, *e;
	size_t i;

	(void)state;
	memset(pad, 'p', 200);
	pad[200] = '\0';
	assert_int_equal(mkdir(rpath("/many"), 0755), 0);
	for (int k = 0; k < count; k++) {
		snprintf(name, sizeof(name), "/many/%05d-%s", k, pad);
		write_file(rpath(name), "x");
	}
	opf(&o, "{\"op\":\"fs.list\",\"path\":\"/many\"}");
	expect_result(&o);
	assert_null(json_object_get(o.end, "entries"));
	assert_true(o.out_len > 4 * WIRE_PAYLOAD_MAX);
	assert_true(o.out_frames > 4);
	arr = list_entries(&o);
	assert_int_equal(json_array_size(arr), (size_t)count);
	json_array_foreach(arr, i, e) {
		snprintf(name, sizeof(name), "%05d-%s", (int)i, pad);
		assert_string_equal(json_string_value(json_object_get(e, "name")), name);
		assert_string_equal(json_string_value(json_object_get(e, "type")), "file");
		assert_int_equal(json_integer_value(json_object_get(e, "size")), 1);
	}
	json_decref(arr);
	op_free(&o);
	/* 10001 entries: refused whole, no partial listing. */
	for (int k = count; k < 10001; k++) {
		snprintf(name, sizeof(name), "/many/%05d", k);
		write_file(rpath(name), "");
	}
	opf(&o, "{\"op\":\"fs.list\",\"path\":\"/many\"}");
	expect_error(&o, "too_large");
	assert_int_equal(o.out_len, 0);
	op_free(&o);
	/* Back to 10000: listed. */
	assert_int_equal(unlink(rpath("/many/10000")), 0);
	opf(&o, "{\"op\":\"fs.list\",\"path\":\"/many\"}");
	expect_result(&o);
	assert_int_equal(jint(&o, "entries_total"), 10000);
	op_free(&o);
	snprintf(name, sizeof(name), "rm -rf '%s'", rpath("/many"));
	assert_int_equal(system(name), 0);
}

static void test_path_escapes(void **state)
{
	struct op_out o;
	static const char *invalid[] = {
		"{\"op\":\"fs.read\",\"path\":\"/../../../../etc/hostname\"}",
		"{\"op\":\"fs.read\",\"path\":\"/a/../../etc/hostname\"}",
		"{\"op\":\"fs.read\",\"path\":\"etc/hostname\"}",
		"{\"op\":\"fs.read\",\"path\":\"\"}",
		"{\"op\":\"fs.stat\",\"path\":\"/..\"}",
		"{\"op\":\"fs.write\",\"path\":\"/x/..\"}",
		"{\"op\":\"exec\",\"cmd\":[\"true\"],\"cwd\":\"/..\"}",
	};

	(void)state;
	/* The host file exists; the root has no /etc yet. */
	assert_int_equal(access("/etc/hostname", R_OK), 0);
	for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
		op_run(invalid[i], NULL, 0, 0, &o);
		expect_error(&o, "path_invalid");
		op_free(&o);
	}
	/* Symlinks to absolute host paths and upward chains resolve inside. */
	assert_int_equal(symlink("/etc/hostname", rpath("/esc")), 0);
	assert_int_equal(symlink("../../../../../../etc", rpath("/up")), 0);
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/esc\"}");
	expect_error(&o, "not_found");
	assert_int_equal(o.out_len, 0);
	op_free(&o);
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/up/hostname\"}");
	expect_error(&o, "not_found");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.list\",\"path\":\"/up\"}");
	expect_error(&o, "not_found");
	op_free(&o);
	op_run("{\"op\":\"fs.write\",\"path\":\"/up/tt-escape-probe\"}", "x", 1, 1, &o);
	expect_error(&o, "not_found");
	op_free(&o);
	assert_int_not_equal(access("/etc/tt-escape-probe", F_OK), 0);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"pwd\"],\"cwd\":\"/up\"}");
	expect_error(&o, "not_found");
	op_free(&o);
	/* The honest request: with an /etc inside the root, the same links
	 * lead there. */
	assert_int_equal(mkdir(rpath("/etc"), 0755), 0);
	write_file(rpath("/etc/hostname"), "inside-the-root\n");
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/esc\"}");
	expect_result(&o);
	assert_string_equal(o.out, "inside-the-root\n");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.read\",\"path\":\"/up/hostname\"}");
	expect_result(&o);
	assert_string_equal(o.out, "inside-the-root\n");
	op_free(&o);
	opf(&o, "{\"op\":\"fs.stat\",\"path\":\"/esc\"}");
	expect_result(&o);
	assert_string_equal(json_string_value(json_object_get(o.end, "type")), "symlink");
	op_free(&o);
}

/* raw_exchange: writes raw bytes, expects an ERROR with code, then EOF. */
static void raw_exchange(const void *raw, size_t n, const char *code)
{
	struct tt_err err = { 0 };
	struct wire_frame f;
	struct op_out o;
	int fd = g_connect();

	assert_int_equal(write(fd, raw, n), (ssize_t)n);
	op_collect(fd, &o);
	expect_error(&o, code);
	op_free(&o);
	/* Closed: EOF, or a reset when our unread bytes were discarded. */
	assert_true(wire_recv(fd, &f, rbuf, sizeof(rbuf), &err) <= 0);
	close(fd);
}

static void test_garbage(void **state)
{
	uint8_t h[WIRE_HDR_LEN + 32];
	struct op_out o;
	int fd;

	(void)state;
	memcpy(h, "GET / HTTP/1.1\r\n\r\n", 18);
	raw_exchange(h, 18, "bad_request");
	wire_hdr_encode(h, WIRE_REQUEST, WIRE_PAYLOAD_MAX + 1);
	raw_exchange(h, WIRE_HDR_LEN, "too_large");
	wire_hdr_encode(h, WIRE_REQUEST, 8);
	memcpy(h + WIRE_HDR_LEN, "not json", 8);
	raw_exchange(h, WIRE_HDR_LEN + 8, "bad_request");
	wire_hdr_encode(h, WIRE_REQUEST, 26);
	memcpy(h + WIRE_HDR_LEN, "{\"op\":\"exec\",\"op\":\"exec\"}", 26);
	raw_exchange(h, WIRE_HDR_LEN + 26, "bad_request");
	wire_hdr_encode(h, WIRE_DATA_IN, 3);
	memcpy(h + WIRE_HDR_LEN, "abc", 3);
	raw_exchange(h, WIRE_HDR_LEN + 3, "bad_request");
	opf(&o, "{\"op\":\"fs.format\",\"path\":\"/\"}");
	expect_error(&o, "bad_request");
	op_free(&o);
	opf(&o, "[\"op\",\"exec\"]");
	expect_error(&o, "bad_request");
	op_free(&o);
	/* Connect and hang up at once; half a header then hang up. */
	fd = g_connect();
	close(fd);
	fd = g_connect();
	assert_int_equal(write(fd, h, 5), 5);
	close(fd);
	/* The agent still serves honest requests. */
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"echo\",\"still here\"]}");
	expect_result(&o);
	assert_string_equal(o.out, "still here\n");
	op_free(&o);
	assert_int_equal(kill(guest_pid, 0), 0);
}

/* expect_refused_hello: a HELLO for (sbx, gen, att) gets ERROR code. */
static void expect_refused_hello(const char *sbx, uint64_t gen, uint32_t att,
                                 const char *code)
{
	uint8_t chal[HELLO_CHALLENGE_LEN];
	struct tt_err err = { 0 };
	struct wire_frame f;
	int fd = g_connect_raw();
	json_t *e;

	assert_int_equal(g_hello(fd, sbx, gen, att, chal, &f), WIRE_ERROR);
	e = wire_frame_json(&f, &err);
	assert_string_equal(json_string_value(json_object_get(e, "error")), code);
	json_decref(e);
	assert_true(wire_recv(fd, &f, rbuf, sizeof(rbuf), &err) <= 0);
	close(fd);
}

/* test_handshake_required: a REQUEST before the HELLO is refused and never
 * runs; a HELLO for another execution or activation is refused; malformed
 * HELLOs are refused; the honest handshake still works afterwards. */
static void test_handshake_required(void **state)
{
	static const char req[] = "{\"op\":\"exec\",\"cmd\":[\"touch\",\"/early\"]}";
	static const char *bad[] = {
		"{\"v\":2,\"challenge\":\"@\",\"sbx\":\"" SBX "\",\"generation\":7,\"activation\":1}",
		"{\"v\":1,\"challenge\":\"@=\",\"sbx\":\"" SBX "\",\"generation\":7,\"activation\":1}",
		"{\"v\":1,\"challenge\":\"@\",\"sbx\":\"" SBX "\",\"generation\":7,\"activation\":1}",
		"{\"v\":1,\"challenge\":\"@\",\"generation\":7,\"activation\":1}",
		"{\"v\":1,\"challenge\":\"@\",\"sbx\":\"" SBX "\",\"generation\":-7,\"activation\":1}",
	};
	uint8_t chal[HELLO_CHALLENGE_LEN];
	char b64[HELLO_B64_LEN + 1], text[512];
	struct tt_err err = { 0 };
	struct wire_frame f;
	struct op_out o;
	int fd;

	(void)state;
	fd = g_connect_raw();
	assert_int_equal(wire_send(fd, WIRE_REQUEST, req, sizeof(req) - 1, &err), 0);
	op_collect(fd, &o);
	expect_error(&o, "handshake_required");
	op_free(&o);
	close(fd);
	assert_int_equal(access(rpath("/early"), F_OK), -1);

	expect_refused_hello(SBX, GEN, 2, "wrong_activation");
	expect_refused_hello(SBX, GEN + 1, 1, "wrong_activation");
	expect_refused_hello("sbx_bbbbbbbbbbbbbbbbbbbbbbbbbb", GEN, 1, "wrong_activation");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		randombytes_buf(chal, sizeof(chal));
		hello_b64_encode(chal, b64);
		/* @ = the challenge (bad[2]: cut to 20 characters). */
		const char *at = strchr(bad[i], '@');
		if (i == 2)
			b64[20] = '\0';
		snprintf(text, sizeof(text), "%.*s%s%s", (int)(at - bad[i]), bad[i], b64, at + 1);
		fd = g_connect_raw();
		assert_int_equal(wire_send(fd, WIRE_HELLO, text, (uint32_t)strlen(text), &err), 0);
		assert_int_equal(wire_recv(fd, &f, rbuf, sizeof(rbuf), &err), 1);
		assert_int_equal(f.type, WIRE_ERROR);
		close(fd);
	}
	/* The honest handshake and operation still work. */
	fd = g_connect();
	close(fd);
	opf(&o, "{\"op\":\"exec\",\"cmd\":[\"echo\",\"ok\"]}");
	expect_result(&o);
	assert_string_equal(o.out, "ok\n");
	op_free(&o);
}

/* seq_op: one operation on an open connection fd: REQUEST (raw JSON
 * text), optional input as DATA_IN frames, optional EOF_IN, then the
 * answer up to RESULT or ERROR. */
static void seq_op(int fd, const char *req, const void *in, size_t in_len,
                   int eof, struct op_out *o)
{
	struct tt_err err = { 0 };

	assert_int_equal(wire_send(fd, WIRE_REQUEST, req, (uint32_t)strlen(req), &err), 0);
	for (size_t off = 0; off < in_len;) {
		size_t n = in_len - off > WIRE_PAYLOAD_MAX ? WIRE_PAYLOAD_MAX : in_len - off;

		assert_int_equal(wire_send(fd, WIRE_DATA_IN, (const uint8_t *)in + off,
		                           (uint32_t)n, &err), 0);
		off += n;
	}
	if (eof)
		assert_int_equal(wire_send(fd, WIRE_EOF_IN, NULL, 0, &err), 0);
	op_collect(fd, o);
}

/* seq_ppid: the pid of the handler serving fd (the parent of the command
 * an exec on fd runs). */
static pid_t seq_ppid(int fd)
{
	struct op_out o;
	pid_t pid;

	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"echo $PPID\"]}", NULL, 0, 0, &o);
	expect_result(&o);
	pid = (pid_t)atoi(o.out);
	op_free(&o);
	assert_true(pid > 1);
	return pid;
}

/* count_children: how many processes (zombies included) have ppid. */
static int count_children(pid_t ppid)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	assert_non_null(d);
	while ((de = readdir(d)) != NULL) {
		char path[300], line[512];
		const char *rp;
		FILE *f;
		int pp = 0;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
		f = fopen(path, "r");
		if (f == NULL)
			continue; /* gone meanwhile */
		if (fgets(line, sizeof(line), f) != NULL &&
		    (rp = strrchr(line, ')')) != NULL &&
		    sscanf(rp + 1, " %*c %d", &pp) == 1 && pp == (int)ppid)
			n++;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* expect_closed: the guest closed fd (EOF, or a reset). */
static void expect_closed(int fd)
{
	struct tt_err err = { 0 };
	struct wire_frame f;

	assert_true(wire_recv(fd, &f, rbuf, sizeof(rbuf), &err) <= 0);
}

static void test_seq_ops(void **state)
{
	static const char in[] = "line one\nline two\n";
	uint8_t chal[HELLO_CHALLENGE_LEN];
	struct wire_frame f;
	struct op_out o;
	int fd;
	pid_t h;

	(void)state;
	fd = g_connect(); /* the one handshake */
	h = seq_ppid(fd);
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"echo\",\"first\"]}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_string_equal(o.out, "first\n");
	op_free(&o);
	seq_op(fd, "{\"op\":\"fs.write\",\"path\":\"/seq.txt\"}", "seq content", 11, 1, &o);
	expect_result(&o);
	assert_int_equal(jint(&o, "bytes"), 11);
	op_free(&o);
	seq_op(fd, "{\"op\":\"fs.read\",\"path\":\"/seq.txt\"}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_string_equal(o.out, "seq content");
	assert_non_null(o.meta);
	op_free(&o);
	seq_op(fd, "{\"op\":\"fs.list\",\"path\":\"/\"}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_non_null(strstr(o.out, "\"name\":\"seq.txt\""));
	op_free(&o);
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"cat\"],\"stdin\":true}", in, strlen(in), 1, &o);
	expect_result(&o);
	assert_string_equal(o.out, in);
	op_free(&o);
	seq_op(fd, "{\"op\":\"fs.stat\",\"path\":\"/seq.txt\"}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_int_equal(jint(&o, "size"), 11);
	op_free(&o);
	/* Still the same handler process: no new connection was made. */
	assert_int_equal(seq_ppid(fd), h);
	/* The handshake happens once: a second HELLO is refused and closes. */
	assert_int_equal(g_hello(fd, SBX, GEN, 1, chal, &f), WIRE_ERROR);
	expect_closed(fd);
	close(fd);
}

static void test_seq_stray_input(void **state)
{
	struct tt_err err = { 0 };
	struct op_out o;
	int fd = g_connect();

	(void)state;
	/* The command exits without reading its stdin; the opener's input is
	 * still in flight after the RESULT. */
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"true\"],\"stdin\":true}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 0);
	op_free(&o);
	assert_int_equal(wire_send(fd, WIRE_DATA_IN, "stale", 5, &err), 0);
	assert_int_equal(wire_send(fd, WIRE_DATA_IN, "more stale", 10, &err), 0);
	assert_int_equal(wire_send(fd, WIRE_EOF_IN, NULL, 0, &err), 0);
	/* Discarded: the next operation works and never sees those bytes. */
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"cat\"],\"stdin\":true}", "fresh", 5, 1, &o);
	expect_result(&o);
	assert_string_equal(o.out, "fresh");
	op_free(&o);
	/* An fs.write refused before its body: the body is discarded too. */
	seq_op(fd, "{\"op\":\"fs.write\",\"path\":\"/nodir/x\"}", "body", 4, 1, &o);
	expect_error(&o, "not_found");
	op_free(&o);
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"echo\",\"ok\"]}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_string_equal(o.out, "ok\n");
	op_free(&o);
	close(fd);
	/* Before the first operation there is nothing to discard: DATA_IN
	 * there is a violation (ERROR, closed). */
	fd = g_connect();
	assert_int_equal(wire_send(fd, WIRE_DATA_IN, "abc", 3, &err), 0);
	op_collect(fd, &o);
	expect_error(&o, "bad_request");
	op_free(&o);
	expect_closed(fd);
	close(fd);
}

static void test_seq_violations(void **state)
{
	uint8_t h[WIRE_HDR_LEN + 16];
	struct tt_err err = { 0 };
	struct op_out o;
	int fd;

	(void)state;
	for (int i = 0; i < 5; i++) {
		fd = g_connect();
		seq_op(fd, "{\"op\":\"fs.stat\",\"path\":\"/\"}", NULL, 0, 0, &o);
		expect_result(&o); /* the honest operation first */
		op_free(&o);
		switch (i) {
		case 0: /* garbage bytes */
			assert_int_equal(write(fd, "GET / HTTP/1.1\r\n\r\n", 18), 18);
			break;
		case 1: { /* a second HELLO */
			uint8_t chal[HELLO_CHALLENGE_LEN];
			char b64[HELLO_B64_LEN + 1], msg[300];

			randombytes_buf(chal, sizeof(chal));
			hello_b64_encode(chal, b64);
			snprintf(msg, sizeof(msg), "{\"v\":1,\"challenge\":\"%s\",\"sbx\":\"%s\","
			         "\"generation\":%d,\"activation\":1}", b64, SBX, GEN);
			assert_int_equal(wire_send(fd, WIRE_HELLO, msg, (uint32_t)strlen(msg), &err), 0);
			break;
		}
		case 2: /* a RESULT from the opener */
			assert_int_equal(wire_send(fd, WIRE_RESULT, "{}", 2, &err), 0);
			break;
		case 3: /* a DATA_OUT */
			assert_int_equal(wire_send(fd, WIRE_DATA_OUT, "x", 1, &err), 0);
			break;
		case 4: /* a REQUEST that is not JSON */
			wire_hdr_encode(h, WIRE_REQUEST, 8);
			memcpy(h + WIRE_HDR_LEN, "not json", 8);
			assert_int_equal(write(fd, h, WIRE_HDR_LEN + 8), WIRE_HDR_LEN + 8);
			break;
		}
		op_collect(fd, &o);
		expect_error(&o, "bad_request");
		op_free(&o);
		expect_closed(fd);
		close(fd);
	}
}

static void test_seq_error_keeps_connection(void **state)
{
	struct op_out o;
	int fd = g_connect();

	(void)state;
	write_file(rpath("/seq-ok.txt"), "still usable");
	seq_op(fd, "{\"op\":\"fs.read\",\"path\":\"/missing-file\"}", NULL, 0, 0, &o);
	expect_error(&o, "not_found");
	op_free(&o);
	seq_op(fd, "{\"op\":\"fs.read\",\"path\":\"/seq-ok.txt\"}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_string_equal(o.out, "still usable");
	op_free(&o);
	/* A request-level refusal (bad cmd, unknown op, bad path) also ends
	 * just that operation. */
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[]}", NULL, 0, 0, &o);
	expect_error(&o, "bad_request");
	op_free(&o);
	seq_op(fd, "{\"op\":\"fs.format\"}", NULL, 0, 0, &o);
	expect_error(&o, "bad_request");
	op_free(&o);
	seq_op(fd, "{\"op\":\"fs.stat\",\"path\":\"/../etc\"}", NULL, 0, 0, &o);
	expect_error(&o, "path_invalid");
	op_free(&o);
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"exit 4\"]}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_int_equal(jint(&o, "exit_code"), 4);
	op_free(&o);
	close(fd);
}

/* The idle bound: a connection left idle between operations longer than
 * --idle-timeout is closed and its handler exits; one used within the
 * bound keeps its handler, and the agent still takes new connections. */
static void test_seq_idle_bound(void **state)
{
	char sock[300];
	struct pollfd pf;
	struct op_out o;
	uint8_t b;
	pid_t g, h;
	int fd;

	(void)state;
	snprintf(sock, sizeof(sock), "%s/idle.sock", sock_dir);
	g = guest_launch(sock, "--idle-timeout", "1");
	assert_true(g > 0);
	fd = g_connect_at(sock);
	h = seq_ppid(fd);
	usleep(500 * 1000); /* within the bound: still served, same handler */
	assert_int_equal(seq_ppid(fd), h);
	/* Past it: the handler closes the connection (EOF, no frame) and exits. */
	pf = (struct pollfd){ .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&pf, 1, 3000), 1);
	assert_int_equal(read(fd, &b, 1), 0);
	assert_true(proc_gone(h));
	close(fd);
	fd = g_connect_at(sock);
	seq_op(fd, "{\"op\":\"exec\",\"cmd\":[\"echo\",\"again\"]}", NULL, 0, 0, &o);
	expect_result(&o);
	assert_string_equal(o.out, "again\n");
	op_free(&o);
	close(fd);
	kill(g, SIGTERM);
	waitpid(g, NULL, 0);
}

static void test_seq_no_process_growth(void **state)
{
	struct op_out o;
	int fd = g_connect(), n = -1;
	pid_t h;

	(void)state;
	h = seq_ppid(fd);
	for (int i = 0; i < 40; i++) {
		/* The background sleep keeps the output pipes open: each
		 * operation hands them to a sink process. */
		seq_op(fd, i % 2 ? "{\"op\":\"exec\",\"cmd\":[\"sh\",\"-c\",\"sleep 3 & echo x\"]}"
		                 : "{\"op\":\"fs.stat\",\"path\":\"/\"}",
		       NULL, 0, 0, &o);
		expect_result(&o);
		op_free(&o);
		/* Between operations the handler keeps no child: commands
		 * are reaped, sinks belong to the agent (the short-lived
		 * intermediate that hands a sink over may still be exiting
		 * right after RESULT; a sink would stay for the 3 s sleep). */
		n = -1;
		for (int j = 0; j < 25 && (n = count_children(h)) != 0; j++)
			usleep(20 * 1000);
		assert_int_equal(n, 0);
	}
	assert_int_equal(seq_ppid(fd), h);
	/* Once the sleeps end, the agent is back to this one handler. */
	for (int i = 0; i < 300 && (n = count_children(guest_pid)) != 1; i++)
		usleep(20 * 1000);
	assert_int_equal(n, 1);
	close(fd);
}

static void test_socket_mode(void **state)
{
	struct stat st;

	(void)state;
	assert_int_equal(lstat(sock_path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0666); /* the bridge connects as its own uid */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_socket_mode),
		cmocka_unit_test(test_exec_basic),
		cmocka_unit_test(test_exec_stdin),
		cmocka_unit_test(test_exec_env_cwd),
		cmocka_unit_test(test_exec_background),
		cmocka_unit_test(test_exec_background_output),
		cmocka_unit_test(test_exec_hangup),
		cmocka_unit_test(test_exec_bad_requests),
		cmocka_unit_test(test_fs_large_roundtrip),
		cmocka_unit_test(test_fs_write_aborted),
		cmocka_unit_test(test_fs_ops),
		cmocka_unit_test(test_fs_read_meta),
		cmocka_unit_test(test_fs_read_shrinks),
		cmocka_unit_test(test_fs_list_stream),
		cmocka_unit_test(test_path_escapes),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_handshake_required),
		cmocka_unit_test(test_seq_ops),
		cmocka_unit_test(test_seq_stray_input),
		cmocka_unit_test(test_seq_violations),
		cmocka_unit_test(test_seq_error_keeps_connection),
		cmocka_unit_test(test_seq_no_process_growth),
		cmocka_unit_test(test_seq_idle_bound),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

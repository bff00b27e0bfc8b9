/* Tests of the ns substrate against the real kernel: real namespaces,
 * cgroups, seccomp and processes (needs root; skipped otherwise). Each case
 * runs a shell script as the sandbox init; the script records what it sees
 * in /workspace, which the test reads from the host layer directory. Every
 * refusal is paired with the honest operation succeeding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "err.h"
#include "hello.h"
#include "substrate/ns/ns.h"
#include "wire.h"
#include "wire_json.h"

#define UID_BASE 3100000u

/* One sandbox under test: its dir, config and handle. */
struct fixture {
	char dir[64];
	char *argv[4];
	char script[4096];
	struct ns_config cfg;
	struct ns_sandbox sb;
};

/* fx_new: a fresh sandbox dir and a config running script as init. */
static struct fixture *fx_new(const char *id, const char *script)
{
	struct fixture *fx = calloc(1, sizeof *fx);
	assert_non_null(fx);
	snprintf(fx->dir, sizeof fx->dir, "/tmp/tt-ns-test.XXXXXX");
	assert_non_null(mkdtemp(fx->dir));
	snprintf(fx->script, sizeof fx->script, "%s", script);
	fx->argv[0] = "/bin/sh";
	fx->argv[1] = "-c";
	fx->argv[2] = fx->script;
	fx->cfg.sbx_id = id;
	fx->cfg.gen = 7;
	fx->cfg.att = 1;
	fx->cfg.sandbox_dir = fx->dir;
	fx->cfg.init_argv = fx->argv;
	fx->cfg.uid_base = UID_BASE;
	fx->cfg.memory_max = 64u << 20;
	fx->cfg.pids_max = 64;
	fx->cfg.log_fd = getenv("NS_TEST_LOG") ? 2 : -1;
	ns_sandbox_init(&fx->sb);
	return fx;
}

/* fx_free: stops the sandbox and removes its dir. */
static void fx_free(struct fixture *fx)
{
	struct tt_err err;
	assert_int_equal(ns_sandbox_stop(&fx->sb, &err), 0);
	/* The run tmpfs (and a layer, if any) stays mounted after a stop. */
	assert_int_equal(ns_layer_umount(fx->dir, &err), 0);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", fx->dir);
	assert_int_equal(system(cmd), 0);
	free(fx);
}

/* fx_start: starts the sandbox; fails the test with the error on failure. */
static void fx_start(struct fixture *fx)
{
	struct tt_err err = { 0 };
	int rc = ns_sandbox_start(&fx->cfg, &fx->sb, &err);
	if (rc < 0)
		fail_msg("ns_sandbox_start: %s", err.msg);
	assert_true(fx->sb.init_pid > 0);
	assert_true(fx->sb.pidfd >= 0);
}

/* fx_wait_exit: waits (bounded) for the init to exit on its own. */
static void fx_wait_exit(struct fixture *fx, int timeout_ms)
{
	struct pollfd pf = { .fd = fx->sb.pidfd, .events = POLLIN };
	assert_int_equal(poll(&pf, 1, timeout_ms), 1);
}

/* fx_read: contents of <dir>/layer/workspace/<name>, newline stripped;
 * "" when missing. */
static void fx_read(struct fixture *fx, const char *name, char *out, size_t cap)
{
	char path[256];
	snprintf(path, sizeof path, "%s/layer/workspace/%s", fx->dir, name);
	out[0] = '\0';
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	size_t n = fread(out, 1, cap - 1, f);
	fclose(f);
	out[n] = '\0';
	while (n && (out[n - 1] == '\n' || out[n - 1] == ' '))
		out[--n] = '\0';
}

/* expect: asserts a workspace result file's exact content. */
static void expect(struct fixture *fx, const char *name, const char *want)
{
	char got[512];
	fx_read(fx, name, got, sizeof got);
	if (strcmp(got, want) != 0)
		fail_msg("%s: got '%s', want '%s'", name, got, want);
}

/* read_file_str: whole small host file, newline stripped. */
static void read_file_str(const char *path, char *out, size_t cap)
{
	out[0] = '\0';
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	size_t n = fread(out, 1, cap - 1, f);
	fclose(f);
	out[n] = '\0';
	while (n && out[n - 1] == '\n')
		out[--n] = '\0';
}

/* Filesystem, pid, uts, user and network isolation, seccomp. */
static void test_isolation(void **state)
{
	(void)state;
	/* Host-side bait: a listener on host loopback, marker files. */
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	assert_int_equal(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
	assert_int_equal(listen(ls, 4), 0);
	socklen_t sl = sizeof sa;
	assert_int_equal(getsockname(ls, (struct sockaddr *)&sa, &sl), 0);
	int port = ntohs(sa.sin_port);
	char tmp_marker[64], root_marker[64];
	snprintf(tmp_marker, sizeof tmp_marker, "/tmp/tt-ns-marker-%d", (int)getpid());
	snprintf(root_marker, sizeof root_marker, "/root/tt-ns-marker-%d", (int)getpid());
	for (int i = 0; i < 2; i++) {
		FILE *f = fopen(i ? root_marker : tmp_marker, "w");
		assert_non_null(f);
		fclose(f);
	}
	/* The honest counterpart of the network check: the listener works. */
	int hc = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(hc, (struct sockaddr *)&sa, sizeof sa), 0);
	close(hc);
	/* And unshare works on the host: its refusal below is the filter's. */
	assert_int_equal(system("unshare -U true"), 0);

	char script[3072];
	snprintf(script, sizeof script,
	         "cd /workspace || exit 1\n"
	         /* First, before the shell opens or saves any fd of its own. */
	         "/usr/bin/perl -e 'opendir D, \"/proc/1/fd\"; open F, \">/workspace/fds\";"
	         " print F join(\" \", sort grep /^\\d+$/, readdir D)'\n"
	         "echo $$ > mypid\n"
	         "tr '\\0' '\\n' < /proc/1/cmdline | head -n 1 > pid1\n"
	         "ls /proc | grep -c '^[0-9]' > npids\n"
	         "{ touch /usr/x && echo yes || echo no; } > usrw 2>/dev/null\n"
	         "{ touch /x && echo yes || echo no; } > rootw 2>/dev/null\n"
	         "awk '$5 == \"/usr\" || $5 == \"/\" || $5 == \"/.tether/tether-guest\" {split($6, o, \",\"); print $5, o[1]}' /proc/self/mountinfo | tr '\\n' ' ' > romounts\n"
	         "awk '$5 == \"/workspace\" {print $6}' /proc/self/mountinfo | tr ',' ' ' > wsopts\n"
	         "{ echo hi > /workspace/w && cat /workspace/w; } > wsw\n"
	         "{ echo hi > /tmp/w && cat /tmp/w; } > tmpw\n"
	         "[ -e %s ] && echo yes > tmpm || echo no > tmpm\n"
	         "[ -e %s ] && echo yes > rootm || echo no > rootm\n"
	         "[ -e /etc/shadow ] && echo yes > shadow || echo no > shadow\n"
	         "hostname > host\n"
	         "id -u > uid\n"
	         "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status | tr -s '\\t' ' ' | tr '\\n' ' ' > secstat\n"
	         "tail -n +3 /proc/net/dev | wc -l > nifs\n"
	         "{ /usr/bin/bash -c 'echo x > /dev/tcp/127.0.0.1/%d' && echo yes || echo no; } > hostnet 2>/dev/null\n"
	         "/usr/bin/perl -MIO::Socket::INET -e '$l=IO::Socket::INET->new(Listen=>1,LocalAddr=>\"127.0.0.1\",LocalPort=>0) or die;"
	         " $c=IO::Socket::INET->new(PeerAddr=>\"127.0.0.1\",PeerPort=>$l->sockport) or die; $a=$l->accept or die;"
	         " print $c \"ping\\n\"; $x=<$a>; print $x' > loop 2>&1\n"
	         "{ unshare -U true && echo yes || echo no; } > unshare 2>/dev/null\n"
	         "{ mount -t tmpfs x /mnt && echo yes || echo no; } > mount 2>/dev/null\n"
	         "{ setarch x86_64 -R true && echo yes || echo no; } > norand 2>/dev/null\n"
	         "{ setarch x86_64 true && echo yes || echo no; } > setarch 2>/dev/null\n"
	         "{ sh -c 'echo child' ; } > fork\n"
	         "/usr/bin/perl -e 'syscall(0x40000027); print \"alive\\n\"' > x32 2>/dev/null; echo $? >> x32\n"
	         "/usr/bin/perl -e 'print syscall(39) > 0 ? \"ok\\n\" : \"bad\\n\"' > native\n"
	         "echo ready >&3\n",
	         tmp_marker, root_marker, port);
	struct fixture *fx = fx_new("sbx_isolation", script);
	fx_start(fx);
	fx_wait_exit(fx, 5000);

	expect(fx, "mypid", "1");
	expect(fx, "pid1", "/bin/sh");
	char npids[16];
	fx_read(fx, "npids", npids, sizeof npids);
	assert_true(atoi(npids) >= 1 && atoi(npids) <= 4); /* sh, ls, grep: no host pids */
	expect(fx, "usrw", "no");
	expect(fx, "rootw", "no");
	/* Read-only by mount flag, not just by ownership. */
	expect(fx, "romounts", "/ ro /usr ro");
	char wsopts[256];
	fx_read(fx, "wsopts", wsopts, sizeof wsopts);
	assert_non_null(strstr(wsopts, "rw"));
	assert_non_null(strstr(wsopts, "nosuid"));
	assert_non_null(strstr(wsopts, "nodev"));
	expect(fx, "wsw", "hi");
	expect(fx, "tmpw", "hi");
	expect(fx, "tmpm", "no");
	expect(fx, "rootm", "no");
	expect(fx, "shadow", "no");
	expect(fx, "host", "sandbox");
	expect(fx, "uid", "0");
	expect(fx, "secstat", "NoNewPrivs: 1 Seccomp: 2");
	expect(fx, "nifs", "1");
	expect(fx, "hostnet", "no");
	expect(fx, "loop", "ping");
	expect(fx, "unshare", "no");
	expect(fx, "mount", "no");
	expect(fx, "norand", "no");
	expect(fx, "setarch", "yes");
	expect(fx, "fork", "child");
	expect(fx, "fds", "0 1 2 3");   /* nothing inherited but stdio + ready */
	expect(fx, "x32", "159");          /* x32 ABI call: killed by SIGSYS */
	expect(fx, "native", "ok");        /* the same call, native ABI: fine */
	/* Files the sandbox's root wrote belong to uid_base on the host. */
	char path[256];
	struct stat st;
	snprintf(path, sizeof path, "%s/layer/workspace/w", fx->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_uid, UID_BASE);
	assert_int_equal(st.st_gid, UID_BASE);
	/* Nothing the sandbox mounted shows on the host side. */
	snprintf(path, sizeof path, "%s/root/usr", fx->dir);
	assert_int_equal(access(path, F_OK), -1);

	unlink(tmp_marker);
	unlink(root_marker);
	close(ls);
	fx_free(fx);
}

/* Memory limit: written to the cgroup, enforced (the hog is killed, a
 * modest allocation passes); the cpu cap written, then rewritten; stop
 * removes the cgroups. */
static void test_memory_limit(void **state)
{
	(void)state;
	struct fixture *fx = fx_new("sbx_memory",
	        "cd /workspace\n"
	        "head -c 8M /dev/zero | tail | wc -c > small\n"
	        "head -c 96M /dev/zero | tail > /dev/null; echo $? > big\n"
	        "echo ready >&3\n");
	fx->cfg.memory_max = 32u << 20;
	fx->cfg.cpu_millis = 500;
	fx_start(fx);
	char quota[PATH_MAX + 32], qv[32];
	snprintf(quota, sizeof quota, "%s/cpu.cfs_quota_us", fx->sb.cgroup_cpu);
	read_file_str(quota, qv, sizeof qv);
	assert_string_equal(qv, "50000");
	/* rewritten while it runs (a spare taken with another cap) */
	struct tt_err cerr = { 0 };
	assert_int_equal(ns_cgroup_set_cpu(&fx->sb, 250, &cerr), 0);
	read_file_str(quota, qv, sizeof qv);
	assert_string_equal(qv, "25000");
	char val[64], path[PATH_MAX + 32];
	snprintf(path, sizeof path, "%s/memory.limit_in_bytes", fx->sb.cgroup_memory);
	read_file_str(path, val, sizeof val);
	assert_string_equal(val, "33554432");
	fx_wait_exit(fx, 10000);
	expect(fx, "small", "8388608");
	expect(fx, "big", "137"); /* tail SIGKILLed by the cgroup OOM killer */
	char mem[PATH_MAX];
	snprintf(mem, sizeof mem, "%s", fx->sb.cgroup_memory);
	struct tt_err err;
	assert_int_equal(ns_sandbox_stop(&fx->sb, &err), 0);
	assert_int_equal(access(mem, F_OK), -1);
	fx_free(fx);
}

/* Pids limit: a bounded fork loop is stopped at the limit, after a few
 * forks succeeded. */
static void test_pids_limit(void **state)
{
	(void)state;
	struct fixture *fx = fx_new("sbx_pids",
	        "cd /workspace\n"
	        "( i=0; while [ $i -lt 60 ]; do sleep 30 & i=$((i+1)); echo $i > forks; done ) 2>/dev/null\n"
	        "echo ready >&3\n"
	        "exec sleep 30\n");
	fx->cfg.pids_max = 16;
	fx_start(fx);
	char val[64], path[PATH_MAX + 32];
	snprintf(path, sizeof path, "%s/pids.max", fx->sb.cgroup_pids);
	read_file_str(path, val, sizeof val);
	assert_string_equal(val, "16");
	char forks[16];
	fx_read(fx, "forks", forks, sizeof forks);
	int n = atoi(forks);
	assert_true(n >= 8);  /* honest forks work */
	assert_true(n < 16);  /* the loop hit the limit */
	fx_free(fx);
}

/* cg_procs_wait: the pids in cgroup dir's cgroup.procs (at most 16), read
 * until there are want of them (1 s); how many there were last. */
static int cg_procs_wait(const char *dir, int want, pid_t pids[16])
{
	char path[PATH_MAX + 32];
	int n = 0;

	snprintf(path, sizeof path, "%s/cgroup.procs", dir);
	for (int tries = 0; tries < 100 && n < want; tries++) {
		FILE *f = fopen(path, "r");
		assert_non_null(f);
		n = 0;
		while (n < 16 && fscanf(f, "%d", &pids[n]) == 1)
			n++;
		fclose(f);
		if (n < want)
			usleep(10000);
	}
	return n;
}

/* Stop kills every process of the sandbox and removes its cgroups; it is
 * idempotent. */
static void test_stop_kills_all(void **state)
{
	(void)state;
	struct fixture *fx = fx_new("sbx_stop",
	        "sleep 300 & sleep 300 & (sleep 300 &)\n"
	        "echo ready >&3\n"
	        "exec sleep 300\n");
	fx_start(fx);
	/* The cgroup lists every sandbox process by host pid. */
	pid_t pids[16];
	int n = cg_procs_wait(fx->sb.cgroup_pids, 4, pids);
	assert_int_equal(n, 4);
	for (int i = 0; i < n; i++)
		assert_int_equal(kill(pids[i], 0), 0);
	char mem[PATH_MAX], pid_cg[PATH_MAX];
	snprintf(mem, sizeof mem, "%s", fx->sb.cgroup_memory);
	snprintf(pid_cg, sizeof pid_cg, "%s", fx->sb.cgroup_pids);
	struct tt_err err;
	assert_int_equal(ns_sandbox_stop(&fx->sb, &err), 0);
	for (int i = 0; i < n; i++) {
		assert_int_equal(kill(pids[i], 0), -1);
		assert_int_equal(errno, ESRCH);
	}
	assert_int_equal(access(mem, F_OK), -1);
	assert_int_equal(access(pid_cg, F_OK), -1);
	assert_int_equal(fx->sb.init_pid, 0);
	assert_int_equal(ns_sandbox_stop(&fx->sb, &err), 0); /* idempotent */
	fx_free(fx);
}

/* test_cgroup_kill: a sandbox known only by its cgroups (its init pid
 * lost, as after a manager killed between starting it and recording it)
 * is killed whole through them; a host process outside stays. */
static void test_cgroup_kill(void **state)
{
	(void)state;
	struct fixture *fx = fx_new("sbx_cgkill",
	        "sleep 300 & sleep 300 &\n"
	        "echo ready >&3\n"
	        "exec sleep 300\n");
	struct ns_sandbox lost;
	struct tt_err err = { 0 };
	pid_t pids[16], outsider;
	int n, st;

	fx_start(fx);
	n = cg_procs_wait(fx->sb.cgroup_pids, 3, pids);
	assert_int_equal(n, 3);
	outsider = fork();
	assert_true(outsider >= 0);
	if (outsider == 0) {
		pause();
		_exit(0);
	}
	ns_sandbox_init(&lost);
	ns_cgroup_find("sbx_cgkill", fx->cfg.gen, &lost);
	assert_string_equal(lost.cgroup_pids, fx->sb.cgroup_pids);
	assert_int_equal(lost.init_pid, 0);
	assert_int_equal(ns_cgroup_kill(&lost, &err), 0);
	/* The init (our child) died of SIGKILL, and the pid namespace with it. */
	assert_int_equal(waitpid(fx->sb.init_pid, &st, 0), fx->sb.init_pid);
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	for (int i = 0; i < n; i++)
		for (int tries = 0; tries < 100 && kill(pids[i], 0) == 0; tries++)
			usleep(10000);
	for (int i = 0; i < n; i++)
		assert_int_equal(kill(pids[i], 0), -1);
	assert_int_equal(kill(outsider, 0), 0);
	kill(outsider, SIGKILL);
	waitpid(outsider, NULL, 0);
	/* Nothing left to kill: the cgroups go. */
	fx->sb.init_pid = 0;
	assert_int_equal(ns_cgroup_kill(&lost, &err), 0);
	assert_int_equal(ns_sandbox_stop(&lost, &err), 0);
	assert_int_equal(access(fx->sb.cgroup_pids, F_OK), -1);
	fx_free(fx);
}

/* start_fails: start must fail with msg in the error, leaving no cgroup
 * and no child. */
static void start_fails(struct fixture *fx, const char *msg)
{
	struct tt_err err = { 0 };
	assert_int_equal(ns_sandbox_start(&fx->cfg, &fx->sb, &err), -1);
	if (!strstr(err.msg, msg))
		fail_msg("error '%s' lacks '%s'", err.msg, msg);
	assert_int_equal(fx->sb.init_pid, 0);
	assert_int_equal(fx->sb.pidfd, -1);
	assert_string_equal(fx->sb.cgroup_memory, "");
	char path[256];
	snprintf(path, sizeof path, "/sys/fs/cgroup/memory/tether/%s-g7", fx->cfg.sbx_id);
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(waitpid(-1, NULL, WNOHANG), -1); /* no child left */
	assert_int_equal(errno, ECHILD);
}

/* Failures are clear and leave nothing behind; bad config is refused. */
static void test_start_failures(void **state)
{
	(void)state;
	struct fixture *fx = fx_new("sbx_fail", "exit 0");
	fx->argv[0] = "/nonexistent/init";
	start_fails(fx, "exec sandbox init");
	fx_free(fx);

	fx = fx_new("sbx_fail", "exit 3");
	start_fails(fx, "exited with status 3 before signalling readiness");
	fx_free(fx);

	fx = fx_new("sbx_fail", "exec 3>&-; sleep 5");
	start_fails(fx, "closed its readiness fd");
	fx_free(fx);

	fx = fx_new("sbx_fail", "echo nope >&3; sleep 5");
	start_fails(fx, "bad readiness line");
	fx_free(fx);

	fx = fx_new("sbx_fail", "sleep 5");
	fx->cfg.ready_timeout_ms = 300;
	start_fails(fx, "timed out");
	fx_free(fx);

	fx = fx_new("../escape", "exit 0");
	start_fails(fx, "sandbox id");
	fx_free(fx);

	fx = fx_new("sbx_fail", "exit 0");
	fx->cfg.uid_base = 0; /* host root is never mapped in */
	start_fails(fx, "uid range");
	fx_free(fx);
}

/* proc_start_time: field 22, robust to a comm holding ") " and digits. */
static void test_proc_start_time(void **state)
{
	(void)state;
	unsigned long long a = 0, b = 0;
	struct tt_err err;
	assert_int_equal(proc_start_time(getpid(), &a, &err), 0);
	assert_true(a > 0);
	char old[16];
	prctl(PR_GET_NAME, old);
	prctl(PR_SET_NAME, "x) R 1 2 3 4 5");
	assert_int_equal(proc_start_time(getpid(), &b, &err), 0);
	prctl(PR_SET_NAME, old);
	assert_true(a == b);
	/* A child started later has a later (or equal) start time. */
	pid_t c = fork();
	if (c == 0) {
		pause();
		_exit(0);
	}
	unsigned long long cs = 0;
	assert_int_equal(proc_start_time(c, &cs, &err), 0);
	assert_true(cs >= a);
	kill(c, SIGKILL);
	waitpid(c, NULL, 0);
	assert_int_equal(proc_start_time(c, &cs, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
}

/* The real guest agent as init: its socket appears on the host side, and
 * the listener's peer credentials name the init (what the bridge checks). */
static void test_real_guest(void **state)
{
	(void)state;
	const char *bin = getenv("TETHER_GUEST_BIN") ? getenv("TETHER_GUEST_BIN")
	                                             : "build/tether-guest";
	char real[PATH_MAX];
	if (!realpath(bin, real) || access(real, X_OK) < 0)
		skip();
	struct fixture *fx = fx_new("sbx_guest", "");
	fx->cfg.init_argv = NULL;
	fx->cfg.guest_bin = real;
	fx_start(fx);
	struct stat st;
	assert_int_equal(stat(fx->sb.guest_socket, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	assert_true(strlen(fx->sb.guest_socket) < sizeof sun.sun_path);
	memcpy(sun.sun_path, fx->sb.guest_socket, strlen(fx->sb.guest_socket) + 1);
	assert_int_equal(connect(s, (struct sockaddr *)&sun, sizeof sun), 0);
	struct ucred cr;
	socklen_t cl = sizeof cr;
	assert_int_equal(getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl), 0);
	assert_int_equal(cr.pid, fx->sb.init_pid);
	assert_int_equal(cr.uid, UID_BASE);
	unsigned long long st_time;
	struct tt_err err;
	assert_int_equal(proc_start_time(cr.pid, &st_time, &err), 0);
	assert_true(st_time == fx->sb.init_start_time);
	close(s);
	fx_free(fx);
}

/* guest_bin_or_skip: the real agent's absolute path, or skip the test. */
static void guest_bin_or_skip(char real[PATH_MAX])
{
	const char *bin = getenv("TETHER_GUEST_BIN") ? getenv("TETHER_GUEST_BIN")
	                                             : "build/tether-guest";
	if (!realpath(bin, real) || access(real, X_OK) < 0)
		skip();
}

/* hello_ok: the bridge's handshake with the agent at sock for (sbx, gen,
 * att) under secret: true when its proof is right. */
static bool hello_ok(const char *sock, const char *sbx, uint64_t gen, uint32_t att,
                     const uint8_t secret[HELLO_SECRET_LEN])
{
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	uint8_t chal[HELLO_CHALLENGE_LEN], want[HELLO_PROOF_LEN], got[HELLO_PROOF_LEN];
	char b64[HELLO_B64_LEN + 1];
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct wire_frame f;
	bool ok = false;
	json_t *o;
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sun.sun_path, sizeof sun.sun_path, "%s", sock);
	if (s < 0 || connect(s, (struct sockaddr *)&sun, sizeof sun) < 0)
		goto out;
	randombytes_buf(chal, sizeof chal);
	hello_b64_encode(chal, b64);
	o = json_pack("{s:i,s:s,s:s,s:I,s:I}", "v", HELLO_VERSION, "challenge", b64, "sbx", sbx,
	              "generation", (json_int_t)gen, "activation", (json_int_t)att);
	if (wire_send_json(s, WIRE_HELLO, o, NULL) < 0 ||
	    wire_recv(s, &f, buf, sizeof buf, NULL) != 1 || f.type != WIRE_HELLO) {
		json_decref(o);
		goto out;
	}
	json_decref(o);
	o = wire_frame_json(&f, NULL);
	hello_proof(secret, sbx, gen, att, chal, want);
	ok = o && hello_b64_decode(json_string_value(json_object_get(o, "proof")), got) == 0 &&
	     memcmp(got, want, sizeof want) == 0;
	json_decref(o);
out:
	if (s >= 0)
		close(s);
	return ok;
}

/* fx_spare: a fixture for a spare: the real agent at real, assigned later. */
static struct fixture *fx_spare(const char *real)
{
	struct fixture *fx = fx_new("spare", "");

	fx->cfg.init_argv = NULL;
	fx->cfg.guest_bin = real;
	fx->cfg.assign_later = true;
	return fx;
}

/* A spare: the sandbox is built and the agent exec'd before its execution
 * is known; it does not listen until assigned. The assignment renames its
 * cgroups and hands the agent its identity and secret: it then answers the
 * handshake for exactly that identity. An assignment the agent cannot
 * parse, or none (EOF: the manager dropped it), ends the sandbox; a bad id
 * is refused before anything is sent. */
static void test_spare_assign(void **state)
{
	(void)state;
	char real[PATH_MAX], old_mem[PATH_MAX];
	uint8_t secret[NS_SECRET_LEN];
	struct tt_err err = { 0 };
	struct stat st;
	guest_bin_or_skip(real);
	assert_true(sodium_init() >= 0);
	randombytes_buf(secret, sizeof secret);

	struct fixture *fx = fx_spare(real);
	if (ns_sandbox_launch(&fx->cfg, &fx->sb, &err) < 0)
		fail_msg("launch: %s", err.msg);
	snprintf(old_mem, sizeof old_mem, "%s", fx->sb.cgroup_memory);
	assert_non_null(strstr(old_mem, "/spare-g7"));
	usleep(100 * 1000);
	assert_int_equal(stat(fx->sb.guest_socket, &st), -1); /* not listening yet */
	assert_int_equal(ns_sandbox_assign(&fx->sb, "bad id!", 9, 2, secret, &err), -1);
	assert_int_equal(ns_sandbox_assign(&fx->sb, "sbx_assigned", 9, 2, secret, &err), 0);
	assert_non_null(strstr(fx->sb.cgroup_memory, "/sbx_assigned-g9"));
	assert_int_equal(stat(old_mem, &st), -1);
	assert_int_equal(stat(fx->sb.cgroup_memory, &st), 0);
	if (ns_sandbox_wait_ready(&fx->sb, &err) < 0)
		fail_msg("wait_ready: %s", err.msg);
	assert_true(hello_ok(fx->sb.guest_socket, "sbx_assigned", 9, 2, secret));
	assert_false(hello_ok(fx->sb.guest_socket, "sbx_assigned", 7, 2, secret));
	fx_free(fx);

	/* Never assigned: EOF ends the agent, PID 1, and the sandbox. */
	fx = fx_spare(real);
	assert_int_equal(ns_sandbox_launch(&fx->cfg, &fx->sb, &err), 0);
	close(fx->sb.assign_fd);
	fx->sb.assign_fd = -1;
	fx_wait_exit(fx, 5000);
	fx_free(fx);

	/* Garbage instead of an assignment: refused, the sandbox ends. */
	fx = fx_spare(real);
	assert_int_equal(ns_sandbox_launch(&fx->cfg, &fx->sb, &err), 0);
	assert_int_equal(write(fx->sb.assign_fd, "short", 5), 5);
	close(fx->sb.assign_fd);
	fx->sb.assign_fd = -1;
	fx_wait_exit(fx, 5000);
	assert_int_equal(ns_sandbox_wait_ready(&fx->sb, &err), -1);
	fx_free(fx);
}

/* now_us: monotonic microseconds. */
static long long now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* cmp_ll: qsort order for long long. */
static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return (x > y) - (x < y);
}

/* Start/stop cycles back to back: each one clean, median time reported. */
static void test_start_stop_cycles(void **state)
{
	(void)state;
	enum { N = 15 };
	long long start_us[N], stop_us[N];
	struct fixture *fx = fx_new("sbx_cycle", "echo ready >&3; exec sleep 60");
	for (int i = 0; i < N; i++) {
		fx->cfg.gen = (uint64_t)i + 1;
		long long t0 = now_us();
		fx_start(fx);
		long long t1 = now_us();
		char mem[PATH_MAX];
		snprintf(mem, sizeof mem, "%s", fx->sb.cgroup_memory);
		struct tt_err err;
		assert_int_equal(ns_sandbox_stop(&fx->sb, &err), 0);
		start_us[i] = t1 - t0;
		stop_us[i] = now_us() - t1;
		assert_int_equal(access(mem, F_OK), -1);
	}
	qsort(start_us, N, sizeof start_us[0], cmp_ll);
	qsort(stop_us, N, sizeof stop_us[0], cmp_ll);
	printf("# ns sandbox start median %.1f ms, stop median %.1f ms (%d cycles)\n",
	       start_us[N / 2] / 1000.0, stop_us[N / 2] / 1000.0, N);
	fx_free(fx);
}

/* loop_of: whether some loop device is backed by a file under dir. */
static bool loop_of(const char *dir)
{
	char cmd[256];

	snprintf(cmd, sizeof cmd, "losetup -a | grep -q -- '(%s/'", dir);
	return system(cmd) == 0;
}

/* Disk and inode caps (task Q): with layer_bytes set, the layer is an
 * ext4 image of its own. Past the cap, a write and a file creation fail
 * with ENOSPC inside; appending to an existing file still works; the
 * image never holds more than the cap on the host; unmount + mount again
 * keeps the files; remove frees the loop device. */
static void test_layer_cap(void **state)
{
	(void)state;
	struct fixture *fx = fx_new("sbx_layer",
	        "cd /workspace\n"
	        ": > icount; : > append; : > dd_rc; : > dd_nospace; : > ws_mounts; : > loops\n"
	        "dd if=/dev/zero of=/tmp/big bs=1M count=40 2>/tmp/dd.err; echo $? > dd_rc\n"
	        "grep -c 'No space left' /tmp/dd.err > dd_nospace\n"
	        "rm -f /tmp/big /tmp/dd.err\n"
	        "head -c 1000000 /dev/zero > honest && wc -c < honest > honest_size\n"
	        "i=0; while [ $i -lt 2000 ]; do true > /tmp/f$i 2>/dev/null || break; i=$((i+1)); done\n"
	        "echo $i > icount\n"
	        "echo more >> append\n"
	        "grep -c ' /workspace ' /proc/self/mountinfo > ws_mounts\n"
	        "grep -c ' ext4 /dev/loop' /proc/self/mountinfo > loops\n"
	        "echo ready >&3\n"
	        "exec sleep 30\n");
	char path[PATH_MAX], got[64], decoy[64];
	struct stat st;
	struct tt_err err = { 0 };

	/* Another sandbox's layer, mounted before the clean mount namespace
	 * is made: it must not show in (or be pinned by) ours. */
	snprintf(decoy, sizeof decoy, "/tmp/tt-ns-decoy.XXXXXX");
	assert_non_null(mkdtemp(decoy));
	if (ns_layer_make(decoy, 16u << 20, 0, &err) < 0)
		fail_msg("ns_layer_make: %s", err.msg);
	int clean = ns_mntns_clean(&err);
	if (clean < 0)
		fail_msg("ns_mntns_clean: %s", err.msg);
	fx->cfg.use_mntns = true;
	fx->cfg.mntns_fd = clean;
	fx->cfg.layer_bytes = 16u << 20;
	fx->cfg.layer_inodes = 256;
	fx_start(fx);
	expect(fx, "ws_mounts", "1");
	expect(fx, "loops", "3"); /* its own home, tmp, workspace only */
	assert_int_equal(ns_layer_remove(decoy, &err), 0);
	for (int i = 0; i < 100 && loop_of(decoy); i++)
		usleep(10000);
	assert_false(loop_of(decoy)); /* not pinned by the clean namespace */
	snprintf(path, sizeof path, "%s/layer", decoy);
	rmdir(path);
	rmdir(decoy);
	assert_true(ns_layer_mounted(fx->dir));
	expect(fx, "dd_nospace", "1");
	fx_read(fx, "dd_rc", got, sizeof got);
	assert_string_not_equal(got, "0");
	expect(fx, "honest_size", "1000000");
	fx_read(fx, "icount", got, sizeof got);
	long made = strtol(got, NULL, 10);
	if (made < 100 || made >= 256)
		fail_msg("files created before the inode cap: %s", got);
	expect(fx, "append", "more");
	/* The host pays at most the cap. */
	snprintf(path, sizeof path, "%s/" NS_LAYER_IMG, fx->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_true((uint64_t)st.st_blocks * 512 <= (16u << 20));
	assert_true(loop_of(fx->dir));
	/* Stopped and unmounted: the files stay in the image. */
	assert_int_equal(ns_sandbox_stop(&fx->sb, &err), 0);
	assert_int_equal(ns_layer_umount(fx->dir, &err), 0);
	assert_false(ns_layer_mounted(fx->dir));
	expect(fx, "append", ""); /* the bare mount point */
	assert_int_equal(ns_layer_ensure(fx->dir, NULL, 16u << 20, 256, &err), 0);
	assert_true(ns_layer_mounted(fx->dir));
	expect(fx, "append", "more");
	/* Removed: unmounted, image gone, loop device freed (autoclear). */
	assert_int_equal(ns_layer_remove(fx->dir, &err), 0);
	assert_false(ns_layer_mounted(fx->dir));
	assert_int_equal(access(path, F_OK), -1);
	for (int i = 0; i < 100 && loop_of(fx->dir); i++)
		usleep(10000);
	assert_false(loop_of(fx->dir));
	close(clean);
	fx_free(fx);
}

/* A layer dir that holds files but no image (made before quotas) is not
 * hidden under a mount: the start fails with a clear error instead. */
static void test_layer_refuses_plain_files(void **state)
{
	(void)state;
	struct fixture *fx = fx_new("sbx_layer_old", "echo ready >&3\nexec sleep 30\n");
	char path[PATH_MAX];
	struct tt_err err = { 0 };

	snprintf(path, sizeof path, "%s/layer", fx->dir);
	assert_int_equal(mkdir(path, 0700), 0);
	snprintf(path, sizeof path, "%s/layer/old", fx->dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fclose(f);
	fx->cfg.layer_bytes = 16u << 20;
	assert_int_equal(ns_sandbox_start(&fx->cfg, &fx->sb, &err), -1);
	assert_non_null(strstr(err.msg, "holds files"));
	assert_false(ns_layer_mounted(fx->dir));
	/* Honest: an empty layer dir gets its filesystem. */
	assert_int_equal(unlink(path), 0);
	fx_start(fx);
	assert_true(ns_layer_mounted(fx->dir));
	assert_int_equal(ns_sandbox_stop(&fx->sb, &err), 0);
	assert_int_equal(ns_layer_remove(fx->dir, &err), 0);
	fx_free(fx);
}

/* Layers copied from a template (ns_layer_template + ns_layer_make_from)
 * are separate filesystems of the template's size and inode count. */
static void test_layer_template(void **state)
{
	(void)state;
	char base[64], tmpl[96], a[96], b[96], f[160];
	struct tt_err err = { 0 };
	struct statvfs va, vb;

	snprintf(base, sizeof base, "/tmp/tt-ns-tmpl.XXXXXX");
	assert_non_null(mkdtemp(base));
	snprintf(tmpl, sizeof tmpl, "%s/t.img", base);
	snprintf(a, sizeof a, "%s/a", base);
	snprintf(b, sizeof b, "%s/b", base);
	if (ns_layer_template(tmpl, 32u << 20, 512, &err) < 0)
		fail_msg("ns_layer_template: %s", err.msg);
	assert_int_equal(mkdir(a, 0700), 0);
	assert_int_equal(mkdir(b, 0700), 0);
	if (ns_layer_make_from(a, tmpl, &err) < 0 || ns_layer_make_from(b, tmpl, &err) < 0)
		fail_msg("ns_layer_make_from: %s", err.msg);
	assert_true(ns_layer_mounted(a) && ns_layer_mounted(b));
	snprintf(f, sizeof f, "%s/layer/workspace", a);
	assert_int_equal(statvfs(f, &va), 0);
	snprintf(f, sizeof f, "%s/layer/workspace", b);
	assert_int_equal(statvfs(f, &vb), 0);
	assert_true(va.f_blocks * va.f_frsize <= (32u << 20));
	assert_true(va.f_files <= 512 && va.f_files >= 256);
	/* A file in one is not in the other. */
	snprintf(f, sizeof f, "%s/layer/workspace/only-a", a);
	FILE *fp = fopen(f, "w");
	assert_non_null(fp);
	fclose(fp);
	snprintf(f, sizeof f, "%s/layer/workspace/only-a", b);
	assert_int_equal(access(f, F_OK), -1);
	/* ns_layer_ensure with the template (a start with no spare ready):
	 * the copy's geometry, not the mkfs parameters also given. */
	char c[96];
	struct statvfs vc;
	snprintf(c, sizeof c, "%s/c", base);
	assert_int_equal(mkdir(c, 0700), 0);
	if (ns_layer_ensure(c, tmpl, 64u << 20, 4096, &err) < 0)
		fail_msg("ns_layer_ensure: %s", err.msg);
	snprintf(f, sizeof f, "%s/layer/workspace", c);
	assert_int_equal(statvfs(f, &vc), 0);
	assert_int_equal(vc.f_files, va.f_files);
	assert_int_equal(vc.f_blocks, va.f_blocks);
	assert_int_equal(ns_layer_remove(c, &err), 0);
	assert_int_equal(ns_layer_remove(a, &err), 0);
	assert_int_equal(ns_layer_remove(b, &err), 0);
	for (int i = 0; i < 100 && loop_of(base); i++)
		usleep(10000);
	assert_false(loop_of(base));
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", base);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_proc_start_time),
		cmocka_unit_test(test_isolation),
		cmocka_unit_test(test_memory_limit),
		cmocka_unit_test(test_pids_limit),
		cmocka_unit_test(test_stop_kills_all),
		cmocka_unit_test(test_cgroup_kill),
		cmocka_unit_test(test_start_failures),
		cmocka_unit_test(test_real_guest),
		cmocka_unit_test(test_spare_assign),
		cmocka_unit_test(test_start_stop_cycles),
		cmocka_unit_test(test_layer_cap),
		cmocka_unit_test(test_layer_refuses_plain_files),
		cmocka_unit_test(test_layer_template),
	};
	if (geteuid() != 0) {
		printf("1..0 # SKIP the ns substrate tests need root\n");
		return 0;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}

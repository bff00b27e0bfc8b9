/* Shared measuring code for the guest baselines (bench_guest.c) and the
 * full-path benchmarks: header-only (static inline) because bench_*.c files
 * are each built alone against libtethercore. */
#ifndef TT_BENCH_UTIL_H
#define TT_BENCH_UTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "client/tether.h"
#include "hello.h"
#include "wire.h"

#define BENCH_SBX "sbx_benchbenchbenchbenchbenchb"

/* The activation secret handed to the guest started by bench_guest_start;
 * bench_wire_op answers its handshake with it, as the bridge does. */
static uint8_t bench_secret[HELLO_SECRET_LEN];

/* bench_now_us: monotonic time in microseconds. */
static inline double bench_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* bench_cmp_double: qsort order for doubles. */
static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* bench_median: sorts v in place and returns its median. */
static inline double bench_median(double *v, size_t n)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof(*v), bench_cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* bench_io_full: reads (or writes) exactly n bytes; 0 or -1. */
static inline int bench_io_full(int fd, void *buf, size_t n, int writing)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = writing ? write(fd, (char *)buf + done, n - done)
		                    : read(fd, (char *)buf + done, n - done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		done += (size_t)r;
	}
	return 0;
}

/* bench_tcp_pair: a connected TCP pair over loopback (TCP_NODELAY, as
 * the HTTP hops run); 0 or -1. */
static inline int bench_tcp_pair(int sv[2])
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sv[0] = sv[1] = -1;
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(lfd, 1) < 0 || getsockname(lfd, (struct sockaddr *)&sa, &len) < 0 ||
	    (sv[0] = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
	    connect(sv[0], (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    (sv[1] = accept(lfd, NULL, NULL)) < 0) {
		if (lfd >= 0)
			close(lfd);
		if (sv[0] >= 0)
			close(sv[0]);
		return -1;
	}
	close(lfd);
	setsockopt(sv[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(sv[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return 0;
}

/* bench_pin: pins the calling process to cpu (-1: leaves it free). */
static inline void bench_pin(int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	(void)sched_setaffinity(0, sizeof(set), &set);
}

/* bench_unpin: lets the calling process run on every CPU again. */
static inline void bench_unpin(void)
{
	cpu_set_t set;
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	CPU_ZERO(&set);
	for (long i = 0; i < n && i < CPU_SETSIZE; i++)
		CPU_SET((int)i, &set);
	(void)sched_setaffinity(0, sizeof(set), &set);
}

static inline double bench_raw_rtt_on(int iters, int tcp, int cpu_a, int cpu_b);

/* bench_raw_rtt: median round trip in µs of a 64-byte ping-pong between
 * two processes the scheduler places, over a unix socketpair (tcp = 0) or
 * loopback TCP (tcp = 1); -1 on failure. */
static inline double bench_raw_rtt(int iters, int tcp)
{
	return bench_raw_rtt_on(iters, tcp, -1, -1);
}

/* bench_raw_rtt_on: the same with the two processes pinned to cpu_a and
 * cpu_b (-1: not pinned). On this kind of VM a wake-up on the same CPU is
 * a plain switch, on another (idle) one an IPI and a halt exit: the
 * unpinned figure swings between the two with placement. */
static inline double bench_raw_rtt_on(int iters, int tcp, int cpu_a, int cpu_b)
{
	double *v = calloc((size_t)iters, sizeof(*v)), med;
	char msg[64] = { 0 };
	int sv[2], status;
	pid_t pid;

	if (v == NULL || (tcp ? bench_tcp_pair(sv) : socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) < 0)
		return free(v), -1;
	pid = fork();
	if (pid < 0)
		return free(v), -1;
	if (pid == 0) {
		close(sv[0]);
		bench_pin(cpu_b);
		while (bench_io_full(sv[1], msg, sizeof(msg), 0) == 0 &&
		       bench_io_full(sv[1], msg, sizeof(msg), 1) == 0)
			;
		_exit(0);
	}
	close(sv[1]);
	bench_pin(cpu_a);
	for (int i = 0; i < iters; i++) {
		double t0 = bench_now_us();

		if (bench_io_full(sv[0], msg, sizeof(msg), 1) < 0 ||
		    bench_io_full(sv[0], msg, sizeof(msg), 0) < 0) {
			iters = i;
			break;
		}
		v[i] = bench_now_us() - t0;
	}
	close(sv[0]);
	if (cpu_a >= 0)
		bench_unpin();
	waitpid(pid, &status, 0);
	med = iters > 0 ? bench_median(v, (size_t)iters) : -1;
	free(v);
	return med;
}

/* bench_guest_start: runs bin as a guest on sock with --root root, a fresh
 * activation secret on a pipe, and waits for "ready"; returns its pid or -1. */
static inline pid_t bench_guest_start(const char *bin, const char *root,
                                      const char *sock)
{
	char fdarg[16], sfdarg[16], line[8] = { 0 };
	int p[2], sp[2];
	pid_t pid;

	randombytes_buf(bench_secret, sizeof(bench_secret));
	if (pipe(p) < 0)
		return -1;
	if (pipe(sp) < 0 ||
	    write(sp[1], bench_secret, sizeof(bench_secret)) != (ssize_t)sizeof(bench_secret))
		return -1;
	close(sp[1]);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		close(p[0]);
		snprintf(fdarg, sizeof(fdarg), "%d", p[1]);
		snprintf(sfdarg, sizeof(sfdarg), "%d", sp[0]);
		execl(bin, bin, "--listen", sock, "--sbx", BENCH_SBX, "--gen", "1",
		      "--att", "1", "--root", root, "--ready-fd", fdarg,
		      "--secret-fd", sfdarg, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	close(sp[0]);
	struct pollfd pf = { .fd = p[0], .events = POLLIN };
	if (poll(&pf, 1, 5000) != 1 || read(p[0], line, 6) != 6) {
		close(p[0]);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return -1;
	}
	close(p[0]);
	return pid;
}

/* bench_hello: the bridge's side of the guest handshake on fd: a fresh
 * challenge, then the proof checked; 0 or -1. */
static inline int bench_hello(int fd, uint8_t *buf)
{
	uint8_t chal[HELLO_CHALLENGE_LEN], want[HELLO_PROOF_LEN], got[HELLO_PROOF_LEN];
	char b64[HELLO_B64_LEN + 1], msg[256];
	struct wire_frame f;
	const char *p;
	int n;

	randombytes_buf(chal, sizeof(chal));
	hello_b64_encode(chal, b64);
	n = snprintf(msg, sizeof(msg),
	             "{\"v\":1,\"challenge\":\"%s\",\"sbx\":\"%s\","
	             "\"generation\":1,\"activation\":1}", b64, BENCH_SBX);
	if (wire_send(fd, WIRE_HELLO, msg, (uint32_t)n, NULL) < 0 ||
	    wire_recv(fd, &f, buf, WIRE_PAYLOAD_MAX + 1, NULL) != 1 ||
	    f.type != WIRE_HELLO)
		return -1;
	/* The answer is {"proof":"<43 chars>"}: enough to find it by hand. */
	p = strstr((const char *)f.payload, "\"proof\":\"");
	if (p == NULL || strlen(p) < 9 + HELLO_B64_LEN)
		return -1;
	memcpy(b64, p + 9, HELLO_B64_LEN);
	b64[HELLO_B64_LEN] = '\0';
	hello_proof(bench_secret, BENCH_SBX, 1, 1, chal, want);
	return hello_b64_decode(b64, got) == 0 &&
	       sodium_memcmp(got, want, sizeof(want)) == 0 ? 0 : -1;
}

/* bench_guest_stop: SIGTERM and reap. */
static inline void bench_guest_stop(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
}

/* bench_unix_connect: a new connection to a unix socket path, or -1. */
static inline int bench_unix_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* bench_wire_op: one whole operation on a new connection to sock, as the
 * bridge makes it: the handshake, REQUEST req, then frames until RESULT (0) or ERROR/EOF (-1). buf holds
 * WIRE_PAYLOAD_MAX + 1 bytes. */
static inline int bench_wire_op(const char *sock, const char *req, uint8_t *buf)
{
	struct wire_frame f;
	int fd = bench_unix_connect(sock), rc = -1;

	if (fd < 0)
		return -1;
	if (bench_hello(fd, buf) == 0 &&
	    wire_send(fd, WIRE_REQUEST, req, (uint32_t)strlen(req), NULL) == 0) {
		while (wire_recv(fd, &f, buf, WIRE_PAYLOAD_MAX + 1, NULL) == 1) {
			if (f.type == WIRE_RESULT) {
				rc = 0;
				break;
			}
			if (f.type == WIRE_ERROR)
				break;
		}
	}
	close(fd);
	return rc;
}

/* bench_wire_median: median µs of iters runs of bench_wire_op (after a few
 * warm-up runs); -1 if any run fails. */
static inline double bench_wire_median(const char *sock, const char *req,
                                       int iters)
{
	uint8_t *buf = malloc(WIRE_PAYLOAD_MAX + 1);
	double *v = calloc((size_t)iters, sizeof(*v)), med = -1;

	if (buf == NULL || v == NULL)
		goto out;
	for (int i = 0; i < 5; i++)
		if (bench_wire_op(sock, req, buf) < 0)
			goto out;
	for (int i = 0; i < iters; i++) {
		double t0 = bench_now_us();

		if (bench_wire_op(sock, req, buf) < 0)
			goto out;
		v[i] = bench_now_us() - t0;
	}
	med = bench_median(v, (size_t)iters);
out:
	free(buf);
	free(v);
	return med;
}

/* bench_guest_exec: median µs of exec `true` straight to a guest socket. */
static inline double bench_guest_exec(const char *sock, int iters)
{
	return bench_wire_median(sock, "{\"op\":\"exec\",\"cmd\":[\"true\"]}", iters);
}

/* bench_guest_fs_read: median µs of fs.read of path straight to a guest. */
static inline double bench_guest_fs_read(const char *sock, const char *path,
                                         int iters)
{
	char req[4200];

	snprintf(req, sizeof(req), "{\"op\":\"fs.read\",\"path\":\"%s\"}", path);
	return bench_wire_median(sock, req, iters);
}

/* bench_wire_seq: one operation on an open, handshaken connection fd:
 * REQUEST req, then frames until RESULT (0) or ERROR/EOF (-1). */
static inline int bench_wire_seq(int fd, const char *req, uint8_t *buf)
{
	struct wire_frame f;

	if (wire_send(fd, WIRE_REQUEST, req, (uint32_t)strlen(req), NULL) < 0)
		return -1;
	while (wire_recv(fd, &f, buf, WIRE_PAYLOAD_MAX + 1, NULL) == 1) {
		if (f.type == WIRE_RESULT)
			return 0;
		if (f.type == WIRE_ERROR)
			return -1;
	}
	return -1;
}

/* bench_wire_median_warm: like bench_wire_median, but connects and runs
 * the handshake ONCE, then times each REQUEST..RESULT on that connection
 * (operations in sequence, as pooled connections carry them); -1 if any
 * step fails. */
static inline double bench_wire_median_warm(const char *sock, const char *req,
                                            int iters)
{
	uint8_t *buf = malloc(WIRE_PAYLOAD_MAX + 1);
	double *v = calloc((size_t)iters, sizeof(*v)), med = -1;
	int fd = bench_unix_connect(sock);

	if (buf == NULL || v == NULL || fd < 0 || bench_hello(fd, buf) < 0)
		goto out;
	for (int i = 0; i < 5; i++)
		if (bench_wire_seq(fd, req, buf) < 0)
			goto out;
	for (int i = 0; i < iters; i++) {
		double t0 = bench_now_us();

		if (bench_wire_seq(fd, req, buf) < 0)
			goto out;
		v[i] = bench_now_us() - t0;
	}
	med = bench_median(v, (size_t)iters);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	free(v);
	return med;
}

/* bench_guest_exec_warm: median µs of exec `true` on one warm connection. */
static inline double bench_guest_exec_warm(const char *sock, int iters)
{
	return bench_wire_median_warm(sock, "{\"op\":\"exec\",\"cmd\":[\"true\"]}",
	                              iters);
}

/* bench_guest_fs_read_warm: median µs of fs.read of path on one warm
 * connection. */
static inline double bench_guest_fs_read_warm(const char *sock, const char *path,
                                              int iters)
{
	char req[4200];

	snprintf(req, sizeof(req), "{\"op\":\"fs.read\",\"path\":\"%s\"}", path);
	return bench_wire_median_warm(sock, req, iters);
}

/* A local cluster run by `tether up --workers 2` for the full-path
 * benchmarks: its scratch directory (HOME and state), port base and pid. */
struct bench_cluster {
	const char *name; /* the benchmark's name, for messages */
	char scratch[PATH_MAX];
	int port_base;
	pid_t pid;
};

/* bench_percentile: v sorted ascending; nearest-rank percentile p in [0,100]. */
static inline double bench_percentile(const double *v, size_t n, double p)
{
	size_t k = (size_t)((p / 100.0) * (double)n + 0.999999);

	if (k == 0)
		k = 1;
	return v[k > n ? n - 1 : k - 1];
}

/* bench_cluster_scratch: makes c's scratch directory from a mkdtemp
 * template; 0 or -1. */
static inline int bench_cluster_scratch(struct bench_cluster *c,
                                        const char *tmpl)
{
	c->pid = -1;
	snprintf(c->scratch, sizeof(c->scratch), "%s", tmpl);
	if (mkdtemp(c->scratch) == NULL) {
		perror("mkdtemp");
		return -1;
	}
	return 0;
}

/* bench_cluster_start: runs build/tether up in the background on scratch. */
static inline int bench_cluster_start(struct bench_cluster *c)
{
	char state[PATH_MAX + 16], port[16];

	snprintf(state, sizeof(state), "%s/state", c->scratch);
	snprintf(port, sizeof(port), "%d", c->port_base);
	c->pid = fork();
	if (c->pid < 0)
		return -1;
	if (c->pid == 0) {
		int devnull = open("/dev/null", O_WRONLY);

		if (devnull >= 0) {
			dup2(devnull, STDOUT_FILENO);
			dup2(devnull, STDERR_FILENO);
		}
		setenv("HOME", c->scratch, 1);
		setenv("TETHER_LOG", "warn", 1);
		execl("build/tether", "tether", "up", "--workers", "2", "--state",
		      state, "--port", port, (char *)NULL);
		_exit(127);
	}
	return 0;
}

/* bench_cluster_client: waits (up to 30 s) for the CLI config written by
 * `tether up` and two registered workers; returns an edge client and
 * fills *cfg with the edge configuration (the caller wipes it). */
static inline struct tether *bench_cluster_client(struct bench_cluster *c,
                                                  struct tether_config *cfg)
{
	struct tt_err err = { 0 };
	struct tether *t = NULL;

	setenv("HOME", c->scratch, 1);
	for (int i = 0; i < 300; i++) {
		usleep(100000);
		if (waitpid(c->pid, NULL, WNOHANG) == c->pid) {
			c->pid = -1;
			fprintf(stderr, "%s: tether up exited (port base %d "
			        "in use?); logs in %s/state/logs\n", c->name,
			        c->port_base, c->scratch);
			break;
		}
		if (t == NULL && tether_config_load(cfg, &err) == 0)
			t = tether_new(cfg, &err);
		if (t == NULL)
			continue;
		json_t *w = tether_workers(t, &err);
		size_t n = json_array_size(json_object_get(w, "workers"));

		json_decref(w);
		if (n == 2)
			return t;
	}
	fprintf(stderr, "%s: cluster did not come up: %s\n", c->name, err.msg);
	tether_free(t);
	return NULL;
}

/* bench_cluster_stop: SIGTERM to `tether up` (which stops its daemons),
 * then removes the scratch directory. */
static inline void bench_cluster_stop(struct bench_cluster *c)
{
	if (c->pid > 0) {
		kill(c->pid, SIGTERM);
		waitpid(c->pid, NULL, 0);
		c->pid = -1;
	}
	if (fork() == 0) {
		execlp("rm", "rm", "-rf", c->scratch, (char *)NULL);
		_exit(127);
	}
	wait(NULL);
}

/* CPU time by role of a cluster's processes (the descendants of its
 * `tether up`), to say where an operation's time goes: wall-clock figures
 * here swing with how fast idle vCPUs wake, CPU time much less. */
enum bench_role { BR_CLIENT, BR_EDGE, BR_NODE, BR_MANAGER, BR_BRIDGE, BR_GUEST, BR_N };

static const char *const bench_role_names[BR_N] = {
	"client", "edge", "node-api", "manager", "bridge", "guest",
};

/* CPU seconds per role at one moment. */
struct bench_cpu {
	double s[BR_N];
};

/* bench_proc_read: ppid and CPU seconds (own + reaped children) of pid. */
static inline int bench_proc_read(int pid, int *ppid, double *cpu)
{
	char path[64], buf[1024];
	unsigned long long ut, st, cut, cst;
	const char *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	/* fields 4 (ppid) and 14-17 (utime, stime, cutime, cstime) */
	if (p == NULL || sscanf(p + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
	                        "%llu %llu %llu %llu", ppid, &ut, &st, &cut, &cst) != 5)
		return -1;
	*cpu = (double)(ut + st + cut + cst) / (double)sysconf(_SC_CLK_TCK);
	return 0;
}

/* bench_proc_role: the role a process of the cluster plays, by argv. */
static inline int bench_proc_role(int pid)
{
	char path[64], argv[256] = { 0 };
	const char *base;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, argv, sizeof(argv) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	base = strrchr(argv, '/') ? strrchr(argv, '/') + 1 : argv;
	if (strcmp(base, "tether-bridge") == 0)
		return BR_BRIDGE;
	if (strcmp(base, "tether-guest") == 0)
		return BR_GUEST;
	if (strcmp(base, "tetherd") != 0 || (size_t)n <= strlen(argv) + 1)
		return -1;
	base = argv + strlen(argv) + 1; /* the role */
	return strcmp(base, "edge") == 0 ? BR_EDGE : strcmp(base, "node") == 0 ? BR_NODE :
	       strcmp(base, "manager") == 0 ? BR_MANAGER : -1;
}

/* bench_cpu_take: CPU seconds by role now, of root's descendants and of
 * this process (the client). */
static inline void bench_cpu_take(pid_t root, struct bench_cpu *c)
{
	static int pids[32768], ppids[32768];
	static double cpus[32768];
	struct rusage ru;
	struct dirent *e;
	size_t n = 0;
	DIR *d = opendir("/proc");

	memset(c, 0, sizeof(*c));
	getrusage(RUSAGE_SELF, &ru);
	c->s[BR_CLIENT] = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
	                  (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
	while (d != NULL && (e = readdir(d)) != NULL && n < 32768) {
		int pid = atoi(e->d_name);

		if (pid > 0 && bench_proc_read(pid, &ppids[n], &cpus[n]) == 0)
			pids[n++] = pid;
	}
	if (d != NULL)
		closedir(d);
	for (size_t i = 0; i < n; i++) {
		int role = bench_proc_role(pids[i]), up = ppids[i], hops = 0;

		if (role < 0)
			continue;
		/* a descendant of root? (walk the parents through the table) */
		while (up > 1 && up != root && hops++ < 16) {
			size_t j = 0;

			while (j < n && pids[j] != up)
				j++;
			up = j < n ? ppids[j] : 0;
		}
		if (up == root)
			c->s[role] += cpus[i];
	}
}

/* bench_cpu_add: sum += b - a, role by role. */
static inline void bench_cpu_add(struct bench_cpu *sum, const struct bench_cpu *a,
                                 const struct bench_cpu *b)
{
	for (int r = 0; r < BR_N; r++)
		sum->s[r] += b->s[r] - a->s[r];
}

/* bench_cpu_print: CPU µs per operation by role between a and b. */
static inline void bench_cpu_print(const char *what, const struct bench_cpu *a,
                                   const struct bench_cpu *b, int ops)
{
	printf("%-17s cpu per op:", what);
	for (int r = 0; r < BR_N; r++)
		printf(" %s %.0f us%s", bench_role_names[r],
		       (b->s[r] - a->s[r]) * 1e6 / ops, r + 1 < BR_N ? "," : "\n");
}

#endif

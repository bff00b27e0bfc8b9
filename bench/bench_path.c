/* bench_path: the request path end to end, on a real local cluster.
 *
 * Starts `tether up --workers 2` on a scratch state directory, then measures
 * in one run:
 *   - create latency (p50, p99 of 100 creates through the edge);
 *   - exec `true` and a 4 KiB file read through the full path
 *     (libtether -> edge -> node-api -> sbx-manager -> bridge -> guest);
 *   - the same two operations sent straight to a guest agent's socket;
 *   - a raw unix-socket round trip (64 B ping-pong between two processes).
 * and prints full/direct ratios plus the "hop floor": the direct operation
 * plus one raw round trip per extra hop (edge, node-api, manager, bridge). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "client/tether.h"

#define EXTRA_HOPS 4 /* edge, node-api, sbx-manager, bridge */
#define CREATES 100
#define EXEC_ITERS 300
#define READ_ITERS 2000

static char scratch[PATH_MAX];
static pid_t cluster_pid = -1;

/* cluster_start: runs build/tether up in the background on scratch. */
static int cluster_start(int port_base)
{
	char state[PATH_MAX + 16], port[16];

	snprintf(state, sizeof(state), "%s/state", scratch);
	snprintf(port, sizeof(port), "%d", port_base);
	cluster_pid = fork();
	if (cluster_pid < 0)
		return -1;
	if (cluster_pid == 0) {
		int devnull = open("/dev/null", O_WRONLY);

		if (devnull >= 0) {
			dup2(devnull, STDOUT_FILENO);
			dup2(devnull, STDERR_FILENO);
		}
		setenv("HOME", scratch, 1);
		setenv("TETHER_LOG", "warn", 1);
		execl("build/tether", "tether", "up", "--workers", "2", "--state",
		      state, "--port", port, (char *)NULL);
		_exit(127);
	}
	return 0;
}

/* cluster_stop: SIGTERM to `tether up`, which stops its daemons. */
static void cluster_stop(void)
{
	if (cluster_pid <= 0)
		return;
	kill(cluster_pid, SIGTERM);
	waitpid(cluster_pid, NULL, 0);
	cluster_pid = -1;
}

/* cluster_client: waits (up to 30 s) for the CLI config written by
 * `tether up` and for two registered workers; returns a client. */
static struct tether *cluster_client(void)
{
	struct tether_config cfg = { 0 };
	struct tt_err err = { 0 };
	struct tether *t = NULL;

	setenv("HOME", scratch, 1);
	for (int i = 0; i < 300; i++) {
		usleep(100000);
		if (t == NULL && tether_config_load(&cfg, &err) == 0)
			t = tether_new(&cfg, &err);
		if (t == NULL)
			continue;
		json_t *w = tether_workers(t, &err);
		size_t n = json_array_size(json_object_get(w, "workers"));

		json_decref(w);
		if (n == 2)
			return t;
	}
	fprintf(stderr, "bench_path: cluster did not come up: %s\n", err.msg);
	tether_free(t);
	return NULL;
}

/* percentile: v sorted ascending; nearest-rank percentile p in [0,100]. */
static double percentile(const double *v, size_t n, double p)
{
	size_t k = (size_t)((p / 100.0) * (double)n + 0.999999);

	if (k == 0)
		k = 1;
	return v[k > n ? n - 1 : k - 1];
}

/* bench_creates: p50/p99 of CREATES creates; removes them afterwards. */
static int bench_creates(struct tether *t)
{
	static char ids[CREATES][64];
	double v[CREATES];
	struct tt_err err = { 0 };

	for (int i = 0; i < CREATES; i++) {
		double t0 = bench_now_us();
		json_t *s = tether_create(t, NULL, &err);

		v[i] = (bench_now_us() - t0) / 1000.0;
		if (s == NULL) {
			fprintf(stderr, "bench_path: create: %s\n", err.msg);
			return -1;
		}
		snprintf(ids[i], sizeof(ids[i]), "%s",
		         json_string_value(json_object_get(s, "id")));
		json_decref(s);
	}
	qsort(v, CREATES, sizeof(v[0]), bench_cmp_double);
	printf("create            p50 %7.2f ms  p99 %7.2f ms  (n=%d; goal p50 <= 10 ms: %s)\n",
	       percentile(v, CREATES, 50), percentile(v, CREATES, 99), CREATES,
	       percentile(v, CREATES, 50) <= 10.0 ? "met" : "NOT met");
	for (int i = 0; i < CREATES; i++)
		tether_rm(t, ids[i], &err);
	return 0;
}

/* full_exec: median µs of exec `true` through the full path. */
static double full_exec(struct tether *t, const char *id)
{
	static char *const argv[] = { "true", NULL };
	double v[EXEC_ITERS];
	struct tt_err err = { 0 };

	for (int i = -5; i < EXEC_ITERS; i++) {
		struct tether_exec_result r = { 0 };
		double t0 = bench_now_us();

		if (tether_exec(t, id, argv, &r, &err) < 0 || r.exit_code != 0) {
			fprintf(stderr, "bench_path: exec: %s\n", err.msg);
			tether_exec_result_free(&r);
			return -1;
		}
		if (i >= 0)
			v[i] = bench_now_us() - t0;
		tether_exec_result_free(&r);
	}
	return bench_median(v, EXEC_ITERS);
}

/* full_read: median µs of reading a 4 KiB file through the full path. */
static double full_read(struct tether *t, const char *id, const char *path)
{
	static double v[READ_ITERS];
	struct tt_err err = { 0 };
	int fd = open("/dev/null", O_WRONLY);

	if (fd < 0)
		return -1;
	for (int i = -5; i < READ_ITERS; i++) {
		uint64_t got = 0;
		double t0 = bench_now_us();

		if (tether_file_get(t, id, path, fd, &got, &err) < 0 || got != 4096) {
			fprintf(stderr, "bench_path: read: %s\n", err.msg);
			close(fd);
			return -1;
		}
		if (i >= 0)
			v[i] = bench_now_us() - t0;
	}
	close(fd);
	return bench_median(v, READ_ITERS);
}

/* put_4k: writes a 4 KiB file at path in the sandbox. */
static int put_4k(struct tether *t, const char *id, const char *path)
{
	char tmp[PATH_MAX + 16], buf[4096];
	struct tt_err err = { 0 };
	int fd, rc;

	snprintf(tmp, sizeof(tmp), "%s/4k", scratch);
	memset(buf, 'x', sizeof(buf));
	fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf) ||
	    lseek(fd, 0, SEEK_SET) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	rc = tether_file_put(t, id, path, fd, sizeof(buf), NULL, &err);
	if (rc < 0)
		fprintf(stderr, "bench_path: put: %s\n", err.msg);
	close(fd);
	return rc;
}

/* direct_baselines: exec `true` and a 4 KiB read straight to a guest
 * agent (same binary, its own socket), measured now, in this run. */
static int direct_baselines(double *exec_us, double *read_us)
{
	char root[PATH_MAX + 16], sock[PATH_MAX + 16], file[PATH_MAX + 32];
	char buf[4096];
	pid_t guest;
	int fd;

	snprintf(root, sizeof(root), "%s/direct", scratch);
	snprintf(sock, sizeof(sock), "%s/direct.sock", scratch);
	snprintf(file, sizeof(file), "%s/f4k", root);
	if (mkdir(root, 0700) < 0)
		return -1;
	memset(buf, 'x', sizeof(buf));
	fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	guest = bench_guest_start("build/tether-guest", root, sock);
	if (guest < 0)
		return -1;
	*exec_us = bench_guest_exec(sock, EXEC_ITERS);
	*read_us = bench_guest_fs_read(sock, "/f4k", READ_ITERS);
	bench_guest_stop(guest);
	return *exec_us < 0 || *read_us < 0 ? -1 : 0;
}

int main(void)
{
	double rtt, d_exec, d_read, f_exec, f_read;
	struct tt_err err = { 0 };
	struct tether *t;
	json_t *s;
	char id[64];
	int rc = 1;

	snprintf(scratch, sizeof(scratch), "/tmp/tether-bench-path.XXXXXX");
	if (mkdtemp(scratch) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	if (cluster_start(27000 + (int)(getpid() % 500) * 20) < 0 ||
	    (t = cluster_client()) == NULL)
		goto out;
	if (bench_creates(t) < 0)
		goto out_client;
	s = tether_create(t, "w1", &err);
	if (s == NULL) {
		fprintf(stderr, "bench_path: create: %s\n", err.msg);
		goto out_client;
	}
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(s, "id")));
	json_decref(s);
	if (put_4k(t, id, "/tmp/f4k") < 0)
		goto out_client;
	f_exec = full_exec(t, id);
	f_read = full_read(t, id, "/tmp/f4k");
	rtt = bench_raw_rtt(20000);
	if (f_exec < 0 || f_read < 0 || rtt < 0 ||
	    direct_baselines(&d_exec, &d_read) < 0) {
		fprintf(stderr, "bench_path: a measurement failed\n");
		goto out_client;
	}
	printf("raw unix rtt      median %8.1f us\n", rtt);
	printf("exec true         full %8.1f us  direct %8.1f us  full/direct %.2f  "
	       "hop floor %8.1f us  full/floor %.2f  (goal full/direct <= 1.5)\n",
	       f_exec, d_exec, f_exec / d_exec, d_exec + EXTRA_HOPS * rtt,
	       f_exec / (d_exec + EXTRA_HOPS * rtt));
	printf("read 4 KiB        full %8.1f us  direct %8.1f us  full/direct %.2f  "
	       "hop floor %8.1f us  full/floor %.2f  (goal full/floor <= 1.5)\n",
	       f_read, d_read, f_read / d_read, d_read + EXTRA_HOPS * rtt,
	       f_read / (d_read + EXTRA_HOPS * rtt));
	tether_rm(t, id, &err);
	rc = 0;
out_client:
	tether_free(t);
out:
	cluster_stop();
	if (fork() == 0) {
		execlp("rm", "rm", "-rf", scratch, (char *)NULL);
		_exit(127);
	}
	wait(NULL);
	return rc;
}

/* bench_path: the request path end to end, on a real local cluster.
 *
 * Starts `tether up --workers 2` on a scratch state directory, then measures
 * in one run:
 *   - create latency (p50, p99 of 100 creates through the edge);
 *   - exec `true` and a 4 KiB file read through the full path
 *     (libtether -> edge -> node-api -> sbx-manager -> bridge -> guest);
 *   - the same two operations sent straight to a guest agent's socket, two
 *     ways: on a new connection each (connect + handshake + the guest's
 *     fork of a handler + the operation: what a one-shot client pays) and
 *     warm (operations in sequence on one handshaken connection: the cost
 *     of the operation itself, as the path's pooled connections see it);
 *   - a raw unix-socket round trip (64 B ping-pong between two processes).
 * and prints full/direct ratios against both, plus the "hop floor": the
 * warm direct operation plus one raw round trip per extra hop (edge,
 * node-api, manager, bridge). */
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

static struct bench_cluster cluster = { .name = "bench_path" };

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
	       bench_percentile(v, CREATES, 50), bench_percentile(v, CREATES, 99), CREATES,
	       bench_percentile(v, CREATES, 50) <= 10.0 ? "met" : "NOT met");
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

	snprintf(tmp, sizeof(tmp), "%s/4k", cluster.scratch);
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

/* Direct baselines, one operation straight to a guest agent. */
struct direct {
	double exec_new, read_new;   /* a new connection per operation */
	double exec_warm, read_warm; /* in sequence on one connection */
};

/* direct_baselines: exec `true` and a 4 KiB read straight to a guest
 * agent (same binary, its own socket), measured now, in this run. */
static int direct_baselines(struct direct *d)
{
	char root[PATH_MAX + 16], sock[PATH_MAX + 16], file[PATH_MAX + 32];
	char buf[4096];
	pid_t guest;
	int fd;

	snprintf(root, sizeof(root), "%s/direct", cluster.scratch);
	snprintf(sock, sizeof(sock), "%s/direct.sock", cluster.scratch);
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
	d->exec_new = bench_guest_exec(sock, EXEC_ITERS);
	d->read_new = bench_guest_fs_read(sock, "/f4k", READ_ITERS);
	d->exec_warm = bench_guest_exec_warm(sock, EXEC_ITERS);
	d->read_warm = bench_guest_fs_read_warm(sock, "/f4k", READ_ITERS);
	bench_guest_stop(guest);
	return d->exec_new < 0 || d->read_new < 0 || d->exec_warm < 0 ||
	       d->read_warm < 0 ? -1 : 0;
}

/* report: one operation's full path against both direct baselines and
 * the hop floor; goal is the ratio asked of full / warm direct floor. */
static void report(const char *name, double full, double direct_new,
                   double direct_warm, double rtt, const char *goal_name,
                   double goal_base)
{
	double floor = direct_warm + EXTRA_HOPS * rtt;

	printf("%-17s full %8.1f us | direct new conn %8.1f us  full/direct %.2f"
	       " | direct warm %8.1f us  full/direct %.2f | hop floor %8.1f us"
	       "  full/floor %.2f\n", name, full, direct_new, full / direct_new,
	       direct_warm, full / direct_warm, floor, full / floor);
	printf("%-17s goal full/%s <= 1.5: %.2f, %s\n", "", goal_name,
	       full / goal_base, full / goal_base <= 1.5 ? "met" : "NOT met");
}

int main(void)
{
	double rtt, f_exec, f_read;
	struct bench_cpu cpu0, cpu1, cpu2;
	struct direct d;
	struct tether_config cfg = { 0 };
	struct tt_err err = { 0 };
	struct tether *t;
	json_t *s;
	char id[64];
	int rc = 1;

	if (bench_cluster_scratch(&cluster, "/tmp/tether-bench-path.XXXXXX") < 0)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	cluster.port_base = 27000 + (int)(getpid() % 500) * 20;
	t = bench_cluster_start(&cluster) < 0 ? NULL :
	    bench_cluster_client(&cluster, &cfg);
	sodium_memzero(&cfg, sizeof(cfg));
	if (t == NULL)
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
	bench_cpu_take(cluster.pid, &cpu0);
	f_exec = full_exec(t, id);
	bench_cpu_take(cluster.pid, &cpu1);
	f_read = full_read(t, id, "/tmp/f4k");
	bench_cpu_take(cluster.pid, &cpu2);
	rtt = bench_raw_rtt(20000);
	if (f_exec < 0 || f_read < 0 || rtt < 0 ||
	    direct_baselines(&d) < 0) {
		fprintf(stderr, "bench_path: a measurement failed\n");
		goto out_client;
	}
	printf("raw unix rtt      median %8.1f us\n", rtt);
	/* exec: fork/exec dominates, so the goal is against the direct
	 * operation; a small read: against the hop floor. */
	report("exec true", f_exec, d.exec_new, d.exec_warm, rtt, "direct warm",
	       d.exec_warm);
	report("read 4 KiB", f_read, d.read_new, d.read_warm, rtt, "hop floor",
	       d.read_warm + EXTRA_HOPS * rtt);
	/* The loops ran EXEC_ITERS / READ_ITERS measured operations plus 5
	 * warm-up ones each. */
	bench_cpu_print("exec true", &cpu0, &cpu1, EXEC_ITERS + 5);
	bench_cpu_print("read 4 KiB", &cpu1, &cpu2, READ_ITERS + 5);
	tether_rm(t, id, &err);
	rc = 0;
out_client:
	tether_free(t);
out:
	bench_cluster_stop(&cluster);
	return rc;
}

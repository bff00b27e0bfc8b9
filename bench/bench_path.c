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
 * node-api, manager, bridge). A loopback TCP round trip is printed too:
 * two of those hops (client -> edge -> node-api) are HTTP over TCP.
 * Every figure is the median of ROUNDS round medians, the rounds taking
 * turns (full path, direct, round trip), so a change in the machine's
 * load during the run moves numerator and denominator alike. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
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
#define ROUNDS 5
#define EXEC_ITERS 100 /* per round */
#define READ_ITERS 400 /* per round */
#define RTT_ITERS 4000 /* per round */

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

/* One round's figures (medians, µs). */
struct round {
	double exec_full, read_full;
	double exec_new, read_new;   /* straight to a guest, a new connection per op */
	double exec_warm, read_warm; /* in sequence on one connection */
	double rtt, rtt_tcp;         /* raw round trips: unix, loopback TCP */
	double rtt_same, rtt_cross;  /* unix, both on CPU 0 / on CPUs 0 and 1 */
};

/* direct_setup: a guest agent of the same binary on its own socket, with a
 * 4 KiB /f4k, for the direct baselines; its pid or -1. */
static pid_t direct_setup(char *sock, size_t cap)
{
	char root[PATH_MAX + 16], file[PATH_MAX + 32];
	char buf[4096];
	int fd;

	snprintf(root, sizeof(root), "%s/direct", cluster.scratch);
	snprintf(sock, cap, "%s/direct.sock", cluster.scratch);
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
	return bench_guest_start("build/tether-guest", root, sock);
}

/* round_run: one round of every measurement, in turn; CPU of the full
 * path's operations is added to cpu_exec / cpu_read. */
static int round_run(struct tether *t, const char *id, const char *sock,
                     struct round *r, struct bench_cpu *cpu_exec,
                     struct bench_cpu *cpu_read)
{
	struct bench_cpu c0, c1, c2;

	bench_cpu_take(cluster.pid, &c0);
	r->exec_full = full_exec(t, id);
	bench_cpu_take(cluster.pid, &c1);
	r->read_full = full_read(t, id, "/tmp/f4k");
	bench_cpu_take(cluster.pid, &c2);
	bench_cpu_add(cpu_exec, &c0, &c1);
	bench_cpu_add(cpu_read, &c1, &c2);
	r->exec_new = bench_guest_exec(sock, EXEC_ITERS);
	r->exec_warm = bench_guest_exec_warm(sock, EXEC_ITERS);
	r->read_new = bench_guest_fs_read(sock, "/f4k", READ_ITERS);
	r->read_warm = bench_guest_fs_read_warm(sock, "/f4k", READ_ITERS);
	r->rtt = bench_raw_rtt(RTT_ITERS, 0);
	r->rtt_tcp = bench_raw_rtt(RTT_ITERS, 1);
	r->rtt_same = bench_raw_rtt_on(RTT_ITERS / 4, 0, 0, 0);
	r->rtt_cross = sysconf(_SC_NPROCESSORS_ONLN) > 1 ?
	               bench_raw_rtt_on(RTT_ITERS / 4, 0, 0, 1) : r->rtt_same;
	return r->exec_full < 0 || r->read_full < 0 || r->exec_new < 0 ||
	       r->exec_warm < 0 || r->read_new < 0 || r->read_warm < 0 ||
	       r->rtt < 0 || r->rtt_tcp < 0 ? -1 : 0;
}

/* round_median: the median over the rounds of one field. */
static double round_median(const struct round *rs, size_t field_off)
{
	double v[ROUNDS];

	for (int i = 0; i < ROUNDS; i++)
		v[i] = *(const double *)((const char *)&rs[i] + field_off);
	return bench_median(v, ROUNDS);
}

#define RMED(rs, f) round_median((rs), offsetof(struct round, f))

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
	static struct round rs[ROUNDS];
	struct bench_cpu cpu_exec = { 0 }, cpu_read = { 0 };
	struct tether_config cfg = { 0 };
	struct tt_err err = { 0 };
	char id[64], sock[PATH_MAX + 16];
	double rtt, rtt_tcp;
	pid_t guest = -1;
	struct tether *t;
	json_t *s;
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
	if (put_4k(t, id, "/tmp/f4k") < 0 || (guest = direct_setup(sock, sizeof(sock))) < 0)
		goto out_client;
	for (int i = 0; i < ROUNDS; i++)
		if (round_run(t, id, sock, &rs[i], &cpu_exec, &cpu_read) < 0) {
			fprintf(stderr, "bench_path: a measurement failed\n");
			goto out_client;
		}
	rtt = RMED(rs, rtt);
	rtt_tcp = RMED(rs, rtt_tcp);
	printf("raw unix rtt      median %8.1f us   (medians of %d rounds; loopback tcp %.1f us;"
	       " unix pinned: same cpu %.1f us, two cpus %.1f us)\n",
	       rtt, ROUNDS, rtt_tcp, RMED(rs, rtt_same), RMED(rs, rtt_cross));
	/* exec: fork/exec dominates, so the goal is against the direct
	 * operation; a small read: against the hop floor. */
	report("exec true", RMED(rs, exec_full), RMED(rs, exec_new), RMED(rs, exec_warm),
	       rtt, "direct warm", RMED(rs, exec_warm));
	report("read 4 KiB", RMED(rs, read_full), RMED(rs, read_new), RMED(rs, read_warm),
	       rtt, "hop floor", RMED(rs, read_warm) + EXTRA_HOPS * rtt);
	/* Each round ran EXEC_ITERS / READ_ITERS measured operations plus 5
	 * warm-up ones each. */
	bench_cpu_print("exec true", &(struct bench_cpu){ 0 }, &cpu_exec,
	                ROUNDS * (EXEC_ITERS + 5));
	bench_cpu_print("read 4 KiB", &(struct bench_cpu){ 0 }, &cpu_read,
	                ROUNDS * (READ_ITERS + 5));
	tether_rm(t, id, &err);
	rc = 0;
out_client:
	if (guest > 0)
		bench_guest_stop(guest);
	tether_free(t);
out:
	bench_cluster_stop(&cluster);
	return rc;
}

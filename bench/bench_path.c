/* bench_path: the request path end to end, on a real local cluster.
 *
 * Starts `tether up --workers 2` on a scratch state directory, then measures
 * in one run:
 *   - create latency (p50, p99 of 100 creates through the edge), and of
 *     bursts: BURST creates at once, each from its own thread and client
 *     (what parallel agents do), placed by the cp over both workers;
 *   - exec `true` and a 4 KiB file read through the full path
 *     (libtether -> edge -> node-api -> sbx-manager -> bridge -> guest);
 *   - the same two operations sent straight to a guest agent's socket, two
 *     ways: on a new connection each (connect + handshake + the guest's
 *     fork of a handler + the operation: what a one-shot client pays) and
 *     warm (operations in sequence on one handshaken connection: the cost
 *     of the operation itself, as the path's pooled connections see it).
 *     That guest runs in a sandbox of the cluster's substrate, made by the
 *     same code (ns_sandbox_launch: namespaces, seccomp, cgroups, its own
 *     layer filesystem holding the same /tmp/f4k), so the ratios measure
 *     the path alone; a bare guest's warm exec is printed beside it, for
 *     what the sandbox itself costs;
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
#include <pthread.h>
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
#include "substrate/ns/ns.h"

#define EXTRA_HOPS 4 /* edge, node-api, sbx-manager, bridge */
#define CREATES 100
#define BURST 8         /* creates at once */
#define BURST_ROUNDS 3
#define ROUNDS 5
#define EXEC_ITERS 100 /* per round */
#define READ_ITERS 400 /* per round */
#define RTT_ITERS 4000 /* per round */
/* Host uids of the direct sandbox: far above the managers' ranges. */
#define DIRECT_UID_BASE 4000000000u

static struct bench_cluster cluster = { .name = "bench_path" };

/* One create of a burst: its own client, its latency and id. */
struct burst_one {
	struct tether *t;
	double ms;
	char id[64];
};

/* burst_create: the thread body; ms < 0 on failure (reported). */
static void *burst_create(void *arg)
{
	struct burst_one *b = arg;
	struct tt_err err = { 0 };
	double t0 = bench_now_us();
	json_t *s = tether_create(b->t, NULL, &err);

	b->ms = s != NULL ? (bench_now_us() - t0) / 1000.0 : -1;
	if (s == NULL)
		fprintf(stderr, "bench_path: burst create: %s\n", err.msg);
	else
		snprintf(b->id, sizeof(b->id), "%s", json_string_value(json_object_get(s, "id")));
	json_decref(s);
	return NULL;
}

/* bench_burst: BURST_ROUNDS bursts of BURST concurrent creates, each
 * burst after the spares had time to refill; the median and the slowest
 * create over all of them. */
static int bench_burst(struct tether *t, const struct tether_config *cfg)
{
	static struct burst_one b[BURST];
	double all[BURST * BURST_ROUNDS];
	pthread_t th[BURST];
	struct tt_err err = { 0 };
	int n = 0, rc = 0;

	for (int i = 0; i < BURST && rc == 0; i++)
		if ((b[i].t = tether_new(cfg, &err)) == NULL)
			rc = -1;
	for (int r = 0; r < BURST_ROUNDS && rc == 0; r++) {
		sleep(1); /* the spares refill */
		for (int i = 0; i < BURST; i++)
			pthread_create(&th[i], NULL, burst_create, &b[i]);
		for (int i = 0; i < BURST; i++) {
			pthread_join(th[i], NULL);
			if (b[i].ms < 0)
				rc = -1;
			else
				all[n++] = b[i].ms;
		}
		for (int i = 0; i < BURST; i++)
			if (b[i].id[0] != '\0' && tether_rm(t, b[i].id, &err) == 0)
				b[i].id[0] = '\0';
	}
	for (int i = 0; i < BURST; i++)
		tether_free(b[i].t);
	if (rc < 0)
		return -1;
	qsort(all, (size_t)n, sizeof(all[0]), bench_cmp_double);
	printf("create burst      p50 %7.2f ms  max %7.2f ms  (%d at once from %d clients, %d rounds)\n",
	       bench_percentile(all, (size_t)n, 50), all[n - 1], BURST, BURST, BURST_ROUNDS);
	return 0;
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
	double exec_bare;            /* warm, to a guest in no sandbox */
	double rtt, rtt_tcp;         /* raw round trips: unix, loopback TCP */
	double rtt_same, rtt_cross;  /* unix, both on CPU 0 / on CPUs 0 and 1 */
};

/* The direct baselines' guests: one in a sandbox like the cluster's (the
 * baseline), one bare (only to show what the sandbox costs). Both hold
 * bench_secret. */
struct direct {
	struct ns_sandbox sb;
	bool launched;
	char dir[PATH_MAX + 16];
	char sock[PATH_MAX + 48];
	pid_t bare;
	char bare_sock[PATH_MAX + 16];
};

/* direct_setup: the bare guest first (it draws bench_secret), then the
 * sandboxed one with the same secret and a 4 KiB /tmp/f4k in its layer,
 * owned by its root. 0 or -1. */
static int direct_setup(struct direct *d)
{
	struct ns_config cfg = { 0 };
	struct tt_err err = { 0 };
	char bin[PATH_MAX], root[PATH_MAX + 16], file[PATH_MAX + 48], buf[4096];
	int fd;

	ns_sandbox_init(&d->sb);
	snprintf(d->dir, sizeof(d->dir), "%s/direct", cluster.scratch);
	snprintf(root, sizeof(root), "%s/bare", cluster.scratch);
	snprintf(d->bare_sock, sizeof(d->bare_sock), "%s/bare.sock", cluster.scratch);
	if (realpath("build/tether-guest", bin) == NULL || mkdir(root, 0700) < 0 ||
	    mkdir(d->dir, 0700) < 0)
		return -1;
	d->bare = bench_guest_start(bin, root, d->bare_sock);
	if (d->bare < 0)
		return -1;
	cfg.sbx_id = BENCH_SBX;
	cfg.gen = 1;
	cfg.att = 1;
	cfg.sandbox_dir = d->dir;
	cfg.guest_bin = bin;
	cfg.uid_base = DIRECT_UID_BASE;
	cfg.uid_count = 65536;
	cfg.layer_bytes = 64u << 20;
	cfg.secret = bench_secret;
	cfg.log_fd = -1;
	if (ns_sandbox_launch(&cfg, &d->sb, &err) < 0 ||
	    (d->launched = true, ns_sandbox_wait_ready(&d->sb, &err)) < 0) {
		fprintf(stderr, "bench_path: direct sandbox: %s\n", err.msg);
		return -1;
	}
	snprintf(d->sock, sizeof(d->sock), "%s/run/guest.sock", d->dir);
	snprintf(file, sizeof(file), "%s/layer/tmp/f4k", d->dir);
	memset(buf, 'x', sizeof(buf));
	fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf) ||
	    fchown(fd, DIRECT_UID_BASE, DIRECT_UID_BASE) < 0) {
		perror("bench_path: direct /tmp/f4k");
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}

/* direct_teardown: both guests stopped, the sandbox's layer removed. */
static void direct_teardown(struct direct *d)
{
	struct tt_err err = { 0 };

	if (d->launched && ns_sandbox_stop(&d->sb, &err) < 0)
		fprintf(stderr, "bench_path: stopping the direct sandbox: %s\n", err.msg);
	if (d->dir[0] && ns_layer_remove(d->dir, &err) < 0)
		fprintf(stderr, "bench_path: the direct sandbox's layer: %s\n", err.msg);
	if (d->bare > 0)
		bench_guest_stop(d->bare);
}

/* round_run: one round of every measurement, in turn; CPU of the full
 * path's operations is added to cpu_exec / cpu_read. */
static int round_run(struct tether *t, const char *id, const struct direct *d,
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
	r->exec_new = bench_guest_exec(d->sock, EXEC_ITERS);
	r->exec_warm = bench_guest_exec_warm(d->sock, EXEC_ITERS);
	r->exec_bare = bench_guest_exec_warm(d->bare_sock, EXEC_ITERS);
	r->read_new = bench_guest_fs_read(d->sock, "/tmp/f4k", READ_ITERS);
	r->read_warm = bench_guest_fs_read_warm(d->sock, "/tmp/f4k", READ_ITERS);
	r->rtt = bench_raw_rtt(RTT_ITERS, 0);
	r->rtt_tcp = bench_raw_rtt(RTT_ITERS, 1);
	r->rtt_same = bench_raw_rtt_on(RTT_ITERS / 4, 0, 0, 0);
	r->rtt_cross = sysconf(_SC_NPROCESSORS_ONLN) > 1 ?
	               bench_raw_rtt_on(RTT_ITERS / 4, 0, 0, 1) : r->rtt_same;
	return r->exec_full < 0 || r->read_full < 0 || r->exec_new < 0 ||
	       r->exec_warm < 0 || r->exec_bare < 0 || r->read_new < 0 || r->read_warm < 0 ||
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
 * the hop floor; goal is the ratio asked of full / warm direct floor. The
 * transit bound is what the path would cost if no process did any work:
 * the direct operation plus its extra hops' round trips as they are, two
 * of them HTTP over TCP (client -> edge -> node-api) and two unix
 * sockets; the hop floor counts all four as unix round trips. */
static void report(const char *name, double full, double direct_new,
                   double direct_warm, double rtt, double rtt_tcp,
                   const char *goal_name, double goal_base)
{
	double floor = direct_warm + EXTRA_HOPS * rtt;
	double transit = direct_warm + 2 * rtt_tcp + (EXTRA_HOPS - 2) * rtt;

	printf("%-17s full %8.1f us | direct new conn %8.1f us  full/direct %.2f"
	       " | direct warm %8.1f us  full/direct %.2f | hop floor %8.1f us"
	       "  full/floor %.2f\n", name, full, direct_new, full / direct_new,
	       direct_warm, full / direct_warm, floor, full / floor);
	printf("%-17s goal full/%s <= 1.5: %.2f, %s\n", "", goal_name,
	       full / goal_base, full / goal_base <= 1.5 ? "met" : "NOT met");
	printf("%-17s transit bound (no processing; 2 tcp + 2 unix round trips) %8.1f us:"
	       " %.2f x %s, the rest %.1f us is the hops' work\n", "", transit,
	       transit / goal_base, goal_name, full - transit);
}

int main(void)
{
	static struct round rs[ROUNDS];
	struct bench_cpu cpu_exec = { 0 }, cpu_read = { 0 };
	struct tether_config cfg = { 0 };
	struct tt_err err = { 0 };
	static struct direct direct = { .bare = -1 };
	char id[64];
	double rtt, rtt_tcp;
	struct tether *t;
	json_t *s;
	int rc = 1;

	if (bench_cluster_scratch(&cluster, "/tmp/tether-bench-path.XXXXXX") < 0)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	cluster.port_base = 27000 + (int)(getpid() % 500) * 20;
	t = bench_cluster_start(&cluster) < 0 ? NULL :
	    bench_cluster_client(&cluster, &cfg);
	if (t == NULL || bench_creates(t) < 0 || bench_burst(t, &cfg) < 0) {
		sodium_memzero(&cfg, sizeof(cfg));
		goto out_client;
	}
	sodium_memzero(&cfg, sizeof(cfg));
	s = tether_create(t, "w1", &err);
	if (s == NULL) {
		fprintf(stderr, "bench_path: create: %s\n", err.msg);
		goto out_client;
	}
	snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(s, "id")));
	json_decref(s);
	if (put_4k(t, id, "/tmp/f4k") < 0 || direct_setup(&direct) < 0)
		goto out_client;
	for (int i = 0; i < ROUNDS; i++)
		if (round_run(t, id, &direct, &rs[i], &cpu_exec, &cpu_read) < 0) {
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
	       rtt, rtt_tcp, "direct warm", RMED(rs, exec_warm));
	report("read 4 KiB", RMED(rs, read_full), RMED(rs, read_new), RMED(rs, read_warm),
	       rtt, rtt_tcp, "hop floor", RMED(rs, read_warm) + EXTRA_HOPS * rtt);
	printf("%-17s exec true warm: in the sandbox %.1f us, a bare guest %.1f us (x%.2f)\n",
	       "sandbox cost", RMED(rs, exec_warm), RMED(rs, exec_bare),
	       RMED(rs, exec_warm) / RMED(rs, exec_bare));
	/* Each round ran EXEC_ITERS / READ_ITERS measured operations plus 5
	 * warm-up ones each. */
	bench_cpu_print("exec true", &(struct bench_cpu){ 0 }, &cpu_exec,
	                ROUNDS * (EXEC_ITERS + 5));
	bench_cpu_print("read 4 KiB", &(struct bench_cpu){ 0 }, &cpu_read,
	                ROUNDS * (READ_ITERS + 5));
	tether_rm(t, id, &err);
	rc = 0;
out_client:
	direct_teardown(&direct);
	tether_free(t);
	bench_cluster_stop(&cluster);
	return rc;
}

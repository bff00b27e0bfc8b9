/* bench_lifecycle: moving a sandbox between workers, on a real local cluster.
 *
 * Starts `tether up --workers 2` on a scratch state directory and its own
 * port base, then measures in one run:
 *   1. resume on the other worker for a 10 MiB writable layer: a sandbox
 *      gets a 10 MiB random file through tether_file_put, then MOVES cycles
 *      of pause (timed on its own) and resume on the other worker, timed as
 *      the resume call alone and as resume + the first exec that succeeds.
 *      Every cycle checks the new generation and worker, and that the file
 *      is still there (size); its SHA-256 is compared at the end.
 *   2. route repair: the edge holds a cached route for (caller, sandbox);
 *      the sandbox is paused and resumed elsewhere directly against the
 *      control plane, so the edge's cache is left stale; the next exec
 *      through the edge gets RefreshRoute from the old worker, is repaired
 *      and succeeds. Timed: that stale exec, warm execs on a cached route,
 *      and one capability mint against the control plane. Each move checks
 *      (edge metrics) that exactly one RefreshRoute repair happened and that
 *      the answer came from the new generation.
 * Figures: p50/p99 (nearest rank; with n = 20 or 30, p99 is the maximum). */
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

#include <curl/curl.h>
#include <sodium.h>

#include "bench_util.h"
#include "client/tether.h"

#define LAYER_BYTES (10u << 20)
#define MOVES 30         /* part 1: pause + resume cycles */
#define REPAIR_MOVES 20  /* part 2: moves behind the edge's back */
#define WARM_PER_MOVE 5  /* warm execs before each part-2 move */
#define RESUME_GOAL_MS 100.0
#define REPAIR_GOAL_MS 2.0 /* plus one mint */
#define METRICS_MAX (1u << 20)

static struct bench_cluster cluster = { .name = "bench_lifecycle" };
static char *const argv_true[] = { "true", NULL };

/* cp_config: the control plane's URL and the admin API key (the key stays
 * in cfg, wiped by the caller). */
static int cp_config(struct tether_config *cfg)
{
	char path[PATH_MAX + 32];
	ssize_t n;
	int fd;

	snprintf(cfg->url, sizeof(cfg->url), "http://127.0.0.1:%d", cluster.port_base);
	snprintf(path, sizeof(path), "%s/state/cp/admin.key", cluster.scratch);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "bench_lifecycle: %s: %s\n", path, strerror(errno));
		return -1;
	}
	n = read(fd, cfg->api_key, sizeof(cfg->api_key) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	cfg->api_key[n] = '\0';
	cfg->api_key[strcspn(cfg->api_key, "\r\n \t")] = '\0';
	return cfg->api_key[0] ? 0 : -1;
}

/* sort: v ascending, in place. */
static void sort(double *v, size_t n)
{
	qsort(v, n, sizeof(v[0]), bench_cmp_double);
}

/* other_worker: the worker a sandbox on w moves to. */
static const char *other_worker(const char *w)
{
	return strcmp(w, "w1") == 0 ? "w2" : "w1";
}

/* sbx_check: the lifecycle answer s (may be NULL) says state, worker and
 * generation as expected; prints why not. 0 or -1. */
static int sbx_check(json_t *s, const char *what, const char *state,
                     const char *worker, json_int_t gen, const struct tt_err *err)
{
	const char *st = json_string_value(json_object_get(s, "state"));
	const char *w = json_string_value(json_object_get(s, "worker"));
	json_int_t g = json_integer_value(json_object_get(s, "generation"));

	if (s == NULL) {
		fprintf(stderr, "bench_lifecycle: %s: %s\n", what, err->msg);
		return -1;
	}
	if (st == NULL || strcmp(st, state) != 0 || w == NULL ||
	    (worker && strcmp(w, worker) != 0) || g != gen) {
		fprintf(stderr, "bench_lifecycle: %s: got %s on %s generation %lld, "
		        "want %s on %s generation %lld\n", what, st ? st : "?",
		        w ? w : "?", (long long)g, state, worker ? worker : "any",
		        (long long)gen);
		return -1;
	}
	return 0;
}

/* exec_ok: runs argv through t; 0 if it exited 0 from generation gen
 * (gen 0: any), with stdout copied into out (may be NULL). */
static int exec_ok(struct tether *t, const char *id, char *const argv[],
                   uint64_t gen, char *out, size_t cap)
{
	struct tether_exec_result r = { 0 };
	struct tt_err err = { 0 };
	int rc = -1;

	if (tether_exec(t, id, argv, &r, &err) < 0)
		fprintf(stderr, "bench_lifecycle: exec %s: %s\n", argv[0], err.msg);
	else if (r.exit_code != 0)
		fprintf(stderr, "bench_lifecycle: exec %s exited %d: %.200s\n",
		        argv[0], r.exit_code, r.errout);
	else if (gen != 0 && r.generation != gen)
		fprintf(stderr, "bench_lifecycle: exec %s served by generation %llu, "
		        "want %llu\n", argv[0], (unsigned long long)r.generation,
		        (unsigned long long)gen);
	else {
		if (out != NULL)
			snprintf(out, cap, "%.*s", (int)r.out_len, r.out);
		rc = 0;
	}
	tether_exec_result_free(&r);
	return rc;
}

/* create_on: a new sandbox on worker; its id into id. */
static int create_on(struct tether *t, const char *worker, char *id, size_t cap)
{
	struct tt_err err = { 0 };
	json_t *s = tether_create(t, worker, &err);

	if (s == NULL) {
		fprintf(stderr, "bench_lifecycle: create: %s\n", err.msg);
		return -1;
	}
	snprintf(id, cap, "%s", json_string_value(json_object_get(s, "id")));
	json_decref(s);
	return 0;
}

/* put_layer: writes LAYER_BYTES of random data to path in the sandbox;
 * their SHA-256 (hex) into hex. */
static int put_layer(struct tether *t, const char *id, const char *path,
                     char hex[crypto_hash_sha256_BYTES * 2 + 1])
{
	unsigned char *buf = malloc(LAYER_BYTES), sum[crypto_hash_sha256_BYTES];
	char tmp[PATH_MAX + 16];
	struct tt_err err = { 0 };
	uint64_t written = 0;
	int fd = -1, rc = -1;

	if (buf == NULL)
		return -1;
	randombytes_buf(buf, LAYER_BYTES);
	crypto_hash_sha256(sum, buf, LAYER_BYTES);
	sodium_bin2hex(hex, crypto_hash_sha256_BYTES * 2 + 1, sum, sizeof(sum));
	snprintf(tmp, sizeof(tmp), "%s/layer", cluster.scratch);
	fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || bench_io_full(fd, buf, LAYER_BYTES, 1) < 0 ||
	    lseek(fd, 0, SEEK_SET) != 0) {
		fprintf(stderr, "bench_lifecycle: %s: %s\n", tmp, strerror(errno));
		goto out;
	}
	if (tether_file_put(t, id, path, fd, LAYER_BYTES, &written, &err) < 0)
		fprintf(stderr, "bench_lifecycle: put %s: %s\n", path, err.msg);
	else if (written != LAYER_BYTES)
		fprintf(stderr, "bench_lifecycle: put %s stored %llu bytes\n", path,
		        (unsigned long long)written);
	else
		rc = 0;
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

/* Part 1 figures, milliseconds (sorted after the run). */
struct resume_figs {
	double pause[MOVES];
	double resume[MOVES];
	double resume_exec[MOVES];
	double first_exec[MOVES]; /* resume_exec - resume: cache dropped, one mint */
};

/* bench_resume: part 1 on a fresh sandbox with a 10 MiB file. */
static int bench_resume(struct tether *t, struct resume_figs *f)
{
	static char *const argv_size[] = { "stat", "-c", "%s", "/home/big", NULL };
	static char *const argv_sum[] = { "sha256sum", "/home/big", NULL };
	char id[64], hex[crypto_hash_sha256_BYTES * 2 + 1], out[256];
	char worker[8] = "w1";
	struct tt_err err = { 0 };
	json_int_t gen = 1;
	int rc = -1;

	if (create_on(t, worker, id, sizeof(id)) < 0)
		return -1;
	if (put_layer(t, id, "/home/big", hex) < 0 ||
	    exec_ok(t, id, argv_true, 1, NULL, 0) < 0)
		goto out;
	for (int i = 0; i < MOVES; i++) {
		const char *to = other_worker(worker);
		double t0 = bench_now_us(), t1, t2;
		json_t *s = tether_pause(t, id, 1, &err);

		f->pause[i] = (bench_now_us() - t0) / 1000.0;
		if (sbx_check(s, "pause", "paused", worker, gen, &err) < 0) {
			json_decref(s);
			goto out;
		}
		json_decref(s);
		t1 = bench_now_us();
		s = tether_resume(t, id, to, 0, &err);
		t2 = bench_now_us();
		if (sbx_check(s, "resume", "running", to, gen + 1, &err) < 0) {
			json_decref(s);
			goto out;
		}
		json_decref(s);
		gen++;
		if (exec_ok(t, id, argv_true, (uint64_t)gen, NULL, 0) < 0)
			goto out;
		f->resume[i] = (t2 - t1) / 1000.0;
		f->resume_exec[i] = (bench_now_us() - t1) / 1000.0;
		f->first_exec[i] = f->resume_exec[i] - f->resume[i];
		snprintf(worker, sizeof(worker), "%s", to);
		/* not timed: the layer came along */
		if (exec_ok(t, id, argv_size, (uint64_t)gen, out, sizeof(out)) < 0)
			goto out;
		if (strtoull(out, NULL, 10) != LAYER_BYTES) {
			fprintf(stderr, "bench_lifecycle: after move %d /home/big has "
			        "%s bytes\n", i + 1, out);
			goto out;
		}
	}
	if (exec_ok(t, id, argv_sum, (uint64_t)gen, out, sizeof(out)) < 0)
		goto out;
	if (strncmp(out, hex, strlen(hex)) != 0) {
		fprintf(stderr, "bench_lifecycle: /home/big changed after %d moves\n",
		        MOVES);
		goto out;
	}
	rc = 0;
out:
	tether_rm(t, id, &err);
	return rc;
}

/* A bounded in-memory body for metrics_get. */
struct mbuf {
	char *p; /* owned */
	size_t len;
};

/* mbuf_write: curl body sink, bounded to METRICS_MAX. */
static size_t mbuf_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct mbuf *b = arg;
	size_t n = size * nmemb;
	char *np;

	if (b->len + n > METRICS_MAX || (np = realloc(b->p, b->len + n + 1)) == NULL)
		return 0;
	b->p = np;
	memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = '\0';
	return n;
}

/* metric_sum: the sum over all label sets of metric name in the Prometheus
 * text body (0 if absent). */
static double metric_sum(const char *body, const char *name)
{
	size_t nl = strlen(name);
	double sum = 0;

	for (const char *l = body; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
		const char *v;

		if (strncmp(l, name, nl) != 0 || (l[nl] != ' ' && l[nl] != '{'))
			continue;
		v = l[nl] == '{' ? strchr(l + nl, '}') : l + nl;
		if (v != NULL)
			sum += strtod(v + (*v == '}'), NULL);
	}
	return sum;
}

/* edge_metrics: GET the edge's /metrics; the body (owned by the caller)
 * or NULL. */
static char *edge_metrics(void)
{
	struct mbuf b = { 0 };
	char url[64];
	CURL *e = curl_easy_init();
	CURLcode rc;
	long status = 0;

	if (e == NULL)
		return NULL;
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", cluster.port_base + 1);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, mbuf_write);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	rc = curl_easy_perform(e);
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(e);
	if (rc != CURLE_OK || status != 200 || b.p == NULL) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* edge_refreshes: the edge's RefreshRoute repair count, -1 on failure. */
static double edge_refreshes(void)
{
	char *m = edge_metrics();
	double v = m ? metric_sum(m, "tether_edge_refresh_total") : -1;

	free(m);
	return v;
}

/* Part 2 figures, milliseconds (sorted after the run). */
struct repair_figs {
	double warm[REPAIR_MOVES * WARM_PER_MOVE];
	double stale[REPAIR_MOVES];
	double mint[REPAIR_MOVES];
	double edge_repair_mean; /* the edge's own reject -> success, mean */
};

/* bench_repair: part 2 on a fresh sandbox: moves made directly against the
 * control plane (cp), requests through the edge (t). */
static int bench_repair(struct tether *t, struct tether *cp,
                        struct repair_figs *f)
{
	char id[64], worker[8] = "w1";
	struct tt_err err = { 0 };
	json_int_t gen = 1;
	json_t *req = json_pack("{s:s,s:[s]}", "purpose", "control", "ops", "exec");
	double sum0 = 0, cnt0 = 0;
	char *m;
	int rc = -1;

	if (req == NULL || create_on(t, worker, id, sizeof(id)) < 0) {
		json_decref(req);
		return -1;
	}
	if ((m = edge_metrics()) != NULL) {
		sum0 = metric_sum(m, "tether_edge_route_repair_duration_seconds_sum");
		cnt0 = metric_sum(m, "tether_edge_route_repair_duration_seconds_count");
		free(m);
	}
	for (int i = 0; i < REPAIR_MOVES; i++) {
		const char *to = other_worker(worker);
		double r0, r1, t0;
		json_t *s;

		/* warm: the edge holds a live route for (us, id) */
		for (int k = -1; k < WARM_PER_MOVE; k++) {
			t0 = bench_now_us();
			if (exec_ok(t, id, argv_true, (uint64_t)gen, NULL, 0) < 0)
				goto out;
			if (k >= 0)
				f->warm[i * WARM_PER_MOVE + k] = (bench_now_us() - t0) / 1000.0;
		}
		/* the move, behind the edge's back */
		s = tether_pause(cp, id, 1, &err);
		if (sbx_check(s, "pause (cp)", "paused", worker, gen, &err) < 0) {
			json_decref(s);
			goto out;
		}
		json_decref(s);
		s = tether_resume(cp, id, to, 0, &err);
		if (sbx_check(s, "resume (cp)", "running", to, gen + 1, &err) < 0) {
			json_decref(s);
			goto out;
		}
		json_decref(s);
		gen++;
		snprintf(worker, sizeof(worker), "%s", to);
		r0 = edge_refreshes();
		t0 = bench_now_us();
		if (exec_ok(t, id, argv_true, (uint64_t)gen, NULL, 0) < 0)
			goto out;
		f->stale[i] = (bench_now_us() - t0) / 1000.0;
		r1 = edge_refreshes();
		if (r0 < 0 || r1 != r0 + 1) {
			fprintf(stderr, "bench_lifecycle: move %d: the edge made %.0f "
			        "RefreshRoute repairs, want exactly 1\n", i + 1, r1 - r0);
			goto out;
		}
		/* one mint, as the edge makes it on a repair */
		t0 = bench_now_us();
		s = tether_cap_issue(cp, id, req, &err);
		f->mint[i] = (bench_now_us() - t0) / 1000.0;
		if (s == NULL || json_integer_value(json_object_get(s, "generation")) != gen) {
			fprintf(stderr, "bench_lifecycle: mint: %s\n",
			        s ? "wrong generation" : err.msg);
			json_decref(s);
			goto out;
		}
		json_decref(s);
	}
	if ((m = edge_metrics()) != NULL) {
		double n = metric_sum(m, "tether_edge_route_repair_duration_seconds_count") - cnt0;

		if (n > 0)
			f->edge_repair_mean = (metric_sum(m, "tether_edge_route_repair_duration_seconds_sum") -
			                       sum0) * 1000.0 / n;
		free(m);
	}
	rc = 0;
out:
	json_decref(req);
	tether_rm(t, id, &err);
	return rc;
}

/* print_row: one p50/p99 line of n sorted values (ms). */
static void print_row(const char *label, const double *v, size_t n)
{
	printf("%-32s p50 %8.2f ms  p99 %8.2f ms  (n=%zu)\n", label,
	       bench_percentile(v, n, 50), bench_percentile(v, n, 99), n);
}

/* report: prints both parts' figures (sorts them). */
static void report(struct resume_figs *a, struct repair_figs *b)
{
	double warm50, stale50, stale99, mint50, over50, goal;

	sort(a->pause, MOVES);
	sort(a->resume, MOVES);
	sort(a->resume_exec, MOVES);
	sort(a->first_exec, MOVES);
	printf("resume on the other worker, 10 MiB writable layer, %d moves w1<->w2:\n",
	       MOVES);
	print_row("  pause (snapshot, wait)", a->pause, MOVES);
	print_row("  resume call", a->resume, MOVES);
	print_row("  resume + first exec", a->resume_exec, MOVES);
	print_row("  first exec after resume", a->first_exec, MOVES);
	printf("  goal p50 <= %.0f ms: resume call %s, resume + first exec %s\n",
	       RESUME_GOAL_MS,
	       bench_percentile(a->resume, MOVES, 50) <= RESUME_GOAL_MS ? "met" : "NOT met",
	       bench_percentile(a->resume_exec, MOVES, 50) <= RESUME_GOAL_MS ? "met" : "NOT met");

	sort(b->warm, REPAIR_MOVES * WARM_PER_MOVE);
	sort(b->stale, REPAIR_MOVES);
	sort(b->mint, REPAIR_MOVES);
	warm50 = bench_percentile(b->warm, REPAIR_MOVES * WARM_PER_MOVE, 50);
	stale50 = bench_percentile(b->stale, REPAIR_MOVES, 50);
	stale99 = bench_percentile(b->stale, REPAIR_MOVES, 99);
	mint50 = bench_percentile(b->mint, REPAIR_MOVES, 50);
	over50 = stale50 - warm50;
	goal = REPAIR_GOAL_MS + mint50;
	printf("route repair, %d moves made at the cp behind the edge's cache "
	       "(1 RefreshRoute each, checked):\n", REPAIR_MOVES);
	print_row("  warm exec (cached route)", b->warm, REPAIR_MOVES * WARM_PER_MOVE);
	print_row("  stale exec -> success", b->stale, REPAIR_MOVES);
	print_row("  capability mint (cp)", b->mint, REPAIR_MOVES);
	if (b->edge_repair_mean > 0)
		printf("  edge's own reject -> success   mean %7.2f ms\n",
		       b->edge_repair_mean);
	printf("  repair overhead = stale - warm: p50 %.2f ms (p99 stale - p50 warm "
	       "%.2f ms); goal <= %.0f ms + one mint = %.2f ms: %s\n", over50,
	       stale99 - warm50, REPAIR_GOAL_MS, goal,
	       over50 <= goal ? "met" : "NOT met");
	/* a move through the edge drops its cache: no rejected attempt */
	printf("  of which the rejected attempt: p50 %.2f ms (stale exec - first exec "
	       "after an edge-proxied move)\n",
	       stale50 - bench_percentile(a->first_exec, MOVES, 50));
}

int main(void)
{
	static struct resume_figs a;
	static struct repair_figs b;
	struct tether_config cfg = { 0 }, cpcfg = { 0 };
	struct tt_err err = { 0 };
	struct tether *t = NULL, *cp = NULL;
	int rc = 1;

	if (bench_cluster_scratch(&cluster,
	                          "/tmp/tether-bench-lifecycle.XXXXXX") < 0)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	if (sodium_init() < 0 || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		goto out;
	/* its own range: 12000..16980, clear of bench_path and the
	 * integration tests */
	cluster.port_base = 12000 + (int)(getpid() % 250) * 20;
	if (bench_cluster_start(&cluster) < 0 ||
	    (t = bench_cluster_client(&cluster, &cfg)) == NULL)
		goto out;
	if (cp_config(&cpcfg) < 0 || (cp = tether_new(&cpcfg, &err)) == NULL) {
		fprintf(stderr, "bench_lifecycle: control-plane client: %s\n", err.msg);
		goto out;
	}
	if (bench_resume(t, &a) < 0 || bench_repair(t, cp, &b) < 0) {
		fprintf(stderr, "bench_lifecycle: a measurement failed\n");
		goto out;
	}
	report(&a, &b);
	rc = 0;
out:
	sodium_memzero(&cfg, sizeof(cfg));
	sodium_memzero(&cpcfg, sizeof(cpcfg));
	tether_free(cp);
	tether_free(t);
	bench_cluster_stop(&cluster);
	return rc;
}

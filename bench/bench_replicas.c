/* bench_replicas: control-plane throughput on its store, in one run:
 *   A. one cp on SQLite (the default, the baseline),
 *   B. one cp on PostgreSQL,
 *   C. two cp replicas on PostgreSQL (one database of its own).
 * Three `tether up --workers 2` clusters run side by side (a PostgreSQL
 * server started for the run by scripts/pgtest.sh), and the measurements
 * are interleaved: ROUNDS rounds, each measuring A, B and C in turn, so the
 * noise of a shared 2-vCPU machine falls on all three alike; medians over
 * the rounds are reported with their ratio to A.
 *   creates/s: CLIENTS threads POST /v1/sandboxes straight to the cp
 *     (spread over the replicas), each answered once the worker
 *     acknowledged the install (201), for SECONDS; the sandboxes are
 *     deleted after each round, untimed.
 *   mints/s:  CLIENTS threads POST capabilities for one running sandbox.
 * No goal is asserted: the figures say what a second replica buys (the
 * cp's work spread over two processes and two signers) and what the
 * database costs against SQLite's local file. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "bench_util.h"

#define ROUNDS 3
#define SECONDS 3.0
#define CLIENTS 4
#define NCFG 3

struct cfg {
	const char *name;
	int replicas;
	char db[256];          /* "" = SQLite */
	struct bench_cluster c;
	char urls[2][64];
	char key[128];
	char sbx[64];          /* the running sandbox of the mint test */
	double creates[ROUNDS], mints[ROUNDS];
};

static struct cfg cfgs[NCFG] = {
	{ .name = "1 cp, SQLite", .replicas = 1, .c = { .name = "bench_replicas" } },
	{ .name = "1 cp, PostgreSQL", .replicas = 1, .c = { .name = "bench_replicas" } },
	{ .name = "2 cp, PostgreSQL", .replicas = 2, .c = { .name = "bench_replicas" } },
};

/* A response body, kept (small). */
struct buf {
	char b[4096];
	size_t n;
};

/* buf_write: curl's write callback. */
static size_t buf_write(char *d, size_t s, size_t n, void *arg)
{
	struct buf *b = arg;
	size_t k = s * n;

	if (b->n + k < sizeof(b->b)) {
		memcpy(b->b + b->n, d, k);
		b->n += k;
		b->b[b->n] = '\0';
	}
	return k;
}

/* req: METHOD url with the admin key and body; the status, *out the body. */
static long req(CURL *c, const char *method, const char *url, const char *key,
                const char *body, struct buf *out)
{
	char auth[200];
	struct curl_slist *h = NULL;
	long st = 0;

	out->n = 0;
	out->b[0] = '\0';
	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key);
	h = curl_slist_append(h, auth);
	h = curl_slist_append(h, "Content-Type: application/json");
	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, buf_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
	if (body != NULL)
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	if (curl_easy_perform(c) == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
	curl_slist_free_all(h);
	return st;
}

/* field: a string field of a JSON body into out. */
static int field(const char *body, const char *name, char *out, size_t cap)
{
	json_t *j = json_loads(body, 0, NULL);
	const char *v = json_string_value(json_object_get(j, name));
	int rc = v ? 0 : -1;

	snprintf(out, cap, "%s", v ? v : "");
	json_decref(j);
	return rc;
}

/* One client thread of a measurement. */
struct job {
	struct cfg *cfg;
	int i, mint;
	double until_us;
	long done;
	char made[256][40];   /* creates: ids, deleted after the round */
	int nmade;
};

/* job_run: creates (or mints) until the deadline. */
static void *job_run(void *arg)
{
	struct job *j = arg;
	CURL *c = curl_easy_init();
	struct buf out;
	char url[256];

	while (c != NULL && bench_now_us() < j->until_us) {
		const char *base = j->cfg->urls[(j->i + (int)j->done) % j->cfg->replicas];

		if (j->mint) {
			snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/capabilities", base, j->cfg->sbx);
			if (req(c, "POST", url, j->cfg->key,
			        "{\"purpose\":\"control\",\"ops\":[\"exec\"]}", &out) == 201)
				j->done++;
			continue;
		}
		snprintf(url, sizeof(url), "%s/v1/sandboxes", base);
		if (req(c, "POST", url, j->cfg->key, "{}", &out) == 201) {
			j->done++;
			if (j->nmade < 256)
				field(out.b, "id", j->made[j->nmade++], sizeof(j->made[0]));
		}
	}
	curl_easy_cleanup(c);
	return NULL;
}

/* measure: CLIENTS threads for SECONDS; operations per second. */
static double measure(struct cfg *cfg, int mint)
{
	static struct job jobs[CLIENTS];
	pthread_t th[CLIENTS];
	double t0 = bench_now_us(), t1;
	long total = 0;
	CURL *c = curl_easy_init();
	struct buf out;
	char url[256];

	for (int i = 0; i < CLIENTS; i++) {
		memset(&jobs[i], 0, sizeof(jobs[i]));
		jobs[i] = (struct job){ .cfg = cfg, .i = i, .mint = mint,
		                        .until_us = t0 + SECONDS * 1e6 };
		pthread_create(&th[i], NULL, job_run, &jobs[i]);
	}
	for (int i = 0; i < CLIENTS; i++) {
		pthread_join(th[i], NULL);
		total += jobs[i].done;
	}
	t1 = bench_now_us();
	for (int i = 0; i < CLIENTS; i++) { /* untimed: the round's sandboxes go */
		for (int k = 0; k < jobs[i].nmade; k++) {
			snprintf(url, sizeof(url), "%s/v1/sandboxes/%s", cfg->urls[0], jobs[i].made[k]);
			req(c, "DELETE", url, cfg->key, NULL, &out);
		}
	}
	curl_easy_cleanup(c);
	return (double)total / ((t1 - t0) / 1e6);
}

/* cluster_start: tether up for cfg on its own port base and state. */
static int cluster_start(struct cfg *cfg, int base)
{
	char state[PATH_MAX + 16], port[16], reps[8];

	cfg->c.port_base = base;
	if (bench_cluster_scratch(&cfg->c, "/tmp/bench_replicas.XXXXXX") < 0)
		return -1;
	snprintf(state, sizeof(state), "%s/state", cfg->c.scratch);
	snprintf(port, sizeof(port), "%d", base);
	snprintf(reps, sizeof(reps), "%d", cfg->replicas);
	snprintf(cfg->urls[0], sizeof(cfg->urls[0]), "http://127.0.0.1:%d", base);
	snprintf(cfg->urls[1], sizeof(cfg->urls[1]), "http://127.0.0.1:%d", base + 2);
	cfg->c.pid = fork();
	if (cfg->c.pid < 0)
		return -1;
	if (cfg->c.pid == 0) {
		int devnull = open("/dev/null", O_WRONLY);

		if (devnull >= 0) {
			dup2(devnull, STDOUT_FILENO);
			dup2(devnull, STDERR_FILENO);
		}
		setenv("HOME", cfg->c.scratch, 1);
		setenv("TETHER_LOG", "warn", 1);
		if (cfg->db[0])
			execl("build/tether", "tether", "up", "--workers", "2", "--state", state,
			      "--port", port, "--cp-replicas", reps, "--db", cfg->db, (char *)NULL);
		else
			execl("build/tether", "tether", "up", "--workers", "2", "--state", state,
			      "--port", port, (char *)NULL);
		_exit(127);
	}
	return 0;
}

/* cluster_ready: the admin key, two workers up, one running sandbox. */
static int cluster_ready(struct cfg *cfg)
{
	char path[PATH_MAX + 32], url[256];
	CURL *c = curl_easy_init();
	struct buf out;
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/state/cp/admin.key", cfg->c.scratch);
	for (int i = 0; i < 600; i++) {
		usleep(100000);
		if (waitpid(cfg->c.pid, NULL, WNOHANG) == cfg->c.pid) {
			fprintf(stderr, "bench_replicas: %s: tether up exited; logs in %s/state/logs\n",
			        cfg->name, cfg->c.scratch);
			cfg->c.pid = -1;
			break;
		}
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, cfg->key, sizeof(cfg->key) - 1);
		close(fd);
		if (n <= 0)
			continue;
		cfg->key[n] = '\0';
		cfg->key[strcspn(cfg->key, "\r\n \t")] = '\0';
		snprintf(url, sizeof(url), "%s/v1/sandboxes", cfg->urls[cfg->replicas - 1]);
		if (req(c, "POST", url, cfg->key, "{}", &out) == 201 &&
		    field(out.b, "id", cfg->sbx, sizeof(cfg->sbx)) == 0) {
			curl_easy_cleanup(c);
			return 0;
		}
	}
	curl_easy_cleanup(c);
	return -1;
}

/* pg_start: scripts/pgtest.sh start; the URL into url. */
static int pg_start(const char *dir, char *url, size_t cap)
{
	char cmd[PATH_MAX + 64];
	FILE *p;

	snprintf(cmd, sizeof(cmd), "scripts/pgtest.sh start '%s'", dir);
	p = popen(cmd, "r");
	if (p == NULL)
		return -1;
	if (fgets(url, (int)cap, p) == NULL)
		url[0] = '\0';
	url[strcspn(url, "\n")] = '\0';
	return pclose(p) == 0 && url[0] ? 0 : -1;
}

/* pg_db: a second database on the server of url: url2 names it. */
static int pg_db(const char *url, const char *name, char *url2, size_t cap)
{
	char cmd[700];
	const char *slash = strrchr(url, '/');

	snprintf(cmd, sizeof(cmd), "psql '%s' -qc 'CREATE DATABASE %s' >/dev/null", url, name);
	if (slash == NULL || system(cmd) != 0)
		return -1;
	snprintf(url2, cap, "%.*s/%s", (int)(slash - url), url, name);
	return 0;
}

/* span_free: ports base..base+19 can all be bound on 127.0.0.1 now. */
static int span_free(int base)
{
	for (int p = base; p < base + 20; p++) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
		                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;

		if (fd < 0)
			return 0;
		ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
		close(fd);
		if (!ok)
			return 0;
	}
	return 1;
}

/* median3: the median of ROUNDS values. */
static double median3(double *v)
{
	return bench_median(v, ROUNDS);
}

int main(void)
{
	char pgdir[] = "/tmp/bench_replicas_pg.XXXXXX", url[512], cmd[600];
	int rc = 1, base = 27300 + (getpid() % 200) * 10;

	curl_global_init(CURL_GLOBAL_DEFAULT);
	signal(SIGPIPE, SIG_IGN);
	if (mkdtemp(pgdir) == NULL || pg_start(pgdir, url, sizeof(url)) < 0) {
		printf("bench_replicas: no PostgreSQL server (scripts/deps.sh); skipped\n");
		return 0;
	}
	snprintf(cfgs[1].db, sizeof(cfgs[1].db), "%s", url);
	if (pg_db(url, "replicas", cfgs[2].db, sizeof(cfgs[2].db)) < 0) {
		fprintf(stderr, "bench_replicas: cannot create a database\n");
		goto out;
	}
	for (int k = 0; k < NCFG; k++) {
		while (!span_free(base) && base < 60000)
			base += 30;
		if (cluster_start(&cfgs[k], base) < 0 || cluster_ready(&cfgs[k]) < 0) {
			fprintf(stderr, "bench_replicas: %s did not come up\n", cfgs[k].name);
			goto out;
		}
		base += 30;
	}
	printf("bench_replicas: %d clients, %.0f s per measurement, %d interleaved rounds\n",
	       CLIENTS, SECONDS, ROUNDS);
	for (int r = 0; r < ROUNDS; r++) {
		for (int k = 0; k < NCFG; k++)
			cfgs[k].creates[r] = measure(&cfgs[k], 0);
		for (int k = 0; k < NCFG; k++)
			cfgs[k].mints[r] = measure(&cfgs[k], 1);
	}
	printf("%-20s %12s %8s %12s %8s\n", "", "creates/s", "ratio", "mints/s", "ratio");
	for (int k = 0; k < NCFG; k++)
		printf("%-20s %12.1f %8.2f %12.1f %8.2f\n", cfgs[k].name, median3(cfgs[k].creates),
		       median3(cfgs[k].creates) / median3(cfgs[0].creates),
		       median3(cfgs[k].mints), median3(cfgs[k].mints) / median3(cfgs[0].mints));
	rc = 0;
out:
	for (int k = 0; k < NCFG; k++)
		if (cfgs[k].c.scratch[0])
			bench_cluster_stop(&cfgs[k].c);
	snprintf(cmd, sizeof(cmd), "scripts/pgtest.sh stop '%s'", pgdir);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_replicas: could not stop the PostgreSQL server\n");
	return rc;
}

/* tether up: a whole local cluster in the foreground (control plane, N
 * workers, edge), laid out as in docs/ARCHITECTURE.md ("Local cluster
 * layout"). A child that dies while starting stops the rest; once the
 * cluster is up, one that dies is restarted (up_supervise.c), and Ctrl-C
 * stops the workers first, the cp last (up_stop.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <sodium.h>

#include "cleanup.h"
#include "cli/cli.h"
#include "cli/up.h"
#include "cli/verbs.h"
#include "manager/uids.h"
#include "client/tether.h"
#include "http.h"
#include "manager/paths.h"

#define UP_READY_SECONDS 30
/* As root, the node-api of the worker listening on port P runs as uid
 * UP_NODE_UID_BASE + P (gid likewise): a uid of its own, since no two
 * workers of a host share a port, and below the sandboxes' host uid
 * ranges (from 1000000, src/manager/uids.h). */
#define UP_NODE_UID_BASE 900000

/* mkdir_p: creates dir and its parents (mode 0700: state holds keys). */
static int mkdir_p(const char *dir)
{
	char buf[PATH_MAX];

	if (snprintf(buf, sizeof(buf), "%s/", dir) >= (int)sizeof(buf))
		return -1;
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return 0;
}

/* up_wait_healthy: polls url/healthz until 200. 0 ready, 1 stop signal,
 * -1 child died or timeout (reported). */
static int up_wait_healthy(struct up *u, const char *what, const char *url)
{
	char hz[600];

	snprintf(hz, sizeof(hz), "%s/healthz", url);
	for (int i = 0; i < UP_READY_SECONDS * 10; i++) {
		_cleanup_free_ char *body = NULL;
		int w;
		if (up_probe(hz, NULL, 2000, &body) == 200)
			return 0;
		if ((w = up_wait(u, 100)) != 0)
			return w;
	}
	cli_fail("%s did not become ready at %s within %d s", what, url,
	        UP_READY_SECONDS);
	return -1;
}

/* up_read_admin_key: see up.h (trimmed). */
int up_read_admin_key(struct up *u)
{
	char path[PATH_MAX + 16];
	_cleanup_close_ int fd = -1;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/cp/admin.key", u->state);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, u->admin_key, sizeof(u->admin_key) - 1);
	if (n <= 0)
		return -1;
	u->admin_key[n] = '\0';
	u->admin_key[strcspn(u->admin_key, "\r\n \t")] = '\0';
	return u->admin_key[0] ? 0 : -1;
}

/* workers_up: how many of w1..wN the cp lists as up. */
static int workers_up(struct up *u, const char *cp_url)
{
	char url[600];
	_cleanup_free_ char *body = NULL;
	json_t *j, *w;
	size_t i;
	int n = 0;

	snprintf(url, sizeof(url), "%s/v1/workers", cp_url);
	if (up_probe(url, u->admin_key, 2000, &body) != 200 || body == NULL)
		return 0;
	j = json_loads(body, JSON_REJECT_DUPLICATES, NULL);
	json_array_foreach(json_object_get(j, "workers"), i, w) {
		const char *id = json_string_value(json_object_get(w, "id"));
		const char *st = json_string_value(json_object_get(w, "state"));
		if (id && id[0] == 'w' && atoi(id + 1) >= 1 &&
		    atoi(id + 1) <= u->workers && (st == NULL || strcmp(st, "up") == 0))
			n++;
	}
	json_decref(j);
	return n;
}

/* up_parse: the options; 0 ok, 1 usage error (printed). */
static int up_parse(struct up *u, int argc, char **argv)
{
	const char *home = getenv("HOME");

	u->workers = 2;
	u->replicas = 1;
	u->base = 7700;
	if (home == NULL || home[0] == '\0')
		home = "/root";
	snprintf(u->state, sizeof(u->state), "%s/.local/state/tether", home);
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		char *end = NULL;
		if (strcmp(argv[i], "--workers") == 0 && v) {
			long n = strtol(v, &end, 10);
			/* Each worker has a host uid range of its own (manager/uids.h):
			 * the 32-bit id space bounds how many fit. */
			long fit = (long)((UINT32_MAX - 1ull - TT_UID_BASE_DEFAULT) /
			                  TT_UID_PER_WORKER);
			long max = fit < UP_MAX_WORKERS ? fit : UP_MAX_WORKERS;

			if (*end || n < 1 || n > max)
				return cli_fail("up: --workers must be 1..%ld", max);
			u->workers = (int)n;
		} else if (strcmp(argv[i], "--port") == 0 && v) {
			long n = strtol(v, &end, 10);
			if (*end || n < 1024 || n > 65535 - 10 - UP_MAX_WORKERS)
				return cli_fail("up: --port must be 1024..%d",
				               65535 - 10 - UP_MAX_WORKERS);
			u->base = (int)n;
		} else if (strcmp(argv[i], "--cp-replicas") == 0 && v) {
			long n = strtol(v, &end, 10);
			if (*end || n < 1 || n > UP_MAX_REPLICAS)
				return cli_fail("up: --cp-replicas must be 1..%d", UP_MAX_REPLICAS);
			u->replicas = (int)n;
		} else if (strcmp(argv[i], "--db") == 0 && v) {
			if ((strncmp(v, "postgresql://", 13) != 0 &&
			     strncmp(v, "postgres://", 11) != 0) || strlen(v) >= sizeof(u->db))
				return cli_fail("up: --db takes a postgresql:// URL");
			snprintf(u->db, sizeof(u->db), "%s", v);
		} else if (strcmp(argv[i], "--disk-mb") == 0 && v) {
			long n = strtol(v, &end, 10);
			if (*end || n < 16 || n > (1L << 24))
				return cli_fail("up: --disk-mb must be 16..%ld", 1L << 24);
			snprintf(u->disk_mb, sizeof(u->disk_mb), "%ld", n);
		} else if (strcmp(argv[i], "--substrate") == 0 && v) {
			if (strcmp(v, "ns") != 0 && strcmp(v, "microvm") != 0)
				return cli_fail("up: --substrate must be ns or microvm");
			snprintf(u->substrate, sizeof(u->substrate), "%s", v);
		} else if (strcmp(argv[i], "--state") == 0 && v) {
			if (realpath(v, u->state) == NULL) {
				if (mkdir_p(v) < 0 || realpath(v, u->state) == NULL)
					return cli_fail("up: cannot use state dir %s: %s", v,
					               strerror(errno));
			}
		} else {
			return cli_fail("usage: tether up [--workers N] [--state DIR] "
			               "[--port BASE] [--disk-mb N] [--substrate ns|microvm] "
			               "[--cp-replicas N --db postgresql://…]");
		}
		i++;
	}
	if (u->replicas > 1 && u->db[0] == '\0')
		return cli_fail("up: --cp-replicas %d needs --db postgresql://… (the "
		                "replicas share one database; SQLite serves one)",
		                u->replicas);
	{
		/* Refused now rather than by the first worker: each worker's
		 * state dir is STATE/workers/wN (manager/paths.h). */
		size_t max = TT_WORKER_STATE_MAX - strlen("/workers/w") -
		             (size_t)snprintf(NULL, 0, "%d", u->workers);

		if (strlen(u->state) > max)
			return cli_fail("up: the state dir %.60s... is %zu bytes long; at most %zu "
			               "(each worker's, STATE/workers/wN, at most %d)", u->state,
			               strlen(u->state), max, TT_WORKER_STATE_MAX);
	}
	return 0;
}

/* up_on_path: whether a plain "tether" in a new shell finds this binary
 * (so the welcome text can say how to get it on PATH when it does not). */
static bool up_on_path(const struct up *u)
{
	const char *path = getenv("PATH");
	size_t n = strlen(u->bindir);

	for (const char *p = path; p != NULL && *p != '\0';) {
		const char *end = strchr(p, ':');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len == n && strncmp(p, u->bindir, n) == 0)
			return true;
		p = end ? end + 1 : NULL;
	}
	return false;
}

/* up_bindir: the directory holding this tether binary (and tetherd). */
static int up_bindir(struct up *u)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n <= 0)
		return cli_fail("cannot find my own binary: %s", strerror(errno));
	self[n] = '\0';
	slash = strrchr(self, '/');
	*slash = '\0';
	snprintf(u->bindir, sizeof(u->bindir), "%s", self);
	return 0;
}

/* up_lock: takes S/up.lock, so that two clusters never share a state dir
 * (their workers would take over each other's managers). Returns the
 * locked descriptor (the lock lives as long as it does; the caller owns
 * it), or -1 after printing why. */
static int up_lock(const struct up *u)
{
	char path[PATH_MAX + 16];
	_cleanup_close_ int fd = -1;

	snprintf(path, sizeof(path), "%s/up.lock", u->state);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return cli_fail("cannot open %s: %s", path, strerror(errno)), -1;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0)
		return cli_fail(errno == EWOULDBLOCK ? "%s is in use by another "
		                "'tether up'; give this one its own --state DIR" :
		                "cannot lock %s", u->state), -1;
	return tt_steal_fd(&fd);
}

/* up_cp_port: control-plane replica r's port (1: BASE, then BASE+2..). */
static int up_cp_port(const struct up *u, int r)
{
	return r == 1 ? u->base : u->base + r;
}

/* up_ports_free: checks every port of the cluster before starting, so a
 * second 'tether up' says so instead of finding the first one's daemons
 * answering its health checks. 0 free, -1 reported. */
static int up_ports_free(struct up *u)
{
	int port;

	for (int i = -u->replicas; i <= u->workers; i++) {
		port = i < 0 ? up_cp_port(u, -i) : i == 0 ? u->base + 1 : u->base + 10 + i;
		if (port_in_use(port))
			return cli_fail("port %d is in use (another 'tether up'?); pick "
			                "other ports with --port BASE (uses BASE, BASE+1, "
			                "BASE+2.. for more control planes, BASE+11..)", port), -1;
	}
	return 0;
}

/* up_provision: `tetherd worker add` for worker id at url, its credential
 * written to credf (0600): a fresh one at each start, the old one revoked
 * by it. 0, or -1 after printing why. */
static int up_provision(struct up *u, char *tetherd, char *id, char *url,
                        char *credf)
{
	char dir[PATH_MAX + 32];
	char *argv[] = { tetherd, "worker", "add", "--state", dir, "--id", id,
	                 "--node-url", url, "--out", credf, NULL, NULL, NULL };
	int status;
	pid_t pid;

	snprintf(dir, sizeof(dir), "%s/cp", u->state);
	if (u->db[0] != '\0') {
		argv[11] = "--db";
		argv[12] = u->db;
	}
	pid = fork();
	if (pid < 0)
		return cli_fail("cannot provision %s: fork: %s", id, strerror(errno)), -1;
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);

		if (fd >= 0)
			dup2(fd, STDERR_FILENO); /* its one line of news */
		execv(tetherd, argv);
		_exit(127);
	}
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR)
			return cli_fail("cannot provision %s: %s", id, strerror(errno)), -1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return cli_fail("cannot provision worker %s (tetherd worker add failed)",
		                id), -1;
	return 0;
}

/* up_start: cp, workers, edge, each waited for. 0 ready, 1 stopped by a
 * signal, -1 failed (reported). */
static int up_start(struct up *u)
{
	char *cp_url = u->cp_url, *edge_url = u->edge_url;
	size_t cap = sizeof(u->cp_url);
	char tetherd[PATH_MAX + 16], guest[PATH_MAX + 16];
	char dir[PATH_MAX + 32], listen[64], credf[PATH_MAX + 48], id[16];
	char snaps[PATH_MAX + 32], node_url[96], uid[16];
	char feedf[PATH_MAX + 32];
	int w;

	snprintf(tetherd, sizeof(tetherd), "%s/tetherd", u->bindir);
	snprintf(guest, sizeof(guest), "%s/tether-guest", u->bindir);
	if (access(tetherd, X_OK) < 0)
		return cli_fail("%s is missing (run make)", tetherd), -1;
	if (up_ports_free(u) < 0)
		return -1;
	snprintf(cp_url, cap, "http://127.0.0.1:%d", u->base);
	snprintf(edge_url, cap, "http://127.0.0.1:%d", u->base + 1);

	/* The control plane: one, or replicas sharing --db and the key files
	 * of STATE/cp (the first makes them; the others start after it). */
	snprintf(dir, sizeof(dir), "%s/cp", u->state);
	u->cp_urls[0] = '\0';
	for (int r = 1; r <= u->replicas; r++) {
		char name[16], url[96];
		char *cp_argv[12] = { tetherd, "cp", "--state", dir, "--listen", listen };
		int na = 6;

		if (u->substrate[0]) {
			cp_argv[na++] = "--default-substrate";
			cp_argv[na++] = u->substrate;
		}
		if (u->db[0]) {
			cp_argv[na++] = "--db";
			cp_argv[na++] = u->db;
		}
		cp_argv[na] = NULL;
		snprintf(listen, sizeof(listen), "127.0.0.1:%d", up_cp_port(u, r));
		snprintf(url, sizeof(url), "http://%s", listen);
		snprintf(name, sizeof(name), r == 1 ? "cp" : "cp%d", r);
		snprintf(u->cp_urls + strlen(u->cp_urls), sizeof(u->cp_urls) - strlen(u->cp_urls),
		         "%s%s", r > 1 ? "," : "", url);
		if (up_spawn(u, UP_CP, name, up_cp_port(u, r), cp_argv) != 0)
			return -1;
		if ((w = up_wait_healthy(u, "the control plane", url)) != 0)
			return w;
	}
	for (int i = 0; up_read_admin_key(u) < 0; i++) {
		if (i == 50)
			return cli_fail("%s/cp/admin.key is missing or empty (the API key "
			               "was shown once; reset the state dir)", u->state), -1;
		if ((w = up_wait(u, 100)) != 0)
			return w;
	}

	/* Provisioning: each worker is given the feed key's public half, which
	 * its manager pins; the cp's signer wrote it before the cp answered. */
	snprintf(feedf, sizeof(feedf), "%s/cp/feed.pub", u->state);
	if (access(feedf, R_OK) < 0)
		return cli_fail("%s is missing (the cp's signer writes it)", feedf), -1;
	/* The snapshot store every local worker shares (lifecycle.md). */
	snprintf(snaps, sizeof(snaps), "%s/snapshots", u->state);
	if (mkdir_p(snaps) < 0)
		return cli_fail("cannot create %s: %s", snaps, strerror(errno)), -1;
	for (int i = 1; i <= u->workers; i++) {
		char uid_base[24];

		snprintf(id, sizeof(id), "w%d", i);
		snprintf(dir, sizeof(dir), "%s/workers/%s", u->state, id);
		snprintf(listen, sizeof(listen), "127.0.0.1:%d", u->base + 10 + i);
		snprintf(node_url, sizeof(node_url), "http://%s", listen);
		snprintf(credf, sizeof(credf), "%s/credential", dir);
		snprintf(uid, sizeof(uid), "%d", UP_NODE_UID_BASE + u->base + 10 + i);
		if (mkdir_p(dir) < 0)
			return cli_fail("cannot create %s: %s", dir, strerror(errno)), -1;
		if (up_provision(u, tetherd, id, node_url, credf) < 0)
			return -1;
		char *node_argv[] = { tetherd, "node", "--id", id, "--listen", listen,
		                      "--cp", u->cp_urls, "--credential-file", credf,
		                      "--feed-key-file", feedf,
		                      "--state", dir, "--guest-bin", guest,
		                      "--snapshots", snaps, "--uid-base", uid_base,
		                      NULL, NULL, NULL, NULL, NULL };
		int na = 20;
		/* Disjoint host uid ranges: sandboxes on different workers never
		 * share ids, nor the kernel's per-uid limits (manager/uids.h). */
		snprintf(uid_base, sizeof(uid_base), "%llu",
		         TT_UID_BASE_DEFAULT + (unsigned long long)(i - 1) * TT_UID_PER_WORKER);
		if (geteuid() == 0) { /* a node-api uid of its own */
			node_argv[na++] = "--uid";
			node_argv[na++] = uid;
		}
		if (u->disk_mb[0]) { /* each sandbox's disk cap (default 1 GiB) */
			node_argv[na++] = "--disk-mb";
			node_argv[na++] = u->disk_mb;
		}
		if (up_spawn(u, UP_WORKER, id, u->base + 10 + i, node_argv) != 0)
			return -1;
	}
	for (int i = 0; workers_up(u, cp_url) < u->workers; i++) {
		if (i == UP_READY_SECONDS * 10)
			return cli_fail("workers did not register within %d s (see %s/logs)",
			               UP_READY_SECONDS, u->state), -1;
		if ((w = up_wait(u, 100)) != 0)
			return w;
	}

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", u->base + 1);
	char *edge_argv[] = { tetherd, "edge", "--listen", listen, "--cp", u->cp_urls, NULL };
	if (up_spawn(u, UP_EDGE, "edge", u->base + 1, edge_argv) != 0)
		return -1;
	return up_wait_healthy(u, "the edge", edge_url);
}

/* up_welcome: what runs where, and what to try next. */
static void up_welcome(struct up *u, const char *cp_url, const char *edge_url,
                       const char *cfg)
{
	printf("tether is up.\n\n");
	printf("  edge           %s   (TETHER_URL; the CLI talks to this)\n", edge_url);
	printf("  control plane  %s\n", cp_url);
	for (int r = 2; r <= u->replicas; r++)
		printf("  replica %-2d     http://127.0.0.1:%d   (%s)\n", r, up_cp_port(u, r),
		       "PostgreSQL");
	for (int i = 1; i <= u->workers; i++)
		printf("  worker w%-2d     http://127.0.0.1:%d\n", i, u->base + 10 + i);
	printf("\n  state  %s\n  logs   %s/logs/\n  config %s (url + API key)\n\n",
	       u->state, u->state, cfg);
	printf("Try, in another terminal%s%s%s:\n"
	       "  id=$(tether create)\n"
	       "  tether exec $id -- sh -c 'echo hello from $(hostname)'\n"
	       "  tether cp ./some-file $id:/tmp/some-file\n"
	       "  tether cp $id:/tmp/some-file ./copy\n"
	       "  tether ls\n"
	       "  tether rm $id\n\n"
	       "A daemon that dies is restarted. Ctrl-C stops the cluster: the\n"
	       "workers first (a second Ctrl-C does not wait for them), the\n"
	       "control plane last.\n",
	       up_on_path(u) ? "" : " (after: export PATH=\"",
	       up_on_path(u) ? "" : u->bindir,
	       up_on_path(u) ? "" : ":$PATH\")");
	fflush(stdout);
}

/* cli_up: up [--workers N] [--state DIR] [--port BASE] [--disk-mb N]
 * [--substrate ns|microvm]. */
int cli_up(int argc, char **argv)
{
	_cleanup_close_ int lock_fd = -1; /* held until the cluster is down */
	struct up u;
	char cfg[PATH_MAX], logs[PATH_MAX + 8];
	struct tt_err err = { 0 };
	sigset_t set;
	int rc = 0, w;

	memset(&u, 0, sizeof(u));
	if (up_parse(&u, argc, argv) != 0 || up_bindir(&u) != 0)
		return 1;
	snprintf(logs, sizeof(logs), "%s/logs", u.state);
	if (mkdir_p(logs) < 0)
		return cli_fail("cannot create %s: %s", logs, strerror(errno));
	if ((lock_fd = up_lock(&u)) < 0)
		return 1;
	if (tether_config_path(cfg, sizeof(cfg), &err) < 0)
		return cli_fail("%s", err.msg);
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		return cli_fail("curl_global_init failed");
	/* signals are taken synchronously (sigtimedwait) so forwarding and
	 * reaping never race with a handler */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_BLOCK, &set, NULL);
	/* Orphans of the cluster (a signer whose cp died, a manager whose
	 * node-api died, bridges and sandboxes whose manager died) become our
	 * children and are reaped at once: a group is empty only once its
	 * zombies are gone, and pid 1 may reap late (seconds, here). */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		fprintf(stderr, "tether: cannot become a subreaper (%s); restarts may "
		        "wait for pid 1 to reap\n", strerror(errno));

	w = up_start(&u);
	if (w == 0 && tether_config_write(cfg, u.edge_url, u.admin_key, &err) < 0) {
		cli_fail("%s", err.msg);
		w = -1;
	}
	sodium_memzero(u.admin_key, sizeof(u.admin_key));
	if (w == 0) {
		up_welcome(&u, u.cp_url, u.edge_url, cfg);
		w = up_supervise(&u);
	}
	if (w > 0)
		fprintf(stderr, "tether: %s received; stopping the cluster\n",
		        strsignal(u.stop_signal));
	else
		rc = 1;
	up_stop(&u);
	up_children_free(&u);
	sodium_memzero(u.admin_key, sizeof(u.admin_key));
	return rc;
}

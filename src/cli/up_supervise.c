/* tether up's children: each in a process group of its own, with a
 * parent-death signal, so neither a terminal Ctrl-C nor our own death
 * leaves strays. While the cluster runs, a child that dies is restarted
 * with the same argv after a backoff (200 ms doubling to 10 s, reset once
 * it stayed up 30 s), never before the old one is gone: its process (and,
 * for the cp and the edge, its whole group) reaped, a worker's old
 * sbx-manager exited (its manager.lock free), its port bindable. Every
 * daemon reads its state back from its state dir. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <sodium.h>

#include "cleanup.h"
#include "cli/cli.h"
#include "cli/up.h"
#include "http.h"

#define UP_BACKOFF_MIN_MS 200u
#define UP_BACKOFF_MAX_MS 10000u
#define UP_STABLE_MS 30000u       /* up this long: the backoff starts over */
#define UP_GROUP_GRACE_MS 5000u   /* cp, edge: group members outliving them */
#define UP_RETRY_MS 100u          /* a restart waiting for the old one */
#define UP_BACK_PROBE_MS 30000u   /* how long "is back" is waited for */

enum { UP_SAID_LOCK = 1, UP_SAID_PORT = 2, UP_SAID_GROUP = 4, UP_SAID_SLOW = 8 };

/* up_now_ms: see up.h. */
uint64_t up_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* child_start: forks and execs k->argv, output appended to k->log. 0, or
 * 1 after printing why. */
static int child_start(struct child *k)
{
	sigset_t none;
	pid_t pid = fork();

	if (pid < 0)
		return cli_fail("cannot start %s: %s", k->name, strerror(errno));
	if (pid == 0) {
		int fd = open(k->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		/* our own group: a terminal Ctrl-C reaches only tether up, which
		 * stops the children in order; the death signal covers tether up
		 * being killed */
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() == 1)
			_exit(1);
		if (fd < 0 || nul < 0 || dup2(nul, 0) < 0 || dup2(fd, 1) < 0 ||
		    dup2(fd, 2) < 0)
			_exit(127);
		execv(k->argv[0], k->argv);
		dprintf(2, "tether up: cannot run %s: %s\n", k->argv[0], strerror(errno));
		_exit(127);
	}
	setpgid(pid, pid); /* also from here, so the group exists before any kill */
	k->pid = k->pgid = pid;
	k->started_ms = up_now_ms();
	return 0;
}

/* up_spawn: see up.h. */
int up_spawn(struct up *u, enum up_role role, const char *name, int port,
             char *const argv[])
{
	struct child *k;
	char path[sizeof(k->log)];

	if (u->nkids == UP_MAX_CHILDREN)
		return cli_fail("too many children");
	k = &u->kids[u->nkids];
	memset(k, 0, sizeof(*k));
	u->nkids++; /* from here on its argv copies are freed with the rest */
	/* via a local buffer: name may point into *u as far as gcc knows */
	snprintf(path, sizeof(path), "%s/logs/%s.log", u->state, name);
	memcpy(k->log, path, sizeof(path));
	if (role == UP_WORKER) {
		snprintf(path, sizeof(path), "%s/workers/%s/manager.lock", u->state, name);
		memcpy(k->lock, path, sizeof(path));
	}
	snprintf(k->name, sizeof(k->name), "%s", name);
	k->role = role;
	k->port = port;
	for (int i = 0; argv[i] != NULL; i++) {
		if (i == UP_MAX_ARGS - 1)
			return cli_fail("%s: too many arguments", name);
		if ((k->argv[i] = strdup(argv[i])) == NULL)
			return cli_fail("out of memory");
	}
	return child_start(k);
}

/* up_children_free: see up.h. */
void up_children_free(struct up *u)
{
	for (int i = 0; i < u->nkids; i++)
		for (int j = 0; j < UP_MAX_ARGS && u->kids[i].argv[j] != NULL; j++) {
			free(u->kids[i].argv[j]);
			u->kids[i].argv[j] = NULL;
		}
}

/* up_log_tail: prints the last lines of a child's log, to say why it died. */
static void up_log_tail(const struct child *k)
{
	_cleanup_close_ int fd = open(k->log, O_RDONLY | O_CLOEXEC);
	char buf[1024];
	off_t end;
	ssize_t n;

	if (fd < 0 || (end = lseek(fd, 0, SEEK_END)) < 0)
		return;
	if (lseek(fd, end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1 : 0,
	          SEEK_SET) < 0)
		return;
	n = read(fd, buf, sizeof(buf) - 1);
	if (n <= 0)
		return;
	buf[n] = '\0';
	const char *start = buf;
	int lines = 0;
	for (char *p = buf + n - 1; p > buf; p--)
		if (*p == '\n' && p != buf + n - 1 && ++lines == 5) {
			start = p + 1;
			break;
		}
	fprintf(stderr, "--- last lines of %s ---\n%s", k->log, start);
	if (buf[n - 1] != '\n')
		fputc('\n', stderr);
}

/* describe: "exited with status N" / "was killed by signal N (Name)". */
static void describe(int status, char *buf, size_t cap)
{
	if (WIFEXITED(status))
		snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status),
		         strsignal(WTERMSIG(status)));
	else
		snprintf(buf, cap, "stopped");
}

/* backoff_ms: the delay before restart attempt n (1, 2, …). */
static uint64_t backoff_ms(unsigned n)
{
	uint64_t d = UP_BACKOFF_MIN_MS << (n > 7 ? 6 : n - 1);

	return d > UP_BACKOFF_MAX_MS ? UP_BACKOFF_MAX_MS : d;
}

/* up_group_alive: see up.h. */
bool up_group_alive(pid_t pg)
{
	return pg > 0 && (kill(-pg, 0) == 0 || errno == EPERM);
}

/* old_group_keep: remembers a dead worker's group that still has members
 * (its bridges and sandboxes, which its next sbx-manager adopts). */
static void old_group_keep(struct child *k)
{
	if (!up_group_alive(k->pgid))
		return;
	for (int i = 0; i < UP_OLD_GROUPS; i++)
		if (k->old_groups[i] == 0 || !up_group_alive(k->old_groups[i])) {
			k->old_groups[i] = k->pgid;
			return;
		}
}

/* up_on_death: a child died while the cluster runs (or the cp while the
 * workers stop and need it): one line, its log tail, a restart scheduled.
 * Any other death while stopping is expected and said nothing of. */
static void up_on_death(struct up *u, struct child *k)
{
	uint64_t lived = k->died_ms - k->started_ms, delay;
	char how[96];

	if (k->role == UP_WORKER)
		old_group_keep(k);
	if (u->phase == UP_STOPPING && !(k->role == UP_CP && u->cp_needed))
		return;
	if (lived >= UP_STABLE_MS)
		k->attempt = 0;
	k->attempt++;
	delay = backoff_ms(k->attempt);
	k->restart_at = k->died_ms + delay;
	k->said = 0;
	describe(k->status, how, sizeof(how));
	if (k->attempt == 1)
		fprintf(stderr, "tether: %s %s; restarting it (attempt 1)\n", k->name, how);
	else
		fprintf(stderr, "tether: %s %s %.1f s after it started; restarting it "
		        "in %.1f s (attempt %u)%s\n", k->name, how, (double)lived / 1000.0,
		        (double)delay / 1000.0, k->attempt, lived < 2000 ?
		        "; it keeps dying right away, retrying with backoff" : "");
	up_log_tail(k);
}

/* up_reap: collects exited children. While starting, returns the first
 * one that died (the caller stops the cluster); else NULL, deaths being
 * handled by up_on_death. Other pids (none expected) are ignored. */
static struct child *up_reap(struct up *u)
{
	struct child *dead = NULL;
	int status;
	pid_t pid;

	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		for (int i = 0; i < u->nkids; i++) {
			struct child *k = &u->kids[i];

			if (k->pid != pid)
				continue;
			k->pid = 0;
			k->status = status;
			k->died_ms = up_now_ms();
			if (u->phase == UP_STARTING) {
				if (dead == NULL)
					dead = k;
			} else {
				up_on_death(u, k);
			}
		}
	}
	return dead;
}

/* up_wait: see up.h. */
int up_wait(struct up *u, long ms)
{
	struct timespec ts = { ms > 0 ? ms / 1000 : 0, ms > 0 ? (ms % 1000) * 1000000L : 0 };
	sigset_t set;
	struct child *dead;
	int sig;

	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGCHLD);
	sig = sigtimedwait(&set, NULL, &ts);
	dead = up_reap(u); /* also when a signal came first: SIGCHLD may wait */
	if (sig == SIGINT || sig == SIGTERM) {
		if (u->signals++ == 0)
			u->stop_signal = sig;
		return 1;
	}
	if (dead != NULL) {
		char how[96];

		describe(dead->status, how, sizeof(how));
		cli_fail("%s %s unexpectedly; stopping the cluster", dead->name, how);
		up_log_tail(dead);
		return -1;
	}
	return 0;
}

/* up_lock_free: see up.h. Only asked once the worker's node-api is
 * reaped, so no manager of ours is starting: holding the lock for this
 * instant cannot make one fail. Cannot tell: free (the manager says). */
bool up_lock_free(const struct child *k)
{
	_cleanup_close_ int fd = -1;

	if (k->lock[0] == '\0')
		return true;
	fd = open(k->lock, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return true;
	return flock(fd, LOCK_EX | LOCK_NB) == 0; /* released by the close */
}

/* up_worker_gone: see up.h. */
bool up_worker_gone(const struct child *k)
{
	if (k->pid > 0 || up_group_alive(k->pgid) || !up_lock_free(k))
		return false;
	for (int i = 0; i < UP_OLD_GROUPS; i++)
		if (up_group_alive(k->old_groups[i]))
			return false;
	return true;
}

/* up_kill_groups: see up.h. */
void up_kill_groups(struct child *k, int sig)
{
	if (up_group_alive(k->pgid))
		kill(-k->pgid, sig);
	for (int i = 0; i < UP_OLD_GROUPS; i++)
		if (up_group_alive(k->old_groups[i]))
			kill(-k->old_groups[i], sig);
}

/* port_in_use: see up.h. SO_REUSEADDR as the daemons' listeners have it
 * (libwebsockets sets it, and FD_CLOEXEC), so a connection of the dead
 * one in TIME_WAIT does not count. */
int port_in_use(int port)
{
	_cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET,
	                         .sin_port = htons((uint16_t)port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int one = 1;

	if (fd < 0)
		return 0; /* cannot tell: the daemon will say */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	return bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 && errno == EADDRINUSE;
}

/* restart_ready: whether the old incarnation of k is gone: a worker's
 * sbx-manager exited (else the new one would refuse its state dir), the
 * cp's or edge's group empty (killed 5 s after the death), the port free.
 * Says once what a restart waits for, when it waits long. */
static bool restart_ready(struct child *k, uint64_t now)
{
	uint64_t waited = now - k->died_ms;

	if (k->role == UP_WORKER) {
		if (!up_lock_free(k)) {
			if (waited > 10000 && !(k->said & UP_SAID_LOCK)) {
				k->said |= UP_SAID_LOCK;
				fprintf(stderr, "tether: %s: waiting for its old sbx-manager to "
				        "exit (it holds %s)\n", k->name, k->lock);
			}
			return false;
		}
	} else if (up_group_alive(k->pgid)) {
		if (waited < UP_GROUP_GRACE_MS)
			return false;
		if (!(k->said & UP_SAID_GROUP)) {
			k->said |= UP_SAID_GROUP;
			fprintf(stderr, "tether: %s: processes of its group outlived it by "
			        "%u s; killing them\n", k->name, UP_GROUP_GRACE_MS / 1000);
		}
		kill(-k->pgid, SIGKILL);
		return false;
	}
	if (port_in_use(k->port)) {
		if (waited > 5000 && !(k->said & UP_SAID_PORT)) {
			k->said |= UP_SAID_PORT;
			fprintf(stderr, "tether: %s: port %d is still in use; waiting for it\n",
			        k->name, k->port);
		}
		return false;
	}
	return true;
}

/* back_check: a restarted child answering /healthz is said to be back,
 * with the time since it died. */
static void back_check(struct child *k)
{
	char url[64];
	_cleanup_free_ char *body = NULL;

	snprintf(url, sizeof(url), "http://127.0.0.1:%d/healthz", k->port);
	if (up_probe(url, NULL, 300, &body) == 200) {
		k->back_pending = false;
		fprintf(stderr, "tether: %s is back (pid %d, %.1f s after it died)\n",
		        k->name, (int)k->pid, (double)(up_now_ms() - k->died_ms) / 1000.0);
	} else if (up_now_ms() > k->started_ms + UP_BACK_PROBE_MS) {
		k->back_pending = false;
		fprintf(stderr, "tether: %s runs again (pid %d) but does not answer at "
		        "%s yet (see %s)\n", k->name, (int)k->pid, url, k->log);
	}
}

/* up_tick: see up.h. */
void up_tick(struct up *u)
{
	uint64_t now = up_now_ms();

	for (int i = 0; i < u->nkids; i++) {
		struct child *k = &u->kids[i];

		for (int j = 0; j < UP_OLD_GROUPS; j++)
			if (k->old_groups[j] != 0 && !up_group_alive(k->old_groups[j]))
				k->old_groups[j] = 0;
		if (u->phase == UP_STOPPING && !(k->role == UP_CP && u->cp_needed)) {
			k->restart_at = 0;
			k->back_pending = false;
			continue;
		}
		if (k->pid == 0 && k->restart_at != 0 && now >= k->restart_at) {
			if (!restart_ready(k, now)) {
				k->restart_at = now + UP_RETRY_MS;
			} else if (child_start(k) == 0) {
				k->restart_at = 0;
				k->back_pending = true;
			} else {
				k->restart_at = now + backoff_ms(k->attempt);
			}
		}
		if (k->pid > 0 && k->back_pending)
			back_check(k);
	}
}

/* up_next_wake: ms until something is due: a restart, a readiness probe,
 * else a second. */
static long up_next_wake(const struct up *u)
{
	uint64_t now = up_now_ms();
	long ms = 1000;

	for (int i = 0; i < u->nkids; i++) {
		const struct child *k = &u->kids[i];

		if (k->back_pending && ms > 100)
			ms = 100;
		if (k->pid == 0 && k->restart_at != 0) {
			long d = k->restart_at > now ? (long)(k->restart_at - now) : 0;
			if (d < ms)
				ms = d;
		}
	}
	return ms;
}

/* up_supervise: see up.h. */
int up_supervise(struct up *u)
{
	int w;

	u->phase = UP_RUNNING;
	for (;;) {
		if ((w = up_wait(u, up_next_wake(u))) != 0)
			return w;
		up_tick(u);
	}
}

/* sink_cb: bounded in-memory body for probes. */
static size_t sink_cb(char *data, size_t size, size_t n, void *arg)
{
	char **buf = arg;
	size_t len = *buf ? strlen(*buf) : 0, add = size * n;
	char *nb;

	if (len + add > (1u << 22))
		return 0;
	nb = realloc(*buf, len + add + 1);
	if (nb == NULL)
		return 0;
	memcpy(nb + len, data, add);
	nb[len + add] = '\0';
	*buf = nb;
	return add;
}

/* up_probe: see up.h. */
long up_probe(const char *url, const char *key, long timeout_ms, char **body)
{
	char auth[300];
	struct curl_slist *h = NULL;
	CURL *e = curl_easy_init();
	long status = 0;

	*body = NULL;
	if (e == NULL)
		return 0;
	if (key) {
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key);
		h = curl_slist_append(h, auth);
		sodium_memzero(auth, sizeof(auth));
	}
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	http_easy_direct(e);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink_cb);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
	if (curl_easy_perform(e) == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(e);
	if (h != NULL) {
		/* the header's copy in the list holds the key too */
		for (struct curl_slist *p = h; p != NULL; p = p->next)
			sodium_memzero(p->data, strlen(p->data));
		curl_slist_free_all(h);
	}
	return status;
}

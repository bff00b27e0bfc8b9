/* sbx-manager: the daemon. Its command line, its socket, the lifeline to
 * node-api, start-up (lock, records, recovery, spares) and shutdown; the
 * pieces it runs live beside it (docs/ARCHITECTURE.md lists them).
 * One libuv loop, single-threaded. Spawned by node-api; only that process
 * (pid and uid given on the command line) may talk to it.
 * Wire contract: docs/ARCHITECTURE.md (notes/protocol.md). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "capcache.h"
#include "log.h"
#include "manager/manager_int.h"
#include "manager/paths.h"
#include "tetherd/roles.h"
#include "uvutil.h"

#define MGR_CAPCACHE_ENTRIES 4096
#define MGR_LOCK_WAIT_MS 10000     /* for a predecessor on its way out */
#define MGR_CPU_MILLIS 1000u       /* each sandbox's CPU cap: one CPU */

/* pidfd_open_raw: see manager_int.h. */
int pidfd_open_raw(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* pidfd_signal: see manager_int.h. */
int pidfd_signal(int pidfd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

/* mgr_now_ms: see manager_int.h. */
int64_t mgr_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* mgr_now_us: see manager_int.h. */
int64_t mgr_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* sock_dir_remove: the runtime directory node-api made for our socket (it
 * cannot remove it itself once unprivileged); empty after the unlink. */
static void sock_dir_remove(struct manager *m)
{
	char dir[PATH_MAX];
	char *slash;

	if (!m->own_sock_dir)
		return;
	snprintf(dir, sizeof(dir), "%s", m->sock_path);
	slash = strrchr(dir, '/');
	if (slash == NULL || slash == dir)
		return;
	*slash = '\0';
	if (rmdir(dir) < 0 && errno != ENOENT)
		log_warn("cannot remove %s: %s", dir, strerror(errno));
	m->own_sock_dir = false;
}

/* manager_shutdown: see manager_int.h. */
void manager_shutdown(struct manager *m)
{
	if (m->stopping)
		return;
	m->stopping = true;
	log_info("stopping: %s", "terminating bridges and sandboxes");
	while (m->execs)
		exec_stop(m, m->execs);
	/* node-api keeps idle connections to us in its pool: they would keep
	 * our loop (and so this process, and node-api waiting for it) alive. */
	while (m->waiting)
		conn_free(m->waiting);
	if (m->watcher != NULL)
		conn_free(m->watcher);
	while (m->lost != NULL)
		lost_forget(m, m->lost->sbx);
	uv_close((uv_handle_t *)&m->server, NULL);
	unlink(m->sock_path);
	sock_dir_remove(m);
	if (m->lifeline_on) {
		uv_close((uv_handle_t *)&m->lifeline, NULL);
		m->lifeline_on = false;
	}
	uv_signal_stop(&m->sigterm);
	uv_signal_stop(&m->sigint);
	uv_close((uv_handle_t *)&m->sigterm, NULL);
	uv_close((uv_handle_t *)&m->sigint, NULL);
	if (m->spare_on) {
		uv_timer_stop(&m->spare_timer);
		uv_close((uv_handle_t *)&m->spare_timer, NULL);
	}
	/* The spare's layer must not stay mounted after us (a stopped worker
	 * leaks no loop device); one still being made is removed by
	 * spare_after_work, which the loop runs before it ends. */
	spare_sb_take(m); /* a launch still running ends first */
	spare_sb_stop(m);
	if (!m->spare_busy && sandbox_tree_remove(m->spare_dir) < 0)
		log_warn("removing %s: %s", m->spare_dir, strerror(errno));
	m->spare_ready = false;
	if (m->spare_netns >= 0)
		close(m->spare_netns);
	m->spare_netns = -1;
	bridgectl_discard(&m->spare_bridge);
}

/* on_signal: SIGTERM / SIGINT. */
static void on_signal(uv_signal_t *s, int signum)
{
	(void)signum;
	manager_shutdown(s->data);
}

/* default_guest_bin: tether-guest next to this binary. */
static void default_guest_bin(char *out, size_t cap)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	out[0] = '\0';
	if (n <= 0)
		return;
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (slash != NULL) {
		*slash = '\0';
		snprintf(out, cap, "%.4000s/tether-guest", self);
	}
}

/* parse_args: the command line of protocol.md. */
static int parse_args(struct manager *m, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "state", required_argument, NULL, 's' },
		{ "socket", required_argument, NULL, 'k' },
		{ "worker-id", required_argument, NULL, 'w' },
		{ "peer-pid", required_argument, NULL, 'p' },
		{ "peer-uid", required_argument, NULL, 'u' },
		{ "guest-bin", required_argument, NULL, 'g' },
		{ "snapshots", required_argument, NULL, 'S' },
		{ "lifeline", required_argument, NULL, 'L' },
		{ "private-socket-dir", no_argument, NULL, 'P' },
		{ "disk-mb", required_argument, NULL, 'D' },
		{ "disk-inodes", required_argument, NULL, 'I' },
		{ "uid-base", required_argument, NULL, 'U' },
		{ "cpu-millis", required_argument, NULL, 'C' },
		{ "feed-key", required_argument, NULL, 'F' },
		{ NULL, 0, NULL, 0 },
	};
	char *end;
	unsigned long long v;
	bool have_pid = false, have_uid = false;
	int o;

	default_guest_bin(m->guest_bin, sizeof(m->guest_bin));
	optind = 1;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': snprintf(m->state_dir, sizeof(m->state_dir), "%s", optarg); break;
		case 'k': snprintf(m->sock_path, sizeof(m->sock_path), "%s", optarg); break;
		case 'w': snprintf(m->worker_id, sizeof(m->worker_id), "%s", optarg); break;
		case 'p': m->peer_pid = (pid_t)atoi(optarg); have_pid = true; break;
		case 'u': m->peer_uid = (uid_t)strtoul(optarg, NULL, 10); have_uid = true; break;
		case 'g': snprintf(m->guest_bin, sizeof(m->guest_bin), "%s", optarg); break;
		case 'S': snprintf(m->snap_dir, sizeof(m->snap_dir), "%s", optarg); break;
		case 'L': m->lifeline_fd = atoi(optarg); break;
		case 'P': m->own_sock_dir = true; break;
		case 'F': snprintf(m->feed_key, sizeof(m->feed_key), "%s", optarg); break;
		case 'D':
		case 'I':
			errno = 0;
			v = strtoull(optarg, &end, 10);
			if (errno != 0 || *end != '\0' || optarg[0] < '0' || optarg[0] > '9' ||
			    (o == 'D' && (v < (NS_LAYER_MIN_BYTES >> 20) || v > (1ull << 24))) ||
			    (o == 'I' && v > UINT32_MAX)) {
				fprintf(stderr, "manager: --disk-mb wants %llu..%llu, "
				        "--disk-inodes 0..%u\n",
				        (unsigned long long)(NS_LAYER_MIN_BYTES >> 20),
				        1ull << 24, UINT32_MAX);
				return -1;
			}
			if (o == 'D')
				m->layer_bytes = v << 20;
			else
				m->layer_inodes = v;
			break;
		case 'U':
		case 'C':
			errno = 0;
			v = strtoull(optarg, &end, 10);
			if (errno != 0 || *end != '\0' || optarg[0] < '0' || optarg[0] > '9' ||
			    (o == 'U' && (v < TT_UID_PER_SANDBOX ||
			                  v + TT_UID_PER_WORKER >= UINT32_MAX)) ||
			    (o == 'C' && v > 1000u * 1024u)) {
				fprintf(stderr, "manager: --uid-base wants %u..%llu, --cpu-millis "
				        "0..%u\n", TT_UID_PER_SANDBOX,
				        UINT32_MAX - TT_UID_PER_WORKER - 1, 1000u * 1024u);
				return -1;
			}
			if (o == 'U')
				m->uid_base = (uid_t)v;
			else
				m->cpu_millis = (uint32_t)v;
			break;
		default: return -1;
		}
	}
	if (strlen(m->state_dir) > TT_WORKER_STATE_MAX) {
		fprintf(stderr, "manager: --state is %zu bytes long; at most %d\n",
		        strlen(m->state_dir), TT_WORKER_STATE_MAX);
		return -1;
	}
	if (!m->state_dir[0] || !m->sock_path[0] || !m->worker_id[0] || !have_pid ||
	    !have_uid || m->peer_pid <= 0 || !m->feed_key[0]) {
		fprintf(stderr, "usage: tetherd manager --state DIR --socket PATH --worker-id W"
		                " --peer-pid PID --peer-uid UID --feed-key K4PUBLIC [--guest-bin PATH]"
		                " [--snapshots DIR] [--lifeline FD] [--private-socket-dir]"
		                " [--disk-mb N] [--disk-inodes N] [--uid-base N]"
		                " [--cpu-millis N]\n");
		return -1;
	}
	return 0;
}

/* listen_socket: the manager socket, mode 0600, stale file replaced; owned
 * by the peer's uid when that is not ours, so that only it can connect. */
static int listen_socket(struct manager *m, struct tt_err *err)
{
	m->srv = (struct uvutil_server){ .loop = m->loop, .ops = &conn_server_ops, .data = m };
	if (uvutil_listen(m->loop, &m->server, m->sock_path, 128, uvutil_server_accept,
	                  &m->srv, err) < 0)
		return -1;
	if (m->peer_uid == geteuid())
		return 0;
	/* Privileged (CAP_CHOWN): node-api runs unprivileged, and connecting
	 * needs write permission on the socket. Handing the 0600 socket to
	 * exactly its uid keeps every other uid out by permissions; the
	 * SO_PEERCRED pid+uid check still applies to each connection. */
	if (chown(m->sock_path, m->peer_uid, (gid_t)-1) < 0)
		return tt_err_sys(err, TT_ERR_IO, "chown %s to uid %u", m->sock_path,
		                  (unsigned)m->peer_uid);
	return 0;
}

/* on_lifeline: node-api never writes; EOF or an error means it closed its
 * end (stopping) or died, and the worker stops with it. */
static void on_lifeline(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct manager *m = s->data;

	(void)buf;
	if (nread > 0)
		m->lifeline_stop = true; /* "stop": node-api stops in order */
	if (nread >= 0)
		return; /* 0: EAGAIN; the bytes themselves are not looked at */
	if (m->lifeline_stop || m->stopping) {
		log_info("node-api asked us to stop");
		manager_shutdown(m);
		return;
	}
	/* node-api is gone: its successor starts a manager that adopts what
	 * runs (as after a SIGKILL of ours), so nothing is stopped; the
	 * socket goes, and we exit at once so the next one gets our lock. */
	log_warn("node-api closed the lifeline without a stop (%s): leaving %zu "
	         "record(s) to the next manager", uv_strerror((int)nread),
	         records_count(m->db));
	m->abandon = true;
	unlink(m->sock_path);
	sock_dir_remove(m);
	uv_stop(m->loop);
}

/* lifeline_alloc: one static sink: the bytes are never looked at. */
static void lifeline_alloc(uv_handle_t *h, size_t size, uv_buf_t *buf)
{
	static char sink[64];

	(void)h;
	(void)size;
	*buf = uv_buf_init(sink, sizeof(sink));
}

/* lifeline_start: watches --lifeline FD. It is moved off fd 0 first, and
 * fd 0 becomes /dev/null, so that nothing we spawn inherits it. */
static int lifeline_start(struct manager *m, struct tt_err *err)
{
	int fd, null;

	if (m->lifeline_fd < 0)
		return 0;
	fd = fcntl(m->lifeline_fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "lifeline fd %d", m->lifeline_fd);
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup2(null, m->lifeline_fd) < 0) {
		if (null >= 0)
			close(null);
		close(fd);
		return tt_err_sys(err, TT_ERR_IO, "/dev/null over the lifeline fd");
	}
	close(null);
	uv_pipe_init(m->loop, &m->lifeline, 0);
	m->lifeline.data = m;
	if (uv_pipe_open(&m->lifeline, fd) < 0 ||
	    uv_read_start((uv_stream_t *)&m->lifeline, lifeline_alloc, on_lifeline) < 0) {
		uv_close((uv_handle_t *)&m->lifeline, NULL);
		return tt_err_set(err, TT_ERR_IO, "cannot watch the lifeline");
	}
	m->lifeline_on = true;
	return 0;
}

/* state_lock: one manager per state directory, held until we exit. A
 * second one would find every execution's bridge pinned to the first,
 * fail to adopt them and stop them all, then take over the socket. The
 * lock file's descriptor is close-on-exec, so no sandbox or bridge keeps
 * it past its exec. 0, or -1 (reported). */
static int state_lock(const char *state_dir, int64_t wait_ms)
{
	char path[PATH_MAX];
	int fd;

	if (snprintf(path, sizeof(path), "%s/manager.lock", state_dir) >= (int)sizeof(path)) {
		log_error("state directory path too long");
		return -1;
	}
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		log_error("cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	/* Spawned by node-api (wait_ms > 0): the manager of a node-api that
	 * died may still be on its way out; it lets go within moments. */
	for (int64_t until = mgr_now_ms() + wait_ms; flock(fd, LOCK_EX | LOCK_NB) < 0;) {
		if (errno != EWOULDBLOCK || mgr_now_ms() >= until) {
			log_error("%s: another sbx-manager runs on this state directory (%s)",
			          path, strerror(errno));
			close(fd);
			return -1;
		}
		usleep(20000);
	}
	return 0; /* fd stays open (and locked) for our lifetime */
}

/* manager_main: the sbx-manager role. */
int manager_main(int argc, char **argv)
{
	static struct manager mgr; /* large; one per process */
	struct manager *m = &mgr;
	struct tt_err err = { 0 };
	char path[PATH_MAX];
	int rc = 1;

	tt_log_init("manager", TT_LOG_INFO);
	signal(SIGPIPE, SIG_IGN);
	m->spare_netns = -1;
	m->lifeline_fd = -1;
	m->clean_mntns = -1;
	m->spare_bridge = (struct bridge_proc){ .pid = 0, .pidfd = -1, .assign_fd = -1,
	                                        .ready_fd = -1 };
	m->layer_bytes = NS_DEFAULT_LAYER_BYTES;
	m->uid_base = TT_UID_BASE_DEFAULT;
	m->cpu_millis = MGR_CPU_MILLIS;
	if (parse_args(m, argc, argv) < 0)
		return 1;
	/* Our bridges' own uid: in this worker's range, mapped into no
	 * sandbox (manager/uids.h). */
	bridgectl_run_as(m->uid_base + TT_UID_PER_SANDBOX * TT_UID_BRIDGE_SLOT);
	if (bridgectl_bin(m->bridge_bin, sizeof(m->bridge_bin), &err) < 0) {
		log_error("%s", err.msg);
		return 1;
	}
	m->loop = uv_default_loop();
	if (snprintf(path, sizeof(path), "%s/sandboxes", m->state_dir) >=
	    (int)sizeof(path)) {
		log_error("state directory path too long");
		return 1;
	}
	if ((mkdir(m->state_dir, 0700) < 0 && errno != EEXIST) ||
	    (mkdir(path, 0700) < 0 && errno != EEXIST)) {
		log_error("cannot create %s: %s", path, strerror(errno));
		return 1;
	}
	if (state_lock(m->state_dir, m->lifeline_fd >= 0 ? MGR_LOCK_WAIT_MS : 0) < 0)
		return 1;
	/* The feed's root key, pinned at provisioning (the first start). */
	if (snprintf(path, sizeof(path), "%s/feed.pub", m->state_dir) >= (int)sizeof(path) ||
	    feedsig_pin(path, m->feed_key, &err) < 0 ||
	    feedsig_init(&m->feed, m->feed_key, m->worker_id, &err) < 0) {
		log_error("%s", err.msg[0] ? err.msg : "state directory path too long");
		return 1;
	}
	if (snprintf(path, sizeof(path), "%s/runtime.db", m->state_dir) >=
	    (int)sizeof(path)) {
		log_error("state directory path too long");
		return 1;
	}
	if (records_open(path, &m->db, &err) < 0) {
		log_error("%s", err.msg);
		return 1;
	}
	m->cache = capcache_new(MGR_CAPCACHE_ENTRIES);
	if (m->cache == NULL) {
		log_error("out of memory");
		goto out;
	}
	/* Before any layer of ours is mounted (and with those of adopted or
	 * other workers' sandboxes detached from it). */
	m->clean_mntns = ns_mntns_clean(&err);
	if (m->clean_mntns < 0)
		log_warn("sandboxes will copy our mount namespace: %s", err.msg);
	recover_adopt(m);
	snapshots_gc(m);
	if (listen_socket(m, &err) < 0 || lifeline_start(m, &err) < 0) {
		log_error("%s", err.msg);
		goto out;
	}
	spare_init(m);
	uvutil_signals_start(m->loop, &m->sigterm, &m->sigint, on_signal, m);
	log_info("worker %s: listening on %s, applied rev %" PRIu64 ", %zu record(s)",
	         m->worker_id, m->sock_path, records_applied_rev(m->db),
	         records_count(m->db));
	uv_run(m->loop, UV_RUN_DEFAULT);
	rc = 0;
	if (m->abandon) { /* our processes and mounts stay for the successor */
		records_close(m->db);
		return 0;
	}
out:
	if (rc != 0) { /* manager_shutdown did not run */
		unlink(m->sock_path);
		sock_dir_remove(m);
	}
	while (m->execs)
		exec_stop(m, m->execs);
	uv_run(m->loop, UV_RUN_NOWAIT);
	capcache_free(m->cache);
	records_close(m->db);
	return rc;
}

/* node-api: the process. Arguments, the privileged sbx-manager it spawns
 * (and its lifeline), the drop to an unprivileged user, readiness, the
 * orderly drain and shutdown. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <jansson.h>
#include <pwd.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "cleanup.h"
#include "log.h"
#include "manager/paths.h"
#include "node/api_int.h"
#include "paseto.h"
#include "tetherd/roles.h"
#include "uvutil.h"
#include "wireop.h"

#define API_READY_TIMEOUT_MS 10000
#define API_READY_RETRY_MS 50

/* How long an orderly stop waits for this worker's sandboxes to pause. */
#define API_DRAIN_MS (120u * 1000u)

static const char *const usage_text =
	"usage: tetherd node --id W --listen 127.0.0.1:PORT --cp URL "
	"--credential-file FILE --feed-key-file FILE --state DIR [--guest-bin PATH]\n"
	"       [--snapshots DIR]  (--feed-key-file: the control plane's feed key,\n"
	"       k4.public, given at provisioning; tether up passes STATE/cp/feed.pub)\n"
	"       [--disk-mb N] [--disk-inodes N]  (each sandbox's disk and inode cap;\n"
	"       default 1024 MiB, one inode per 16 KiB)\n"
	"       [--uid-base N]  (this worker's host uid range; default 1000000)\n"
	"       [--cpu-millis N]  (each sandbox's CPU cap; default 1000 = one CPU)\n"
	"       [--uid UID[:GID] | --user NAME]  (when started as root: whom node-api\n"
	"       runs as, one of its own per worker; default nobody)\n"
	"  FILE: this worker's credential (tetherd worker add), mode 0600\n";

/* node_read_token: the worker's credential file (first line, bounded):
 * ours (our euid) and readable by no one else, since it is all it takes
 * to act as this worker towards the cp. */
static int node_read_token(struct node *n, const char *file, struct tt_err *err)
{
	_cleanup_close_ int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	char buf[NODE_TOKEN_MAX + 2];
	struct stat st;
	ssize_t got;
	size_t len;

	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot open %s", file);
	if (fstat(fd, &st) < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot stat %s", file);
	if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0 || st.st_uid != geteuid())
		return tt_err_set(err, TT_ERR_INVALID, "%s must be a regular file of"
		                  " uid %u, mode 0600 (it holds this worker's credential)",
		                  file, (unsigned)geteuid());
	got = read(fd, buf, sizeof(buf) - 1);
	if (got < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot read %s", file);
	len = (size_t)got;
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r' ||
	                   buf[len - 1] == ' '))
		len--;
	if (len == 0 || len > NODE_TOKEN_MAX || memchr(buf, '\n', len) != NULL) {
		sodium_memzero(buf, sizeof(buf));
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "%s: expected one credential line of at most %d bytes",
		                  file, NODE_TOKEN_MAX);
	}
	memcpy(n->node_token, buf, len);
	n->node_token[len] = '\0';
	sodium_memzero(buf, sizeof(buf));
	return 0;
}

/* node_read_feed_key: the feed key file: one k4.public line. */
static int node_read_feed_key(struct node *n, const char *file, struct tt_err *err)
{
	_cleanup_close_ int fd = open(file, O_RDONLY | O_CLOEXEC);
	char buf[PASERK_K4_PUBLIC_LEN + 3];
	uint8_t pk[PASETO_PK_BYTES];
	ssize_t got;

	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot open %s", file);
	got = read(fd, buf, sizeof(buf) - 1);
	if (got < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot read %s", file);
	buf[got] = '\0';
	if (got > PASERK_K4_PUBLIC_LEN && buf[PASERK_K4_PUBLIC_LEN] == '\n')
		buf[PASERK_K4_PUBLIC_LEN] = '\0';
	if (paserk_k4_public_decode(buf, pk, err) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: expected one k4.public line",
		                  file);
	memcpy(n->feed_key, buf, PASERK_K4_PUBLIC_LEN + 1);
	return 0;
}

/* node_id_valid: worker ids are short [a-z0-9_-] names (they go into URLs). */
static bool node_id_valid(const char *s)
{
	size_t len = strlen(s);

	if (len == 0 || len > TT_NAME_MAX)
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
		      *s == '_' || *s == '-'))
			return false;
	return true;
}

/* node_parse: command line -> n; -1 with err on a usage error. */
static int node_parse(struct node *n, int argc, char **argv, struct tt_err *err)
{
	static const struct option opts[] = {
		{ "id", required_argument, NULL, 'i' },
		{ "listen", required_argument, NULL, 'l' },
		{ "cp", required_argument, NULL, 'c' },
		{ "credential-file", required_argument, NULL, 't' },
		{ "feed-key-file", required_argument, NULL, 'F' },
		{ "state", required_argument, NULL, 's' },
		{ "guest-bin", required_argument, NULL, 'g' },
		{ "snapshots", required_argument, NULL, 'S' },
		{ "user", required_argument, NULL, 'u' },
		{ "uid", required_argument, NULL, 'U' },
		{ "disk-mb", required_argument, NULL, 'D' },
		{ "disk-inodes", required_argument, NULL, 'I' },
		{ "uid-base", required_argument, NULL, 'B' },
		{ "cpu-millis", required_argument, NULL, 'C' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *listen = NULL, *token_file = NULL, *feed_file = NULL, *colon;
	char *end;
	long port;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'i': n->id = optarg; break;
		case 'l': listen = optarg; break;
		case 'c': n->cp_url = optarg; break;
		case 't': token_file = optarg; break;
		case 'F': feed_file = optarg; break;
		case 's': n->state_dir = optarg; break;
		case 'g': n->guest_bin = optarg; break;
		case 'S': n->snap_dir = optarg; break;
		case 'u': n->user = optarg; break;
		case 'U': n->uid = optarg; break;
		case 'D': n->disk_mb = optarg; break;
		case 'I': n->disk_inodes = optarg; break;
		case 'B': n->uid_base = optarg; break;
		case 'C': n->cpu_millis = optarg; break;
		default:
			return tt_err_set(err, TT_ERR_INVALID, "%s", usage_text);
		}
	}
	if (optind != argc || !n->id || !listen || !n->cp_url || !token_file ||
	    !feed_file || !n->state_dir)
		return tt_err_set(err, TT_ERR_INVALID, "%s", usage_text);
	if (!node_id_valid(n->id))
		return tt_err_set(err, TT_ERR_INVALID, "invalid worker id '%s'", n->id);
	colon = strrchr(listen, ':');
	if (colon == NULL || (size_t)(colon - listen) >= sizeof(n->listen_host) ||
	    colon == listen)
		return tt_err_set(err, TT_ERR_INVALID, "--listen wants HOST:PORT");
	port = strtol(colon + 1, &end, 10);
	if (*end != '\0' || port < 1 || port > 65535)
		return tt_err_set(err, TT_ERR_INVALID, "invalid port in --listen");
	memcpy(n->listen_host, listen, (size_t)(colon - listen));
	n->listen_host[colon - listen] = '\0';
	n->port = (int)port;
	snprintf(n->node_url, sizeof(n->node_url), "http://%s:%d", n->listen_host,
	         n->port);
	if (urllist_parse(&n->cps, n->cp_url, err) < 0)
		return -1;
	/* Unix socket paths may be of any length (unixaddr.h); the state
	 * dir's own limit is the manager's (manager/paths.h). */
	if (strlen(n->state_dir) > TT_WORKER_STATE_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "--state is %zu bytes long; at most %d",
		                  strlen(n->state_dir), TT_WORKER_STATE_MAX);
	snprintf(n->sock_path, sizeof(n->sock_path), "%s/manager.sock", n->state_dir);
	if (node_read_feed_key(n, feed_file, err) < 0)
		return -1;
	return node_read_token(n, token_file, err);
}

/* node_on_manager_exit: the manager is part of the worker; without it
 * nothing can be admitted, so node-api exits and its supervisor restarts
 * both. */
static void node_on_manager_exit(uv_process_t *p, int64_t status, int sig)
{
	struct node *n = p->data;

	n->manager_running = false;
	uv_close((uv_handle_t *)p, NULL);
	if (n->exit_code >= 0) { /* our own shutdown */
		uv_stop(n->loop);
		return;
	}
	log_error("sbx-manager exited (status %" PRId64 ", signal %d); stopping",
	          status, sig);
	n->exit_code = 1;
	uv_stop(n->loop);
}

/* node_spawn_manager: fork + exec of our own binary as "manager"; it
 * accepts only our pid and uid on its socket (protocol.md). */
static int node_spawn_manager(struct node *n, struct tt_err *err)
{
	char pid[24], uid[24];
	char *args[32];
	uv_process_options_t o;
	uv_stdio_container_t stdio[3];
	int i = 0, rc;

	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	/* The uid node-api will have when it connects (after the drop). */
	snprintf(uid, sizeof(uid), "%u", (unsigned)n->run_uid);
	args[i++] = (char *)"tetherd";
	args[i++] = (char *)"manager";
	args[i++] = (char *)"--state";
	args[i++] = (char *)n->state_dir;
	args[i++] = (char *)"--socket";
	args[i++] = n->sock_path;
	args[i++] = (char *)"--worker-id";
	args[i++] = (char *)n->id;
	args[i++] = (char *)"--peer-pid";
	args[i++] = pid;
	args[i++] = (char *)"--peer-uid";
	args[i++] = uid;
	args[i++] = (char *)"--lifeline";
	args[i++] = (char *)"0";
	if (n->run_dir[0] != '\0')
		args[i++] = (char *)"--private-socket-dir";
	if (n->guest_bin != NULL) {
		args[i++] = (char *)"--guest-bin";
		args[i++] = (char *)n->guest_bin;
	}
	if (n->snap_dir != NULL) { /* the snapshot store, passed through */
		args[i++] = (char *)"--snapshots";
		args[i++] = (char *)n->snap_dir;
	}
	if (n->disk_mb != NULL) { /* the layer caps, checked by the manager */
		args[i++] = (char *)"--disk-mb";
		args[i++] = (char *)n->disk_mb;
	}
	if (n->disk_inodes != NULL) {
		args[i++] = (char *)"--disk-inodes";
		args[i++] = (char *)n->disk_inodes;
	}
	if (n->uid_base != NULL) { /* this worker's host uid range */
		args[i++] = (char *)"--uid-base";
		args[i++] = (char *)n->uid_base;
	}
	if (n->cpu_millis != NULL) { /* each sandbox's CPU cap */
		args[i++] = (char *)"--cpu-millis";
		args[i++] = (char *)n->cpu_millis;
	}
	args[i++] = (char *)"--feed-key"; /* the manager pins and verifies with it */
	args[i++] = n->feed_key;
	args[i] = NULL;
	memset(&o, 0, sizeof(o));
	memset(stdio, 0, sizeof(stdio));
	for (int k = 1; k < 3; k++) {
		stdio[k].flags = UV_INHERIT_FD;
		stdio[k].data.fd = k;
	}
	/* stdin is the lifeline: a socketpair end we never write to. */
	uv_pipe_init(n->loop, &n->lifeline, 0);
	n->lifeline_open = true;
	stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
	stdio[0].data.stream = (uv_stream_t *)&n->lifeline;
	o.file = "/proc/self/exe"; /* the same tetherd binary */
	o.args = args;
	o.exit_cb = node_on_manager_exit;
	/* Its own session and process group: a signal to ours (a terminal's
	 * Ctrl-C, `tether up` or a supervisor stopping us) must not stop the
	 * sandboxes behind our back: we pause them first, then ask the
	 * manager to stop over the lifeline, which is all it obeys. */
	o.flags = UV_PROCESS_DETACHED;
	o.stdio = stdio;
	o.stdio_count = 3;
	n->manager.data = n;
	rc = uv_spawn(n->loop, &n->manager, &o);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_SYS, "cannot start the manager: %s",
		                  uv_strerror(rc));
	n->manager_running = true;
	log_info("started sbx-manager (pid %d)", n->manager.pid);
	return 0;
}

/* node_stop_manager: asks the manager to stop. Once unprivileged we may
 * not signal it (it stays root), so the lifeline is what counts: "stop"
 * on it, then EOF, is an orderly stop (its sandboxes stop too); EOF alone
 * — we died, or stop on an error — makes it leave them running for the
 * manager our successor starts, which adopts them. The signal is for a
 * node-api that never dropped (EPERM is expected). */
static void node_stop_manager(struct node *n, bool orderly)
{
	uv_os_fd_t fd;

	if (n->lifeline_open) {
		if (orderly && uv_fileno((uv_handle_t *)&n->lifeline, &fd) == 0 &&
		    write(fd, "stop\n", 5) != 5)
			log_warn("cannot ask the manager to stop: %s", strerror(errno));
		uv_close((uv_handle_t *)&n->lifeline, NULL);
		n->lifeline_open = false;
	}
	if (orderly && n->manager_running)
		uv_process_kill(&n->manager, SIGTERM);
}

/* node_fatal: logs, stops the manager and the loop with status 1. */
static void node_fatal(struct node *n, const char *msg)
{
	log_error("%s", msg);
	n->exit_code = 1;
	node_stop_manager(n, false);
	uv_stop(n->loop);
}

/* node_serv_buf_env: TETHER_NODE_SERV_BUF (bytes, 4096..1 MiB) sets lws'
 * per-thread service buffer, which sizes each read from a client: the
 * request-body paths must be correct whatever it is, and the regression
 * test (tests/integration/test_upload_flow.sh) runs them at 32 KiB. */
static void node_serv_buf_env(void)
{
	const char *v = getenv("TETHER_NODE_SERV_BUF");
	char *end;
	unsigned long b;

	if (v == NULL || v[0] == '\0')
		return;
	errno = 0;
	b = strtoul(v, &end, 10);
	if (errno != 0 || *end != '\0' || b < 4096 || b > (1ul << 20)) {
		log_warn("TETHER_NODE_SERV_BUF=%s ignored: want 4096..1048576", v);
		return;
	}
	http_server_set_serv_buf(b);
	log_info("node-api: lws service buffer %lu bytes", b);
}

/* node_serve: the manager answered: start HTTP and the feed. */
static void node_serve(struct node *n)
{
	struct tt_err err = { 0 };

	node_serv_buf_env();
	/* a client, its manager connection and an rxguard dup */
	http_server_set_fds_per_conn(3);
	n->lws = http_server_new(n->loop, n->listen_host, n->port, api_protocols,
	                         n, &err);
	if (n->lws == NULL) {
		node_fatal(n, err.msg);
		return;
	}
	n->httpc = httpc_new(n->loop, &err);
	if (n->httpc == NULL || node_feed_start(n, &err) < 0 ||
	    node_events_start(n, &err) < 0) {
		node_fatal(n, err.msg);
		return;
	}
	log_info("node-api %s listening on %s", n->id, n->node_url);
}

static uv_timer_t ready_timer;
static uint64_t ready_deadline;

static void node_ready_try(uv_timer_t *t);

/* node_on_status: the manager's status answer (readiness + feed resume). */
static void node_on_status(void *arg, json_t *result, const struct tt_err *err)
{
	struct node *n = arg;
	json_t *rev;

	if (n->exit_code >= 0)
		goto out;
	if (result == NULL) {
		if (err->code == TT_ERR_IO && uv_now(n->loop) < ready_deadline &&
		    n->manager_running) {
			uv_timer_start(&ready_timer, node_ready_try, API_READY_RETRY_MS, 0);
			goto out;
		}
		log_error("manager status: %s", err->msg);
		node_fatal(n, "the sbx-manager did not come up");
		goto out;
	}
	rev = json_object_get(result, "applied_rev");
	if (!json_is_integer(rev) || json_integer_value(rev) < 0) {
		node_fatal(n, "manager status has no applied_rev");
		goto out;
	}
	n->applied_rev = (uint64_t)json_integer_value(rev);
	node_serve(n);
out:
	json_decref(result);
}

/* node_ready_try: asks the manager for its status (retried until ready). */
static void node_ready_try(uv_timer_t *t)
{
	struct node *n = t->data;
	struct tt_err err = { 0 };
	json_t *req = json_pack("{s:s}", "op", wireop_name(WIRE_OP_STATUS));

	if (req == NULL ||
	    mgrconn_call(n, req, node_on_status, n, &err) < 0)
		node_fatal(n, "cannot ask the manager for its status");
	json_decref(req);
}

/* node_drained: the sandboxes are paused (or that was given up): the
 * manager stops, and its exit callback stops the loop. */
static void node_drained(struct node *n)
{
	if (n->manager_running)
		node_stop_manager(n, true);
	else
		uv_stop(n->loop);
}

/* node_on_signal: SIGTERM/SIGINT: an orderly stop: the cp pauses this
 * worker's sandboxes (to resume here when we are back), then the manager
 * stops, then we exit; a second signal skips the wait. The feed stops
 * after the loop (node_main), so that no transfer outlives it. */
static void node_on_signal(uv_signal_t *s, int signum)
{
	struct node *n = s->data;

	log_info("signal %d: shutting down", signum);
	if (n->exit_code < 0)
		n->exit_code = 0;
	if (n->manager_running)
		node_drain(n, API_DRAIN_MS, node_drained);
	else
		uv_stop(n->loop);
}

/* node_uid_parse: --uid UID[:GID] (GID defaults to UID), neither 0. */
static int node_uid_parse(struct node *n, struct tt_err *err)
{
	unsigned long u, g;
	char *end;

	errno = 0;
	u = strtoul(n->uid, &end, 10);
	g = u;
	if (errno == 0 && *end == ':' && end[1] != '\0')
		g = strtoul(end + 1, &end, 10);
	if (errno != 0 || *end != '\0' || !isdigit((unsigned char)n->uid[0]) ||
	    u == 0 || g == 0 || u >= UINT32_MAX || g >= UINT32_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "--uid wants UID[:GID], neither 0");
	n->run_uid = (uid_t)u;
	n->run_gid = (gid_t)g;
	n->drop = true;
	return 0;
}

/* node_user_resolve: who we run as. As root: --uid, or --user (default
 * "nobody"), which must not be root; otherwise no change (and --user or
 * --uid is refused, since it could not be honoured). */
static int node_user_resolve(struct node *n, struct tt_err *err)
{
	const char *name = n->user != NULL ? n->user : "nobody";
	struct passwd *pw;

	n->run_uid = getuid();
	n->run_gid = getgid();
	if (geteuid() != 0) {
		if (n->user != NULL || n->uid != NULL)
			return tt_err_set(err, TT_ERR_INVALID,
			                  "--user and --uid need tetherd node to start as root");
		return 0;
	}
	if (n->uid != NULL && n->user != NULL)
		return tt_err_set(err, TT_ERR_INVALID, "--uid or --user, not both");
	if (n->uid != NULL)
		return node_uid_parse(n, err);
	if (n->user == NULL)
		log_warn("running as nobody, like any other worker on this host started"
		         " without --uid/--user: give each its own uid");
	errno = 0;
	pw = getpwnam(name);
	if (pw == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "unknown user '%s'%s%s", name,
		                  errno ? ": " : "", errno ? strerror(errno) : "");
	if (pw->pw_uid == 0 || pw->pw_gid == 0)
		return tt_err_set(err, TT_ERR_INVALID,
		                  "--user %s: node-api must not run with uid or gid 0", name);
	n->run_uid = pw->pw_uid;
	n->run_gid = pw->pw_gid;
	n->drop = true;
	return 0;
}

/* node_run_dir: a fresh directory for manager.sock that the unprivileged
 * node-api can reach (the state dir's ancestors, e.g. /root, may not be).
 * Root-owned, mode 0711: others may pass through but not list it or put
 * anything in it; the manager chowns the 0600 socket inside to run_uid. */
static int node_run_dir(struct node *n, struct tt_err *err)
{
	static const char *const bases[] = { "/run", "/tmp" };

	for (size_t i = 0; i < sizeof(bases) / sizeof(bases[0]); i++) {
		snprintf(n->run_dir, sizeof(n->run_dir), "%s/tether-node.XXXXXX", bases[i]);
		/* Privileged: /run is writable only by root; that is the point,
		 * since no unprivileged user can pre-create or swap this dir. */
		if (mkdtemp(n->run_dir) == NULL)
			continue;
		if (chmod(n->run_dir, 0711) < 0) {
			tt_err_sys(err, TT_ERR_IO, "chmod %s", n->run_dir);
			rmdir(n->run_dir);
			n->run_dir[0] = '\0';
			return -1;
		}
		snprintf(n->sock_path, sizeof(n->sock_path), "%s/manager.sock", n->run_dir);
		return 0;
	}
	n->run_dir[0] = '\0';
	return tt_err_sys(err, TT_ERR_IO, "cannot create a runtime dir in /run or /tmp");
}

/* node_drop: becomes run_uid/run_gid for good (OpenBSD style privsep):
 * the manager is spawned and the token read, nothing privileged is left to
 * do. Verified after the fact: a half-done drop is a fatal error. */
static int node_drop(struct node *n, struct tt_err *err)
{
	uid_t ru, eu, su;
	gid_t rg, eg, sg;

	/* Privileged, and the last privileged calls node-api makes: shed the
	 * supplementary groups (root's), then gid before uid (afterwards we
	 * could no longer change gids). */
	if (setgroups(0, NULL) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "setgroups");
	if (setresgid(n->run_gid, n->run_gid, n->run_gid) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "setresgid %u", (unsigned)n->run_gid);
	if (setresuid(n->run_uid, n->run_uid, n->run_uid) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "setresuid %u", (unsigned)n->run_uid);
	/* No way back through a setuid binary either. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "PR_SET_NO_NEW_PRIVS");
	if (getresuid(&ru, &eu, &su) < 0 || getresgid(&rg, &eg, &sg) < 0 ||
	    ru != n->run_uid || eu != n->run_uid || su != n->run_uid ||
	    rg != n->run_gid || eg != n->run_gid || sg != n->run_gid ||
	    getgroups(0, NULL) != 0)
		return tt_err_set(err, TT_ERR_SYS, "privilege drop did not take");
	if (setuid(0) == 0 || setgid(0) == 0)
		return tt_err_set(err, TT_ERR_SYS, "privilege drop is reversible; refusing to run");
	log_info("running as uid %u gid %u", (unsigned)n->run_uid, (unsigned)n->run_gid);
	return 0;
}

/* node_main: see roles.h. */
int node_main(int argc, char **argv)
{
	static struct node node;
	struct node *n = &node;
	struct tt_err err = { 0 };
	uv_signal_t sigterm, sigint;
	uv_loop_t *loop;

	tt_log_init("node", TT_LOG_INFO);
	if (sodium_init() < 0) {
		fprintf(stderr, "tetherd node: libsodium init failed\n");
		return 1;
	}
	n->exit_code = -1;
	if (node_parse(n, argc, argv, &err) < 0) {
		fprintf(stderr, "tetherd node: %s%s", err.msg,
		        err.code == TT_ERR_INVALID && strncmp(err.msg, "usage", 5) == 0 ? "" : "\n");
		sodium_memzero(n->node_token, sizeof(n->node_token));
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	if (mkdir(n->state_dir, 0700) < 0 && errno != EEXIST) {
		log_error("cannot create %s: %s", n->state_dir, strerror(errno));
		return 1;
	}
	loop = uv_default_loop();
	n->loop = loop;
	n->mgr_pool = uvutil_pool_new(loop, MGRCONN_POOL_MAX, MGRCONN_IDLE_MS);
	if (n->mgr_pool == NULL) {
		log_error("out of memory");
		return 1;
	}
	/* Order: everything root-only first (token read in node_parse, run
	 * dir, manager spawn), then the drop, then the loop. */
	if (node_user_resolve(n, &err) < 0 || (n->drop && node_run_dir(n, &err) < 0) ||
	    node_spawn_manager(n, &err) < 0) {
		log_error("%s", err.msg);
		if (n->run_dir[0] != '\0' && !n->manager_running)
			rmdir(n->run_dir);
		sodium_memzero(n->node_token, sizeof(n->node_token));
		return 1;
	}
	if (n->drop && node_drop(n, &err) < 0) {
		log_error("%s", err.msg);
		node_stop_manager(n, false); /* still root here if setresuid failed */
		sodium_memzero(n->node_token, sizeof(n->node_token));
		return 1;
	}
	uv_signal_init(loop, &sigterm);
	uv_signal_init(loop, &sigint);
	sigterm.data = sigint.data = n;
	uv_signal_start(&sigterm, node_on_signal, SIGTERM);
	uv_signal_start(&sigint, node_on_signal, SIGINT);
	uv_timer_init(loop, &ready_timer);
	ready_timer.data = n;
	ready_deadline = uv_now(loop) + API_READY_TIMEOUT_MS;
	uv_timer_start(&ready_timer, node_ready_try, API_READY_RETRY_MS, 0);

	uv_run(loop, UV_RUN_DEFAULT);

	/* an error exit: the manager leaves its sandboxes to our successor */
	if (n->manager_running || n->lifeline_open)
		node_stop_manager(n, false);
	node_events_stop(n);
	/* Order matters: the feed is marked stopping before httpc_free runs
	 * its aborted-transfer callbacks; the loop does not run again, so
	 * nothing is freed under a pending callback (the process exits). */
	node_feed_stop(n);
	if (n->httpc != NULL)
		httpc_free(n->httpc);
	uvutil_pool_free(n->mgr_pool);
	sodium_memzero(n->node_token, sizeof(n->node_token));
	log_info("node-api %s exiting (%d)", n->id, n->exit_code < 0 ? 1 : n->exit_code);
	return n->exit_code < 0 ? 1 : n->exit_code;
}

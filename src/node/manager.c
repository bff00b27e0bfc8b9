/* sbx-manager: worker admission (SPEC §4), the durable runtime records
 * (SPEC §10), feed apply (SPEC §7) and the per-execution host bridges.
 * One libuv loop, single-threaded. Spawned by node-api; only that process
 * (pid and uid given on the command line) may talk to it.
 * Wire contract: docs/ARCHITECTURE.md (notes/protocol.md). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "bridge/reason.h"
#include "capcache.h"
#include "cleanup.h"
#include "decision.h"
#include "guest/hello.h"
#include "feedsig.h"
#include "keyring.h"
#include "log.h"
#include "metrics.h"
#include "node/bridgectl.h"
#include "node/ns.h"
#include "node/paths.h"
#include "snapshot.h"
#include "snapstore.h"
#include "node/records.h"
#include "procid.h"
#include "relay.h"
#include "tetherd/roles.h"
#include "timefmt.h"
#include "unixaddr.h"
#include "uvutil.h"
#include "wire.h"
#include "wire_json.h"

#define MGR_CAPCACHE_ENTRIES 4096
#define MGR_UPDATES_MAX 1000      /* updates in one feed.apply */
#define MGR_UID_BASE 1000000u
#define MGR_UID_COUNT 65536u
#define MGR_BRIDGE_READY_MS 5000
#define MGR_LOCK_WAIT_MS 10000     /* for a predecessor on its way out */
#define MGR_SPARE_BACKOFF_MIN_MS 250   /* first wait after a failed spare */
#define MGR_SPARE_BACKOFF_MAX_MS 10000
/* Idle connections kept per bridge, and for how long. */
#define MGR_POOL_IDLE_MAX 4
#define MGR_POOL_IDLE_MS 30000

/* Runtime (non-durable) state of one execution running here: the sandbox,
 * its bridge and the pidfd watchers. Owned by manager.execs. */
struct mgr_exec {
	struct manager *m;
	char sbx[TT_SBX_ID_LEN + 1];
	struct ns_sandbox sb;
	pid_t bridge_pid;
	int bridge_pidfd;
	unsigned long long bridge_start;
	/* The bridge as pinned at spawn (pid, start time, executable, uid):
	 * every connection to it must reach exactly this process. */
	struct proc_identity bridge_id;
	bool own_children;        /* false when adopted after a restart */
	/* Identifies this very runtime state (never reused): a connection to
	 * the bridge goes back only to the pool of the execution it was
	 * opened for, never to a successor for the same sandbox. */
	uint64_t serial;
	/* Idle bridge connections, each verified when opened; freed at stop. */
	struct uvutil_pool *pool;
	uv_poll_t init_poll, bridge_poll;
	bool init_poll_on, bridge_poll_on; /* initialised, not yet closed */
	int polls_open;                    /* closes still to come back */
	bool stopping;
	/* Set before exec_stop when the layer is deleted right after (a
	 * published pause): stop deletes it (no write-back) instead of
	 * unmounting it. */
	bool discard_layer;
	/* Where its start went (microseconds, logged at install): the
	 * sandbox up to its init's exec, the bridge's spawn, then the wait
	 * for both to be ready. */
	int64_t launch_us, spawn_us, ready_us;
	/* The activation's adoption key (guest/hello.h): recorded, so that a
	 * successor of ours can take over the bridge. */
	uint8_t adopt_key[HELLO_PROOF_LEN];
	struct mgr_exec *next;
};

/* One accepted node-api connection, serving its operations in sequence;
 * a relay holds both streams while an admitted operation runs. */
struct mgr_conn {
	struct manager *m;
	uint64_t served;          /* operations done on this connection */
	uint64_t exec_serial;     /* mgr_exec.serial of the bridge in use */
	uv_pipe_t *conn;          /* owned until handed to the relay */
	uv_pipe_t *bridge;        /* owned until handed to the relay */
	struct wire_reader rd;
	uint8_t *pending;         /* bytes after the REQUEST (owned) */
	size_t pending_len;
	json_t *req;              /* the REQUEST (owned) */
	char *decision;           /* an Allow DECISION held back to go out with
	                           * the answer (owned), or NULL */
	char sbx[TT_SBX_ID_LEN + 1];
	uint64_t epoch;           /* lease: identity epoch at admission */
	struct relay *relay;      /* set while relaying */
	uv_connect_t connect;
	struct mgr_conn *next;    /* manager.ops while admitted */
	struct mgr_conn *wnext;   /* manager.waiting while on it */
	bool waiting;             /* on manager.waiting: reading a REQUEST */
	bool streamed;            /* a stream (node-api's WebSocket exec):
	                           * open-ended, cancelled at a retirement */
	bool connecting;          /* admitted, its bridge connection not ready
	                           * yet: on manager.ops already, so that a
	                           * pause's drain waits for it too */
	/* Last: conn_new clears only what precedes it (always filled by a
	 * read before being looked at). */
	uint8_t buf[WIRE_PAYLOAD_MAX + WIRE_HDR_LEN];
};

/* Why an execution was lost while we ran (recover's finds get a generic
 * reason): what a watcher is told. Owned by manager.lost. */
struct mgr_lost {
	char sbx[TT_SBX_ID_LEN + 1];
	uint64_t gen;
	char reason[96];
	bool reactivate;         /* same execution, next activation */
	struct mgr_lost *next;
};

struct manager {
	uv_loop_t *loop;
	char state_dir[1024];      /* bounded so derived paths always fit */
	char sock_path[PATH_MAX];
	char worker_id[TT_NAME_MAX + 1];
	char guest_bin[PATH_MAX];
	char snap_dir[PATH_MAX];   /* snapshot store root; "" = none */
	pid_t peer_pid;
	uid_t peer_uid;
	struct records *db;
	struct capcache *cache;
	/* The feed's pinned root key and order check (lib/feedsig.h): every
	 * update is verified before it is applied (SPEC §7). */
	char feed_key[PASERK_K4_PUBLIC_LEN + 1];
	struct feedsig_state feed;
	struct mgr_exec *execs;
	uint64_t exec_serial;      /* last mgr_exec.serial handed out */
	struct mgr_conn *ops;
	struct mgr_conn *waiting;  /* connections reading their next REQUEST
	                            * (new, or idle between operations) */
	/* node-api's {"op":"watch"} connection: told of every execution lost
	 * (DATA_OUT {"lost":…}), so the cp can relaunch it; at most one */
	struct mgr_conn *watcher;
	struct mgr_lost *lost;
	uv_pipe_t server;
	uv_signal_t sigterm, sigint;
	bool stopping;
	/* The node-api's end of a socketpair (--lifeline): EOF means node-api
	 * is gone or stopping. An unprivileged node-api cannot signal us (we
	 * stay root), so this is how it asks us to shut down. */
	uv_pipe_t lifeline;
	bool lifeline_on;
	int lifeline_fd;           /* --lifeline FD, or -1 */
	/* node-api wrote on the lifeline before closing it: an orderly stop
	 * (sandboxes stop too). EOF alone: node-api died; we leave them
	 * running, for the manager its successor starts (adoption). */
	bool lifeline_stop;
	bool abandon;              /* leaving: nothing is stopped */
	bool own_sock_dir;         /* --private-socket-dir: rmdir it at exit */
	/* A sandbox directory tree made ahead of time (<state>/sandboxes/
	 * .spare), renamed into place by the next create: its mkdirs are off
	 * the create path. Refilled from a timer after each use. */
	char spare_dir[PATH_MAX];
	bool spare_ready;
	/* Likewise a fresh network namespace (creating one is the costliest
	 * part of the sandbox's clone), or -1. */
	int spare_netns;
	bool spare_on;             /* spare_timer initialized */
	/* After a spare failed to come up, refills wait this long (doubling
	 * up to MGR_SPARE_BACKOFF_MAX_MS; 0 after a success) instead of
	 * retrying at once: a launch that keeps failing (pids or user
	 * namespace limits, a guest binary missing mid-upgrade) would
	 * otherwise spin, making a network namespace each time. */
	int64_t spare_backoff_ms;
	int64_t spare_retry_at;    /* now_ms() before which no refill runs */
	uv_timer_t spare_timer;
	/* The spare's layer filesystem (mkfs + mount, ~8 ms) is made on a
	 * libuv worker thread: spare_busy while spare_work is queued; its
	 * result in spare_rc/spare_err (read back on the loop). */
	bool spare_busy;
	uv_work_t spare_work;
	int spare_rc;
	struct tt_err spare_err;
	/* Each sandbox's writable layer: its own filesystem of this size and
	 * inode count (--disk-mb, --disk-inodes; ns_layer.c). */
	uint64_t layer_bytes;
	uint64_t layer_inodes;     /* 0 = one per NS_LAYER_BYTES_PER_INODE */
	/* The mount namespace sandboxes start from (ns_mntns_clean: ours
	 * without the layer mounts), or -1 (then they copy ours). */
	int clean_mntns;
	/* <state>/sandboxes/.layer-template.img: a formatted layer that
	 * spares copy (~1 ms) instead of running mkfs (~5 ms of CPU per
	 * create); remade by the first spare_work of each run (worker
	 * thread), so it always has this run's size. */
	char layer_tmpl[PATH_MAX];
	bool tmpl_ready;           /* written by the worker thread, read by it */
	bool tmpl_usable;          /* tmpl_ready as the loop may rely on it: set
	                            * after a spare_work that had it (the file
	                            * is only read from then on) */
	/* tether-bridge, and one started ahead, waiting for the next
	 * execution (pid 0: none): its spawn, exec and library loading
	 * (~1.5 ms) are off the create path. It exits by itself if we die
	 * (its assignment pipe ends). */
	char bridge_bin[PATH_MAX];
	struct bridge_proc spare_bridge;
	/* A sandbox launched ahead into the spare tree (ns assign_later: the
	 * agent waits for its identity), holding uid slot spare_sb_slot
	 * (kept out of records_free_slot's answers): a fresh create only
	 * assigns it. Its cgroups are "spare<our pid>-g<serial>" until then. */
	struct ns_sandbox spare_sb;
	bool spare_sb_on;
	uint32_t spare_sb_slot;
	uint64_t spare_sb_serial;
	/* Its launch runs on a libuv worker thread (~3 ms that would block
	 * our loop): spare_sb_busy from queueing until the result is taken
	 * (spare_sb_take, on the loop: by the after-work callback, or by a
	 * create that cannot wait for it); the thread fills spare_sb_new and
	 * signals spare_sb_cv under spare_sb_mu. */
	bool spare_sb_busy, spare_sb_done, spare_sb_taken;
	uv_work_t spare_sb_work;
	uv_mutex_t spare_sb_mu;
	uv_cond_t spare_sb_cv;
	struct ns_config spare_sb_cfg;
	char spare_sb_id[32];
	struct ns_sandbox spare_sb_new;
	int spare_sb_rc;
	struct tt_err spare_sb_err;
};

static void exec_stop(struct manager *m, struct mgr_exec *ex);
static int layer_restore(struct manager *m, const struct rec_exec *rec,
                         const char *key, struct tt_err *err);

/* pidfd_open_raw: glibc 2.36 lacks a wrapper in older headers. */
static int pidfd_open_raw(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* pidfd_signal: signals through a pidfd (no pid-reuse race). */
static int pidfd_signal(int pidfd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

/* now_ms: monotonic milliseconds. */
static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* now_us: monotonic microseconds. */
static int64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* exec_find: runtime state of sbx, or NULL. */
static struct mgr_exec *exec_find(struct manager *m, const char *sbx)
{
	for (struct mgr_exec *ex = m->execs; ex; ex = ex->next)
		if (strcmp(ex->sbx, sbx) == 0)
			return ex;
	return NULL;
}

/* sandbox_dir: <state>/sandboxes/<sbx>. */
static int sandbox_dir(const struct manager *m, const char *sbx, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s/sandboxes/%s", m->state_dir, sbx);

	return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* ---- admission ---------------------------------------------------------- */

/* installed_of: the §4 record admission compares against. Anything that is
 * not a running, unretired execution answers as retired (RefreshRoute). */
static struct tt_installed installed_of(const struct rec_exec *r)
{
	struct tt_installed in = { 0 };

	if (r == NULL)
		return in;
	in.present = true;
	in.id = r->id;
	in.retired = r->retired || r->state != REC_RUNNING;
	in.epoch = r->epoch;
	return in;
}

/* cap_op_of: node operation -> capability operation bit (0 = unknown). */
static uint32_t cap_op_of(const char *op)
{
	if (strcmp(op, "exec") == 0)
		return TT_OP_EXEC;
	if (strcmp(op, "fs.read") == 0 || strcmp(op, "fs.stat") == 0 ||
	    strcmp(op, "fs.list") == 0)
		return TT_OP_FS_READ;
	if (strcmp(op, "fs.write") == 0 || strcmp(op, "fs.mkdir") == 0 ||
	    strcmp(op, "fs.remove") == 0)
		return TT_OP_FS_WRITE;
	return 0;
}

/* waiting_add: c now reads its next REQUEST (shutdown closes it). */
static void waiting_add(struct mgr_conn *c)
{
	c->wnext = c->m->waiting;
	c->m->waiting = c;
	c->waiting = true;
}

/* waiting_del: c is no longer waiting for a REQUEST. */
static void waiting_del(struct mgr_conn *c)
{
	struct mgr_conn **pp;

	if (!c->waiting)
		return;
	for (pp = &c->m->waiting; *pp; pp = &(*pp)->wnext)
		if (*pp == c) {
			*pp = c->wnext;
			break;
		}
	c->wnext = NULL;
	c->waiting = false;
}

/* conn_free: releases a connection context and whatever it still owns. */
static void conn_free(struct mgr_conn *c)
{
	struct mgr_conn **pp;

	waiting_del(c);
	if (c->m->watcher == c)
		c->m->watcher = NULL;
	for (pp = &c->m->ops; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	if (c->conn)
		relay_close_free((uv_stream_t *)c->conn);
	if (c->bridge)
		relay_close_free((uv_stream_t *)c->bridge);
	json_decref(c->req);
	free(c->decision);
	free(c->pending);
	free(c);
}

/* conn_fail: tells the opener why (ERROR), then closes. */
static void conn_fail(struct mgr_conn *c, const char *code, const char *msg)
{
	log_warn("operation on %s failed: %s: %s", c->sbx[0] ? c->sbx : "-", code, msg);
	/* node-api reads the DECISION first, always. */
	if (c->decision != NULL)
		relay_write_frame((uv_stream_t *)c->conn, WIRE_DECISION, c->decision,
		                  (uint32_t)strlen(c->decision), NULL);
	relay_error_close((uv_stream_t *)c->conn, code, msg);
	c->conn = NULL;
	conn_free(c);
}

static void conn_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void conn_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

/* conn_refresh: an admitted operation whose execution was replaced before
 * anything of it went to the bridge. If its Allow is still held back, the
 * decision becomes RefreshRoute (SPEC §4: never executed, so the opener
 * rebuilds it); once Allow went out, ERROR refresh_route is all there is. */
static void conn_refresh(struct mgr_conn *c, const struct rec_exec *rec)
{
	struct tt_decision d = { .verdict = TT_REFRESH_ROUTE, .reason = TT_R_RETIRED };
	_cleanup_free_ char *body = NULL;

	if (c->decision == NULL) {
		conn_fail(c, "refresh_route", "execution replaced or retired");
		return;
	}
	d.installed_generation = rec != NULL ? rec->id.gen : 0;
	body = decision_body_json(&d, c->sbx);
	free(c->decision);
	c->decision = NULL;
	if (body != NULL)
		relay_write_frame((uv_stream_t *)c->conn, WIRE_DECISION, body,
		                  (uint32_t)strlen(body), NULL);
	metrics_inc("tether_admission_total", "decision=\"refresh_route\",reason=\"retired\"");
	relay_close_after_writes((uv_stream_t *)c->conn);
	c->conn = NULL;
	conn_free(c);
}

/* ops_unlink: the connection's operation holds no lease any more. */
static void ops_unlink(struct mgr_conn *c)
{
	struct mgr_conn **pp;

	for (pp = &c->m->ops; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	c->next = NULL;
}

/* bridge_pool_of: the pool a bridge connection opened for execution
 * serial of sbx goes back to, or NULL when that execution is no longer
 * the running one (retired, replaced, stopping). */
static struct uvutil_pool *bridge_pool_of(struct manager *m, const char *sbx,
                                          uint64_t serial, uint64_t epoch)
{
	const struct rec_exec *rec = records_get(m->db, sbx);
	struct mgr_exec *ex = exec_find(m, sbx);

	if (ex == NULL || ex->stopping || ex->serial != serial || rec == NULL ||
	    rec->epoch != epoch || rec->retired || rec->state != REC_RUNNING)
		return NULL;
	return ex->pool;
}

/* relay_kept: an admitted operation ended. After a clean end the bridge
 * connection goes back to its execution's pool and node-api's connection
 * waits for the next REQUEST; otherwise the relay closed both. */
static void relay_kept(struct relay *r, enum relay_end how, const char *msg,
                       struct relay_kept *kept, void *data)
{
	struct mgr_conn *c = data;

	(void)r;
	c->relay = NULL;
	if (kept == NULL) {
		if (how != RELAY_DONE)
			log_info("operation on %s ended: %s: %s", c->sbx, relay_end_name(how),
			         msg);
		conn_free(c);
		return;
	}
	ops_unlink(c);
	if (kept->far != NULL)
		uvutil_pool_put(bridge_pool_of(c->m, c->sbx, c->exec_serial, c->epoch),
		                kept->far);
	json_decref(c->req);
	free(c->pending);
	c->req = NULL;
	c->pending = NULL;
	c->pending_len = 0;
	c->sbx[0] = '\0';
	c->served++;
	c->conn = (uv_pipe_t *)kept->opener;
	relay_kept_reader(kept, &c->rd);
	c->conn->data = c;
	if (uv_read_start((uv_stream_t *)c->conn, conn_alloc_cb, conn_read_cb) < 0) {
		conn_free(c);
		return;
	}
	waiting_add(c);
}

/* bridge_forward: the bridge connection is verified (now or when it was
 * opened): forward the REQUEST without its token and relay. */
static void bridge_forward(struct mgr_conn *c)
{
	struct manager *m = c->m;
	struct tt_err err = { 0 };
	struct wire_out first;

	/* Meant for us: the bridge and guest get the operation only. */
	json_object_del(c->req, "token");
	json_object_del(c->req, "allow_with_answer");
	c->streamed = json_is_true(json_object_get(c->req, "stream"));
	json_object_del(c->req, "stream");
	if (relay_write_json((uv_stream_t *)c->bridge, WIRE_REQUEST, c->req, &err) < 0) {
		conn_fail(c, "transport", err.msg);
		return;
	}
	if (c->decision != NULL)
		first = (struct wire_out){ WIRE_DECISION, c->decision,
		                           (uint32_t)strlen(c->decision) };
	c->relay = relay_start_keep((uv_stream_t *)c->conn, (uv_stream_t *)c->bridge,
	                            c->pending, c->pending_len,
	                            c->decision != NULL ? &first : NULL, relay_kept, c, &err);
	if (c->relay == NULL) {
		conn_fail(c, "internal", err.msg);
		return;
	}
	free(c->decision); /* the relay copied it */
	c->decision = NULL;
	c->conn = NULL; /* the relay owns both streams now */
	c->bridge = NULL;
	if (!c->connecting) {
		c->next = m->ops;
		m->ops = c;
	}
	c->connecting = false;
}

/* bridge_connected: verify the bridge, re-check the lease, forward the
 * REQUEST without its token and start relaying. */
static void bridge_connected(uv_connect_t *req, int status)
{
	struct mgr_conn *c = req->data;
	struct manager *m = c->m;
	const struct rec_exec *rec = records_get(m->db, c->sbx);
	struct mgr_exec *ex = exec_find(m, c->sbx);
	uv_os_fd_t fd;
	char why[160];
	struct tt_err err = { 0 };
	const char *reason;

	if (status < 0) {
		snprintf(why, sizeof(why), "cannot reach the bridge: %s", uv_strerror(status));
		conn_fail(c, "transport", why);
		return;
	}
	/* The execution may have been replaced or stopped while connecting
	 * (a pause's retirement alone does not count: the operation was
	 * admitted before it, and the pause's drain waits for it). Nothing
	 * went to the bridge: an Allow not yet sent becomes RefreshRoute. */
	if (rec == NULL || ex == NULL || ex->stopping || ex->serial != c->exec_serial ||
	    rec->epoch != c->epoch || rec->state != REC_RUNNING) {
		conn_refresh(c, rec);
		return;
	}
	if (uv_fileno((uv_handle_t *)c->bridge, &fd) < 0) {
		conn_fail(c, "internal", "bridge connection has no fd");
		return;
	}
	/* Whatever listens at bridge.sock must be the process pinned at
	 * spawn (SPEC §5) before a single byte of the operation goes out. */
	if (verify_peer(fd, &ex->bridge_id, &err) < 0) {
		char msg[300], labels[64];

		reason = bridge_refusal_reason(&err);
		snprintf(msg, sizeof(msg), "bridge verification failed: %s", err.msg);
		snprintf(labels, sizeof(labels), "reason=\"%s\"", reason);
		log_warn("refused bridge of %s (%s): %s", c->sbx, reason, err.msg);
		metrics_inc("tether_bridge_verify_failed_total", NULL);
		metrics_inc("tether_bridge_refusals_total", labels);
		conn_fail(c, "transport", msg);
		return;
	}
	bridge_forward(c);
}

/* decision_may_wait: an Allow for op may go out with the answer (one
 * wake-up of node-api instead of two): the file operations that send no
 * input, whose opener just waits for the answer, and an exec whose opener
 * said so ("allow_with_answer": an HTTP exec without stdin). A streamed
 * exec shows its decision at once, and fs.write (node-api streams the
 * body only once allowed) gets its at once. */
static bool decision_may_wait(const char *op, const json_t *req)
{
	if (strcmp(op, "exec") == 0)
		return json_is_true(json_object_get(req, "allow_with_answer"));
	return strcmp(op, "fs.read") == 0 || strcmp(op, "fs.stat") == 0 ||
	       strcmp(op, "fs.list") == 0 || strcmp(op, "fs.mkdir") == 0 ||
	       strcmp(op, "fs.remove") == 0;
}

/* handle_data_op: admission, DECISION, then (allowed) connect the bridge. */
static void handle_data_op(struct mgr_conn *c)
{
	struct manager *m = c->m;
	const char *token = json_string_value(json_object_get(c->req, "token"));
	const char *sbx = json_string_value(json_object_get(c->req, "sbx"));
	const char *op = json_string_value(json_object_get(c->req, "op"));
	const struct rec_exec *rec;
	struct mgr_exec *ex;
	struct tt_installed inst;
	struct tt_request rq = { 0 };
	struct tt_decision d;
	_cleanup_free_ char *body = NULL;
	char labels[128], path[PATH_MAX];

	if (sbx == NULL || !sbx_id_valid(sbx) || op == NULL || cap_op_of(op) == 0) {
		conn_fail(c, "bad_request", "request needs a valid sbx and a known op");
		return;
	}
	snprintf(c->sbx, sizeof(c->sbx), "%s", sbx);
	rec = records_get(m->db, sbx);
	inst = installed_of(rec);
	rq.receiver = TT_RCV_NODE;
	rq.sbx = sbx;
	rq.op = cap_op_of(op);
	rq.new_open = true;
	if (token == NULL)
		token = "";
	d = cap_admit(m->cache, records_keys(m->db), token, strlen(token), NULL, 0, &rq,
	              &inst, tt_now(), NULL);
	snprintf(labels, sizeof(labels), "decision=\"%s\",reason=\"%s\"",
	         decision_verdict_name(d.verdict), decision_reason_name(d.reason));
	metrics_inc("tether_admission_total", labels);
	body = decision_body_json(&d, sbx);
	if (body == NULL) {
		conn_fail(c, "internal", "cannot encode the decision");
		return;
	}
	if (d.verdict == TT_ALLOW && decision_may_wait(op, c->req)) {
		c->decision = tt_steal_ptr(&body);
	} else {
		relay_write_frame((uv_stream_t *)c->conn, WIRE_DECISION, body,
		                  (uint32_t)strlen(body), NULL);
	}
	if (d.verdict != TT_ALLOW) {
		/* Never the token: only what the decision says. */
		log_info("admission refused: sbx=%s op=%s decision=%s reason=%s", sbx, op,
		         decision_verdict_name(d.verdict), decision_reason_name(d.reason));
		relay_close_after_writes((uv_stream_t *)c->conn);
		c->conn = NULL;
		conn_free(c);
		return;
	}
	c->epoch = rec->epoch;
	ex = exec_find(m, sbx);
	c->exec_serial = ex != NULL ? ex->serial : 0;
	/* in flight from now on: a pause's drain counts it */
	c->connecting = true;
	c->next = m->ops;
	m->ops = c;
	if (ex != NULL && !ex->stopping) {
		/* Admitted just now against the durable record; an idle
		 * connection reaches the bridge pinned for this execution,
		 * verified when it was opened. */
		c->bridge = (uv_pipe_t *)uvutil_pool_get(ex->pool);
		if (c->bridge != NULL) {
			bridge_forward(c);
			return;
		}
	}
	if (ex == NULL || sandbox_dir(m, sbx, path, sizeof(path) - sizeof("/bridge.sock")) < 0) {
		conn_fail(c, "transport", "no bridge for this execution");
		return;
	}
	strcat(path, "/bridge.sock");
	c->bridge = malloc(sizeof(*c->bridge));
	if (c->bridge == NULL || uv_pipe_init(m->loop, c->bridge, 0) < 0) {
		free(c->bridge);
		c->bridge = NULL;
		conn_fail(c, "internal", "out of memory");
		return;
	}
	c->connect.data = c;
	/* Any length of state path (unixaddr.h). */
	uvutil_pipe_connect(&c->connect, c->bridge, path, bridge_connected);
}

/* ---- feed apply --------------------------------------------------------- */

/* rm_cb: nftw callback removing one entry (bottom-up, no symlink follow). */
static int rm_cb(const char *p, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (type == FTW_DP)
		return rmdir(p) < 0 && errno != ENOENT ? -1 : 0;
	return unlink(p) < 0 && errno != ENOENT ? -1 : 0;
}

/* remove_tree: deletes a sandbox directory; its layer filesystem is
 * unmounted and its image deleted first (nftw stays on the directory's
 * own filesystem, so a layer still mounted would be left behind, files
 * and loop device included); never follows symlinks planted by the
 * sandbox. */
static int remove_tree(const char *path)
{
	struct tt_err err = { 0 };

	if (access(path, F_OK) < 0)
		return 0;
	if (ns_layer_remove(path, &err) < 0) {
		log_warn("removing %s: %s", path, err.msg);
		errno = EBUSY;
		return -1;
	}
	return nftw(path, rm_cb, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* layer_unmount_of: unmounts the layer of sbx (the image stays): done
 * whenever its execution stops, so a layer is mounted only while an
 * execution runs on it (or it is the spare's). */
static void layer_unmount_of(struct manager *m, const char *sbx)
{
	struct tt_err err = { 0 };
	char dir[PATH_MAX];

	if (sandbox_dir(m, sbx, dir, sizeof(dir)) == 0 && ns_layer_umount(dir, &err) < 0)
		log_warn("unmounting the layer of %s: %s", sbx, err.msg);
}

/* exec_poll_close_cb: frees the runtime once both watchers closed. */
static void exec_poll_close_cb(uv_handle_t *h)
{
	struct mgr_exec *ex = h->data;

	if (--ex->polls_open == 0)
		free(ex);
}

/* exec_free: frees ex once libuv is done with the poll handles that were
 * initialised (at once when none was): freeing it under a handle still
 * on the loop's closing list would be a use after free. */
static void exec_free(struct mgr_exec *ex)
{
	ex->polls_open = (int)ex->init_poll_on + (int)ex->bridge_poll_on;
	if (ex->polls_open == 0) {
		free(ex);
		return;
	}
	if (ex->init_poll_on)
		uv_close((uv_handle_t *)&ex->init_poll, exec_poll_close_cb);
	if (ex->bridge_poll_on)
		uv_close((uv_handle_t *)&ex->bridge_poll, exec_poll_close_cb);
	ex->init_poll_on = ex->bridge_poll_on = false;
}

/* cancel_leases: every stream opened under sbx's current epoch stops now
 * and its opener is told to refresh the route (SPEC §6). */
static void cancel_leases(struct manager *m, const char *sbx)
{
	struct mgr_conn *c = m->ops, *next;

	for (; c; c = next) {
		next = c->next;
		if (strcmp(c->sbx, sbx) == 0 && c->relay != NULL) {
			metrics_inc("tether_streams_cancelled_total", "reason=\"epoch\"");
			relay_abort(c->relay, "refresh_route", "execution retired or replaced");
		}
	}
}

/* cancel_input_streams: at a pause's retirement, the streams with open
 * input (exec with "stdin": interactive, open-ended) lose their lease at
 * once (SPEC §6/§7): input and output stop, the client is told
 * refresh_route. Every other operation in flight — an exec streamed
 * without stdin included: bounded by its command like an HTTP exec — may
 * still finish during the drain, so what it did and acknowledged is in
 * the snapshot, and a short command never notices the pause. */
static void cancel_input_streams(struct manager *m, const char *sbx)
{
	struct mgr_conn *c = m->ops, *next;

	for (; c; c = next) {
		next = c->next;
		if (strcmp(c->sbx, sbx) != 0 || c->relay == NULL ||
		    !json_is_true(json_object_get(c->req, "stdin")))
			continue;
		metrics_inc("tether_streams_cancelled_total", "reason=\"epoch\"");
		relay_abort(c->relay, "refresh_route", "execution retired for a pause");
	}
}

/* bridge_kill: SIGTERM, a short grace, then SIGKILL; reaps our child. */
static void bridge_kill(struct mgr_exec *ex)
{
	int64_t deadline = now_ms() + 1000;

	if (ex->bridge_pidfd < 0)
		return;
	pidfd_signal(ex->bridge_pidfd, SIGTERM);
	while (ex->own_children && now_ms() < deadline) {
		if (waitpid(ex->bridge_pid, NULL, WNOHANG) != 0)
			return;
		usleep(5000);
	}
	pidfd_signal(ex->bridge_pidfd, SIGKILL);
	if (ex->own_children)
		waitpid(ex->bridge_pid, NULL, 0);
}

/* exec_stop: stops the bridge and the sandbox of one execution and drops
 * its runtime state (the durable record is the caller's business). */
static void exec_stop(struct manager *m, struct mgr_exec *ex)
{
	struct mgr_exec **pp;
	struct tt_err err = { 0 };

	if (ex->stopping)
		return;
	ex->stopping = true;
	cancel_leases(m, ex->sbx);
	uvutil_pool_free(ex->pool);
	ex->pool = NULL;
	for (pp = &m->execs; *pp; pp = &(*pp)->next)
		if (*pp == ex) {
			*pp = ex->next;
			break;
		}
	if (ex->bridge_poll_on)
		uv_poll_stop(&ex->bridge_poll);
	if (ex->init_poll_on)
		uv_poll_stop(&ex->init_poll);
	bridge_kill(ex);
	if (ns_sandbox_stop(&ex->sb, &err) < 0)
		log_warn("stopping sandbox %s: %s", ex->sbx, err.msg);
	/* The sandbox is dead (its mount namespace with it): release its
	 * layer's mount and loop device; its files stay in the image,
	 * unless the caller deletes the layer anyway. */
	if (ex->discard_layer) {
		char dir[PATH_MAX];

		if (sandbox_dir(m, ex->sbx, dir, sizeof(dir)) == 0 &&
		    ns_layer_remove(dir, &err) < 0)
			log_warn("removing the layer of %s: %s", ex->sbx, err.msg);
	} else {
		layer_unmount_of(m, ex->sbx);
	}
	if (ex->bridge_pidfd >= 0)
		close(ex->bridge_pidfd);
	ex->bridge_pidfd = -1;
	exec_free(ex);
}

/* mark_state: persists a new state for sbx (best effort, logged). */
static void mark_state(struct manager *m, const char *sbx, enum rec_state st)
{
	const struct rec_exec *cur = records_get(m->db, sbx);
	struct rec_exec e;
	struct tt_err err = { 0 };

	if (cur == NULL || cur->state == st)
		return;
	e = *cur;
	e.state = st;
	if (records_put(m->db, &e, 0, &err) < 0)
		log_error("persisting state of %s: %s", sbx, err.msg);
}

static void lost_note(struct manager *m, const struct rec_exec *r,
                      const char *reason, bool reactivate);
static void lost_forget(struct manager *m, const char *sbx);

/* exec_died_cb: the sandbox init or the bridge exited on its own: the
 * execution is lost (admission answers RefreshRoute from now on). */
static void exec_died_cb(uv_poll_t *p, int status, int events)
{
	struct mgr_exec *ex = p->data;
	struct manager *m = ex->m;
	bool init_died = p == &ex->init_poll;
	const struct rec_exec *r;
	char sbx[TT_SBX_ID_LEN + 1];

	(void)status;
	(void)events;
	log_warn("execution %s lost: its %s exited", ex->sbx,
	         init_died ? "sandbox init" : "bridge");
	snprintf(sbx, sizeof(sbx), "%s", ex->sbx);
	mark_state(m, sbx, REC_LOST);
	exec_stop(m, ex); /* ex is gone from here */
	/* its layer stays: the cp re-activates it in place (SPEC §7) */
	r = records_get(m->db, sbx);
	if (r != NULL && !r->retired && r->state == REC_LOST)
		lost_note(m, r, init_died ? "its guest agent (the sandbox init) "
		          "exited" : "its host bridge exited", true);
}

/* exec_watch: starts the pidfd watchers and links the runtime state. */
static int exec_watch(struct manager *m, struct mgr_exec *ex, struct tt_err *err)
{
	ex->init_poll.data = ex;
	ex->bridge_poll.data = ex;
	if (uv_poll_init(m->loop, &ex->init_poll, ex->sb.pidfd) < 0)
		return tt_err_set(err, TT_ERR_SYS, "cannot watch the sandbox init");
	ex->init_poll_on = true; /* closed by exec_free, even on failure */
	if (uv_poll_init(m->loop, &ex->bridge_poll, ex->bridge_pidfd) < 0)
		return tt_err_set(err, TT_ERR_SYS, "cannot watch the bridge");
	ex->bridge_poll_on = true;
	uv_poll_start(&ex->init_poll, UV_READABLE, exec_died_cb);
	uv_poll_start(&ex->bridge_poll, UV_READABLE, exec_died_cb);
	ex->next = m->execs;
	m->execs = ex;
	return 0;
}

/* bridge_pin: records the identity of the bridge that just said ready (our
 * child: its pid cannot be reused before we reap it) and checks that it
 * runs the binary we exec'd. */
static int bridge_pin(struct mgr_exec *ex, const char *bin, struct tt_err *err)
{
	struct stat st;

	if (procid_pin(ex->bridge_pid, &ex->bridge_id, NULL, err) < 0)
		return -1;
	if (stat(bin, &st) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "stat %s", bin);
	if (st.st_dev != ex->bridge_id.exe_dev || st.st_ino != ex->bridge_id.exe_ino)
		return tt_err_set(err, TT_ERR_VERIFY, "bridge pid %d does not run %s",
		                  (int)ex->bridge_pid, bin);
	ex->bridge_start = ex->bridge_id.start_time;
	return 0;
}

static void spare_kick(struct manager *m);
static void spare_failed(struct manager *m);
static void spare_sb_launch(struct manager *m);
static void spare_sb_take(struct manager *m);

/* bridge_take: a bridge for one execution: the spare started ahead (its
 * spawn and library loading off the create path) or, without one, a new
 * one; assigned its execution (the activation secret included), not yet
 * waited for. ex gets its pid and pidfd; *bp keeps the readiness pipe for
 * bridge_finish. Nothing is left running on failure. */
static int bridge_take(struct manager *m, struct mgr_exec *ex, const char *dir,
                       const struct rec_exec *rec, const uint8_t secret[NS_SECRET_LEN],
                       struct bridge_proc *bp, struct tt_err *err)
{
	struct bridge_assignment a = {
		.sbx = rec->id.sbx, .gen = rec->id.gen, .att = rec->id.att,
		.guest_socket = ex->sb.guest_socket, .init_pid = ex->sb.init_pid,
		.init_start = ex->sb.init_start_time, .secret = secret,
	};
	char sock[PATH_MAX];
	struct tt_err e2 = { 0 };

	/* The bridge binds it at any length (unixaddr.h). */
	if ((size_t)snprintf(sock, sizeof(sock), "%s/bridge.sock", dir) >= sizeof(sock))
		return tt_err_set(err, TT_ERR_INVALID, "bridge socket path too long");
	unlink(sock);
	a.listen_path = sock;
	*bp = m->spare_bridge;
	m->spare_bridge = (struct bridge_proc){ .pid = 0, .pidfd = -1, .assign_fd = -1,
	                                        .ready_fd = -1 };
	if (bp->pid > 0) {
		spare_kick(m);
		/* Not one that died waiting (killed from outside), nor one
		 * running a tether-bridge replaced since (an upgrade):
		 * bridge_pin would refuse it. */
		if (!bridgectl_alive(bp))
			log_warn("spare bridge pid %d exited while waiting; starting a new one",
			         (int)bp->pid);
		else if (!bridgectl_runs(bp, m->bridge_bin))
			log_info("spare bridge pid %d runs a replaced %s: starting a new one",
			         (int)bp->pid, m->bridge_bin);
		else if (bridgectl_assign(bp, &a, &e2) == 0)
			goto assigned;
		else
			log_warn("spare bridge: %s; starting a new one", e2.msg);
		bridgectl_discard(bp);
	}
	if (bridgectl_spawn(m->bridge_bin, bp, err) < 0)
		return -1;
	if (bridgectl_assign(bp, &a, err) < 0) {
		bridgectl_discard(bp);
		return -1;
	}
assigned:
	ex->bridge_pid = bp->pid;
	ex->bridge_pidfd = bp->pidfd;
	bp->pidfd = -1; /* ex's now */
	return 0;
}

/* bridge_abort: kills a bridge that did not (or will not) finish starting. */
static void bridge_abort(struct mgr_exec *ex)
{
	bridge_kill(ex);
	if (ex->bridge_pidfd >= 0)
		close(ex->bridge_pidfd);
	ex->bridge_pidfd = -1;
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

/* bridge_finish: the assigned bridge's "ready" (it listens), then its
 * identity pinned (SPEC §5). Consumes bp's readiness pipe; on failure the
 * bridge is gone. */
static int bridge_finish(struct manager *m, struct mgr_exec *ex, struct bridge_proc *bp,
                         struct tt_err *err)
{
	bp->pidfd = ex->bridge_pidfd; /* for the wait only: ex keeps it */
	if (bridgectl_wait_ready(bp, MGR_BRIDGE_READY_MS, err) < 0 ||
	    bridge_pin(ex, m->bridge_bin, err) < 0) {
		bridge_abort(ex);
		return -1;
	}
	return 0;
}

static void shutdown_all(struct manager *m);

/* spare_work: the spare tree and its layer filesystem (worker thread:
 * touches only the spare's directory and the spare_* results). */
static void spare_work(uv_work_t *w)
{
	struct manager *m = w->data;

	tt_err_clear(&m->spare_err);
	m->spare_rc = -1;
	if (!m->tmpl_ready) {
		struct tt_err e = { 0 };

		m->tmpl_ready = ns_layer_template(m->layer_tmpl, m->layer_bytes,
		                                  m->layer_inodes, &e) == 0;
		if (!m->tmpl_ready)
			log_warn("no layer template (spares run mkfs): %s", e.msg);
	}
	if (remove_tree(m->spare_dir) < 0)
		tt_err_sys(&m->spare_err, TT_ERR_IO, "removing the old %s", m->spare_dir);
	else if (ns_sandbox_dirs_spare(m->spare_dir, &m->spare_err) == 0 &&
	         (m->tmpl_ready ? ns_layer_make_from(m->spare_dir, m->layer_tmpl, &m->spare_err)
	                        : ns_layer_make(m->spare_dir, m->layer_bytes, m->layer_inodes,
	                                        &m->spare_err)) == 0)
		m->spare_rc = 0;
}

/* spare_after_work: back on the loop: the spare is ready, or removed
 * (failed, or the manager is stopping and nobody will claim it). */
static void spare_after_work(uv_work_t *w, int status)
{
	struct manager *m = w->data;

	m->spare_busy = false;
	m->tmpl_usable = m->tmpl_ready; /* the work is done: no race */
	if (status == 0 && m->spare_rc == 0 && !m->stopping) {
		m->spare_ready = true;
		spare_kick(m); /* its sandbox next */
		return;
	}
	if (!m->stopping)
		log_warn("spare sandbox directory: %s", status < 0 ? uv_strerror(status)
		                                                   : m->spare_err.msg);
	if (remove_tree(m->spare_dir) < 0)
		log_warn("removing %s: %s", m->spare_dir, strerror(errno));
	spare_failed(m);
	spare_kick(m);
}

/* spare_refill_cb: makes whatever spare is missing (loop idle time). */
static void spare_refill_cb(uv_timer_t *t)
{
	struct manager *m = t->data;
	struct tt_err err = { 0 };
	bool stuck = false;

	if (m->stopping)
		return;
	if (!m->spare_ready && !m->spare_busy) {
		m->spare_work.data = m;
		if (uv_queue_work(m->loop, &m->spare_work, spare_work, spare_after_work) == 0)
			m->spare_busy = true;
	}
	if (m->spare_bridge.pid == 0 && m->bridge_bin[0] &&
	    bridgectl_spawn(m->bridge_bin, &m->spare_bridge, &err) < 0) {
		log_warn("spare bridge: %s", err.msg); /* creates spawn their own */
		spare_failed(m);
	}
	if (m->spare_netns < 0 && !m->spare_sb_on) {
		m->spare_netns = ns_netns_make(&stuck, &err);
		if (stuck) {
			log_error("%s", err.msg);
			shutdown_all(m);
			return;
		} else if (m->spare_netns < 0) {
			log_warn("spare network namespace: %s", err.msg);
			spare_failed(m);
			spare_kick(m);
			return;
		}
	}
	spare_sb_launch(m);
}

/* spare_kick: schedules a refill right after the current loop iteration,
 * or once a failure's backoff is over. */
static void spare_kick(struct manager *m)
{
	int64_t wait = m->spare_retry_at - now_ms();

	if (m->spare_on && !m->stopping)
		uv_timer_start(&m->spare_timer, spare_refill_cb, wait > 0 ? (uint64_t)wait : 0, 0);
}

/* spare_failed: a spare did not come up: the next refills back off. */
static void spare_failed(struct manager *m)
{
	m->spare_backoff_ms = m->spare_backoff_ms == 0 ? MGR_SPARE_BACKOFF_MIN_MS :
	                      m->spare_backoff_ms * 2 > MGR_SPARE_BACKOFF_MAX_MS ?
	                      MGR_SPARE_BACKOFF_MAX_MS : m->spare_backoff_ms * 2;
	m->spare_retry_at = now_ms() + m->spare_backoff_ms;
}

/* spare_succeeded: a spare came up: refills run at once again. */
static void spare_succeeded(struct manager *m)
{
	m->spare_backoff_ms = 0;
	m->spare_retry_at = 0;
}

/* exec_cfg: what every sandbox of ours shares: the agent, the uid range
 * of slot, the layer's cap, and the spare netns (then consumed: the caller
 * closes it) and the clean mount namespace when there are. */
static void exec_cfg(struct manager *m, struct ns_config *cfg, const char *dir,
                     uint32_t slot)
{
	cfg->sandbox_dir = dir;
	cfg->guest_bin = m->guest_bin;
	/* Each slot gets its own host uid range, never overlapping another
	 * sandbox's (and never host root). */
	cfg->uid_base = MGR_UID_BASE + MGR_UID_COUNT * slot;
	cfg->uid_count = MGR_UID_COUNT;
	/* The layer's cap: the spare's filesystem, or one made now (copied
	 * from the template once there is one). */
	cfg->layer_bytes = m->layer_bytes;
	cfg->layer_inodes = m->layer_inodes;
	cfg->layer_template = m->tmpl_usable ? m->layer_tmpl : NULL;
	if (m->spare_netns >= 0) {
		cfg->use_netns = true;
		cfg->netns_fd = m->spare_netns;
	}
	if (m->clean_mntns >= 0) {
		cfg->use_mntns = true;
		cfg->mntns_fd = m->clean_mntns;
	}
}

/* spare_sb_stop: stops the spare sandbox, if any (its slot is free again). */
static void spare_sb_stop(struct manager *m)
{
	struct tt_err err = { 0 };

	if (!m->spare_sb_on)
		return;
	if (ns_sandbox_stop(&m->spare_sb, &err) < 0)
		log_warn("stopping the spare sandbox: %s", err.msg);
	ns_sandbox_init(&m->spare_sb);
	m->spare_sb_on = false;
}

/* spare_sb_work_cb: the launch (worker thread: touches only spare_sb_new,
 * spare_sb_rc/err and the spare tree, whose claims wait for it). */
static void spare_sb_work_cb(uv_work_t *w)
{
	struct manager *m = w->data;
	struct tt_err err = { 0 };
	int rc = ns_sandbox_launch(&m->spare_sb_cfg, &m->spare_sb_new, &err);

	uv_mutex_lock(&m->spare_sb_mu);
	m->spare_sb_rc = rc;
	m->spare_sb_err = err;
	m->spare_sb_done = true;
	uv_cond_signal(&m->spare_sb_cv);
	uv_mutex_unlock(&m->spare_sb_mu);
}

/* spare_sb_take: back on the loop, the launch's result (waiting for it if
 * it is still running: a create needs the spare tree): the spare sandbox
 * is up, or the failure logged. */
static void spare_sb_take(struct manager *m)
{
	if (!m->spare_sb_busy || m->spare_sb_taken)
		return;
	/* Not started yet (every pool thread busy, e.g. with snapshots):
	 * cancelled rather than waited for with the loop blocked; the
	 * create makes its own. spare_sb_after_cb still runs (ECANCELED). */
	if (uv_cancel((uv_req_t *)&m->spare_sb_work) == 0) {
		m->spare_sb_taken = true;
		close(m->spare_netns); /* the launch would have used it */
		m->spare_netns = -1;
		log_info("%s", "spare sandbox launch had not started: cancelled");
		return;
	}
	uv_mutex_lock(&m->spare_sb_mu);
	while (!m->spare_sb_done)
		uv_cond_wait(&m->spare_sb_cv, &m->spare_sb_mu);
	uv_mutex_unlock(&m->spare_sb_mu);
	m->spare_sb_taken = true;
	close(m->spare_netns); /* used up either way */
	m->spare_netns = -1;
	if (m->spare_sb_rc < 0) {
		log_warn("spare sandbox: %s (creates launch their own)", m->spare_sb_err.msg);
		spare_failed(m);
		spare_kick(m);
		return;
	}
	spare_succeeded(m);
	spare_kick(m);
	m->spare_sb = m->spare_sb_new;
	m->spare_sb_on = true;
	if (m->stopping)
		spare_sb_stop(m);
}

/* spare_sb_after_cb: the launch is done (or was cancelled at stop). */
static void spare_sb_after_cb(uv_work_t *w, int status)
{
	struct manager *m = w->data;

	if (status == UV_ECANCELED) { /* never ran: nothing was launched */
		m->spare_sb_rc = -1;
		tt_err_set(&m->spare_sb_err, TT_ERR_SYS, "launch cancelled");
		m->spare_sb_done = true;
	}
	spare_sb_take(m); /* a no-op after a cancel: spare_sb_take did it */
	m->spare_sb_busy = false;
	spare_kick(m);
}

/* spare_sb_launch: a sandbox into the ready spare tree, waiting for its
 * execution (~3 ms, between creates instead of on one, on a worker
 * thread). It takes the spare netns and reserves the lowest free slot. */
static void spare_sb_launch(struct manager *m)
{
	if (m->spare_sb_on || m->spare_sb_busy || !m->spare_ready || m->spare_busy ||
	    m->stopping || m->spare_netns < 0)
		return;
	m->spare_sb_slot = records_free_slot(m->db);
	snprintf(m->spare_sb_id, sizeof(m->spare_sb_id), "spare%d", (int)getpid());
	memset(&m->spare_sb_cfg, 0, sizeof(m->spare_sb_cfg));
	m->spare_sb_cfg.sbx_id = m->spare_sb_id;
	m->spare_sb_cfg.gen = ++m->spare_sb_serial;
	m->spare_sb_cfg.att = 1;
	m->spare_sb_cfg.assign_later = true;
	exec_cfg(m, &m->spare_sb_cfg, m->spare_dir, m->spare_sb_slot);
	ns_sandbox_init(&m->spare_sb_new);
	m->spare_sb_done = m->spare_sb_taken = false;
	m->spare_sb_work.data = m;
	if (uv_queue_work(m->loop, &m->spare_sb_work, spare_sb_work_cb, spare_sb_after_cb) == 0)
		m->spare_sb_busy = true;
}

/* spare_claim: renames the spare tree to dir if dir does not exist yet (a
 * restore or a retry keeps its own), then schedules a refill. Best effort:
 * without a spare, the sandbox start makes the directories itself. The
 * spare sandbox running in it goes to *sb when sb is given and it still
 * runs (the caller assigns it, in the slot it holds); otherwise it is
 * stopped first. Returns whether *sb got it. */
static bool spare_claim(struct manager *m, const char *dir, struct ns_sandbox *sb)
{
	struct pollfd pf;

	/* A launch into the tree still running: its result first (the
	 * wait is what is left of ~3 ms, once in a while). */
	spare_sb_take(m);
	pf = (struct pollfd){ .fd = m->spare_sb.pidfd, .events = POLLIN };
	if (!m->spare_ready || m->spare_busy || m->stopping) {
		if (!m->stopping && access(dir, F_OK) < 0)
			log_info("no spare ready for %s: its layer is made on the create path",
			         dir);
		return false;
	}
	if (access(dir, F_OK) == 0)
		return false; /* dir is there already: the spare stays */
	if (m->spare_sb_on && (sb == NULL || poll(&pf, 1, 0) != 0 ||
	                       !procid_runs_file(m->spare_sb.init_pid, m->guest_bin))) {
		/* Dead, or an agent from before an upgrade of tether-guest
		 * (a create must get the current one, as bridges do). */
		if (sb != NULL)
			log_warn("the spare sandbox (init pid %d) %s", (int)m->spare_sb.init_pid,
			         poll(&pf, 1, 0) != 0 ? "exited while waiting"
			                              : "runs a replaced tether-guest: not used");
		spare_sb_stop(m);
	}
	if (renameat2(AT_FDCWD, m->spare_dir, AT_FDCWD, dir, RENAME_NOREPLACE) < 0) {
		if (errno == EEXIST)
			return false;
		log_warn("renaming %s to %s: %s", m->spare_dir, dir, strerror(errno));
		spare_sb_stop(m);
		remove_tree(m->spare_dir);
	}
	m->spare_ready = false;
	spare_kick(m);
	if (!m->spare_sb_on)
		return false;
	*sb = m->spare_sb;
	ns_sandbox_init(&m->spare_sb);
	m->spare_sb_on = false;
	return true;
}

/* spare_init: fresh spares (a tree left by an earlier run is made again). */
static void spare_init(struct manager *m)
{
	snprintf(m->spare_dir, sizeof(m->spare_dir), "%s/sandboxes/.spare", m->state_dir);
	snprintf(m->layer_tmpl, sizeof(m->layer_tmpl), "%s/sandboxes/.layer-template.img",
	         m->state_dir);
	remove_tree(m->spare_dir);
	/* Cgroups of spare sandboxes whose manager died (they ended with
	 * it: their agent read EOF); ours are named after our pid. */
	ns_cgroup_sweep("spare");
	/* Once, before any launch can use them (glibc's cannot fail). */
	if (uv_mutex_init(&m->spare_sb_mu) != 0 || uv_cond_init(&m->spare_sb_cv) != 0) {
		log_warn("%s", "no spare sandboxes: cannot make their mutex");
		return;
	}
	uv_timer_init(m->loop, &m->spare_timer);
	m->spare_timer.data = m;
	m->spare_on = true;
	spare_kick(m);
}

/* exec_runtime_init: what every runtime state starts with, started here
 * or adopted after a restart: its owner, a serial never handed out before,
 * and its (empty) pool of bridge connections (NULL when out of memory:
 * then none is kept). */
static void exec_runtime_init(struct manager *m, struct mgr_exec *ex)
{
	ex->m = m;
	ex->serial = ++m->exec_serial;
	ex->pool = uvutil_pool_new(m->loop, MGR_POOL_IDLE_MAX, MGR_POOL_IDLE_MS);
}

/* exec_start: starts the sandbox and its bridge for rec (state starting);
 * fills the runtime state. Nothing is left running on failure. */
static struct mgr_exec *exec_start(struct manager *m, const struct rec_exec *rec,
                                   struct tt_err *err)
{
	struct mgr_exec *ex = calloc(1, sizeof(*ex));
	char dir[PATH_MAX];
	struct ns_config cfg = { 0 };
	struct bridge_proc bp;
	struct tt_err e2 = { 0 };
	bool use_spare;
	int64_t t;
	int rc;
	/* The activation secret (SPEC §5): fresh per activation, handed to
	 * the guest and the bridge, then zeroed here. It is never stored:
	 * after a manager restart the adopted bridge and guest still hold it,
	 * and any re-activation draws a new one. */
	uint8_t secret[NS_SECRET_LEN];

	/* A spare launch in flight: its result first, so that the checks
	 * below see whether a spare holds rec's slot. */
	spare_sb_take(m);
	if (ex == NULL) {
		/* The record keeps its slot: a spare in it would share it. */
		if (m->spare_sb_on && m->spare_sb_slot == rec->slot)
			spare_sb_stop(m);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	exec_runtime_init(m, ex);
	ex->own_children = true;
	ex->bridge_pidfd = -1;
	snprintf(ex->sbx, sizeof(ex->sbx), "%s", rec->id.sbx);
	ns_sandbox_init(&ex->sb);
	if (sandbox_dir(m, rec->id.sbx, dir, sizeof(dir)) < 0) {
		tt_err_set(err, TT_ERR_INVALID, "state path too long");
		goto fail;
	}
	randombytes_buf(secret, sizeof(secret));
	hello_adopt_key(secret, rec->id.sbx, rec->id.gen, rec->id.att, ex->adopt_key);
	t = now_us();
	/* The spare sandbox, when it holds this slot (apply_install gave it
	 * to a fresh create): only its identity and secret are handed over. */
	use_spare = m->spare_sb_on && m->spare_sb_slot == rec->slot &&
	            spare_claim(m, dir, &ex->sb);
	if (!use_spare) {
		/* Never two sandboxes in one uid range: a spare we could
		 * not take (our directory was there already) goes. */
		if (m->spare_sb_on && m->spare_sb_slot == rec->slot)
			spare_sb_stop(m);
		spare_claim(m, dir, NULL);
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		tt_err_sys(err, TT_ERR_IO, "mkdir %s", dir);
		if (use_spare)
			ns_sandbox_stop(&ex->sb, &e2);
		goto fail;
	}
	if (use_spare) {
		/* Its tree moved here with it (the agent's socket too). */
		snprintf(ex->sb.guest_socket, sizeof(ex->sb.guest_socket), "%.4000s/run/guest.sock",
		         dir);
		rc = ns_sandbox_assign(&ex->sb, rec->id.sbx, rec->id.gen, rec->id.att, secret,
		                       err);
		if (rc < 0)
			ns_sandbox_stop(&ex->sb, &e2);
	} else {
		cfg.sbx_id = rec->id.sbx;
		cfg.gen = rec->id.gen;
		cfg.att = rec->id.att;
		cfg.secret = secret;
		exec_cfg(m, &cfg, dir, rec->slot);
		/* The guest and its bridge come up side by side: the bridge
		 * needs only the init's final identity (after exec), not its
		 * listener. */
		rc = ns_sandbox_launch(&cfg, &ex->sb, err);
		if (cfg.use_netns) {
			/* Used up either way: the sandbox holds it now, or it
			 * is dropped with the failed start. */
			close(m->spare_netns);
			m->spare_netns = -1;
			spare_kick(m);
		}
	}
	ex->launch_us = now_us() - t;
	if (rc < 0)
		goto fail;
	t = now_us();
	rc = bridge_take(m, ex, dir, rec, secret, &bp, err);
	ex->spawn_us = now_us() - t;
	if (rc < 0) {
		ns_sandbox_stop(&ex->sb, &e2);
		goto fail;
	}
	t = now_us();
	if (ns_sandbox_wait_ready(&ex->sb, err) < 0) {
		close(bp.ready_fd);
		bridge_abort(ex);
		goto fail;
	}
	if (bridge_finish(m, ex, &bp, err) < 0) {
		ns_sandbox_stop(&ex->sb, &e2);
		goto fail;
	}
	ex->ready_us = now_us() - t;
	sodium_memzero(secret, sizeof(secret));
	return ex;
fail:
	sodium_memzero(secret, sizeof(secret));
	/* Nothing runs on the layer: unmount it (its files stay for a
	 * retry or a destroy). */
	layer_unmount_of(m, rec->id.sbx);
	uvutil_pool_free(ex->pool);
	free(ex);
	return NULL;
}

/* str_field: a bounded string member of an update ("" allowed only when
 * empty_ok). */
static const char *str_field(json_t *u, const char *key, size_t max, bool empty_ok)
{
	const char *s = json_string_value(json_object_get(u, key));

	if (s == NULL && empty_ok && json_object_get(u, key) == NULL)
		return "";
	if (s == NULL || strlen(s) > max || (!empty_ok && s[0] == '\0'))
		return NULL;
	return s;
}

/* u64_field: a positive integer member of an update; 0 when absent/bad. */
static uint64_t u64_field(json_t *u, const char *key)
{
	json_t *v = json_object_get(u, key);

	if (!json_is_integer(v) || json_integer_value(v) <= 0)
		return 0;
	return (uint64_t)json_integer_value(v);
}

/* retire_and_stop: persists retired for the current record of sbx (if not
 * yet), then cancels leases and stops its processes. */
static int retire_and_stop(struct manager *m, const struct rec_exec *cur,
                           uint64_t rev, struct tt_err *err)
{
	struct mgr_exec *ex;
	char sbx[TT_SBX_ID_LEN + 1];

	int rc;

	snprintf(sbx, sizeof(sbx), "%s", cur->id.sbx);
	/* On a persist failure records_retire still retires the mirror; stop
	 * the execution anyway (fail closed) and report the error. */
	rc = records_retire(m->db, sbx, cur->id.gen, rev, err) < 0 ? -1 : 0;
	ex = exec_find(m, sbx);
	if (ex != NULL) {
		exec_stop(m, ex);
		if (rc == 0)
			mark_state(m, sbx, REC_STOPPED);
	}
	cancel_leases(m, sbx);
	return rc;
}

/* layer_held: sbx's layer image is here (a regular file, not followed). */
static bool layer_held(struct manager *m, const char *sbx)
{
	char dir[PATH_MAX], img[PATH_MAX + 16];
	struct stat st;

	return sandbox_dir(m, sbx, dir, sizeof(dir)) == 0 &&
	       (size_t)snprintf(img, sizeof(img), "%s/" NS_LAYER_IMG, dir) < sizeof(img) &&
	       lstat(img, &st) == 0 && S_ISREG(st.st_mode);
}

/* apply_install: install {sandbox,generation,worker,substrate,pod,activation}
 * (+ snapshot: restore it first; + from_layer: relaunch on the layer held
 * here). */
static int apply_install(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	const char *sbx = str_field(u, "sandbox", TT_SBX_ID_LEN, false);
	const char *wrk = str_field(u, "worker", TT_NAME_MAX, false);
	const char *sst = str_field(u, "substrate", TT_NAME_MAX, false);
	const char *pod = str_field(u, "pod", TT_NAME_MAX, true);
	json_t *jsnap = json_object_get(u, "snapshot");
	const char *snap = json_string_value(jsnap); /* resume: restore first */
	/* a relaunch after a lost execution: on the layer held here, never on
	 * an empty one */
	bool from_layer = json_is_true(json_object_get(u, "from_layer"));
	uint64_t gen = u64_field(u, "generation"), att = u64_field(u, "activation");
	const struct rec_exec *cur;
	struct rec_exec rec = { 0 };
	struct mgr_exec *ex;
	int64_t t_put, t_start, t_put2, t_end;

	if (sbx == NULL || !sbx_id_valid(sbx) || wrk == NULL || sst == NULL ||
	    pod == NULL || gen == 0 || att == 0 || att > UINT32_MAX ||
	    (jsnap != NULL && !json_is_null(jsnap) &&
	     (snap == NULL || strlen(snap) >= SNAPSTORE_KEY_MAX)))
		return tt_err_set(err, TT_ERR_MALFORMED, "install: bad or missing fields");
	if (strcmp(wrk, m->worker_id) != 0)
		return records_set_applied_rev(m->db, rev, err); /* not ours */
	if (strcmp(sst, "ns") != 0)
		return tt_err_set(err, TT_ERR_INVALID, "install: substrate %s not available here", sst);
	if (from_layer && (snap != NULL || !layer_held(m, sbx)))
		return tt_err_set(err, TT_ERR_CONFLICT, "install: no layer of %s here "
		                  "to relaunch it from", sbx);
	lost_forget(m, sbx);
	cur = records_get(m->db, sbx);
	if (cur != NULL && cur->id.gen > gen)
		return tt_err_set(err, TT_ERR_CONFLICT,
		                  "install: generation %" PRIu64 " older than installed %" PRIu64,
		                  gen, cur->id.gen);
	if (cur != NULL && cur->id.gen == gen && cur->id.att == att && !cur->retired &&
	    cur->state == REC_RUNNING && exec_find(m, sbx) != NULL &&
	    strcmp(cur->id.pod, pod) == 0)
		return records_set_applied_rev(m->db, rev, err); /* already so */
	snprintf(rec.id.sbx, sizeof(rec.id.sbx), "%s", sbx);
	snprintf(rec.id.wrk, sizeof(rec.id.wrk), "%s", wrk);
	snprintf(rec.id.sst, sizeof(rec.id.sst), "%s", sst);
	snprintf(rec.id.pod, sizeof(rec.id.pod), "%s", pod);
	rec.id.gen = gen;
	rec.id.att = (uint32_t)att;
	rec.epoch = cur ? cur->epoch + 1 : 1;
	/* A fresh sandbox takes the spare sandbox's slot (and so the spare);
	 * any other slot must avoid it. */
	spare_sb_take(m); /* a launch still running: its slot is decided */
	rec.slot = cur ? cur->slot : m->spare_sb_on && snap == NULL ? m->spare_sb_slot :
	           records_free_slot_except(m->db, m->spare_sb_on ? m->spare_sb_slot
	                                                          : UINT32_MAX);
	rec.state = REC_STARTING;
	/* An older execution here is retired and stopped first (epoch bump). */
	if (cur != NULL && retire_and_stop(m, cur, 0, err) < 0)
		return -1;
	t_put = now_us();
	if (records_put(m->db, &rec, 0, err) < 0)
		return -1;
	t_start = now_us();
	ex = snap != NULL && layer_restore(m, &rec, snap, err) < 0 ? NULL
	                                                             : exec_start(m, &rec, err);
	if (ex == NULL) {
		struct tt_err e2 = { 0 };

		rec.state = REC_FAILED;
		if (records_put(m->db, &rec, rev, &e2) < 0)
			log_error("persisting failed install of %s: %s", sbx, e2.msg);
		return -1;
	}
	rec.state = REC_RUNNING;
	rec.init_pid = ex->sb.init_pid;
	rec.init_start = ex->sb.init_start_time;
	rec.bridge_pid = ex->bridge_pid;
	rec.bridge_start = ex->bridge_start;
	memcpy(rec.adopt_key, ex->adopt_key, sizeof(rec.adopt_key));
	rec.has_adopt_key = true;
	/* Persist, then apply: admission sees the execution only once the
	 * record with its pids is committed. */
	t_put2 = now_us();
	if (records_put(m->db, &rec, rev, err) < 0 || exec_watch(m, ex, err) < 0) {
		exec_stop(m, ex);
		return -1;
	}
	t_end = now_us();
	log_info("installed %s generation %" PRIu64 " activation %" PRIu64
	         " (init pid %d, bridge pid %d, epoch %" PRIu64 ") in %.2f ms: record "
	         "%.2f, sandbox %.2f, bridge spawn %.2f, both ready %.2f, record %.2f",
	         sbx, gen, att, (int)rec.init_pid, (int)rec.bridge_pid, rec.epoch,
	         (double)(t_end - t_put) / 1000, (double)(t_start - t_put) / 1000,
	         (double)ex->launch_us / 1000, (double)ex->spawn_us / 1000,
	         (double)ex->ready_us / 1000, (double)(t_end - t_put2) / 1000);
	return 0;
}

/* apply_retire: retire {sandbox,generation}. */
static int apply_retire(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	const char *sbx = str_field(u, "sandbox", TT_SBX_ID_LEN, false);
	uint64_t gen = u64_field(u, "generation");
	const struct rec_exec *cur;

	if (sbx == NULL || !sbx_id_valid(sbx) || gen == 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "retire: bad or missing fields");
	cur = records_get(m->db, sbx);
	if (cur == NULL || cur->id.gen != gen)
		return records_set_applied_rev(m->db, rev, err);
	log_info("retiring %s generation %" PRIu64, sbx, gen);
	return retire_and_stop(m, cur, rev, err);
}

/* snapshots_gc: at start, the partial snapshots (a pause cut short by a
 * crash) and orphaned pieces older than an hour leave the shared store:
 * nothing else ever removed them. A pause running now on another worker
 * writes far more recently than that. */
static void snapshots_gc(struct manager *m)
{
	struct snapstore *s = NULL;
	struct tt_err err = { 0 };
	unsigned removed = 0;

	if (!m->snap_dir[0])
		return;
	if (snapstore_dir_open(m->snap_dir, &s, &err) < 0 ||
	    snapstore_gc(s, 3600, &removed, &err) < 0)
		log_warn("snapshot store gc: %s", err.msg);
	else if (removed > 0)
		log_info("snapshot store gc: removed %u stale piece(s)", removed);
	snapstore_close(s);
}

/* snapshots_remove: a destroyed sandbox's snapshots leave the shared
 * store (their files were readable there for good, and took its space);
 * best effort: what cannot go now is logged. */
static void snapshots_remove(struct manager *m, const char *sbx)
{
	struct snapstore *s = NULL;
	struct tt_err err = { 0 };
	uint64_t *gens = NULL;
	size_t n = 0;

	if (!m->snap_dir[0])
		return;
	if (snapstore_dir_open(m->snap_dir, &s, &err) < 0 ||
	    snapstore_list(s, sbx, &gens, &n, &err) < 0) {
		if (err.code != TT_ERR_NOT_FOUND)
			log_warn("snapshots of %s: %s", sbx, err.msg);
		snapstore_close(s);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		tt_err_clear(&err);
		if (snapstore_remove(s, sbx, gens[i], &err) < 0)
			log_warn("removing snapshot %s/%" PRIu64 ": %s", sbx, gens[i], err.msg);
	}
	if (n > 0)
		log_info("removed %zu snapshot(s) of destroyed %s", n, sbx);
	free(gens);
	snapstore_close(s);
}

#define MGR_PRUNE_KEEP_MAX 256

/* apply_prune: prune {sandbox, generation, keep:[...]}: the cp recorded
 * the complete snapshot `generation` (its newest) and keeps the ones in
 * keep; every other complete snapshot of the sandbox below it leaves the
 * shared store (also one the cp never recorded: a pause whose answer was
 * lost before a newer one was acknowledged). Nothing at or above
 * generation is touched. The cp decides what stays; we, who own the
 * store's files, remove them. */
static int apply_prune(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	const char *sbx = str_field(u, "sandbox", TT_SBX_ID_LEN, false);
	uint64_t gen = u64_field(u, "generation");
	json_t *jkeep = json_object_get(u, "keep"), *v;
	uint64_t keep[MGR_PRUNE_KEEP_MAX];
	struct snapstore *s = NULL;
	unsigned removed = 0;
	size_t n = 0, i;
	int rc;

	if (sbx == NULL || !sbx_id_valid(sbx) || gen == 0 || !json_is_array(jkeep) ||
	    json_array_size(jkeep) > MGR_PRUNE_KEEP_MAX)
		return tt_err_set(err, TT_ERR_MALFORMED, "prune: bad or missing fields");
	json_array_foreach(jkeep, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) <= 0)
			return tt_err_set(err, TT_ERR_MALFORMED, "prune: bad keep list");
		keep[n++] = (uint64_t)json_integer_value(v);
	}
	if (m->snap_dir[0]) {
		rc = snapstore_dir_open(m->snap_dir, &s, err) < 0 ? -1 :
		     snapstore_prune(s, sbx, gen, keep, n, &removed, err);
		snapstore_close(s);
		if (removed > 0)
			log_info("pruned %u snapshot(s) of %s older than generation %" PRIu64,
			         removed, sbx, gen);
		if (rc < 0)
			return -1;
	}
	return records_set_applied_rev(m->db, rev, err);
}

/* apply_destroy: destroy {sandbox}: retire, stop, delete data and record. */
static int apply_destroy(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	const char *sbx = str_field(u, "sandbox", TT_SBX_ID_LEN, false);
	const struct rec_exec *cur;
	char dir[PATH_MAX];

	if (sbx == NULL || !sbx_id_valid(sbx))
		return tt_err_set(err, TT_ERR_MALFORMED, "destroy: bad or missing sandbox");
	snapshots_remove(m, sbx);
	cur = records_get(m->db, sbx);
	if (cur == NULL)
		return records_set_applied_rev(m->db, rev, err);
	if (retire_and_stop(m, cur, 0, err) < 0)
		return -1;
	if (sandbox_dir(m, sbx, dir, sizeof(dir)) == 0 && remove_tree(dir) < 0)
		log_warn("removing %s: %s", dir, strerror(errno));
	log_info("destroyed %s", sbx);
	return records_delete(m->db, sbx, rev, err);
}

/* apply_keys: keys {"keys":[...]}: replaces the ring (persisted). */
static int apply_keys(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	struct tt_keyring kr = { 0 };
	json_t *bundle = json_pack("{s:O}", "keys", json_object_get(u, "keys"));
	_cleanup_free_ char *text = bundle ? json_dumps(bundle, JSON_COMPACT) : NULL;

	json_decref(bundle);
	if (text == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "keys: missing bundle");
	if (keyring_from_json(&kr, text, strlen(text), err) < 0)
		return -1;
	if (records_keys_replace(m->db, &kr, rev, err) < 0)
		return -1;
	log_info("key ring replaced: %zu key(s)", kr.n);
	return 0;
}

/* apply_one: one update, persisted then applied; never skips a revision. */
static int apply_one(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	const char *kind = json_string_value(json_object_get(u, "kind"));
	int rc;

	if (kind == NULL)
		rc = tt_err_set(err, TT_ERR_MALFORMED, "update without kind");
	else if (strcmp(kind, "keys") == 0)
		rc = apply_keys(m, u, rev, err);
	else if (strcmp(kind, "install") == 0)
		rc = apply_install(m, u, rev, err);
	else if (strcmp(kind, "retire") == 0)
		rc = apply_retire(m, u, rev, err);
	else if (strcmp(kind, "destroy") == 0)
		rc = apply_destroy(m, u, rev, err);
	else if (strcmp(kind, "prune") == 0)
		rc = apply_prune(m, u, rev, err);
	else
		rc = tt_err_set(err, TT_ERR_INVALID, "unknown update kind %.32s", kind);
	/* A failed update is still consumed (its result says why), so the
	 * feed moves on; the failure is what gets acknowledged. */
	if (rc < 0 && records_applied_rev(m->db) < rev) {
		struct tt_err e2 = { 0 };

		if (records_set_applied_rev(m->db, rev, &e2) < 0)
			log_error("persisting applied revision: %s", e2.msg);
	}
	return rc;
}

/* ---- pause and snapshots (lifecycle.md, SPEC §7) ------------------------
 * A pause update suspends its feed.apply: the manager retires the execution
 * (persisted), waits for in-flight operations (bounded), freezes the
 * sandbox, packs <sandbox_dir>/layer into the snapshot store on a libuv
 * worker thread (the loop keeps serving other sandboxes), then stops the
 * processes and records the result. While the snapshot is written, progress
 * goes to node-api on the feed.apply connection as DATA_OUT frames holding
 * {"progress":{"rev","sandbox","bytes","total"}} (at most 5/s), before
 * the final RESULT; node-api forwards them to the cp. */

#define MGR_DRAIN_MS 5000    /* in-flight operations may finish within */
#define MGR_DRAIN_POLL_MS 5
#define MGR_FREEZE_MS 5000
#define MGR_PROGRESS_MS 200

struct mgr_apply;

/* One pause in progress (feed.apply is sequential: at most one). Owned by
 * its mgr_apply; freed when its timer has closed. */
struct mgr_pause {
	struct manager *m;
	struct mgr_apply *ap;
	char sbx[TT_SBX_ID_LEN + 1];
	uint64_t gen, rev;
	uid_t uid_base;
	char layer[PATH_MAX];
	uv_timer_t timer;            /* drain polling, then progress */
	int64_t drain_deadline;
	int64_t started_ms;
	uv_work_t work;
	_Atomic uint64_t done, total; /* written by the worker thread */
	uint64_t sent;               /* last progress reported */
	/* Results of the worker thread (read after it finished). */
	int rc;
	struct tt_err err;
	struct snapstore_info info;
};

/* A feed.apply in progress: updates applied in order. Owns c (and so the
 * request whose updates it walks) and results. */
struct mgr_apply {
	struct manager *m;
	struct mgr_conn *c;
	json_t *updates;             /* borrowed from c->req */
	size_t i;
	json_t *results;
};

static void apply_continue(struct mgr_apply *ap);

/* uid_base_of: the host id base of a record's slot (as exec_start maps it). */
static uid_t uid_base_of(const struct rec_exec *rec)
{
	return MGR_UID_BASE + MGR_UID_COUNT * rec->slot;
}

/* layer_move_up: moves every entry of ldfd/name up into ldfd (same
 * filesystem: renames), then removes the empty name. */
static int layer_move_up(int ldfd, const char *name, struct tt_err *err)
{
	int rfd = openat(ldfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (rfd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open the restored layer");
	d = fdopendir(rfd);
	if (d == NULL) {
		close(rfd);
		return tt_err_sys(err, TT_ERR_IO, "read the restored layer");
	}
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (renameat2(rfd, de->d_name, ldfd, de->d_name, RENAME_NOREPLACE) < 0) {
			tt_err_sys(err, TT_ERR_IO, "moving %.64s into the layer", de->d_name);
			closedir(d);
			return -1;
		}
	}
	closedir(d);
	if (unlinkat(ldfd, name, AT_REMOVEDIR) < 0)
		return tt_err_sys(err, TT_ERR_IO, "rmdir the restore dir");
	return 0;
}

/* layer_restore_into: unpacks snapshot ksbx/kgen into the (fresh, mounted)
 * layer of dir. */
static int layer_restore_into(struct manager *m, const struct rec_exec *rec,
                              const char *dir, const char *ksbx, uint64_t kgen,
                              struct snapshot_stats *st, struct tt_err *err)
{
	static const char *const subs[] = { "home", "tmp", "workspace" };
	struct snapshot_unpack_opts o = { 0 };
	struct snapstore *s = NULL;
	_cleanup_close_ int ldfd = -1;
	char layer[PATH_MAX];
	int rc;

	if (ns_layer_ensure(dir, m->tmpl_usable ? m->layer_tmpl : NULL, m->layer_bytes,
	                    m->layer_inodes, err) < 0)
		return -1;
	snprintf(layer, sizeof(layer), "%.4000s/layer", dir);
	ldfd = open(layer, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (ldfd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open %s", layer);
	/* The fresh filesystem's empty home/tmp/workspace go: the archive's
	 * tree is all the layer holds. */
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
		if (snapshot_rm_tree(ldfd, subs[i], err) < 0)
			return -1;
	if (snapstore_dir_open(m->snap_dir, &s, err) < 0)
		return -1;
	o.chown = true;
	o.id_base = uid_base_of(rec);
	o.gid_base = uid_base_of(rec);
	/* Unpacked INSIDE the capped filesystem (then moved up by renames):
	 * a snapshot larger than the cap fails with ENOSPC there, never
	 * touching the worker's filesystem; a failed unpack leaves nothing. */
	rc = snapstore_get_tree(s, ksbx, kgen, ldfd, "restore", &o, st, err);
	snapstore_close(s);
	if (rc < 0) {
		char why[sizeof(err->msg)];
		int no_space = err->sys_errno == ENOSPC || err->sys_errno == EDQUOT;

		memcpy(why, err->msg, sizeof(why)); /* the message is rewritten in place */
		if (no_space)
			return tt_err_set(err, TT_ERR_TOO_LARGE, "install: snapshot %s/%" PRIu64
			                  " does not fit this worker's sandbox disk quota "
			                  "(%" PRIu64 " MiB): %s", ksbx, kgen,
			                  m->layer_bytes >> 20, why);
		return tt_err_set(err, err->code, "install: snapshot %s/%" PRIu64 ": %s",
		                  ksbx, kgen, why);
	}
	return layer_move_up(ldfd, "restore", err);
}

/* layer_restore: replaces <sandbox_dir>/layer by the complete snapshot key
 * (checksum verified while unpacking, all or nothing; ids shifted to this
 * slot's uid base). Missing or partial snapshots fail. A layer left by an
 * older execution here is never reused: its tree and image are deleted
 * and the snapshot goes into a fresh filesystem (the spare's when there
 * is one, else one made now) rather than into the old one emptied: that
 * is cheaper than deleting a big tree file by file, and nothing of the
 * old filesystem (its size, stray inodes) survives. On failure nothing
 * stays mounted. */
static int layer_restore(struct manager *m, const struct rec_exec *rec,
                         const char *key, struct tt_err *err)
{
	char ksbx[SNAPSTORE_SBX_MAX + 1], dir[PATH_MAX];
	struct snapshot_stats st = { 0 };
	uint64_t kgen;
	int64_t t0 = now_ms();

	if (snapstore_key_parse(key, ksbx, &kgen, err) < 0)
		return -1;
	if (strcmp(ksbx, rec->id.sbx) != 0 || kgen >= rec->id.gen)
		return tt_err_set(err, TT_ERR_INVALID, "install: snapshot %s is not an "
		                  "older generation of %s", key, rec->id.sbx);
	if (!m->snap_dir[0])
		return tt_err_set(err, TT_ERR_INVALID, "install: this worker has no "
		                  "snapshot store (--snapshots)");
	if (sandbox_dir(m, rec->id.sbx, dir, sizeof(dir)) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "state path too long");
	/* Nothing runs there (the caller retired and stopped it). */
	if (remove_tree(dir) < 0)
		return tt_err_sys(err, TT_ERR_IO, "removing the old layer of %s", rec->id.sbx);
	spare_claim(m, dir, NULL); /* its filesystem, not its sandbox */
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", dir);
	if (layer_restore_into(m, rec, dir, ksbx, kgen, &st, err) < 0) {
		layer_unmount_of(m, rec->id.sbx);
		return -1;
	}
	log_info("restored %s from snapshot %s: %" PRIu64 " entries, %" PRIu64
	         " bytes in %" PRId64 " ms", rec->id.sbx, key, st.entries,
	         st.data_bytes, now_ms() - t0);
	return 0;
}

/* ops_of: admitted operations of sbx still relaying. */
static size_t ops_of(struct manager *m, const char *sbx)
{
	size_t n = 0;

	for (struct mgr_conn *c = m->ops; c; c = c->next)
		if (strcmp(c->sbx, sbx) == 0 && (c->relay != NULL || c->connecting))
			n++;
	return n;
}

/* pause_closed: frees the pause once its timer is closed. */
static void pause_closed(uv_handle_t *h)
{
	free(h->data);
}

/* pause_send_progress: one DATA_OUT progress frame to node-api. */
static void pause_send_progress(struct mgr_pause *p, uint64_t done, uint64_t total)
{
	json_t *o;

	if (p->ap->c->conn == NULL)
		return;
	o = json_pack("{s:{s:I,s:s,s:I,s:I}}", "progress", "rev", (json_int_t)p->rev,
	              "sandbox", p->sbx, "bytes", (json_int_t)done, "total",
	              (json_int_t)total);
	if (o != NULL)
		relay_write_json((uv_stream_t *)p->ap->c->conn, WIRE_DATA_OUT, o, NULL);
	json_decref(o);
	p->sent = done;
}

/* layer_discard: the layer of sbx once its snapshot is published: it
 * lives in the store now, and resumes always restore it. Its image goes
 * (unmounted first), then the mount point. */
static void layer_discard(struct manager *m, const char *sbx)
{
	_cleanup_close_ int dfd = -1;
	struct tt_err err = { 0 };
	char dir[PATH_MAX];

	if (sandbox_dir(m, sbx, dir, sizeof(dir)) < 0)
		return;
	if (ns_layer_remove(dir, &err) < 0) {
		log_warn("removing the layer of %s: %s", sbx, err.msg);
		return;
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		if (errno != ENOENT)
			log_warn("removing the layer of %s: open %s: %s", sbx, dir, strerror(errno));
		return;
	}
	if (snapshot_rm_tree(dfd, "layer", &err) < 0)
		log_warn("removing the layer of %s: %s", sbx, err.msg);
}

/* pause_result_ok: a pause's successful result: the published snapshot
 * (key, generation, size, checksum) the cp records. */
static json_t *pause_result_ok(uint64_t rev, const char *sbx, uint64_t gen,
                               const struct snapstore_info *info)
{
	char key[SNAPSTORE_KEY_MAX], sum[2 * SNAPSTORE_HASH_LEN + 1];

	sodium_bin2hex(sum, sizeof(sum), info->blake2b, sizeof(info->blake2b));
	snapstore_key(key, sbx, gen, NULL);
	return json_pack("{s:I,s:b,s:{s:s,s:I,s:I,s:s+}}", "rev", (json_int_t)rev, "ok", 1,
	                 "snapshot", "key", key, "generation", (json_int_t)gen, "size",
	                 (json_int_t)info->size, "checksum", "blake2b:", sum);
}

/* pause_published: a pause of an execution that no longer runs here,
 * whose snapshot is complete in the store: the pause ran and published
 * it, and its answer was lost (a manager killed between publishing and
 * answering, a node-api restarted before acknowledging; the cp asks
 * again). Answered from the store, so the cp records that snapshot
 * rather than fail the pause and later resume from an older one that
 * lacks writes the execution acknowledged; its layer (in the store now)
 * goes. NULL when that does not apply: the pause runs, or fails, as
 * before. A snapshot is only ever published after its execution was
 * retired and drained, so it holds every write that was acknowledged. */
static json_t *pause_published(struct manager *m, json_t *u, uint64_t rev)
{
	const char *sbx = str_field(u, "sandbox", TT_SBX_ID_LEN, false);
	const char *snap = str_field(u, "snapshot", SNAPSTORE_KEY_MAX, false);
	uint64_t gen = u64_field(u, "generation");
	struct snapstore_info info = { 0 };
	struct snapstore *s = NULL;
	struct tt_err err = { 0 };
	const struct rec_exec *cur;
	char key[SNAPSTORE_KEY_MAX];
	int rc;

	if (sbx == NULL || !sbx_id_valid(sbx) || gen == 0 || snap == NULL ||
	    snapstore_key(key, sbx, gen, NULL) < 0 || strcmp(key, snap) != 0 ||
	    !m->snap_dir[0])
		return NULL;
	cur = records_get(m->db, sbx);
	if (cur == NULL || cur->id.gen != gen ||
	    (!cur->retired && cur->state == REC_RUNNING && exec_find(m, sbx) != NULL))
		return NULL;
	rc = snapstore_dir_open(m->snap_dir, &s, &err) == 0 &&
	     snapstore_stat(s, sbx, gen, &info, &err) == 0 && info.complete ? 0 : -1;
	snapstore_close(s);
	if (rc < 0)
		return NULL;
	log_info("pause of %s generation %" PRIu64 " (rev %" PRIu64 "): its snapshot %s "
	         "was published already (%" PRIu64 " bytes); answered from the store", sbx,
	         gen, rev, key, info.size);
	mark_state(m, sbx, REC_STOPPED);
	layer_discard(m, sbx);
	return pause_result_ok(rev, sbx, gen, &info);
}

/* pause_end: stops the (retired) execution's processes, records the
 * result and resumes the feed.apply. */
static void pause_end(struct mgr_pause *p, int rc)
{
	struct manager *m = p->m;
	struct mgr_apply *ap = p->ap;
	struct mgr_exec *ex = exec_find(m, p->sbx);
	struct tt_err e2 = { 0 };
	json_t *r;

	/* Only now do the processes go: the snapshot is published (or the
	 * pause failed and the execution stays retired either way). A
	 * published layer goes with them (below); a failed pause keeps it. */
	if (ex != NULL) {
		ex->discard_layer = rc == 0;
		exec_stop(m, ex);
	}
	mark_state(m, p->sbx, REC_STOPPED);
	if (rc == 0) {
		r = pause_result_ok(p->rev, p->sbx, p->gen, &p->info);
		log_info("paused %s generation %" PRIu64 ": snapshot %s/%" PRIu64 ", %" PRIu64
		         " bytes, %" PRId64 " ms", p->sbx, p->gen, p->sbx, p->gen, p->info.size,
		         now_ms() - p->started_ms);
		/* exec_stop unmounted it; the store holds it now. */
		layer_discard(m, p->sbx);
	} else {
		log_warn("pause of %s generation %" PRIu64 " failed: %s", p->sbx, p->gen,
		         p->err.msg);
		r = json_pack("{s:I,s:b,s:s}", "rev", (json_int_t)p->rev, "ok", 0, "error",
		              p->err.msg);
	}
	if (records_applied_rev(m->db) < p->rev &&
	    records_set_applied_rev(m->db, p->rev, &e2) < 0)
		log_error("persisting applied revision: %s", e2.msg);
	json_array_append_new(ap->results, r);
	uv_timer_stop(&p->timer);
	uv_close((uv_handle_t *)&p->timer, pause_closed);
	apply_continue(ap);
}

/* pause_progress_cb: reports snapshot progress when it moved. */
static void pause_progress_cb(uv_timer_t *t)
{
	struct mgr_pause *p = t->data;
	uint64_t done = atomic_load(&p->done);

	if (done != p->sent)
		pause_send_progress(p, done, atomic_load(&p->total));
}

/* pause_on_progress: snapshot progress (worker thread). */
static void pause_on_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct mgr_pause *p = ctx;

	(void)total;
	atomic_store(&p->done, done);
}

static _Thread_local uint64_t walk_bytes; /* layer_estimate's accumulator */
static _Thread_local size_t walk_root_len;

/* walk_cb: adds one entry's archive bytes (see snapshot.h's format). */
static int walk_cb(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	size_t len = strlen(path);
	size_t rel = len > walk_root_len ? len - walk_root_len - 1 : 0;

	(void)ftw;
	if (type == FTW_NS || type == FTW_DNR)
		return 0;
	if (S_ISREG(st->st_mode) || S_ISLNK(st->st_mode))
		walk_bytes += SNAPSHOT_ENTRY_HDR_LEN + rel + (uint64_t)st->st_size;
	else if (S_ISDIR(st->st_mode))
		walk_bytes += SNAPSHOT_ENTRY_HDR_LEN + rel;
	return 0;
}

/* layer_estimate: the archive size of the (frozen) layer, for progress
 * totals; never follows symlinks. 0 when unknown. */
static uint64_t layer_estimate(const char *layer)
{
	walk_bytes = SNAPSHOT_HDR_LEN + SNAPSHOT_TRAILER_LEN;
	walk_root_len = strlen(layer);
	if (nftw(layer, walk_cb, 32, FTW_PHYS | FTW_MOUNT) < 0)
		return 0;
	return walk_bytes;
}

/* pause_work: packs the layer into the store (worker thread: touches only
 * the pause, its own store handle and the frozen layer). */
static void pause_work(uv_work_t *w)
{
	struct mgr_pause *p = w->data;
	struct snapshot_pack_opts o = { 0 };
	struct snapshot_limits lim = { 0 };
	struct snapstore *s = NULL;
	struct statvfs vfs;
	_cleanup_close_ int fd = -1;

	atomic_store(&p->total, layer_estimate(p->layer));
	p->rc = -1;
	fd = open(p->layer, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		tt_err_sys(&p->err, TT_ERR_IO, "open %s", p->layer);
		return;
	}
	if (snapstore_dir_open(p->m->snap_dir, &s, &p->err) < 0)
		return;
	/* The archive stores sparse files and hard links expanded: one
	 * larger than the layer's filesystem could never be unpacked into a
	 * layer of that size, so packing it fails the pause, instead of a
	 * snapshot no worker can restore being published (and the layer
	 * deleted), or a few sparse files filling the shared store. */
	if (fstatvfs(fd, &vfs) == 0 && vfs.f_blocks > 0) {
		lim.max_total = (uint64_t)vfs.f_blocks * vfs.f_frsize;
		lim.max_entry_size = lim.max_total;
		o.limits = &lim;
	}
	o.id_base = p->uid_base;
	o.gid_base = p->uid_base;
	o.progress = pause_on_progress;
	o.progress_ctx = p;
	o.total_hint = atomic_load(&p->total);
	if (snapstore_put_tree(s, p->sbx, p->gen, fd, &o, NULL, &p->err) == 0 &&
	    snapstore_stat(s, p->sbx, p->gen, &p->info, &p->err) == 0) {
		if (p->info.complete)
			p->rc = 0;
		else
			tt_err_set(&p->err, TT_ERR_IO, "snapshot not published");
	}
	snapstore_close(s);
}

/* pause_after_work: back on the loop once the snapshot is done. */
static void pause_after_work(uv_work_t *w, int status)
{
	struct mgr_pause *p = w->data;

	if (status < 0 && p->rc == 0)
		p->rc = -1;
	if (p->rc == 0)
		pause_send_progress(p, p->info.size, p->info.size);
	pause_end(p, p->rc);
}

/* pause_freeze: in-flight operations are over: freeze, then snapshot. */
static void pause_freeze(struct mgr_pause *p)
{
	struct mgr_exec *ex = exec_find(p->m, p->sbx);
	int rc;

	if (ex == NULL) {
		tt_err_set(&p->err, TT_ERR_CONFLICT, "the execution exited during the pause");
		pause_end(p, -1);
		return;
	}
	if (ns_sandbox_freeze(&ex->sb, MGR_FREEZE_MS, &p->err) < 0) {
		pause_end(p, -1);
		return;
	}
	uv_timer_start(&p->timer, pause_progress_cb, MGR_PROGRESS_MS, MGR_PROGRESS_MS);
	p->work.data = p;
	rc = uv_queue_work(p->m->loop, &p->work, pause_work, pause_after_work);
	if (rc < 0) {
		tt_err_set(&p->err, TT_ERR_SYS, "cannot start the snapshot: %s", uv_strerror(rc));
		pause_end(p, -1);
	}
}

/* pause_drain_cb: waits for in-flight operations of the retired execution
 * to finish; past the bound they fail (never silently retried). */
static void pause_drain_cb(uv_timer_t *t)
{
	struct mgr_pause *p = t->data;
	struct mgr_conn *c, *next;

	if (ops_of(p->m, p->sbx) > 0 && now_ms() < p->drain_deadline)
		return;
	uv_timer_stop(t);
	for (c = p->m->ops; c; c = next) {
		next = c->next;
		if (strcmp(c->sbx, p->sbx) == 0 && c->relay != NULL) {
			log_warn("pause of %s: failing an operation still running after %d ms",
			         p->sbx, MGR_DRAIN_MS);
			relay_abort(c->relay, "transport",
			            "the sandbox was paused while this operation ran");
		}
	}
	pause_freeze(p);
}

/* pause_start: pause {sandbox,generation,snapshot}. Retires at once
 * (persisted), then continues asynchronously; -1 when it cannot start. */
static int pause_start(struct mgr_apply *ap, json_t *u, uint64_t rev,
                       struct tt_err *err)
{
	struct manager *m = ap->m;
	const char *sbx = str_field(u, "sandbox", TT_SBX_ID_LEN, false);
	const char *snap = str_field(u, "snapshot", SNAPSTORE_KEY_MAX, false);
	uint64_t gen = u64_field(u, "generation");
	const struct rec_exec *cur;
	char key[SNAPSTORE_KEY_MAX], dir[PATH_MAX];
	struct mgr_pause *p;

	if (sbx == NULL || !sbx_id_valid(sbx) || gen == 0 || snap == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "pause: bad or missing fields");
	if (snapstore_key(key, sbx, gen, err) < 0 || strcmp(key, snap) != 0)
		return tt_err_set(err, TT_ERR_INVALID, "pause: snapshot key must be %s/%" PRIu64,
		                  sbx, gen);
	cur = records_get(m->db, sbx);
	if (cur == NULL || cur->id.gen != gen || cur->retired ||
	    cur->state != REC_RUNNING || exec_find(m, sbx) == NULL)
		return tt_err_set(err, TT_ERR_CONFLICT, "pause: generation %" PRIu64
		                  " of %s is not running here", gen, sbx);
	if (!m->snap_dir[0])
		return tt_err_set(err, TT_ERR_INVALID, "pause: this worker has no snapshot "
		                  "store (--snapshots)");
	if (sandbox_dir(m, sbx, dir, sizeof(dir)) < 0 || strlen(dir) + 7 > sizeof(dir))
		return tt_err_set(err, TT_ERR_INVALID, "state path too long");
	/* The snapshot is read from the host's mount of the layer: without
	 * it, an empty mount point would be published as the sandbox's files. */
	if (!ns_layer_mounted(dir))
		return tt_err_set(err, TT_ERR_CONFLICT, "pause: the layer of %s is not "
		                  "mounted here", sbx);
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	p->uid_base = uid_base_of(cur);
	/* Retire first, durably: from here admission answers RefreshRoute. */
	if (records_retire(m->db, sbx, gen, 0, err) < 0) {
		free(p);
		return -1;
	}
	cancel_input_streams(m, sbx);
	p->m = m;
	p->ap = ap;
	snprintf(p->sbx, sizeof(p->sbx), "%s", sbx);
	p->gen = gen;
	p->rev = rev;
	snprintf(p->layer, sizeof(p->layer), "%.4000s/layer", dir);
	p->started_ms = now_ms();
	p->drain_deadline = p->started_ms + MGR_DRAIN_MS;
	uv_timer_init(m->loop, &p->timer);
	p->timer.data = p;
	log_info("pausing %s generation %" PRIu64 " (rev %" PRIu64 "): retired, "
	         "%zu operation(s) in flight", sbx, gen, rev, ops_of(m, sbx));
	uv_timer_start(&p->timer, pause_drain_cb, 0, MGR_DRAIN_POLL_MS);
	return 0;
}

/* apply_finish: RESULT {"applied_rev","results"} and close. */
static void apply_finish(struct mgr_apply *ap)
{
	struct mgr_conn *c = ap->c;
	json_t *res = json_pack("{s:I,s:O}", "applied_rev",
	                        (json_int_t)records_applied_rev(ap->m->db), "results",
	                        ap->results);
	struct tt_err err = { 0 };

	if (res == NULL || relay_write_json((uv_stream_t *)c->conn, WIRE_RESULT, res, &err) < 0)
		log_warn("answering feed.apply: %s", res ? err.msg : "out of memory");
	json_decref(res);
	json_decref(ap->results);
	free(ap);
	relay_close_after_writes((uv_stream_t *)c->conn);
	c->conn = NULL;
	conn_free(c);
}

/* apply_continue: applies updates in order until one runs asynchronously
 * (a pause) or all are done. */
static void apply_continue(struct mgr_apply *ap)
{
	struct manager *m = ap->m;

	while (ap->i < json_array_size(ap->updates)) {
		json_t *env = json_array_get(ap->updates, ap->i++), *u;
		struct tt_err err = { 0 };
		const char *why;

		/* Signed by the feed key, for us, in order (lib/feedsig.h); a
		 * refused update is not consumed, and the rest of the batch
		 * waits (its chain is broken). From here on the update is the
		 * verified body. */
		if (feedsig_open(&m->feed, env, records_applied_rev(m->db), &u, &why,
		                 &err) == FEEDSIG_REFUSED) {
			json_array_append_new(ap->results, feedsig_refused(env, why, &err));
			break;
		}
		json_array_set_new(ap->updates, ap->i - 1, u);
		const char *kind = json_string_value(json_object_get(u, "kind"));
		uint64_t rev = u64_field(u, "rev");
		int rc;

		if (rev == 0) {
			json_array_append_new(ap->results, json_pack("{s:I,s:b,s:s}", "rev",
			                      (json_int_t)0, "ok", 0, "error", "update without rev"));
			continue;
		}
		if (rev <= records_applied_rev(m->db)) {
			/* Already applied (a replay after a lost ack); a pause's
			 * answer is its snapshot, told again from the store. */
			json_t *done = kind != NULL && strcmp(kind, "pause") == 0
			               ? pause_published(m, u, rev) : NULL;

			json_array_append_new(ap->results, done != NULL ? done :
			                      json_pack("{s:I,s:b}", "rev", (json_int_t)rev,
			                                "ok", 1));
			continue;
		}
		if (kind != NULL && strcmp(kind, "pause") == 0) {
			json_t *done = pause_published(m, u, rev);

			if (done != NULL) {
				if (records_set_applied_rev(m->db, rev, &err) < 0)
					log_error("persisting applied revision %" PRIu64 ": %s",
					          rev, err.msg);
				json_array_append_new(ap->results, done);
				continue;
			}
			if (pause_start(ap, u, rev, &err) == 0)
				return; /* pause_end continues */
			rc = -1;
			if (records_set_applied_rev(m->db, rev, &(struct tt_err){ 0 }) < 0)
				log_error("persisting applied revision %" PRIu64, rev);
		} else {
			rc = apply_one(m, u, rev, &err);
		}
		if (rc == 0) {
			json_array_append_new(ap->results, json_pack("{s:I,s:b}", "rev",
			                      (json_int_t)rev, "ok", 1));
		} else {
			log_warn("update rev %" PRIu64 " failed: %s", rev, err.msg);
			json_array_append_new(ap->results, json_pack("{s:I,s:b,s:s}", "rev",
			                      (json_int_t)rev, "ok", 0, "error", err.msg));
		}
	}
	apply_finish(ap);
}

/* handle_feed_apply: {"op":"feed.apply","updates":[...]}: starts applying;
 * the RESULT follows (maybe after a pause). -1: bad request. */
static int handle_feed_apply(struct mgr_conn *c)
{
	json_t *updates = json_object_get(c->req, "updates");
	struct mgr_apply *ap;

	if (!json_is_array(updates) || json_array_size(updates) > MGR_UPDATES_MAX)
		return -1;
	ap = calloc(1, sizeof(*ap));
	if (ap == NULL || (ap->results = json_array()) == NULL) {
		free(ap);
		return -1;
	}
	ap->m = c->m;
	ap->c = c;
	ap->updates = updates;
	apply_continue(ap);
	return 0;
}

/* handle_status: {"op":"status"} -> the records and the applied revision. */
static json_t *handle_status(struct manager *m)
{
	json_t *list = json_array();

	for (size_t i = 0; i < records_count(m->db); i++) {
		const struct rec_exec *r = records_at(m->db, i);

		json_array_append_new(list, json_pack(
			"{s:s,s:I,s:s,s:s,s:s,s:I,s:b,s:s,s:I,s:i,s:i}", "sandbox", r->id.sbx,
			"generation", (json_int_t)r->id.gen, "worker", r->id.wrk,
			"substrate", r->id.sst, "pod", r->id.pod, "activation",
			(json_int_t)r->id.att, "retired", r->retired, "state",
			rec_state_name(r->state), "epoch", (json_int_t)r->epoch,
			"init_pid", (int)r->init_pid, "bridge_pid", (int)r->bridge_pid));
	}
	return json_pack("{s:I,s:o}", "applied_rev",
	                 (json_int_t)records_applied_rev(m->db), "executions", list);
}

/* lost_send: one {"lost":{…}} event to the watcher; one that cannot take
 * it is dropped (node-api watches again, and hears of it then). */
static void lost_send(struct manager *m, const char *sbx, uint64_t gen,
                      uint32_t att, const char *reason, bool reactivate)
{
	struct tt_err err = { 0 };
	json_t *o;

	if (m->watcher == NULL)
		return;
	o = json_pack("{s:{s:s,s:I,s:I,s:s,s:b}}", "lost", "sandbox", sbx,
	              "generation", (json_int_t)gen, "activation", (json_int_t)att,
	              "reason", reason, "reactivate", reactivate);
	if (o == NULL ||
	    relay_write_json((uv_stream_t *)m->watcher->conn, WIRE_DATA_OUT, o, &err) < 0) {
		log_warn("telling node-api of a lost execution: %s",
		         o ? err.msg : "out of memory");
		conn_free(m->watcher);
	}
	json_decref(o);
}

/* lost_find: what we noted of sbx's loss, or NULL. */
static struct mgr_lost *lost_find(struct manager *m, const char *sbx)
{
	for (struct mgr_lost *l = m->lost; l != NULL; l = l->next)
		if (strcmp(l->sbx, sbx) == 0)
			return l;
	return NULL;
}

/* lost_forget: sbx runs again (or is gone): its loss is no news. */
static void lost_forget(struct manager *m, const char *sbx)
{
	for (struct mgr_lost **pp = &m->lost; *pp != NULL; pp = &(*pp)->next) {
		if (strcmp((*pp)->sbx, sbx) == 0) {
			struct mgr_lost *l = *pp;

			*pp = l->next;
			free(l);
			return;
		}
	}
}

/* lost_note: remembers why r was lost (for a watcher that comes later)
 * and tells the watcher now. */
static void lost_note(struct manager *m, const struct rec_exec *r,
                      const char *reason, bool reactivate)
{
	struct mgr_lost *l = lost_find(m, r->id.sbx);

	if (l == NULL && (l = calloc(1, sizeof(*l))) != NULL) {
		l->next = m->lost;
		m->lost = l;
	}
	if (l != NULL) {
		snprintf(l->sbx, sizeof(l->sbx), "%s", r->id.sbx);
		l->gen = r->id.gen;
		snprintf(l->reason, sizeof(l->reason), "%s", reason);
		l->reactivate = reactivate;
	}
	lost_send(m, r->id.sbx, r->id.gen, r->id.att, reason, reactivate);
}

/* watch_read_cb: a watcher sends nothing more: EOF (or any byte) ends it. */
static void watch_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	(void)buf;
	if (nread != 0)
		conn_free(s->data);
}

/* watch_start: {"op":"watch"}: the connection hears of every execution
 * lost from now on, first of those lost already (found so at start: the
 * worker restarted without their processes; relaunched as the next
 * generation). */
static void watch_start(struct mgr_conn *c)
{
	struct manager *m = c->m;

	if (m->watcher != NULL && m->watcher != c)
		conn_free(m->watcher);
	m->watcher = c;
	uv_read_stop((uv_stream_t *)c->conn);
	if (uv_read_start((uv_stream_t *)c->conn, conn_alloc_cb, watch_read_cb) < 0) {
		conn_free(c);
		return;
	}
	for (size_t i = 0; i < records_count(m->db) && m->watcher == c; i++) {
		const struct rec_exec *r = records_at(m->db, i);
		const struct mgr_lost *l = lost_find(m, r->id.sbx);

		if (r->state != REC_LOST || r->retired)
			continue;
		if (l != NULL && l->gen == r->id.gen)
			lost_send(m, r->id.sbx, r->id.gen, r->id.att, l->reason,
			          l->reactivate);
		else
			lost_send(m, r->id.sbx, r->id.gen, r->id.att, "the worker "
			          "restarted and its processes were gone", false);
	}
}

/* handle_control: feed.apply / status; answers RESULT and closes (a
 * feed.apply holding a pause answers when the pause ends). */
static void handle_control(struct mgr_conn *c, const char *op)
{
	struct tt_err err = { 0 };
	json_t *res;

	if (strcmp(op, "status") != 0) {
		if (handle_feed_apply(c) < 0)
			conn_fail(c, "bad_request", "feed.apply needs an updates array (<= 1000)");
		return;
	}
	res = handle_status(c->m);
	if (relay_write_json((uv_stream_t *)c->conn, WIRE_RESULT, res, &err) < 0)
		log_warn("answering %s: %s", op, err.msg);
	json_decref(res);
	relay_close_after_writes((uv_stream_t *)c->conn);
	c->conn = NULL;
	conn_free(c);
}

/* ---- connections -------------------------------------------------------- */

/* conn_alloc_cb: reads go straight into the connection's buffer. */
static void conn_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct mgr_conn *c = h->data;

	(void)suggested;
	*buf = uv_buf_init((char *)c->buf, sizeof(c->buf));
}

/* conn_read_cb: waits for the connection's next REQUEST frame, then
 * dispatches. */
static void conn_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct mgr_conn *c = s->data;
	struct wire_frame f;
	struct tt_err err = { 0 };
	const char *op;

	(void)buf;
	switch (uvutil_read_request(s, c->served, &c->rd, c->buf, nread, &f, &c->pending,
	                            &c->pending_len, &err)) {
	case UVUTIL_REQ_MORE:
		return;
	case UVUTIL_REQ_READY:
		waiting_del(c);
		break;
	case UVUTIL_REQ_BAD:
		log_warn("closing a connection: %s", err.msg);
		metrics_inc("tether_manager_bad_frames_total", NULL);
		conn_free(c);
		return;
	case UVUTIL_REQ_NOMEM:
		conn_fail(c, "internal", "out of memory");
		return;
	case UVUTIL_REQ_CLOSED:
		conn_free(c);
		return;
	}
	c->req = wire_frame_json(&f, &err);
	op = c->req ? json_string_value(json_object_get(c->req, "op")) : NULL;
	if (op == NULL) {
		conn_fail(c, "bad_request", c->req ? "request without op" : err.msg);
		return;
	}
	if (strcmp(op, "feed.apply") == 0 || strcmp(op, "status") == 0)
		handle_control(c, op);
	else if (strcmp(op, "watch") == 0)
		watch_start(c);
	else
		handle_data_op(c);
}

/* peer_allowed: only the node-api that spawned us (pid and uid). */
static bool peer_allowed(struct manager *m, uv_pipe_t *p, struct ucred *cr)
{
	uv_os_fd_t fd;
	socklen_t len = sizeof(*cr);

	if (uv_fileno((uv_handle_t *)p, &fd) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &len) < 0)
		return false;
	return cr->uid == m->peer_uid && cr->pid == m->peer_pid;
}

/* on_connection: accept, check the peer, start reading its REQUEST. */
static void on_connection(uv_stream_t *server, int status)
{
	struct manager *m = server->data;
	struct mgr_conn *c;
	uv_pipe_t *p;
	struct ucred cr = { 0 };

	if (status < 0 || (p = uvutil_accept(server, m->loop)) == NULL)
		return;
	if (!peer_allowed(m, p, &cr)) {
		log_warn("peer refused: pid %d uid %u (expected pid %d uid %u)", (int)cr.pid,
		         (unsigned)cr.uid, (int)m->peer_pid, (unsigned)m->peer_uid);
		metrics_inc("tether_manager_peer_refused_total", NULL);
		relay_close_free((uv_stream_t *)p);
		return;
	}
	/* Not calloc: zeroing the 64 KiB buffer per operation showed in
	 * profiles; every other field is cleared. */
	c = malloc(sizeof(*c));
	if (c == NULL) {
		relay_close_free((uv_stream_t *)p);
		return;
	}
	memset(c, 0, offsetof(struct mgr_conn, buf));
	c->m = m;
	c->conn = p;
	p->data = c;
	wire_reader_init(&c->rd);
	if (uv_read_start((uv_stream_t *)p, conn_alloc_cb, conn_read_cb) < 0) {
		conn_free(c);
		return;
	}
	waiting_add(c);
}

/* ---- start-up and shutdown --------------------------------------------- */

/* proc_matches: pid is alive and started at start (pid reuse guard). */
static bool proc_matches(pid_t pid, unsigned long long start)
{
	unsigned long long now = 0;

	return pid > 0 && proc_start_time(pid, &now, NULL) == 0 && now == start;
}

/* kill_verified: SIGKILL to pid only if it is still the recorded process
 * (pidfd opened first, start time checked after: no reuse race). */
static void kill_verified(pid_t pid, unsigned long long start)
{
	int fd;

	if (pid <= 0 || (fd = pidfd_open_raw(pid)) < 0)
		return;
	if (proc_matches(pid, start))
		pidfd_signal(fd, SIGKILL);
	close(fd);
}

/* cgroups_release: kills whatever still runs in the cgroups of r's
 * execution, found dead or not adopted after a restart, then removes
 * them. The record may not name its init: a manager killed between
 * starting a sandbox and recording its pids left STARTING with pid 0. */
static void cgroups_release(const struct rec_exec *r)
{
	struct ns_sandbox gone;
	struct tt_err err = { 0 };

	ns_sandbox_init(&gone);
	ns_cgroup_find(r->id.sbx, r->id.gen, &gone);
	if (ns_cgroup_kill(&gone, &err) < 0)
		log_warn("killing what runs in %s generation %" PRIu64 ": %s", r->id.sbx,
		         r->id.gen, err.msg);
	if (ns_sandbox_stop(&gone, &err) < 0)
		log_warn("cgroups of %s generation %" PRIu64 ": %s", r->id.sbx, r->id.gen,
		         err.msg);
}

/* bridge_adopt: takes over the bridge of an execution our predecessor
 * started (guest/hello.h, "Adoption"): it must be the recorded bridge
 * (verify_peer against the identity pinned in recover), challenge us, and
 * accept the proof made with the recorded adoption key. Blocking, each
 * read and write bounded (the bridge is local): runs once per execution,
 * at start, before we serve. */
static int bridge_adopt(struct manager *m, struct mgr_exec *ex, const struct rec_exec *r,
                        struct tt_err *err)
{
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	uint8_t chal[HELLO_CHALLENGE_LEN], proof[HELLO_PROOF_LEN];
	char path[PATH_MAX], b64[HELLO_B64_LEN + 1];
	_cleanup_close_ int fd = -1;
	struct wire_frame f;
	json_t *o;
	int rc;

	if (!r->has_adopt_key)
		return tt_err_set(err, TT_ERR_VERIFY, "recorded without an adoption key");
	if (sandbox_dir(m, r->id.sbx, path, sizeof(path) - sizeof("/bridge.sock")) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "bridge socket path too long");
	strcat(path, "/bridge.sock");
	/* Any length of state path (unixaddr.h). */
	fd = unixaddr_connect(path, HELLO_TIMEOUT_MS, err);
	if (fd < 0)
		return -1;
	if (verify_peer(fd, &ex->bridge_id, err) < 0)
		return -1;
	if (wire_recv(fd, &f, buf, sizeof(buf), err) != 1)
		return tt_err_set(err, TT_ERR_TRANSPORT, "its bridge sent no adoption challenge");
	o = f.type == WIRE_HELLO ? wire_frame_json(&f, NULL) : NULL;
	rc = o != NULL && hello_b64_decode(json_string_value(json_object_get(o,
	                                   "adopt_challenge")), chal) == 0 ? 0 : -1;
	json_decref(o);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "its bridge sent no adoption challenge");
	hello_mac(r->adopt_key, HELLO_ADOPT_LABEL, r->id.sbx, r->id.gen, r->id.att, chal, proof);
	hello_b64_encode(proof, b64);
	sodium_memzero(proof, sizeof(proof));
	o = json_pack("{s:s}", "proof", b64);
	rc = o != NULL ? wire_send_json(fd, WIRE_HELLO, o, err) : -1;
	json_decref(o);
	if (rc < 0)
		return -1;
	if (wire_recv(fd, &f, buf, sizeof(buf), err) != 1)
		return tt_err_set(err, TT_ERR_TRANSPORT, "its bridge closed without an answer");
	o = wire_frame_json(&f, NULL);
	rc = f.type == WIRE_HELLO && json_is_true(json_object_get(o, "adopted")) ? 0 : -1;
	if (rc < 0)
		tt_err_set(err, TT_ERR_VERIFY, "its bridge refused: %.160s",
		           o && json_string_value(json_object_get(o, "message")) ?
		           json_string_value(json_object_get(o, "message")) : "?");
	json_decref(o);
	return rc;
}

/* recover: after a restart, adopt executions whose processes are still the
 * recorded ones; mark the others lost (admission: RefreshRoute). */
static void recover(struct manager *m)
{
	for (size_t i = 0; i < records_count(m->db); i++) {
		const struct rec_exec *r = records_at(m->db, i);
		bool init_ok = proc_matches(r->init_pid, r->init_start);
		bool bridge_ok = proc_matches(r->bridge_pid, r->bridge_start);
		struct mgr_exec *ex;
		struct tt_err err = { 0 };
		char dir[1200];
		bool pinned;

		if (r->state != REC_RUNNING || r->retired || !init_ok || !bridge_ok) {
			kill_verified(r->bridge_pid, r->bridge_start);
			kill_verified(r->init_pid, r->init_start);
			/* A pause cut short by our death left it frozen. */
			ns_freezer_release(r->id.sbx, r->id.gen);
			cgroups_release(r);
			/* Our mounts outlive us (we share the host's mount
			 * namespace): a layer nothing runs on is unmounted. */
			layer_unmount_of(m, r->id.sbx);
			if (r->state == REC_RUNNING || r->state == REC_STARTING) {
				log_warn("execution %s generation %" PRIu64 " lost across restart",
				         r->id.sbx, r->id.gen);
				mark_state(m, r->id.sbx, r->retired ? REC_STOPPED : REC_LOST);
			}
			continue;
		}
		ex = calloc(1, sizeof(*ex));
		if (ex == NULL)
			continue;
		exec_runtime_init(m, ex);
		snprintf(ex->sbx, sizeof(ex->sbx), "%s", r->id.sbx);
		ns_sandbox_init(&ex->sb);
		ex->sb.init_pid = r->init_pid;
		ex->sb.init_start_time = r->init_start;
		/* Its cgroups, so that stopping it later removes them. */
		ns_cgroup_find(r->id.sbx, r->id.gen, &ex->sb);
		ex->sb.pidfd = pidfd_open_raw(r->init_pid);
		sandbox_dir(m, r->id.sbx, dir, sizeof(dir));
		snprintf(ex->sb.guest_socket, sizeof(ex->sb.guest_socket), "%s/run/guest.sock", dir);
		ex->bridge_pid = r->bridge_pid;
		ex->bridge_start = r->bridge_start;
		ex->bridge_pidfd = -1;
		/* The bridge as it runs now, pinned (pidfd + recheck): the
		 * identity its connections are verified against, provided its
		 * start time is the recorded one. */
		pinned = procid_pin(r->bridge_pid, &ex->bridge_id, &ex->bridge_pidfd, &err) == 0 &&
		         ex->bridge_id.start_time == r->bridge_start;
		if (ex->sb.pidfd < 0 || !pinned ||
		    !proc_matches(r->init_pid, r->init_start) ||
		    bridge_adopt(m, ex, r, &err) < 0 || exec_watch(m, ex, &err) < 0) {
			int init_fd = ex->sb.pidfd, bridge_fd = ex->bridge_pidfd;

			log_warn("execution %s generation %" PRIu64 " not adopted%s%s: stopping it",
			         r->id.sbx, r->id.gen, err.msg[0] ? ": " : "", err.msg);
			uvutil_pool_free(ex->pool);
			exec_free(ex); /* its polls leave epoll while their fds are open */
			if (init_fd >= 0)
				close(init_fd);
			if (bridge_fd >= 0)
				close(bridge_fd);
			/* Alive but out of our reach: not left running. */
			kill_verified(r->bridge_pid, r->bridge_start);
			kill_verified(r->init_pid, r->init_start);
			ns_freezer_release(r->id.sbx, r->id.gen);
			cgroups_release(r);
			mark_state(m, r->id.sbx, REC_LOST);
			layer_unmount_of(m, r->id.sbx);
			continue;
		}
		if (!ns_layer_mounted(dir))
			log_warn("adopted %s without its layer mounted on the host: a pause "
			         "will be refused", r->id.sbx);
		log_info("adopted %s generation %" PRIu64 " (init pid %d)", r->id.sbx,
		         r->id.gen, (int)r->init_pid);
	}
}

/* shutdown_all: stops every execution and the server; the loop ends. */
static void shutdown_all(struct manager *m)
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
	if (!m->spare_busy && remove_tree(m->spare_dir) < 0)
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
	shutdown_all(s->data);
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
		                " [--disk-mb N] [--disk-inodes N]\n");
		return -1;
	}
	return 0;
}

/* listen_socket: the manager socket, mode 0600, stale file replaced; owned
 * by the peer's uid when that is not ours, so that only it can connect. */
static int listen_socket(struct manager *m, struct tt_err *err)
{
	if (uvutil_listen(m->loop, &m->server, m->sock_path, 128, on_connection, m, err) < 0)
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
		shutdown_all(m);
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

/* manager_main: the sbx-manager role. */
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
	for (int64_t until = now_ms() + wait_ms; flock(fd, LOCK_EX | LOCK_NB) < 0;) {
		if (errno != EWOULDBLOCK || now_ms() >= until) {
			log_error("%s: another sbx-manager runs on this state directory (%s)",
			          path, strerror(errno));
			close(fd);
			return -1;
		}
		usleep(20000);
	}
	return 0; /* fd stays open (and locked) for our lifetime */
}

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
	if (parse_args(m, argc, argv) < 0)
		return 1;
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
	recover(m);
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
	if (rc != 0) { /* shutdown_all did not run */
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

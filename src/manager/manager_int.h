/* sbx-manager: what its pieces share (the files of src/manager/): the
 * runtime state of the daemon, its executions and connections, and the few
 * calls one piece makes into another. Private to src/manager/. */
#ifndef TT_MANAGER_MANAGER_INT_H
#define TT_MANAGER_MANAGER_INT_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "claims.h"
#include "err.h"
#include "feedsig.h"
#include "hello.h"
#include "manager/bridgectl.h"
#include "manager/records.h"
#include "manager/uids.h"
#include "procid.h"
#include "substrate/substrate.h"
#include "wire.h"
#include "uvutil.h"
#include "wirecode.h"

struct relay;
struct uvutil_pool;
struct capcache;

/* Runtime (non-durable) state of one execution running here: the sandbox,
 * its bridge and the pidfd watchers. Owned by manager.execs. */
struct mgr_exec {
	struct manager *m;
	char sbx[TT_SBX_ID_LEN + 1];
	struct substrate_exec sub; /* its substrate (substrate.h) */
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
	/* The activation's adoption key (lib/hello.h): recorded, so that a
	 * successor of ours can take over the bridge. */
	uint8_t adopt_key[HELLO_PROOF_LEN];
	struct mgr_exec *next;
};

/* One accepted node-api connection, serving its operations in sequence;
 * a relay holds both streams while an admitted operation runs. */
struct mgr_conn {
	/* First: the server skeleton's part (lib/uvutil.h): served, the
	 * REQUEST decoder, the bytes after the REQUEST (owned). */
	struct uvutil_reqconn rc;
	struct manager *m;
	uint64_t exec_serial;     /* mgr_exec.serial of the bridge in use */
	uv_pipe_t *conn;          /* owned until handed to the relay */
	uv_pipe_t *bridge;        /* owned until handed to the relay */
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

/* Why an execution was lost while we ran (recover_adopt's finds get a
 * generic reason): what a watcher is told. Owned by manager.lost. */
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
	struct uvutil_server srv;  /* server.data: the skeleton's hooks */
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
	int64_t spare_retry_at;    /* mgr_now_ms() before which no refill runs */
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
	/* This worker's host id range (--uid-base; manager/uids.h) and each
	 * sandbox's CPU bandwidth in millicores (--cpu-millis; 0 = none). */
	uid_t uid_base;
	uint32_t cpu_millis;
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
	/* The microvm substrate (vm.c): its assets and the probe's verdict,
	 * made at the first microvm install (vm_checked), cached on disk. */
	bool vm_checked, vm_ok, vm_kvm;
	char vm_assets[PATH_MAX];
	char vm_why[256];
};

/* ---- manager.c -------------------------------------------------------- */

/* pidfd_open_raw: glibc 2.36 lacks a wrapper in older headers. */
int pidfd_open_raw(pid_t pid);
/* pidfd_signal: signals through a pidfd (no pid-reuse race). */
int pidfd_signal(int pidfd, int sig);
/* mgr_now_ms: monotonic milliseconds. */
int64_t mgr_now_ms(void);
/* mgr_now_us: monotonic microseconds. */
int64_t mgr_now_us(void);
/* manager_shutdown: stops every execution and the server; the loop ends. */
void manager_shutdown(struct manager *m);

/* ---- conn.c ----------------------------------------------------------- */

/* waiting_add: c now reads its next REQUEST (shutdown closes it). */
void waiting_add(struct mgr_conn *c);
/* conn_free: releases a connection context and whatever it still owns. */
void conn_free(struct mgr_conn *c);
/* conn_fail: tells the opener why (ERROR), then closes. */
void conn_fail(struct mgr_conn *c, enum wire_code code, const char *msg);
/* conn_server_ops: node-api's connections on the server skeleton
 * (lib/uvutil.h): the peer check, then one REQUEST at a time. */
extern const struct uvutil_server_ops conn_server_ops;

/* ---- admit.c ---------------------------------------------------------- */

/* admit_data_op: admission, DECISION, then (allowed) connect the bridge. */
void admit_data_op(struct mgr_conn *c);

/* ---- exec.c ----------------------------------------------------------- */

/* exec_find: runtime state of sbx, or NULL. */
struct mgr_exec *exec_find(struct manager *m, const char *sbx);
/* sandbox_dir: <state>/sandboxes/<sbx>. */
int sandbox_dir(const struct manager *m, const char *sbx, char *out, size_t cap);
/* uid_base_of: the host id base of a record's slot (as exec_start maps it). */
uid_t uid_base_of(const struct manager *m, const struct rec_exec *rec);
/* exec_free: frees ex once libuv is done with the poll handles that were
 * initialised (at once when none was): freeing it under a handle still
 * on the loop's closing list would be a use after free. */
void exec_free(struct mgr_exec *ex);
/* cancel_leases: every stream opened under sbx's current epoch stops now
 * and its opener is told to refresh the route (SPEC §6). */
void cancel_leases(struct manager *m, const char *sbx);
/* cancel_input_streams: at a pause's retirement, the streams with open
 * input (exec with "stdin": interactive, open-ended) lose their lease at
 * once (SPEC §6/§7): input and output stop, the client is told
 * refresh_route. Every other operation in flight — an exec streamed
 * without stdin included: bounded by its command like an HTTP exec — may
 * still finish during the drain, so what it did and acknowledged is in
 * the snapshot, and a short command never notices the pause. */
void cancel_input_streams(struct manager *m, const char *sbx);
/* exec_stop: stops the bridge and the sandbox of one execution and drops
 * its runtime state (the durable record is the caller's business). */
void exec_stop(struct manager *m, struct mgr_exec *ex);
/* exec_mark_state: persists a new state for sbx (best effort, logged). */
void exec_mark_state(struct manager *m, const char *sbx, enum rec_state st);
/* exec_watch: starts the pidfd watchers and links the runtime state. */
int exec_watch(struct manager *m, struct mgr_exec *ex, struct tt_err *err);
/* exec_cfg: what every sandbox of ours shares: the agent, the uid range
 * of slot, the layer's cap, and the spare netns (then consumed: the caller
 * closes it) and the clean mount namespace when there are. */
void exec_cfg(struct manager *m, struct ns_config *cfg, const char *dir,
              uint32_t slot);
/* exec_cpu: the CPU cap rec runs under, in millicores: the one its
 * install asked, else ours (--cpu-millis; 0 = none). */
uint32_t exec_cpu(const struct manager *m, const struct rec_exec *rec);
/* exec_runtime_init: what every runtime state starts with, started here
 * or adopted after a restart: its owner, a serial never handed out before,
 * and its (empty) pool of bridge connections (NULL when out of memory:
 * then none is kept). */
void exec_runtime_init(struct manager *m, struct mgr_exec *ex);
/* exec_start: starts the sandbox and its bridge for rec (state starting);
 * fills the runtime state. Nothing is left running on failure. */
struct mgr_exec *exec_start(struct manager *m, const struct rec_exec *rec,
                            struct tt_err *err);

/* ---- layer.c ---------------------------------------------------------- */

/* sandbox_tree_remove: deletes a sandbox directory; its layer filesystem is
 * unmounted and its image deleted first (the removal stays on the
 * directory's own filesystem, so a layer still mounted would be left
 * behind, files and loop device included); fd-relative at any depth,
 * never following symlinks planted by the sandbox (ns_tree_remove). */
int sandbox_tree_remove(const char *path);
/* layer_unmount_of: unmounts the layer of sbx (the image stays): done
 * whenever its execution stops, so a layer is mounted only while an
 * execution runs on it (or it is the spare's). */
void layer_unmount_of(struct manager *m, const char *sbx);
/* snapshots_gc: at start, the partial snapshots (a pause cut short by a
 * crash) and orphaned pieces older than an hour leave the shared store:
 * nothing else ever removed them. A pause running now on another worker
 * writes far more recently than that. */
void snapshots_gc(struct manager *m);
/* snapshots_remove: a destroyed sandbox's snapshots leave the shared
 * store (their files were readable there for good, and took its space);
 * best effort: what cannot go now is logged. */
void snapshots_remove(struct manager *m, const char *sbx);
/* layer_restore: replaces <sandbox_dir>/layer by the complete snapshot key
 * (checksum verified while unpacking, all or nothing; ids shifted to this
 * slot's uid base). Missing or partial snapshots fail. A layer left by an
 * older execution here is never reused: its tree and image are deleted
 * and the snapshot goes into a fresh filesystem (the spare's when there
 * is one, else one made now) rather than into the old one emptied: that
 * is cheaper than deleting a big tree file by file, and nothing of the
 * old filesystem (its size, stray inodes) survives. On failure nothing
 * stays mounted. */
int layer_restore(struct manager *m, const struct rec_exec *rec,
                  const char *key, struct tt_err *err);
/* layer_discard: the layer of sbx once its snapshot is published: it
 * lives in the store now, and resumes always restore it. Its image goes
 * (unmounted first), then the mount point. */
void layer_discard(struct manager *m, const char *sbx);

/* ---- spare.c ---------------------------------------------------------- */

/* spare_kick: schedules a refill right after the current loop iteration,
 * or once a failure's backoff is over. */
void spare_kick(struct manager *m);
/* spare_sb_stop: stops the spare sandbox, if any (its slot is free again). */
void spare_sb_stop(struct manager *m);
/* spare_sb_take: back on the loop, the launch's result (waiting for it if
 * it is still running: a create needs the spare tree): the spare sandbox
 * is up, or the failure logged. */
void spare_sb_take(struct manager *m);
/* spare_claim: renames the spare tree to dir if dir does not exist yet (a
 * restore or a retry keeps its own), then schedules a refill. Best effort:
 * without a spare, the sandbox start makes the directories itself. The
 * spare sandbox running in it goes to *sb when sb is given and it still
 * runs (the caller assigns it, in the slot it holds); otherwise it is
 * stopped first. Returns whether *sb got it. */
bool spare_claim(struct manager *m, const char *dir, struct ns_sandbox *sb);
/* spare_init: fresh spares (a tree left by an earlier run is made again). */
void spare_init(struct manager *m);

/* ---- apply.c ---------------------------------------------------------- */

/* update_str: a bounded string member of an update ("" allowed only when
 * empty_ok). */
const char *update_str(json_t *u, const char *key, size_t max, bool empty_ok);
/* update_u64: a positive integer member of an update; 0 when absent/bad. */
uint64_t update_u64(json_t *u, const char *key);
/* apply_feed: {"op":"feed.apply","updates":[...]}: starts applying;
 * the RESULT follows (maybe after a pause). -1: bad request. */
int apply_feed(struct mgr_conn *c);

/* ---- pause.c ---------------------------------------------------------- */

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
json_t *pause_published(struct manager *m, json_t *u, uint64_t rev);
/* pause_done_fn: a pause ended; result (owned by the callee) is its
 * answer for the feed.apply's RESULT. */
typedef void (*pause_done_fn)(void *arg, json_t *result);
/* pause_start: pause {sandbox,generation,snapshot}. Retires at once
 * (persisted), then continues asynchronously: done runs once it ended,
 * progress goes to c meanwhile; -1 when it cannot start (done never runs). */
int pause_start(struct manager *m, struct mgr_conn *c, json_t *u, uint64_t rev,
                pause_done_fn done, void *arg, struct tt_err *err);

/* ---- vm.c ------------------------------------------------------------- */

/* vm_ready: the microvm substrate can run here (its assets built and a
 * probe boot passed, KVM or TCG; done once, then remembered). -1 with why. */
int vm_ready(struct manager *m, struct tt_err *err);

/* ---- recover.c -------------------------------------------------------- */

/* lost_forget: sbx runs again (or is gone): its loss is no news. */
void lost_forget(struct manager *m, const char *sbx);
/* lost_note: remembers why r was lost (for a watcher that comes later)
 * and tells the watcher now. */
void lost_note(struct manager *m, const struct rec_exec *r,
               const char *reason, bool reactivate);
/* watch_start: {"op":"watch"}: the connection hears of every execution
 * lost from now on, first of those lost already (found so at start: the
 * worker restarted without their processes; relaunched as the next
 * generation). */
void watch_start(struct mgr_conn *c);
/* recover_adopt: after a restart, adopt executions whose processes are still the
 * recorded ones; mark the others lost (admission: RefreshRoute). */
void recover_adopt(struct manager *m);

#endif

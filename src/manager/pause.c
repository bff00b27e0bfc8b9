/* sbx-manager: pause (lifecycle.md, SPEC §7): retire, drain, freeze, then
 * publish the layer as a snapshot on a worker thread; the feed.apply
 * that asked for it goes on from the pause's completion callback. */
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <uv.h>

#include "cleanup.h"
#include "log.h"
#include "manager/manager_int.h"
#include "relay.h"
#include "snapstore.h"

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

/* One pause in progress (feed.apply is sequential: at most one). Started
 * by a feed.apply, told its result through done; freed when its timer has
 * closed. */
struct mgr_pause {
	struct manager *m;
	struct mgr_conn *c;          /* the feed.apply's: progress goes there */
	pause_done_fn on_done;
	void *on_done_arg;
	char sbx[TT_SBX_ID_LEN + 1];
	uint64_t gen, rev;
	uid_t uid_base;
	char dir[PATH_MAX];          /* the sandbox dir */
	char layer[PATH_MAX];        /* the tree the snapshot packs */
	struct substrate_exec sub;   /* a copy, for the worker thread */
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

	if (p->c->conn == NULL)
		return;
	o = json_pack("{s:{s:I,s:s,s:I,s:I}}", "progress", "rev", (json_int_t)p->rev,
	              "sandbox", p->sbx, "bytes", (json_int_t)done, "total",
	              (json_int_t)total);
	if (o != NULL)
		relay_write_json((uv_stream_t *)p->c->conn, WIRE_DATA_OUT, o, NULL);
	json_decref(o);
	p->sent = done;
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

/* pause_published: see manager_int.h. */
json_t *pause_published(struct manager *m, json_t *u, uint64_t rev)
{
	const char *sbx = update_str(u, "sandbox", TT_SBX_ID_LEN, false);
	const char *snap = update_str(u, "snapshot", SNAPSTORE_KEY_MAX, false);
	uint64_t gen = update_u64(u, "generation");
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
	exec_mark_state(m, sbx, REC_STOPPED);
	layer_discard(m, sbx);
	return pause_result_ok(rev, sbx, gen, &info);
}

/* pause_end: stops the (retired) execution's processes, records the
 * result and tells the one that started it (on_done). */
static void pause_end(struct mgr_pause *p, int rc)
{
	struct manager *m = p->m;
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
	exec_mark_state(m, p->sbx, REC_STOPPED);
	if (rc == 0) {
		r = pause_result_ok(p->rev, p->sbx, p->gen, &p->info);
		log_info("paused %s generation %" PRIu64 ": snapshot %s/%" PRIu64 ", %" PRIu64
		         " bytes, %" PRId64 " ms", p->sbx, p->gen, p->sbx, p->gen, p->info.size,
		         mgr_now_ms() - p->started_ms);
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
	uv_timer_stop(&p->timer);
	uv_close((uv_handle_t *)&p->timer, pause_closed);
	p->on_done(p->on_done_arg, r);
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

	p->rc = -1;
	/* microvm: memory and devices to disk first (QEMU's migration) */
	if (substrate_snapshot_prepare(&p->sub, p->dir, p->uid_base, &p->err) < 0)
		return;
	atomic_store(&p->total, layer_estimate(p->layer));
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
	if (substrate_freeze(&ex->sub, MGR_FREEZE_MS, &p->err) < 0) {
		pause_end(p, -1);
		return;
	}
	p->sub = ex->sub;
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

	if (ops_of(p->m, p->sbx) > 0 && mgr_now_ms() < p->drain_deadline)
		return;
	uv_timer_stop(t);
	for (c = p->m->ops; c; c = next) {
		next = c->next;
		if (strcmp(c->sbx, p->sbx) == 0 && c->relay != NULL) {
			log_warn("pause of %s: failing an operation still running after %d ms",
			         p->sbx, MGR_DRAIN_MS);
			relay_abort(c->relay, WIRE_E_TRANSPORT,
			            "the sandbox was paused while this operation ran");
		}
	}
	pause_freeze(p);
}

/* pause_start: see manager_int.h. */
int pause_start(struct manager *m, struct mgr_conn *c, json_t *u, uint64_t rev,
                pause_done_fn done, void *arg, struct tt_err *err)
{
	const char *sbx = update_str(u, "sandbox", TT_SBX_ID_LEN, false);
	const char *snap = update_str(u, "snapshot", SNAPSTORE_KEY_MAX, false);
	uint64_t gen = update_u64(u, "generation");
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
	if (strcmp(cur->id.sst, "microvm") != 0 && !ns_layer_mounted(dir))
		return tt_err_set(err, TT_ERR_CONFLICT, "pause: the layer of %s is not "
		                  "mounted here", sbx);
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	p->uid_base = uid_base_of(m, cur);
	/* Retire first, durably: from here admission answers RefreshRoute. */
	if (records_retire(m->db, sbx, gen, 0, err) < 0) {
		free(p);
		return -1;
	}
	cancel_input_streams(m, sbx);
	p->m = m;
	p->c = c;
	p->on_done = done;
	p->on_done_arg = arg;
	snprintf(p->sbx, sizeof(p->sbx), "%s", sbx);
	p->gen = gen;
	p->rev = rev;
	snprintf(p->dir, sizeof(p->dir), "%s", dir);
	substrate_snapshot_tree(strcmp(cur->id.sst, "microvm") == 0 ? SUBSTRATE_MICROVM
	                        : SUBSTRATE_NS, dir, p->layer, sizeof(p->layer));
	p->started_ms = mgr_now_ms();
	p->drain_deadline = p->started_ms + MGR_DRAIN_MS;
	uv_timer_init(m->loop, &p->timer);
	p->timer.data = p;
	log_info("pausing %s generation %" PRIu64 " (rev %" PRIu64 "): retired, "
	         "%zu operation(s) in flight", sbx, gen, rev, ops_of(m, sbx));
	uv_timer_start(&p->timer, pause_drain_cb, 0, MGR_DRAIN_POLL_MS);
	return 0;
}

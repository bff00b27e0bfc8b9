/* sbx-manager: feed apply (SPEC §7). apply_feed is the one entry point of
 * the control plane's updates: they are applied in revision order, each
 * persisted before it takes effect, and answered in one RESULT. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

#include "cleanup.h"
#include "log.h"
#include "manager/manager_int.h"
#include "relay.h"
#include "snapstore.h"

#define MGR_UPDATES_MAX 1000      /* updates in one feed.apply */

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

/* update_str: see manager_int.h. */
const char *update_str(json_t *u, const char *key, size_t max, bool empty_ok)
{
	const char *s = json_string_value(json_object_get(u, key));

	if (s == NULL && empty_ok && json_object_get(u, key) == NULL)
		return "";
	if (s == NULL || strlen(s) > max || (!empty_ok && s[0] == '\0'))
		return NULL;
	return s;
}

/* update_u64: see manager_int.h. */
uint64_t update_u64(json_t *u, const char *key)
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
			exec_mark_state(m, sbx, REC_STOPPED);
	}
	cancel_leases(m, sbx);
	return rc;
}

/* layer_held: sbx's layer image is here (a regular file, not followed). */
static bool layer_held(struct manager *m, const char *sbx)
{
	char dir[PATH_MAX], img[PATH_MAX + 32];
	struct stat st;

	/* ns: its layer image; microvm: its disk (layer.qcow2) */
	return sandbox_dir(m, sbx, dir, sizeof(dir)) == 0 &&
	       (((size_t)snprintf(img, sizeof(img), "%s/" NS_LAYER_IMG, dir) < sizeof(img) &&
	         lstat(img, &st) == 0 && S_ISREG(st.st_mode)) ||
	        ((size_t)snprintf(img, sizeof(img), "%s/" MICROVM_DISK_DIR "/" MICROVM_LAYER, dir) <
	         sizeof(img) && lstat(img, &st) == 0 && S_ISREG(st.st_mode)));
}

/* apply_install: install {sandbox,generation,worker,substrate,pod,activation}
 * (+ snapshot: restore it first; + from_layer: relaunch on the layer held
 * here; + cpu: its CPU cap in millicores, else ours, --cpu-millis). */
static int apply_install(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	const char *sbx = update_str(u, "sandbox", TT_SBX_ID_LEN, false);
	const char *wrk = update_str(u, "worker", TT_NAME_MAX, false);
	const char *sst = update_str(u, "substrate", TT_NAME_MAX, false);
	const char *pod = update_str(u, "pod", TT_NAME_MAX, true);
	json_t *jsnap = json_object_get(u, "snapshot");
	const char *snap = json_string_value(jsnap); /* resume: restore first */
	/* a relaunch after a lost execution: on the layer held here, never on
	 * an empty one */
	bool from_layer = json_is_true(json_object_get(u, "from_layer"));
	uint64_t gen = update_u64(u, "generation"), att = update_u64(u, "activation");
	int64_t cpu = feedsig_cpu(u); /* bounded by feedsig_open already */
	const struct rec_exec *cur;
	struct rec_exec rec = { 0 };
	struct mgr_exec *ex;
	int64_t t_put, t_start, t_put2, t_end;
	enum substrate_kind kind = SUBSTRATE_NS;

	if (sbx == NULL || !sbx_id_valid(sbx) || wrk == NULL || sst == NULL ||
	    pod == NULL || gen == 0 || att == 0 || att > UINT32_MAX || cpu < 0 ||
	    (jsnap != NULL && !json_is_null(jsnap) &&
	     (snap == NULL || strlen(snap) >= SNAPSTORE_KEY_MAX)))
		return tt_err_set(err, TT_ERR_MALFORMED, "install: bad or missing fields");
	if (strcmp(wrk, m->worker_id) != 0)
		return records_set_applied_rev(m->db, rev, err); /* not ours */
	if (substrate_parse(sst, &kind) < 0)
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
	rec.cpu_millis = (uint32_t)cpu;
	rec.epoch = cur ? cur->epoch + 1 : 1;
	/* A fresh sandbox takes the spare sandbox's slot (and so the spare);
	 * any other slot must avoid it. */
	spare_sb_take(m); /* a launch still running: its slot is decided */
	rec.slot = cur ? cur->slot : m->spare_sb_on && snap == NULL && kind == SUBSTRATE_NS
	           ? m->spare_sb_slot :
	           records_free_slot_except(m->db, m->spare_sb_on ? m->spare_sb_slot
	                                                          : UINT32_MAX);
	rec.state = REC_STARTING;
	/* An older execution here is retired and stopped first (epoch bump). */
	if (cur != NULL && retire_and_stop(m, cur, 0, err) < 0)
		return -1;
	t_put = mgr_now_us();
	if (records_put(m->db, &rec, 0, err) < 0)
		return -1;
	t_start = mgr_now_us();
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
	{
		struct substrate_owner own;

		substrate_owner(&ex->sub, &own);
		rec.init_pid = own.pid;
		rec.init_start = own.start_time;
	}
	rec.bridge_pid = ex->bridge_pid;
	rec.bridge_start = ex->bridge_start;
	memcpy(rec.adopt_key, ex->adopt_key, sizeof(rec.adopt_key));
	rec.has_adopt_key = true;
	/* Persist, then apply: admission sees the execution only once the
	 * record with its pids is committed. */
	t_put2 = mgr_now_us();
	if (records_put(m->db, &rec, rev, err) < 0 || exec_watch(m, ex, err) < 0) {
		exec_stop(m, ex);
		return -1;
	}
	t_end = mgr_now_us();
	log_info("installed %s generation %" PRIu64 " activation %" PRIu64
	         " (init pid %d, bridge pid %d, epoch %" PRIu64 ", cpu %" PRIu32 "m%s) in"
	         " %.2f ms: record %.2f, sandbox %.2f, bridge spawn %.2f, both ready %.2f,"
	         " record %.2f", sbx, gen, att, (int)rec.init_pid, (int)rec.bridge_pid,
	         rec.epoch, exec_cpu(m, &rec), rec.cpu_millis ? "" : " by default",
	         (double)(t_end - t_put) / 1000, (double)(t_start - t_put) / 1000,
	         (double)ex->launch_us / 1000, (double)ex->spawn_us / 1000,
	         (double)ex->ready_us / 1000, (double)(t_end - t_put2) / 1000);
	return 0;
}

/* apply_retire: retire {sandbox,generation}. */
static int apply_retire(struct manager *m, json_t *u, uint64_t rev, struct tt_err *err)
{
	const char *sbx = update_str(u, "sandbox", TT_SBX_ID_LEN, false);
	uint64_t gen = update_u64(u, "generation");
	const struct rec_exec *cur;

	if (sbx == NULL || !sbx_id_valid(sbx) || gen == 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "retire: bad or missing fields");
	cur = records_get(m->db, sbx);
	if (cur == NULL || cur->id.gen != gen)
		return records_set_applied_rev(m->db, rev, err);
	log_info("retiring %s generation %" PRIu64, sbx, gen);
	return retire_and_stop(m, cur, rev, err);
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
	const char *sbx = update_str(u, "sandbox", TT_SBX_ID_LEN, false);
	uint64_t gen = update_u64(u, "generation");
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
	const char *sbx = update_str(u, "sandbox", TT_SBX_ID_LEN, false);
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
	if (sandbox_dir(m, sbx, dir, sizeof(dir)) == 0 && sandbox_tree_remove(dir) < 0)
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

/* apply_paused: a pause's completion: its result, then the next updates. */
static void apply_paused(void *arg, json_t *result)
{
	struct mgr_apply *ap = arg;

	json_array_append_new(ap->results, result);
	apply_continue(ap);
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
		uint64_t rev = update_u64(u, "rev");
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
			if (pause_start(m, ap->c, u, rev, apply_paused, ap, &err) == 0)
				return; /* apply_paused continues */
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

/* apply_feed: see manager_int.h. */
int apply_feed(struct mgr_conn *c)
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

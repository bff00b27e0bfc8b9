/* Control-plane store: sandboxes, their lifecycle compare-and-swaps and
 * snapshots (see db.h). Each write that implies feed updates runs in one
 * cpdb_txn with them; on PostgreSQL a transaction touches the sandbox row
 * before the feed counter (the guarded UPDATE, or cpdb_lock, comes
 * first), so two of them never wait on each other in a cycle. */
#include "cp/db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp/dbdrv.h"

/* cpdb_install_cpu: an install body carries the sandbox's CPU cap when
 * one was asked (absent: the worker's default; lib/feedsig.h). */
static int cpdb_install_cpu(json_t *body, int64_t cpu)
{
	return cpu > 0 ? json_object_set_new(body, "cpu", json_integer(cpu)) : 0;
}

/* The arguments of cpdb_sandbox_create's transaction. */
struct cpdb_create {
	const struct cp_sandbox *sb;
	int64_t *rev;
};

/* cpdb_create_txn: the row, its install update, the call's record. */
static int cpdb_create_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_create *c = arg;
	const struct cp_sandbox *sb = c->sb;
	struct cpdb_idem rec = { .generation = 1 };
	json_t *body;
	int rc;

	if (cpdb_change(db, err, "insert sandbox", "INSERT INTO sandboxes(id,state,"
	                "generation,worker,substrate,pod,activation,created_at,cpu)"
	                " VALUES(?1,'starting',1,?2,?3,'',1,?4,?5)", "tttii", sb->id,
	                sb->worker, sb->substrate, sb->created_at, sb->cpu) < 0)
		return -1;
	body = json_pack("{s:s,s:I,s:s,s:s,s:s,s:I,s:n}", "sandbox", sb->id,
	                 "generation", (json_int_t)1, "worker", sb->worker,
	                 "substrate", sb->substrate, "pod", "", "activation",
	                 (json_int_t)1, "snapshot");
	if (body == NULL || cpdb_install_cpu(body, sb->cpu) < 0) {
		json_decref(body);
		return tt_err_set(err, TT_ERR_NOMEM, "oom");
	}
	rc = cpdb_feed_insert(db, "install", sb->worker, body, sb->created_at, c->rev, err);
	json_decref(body);
	if (rc < 0)
		return -1;
	snprintf(rec.sandbox, sizeof(rec.sandbox), "%s", sb->id);
	snprintf(rec.worker, sizeof(rec.worker), "%s", sb->worker);
	rec.rev = *c->rev;
	return cpdb_idem_record(db, &rec, sb->created_at, err);
}

/* cpdb_sandbox_create: on the ns substrate. */
int cpdb_sandbox_create(struct cpdb *db, const char *id, const char *worker,
                        int64_t cpu, int64_t now, struct cp_sandbox *out,
                        int64_t *rev, struct tt_err *err)
{
	return cpdb_sandbox_create_on(db, id, worker, "ns", cpu, now, out, rev, err);
}

/* cpdb_sandbox_create_on: sandbox row + install update, atomically. */
int cpdb_sandbox_create_on(struct cpdb *db, const char *id, const char *worker,
                           const char *sst, int64_t cpu, int64_t now,
                           struct cp_sandbox *out, int64_t *rev, struct tt_err *err)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->id, sizeof(out->id), "%s", id);
	snprintf(out->state, sizeof(out->state), "starting");
	out->generation = 1;
	snprintf(out->worker, sizeof(out->worker), "%s", worker);
	snprintf(out->substrate, sizeof(out->substrate), "%s", sst);
	out->activation = 1;
	out->created_at = now;
	out->progress_bytes = out->progress_total = -1;
	out->cpu = cpu;
	return cpdb_txn(db, cpdb_create_txn, &(struct cpdb_create){ out, rev },
	                err) < 0 ? -1 : 0;
}

/* The arguments of cpdb_generation_next's transaction. */
struct cpdb_gennext {
	const char *id;
	int64_t g;
};

/* cpdb_gennext_txn: generation += 1, read back under the row's lock. */
static int cpdb_gennext_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_gennext *g = arg;
	int rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET"
	                     " generation=generation+1 WHERE id=?1", "t", g->id);

	if (rc == 0)
		return tt_err_set(err, TT_ERR_NOT_FOUND, "no sandbox %s", g->id);
	if (rc < 0)
		return -1;
	return cpdb_scalar(db, "SELECT generation FROM sandboxes WHERE id=?1",
	                   g->id, &g->g, err);
}

/* cpdb_generation_next: generation += 1 in a write transaction. */
int cpdb_generation_next(struct cpdb *db, const char *id, uint64_t *gen,
                         struct tt_err *err)
{
	struct cpdb_gennext g = { id, 0 };

	if (cpdb_txn(db, cpdb_gennext_txn, &g, err) < 0)
		return -1;
	*gen = (uint64_t)g.g;
	return 0;
}

/* cpdb_sandbox_row: row -> struct. */
static void cpdb_sandbox_row(const struct cpdb_row *r, void *out)
{
	struct cp_sandbox *s = out;

	cpdb_text(r, 0, s->id, sizeof(s->id));
	cpdb_text(r, 1, s->state, sizeof(s->state));
	s->generation = (uint64_t)cpdb_int(r, 2);
	cpdb_text(r, 3, s->worker, sizeof(s->worker));
	cpdb_text(r, 4, s->substrate, sizeof(s->substrate));
	cpdb_text(r, 5, s->pod, sizeof(s->pod));
	s->activation = (uint32_t)cpdb_int(r, 6);
	s->created_at = cpdb_int(r, 7);
	cpdb_text(r, 8, s->error, sizeof(s->error));
	s->op_rev = cpdb_int(r, 9);
	s->op_at = cpdb_int(r, 10);
	s->progress_bytes = cpdb_int(r, 11);
	s->progress_total = cpdb_int(r, 12);
	cpdb_text(r, 13, s->migrate_to, sizeof(s->migrate_to));
	cpdb_text(r, 14, s->note, sizeof(s->note));
	cpdb_text(r, 15, s->resume_on, sizeof(s->resume_on));
	s->relaunches = cpdb_int(r, 16);
	s->relaunch_at = cpdb_int(r, 17);
	s->cpu = cpdb_int(r, 18);
}

#define CPDB_SBX_COLS "id,state,generation,worker,substrate,pod,activation," \
                      "created_at,error,op_rev,op_at,progress_bytes," \
                      "progress_total,migrate_to,note,resume_on,relaunches," \
                      "relaunch_at,cpu"

/* cpdb_sandbox_get: one sandbox (deleted ones too: they keep their gen). */
int cpdb_sandbox_get(struct cpdb *db, const char *id, struct cp_sandbox *out,
                     struct tt_err *err)
{
	return cpdb_get1(db, "SELECT " CPDB_SBX_COLS " FROM sandboxes WHERE id=?1",
	                 id, cpdb_sandbox_row, out, "sandbox lookup", err);
}

/* What cpdb_sandboxes_each calls. */
struct cpdb_each_sbx {
	void (*fn)(const struct cp_sandbox *, void *);
	void *arg;
};

/* cpdb_each_sbx_row: one sandbox to the caller's fn. */
static int cpdb_each_sbx_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_each_sbx *e = arg;
	struct cp_sandbox s;

	cpdb_sandbox_row(r, &s);
	e->fn(&s, e->arg);
	return 0;
}

/* cpdb_sandboxes_each: live sandboxes, oldest first. */
int cpdb_sandboxes_each(struct cpdb *db,
                        void (*fn)(const struct cp_sandbox *, void *),
                        void *arg, struct tt_err *err)
{
	struct cpdb_each_sbx e = { fn, arg };

	return cpdb_select(db, err, "list sandboxes", "SELECT " CPDB_SBX_COLS
	                   " FROM sandboxes WHERE state<>'deleted'"
	                   " ORDER BY created_at, id", cpdb_each_sbx_row, &e, "");
}

/* cpdb_sandbox_set_state: state (+ error text, NULL clears it). */
int cpdb_sandbox_set_state(struct cpdb *db, const char *id, const char *state,
                           const char *error, struct tt_err *err)
{
	return cpdb_change(db, err, "set state", "UPDATE sandboxes SET state=?1,"
	                   "error=?2 WHERE id=?3", "ttt", state, error, id) < 0 ? -1 : 0;
}

/* The arguments of a transaction on one sandbox that appends updates. */
struct cpdb_op {
	const struct cp_sandbox *s;
	const char *migrate_to, *resume_on;
	int64_t now, *rev;
};

/* cpdb_destroy_txn: deleting, the destroy update, the call's record. */
static int cpdb_destroy_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_op *o = arg;
	struct cpdb_idem rec = { .generation = o->s->generation };
	json_t *body;
	int rc;

	if (cpdb_change(db, err, "update", "UPDATE sandboxes SET state='deleting',"
	                "error=NULL WHERE id=?1", "t", o->s->id) < 0)
		return -1;
	body = json_pack("{s:s}", "sandbox", o->s->id);
	rc = body ? cpdb_feed_insert(db, "destroy", o->s->worker, body, o->now,
	                             o->rev, err)
	          : tt_err_set(err, TT_ERR_NOMEM, "oom");
	json_decref(body);
	if (rc < 0)
		return -1;
	snprintf(rec.sandbox, sizeof(rec.sandbox), "%s", o->s->id);
	snprintf(rec.worker, sizeof(rec.worker), "%s", o->s->worker);
	rec.rev = *o->rev;
	return cpdb_idem_record(db, &rec, o->now, err);
}

/* cpdb_sandbox_destroy: deleting + destroy update for its worker. */
int cpdb_sandbox_destroy(struct cpdb *db, const struct cp_sandbox *s,
                         int64_t now, int64_t *rev, struct tt_err *err)
{
	struct cpdb_op o = { .s = s, .now = now, .rev = rev };

	return cpdb_txn(db, cpdb_destroy_txn, &o, err) < 0 ? -1 : 0;
}

/* cpdb_retire_insert: retire{sandbox, generation} for worker (in a txn). */
static int cpdb_retire_insert(struct cpdb *db, const char *id, uint64_t gen,
                              const char *worker, int64_t now, int64_t *rev,
                              struct tt_err *err)
{
	json_t *body = json_pack("{s:s,s:I}", "sandbox", id, "generation",
	                         (json_int_t)gen);
	int rc;

	if (body == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	rc = cpdb_feed_insert(db, "retire", worker, body, now, rev, err);
	json_decref(body);
	return rc;
}

/* cpdb_pause_txn: the pause CAS, its update, the call's record. */
static int cpdb_pause_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_op *o = arg;
	const struct cp_sandbox *s = o->s;
	struct cpdb_idem rec = { .generation = s->generation };
	char key[CPDB_SNAPKEY_MAX];
	json_t *body;
	int rc;

	snprintf(key, sizeof(key), "%s/%llu", s->id, (unsigned long long)s->generation);
	rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET state='pausing',"
	                 "error=NULL,op_at=?3,progress_bytes=-1,progress_total=-1,"
	                 "migrate_to=?4,resume_on=?5,note=''"
	                 " WHERE id=?1 AND state='running' AND generation=?2",
	                 "tiitt", s->id, (int64_t)s->generation, o->now,
	                 o->migrate_to != NULL ? o->migrate_to : "",
	                 o->resume_on != NULL ? o->resume_on : "");
	if (rc <= 0)
		return rc;
	body = json_pack("{s:s,s:I,s:s}", "sandbox", s->id, "generation",
	                 (json_int_t)s->generation, "snapshot", key);
	rc = body ? cpdb_feed_insert(db, "pause", s->worker, body, o->now, o->rev, err)
	          : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_decref(body);
	if (rc == 0)
		rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
		                 " WHERE id=?1", "ti", s->id, *o->rev);
	if (rc < 0)
		return -1;
	snprintf(rec.sandbox, sizeof(rec.sandbox), "%s", s->id);
	snprintf(rec.worker, sizeof(rec.worker), "%s", s->worker);
	snprintf(rec.target, sizeof(rec.target), "%s", o->migrate_to ? o->migrate_to : "");
	rec.rev = *o->rev;
	return cpdb_idem_record(db, &rec, o->now, err) < 0 ? -1 : 1;
}

/* cpdb_sandbox_pause: the pause CAS and its feed update, atomically. */
int cpdb_sandbox_pause(struct cpdb *db, const struct cp_sandbox *s,
                       const char *migrate_to, const char *resume_on,
                       int64_t now, int64_t *rev, struct tt_err *err)
{
	struct cpdb_op o = { s, migrate_to, resume_on, now, rev };

	return cpdb_txn(db, cpdb_pause_txn, &o, err);
}

/* cpdb_sandbox_migrate_clear: see db.h. */
int cpdb_sandbox_migrate_clear(struct cpdb *db, const char *id, uint64_t gen,
                               const char *error, struct tt_err *err)
{
	return cpdb_change(db, err, "update", "UPDATE sandboxes SET migrate_to='',"
	                   "resume_on='',error=?3"
	                   " WHERE id=?1 AND state='paused' AND generation=?2",
	                   "tit", id, (int64_t)gen, error);
}

/* What the generations of snapshots are collected into. */
struct cpdb_gens {
	uint64_t *out;
	size_t cap, *n;
};

/* cpdb_gens_row: one generation, while there is room. */
static int cpdb_gens_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_gens *g = arg;

	if (*g->n >= g->cap)
		return 1;
	g->out[(*g->n)++] = (uint64_t)cpdb_int(r, 0);
	return 0;
}

/* cpdb_snapshot_gens: see db.h. */
int cpdb_snapshot_gens(struct cpdb *db, const char *id, uint64_t *out, size_t cap,
                       size_t *n, struct tt_err *err)
{
	struct cpdb_gens g = { out, cap, n };

	*n = 0;
	return cpdb_select(db, err, "snapshot list", "SELECT generation FROM snapshots"
	                   " WHERE sandbox=?1 ORDER BY generation DESC", cpdb_gens_row,
	                   &g, "t", id);
}

/* cpdb_prune_txn: inside the recording transaction: the rows of id past
 * the newest keep_older + 1 go, and the prune update naming what stays
 * (the store's files of everything else below gen) is appended for
 * worker. */
static int cpdb_prune_txn(struct cpdb *db, const char *id, uint64_t gen,
                          unsigned keep_older, const char *worker, int64_t now,
                          int64_t *rev, struct tt_err *err)
{
	uint64_t kept[CPDB_KEEP_MAX + 1];
	size_t n = 0;
	json_t *body, *keep;
	int rc;

	if (keep_older > CPDB_KEEP_MAX)
		keep_older = CPDB_KEEP_MAX;
	if (cpdb_change(db, err, "prune snapshots", "DELETE FROM snapshots WHERE sandbox=?1"
	                " AND generation NOT IN (SELECT generation FROM snapshots"
	                " WHERE sandbox=?1 ORDER BY generation DESC LIMIT ?2)", "ti", id,
	                (int64_t)keep_older + 1) < 0 ||
	    cpdb_snapshot_gens(db, id, kept, keep_older + 1, &n, err) < 0)
		return -1;
	keep = json_array();
	for (size_t i = 0; keep != NULL && i < n; i++)
		json_array_append_new(keep, json_integer((json_int_t)kept[i]));
	body = keep != NULL ? json_pack("{s:s,s:I,s:o}", "sandbox", id, "generation",
	                                (json_int_t)gen, "keep", keep) : NULL;
	rc = body != NULL ? cpdb_feed_insert(db, "prune", worker, body, now, rev, err)
	                  : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_decref(body);
	return rc;
}

/* The arguments of cpdb_snapshot_record's transaction. */
struct cpdb_rec {
	const char *id;
	const struct cpdb_record *r;
	const struct cp_snapshot *snap;
	int64_t *prune_rev;
};

/* cpdb_record_txn: CAS to paused, the snapshot row, the pruning. */
static int cpdb_record_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_rec *a = arg;
	const struct cpdb_record *r = a->r;
	const struct cp_snapshot *snap = a->snap;
	int rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET state='paused',"
	                     "error=NULL,op_rev=0,progress_bytes=-1,progress_total=-1"
	                     " WHERE id=?1 AND state=?2 AND generation=?3"
	                     " AND (?4 < 0 OR op_rev=?4)", "ttii", a->id, r->from,
	                     (int64_t)r->gen, r->op_rev);

	if (rc <= 0)
		return rc;
	rc = cpdb_change(db, err, "update", "INSERT INTO snapshots(sandbox,"
	                 "generation,key,size,checksum,created_at)"
	                 " VALUES(?1,?2,?3,?4,?5,?6) ON CONFLICT(sandbox,generation)"
	                 " DO UPDATE SET key=?3,size=?4,checksum=?5,created_at=?6",
	                 "tititi", a->id, (int64_t)r->gen, snap->key, snap->size,
	                 snap->checksum, snap->created_at);
	if (rc >= 0 && r->worker != NULL)
		rc = cpdb_prune_txn(db, a->id, r->gen, r->keep_older, r->worker, r->now,
		                    a->prune_rev, err);
	return rc < 0 ? -1 : 1;
}

/* cpdb_snapshot_record: CAS to paused, the snapshot row, the pruning. */
int cpdb_snapshot_record(struct cpdb *db, const char *id, const struct cpdb_record *r,
                         const struct cp_snapshot *snap, int64_t *prune_rev,
                         struct tt_err *err)
{
	struct cpdb_rec a = { id, r, snap, prune_rev };

	if (snap->generation != r->gen)
		return 0; /* not this generation's snapshot: nothing changes */
	return cpdb_txn(db, cpdb_record_txn, &a, err);
}

/* cpdb_sandbox_paused: pausing -> paused plus the snapshot row (every
 * older one kept). */
int cpdb_sandbox_paused(struct cpdb *db, const char *id, uint64_t gen,
                        int64_t op_rev, const struct cp_snapshot *snap,
                        struct tt_err *err)
{
	struct cpdb_record r = { .from = "pausing", .gen = gen, .op_rev = op_rev };

	return cpdb_snapshot_record(db, id, &r, snap, NULL, err);
}

/* cpdb_preask_txn: a pause asked again (row locked first, dbdrv.h). */
static int cpdb_preask_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_op *o = arg;
	const struct cp_sandbox *s = o->s;
	char key[CPDB_SNAPKEY_MAX];
	json_t *body;
	int rc;

	snprintf(key, sizeof(key), "%s/%llu", s->id, (unsigned long long)s->generation);
	if (cpdb_lock(db, s->id, err) < 0)
		return -1;
	body = json_pack("{s:s,s:I,s:s,s:b}", "sandbox", s->id, "generation",
	                 (json_int_t)s->generation, "snapshot", key, "again", 1);
	rc = body ? cpdb_feed_insert(db, "pause", s->worker, body, o->now, o->rev, err)
	          : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_decref(body);
	/* A pause still pending waits for the new one's answer instead. */
	if (rc == 0)
		rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
		                 " WHERE id=?1 AND state='pausing' AND generation=?3",
		                 "tii", s->id, *o->rev, (int64_t)s->generation);
	return rc < 0 ? -1 : 0;
}

/* cpdb_pause_reask: a pause asked again, marked so (see db.h). */
int cpdb_pause_reask(struct cpdb *db, const struct cp_sandbox *s, int64_t now,
                     int64_t *rev, struct tt_err *err)
{
	struct cpdb_op o = { .s = s, .now = now, .rev = rev };

	return cpdb_txn(db, cpdb_preask_txn, &o, err) < 0 ? -1 : 0;
}

/* The arguments of cpdb_install_reask's transaction. */
struct cpdb_ireask {
	const struct cp_sandbox *s;
	json_t *body;
	int64_t now, *rev;
};

/* cpdb_ireask_txn: an install asked again (row locked first). */
static int cpdb_ireask_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_ireask *a = arg;
	int rc;

	if (cpdb_lock(db, a->s->id, err) < 0 ||
	    cpdb_feed_insert(db, "install", a->s->worker, a->body, a->now, a->rev, err) < 0)
		return -1;
	rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
	                 " WHERE id=?1 AND state IN ('starting','resuming')"
	                 " AND generation=?3", "tii", a->s->id, *a->rev,
	                 (int64_t)a->s->generation);
	return rc < 0 ? -1 : 0;
}

/* cpdb_install_reask: see db.h. */
int cpdb_install_reask(struct cpdb *db, const struct cp_sandbox *s, json_t *up,
                       int64_t now, int64_t *rev, struct tt_err *err)
{
	struct cpdb_ireask a = { s, json_deep_copy(up), now, rev };
	int rc;

	if (a.body == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_object_del(a.body, "rev");
	json_object_del(a.body, "kind");
	json_object_del(a.body, "worker");
	json_object_set_new(a.body, "again", json_true());
	rc = cpdb_txn(db, cpdb_ireask_txn, &a, err);
	json_decref(a.body);
	return rc < 0 ? -1 : 0;
}

/* The arguments of cpdb_sandbox_cas's transaction. */
struct cpdb_casargs {
	const char *id, *from;
	uint64_t gen;
	int64_t op_rev;
	const char *to, *error, *retire_worker;
	int64_t now, *retire_rev;
};

/* cpdb_cas_txn: the guarded change, then the retire. */
static int cpdb_cas_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_casargs *a = arg;
	int rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET state=?4,error=?6,"
	                     "op_rev=0,progress_bytes=-1,progress_total=-1,migrate_to='',"
	                     "resume_on=''"
	                     " WHERE id=?1 AND state=?2 AND generation=?3"
	                     " AND (?5 < 0 OR op_rev=?5)", "ttitit", a->id, a->from,
	                     (int64_t)a->gen, a->to, a->op_rev, a->error);

	if (rc <= 0)
		return rc;
	if (a->retire_worker != NULL &&
	    cpdb_retire_insert(db, a->id, a->gen, a->retire_worker, a->now,
	                       a->retire_rev, err) < 0)
		return -1;
	return 1;
}

/* cpdb_sandbox_cas: a guarded state change, optionally with a retire. */
int cpdb_sandbox_cas(struct cpdb *db, const char *id, const char *from,
                     uint64_t gen, int64_t op_rev, const char *to,
                     const char *error, const char *retire_worker,
                     int64_t now, int64_t *retire_rev, struct tt_err *err)
{
	struct cpdb_casargs a = { id, from, gen, op_rev, to, error, retire_worker,
	                          now, retire_rev };

	return cpdb_txn(db, cpdb_cas_txn, &a, err);
}

/* The arguments of cpdb_sandbox_resume's transaction. */
struct cpdb_resumeargs {
	const char *id;
	const struct cpdb_resume *r;
	int64_t now, *rev, *retire_rev;
};

/* cpdb_snapkey_gen: the generation in a snapshot key "<sbx>/<gen>". */
static uint64_t cpdb_snapkey_gen(const char *key)
{
	const char *slash = key ? strrchr(key, '/') : NULL;

	return slash ? strtoull(slash + 1, NULL, 10) : 0;
}

/* cpdb_resume_txn: the CAS first (it takes the row: a concurrent resume
 * of the same generation finds it changed and loses), then the install
 * built from the row as the CAS left it, after the retire (forced). */
static int cpdb_resume_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_resumeargs *a = arg;
	const struct cpdb_resume *r = a->r;
	struct cpdb_idem rec = { .forced = r->retire_worker != NULL };
	struct cp_sandbox cur;
	json_t *body;
	int rc;

	/* a relaunch (note set) counts towards its crash-loop bound: the
	 * count restarts after CPDB_RELAUNCH_WINDOW quiet seconds */
	rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET state='resuming',"
	                 "generation=?3+?6,activation=activation+?7,worker=?4,"
	                 "error=NULL,op_at=?5,progress_bytes=-1,progress_total=-1,"
	                 "migrate_to='',resume_on='',note=?8,"
	                 "relaunches=CASE WHEN ?8='' THEN relaunches"
	                 " WHEN relaunch_at>?5-?9 THEN relaunches+1 ELSE 1 END,"
	                 "relaunch_at=CASE WHEN ?8='' THEN relaunch_at ELSE ?5 END"
	                 " WHERE id=?1 AND state=?2 AND generation=?3",
	                 "ttitiiiti", a->id, r->from, (int64_t)r->gen, r->worker, a->now,
	                 (int64_t)(r->reactivate ? 0 : 1),
	                 (int64_t)(r->reactivate ? 1 : 0),
	                 r->note != NULL ? r->note : "",
	                 (int64_t)CPDB_RELAUNCH_WINDOW);
	if (rc <= 0)
		return rc; /* lost the CAS (0), or an error */
	rc = cpdb_sandbox_get(db, a->id, &cur, err);
	if (rc <= 0)
		return rc < 0 ? -1 : tt_err_set(err, TT_ERR_IO, "resume: row vanished");
	if (r->retire_worker != NULL &&
	    cpdb_retire_insert(db, a->id, r->gen, r->retire_worker, a->now,
	                       a->retire_rev, err) < 0)
		return -1;
	/* without a snapshot: the worker starts it on the layer it holds
	 * ("from_layer": it refuses rather than start on an empty one) */
	body = json_pack("{s:s,s:I,s:s,s:s,s:s,s:I,s:s?,s:b}", "sandbox", a->id,
	                 "generation", (json_int_t)cur.generation,
	                 "worker", r->worker, "substrate", cur.substrate, "pod",
	                 cur.pod, "activation", (json_int_t)cur.activation,
	                 "snapshot", r->snapshot_key, "from_layer",
	                 r->snapshot_key == NULL);
	/* every execution of the sandbox keeps the cap it was created with */
	rc = body && cpdb_install_cpu(body, cur.cpu) == 0
	     ? cpdb_feed_insert(db, "install", r->worker, body, a->now, a->rev, err)
	     : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_decref(body);
	if (rc == 0)
		rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
		                 " WHERE id=?1", "ti", a->id, *a->rev);
	if (rc < 0)
		return -1;
	snprintf(rec.sandbox, sizeof(rec.sandbox), "%s", a->id);
	snprintf(rec.worker, sizeof(rec.worker), "%s", r->worker);
	rec.generation = cur.generation;
	rec.rev = *a->rev;
	rec.resumed_from = cpdb_snapkey_gen(r->snapshot_key);
	return cpdb_idem_record(db, &rec, a->now, err) < 0 ? -1 : 1;
}

/* cpdb_sandbox_resume: generation N+1 and its install, atomically. */
int cpdb_sandbox_resume(struct cpdb *db, const char *id,
                        const struct cpdb_resume *r, int64_t now,
                        uint64_t *new_gen, int64_t *rev, int64_t *retire_rev,
                        struct tt_err *err)
{
	struct cpdb_resumeargs a = { id, r, now, rev, retire_rev };
	int rc = cpdb_txn(db, cpdb_resume_txn, &a, err);

	if (rc == 1)
		*new_gen = r->reactivate ? r->gen : r->gen + 1;
	return rc;
}

/* cpdb_sandbox_progress: bounded to the pause it belongs to. */
int cpdb_sandbox_progress(struct cpdb *db, const char *id, int64_t op_rev,
                          int64_t bytes, int64_t total, struct tt_err *err)
{
	return cpdb_change(db, err, "update", "UPDATE sandboxes SET progress_bytes=?3,"
	                   "progress_total=?4 WHERE id=?1 AND state='pausing'"
	                   " AND op_rev=?2", "tiii", id, op_rev, bytes,
	                   total < 0 ? (int64_t)-1 : total);
}

/* cpdb_snapshot_row: row -> struct. */
static void cpdb_snapshot_row(const struct cpdb_row *r, void *out)
{
	struct cp_snapshot *snap = out;

	cpdb_text(r, 0, snap->sandbox, sizeof(snap->sandbox));
	snap->generation = (uint64_t)cpdb_int(r, 1);
	cpdb_text(r, 2, snap->key, sizeof(snap->key));
	snap->size = cpdb_int(r, 3);
	cpdb_text(r, 4, snap->checksum, sizeof(snap->checksum));
	snap->created_at = cpdb_int(r, 5);
}

/* cpdb_snapshot_latest: highest generation with a complete snapshot. */
int cpdb_snapshot_latest(struct cpdb *db, const char *id,
                         struct cp_snapshot *out, struct tt_err *err)
{
	return cpdb_get1(db, "SELECT sandbox,generation,key,size,checksum,"
	                 "created_at FROM snapshots WHERE sandbox=?1"
	                 " ORDER BY generation DESC LIMIT 1", id,
	                 cpdb_snapshot_row, out, "snapshot lookup", err);
}

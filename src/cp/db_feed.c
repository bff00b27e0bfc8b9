/* Control-plane store: the update feed (see db.h): appends inside the
 * caller's transaction or one of their own, reads per worker. Revs are
 * allocated by the backend (dbdrv.h, feed_sql) in commit order. */
#include "cp/db.h"

#include <stdio.h>
#include <string.h>

#include "cleanup.h"
#include "cp/dbdrv.h"

/* cpdb_feed_insert: the INSERT of one feed row (inside a caller's txn);
 * the backend allocates the rev (dbdrv.h, feed_sql). */
int cpdb_feed_insert(struct cpdb *db, const char *kind, const char *worker,
                     json_t *body, int64_t now, int64_t *rev,
                     struct tt_err *err)
{
	_cleanup_free_ char *s = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS);
	struct cpdb_one o = { cpdb_int_row, rev, 0 };
	/* worker NULL: a broadcast row */
	struct cpdb_arg a[4] = { { 't', kind, 0 }, { 't', worker, 0 },
	                         { 't', s, 0 }, { 'i', NULL, now } };

	if (s == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "cannot encode feed body");
	if (db->drv->query(db, db->drv->feed_sql, a, 4, cpdb_one_row, &o, NULL, err) < 0)
		return -1;
	if (!o.found)
		return tt_err_set(err, TT_ERR_IO, "append feed: no rev");
	return 0;
}

/* The arguments of one feed append. */
struct cpdb_append {
	const char *kind, *worker;
	json_t *body;
	int64_t now, *rev;
};

/* cpdb_append_txn: the append's transaction body. */
static int cpdb_append_txn(struct cpdb *db, void *arg, struct tt_err *err)
{
	struct cpdb_append *a = arg;

	return cpdb_feed_insert(db, a->kind, a->worker, a->body, a->now, a->rev, err);
}

/* cpdb_feed_append: one update in its own transaction. */
int cpdb_feed_append(struct cpdb *db, const char *kind, const char *worker,
                     json_t *body, int64_t now, int64_t *rev,
                     struct tt_err *err)
{
	struct cpdb_append a = { kind, worker, body, now, rev };

	return cpdb_txn(db, cpdb_append_txn, &a, err) < 0 ? -1 : 0;
}

/* cpdb_feed_latest: newest rev. Every rev up to it has committed: revs
 * are allocated in commit order (dbdrv.h, feed_sql). */
int cpdb_feed_latest(struct cpdb *db, int64_t *rev, struct tt_err *err)
{
	return cpdb_scalar(db, "SELECT coalesce(max(rev),0) FROM feed", NULL,
	                   rev, err);
}

/* cpdb_feed_prev: the worker's update before rev (its own or broadcast),
 * 0 when none: the "prev" its signed feed update names. */
int cpdb_feed_prev(struct cpdb *db, const char *worker, int64_t rev,
                   int64_t *prev, struct tt_err *err)
{
	struct cpdb_prev p = { prev, 0 };

	if (cpdb_select(db, err, "read feed", "SELECT coalesce(max(rev),0) FROM feed"
	                " WHERE rev<?1 AND (worker IS NULL OR worker=?2)",
	                cpdb_int_first, &p, "it", rev, worker) < 0)
		return -1;
	return p.found ? 0 : tt_err_set(err, TT_ERR_IO, "read feed: no row");
}

/* cpdb_feed_update: row (rev, kind, worker, body) -> update object. */
static json_t *cpdb_feed_update(const struct cpdb_row *r, struct tt_err *err)
{
	const char *body = r->drv->col_text(r, 3);
	json_t *u = body ? json_loads(body, JSON_REJECT_DUPLICATES, NULL) : NULL;

	if (!json_is_object(u)) {
		json_decref(u);
		tt_err_set(err, TT_ERR_MALFORMED, "corrupt feed row %lld",
		           (long long)cpdb_int(r, 0));
		return NULL;
	}
	json_object_set_new(u, "rev", json_integer(cpdb_int(r, 0)));
	json_object_set_new(u, "kind", json_string(r->drv->col_text(r, 1)));
	if (cpdb_is_null(r, 2))
		json_object_set_new(u, "worker", json_null());
	else
		json_object_set_new(u, "worker", json_string(r->drv->col_text(r, 2)));
	return u;
}

/* What feed rows are collected into. */
struct cpdb_ups {
	json_t *arr;
	struct tt_err *err;
};

/* cpdb_ups_row: one update appended (-1: a corrupt row). */
static int cpdb_ups_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_ups *u = arg;
	json_t *o = cpdb_feed_update(r, u->err);

	if (o == NULL)
		return -1;
	json_array_append_new(u->arr, o);
	return 0;
}

/* cpdb_feed_since: the worker's updates (its own and broadcast ones). */
json_t *cpdb_feed_since(struct cpdb *db, const char *worker, int64_t after,
                        int limit, struct tt_err *err)
{
	struct cpdb_ups u = { json_array(), err };

	if (u.arr == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	if (cpdb_select(db, err, "read feed", "SELECT rev,kind,worker,body FROM feed"
	                " WHERE rev>?1 AND (worker IS NULL OR worker=?2)"
	                " ORDER BY rev LIMIT ?3", cpdb_ups_row, &u, "iti", after,
	                worker, (int64_t)limit) < 0) {
		json_decref(u.arr);
		return NULL;
	}
	return u.arr;
}

/* What cpdb_feed_get reads into. */
struct cpdb_feedrow {
	char *kind;
	size_t cap;
	json_t **body;
	struct tt_err *err;
	int found;
};

/* cpdb_feedrow_row: the row's kind and update. */
static int cpdb_feedrow_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_feedrow *f = arg;

	f->found = 1;
	cpdb_text(r, 1, f->kind, f->cap);
	*f->body = cpdb_feed_update(r, f->err);
	return *f->body ? 1 : -1;
}

/* cpdb_feed_get: one row's kind and body. */
int cpdb_feed_get(struct cpdb *db, int64_t rev, char *kind, size_t cap,
                  json_t **body, struct tt_err *err)
{
	struct cpdb_feedrow f = { kind, cap, body, err, 0 };

	*body = NULL;
	if (cpdb_select(db, err, "read feed row", "SELECT rev,kind,worker,body FROM"
	                " feed WHERE rev=?1", cpdb_feedrow_row, &f, "i", rev) < 0)
		return -1;
	return f.found;
}

/* What cpdb_feed_last_body reads into. */
struct cpdb_lastbody {
	json_t *body;
};

/* cpdb_lastbody_row: the newest body. */
static int cpdb_lastbody_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_lastbody *l = arg;
	const char *t = r->drv->col_text(r, 0);

	l->body = t ? json_loads(t, JSON_REJECT_DUPLICATES, NULL) : NULL;
	return 1;
}

/* cpdb_feed_last_body: newest body of kind (to detect key changes). */
json_t *cpdb_feed_last_body(struct cpdb *db, const char *kind,
                            struct tt_err *err)
{
	struct cpdb_lastbody l = { NULL };

	tt_err_clear(err);
	if (cpdb_select(db, err, "read feed", "SELECT body FROM feed WHERE kind=?1"
	                " ORDER BY rev DESC LIMIT 1", cpdb_lastbody_row, &l, "t",
	                kind) < 0)
		return NULL;
	return l.body;
}


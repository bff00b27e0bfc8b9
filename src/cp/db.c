/* Control-plane store (see db.h): opening a backend, the statement and
 * transaction helpers the store's logic runs on (dbdrv.h), API keys,
 * workers, worker credentials, the feed, idempotency records and leases.
 * Sandboxes and snapshots: db_sandbox.c. Every write that must be atomic
 * with a feed update runs in one cpdb_txn. */
#include "cp/db.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "cp/dbdrv.h"

/* Columns added to the base schema since (db_sqlite.c, db_pg.c make the
 * base): databases made before gain them on open. Adding a column to the
 * store is one line here (both backends take the decl: BIGINT and TEXT
 * only), the struct field and its row decoder. */
const struct cpdb_column cpdb_columns[] = {
	/* the lifecycle (issue 5) */
	{ "sandboxes", "op_rev", "op_rev BIGINT NOT NULL DEFAULT 0" },
	{ "sandboxes", "op_at", "op_at BIGINT NOT NULL DEFAULT 0" },
	{ "sandboxes", "progress_bytes", "progress_bytes BIGINT NOT NULL DEFAULT -1" },
	{ "sandboxes", "progress_total", "progress_total BIGINT NOT NULL DEFAULT -1" },
	{ "sandboxes", "migrate_to", "migrate_to TEXT NOT NULL DEFAULT ''" },
	/* restarts and crashes (issue 12) */
	{ "sandboxes", "note", "note TEXT NOT NULL DEFAULT ''" },
	{ "sandboxes", "resume_on", "resume_on TEXT NOT NULL DEFAULT ''" },
	{ "sandboxes", "relaunches", "relaunches BIGINT NOT NULL DEFAULT 0" },
	{ "sandboxes", "relaunch_at", "relaunch_at BIGINT NOT NULL DEFAULT 0" },
	{ "workers", "draining", "draining BIGINT NOT NULL DEFAULT 0" },
	/* the highest rev a feed answer gave the worker (issue 13) */
	{ "workers", "sent_rev", "sent_rev BIGINT NOT NULL DEFAULT 0" },
	/* the CPU cap asked at create, in millicores (issue 13; 0 = the
	 * worker's default): every install of the sandbox carries it */
	{ "sandboxes", "cpu", "cpu BIGINT NOT NULL DEFAULT 0" },
};
const size_t cpdb_ncolumns = sizeof(cpdb_columns) / sizeof(cpdb_columns[0]);

#define CPDB_TXN_TRIES 8

/* cpdb_add_columns: each listed column a database lacks is added. */
int cpdb_add_columns(struct cpdb *db, struct tt_err *err)
{
	for (size_t i = 0; i < cpdb_ncolumns; i++) {
		int have = db->drv->has_column(db, cpdb_columns[i].table,
		                               cpdb_columns[i].name, err);

		if (have < 0 || (have == 0 && db->drv->add_column(db, cpdb_columns[i].table,
		                                                  cpdb_columns[i].decl, err) < 0))
			return -1;
	}
	return 0;
}

/* cpdb_is_url: a PostgreSQL connection URI. */
int cpdb_is_url(const char *path)
{
	return strncmp(path, "postgresql://", 13) == 0 ||
	       strncmp(path, "postgres://", 11) == 0;
}

/* cpdb_open: the backend path names. */
struct cpdb *cpdb_open(const char *path, struct tt_err *err)
{
	struct cpdb *db = calloc(1, sizeof(*db));
	int rc;

	if (db == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	rc = cpdb_is_url(path) ? cpdb_pg_open(db, path, err)
	                       : cpdb_sqlite_open(db, path, err);
	if (rc < 0) {
		if (db->drv != NULL)
			db->drv->close(db);
		free(db);
		return NULL;
	}
	return db;
}

/* cpdb_close: closes the backend and frees db. */
void cpdb_close(struct cpdb *db)
{
	if (db == NULL)
		return;
	db->drv->close(db);
	free(db);
}

/* cpdb_backend: the backend's name. */
const char *cpdb_backend(const struct cpdb *db)
{
	return db->drv->name;
}

/* cpdb_shared: replicas can share it (it has notifications). */
int cpdb_shared(const struct cpdb *db)
{
	return db->drv->notify != NULL;
}

/* cpdb_notify: a message to the other replicas (none on SQLite). */
int cpdb_notify(struct cpdb *db, const char *msg, struct tt_err *err)
{
	return db->drv->notify ? db->drv->notify(db, msg, err) : 0;
}

/* cpdb_listen_fd: see db.h. */
int cpdb_listen_fd(struct cpdb *db)
{
	return db->drv->listen_fd ? db->drv->listen_fd(db) : -1;
}

/* cpdb_listen_read: see db.h. */
int cpdb_listen_read(struct cpdb *db, void (*fn)(const char *msg, void *arg),
                     void *arg, struct tt_err *err)
{
	return db->drv->listen_read ? db->drv->listen_read(db, fn, arg, err) : 0;
}

/* ---- statements ------------------------------------------------------ */

/* cpdb_args: the parameters types names, from ap. -1 if too many. */
static int cpdb_args(struct cpdb_arg *a, const char *types, va_list ap)
{
	int n = 0;

	for (; types[n] != '\0'; n++) {
		if (n == CPDB_ARGS_MAX)
			return -1;
		a[n].t = types[n];
		if (types[n] == 't')
			a[n].s = va_arg(ap, const char *);
		else
			a[n].i = va_arg(ap, int64_t);
	}
	return n;
}

/* cpdb_change: see dbdrv.h. */
int cpdb_change(struct cpdb *db, struct tt_err *err, const char *what,
                const char *sql, const char *types, ...)
{
	struct cpdb_arg a[CPDB_ARGS_MAX];
	int64_t changes = 0;
	va_list ap;
	int n;

	va_start(ap, types);
	n = cpdb_args(a, types, ap);
	va_end(ap);
	if (n < 0)
		return tt_err_set(err, TT_ERR_INVALID, "%s: too many parameters", what);
	if (db->drv->query(db, sql, a, n, NULL, NULL, &changes, err) < 0)
		return -1;
	return (int)changes;
}

/* cpdb_select: see dbdrv.h. */
int cpdb_select(struct cpdb *db, struct tt_err *err, const char *what,
                const char *sql, cpdb_row_fn fn, void *arg,
                const char *types, ...)
{
	struct cpdb_arg a[CPDB_ARGS_MAX];
	va_list ap;
	int n;

	va_start(ap, types);
	n = cpdb_args(a, types, ap);
	va_end(ap);
	if (n < 0)
		return tt_err_set(err, TT_ERR_INVALID, "%s: too many parameters", what);
	return db->drv->query(db, sql, a, n, fn, arg, NULL, err);
}

/* cpdb_one_row: the first row, then stop. */
int cpdb_one_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_one *o = arg;

	o->row(r, o->out);
	o->found = 1;
	return 1;
}

/* cpdb_get1: see dbdrv.h. */
int cpdb_get1(struct cpdb *db, const char *sql, const char *p1,
              void (*row)(const struct cpdb_row *, void *), void *out,
              const char *what, struct tt_err *err)
{
	struct cpdb_one o = { row, out, 0 };
	struct cpdb_arg a = { 't', p1, 0 };

	(void)what;
	if (db->drv->query(db, sql, &a, p1 != NULL, cpdb_one_row, &o, NULL, err) < 0)
		return -1;
	return o.found;
}

/* cpdb_int: column i as an int64_t (NULL reads 0). */
int64_t cpdb_int(const struct cpdb_row *r, int i)
{
	return r->drv->col_int(r, i);
}

/* cpdb_text: see dbdrv.h. */
void cpdb_text(const struct cpdb_row *r, int i, char *buf, size_t cap)
{
	const char *t = r->drv->col_text(r, i);

	snprintf(buf, cap, "%s", t ? t : "");
}

/* cpdb_is_null: column i is NULL. */
int cpdb_is_null(const struct cpdb_row *r, int i)
{
	return r->drv->col_text(r, i) == NULL;
}

/* cpdb_int_row: column 0 as an int64_t. */
void cpdb_int_row(const struct cpdb_row *r, void *out)
{
	*(int64_t *)out = cpdb_int(r, 0);
}

/* cpdb_int_first: see dbdrv.h. */
int cpdb_int_first(const struct cpdb_row *r, void *arg)
{
	struct cpdb_prev *p = arg;

	*p->out = cpdb_int(r, 0);
	p->found = 1;
	return 1;
}

/* cpdb_scalar: see dbdrv.h. */
int cpdb_scalar(struct cpdb *db, const char *sql, const char *p1,
                int64_t *out, struct tt_err *err)
{
	int rc = cpdb_get1(db, sql, p1, cpdb_int_row, out, "query", err);

	/* a query for one number that yields no row is an error too */
	if (rc == 0)
		return tt_err_set(err, TT_ERR_IO, "%s: no row", cpdb_backend(db));
	return rc > 0 ? 0 : -1;
}

/* ---- transactions ---------------------------------------------------- */

/* cpdb_txn: see dbdrv.h. */
int cpdb_txn(struct cpdb *db, int (*fn)(struct cpdb *, void *, struct tt_err *),
             void *arg, struct tt_err *err)
{
	for (int tries = 1;; tries++) {
		int rc = db->drv->begin(db, err);

		if (rc == 0) {
			db->in_txn = 1;
			rc = fn(db, arg, err);
			if (rc >= 0 && db->drv->commit(db, err) == 0) {
				db->in_txn = 0;
				return rc;
			}
			db->drv->rollback(db);
			db->in_txn = 0;
			if (rc >= 0)
				rc = -1; /* the COMMIT failed */
		}
		if (!db->drv->retryable(db) || tries == CPDB_TXN_TRIES)
			return -1;
		/* a concurrent transaction won; ours left nothing: again,
		 * after a short random pause (0.5..2 ms, doubling) */
		usleep((useconds_t)((500u << (tries < 4 ? tries - 1 : 3)) +
		                    randombytes_uniform(500)));
	}
}

/* cpdb_batch_begin: a write transaction for a group of plain updates. */
int cpdb_batch_begin(struct cpdb *db, struct tt_err *err)
{
	if (db->drv->begin(db, err) < 0)
		return -1;
	db->in_txn = 1;
	return 0;
}

/* cpdb_batch_end: COMMIT (rc >= 0) or ROLLBACK; passes rc through. */
int cpdb_batch_end(struct cpdb *db, int rc, struct tt_err *err)
{
	db->in_txn = 0;
	if (rc >= 0 && db->drv->commit(db, err) == 0)
		return rc;
	db->drv->rollback(db);
	return -1;
}

/* cpdb_lock: the sandbox row, where the backend needs it. */
int cpdb_lock(struct cpdb *db, const char *id, struct tt_err *err)
{
	if (db->drv->lock_sql == NULL)
		return 0;
	return cpdb_select(db, err, "lock", db->drv->lock_sql, NULL, NULL, "t", id);
}

/* ---- API keys -------------------------------------------------------- */

/* cpdb_key_hash: keys are stored only as their SHA-256. */
void cpdb_key_hash(const char *key, char out[CPDB_HASH_HEX + 1])
{
	unsigned char h[crypto_hash_sha256_BYTES];

	crypto_hash_sha256(h, (const unsigned char *)key, strlen(key));
	sodium_bin2hex(out, CPDB_HASH_HEX + 1, h, sizeof(h));
}

/* cpdb_apikey_add: stores the hash of key under name. */
int cpdb_apikey_add(struct cpdb *db, const char *key, const char *name,
                    int64_t now, struct tt_err *err)
{
	char hash[CPDB_HASH_HEX + 1];

	cpdb_key_hash(key, hash);
	return cpdb_change(db, err, "insert api key", "INSERT INTO api_keys(hash,"
	                   "name,created_at) VALUES(?1,?2,?3)", "tti", hash, name,
	                   now) < 0 ? -1 : 0;
}

/* cpdb_apikey_count: how many keys exist. */
int cpdb_apikey_count(struct cpdb *db, int64_t *n, struct tt_err *err)
{
	return cpdb_scalar(db, "SELECT count(*) FROM api_keys", NULL, n, err);
}

/* A caller's text buffer, for cpdb_str_row. */
struct cpdb_strbuf {
	char *buf;
	size_t cap;
};

/* cpdb_str_row: column 0 into a struct cpdb_strbuf. */
static void cpdb_str_row(const struct cpdb_row *r, void *out)
{
	struct cpdb_strbuf *b = out;

	cpdb_text(r, 0, b->buf, b->cap);
}

/* cpdb_apikey_lookup: looks the key up by its hash. */
int cpdb_apikey_lookup(struct cpdb *db, const char *key, char *name,
                       size_t cap, struct tt_err *err)
{
	char hash[CPDB_HASH_HEX + 1];
	struct cpdb_strbuf out = { name, cap };

	cpdb_key_hash(key, hash);
	return cpdb_get1(db, "SELECT name FROM api_keys WHERE hash=?1", hash,
	                 cpdb_str_row, &out, "api key lookup", err);
}

/* ---- workers --------------------------------------------------------- */

/* cpdb_worker_register: insert or refresh the worker's URL. */
int cpdb_worker_register(struct cpdb *db, const char *id, const char *url,
                         int64_t now, struct tt_err *err)
{
	return cpdb_change(db, err, "register worker",
	                   "INSERT INTO workers(id,node_url,registered_at,last_seen)"
	                   " VALUES(?1,?2,?3,?3) ON CONFLICT(id) DO UPDATE SET"
	                   " node_url=?2, registered_at=?3, last_seen=?3,"
	                   " draining=0", "tti",
	                   id, url, now) < 0 ? -1 : 0;
}

/* cpdb_update1: runs an UPDATE with (int64 ?1, text ?2) params; returns
 * rows changed (0 or 1) or -1. */
static int cpdb_update1(struct cpdb *db, const char *sql, int64_t v,
                        const char *id, struct tt_err *err)
{
	int rc = cpdb_change(db, err, "update", sql, "it", v, id);

	return rc < 0 ? -1 : rc > 0;
}

/* cpdb_worker_seen: liveness stamp from feed polls (never backwards: a
 * replica's late stamp does not undo another's newer one). */
int cpdb_worker_seen(struct cpdb *db, const char *id, int64_t now,
                     struct tt_err *err)
{
	int rc = cpdb_update1(db, "UPDATE workers SET last_seen=?1 WHERE id=?2"
	                      " AND last_seen<?1", now, id, err);

	if (rc == 0) /* unchanged (already this recent), or unknown */
		rc = cpdb_get1(db, "SELECT 1 FROM workers WHERE id=?1", id,
		               cpdb_int_row, &(int64_t){ 0 }, "worker", err);
	return rc;
}

/* cpdb_worker_set_acked: acked_rev only moves forward. */
int cpdb_worker_set_acked(struct cpdb *db, const char *id, int64_t rev,
                          struct tt_err *err)
{
	return cpdb_update1(db, "UPDATE workers SET acked_rev=CASE WHEN acked_rev>?1"
	                    " THEN acked_rev ELSE ?1 END WHERE id=?2", rev, id, err);
}

/* cpdb_worker_acked_seen: both stamps of an ack, atomically. */
int cpdb_worker_acked_seen(struct cpdb *db, const char *id, int64_t rev,
                           int64_t now, struct tt_err *err)
{
	int rc = cpdb_change(db, err, "ack", "UPDATE workers SET"
	                     " acked_rev=CASE WHEN acked_rev>?1 THEN acked_rev"
	                     " ELSE ?1 END, last_seen=CASE WHEN last_seen>?3"
	                     " THEN last_seen ELSE ?3 END"
	                     " WHERE id=?2", "iti", rev, id, now);

	return rc < 0 ? -1 : rc > 0;
}

/* cpdb_worker_row: row -> struct. */
static void cpdb_worker_row(const struct cpdb_row *r, void *out)
{
	struct cp_worker *w = out;

	cpdb_text(r, 0, w->id, sizeof(w->id));
	cpdb_text(r, 1, w->node_url, sizeof(w->node_url));
	w->registered_at = cpdb_int(r, 2);
	w->last_seen = cpdb_int(r, 3);
	w->acked_rev = cpdb_int(r, 4);
	w->draining = cpdb_int(r, 5);
	w->sent_rev = cpdb_int(r, 6);
}

#define CPDB_WORKER_COLS "id,node_url,registered_at,last_seen,acked_rev,draining," \
	"sent_rev"

/* cpdb_worker_drain: see db.h. */
int cpdb_worker_drain(struct cpdb *db, const char *id, int64_t now,
                      struct tt_err *err)
{
	return cpdb_change(db, err, "drain worker", "UPDATE workers SET draining=?2"
	                   " WHERE id=?1 AND draining=0", "ti", id, now) < 0 ? -1 : 0;
}

/* cpdb_worker_get: one worker by id. */
int cpdb_worker_get(struct cpdb *db, const char *id, struct cp_worker *out,
                    struct tt_err *err)
{
	return cpdb_get1(db, "SELECT " CPDB_WORKER_COLS " FROM workers WHERE id=?1",
	                 id, cpdb_worker_row, out, "worker lookup", err);
}

/* What cpdb_workers_each calls. */
struct cpdb_each_worker {
	void (*fn)(const struct cp_worker *, void *);
	void *arg;
};

/* cpdb_each_worker_row: one worker to the caller's fn. */
static int cpdb_each_worker_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_each_worker *e = arg;
	struct cp_worker w;

	cpdb_worker_row(r, &w);
	e->fn(&w, e->arg);
	return 0;
}

/* cpdb_workers_each: iterates all workers. */
int cpdb_workers_each(struct cpdb *db,
                      void (*fn)(const struct cp_worker *, void *), void *arg,
                      struct tt_err *err)
{
	struct cpdb_each_worker e = { fn, arg };

	return cpdb_select(db, err, "list workers", "SELECT " CPDB_WORKER_COLS
	                   " FROM workers ORDER BY id", cpdb_each_worker_row, &e, "");
}

/* cpdb_worker_load: placement weight of a worker. */
int cpdb_worker_load(struct cpdb *db, const char *id, int64_t *n,
                     struct tt_err *err)
{
	return cpdb_scalar(db, "SELECT count(*) FROM sandboxes WHERE worker=?1"
	                   " AND state IN ('starting','running','pausing',"
	                   "'resuming','deleting')",
	                   id, n, err);
}

/* cpdb_worker_sent: sent_rev only moves forward. */
int cpdb_worker_sent(struct cpdb *db, const char *id, int64_t rev,
                     struct tt_err *err)
{
	return cpdb_update1(db, "UPDATE workers SET sent_rev=?1 WHERE id=?2"
	                    " AND sent_rev<?1", rev, id, err);
}

/* ---- per-worker credentials ------------------------------------------ */

/* cpdb_cred_set: stores (or replaces: the old one stops working) the
 * credential hash and node_url of worker id. */
int cpdb_cred_set(struct cpdb *db, const char *id, const char *hash,
                  const char *url, int64_t now, struct tt_err *err)
{
	return cpdb_change(db, err, "provision worker",
	                   "INSERT INTO worker_creds(id,hash,node_url,created_at)"
	                   " VALUES(?1,?2,?3,?4) ON CONFLICT(id) DO UPDATE SET"
	                   " hash=?2, node_url=?3, created_at=?4", "ttti",
	                   id, hash, url, now) < 0 ? -1 : 0;
}

/* cpdb_cred_revoke: drops the credential of id; 1 if there was one. */
int cpdb_cred_revoke(struct cpdb *db, const char *id, struct tt_err *err)
{
	int rc = cpdb_change(db, err, "revoke worker",
	                     "DELETE FROM worker_creds WHERE id=?1", "t", id);

	return rc < 0 ? -1 : rc > 0;
}

/* cpdb_cred_row: (id, hash, node_url) -> struct cp_cred. */
static void cpdb_cred_row(const struct cpdb_row *r, void *out)
{
	struct cp_cred *c = out;

	cpdb_text(r, 0, c->id, sizeof(c->id));
	cpdb_text(r, 1, c->hash, sizeof(c->hash));
	cpdb_text(r, 2, c->node_url, sizeof(c->node_url));
}

/* cpdb_cred_by_hash: the worker a credential hash belongs to. */
int cpdb_cred_by_hash(struct cpdb *db, const char *hash, struct cp_cred *out,
                      struct tt_err *err)
{
	return cpdb_get1(db, "SELECT id,hash,node_url FROM worker_creds WHERE hash=?1",
	                 hash, cpdb_cred_row, out, "credential lookup", err);
}

/* cpdb_cred_get: the credential row of worker id. */
int cpdb_cred_get(struct cpdb *db, const char *id, struct cp_cred *out,
                  struct tt_err *err)
{
	return cpdb_get1(db, "SELECT id,hash,node_url FROM worker_creds WHERE id=?1",
	                 id, cpdb_cred_row, out, "credential lookup", err);
}

/* ---- idempotency records --------------------------------------------- */

/* cpdb_idem_arm: see db.h. */
void cpdb_idem_arm(struct cpdb *db, const char *caller, const char *key,
                   const char *op)
{
	db->idem.on = 1;
	snprintf(db->idem.caller, sizeof(db->idem.caller), "%s", caller);
	snprintf(db->idem.key, sizeof(db->idem.key), "%s", key);
	snprintf(db->idem.op, sizeof(db->idem.op), "%s", op);
}

/* cpdb_idem_disarm: see db.h. */
void cpdb_idem_disarm(struct cpdb *db)
{
	db->idem.on = 0;
}

/* cpdb_idem_record: see dbdrv.h. The record is the armed call's; a
 * second write in the same call (none today) records nothing. */
int cpdb_idem_record(struct cpdb *db, const struct cpdb_idem *rec, int64_t now,
                     struct tt_err *err)
{
	if (!db->idem.on)
		return 0;
	return cpdb_change(db, err, "idempotency record", "INSERT INTO requests(caller,"
	                   "key,op,sandbox,generation,rev,worker,target,forced,"
	                   "resumed_from,created_at) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,"
	                   "?9,?10,?11)", "ttttiittiii", db->idem.caller, db->idem.key, db->idem.op,
	                   rec->sandbox, (int64_t)rec->generation, rec->rev,
	                   rec->worker, rec->target, (int64_t)rec->forced,
	                   (int64_t)rec->resumed_from, now) < 0 ? -1 : 0;
}

/* cpdb_idem_row: row -> struct cpdb_idem. */
static void cpdb_idem_row(const struct cpdb_row *r, void *out)
{
	struct cpdb_idem *i = out;

	cpdb_text(r, 0, i->op, sizeof(i->op));
	cpdb_text(r, 1, i->sandbox, sizeof(i->sandbox));
	i->generation = (uint64_t)cpdb_int(r, 2);
	i->rev = cpdb_int(r, 3);
	cpdb_text(r, 4, i->worker, sizeof(i->worker));
	cpdb_text(r, 5, i->target, sizeof(i->target));
	i->forced = (int)cpdb_int(r, 6);
	i->resumed_from = (uint64_t)cpdb_int(r, 7);
	i->created_at = cpdb_int(r, 8);
}

/* What cpdb_idem_get reads into. */
struct cpdb_idemget {
	struct cpdb_idem *out;
	int found;
};

/* cpdb_idemget_row: the one record. */
static int cpdb_idemget_row(const struct cpdb_row *r, void *arg)
{
	struct cpdb_idemget *g = arg;

	cpdb_idem_row(r, g->out);
	g->found = 1;
	return 1;
}

/* cpdb_idem_get: see db.h. */
int cpdb_idem_get(struct cpdb *db, const char *caller, const char *key,
                  struct cpdb_idem *out, struct tt_err *err)
{
	struct cpdb_idemget g = { out, 0 };

	memset(out, 0, sizeof(*out));
	if (cpdb_select(db, err, "idempotency lookup", "SELECT op,sandbox,generation,"
	                "rev,worker,target,forced,resumed_from,created_at FROM"
	                " requests WHERE caller=?1 AND key=?2", cpdb_idemget_row, &g,
	                "tt", caller, key) < 0)
		return -1;
	return g.found;
}

/* cpdb_idem_prune: old records go (the sweep). */
int cpdb_idem_prune(struct cpdb *db, int64_t before, struct tt_err *err)
{
	return cpdb_change(db, err, "idempotency prune", "DELETE FROM requests"
	                   " WHERE created_at<?1", "i", before) < 0 ? -1 : 0;
}

/* cpdb_meta_claim: see db.h. */
int cpdb_meta_claim(struct cpdb *db, const char *name, const char *value,
                    char *out, size_t cap, struct tt_err *err)
{
	struct cpdb_strbuf b = { out, cap };

	if (cpdb_change(db, err, "meta", "INSERT INTO meta(name,value) VALUES(?1,?2)"
	                " ON CONFLICT(name) DO NOTHING", "tt", name, value) < 0)
		return -1;
	return cpdb_get1(db, "SELECT value FROM meta WHERE name=?1", name,
	                 cpdb_str_row, &b, "meta", err) == 1 ? 0 : -1;
}

/* ---- rebuilt-attempt leases ------------------------------------------ */

/* cpdb_lease_set: the newest lease of a sandbox replaces its older one. */
int cpdb_lease_set(struct cpdb *db, const char *id, uint64_t gen,
                   uint32_t att, int64_t until_ms, struct tt_err *err)
{
	return cpdb_change(db, err, "lease", "INSERT INTO leases(sandbox,generation,"
	                   "activation,until_ms) VALUES(?1,?2,?3,?4) ON CONFLICT"
	                   "(sandbox) DO UPDATE SET generation=?2,activation=?3,"
	                   "until_ms=?4", "tiii", id, (int64_t)gen, (int64_t)att,
	                   until_ms) < 0 ? -1 : 0;
}

/* cpdb_leased: see db.h. */
int cpdb_leased(struct cpdb *db, const char *id, uint64_t gen, uint32_t att,
                int64_t now_ms, struct tt_err *err)
{
	struct cpdb_prev p = { &(int64_t){ 0 }, 0 };

	if (cpdb_select(db, err, "lease", "SELECT 1 FROM leases WHERE sandbox=?1"
	                " AND generation=?2 AND activation=?3 AND until_ms>?4",
	                cpdb_int_first, &p, "tiii", id, (int64_t)gen, (int64_t)att,
	                now_ms) < 0)
		return -1;
	return p.found;
}

/* Control-plane SQLite store (see db.h). Every write that must be atomic
 * with a feed update runs in BEGIN IMMEDIATE ... COMMIT. */
#include "cp/db.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>
#include <sqlite3.h>

#include "cleanup.h"

struct cpdb {
	sqlite3 *h;
};

static const char cpdb_schema[] =
	"CREATE TABLE IF NOT EXISTS api_keys("
	" hash TEXT PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS workers("
	" id TEXT PRIMARY KEY, node_url TEXT NOT NULL,"
	" registered_at INTEGER NOT NULL, last_seen INTEGER NOT NULL,"
	" acked_rev INTEGER NOT NULL DEFAULT 0);"
	"CREATE TABLE IF NOT EXISTS sandboxes("
	" id TEXT PRIMARY KEY, state TEXT NOT NULL,"
	" generation INTEGER NOT NULL CHECK (generation >= 1),"
	" worker TEXT NOT NULL, substrate TEXT NOT NULL, pod TEXT NOT NULL,"
	" activation INTEGER NOT NULL CHECK (activation >= 1),"
	" created_at INTEGER NOT NULL, error TEXT);"
	"CREATE TABLE IF NOT EXISTS feed("
	" rev INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL,"
	" worker TEXT, body TEXT NOT NULL, created_at INTEGER NOT NULL);"
	"CREATE INDEX IF NOT EXISTS feed_worker ON feed(worker, rev);"
	"CREATE TABLE IF NOT EXISTS snapshots("
	" sandbox TEXT NOT NULL, generation INTEGER NOT NULL,"
	" key TEXT NOT NULL, size INTEGER NOT NULL CHECK (size >= 0),"
	" checksum TEXT NOT NULL, created_at INTEGER NOT NULL,"
	" PRIMARY KEY (sandbox, generation));"
	/* per-worker credentials (tetherd worker add): SHA-256 of the
	 * credential, and the one node_url the worker may register */
	"CREATE TABLE IF NOT EXISTS worker_creds("
	" id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE,"
	" node_url TEXT NOT NULL, created_at INTEGER NOT NULL);";

/* Columns added to sandboxes by the lifecycle (issue 5); databases made
 * before it gain them on open. */
static const struct {
	const char *table, *name, *decl;
} cpdb_sbx_added[] = {
	{ "sandboxes", "op_rev", "op_rev INTEGER NOT NULL DEFAULT 0" },
	{ "sandboxes", "op_at", "op_at INTEGER NOT NULL DEFAULT 0" },
	{ "sandboxes", "progress_bytes", "progress_bytes INTEGER NOT NULL DEFAULT -1" },
	{ "sandboxes", "progress_total", "progress_total INTEGER NOT NULL DEFAULT -1" },
	{ "sandboxes", "migrate_to", "migrate_to TEXT NOT NULL DEFAULT ''" },
	/* restarts and crashes (issue 12) */
	{ "sandboxes", "note", "note TEXT NOT NULL DEFAULT ''" },
	{ "sandboxes", "resume_on", "resume_on TEXT NOT NULL DEFAULT ''" },
	{ "sandboxes", "relaunches", "relaunches INTEGER NOT NULL DEFAULT 0" },
	{ "sandboxes", "relaunch_at", "relaunch_at INTEGER NOT NULL DEFAULT 0" },
	{ "workers", "draining", "draining INTEGER NOT NULL DEFAULT 0" },
	/* the highest rev a feed answer gave the worker (issue 13) */
	{ "workers", "sent_rev", "sent_rev INTEGER NOT NULL DEFAULT 0" },
	/* the CPU cap asked at create, in millicores (issue 13; 0 = the
	 * worker's default): every install of the sandbox carries it */
	{ "sandboxes", "cpu", "cpu INTEGER NOT NULL DEFAULT 0" },
};

/* cpdb_fail: err from the connection's last error; returns -1. */
static int cpdb_fail(struct cpdb *db, struct tt_err *err, const char *what)
{
	return tt_err_set(err, TT_ERR_IO, "sqlite %s: %s", what,
	                  sqlite3_errmsg(db->h));
}

/* cpdb_exec: runs SQL without results. */
static int cpdb_exec(struct cpdb *db, const char *sql, struct tt_err *err)
{
	char *msg = NULL;

	if (sqlite3_exec(db->h, sql, NULL, NULL, &msg) != SQLITE_OK) {
		tt_err_set(err, TT_ERR_IO, "sqlite: %s", msg ? msg : "error");
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

/* cpdb_prep: prepares sql; NULL + err on failure. */
static sqlite3_stmt *cpdb_prep(struct cpdb *db, const char *sql,
                               struct tt_err *err)
{
	sqlite3_stmt *st = NULL;

	if (sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK) {
		cpdb_fail(db, err, "prepare");
		return NULL;
	}
	return st;
}

/* cpdb_text: copies column i (may be NULL) into buf. */
static void cpdb_text(sqlite3_stmt *st, int i, char *buf, size_t cap)
{
	const unsigned char *t = sqlite3_column_text(st, i);

	snprintf(buf, cap, "%s", t ? (const char *)t : "");
}

/* cpdb_change: runs a write statement; binds follows types, one char per
 * parameter: 't' text (NULL binds NULL), 'i' int64 (pass an int64_t).
 * Returns the rows changed or -1 (what names the statement in err). */
static int cpdb_change(struct cpdb *db, struct tt_err *err, const char *what,
                       const char *sql, const char *types, ...)
{
	sqlite3_stmt *st = cpdb_prep(db, sql, err);
	va_list ap;
	int rc;

	if (st == NULL)
		return -1;
	va_start(ap, types);
	for (int i = 0; types[i] != '\0'; i++) {
		if (types[i] == 't') {
			const char *v = va_arg(ap, const char *);

			if (v != NULL)
				sqlite3_bind_text(st, i + 1, v, -1, SQLITE_TRANSIENT);
			else
				sqlite3_bind_null(st, i + 1);
		} else {
			sqlite3_bind_int64(st, i + 1, va_arg(ap, int64_t));
		}
	}
	va_end(ap);
	rc = sqlite3_step(st);
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return cpdb_fail(db, err, what);
	return sqlite3_changes(db->h);
}

/* cpdb_get1: the first row of sql (text parameter p1), decoded by row
 * into out. 1 found, 0 none, -1 error (what names the query in err). */
static int cpdb_get1(struct cpdb *db, const char *sql, const char *p1,
                     void (*row)(sqlite3_stmt *, void *), void *out,
                     const char *what, struct tt_err *err)
{
	sqlite3_stmt *st = cpdb_prep(db, sql, err);
	int rc;

	if (st == NULL)
		return -1;
	if (p1 != NULL)
		sqlite3_bind_text(st, 1, p1, -1, SQLITE_TRANSIENT);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		row(st, out);
	sqlite3_finalize(st);
	if (rc == SQLITE_ROW)
		return 1;
	return rc == SQLITE_DONE ? 0 : cpdb_fail(db, err, what);
}

/* cpdb_int_row: column 0 as an int64_t. */
static void cpdb_int_row(sqlite3_stmt *st, void *out)
{
	*(int64_t *)out = sqlite3_column_int64(st, 0);
}

static int cpdb_scalar(struct cpdb *db, const char *sql, const char *p1,
                       int64_t *out, struct tt_err *err);

/* cpdb_migrate: adds the lifecycle columns a pre-issue-5 file lacks. */
static int cpdb_migrate(struct cpdb *db, struct tt_err *err)
{
	char sql[160];
	int64_t have;

	for (size_t i = 0; i < sizeof(cpdb_sbx_added) / sizeof(cpdb_sbx_added[0]);
	     i++) {
		snprintf(sql, sizeof(sql), "SELECT count(*) FROM pragma_table_info("
		         "'%s') WHERE name=?1", cpdb_sbx_added[i].table);
		if (cpdb_scalar(db, sql, cpdb_sbx_added[i].name, &have, err) < 0)
			return -1;
		if (have > 0)
			continue;
		snprintf(sql, sizeof(sql), "ALTER TABLE %s ADD COLUMN %s",
		         cpdb_sbx_added[i].table, cpdb_sbx_added[i].decl);
		if (cpdb_exec(db, sql, err) < 0)
			return -1;
	}
	return 0;
}

/* cpdb_private: path (made if missing, with create) is a regular file of
 * mode 0600, narrowed if wider, before SQLite writes a byte to it; no
 * symlink is followed. It holds API key hashes and every sandbox's state;
 * SQLite gives the -wal and -shm files it creates the database's mode. */
static int cpdb_private(const char *path, bool create, struct tt_err *err)
{
	int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600);
	struct stat st;
	int rc = 0;

	if (fd < 0)
		return !create && errno == ENOENT ? 0 :
		       tt_err_sys(err, TT_ERR_IO, "cp.db: open %s", path);
	if (fstat(fd, &st) < 0 || ((st.st_mode & 077) != 0 && fchmod(fd, st.st_mode & 0700) < 0))
		rc = tt_err_sys(err, TT_ERR_IO, "cp.db: making %s private", path);
	else if (!S_ISREG(st.st_mode))
		rc = tt_err_set(err, TT_ERR_IO, "cp.db: %s is not a regular file", path);
	close(fd);
	return rc;
}

/* cpdb_private_all: the database and, where they exist already (from a run
 * before files were made private), its -wal and -shm files: 0600. */
static int cpdb_private_all(const char *path, struct tt_err *err)
{
	char side[PATH_MAX];

	if (cpdb_private(path, true, err) < 0)
		return -1;
	snprintf(side, sizeof(side), "%s-wal", path);
	if (cpdb_private(side, false, err) < 0)
		return -1;
	snprintf(side, sizeof(side), "%s-shm", path);
	return cpdb_private(side, false, err);
}

/* cpdb_open: opens the file, sets durability pragmas, creates the schema. */
struct cpdb *cpdb_open(const char *path, struct tt_err *err)
{
	struct cpdb *db = calloc(1, sizeof(*db));

	if (db == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	/* SQLite's own pathname bound (its journal's name adds 8 bytes). */
	if (strlen(path) > (size_t)sqlite3_vfs_find(NULL)->mxPathname - 8) {
		tt_err_set(err, TT_ERR_INVALID, "%s: the path is %zu bytes long; SQLite takes"
		           " at most %d", "cp.db", strlen(path),
		           sqlite3_vfs_find(NULL)->mxPathname - 8);
		free(db);
		return NULL;
	}
	if (cpdb_private_all(path, err) < 0) {
		free(db);
		return NULL;
	}
	if (sqlite3_open_v2(path, &db->h, SQLITE_OPEN_READWRITE |
	                    SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
	                    NULL) != SQLITE_OK) {
		tt_err_set(err, TT_ERR_IO, "cannot open %s: %s", path,
		           db->h ? sqlite3_errmsg(db->h) : "out of memory");
		cpdb_close(db);
		return NULL;
	}
	sqlite3_busy_timeout(db->h, 5000);
	if (cpdb_exec(db, "PRAGMA journal_mode=WAL;"
	                  "PRAGMA synchronous=FULL;"
	                  "PRAGMA foreign_keys=ON;", err) < 0 ||
	    cpdb_exec(db, cpdb_schema, err) < 0 || cpdb_migrate(db, err) < 0) {
		cpdb_close(db);
		return NULL;
	}
	return db;
}

/* cpdb_close: closes the connection and frees db. */
void cpdb_close(struct cpdb *db)
{
	if (db == NULL)
		return;
	sqlite3_close(db->h);
	free(db);
}

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
	                   "name,created_at) VALUES(?,?,?)", "tti", hash, name,
	                   now) < 0 ? -1 : 0;
}

/* cpdb_scalar: one integer from a query with an optional text parameter. */
static int cpdb_scalar(struct cpdb *db, const char *sql, const char *p1,
                       int64_t *out, struct tt_err *err)
{
	int rc = cpdb_get1(db, sql, p1, cpdb_int_row, out, "query", err);

	/* a query for one number that yields no row is an error too */
	if (rc == 0)
		return cpdb_fail(db, err, "query");
	return rc > 0 ? 0 : -1;
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
static void cpdb_str_row(sqlite3_stmt *st, void *out)
{
	struct cpdb_strbuf *b = out;

	cpdb_text(st, 0, b->buf, b->cap);
}

/* cpdb_apikey_lookup: looks the key up by its hash. */
int cpdb_apikey_lookup(struct cpdb *db, const char *key, char *name,
                       size_t cap, struct tt_err *err)
{
	char hash[CPDB_HASH_HEX + 1];
	struct cpdb_strbuf out = { name, cap };

	cpdb_key_hash(key, hash);
	return cpdb_get1(db, "SELECT name FROM api_keys WHERE hash=?", hash,
	                 cpdb_str_row, &out, "api key lookup", err);
}

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

/* cpdb_update1: runs an UPDATE with (int64, text) params; returns rows
 * changed (0 or 1) or -1. */
static int cpdb_update1(struct cpdb *db, const char *sql, int64_t v,
                        const char *id, struct tt_err *err)
{
	int rc = cpdb_change(db, err, "update", sql, "it", v, id);

	return rc < 0 ? -1 : rc > 0;
}

/* cpdb_worker_seen: liveness stamp from feed polls. */
int cpdb_worker_seen(struct cpdb *db, const char *id, int64_t now,
                     struct tt_err *err)
{
	return cpdb_update1(db, "UPDATE workers SET last_seen=?1 WHERE id=?2",
	                    now, id, err);
}

/* cpdb_worker_set_acked: acked_rev only moves forward. */
int cpdb_worker_set_acked(struct cpdb *db, const char *id, int64_t rev,
                          struct tt_err *err)
{
	return cpdb_update1(db, "UPDATE workers SET acked_rev=max(acked_rev,?1)"
	                    " WHERE id=?2", rev, id, err);
}

/* cpdb_worker_acked_seen: both stamps of an ack, atomically. */
int cpdb_worker_acked_seen(struct cpdb *db, const char *id, int64_t rev,
                           int64_t now, struct tt_err *err)
{
	int rc = cpdb_change(db, err, "ack", "UPDATE workers SET"
	                     " acked_rev=max(acked_rev,?1), last_seen=?3"
	                     " WHERE id=?2", "iti", rev, id, now);

	return rc < 0 ? -1 : rc > 0;
}

/* cpdb_worker_row: row -> struct. */
static void cpdb_worker_row(sqlite3_stmt *st, void *out)
{
	struct cp_worker *w = out;

	cpdb_text(st, 0, w->id, sizeof(w->id));
	cpdb_text(st, 1, w->node_url, sizeof(w->node_url));
	w->registered_at = sqlite3_column_int64(st, 2);
	w->last_seen = sqlite3_column_int64(st, 3);
	w->acked_rev = sqlite3_column_int64(st, 4);
	w->draining = sqlite3_column_int64(st, 5);
	w->sent_rev = sqlite3_column_int64(st, 6);
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
	return cpdb_get1(db, "SELECT " CPDB_WORKER_COLS " FROM workers WHERE id=?",
	                 id, cpdb_worker_row, out, "worker lookup", err);
}

/* cpdb_workers_each: iterates all workers. */
int cpdb_workers_each(struct cpdb *db,
                      void (*fn)(const struct cp_worker *, void *), void *arg,
                      struct tt_err *err)
{
	sqlite3_stmt *st = cpdb_prep(db, "SELECT " CPDB_WORKER_COLS
	                             " FROM workers ORDER BY id", err);
	struct cp_worker w;
	int rc;

	if (st == NULL)
		return -1;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		cpdb_worker_row(st, &w);
		fn(&w, arg);
	}
	sqlite3_finalize(st);
	return rc == SQLITE_DONE ? 0 : cpdb_fail(db, err, "list workers");
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

/* cpdb_feed_insert: the INSERT of one feed row (inside a caller's txn). */
static int cpdb_feed_insert(struct cpdb *db, const char *kind,
                            const char *worker, json_t *body, int64_t now,
                            int64_t *rev, struct tt_err *err)
{
	_cleanup_free_ char *s = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS);

	if (s == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "cannot encode feed body");
	/* worker NULL: a broadcast row */
	if (cpdb_change(db, err, "append feed", "INSERT INTO feed(kind,worker,"
	                "body,created_at) VALUES(?,?,?,?)", "ttti", kind, worker,
	                s, now) < 0)
		return -1;
	*rev = sqlite3_last_insert_rowid(db->h);
	return 0;
}

/* cpdb_commit: COMMIT, or ROLLBACK when rc < 0 or the COMMIT itself
 * failed (e.g. SQLITE_FULL: the transaction may still be open, and every
 * later BEGIN would fail); passes rc through. */
static int cpdb_commit(struct cpdb *db, int rc, struct tt_err *err)
{
	if (rc >= 0 && cpdb_exec(db, "COMMIT", err) == 0)
		return 0;
	if (!sqlite3_get_autocommit(db->h))
		sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
	return -1;
}

/* cpdb_batch_begin: BEGIN IMMEDIATE for a group of plain updates. */
int cpdb_batch_begin(struct cpdb *db, struct tt_err *err)
{
	return cpdb_exec(db, "BEGIN IMMEDIATE", err);
}

/* cpdb_batch_end: COMMIT (rc >= 0) or ROLLBACK; passes rc through. */
int cpdb_batch_end(struct cpdb *db, int rc, struct tt_err *err)
{
	return cpdb_commit(db, rc < 0 ? -1 : 0, err) < 0 ? -1 : rc;
}

/* cpdb_feed_append: one update in its own transaction. */
int cpdb_feed_append(struct cpdb *db, const char *kind, const char *worker,
                     json_t *body, int64_t now, int64_t *rev,
                     struct tt_err *err)
{
	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	return cpdb_commit(db, cpdb_feed_insert(db, kind, worker, body, now,
	                                        rev, err), err);
}

/* cpdb_install_cpu: an install body carries the sandbox's CPU cap when
 * one was asked (absent: the worker's default; lib/feedsig.h). */
static int cpdb_install_cpu(json_t *body, int64_t cpu)
{
	return cpu > 0 ? json_object_set_new(body, "cpu", json_integer(cpu)) : 0;
}

/* cpdb_sandbox_create: sandbox row + install update, atomically. */
int cpdb_sandbox_create(struct cpdb *db, const char *id, const char *worker,
                        int64_t cpu, int64_t now, struct cp_sandbox *out,
                        int64_t *rev, struct tt_err *err)
{
	return cpdb_sandbox_create_on(db, id, worker, "ns", cpu, now, out, rev, err);
}

/* cpdb_sandbox_create_on: see db.h. */
int cpdb_sandbox_create_on(struct cpdb *db, const char *id, const char *worker,
                           const char *sst, int64_t cpu, int64_t now,
                           struct cp_sandbox *out, int64_t *rev, struct tt_err *err)
{
	json_t *body;
	int rc;

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
	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	if (cpdb_change(db, err, "insert sandbox", "INSERT INTO sandboxes(id,state,"
	                "generation,worker,substrate,pod,activation,created_at,cpu)"
	                " VALUES(?,'starting',1,?,?,'',1,?,?)", "tttii", id, worker, sst,
	                now, cpu) < 0)
		return cpdb_commit(db, -1, err);
	body = json_pack("{s:s,s:I,s:s,s:s,s:s,s:I,s:n}", "sandbox", id,
	                 "generation", (json_int_t)1, "worker", worker,
	                 "substrate", sst, "pod", "", "activation",
	                 (json_int_t)1, "snapshot");
	if (body == NULL || cpdb_install_cpu(body, cpu) < 0) {
		json_decref(body);
		return cpdb_commit(db, tt_err_set(err, TT_ERR_NOMEM, "oom"), err);
	}
	rc = cpdb_feed_insert(db, "install", worker, body, now, rev, err);
	json_decref(body);
	return cpdb_commit(db, rc, err);
}

/* cpdb_generation_next: generation += 1 under a write lock. */
int cpdb_generation_next(struct cpdb *db, const char *id, uint64_t *gen,
                         struct tt_err *err)
{
	int64_t g = 0;
	int rc;

	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	rc = cpdb_update1(db, "UPDATE sandboxes SET generation=generation+?1"
	                  " WHERE id=?2", 1, id, err);
	if (rc == 0)
		rc = tt_err_set(err, TT_ERR_NOT_FOUND, "no sandbox %s", id);
	if (rc > 0)
		rc = cpdb_scalar(db, "SELECT generation FROM sandboxes WHERE id=?",
		                 id, &g, err);
	if (cpdb_commit(db, rc, err) < 0)
		return -1;
	*gen = (uint64_t)g;
	return 0;
}

/* cpdb_sandbox_row: row -> struct. */
static void cpdb_sandbox_row(sqlite3_stmt *st, void *out)
{
	struct cp_sandbox *s = out;

	cpdb_text(st, 0, s->id, sizeof(s->id));
	cpdb_text(st, 1, s->state, sizeof(s->state));
	s->generation = (uint64_t)sqlite3_column_int64(st, 2);
	cpdb_text(st, 3, s->worker, sizeof(s->worker));
	cpdb_text(st, 4, s->substrate, sizeof(s->substrate));
	cpdb_text(st, 5, s->pod, sizeof(s->pod));
	s->activation = (uint32_t)sqlite3_column_int64(st, 6);
	s->created_at = sqlite3_column_int64(st, 7);
	cpdb_text(st, 8, s->error, sizeof(s->error));
	s->op_rev = sqlite3_column_int64(st, 9);
	s->op_at = sqlite3_column_int64(st, 10);
	s->progress_bytes = sqlite3_column_int64(st, 11);
	s->progress_total = sqlite3_column_int64(st, 12);
	cpdb_text(st, 13, s->migrate_to, sizeof(s->migrate_to));
	cpdb_text(st, 14, s->note, sizeof(s->note));
	cpdb_text(st, 15, s->resume_on, sizeof(s->resume_on));
	s->relaunches = sqlite3_column_int64(st, 16);
	s->relaunch_at = sqlite3_column_int64(st, 17);
	s->cpu = sqlite3_column_int64(st, 18);
}

#define CPDB_SBX_COLS "id,state,generation,worker,substrate,pod,activation," \
                      "created_at,error,op_rev,op_at,progress_bytes," \
                      "progress_total,migrate_to,note,resume_on,relaunches," \
                      "relaunch_at,cpu"

/* cpdb_sandbox_get: one sandbox (deleted ones too: they keep their gen). */
int cpdb_sandbox_get(struct cpdb *db, const char *id, struct cp_sandbox *out,
                     struct tt_err *err)
{
	return cpdb_get1(db, "SELECT " CPDB_SBX_COLS " FROM sandboxes WHERE id=?",
	                 id, cpdb_sandbox_row, out, "sandbox lookup", err);
}

/* cpdb_sandboxes_each: live sandboxes, oldest first. */
int cpdb_sandboxes_each(struct cpdb *db,
                        void (*fn)(const struct cp_sandbox *, void *),
                        void *arg, struct tt_err *err)
{
	sqlite3_stmt *st = cpdb_prep(db, "SELECT " CPDB_SBX_COLS
	                             " FROM sandboxes WHERE state<>'deleted'"
	                             " ORDER BY created_at, id", err);
	struct cp_sandbox s;
	int rc;

	if (st == NULL)
		return -1;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		cpdb_sandbox_row(st, &s);
		fn(&s, arg);
	}
	sqlite3_finalize(st);
	return rc == SQLITE_DONE ? 0 : cpdb_fail(db, err, "list sandboxes");
}

/* cpdb_sandbox_set_state: state (+ error text, NULL clears it). */
int cpdb_sandbox_set_state(struct cpdb *db, const char *id, const char *state,
                           const char *error, struct tt_err *err)
{
	return cpdb_change(db, err, "set state", "UPDATE sandboxes SET state=?,"
	                   "error=? WHERE id=?", "ttt", state, error, id) < 0 ? -1 : 0;
}

/* cpdb_sandbox_destroy: deleting + destroy update for its worker. */
int cpdb_sandbox_destroy(struct cpdb *db, const struct cp_sandbox *s,
                         int64_t now, int64_t *rev, struct tt_err *err)
{
	json_t *body;
	int rc;

	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	rc = cpdb_update1(db, "UPDATE sandboxes SET state='deleting',"
	                  "error=NULL WHERE id=?2 AND ?1", 1, s->id, err);
	if (rc >= 0) {
		body = json_pack("{s:s}", "sandbox", s->id);
		rc = body ? cpdb_feed_insert(db, "destroy", s->worker, body, now,
		                             rev, err)
		          : tt_err_set(err, TT_ERR_NOMEM, "oom");
		json_decref(body);
	}
	return cpdb_commit(db, rc, err);
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

/* cpdb_sandbox_pause: the pause CAS and its feed update, atomically. */
int cpdb_sandbox_pause(struct cpdb *db, const struct cp_sandbox *s,
                       const char *migrate_to, const char *resume_on,
                       int64_t now, int64_t *rev, struct tt_err *err)
{
	char key[CPDB_SNAPKEY_MAX];
	json_t *body;
	int rc;

	snprintf(key, sizeof(key), "%s/%llu", s->id,
	         (unsigned long long)s->generation);
	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET state='pausing',"
	                 "error=NULL,op_at=?3,progress_bytes=-1,progress_total=-1,"
	                 "migrate_to=?4,resume_on=?5,note=''"
	                 " WHERE id=?1 AND state='running' AND generation=?2",
	                 "tiitt", s->id, (int64_t)s->generation, now,
	                 migrate_to != NULL ? migrate_to : "",
	                 resume_on != NULL ? resume_on : "");
	if (rc <= 0) {
		cpdb_commit(db, -1, err);
		return rc;
	}
	body = json_pack("{s:s,s:I,s:s}", "sandbox", s->id, "generation",
	                 (json_int_t)s->generation, "snapshot", key);
	rc = body ? cpdb_feed_insert(db, "pause", s->worker, body, now, rev, err)
	          : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_decref(body);
	if (rc == 0)
		rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
		                 " WHERE id=?1", "ti", s->id, *rev);
	if (cpdb_commit(db, rc < 0 ? -1 : 0, err) < 0)
		return -1;
	return 1;
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

/* cpdb_snapshot_gens_txn: the generations of id's recorded snapshots,
 * newest first, at most cap (*n of them). */
static int cpdb_snapshot_gens_txn(struct cpdb *db, const char *id, uint64_t *out,
                                  size_t cap, size_t *n, struct tt_err *err)
{
	sqlite3_stmt *st = cpdb_prep(db, "SELECT generation FROM snapshots WHERE"
	                             " sandbox=?1 ORDER BY generation DESC", err);
	int rc;

	*n = 0;
	if (st == NULL)
		return -1;
	sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW && *n < cap)
		out[(*n)++] = (uint64_t)sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : cpdb_fail(db, err, "snapshot list");
}

/* cpdb_snapshot_gens: see db.h. */
int cpdb_snapshot_gens(struct cpdb *db, const char *id, uint64_t *out, size_t cap,
                       size_t *n, struct tt_err *err)
{
	return cpdb_snapshot_gens_txn(db, id, out, cap, n, err);
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
	    cpdb_snapshot_gens_txn(db, id, kept, keep_older + 1, &n, err) < 0)
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

/* cpdb_snapshot_record: CAS to paused, the snapshot row, the pruning. */
int cpdb_snapshot_record(struct cpdb *db, const char *id, const struct cpdb_record *r,
                         const struct cp_snapshot *snap, int64_t *prune_rev,
                         struct tt_err *err)
{
	int rc;

	if (snap->generation != r->gen)
		return 0; /* not this generation's snapshot: nothing changes */
	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET state='paused',"
	                 "error=NULL,op_rev=0,progress_bytes=-1,progress_total=-1"
	                 " WHERE id=?1 AND state=?2 AND generation=?3"
	                 " AND (?4 < 0 OR op_rev=?4)", "ttii", id, r->from,
	                 (int64_t)r->gen, r->op_rev);
	if (rc <= 0) {
		cpdb_commit(db, -1, err);
		return rc;
	}
	rc = cpdb_change(db, err, "update", "INSERT OR REPLACE INTO snapshots(sandbox,"
	                 "generation,key,size,checksum,created_at)"
	                 " VALUES(?1,?2,?3,?4,?5,?6)", "tititi", id,
	                 (int64_t)r->gen, snap->key, snap->size, snap->checksum,
	                 snap->created_at);
	if (rc >= 0 && r->worker != NULL)
		rc = cpdb_prune_txn(db, id, r->gen, r->keep_older, r->worker, r->now,
		                    prune_rev, err);
	if (cpdb_commit(db, rc < 0 ? -1 : 0, err) < 0)
		return -1;
	return 1;
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

/* cpdb_pause_reask: a pause asked again, marked so (see db.h). */
int cpdb_pause_reask(struct cpdb *db, const struct cp_sandbox *s, int64_t now,
                     int64_t *rev, struct tt_err *err)
{
	char key[CPDB_SNAPKEY_MAX];
	json_t *body;
	int rc;

	snprintf(key, sizeof(key), "%s/%llu", s->id, (unsigned long long)s->generation);
	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	body = json_pack("{s:s,s:I,s:s,s:b}", "sandbox", s->id, "generation",
	                 (json_int_t)s->generation, "snapshot", key, "again", 1);
	rc = body ? cpdb_feed_insert(db, "pause", s->worker, body, now, rev, err)
	          : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_decref(body);
	/* A pause still pending waits for the new one's answer instead. */
	if (rc == 0)
		rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
		                 " WHERE id=?1 AND state='pausing' AND generation=?3",
		                 "tii", s->id, *rev, (int64_t)s->generation);
	return cpdb_commit(db, rc < 0 ? -1 : 0, err);
}

/* cpdb_install_reask: see db.h. */
int cpdb_install_reask(struct cpdb *db, const struct cp_sandbox *s, json_t *up,
                       int64_t now, int64_t *rev, struct tt_err *err)
{
	json_t *body = json_deep_copy(up);
	int rc;

	if (body == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_object_del(body, "rev");
	json_object_del(body, "kind");
	json_object_del(body, "worker");
	json_object_set_new(body, "again", json_true());
	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0) {
		json_decref(body);
		return -1;
	}
	rc = cpdb_feed_insert(db, "install", s->worker, body, now, rev, err);
	json_decref(body);
	if (rc == 0)
		rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
		                 " WHERE id=?1 AND state IN ('starting','resuming')"
		                 " AND generation=?3", "tii", s->id, *rev,
		                 (int64_t)s->generation);
	return cpdb_commit(db, rc < 0 ? -1 : 0, err);
}

/* cpdb_sandbox_cas: a guarded state change, optionally with a retire. */
int cpdb_sandbox_cas(struct cpdb *db, const char *id, const char *from,
                     uint64_t gen, int64_t op_rev, const char *to,
                     const char *error, const char *retire_worker,
                     int64_t now, int64_t *retire_rev, struct tt_err *err)
{
	int rc;

	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET state=?4,error=?6,"
	                 "op_rev=0,progress_bytes=-1,progress_total=-1,migrate_to='',"
	                 "resume_on=''"
	                 " WHERE id=?1 AND state=?2 AND generation=?3"
	                 " AND (?5 < 0 OR op_rev=?5)", "ttitit", id, from,
	                 (int64_t)gen, to, op_rev, error);
	if (rc <= 0) {
		cpdb_commit(db, -1, err);
		return rc;
	}
	if (retire_worker != NULL)
		rc = cpdb_retire_insert(db, id, gen, retire_worker, now,
		                        retire_rev, err);
	if (cpdb_commit(db, rc < 0 ? -1 : 0, err) < 0)
		return -1;
	return 1;
}

/* cpdb_sandbox_resume: generation N+1 and its install, atomically. */
int cpdb_sandbox_resume(struct cpdb *db, const char *id,
                        const struct cpdb_resume *r, int64_t now,
                        uint64_t *new_gen, int64_t *rev, int64_t *retire_rev,
                        struct tt_err *err)
{
	struct cp_sandbox cur;
	json_t *body;
	int rc;

	if (cpdb_exec(db, "BEGIN IMMEDIATE", err) < 0)
		return -1;
	/* read inside the write lock: the install copies these fields */
	rc = cpdb_sandbox_get(db, id, &cur, err);
	if (rc <= 0 || strcmp(cur.state, r->from) != 0 ||
	    cur.generation != r->gen) {
		cpdb_commit(db, -1, err);
		return rc < 0 ? -1 : 0;
	}
	if (r->retire_worker != NULL &&
	    cpdb_retire_insert(db, id, r->gen, r->retire_worker, now,
	                       retire_rev, err) < 0)
		return cpdb_commit(db, -1, err);
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
	                 "ttitiiiti", id, r->from, (int64_t)r->gen, r->worker, now,
	                 (int64_t)(r->reactivate ? 0 : 1),
	                 (int64_t)(r->reactivate ? 1 : 0),
	                 r->note != NULL ? r->note : "",
	                 (int64_t)CPDB_RELAUNCH_WINDOW);
	if (rc != 1)
		return cpdb_commit(db, rc < 0 ? -1 : tt_err_set(err, TT_ERR_IO,
		                   "resume update changed %d rows", rc), err);
	/* without a snapshot: the worker starts it on the layer it holds
	 * ("from_layer": it refuses rather than start on an empty one) */
	body = json_pack("{s:s,s:I,s:s,s:s,s:s,s:I,s:s?,s:b}", "sandbox", id,
	                 "generation", (json_int_t)(r->reactivate ? r->gen : r->gen + 1),
	                 "worker", r->worker, "substrate", cur.substrate, "pod",
	                 cur.pod, "activation",
	                 (json_int_t)(cur.activation + (r->reactivate ? 1 : 0)),
	                 "snapshot", r->snapshot_key, "from_layer",
	                 r->snapshot_key == NULL);
	/* every execution of the sandbox keeps the cap it was created with */
	rc = body && cpdb_install_cpu(body, cur.cpu) == 0
	     ? cpdb_feed_insert(db, "install", r->worker, body, now, rev, err)
	     : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	json_decref(body);
	if (rc == 0)
		rc = cpdb_change(db, err, "update", "UPDATE sandboxes SET op_rev=?2"
		                 " WHERE id=?1", "ti", id, *rev);
	if (cpdb_commit(db, rc < 0 ? -1 : 0, err) < 0)
		return -1;
	*new_gen = r->reactivate ? r->gen : r->gen + 1;
	return 1;
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
static void cpdb_snapshot_row(sqlite3_stmt *st, void *out)
{
	struct cp_snapshot *snap = out;

	cpdb_text(st, 0, snap->sandbox, sizeof(snap->sandbox));
	snap->generation = (uint64_t)sqlite3_column_int64(st, 1);
	cpdb_text(st, 2, snap->key, sizeof(snap->key));
	snap->size = sqlite3_column_int64(st, 3);
	cpdb_text(st, 4, snap->checksum, sizeof(snap->checksum));
	snap->created_at = sqlite3_column_int64(st, 5);
}

/* cpdb_snapshot_latest: highest generation with a complete snapshot. */
int cpdb_snapshot_latest(struct cpdb *db, const char *id,
                         struct cp_snapshot *out, struct tt_err *err)
{
	return cpdb_get1(db, "SELECT sandbox,generation,key,size,checksum,"
	                 "created_at FROM snapshots WHERE sandbox=?"
	                 " ORDER BY generation DESC LIMIT 1", id,
	                 cpdb_snapshot_row, out, "snapshot lookup", err);
}

/* cpdb_feed_latest: newest rev. */
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
	sqlite3_stmt *st = cpdb_prep(db, "SELECT coalesce(max(rev),0) FROM feed"
	                             " WHERE rev<?1 AND (worker IS NULL OR"
	                             " worker=?2)", err);
	int rc;

	if (st == NULL)
		return -1;
	sqlite3_bind_int64(st, 1, rev);
	sqlite3_bind_text(st, 2, worker, -1, SQLITE_TRANSIENT);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*prev = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return rc == SQLITE_ROW ? 0 : cpdb_fail(db, err, "read feed");
}

/* cpdb_feed_update: row (rev, kind, worker, body) -> update object. */
static json_t *cpdb_feed_update(sqlite3_stmt *st, struct tt_err *err)
{
	const char *body = (const char *)sqlite3_column_text(st, 3);
	json_t *u = body ? json_loads(body, JSON_REJECT_DUPLICATES, NULL) : NULL;

	if (!json_is_object(u)) {
		json_decref(u);
		tt_err_set(err, TT_ERR_MALFORMED, "corrupt feed row %lld",
		           (long long)sqlite3_column_int64(st, 0));
		return NULL;
	}
	json_object_set_new(u, "rev", json_integer(sqlite3_column_int64(st, 0)));
	json_object_set_new(u, "kind", json_string(
	        (const char *)sqlite3_column_text(st, 1)));
	if (sqlite3_column_type(st, 2) == SQLITE_NULL)
		json_object_set_new(u, "worker", json_null());
	else
		json_object_set_new(u, "worker", json_string(
		        (const char *)sqlite3_column_text(st, 2)));
	return u;
}

/* cpdb_feed_since: the worker's updates (its own and broadcast ones). */
json_t *cpdb_feed_since(struct cpdb *db, const char *worker, int64_t after,
                        int limit, struct tt_err *err)
{
	sqlite3_stmt *st = cpdb_prep(db, "SELECT rev,kind,worker,body FROM feed"
	                             " WHERE rev>?1 AND (worker IS NULL OR"
	                             " worker=?2) ORDER BY rev LIMIT ?3", err);
	json_t *arr = json_array(), *u;
	int rc;

	if (st == NULL || arr == NULL) {
		sqlite3_finalize(st);
		json_decref(arr);
		return NULL;
	}
	sqlite3_bind_int64(st, 1, after);
	sqlite3_bind_text(st, 2, worker, -1, SQLITE_TRANSIENT);
	sqlite3_bind_int(st, 3, limit);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		u = cpdb_feed_update(st, err);
		if (u == NULL)
			break;
		json_array_append_new(arr, u);
	}
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE) {
		if (rc != SQLITE_ROW)
			cpdb_fail(db, err, "read feed");
		json_decref(arr);
		return NULL;
	}
	return arr;
}

/* cpdb_feed_get: one row's kind and body. */
int cpdb_feed_get(struct cpdb *db, int64_t rev, char *kind, size_t cap,
                  json_t **body, struct tt_err *err)
{
	sqlite3_stmt *st = cpdb_prep(db, "SELECT rev,kind,worker,body FROM feed"
	                             " WHERE rev=?", err);
	int rc;

	*body = NULL;
	if (st == NULL)
		return -1;
	sqlite3_bind_int64(st, 1, rev);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		cpdb_text(st, 1, kind, cap);
		*body = cpdb_feed_update(st, err);
	}
	sqlite3_finalize(st);
	if (rc == SQLITE_ROW)
		return *body ? 1 : -1;
	return rc == SQLITE_DONE ? 0 : cpdb_fail(db, err, "read feed row");
}

/* cpdb_feed_last_body: newest body of kind (to detect key changes). */
json_t *cpdb_feed_last_body(struct cpdb *db, const char *kind,
                            struct tt_err *err)
{
	sqlite3_stmt *st = cpdb_prep(db, "SELECT body FROM feed WHERE kind=?"
	                             " ORDER BY rev DESC LIMIT 1", err);
	json_t *body = NULL;
	int rc;

	if (st == NULL)
		return NULL;
	tt_err_clear(err);
	sqlite3_bind_text(st, 1, kind, -1, SQLITE_TRANSIENT);
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		body = json_loads((const char *)sqlite3_column_text(st, 0),
		                  JSON_REJECT_DUPLICATES, NULL);
	else if (rc != SQLITE_DONE)
		cpdb_fail(db, err, "read feed");
	sqlite3_finalize(st);
	return body;
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
static void cpdb_cred_row(sqlite3_stmt *st, void *out)
{
	struct cp_cred *c = out;

	cpdb_text(st, 0, c->id, sizeof(c->id));
	cpdb_text(st, 1, c->hash, sizeof(c->hash));
	cpdb_text(st, 2, c->node_url, sizeof(c->node_url));
}

/* cpdb_cred_by_hash: the worker a credential hash belongs to. */
int cpdb_cred_by_hash(struct cpdb *db, const char *hash, struct cp_cred *out,
                      struct tt_err *err)
{
	return cpdb_get1(db, "SELECT id,hash,node_url FROM worker_creds WHERE hash=?",
	                 hash, cpdb_cred_row, out, "credential lookup", err);
}

/* cpdb_cred_get: the credential row of worker id. */
int cpdb_cred_get(struct cpdb *db, const char *id, struct cp_cred *out,
                  struct tt_err *err)
{
	return cpdb_get1(db, "SELECT id,hash,node_url FROM worker_creds WHERE id=?",
	                 id, cpdb_cred_row, out, "credential lookup", err);
}

/* cpdb_worker_sent: sent_rev only moves forward. */
int cpdb_worker_sent(struct cpdb *db, const char *id, int64_t rev,
                     struct tt_err *err)
{
	return cpdb_update1(db, "UPDATE workers SET sent_rev=?1 WHERE id=?2"
	                    " AND sent_rev<?1", rev, id, err);
}

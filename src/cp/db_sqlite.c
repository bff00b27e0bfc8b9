/* The store's SQLite backend (dbdrv.h): one file (WAL, synchronous=FULL,
 * foreign keys), made 0600 before SQLite writes to it; one cp uses it.
 * Write transactions are BEGIN IMMEDIATE: the file's one writer. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cp/dbdrv.h"

static const char sq_schema[] =
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
	" node_url TEXT NOT NULL, created_at INTEGER NOT NULL);"
	/* what each lifecycle call with an Idempotency-Key started */
	"CREATE TABLE IF NOT EXISTS requests("
	" caller TEXT NOT NULL, key TEXT NOT NULL, op TEXT NOT NULL,"
	" sandbox TEXT NOT NULL, generation INTEGER NOT NULL, rev INTEGER NOT NULL,"
	" worker TEXT NOT NULL, target TEXT NOT NULL, forced INTEGER NOT NULL,"
	" resumed_from INTEGER NOT NULL, created_at INTEGER NOT NULL,"
	" PRIMARY KEY (caller, key));"
	/* rebuilt-attempt leases: one per sandbox, the newest */
	/* facts every replica must agree on (the feed key) */
	"CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS leases("
	" sandbox TEXT PRIMARY KEY, generation INTEGER NOT NULL,"
	" activation INTEGER NOT NULL, until_ms INTEGER NOT NULL);";

static const struct cpdb_drv sq_drv;

/* sq_h: the connection. */
static sqlite3 *sq_h(struct cpdb *db)
{
	return db->h;
}

/* sq_fail: err from the connection's last error; returns -1. */
static int sq_fail(struct cpdb *db, struct tt_err *err, const char *what)
{
	return tt_err_set(err, TT_ERR_IO, "sqlite %s: %s", what,
	                  sqlite3_errmsg(sq_h(db)));
}

/* sq_exec: SQL without parameters or results. */
static int sq_exec(struct cpdb *db, const char *sql, struct tt_err *err)
{
	char *msg = NULL;

	if (sqlite3_exec(sq_h(db), sql, NULL, NULL, &msg) != SQLITE_OK) {
		tt_err_set(err, TT_ERR_IO, "sqlite: %s", msg ? msg : "error");
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

/* sq_query: prepare, bind, step through the rows. */
static int sq_query(struct cpdb *db, const char *sql, const struct cpdb_arg *a,
                    int n, cpdb_row_fn fn, void *arg, int64_t *changes,
                    struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	struct cpdb_row row = { &sq_drv, NULL, 0 };
	int rc, stop = 0;

	if (sqlite3_prepare_v2(sq_h(db), sql, -1, &st, NULL) != SQLITE_OK)
		return sq_fail(db, err, "prepare");
	for (int i = 0; i < n; i++) {
		if (a[i].t == 't' && a[i].s != NULL)
			sqlite3_bind_text(st, i + 1, a[i].s, -1, SQLITE_TRANSIENT);
		else if (a[i].t == 't')
			sqlite3_bind_null(st, i + 1);
		else
			sqlite3_bind_int64(st, i + 1, a[i].i);
	}
	row.h = st;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		stop = fn ? fn(&row, arg) : 0;
		if (stop != 0)
			break;
	}
	sqlite3_finalize(st);
	if (stop < 0)
		return -1; /* the callback's error */
	if (stop == 0 && rc != SQLITE_DONE)
		return sq_fail(db, err, "step");
	if (changes != NULL)
		*changes = sqlite3_changes(sq_h(db));
	return 0;
}

/* sq_col_int: column i of the current row. */
static int64_t sq_col_int(const struct cpdb_row *r, int i)
{
	return sqlite3_column_int64(r->h, i);
}

/* sq_col_text: column i, NULL for NULL. */
static const char *sq_col_text(const struct cpdb_row *r, int i)
{
	return (const char *)sqlite3_column_text(r->h, i);
}

/* sq_begin: the file's write lock. */
static int sq_begin(struct cpdb *db, struct tt_err *err)
{
	return sq_exec(db, "BEGIN IMMEDIATE", err);
}

/* sq_commit: COMMIT (on failure, e.g. SQLITE_FULL, the rollback follows
 * from cpdb_txn: the transaction may still be open). */
static int sq_commit(struct cpdb *db, struct tt_err *err)
{
	return sq_exec(db, "COMMIT", err);
}

/* sq_rollback: ROLLBACK if a transaction is open. */
static void sq_rollback(struct cpdb *db)
{
	if (!sqlite3_get_autocommit(sq_h(db)))
		sqlite3_exec(sq_h(db), "ROLLBACK", NULL, NULL, NULL);
}

/* sq_retryable: one writer at a time (the busy timeout waits for the
 * others): nothing to run again. */
static int sq_retryable(struct cpdb *db)
{
	(void)db;
	return 0;
}

/* What sq_has_column counts. */
struct sq_count {
	int64_t n;
};

/* sq_count_row: column 0. */
static int sq_count_row(const struct cpdb_row *r, void *arg)
{
	((struct sq_count *)arg)->n = sqlite3_column_int64(r->h, 0);
	return 1;
}

/* sq_has_column: pragma_table_info. */
static int sq_has_column(struct cpdb *db, const char *table, const char *col,
                         struct tt_err *err)
{
	char sql[160];
	struct sq_count c = { 0 };
	struct cpdb_arg a = { 't', col, 0 };

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM pragma_table_info('%s')"
	         " WHERE name=?1", table);
	if (sq_query(db, sql, &a, 1, sq_count_row, &c, NULL, err) < 0)
		return -1;
	return c.n > 0;
}

/* sq_add_column: ALTER TABLE ... ADD COLUMN. */
static int sq_add_column(struct cpdb *db, const char *table, const char *decl,
                         struct tt_err *err)
{
	char sql[256];

	snprintf(sql, sizeof(sql), "ALTER TABLE %s ADD COLUMN %s", table, decl);
	return sq_exec(db, sql, err);
}

/* sq_close: closes the connection. */
static void sq_close(struct cpdb *db)
{
	sqlite3_close(sq_h(db));
	db->h = NULL;
}

static const struct cpdb_drv sq_drv = {
	.name = "sqlite",
	.close = sq_close,
	.exec = sq_exec,
	.query = sq_query,
	.col_int = sq_col_int,
	.col_text = sq_col_text,
	.begin = sq_begin,
	.commit = sq_commit,
	.rollback = sq_rollback,
	.retryable = sq_retryable,
	.has_column = sq_has_column,
	.add_column = sq_add_column,
	/* AUTOINCREMENT: never reused, even after a delete; the write lock
	 * makes commit order rev order */
	.feed_sql = "INSERT INTO feed(kind,worker,body,created_at)"
	            " VALUES(?1,?2,?3,?4) RETURNING rev",
	.lock_sql = NULL,
};

/* sq_private: path (made if missing, with create) is a regular file of
 * mode 0600, narrowed if wider, before SQLite writes a byte to it; no
 * symlink is followed. It holds API key hashes and every sandbox's state;
 * SQLite gives the -wal and -shm files it creates the database's mode. */
static int sq_private(const char *path, bool create, struct tt_err *err)
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

/* sq_private_all: the database and, where they exist already (from a run
 * before files were made private), its -wal and -shm files: 0600. */
static int sq_private_all(const char *path, struct tt_err *err)
{
	char side[PATH_MAX];

	if (sq_private(path, true, err) < 0)
		return -1;
	snprintf(side, sizeof(side), "%s-wal", path);
	if (sq_private(side, false, err) < 0)
		return -1;
	snprintf(side, sizeof(side), "%s-shm", path);
	return sq_private(side, false, err);
}

/* cpdb_sqlite_open: opens the file, sets durability pragmas, creates the
 * schema and adds the later columns. */
int cpdb_sqlite_open(struct cpdb *db, const char *path, struct tt_err *err)
{
	sqlite3 *h = NULL;

	/* SQLite's own pathname bound (its journal's name adds 8 bytes). */
	if (strlen(path) > (size_t)sqlite3_vfs_find(NULL)->mxPathname - 8)
		return tt_err_set(err, TT_ERR_INVALID, "%s: the path is %zu bytes long;"
		                  " SQLite takes at most %d", "cp.db", strlen(path),
		                  sqlite3_vfs_find(NULL)->mxPathname - 8);
	if (sq_private_all(path, err) < 0)
		return -1;
	if (sqlite3_open_v2(path, &h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
	                    SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
		tt_err_set(err, TT_ERR_IO, "cannot open %s: %s", path,
		           h ? sqlite3_errmsg(h) : "out of memory");
		sqlite3_close(h);
		return -1;
	}
	db->drv = &sq_drv;
	db->h = h;
	sqlite3_busy_timeout(h, 5000);
	if (sq_exec(db, "PRAGMA journal_mode=WAL;"
	                "PRAGMA synchronous=FULL;"
	                "PRAGMA foreign_keys=ON;", err) < 0 ||
	    sq_exec(db, sq_schema, err) < 0 || cpdb_add_columns(db, err) < 0)
		return -1;
	return 0;
}

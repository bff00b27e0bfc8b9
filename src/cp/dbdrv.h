/* The control plane's store backends (docs/ARCHITECTURE.md "The store").
 * db.c holds the store's logic once, in SQL both backends take (SQLite's
 * "?N" parameters; the PostgreSQL backend numbers them "$N"); a backend
 * supplies the connection, statements with typed parameters and rows,
 * transactions, schema and column checks, the statement that appends one
 * feed row and allocates its rev, and cross-replica notifications.
 * Backends: db_sqlite.c (the default: one file, one cp) and db_pg.c
 * (PostgreSQL: several cp replicas on one database). Private to src/cp. */
#ifndef TT_CP_DBDRV_H
#define TT_CP_DBDRV_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "cp/db.h"
#include "err.h"

/* One statement parameter: 't' text (s; NULL binds NULL) or 'i' int64. */
struct cpdb_arg {
	char t;
	const char *s;
	int64_t i;
};

/* The current row of a query: h and n are the backend's own. */
struct cpdb_row {
	const struct cpdb_drv *drv;
	void *h;
	int n;
};

/* Called per row: 0 goes on, 1 stops (not an error), -1 stops with the
 * error the callback recorded in its own argument. */
typedef int (*cpdb_row_fn)(const struct cpdb_row *r, void *arg);

#define CPDB_ARGS_MAX 16
#define CPDB_SQL_MAX 2048

struct cpdb_drv {
	const char *name; /* "sqlite" | "postgresql" */
	void (*close)(struct cpdb *db);
	/* exec: SQL without parameters or rows (may be several statements) */
	int (*exec)(struct cpdb *db, const char *sql, struct tt_err *err);
	/* query: one statement; fn (may be NULL) sees each row; *changes
	 * (may be NULL) the rows a write changed. 0 or -1. */
	int (*query)(struct cpdb *db, const char *sql, const struct cpdb_arg *a,
	             int n, cpdb_row_fn fn, void *arg, int64_t *changes,
	             struct tt_err *err);
	int64_t (*col_int)(const struct cpdb_row *r, int i);
	const char *(*col_text)(const struct cpdb_row *r, int i); /* NULL: NULL */
	/* a write transaction: SQLite BEGIN IMMEDIATE (the file's one writer),
	 * PostgreSQL BEGIN (READ COMMITTED; rows locked by the writes that
	 * guard them, lock_sql where a read decides a write) */
	int (*begin)(struct cpdb *db, struct tt_err *err);
	int (*commit)(struct cpdb *db, struct tt_err *err);
	void (*rollback)(struct cpdb *db);
	/* retryable: the last failure was a serialization failure, a
	 * deadlock, or a connection lost before COMMIT: the transaction
	 * left nothing behind and may run again */
	int (*retryable)(struct cpdb *db);
	/* has_column: 1/0/-1; add_column: ALTER TABLE t ADD COLUMN decl
	 * (the decl as written in db.c's column list) */
	int (*has_column)(struct cpdb *db, const char *table, const char *col,
	                  struct tt_err *err);
	int (*add_column)(struct cpdb *db, const char *table, const char *decl,
	                  struct tt_err *err);
	/* feed_sql: appends one feed row (?1 kind, ?2 worker, ?3 body, ?4
	 * created_at) and yields its rev as the one row, in rev order of
	 * commit (PostgreSQL: a one-row counter updated in the transaction) */
	const char *feed_sql;
	/* lock_sql: locks sandbox ?1's row for the transaction (NULL: the
	 * write transaction already excludes every other writer) */
	const char *lock_sql;
	/* notify: tells the other replicas (NULL: none can exist);
	 * listen_fd: a descriptor readable when they told us something;
	 * listen_read: calls fn for each message (from others only) */
	int (*notify)(struct cpdb *db, const char *msg, struct tt_err *err);
	int (*listen_fd)(struct cpdb *db);
	int (*listen_read)(struct cpdb *db, void (*fn)(const char *msg, void *arg),
	                   void *arg, struct tt_err *err);
};

/* The idempotency record a lifecycle write makes, when armed. */
struct cpdb_armed {
	int on;
	char caller[TT_SUB_MAX + 1];
	char key[CPDB_IDEM_KEY_MAX + 1];
	char op[16];
};

struct cpdb {
	const struct cpdb_drv *drv;
	void *h;              /* the backend's connection state */
	int in_txn;
	struct cpdb_armed idem;
};

/* The backends' constructors: h and drv set, schema made. */
int cpdb_sqlite_open(struct cpdb *db, const char *path, struct tt_err *err);
int cpdb_pg_open(struct cpdb *db, const char *url, struct tt_err *err);

/* ---- helpers of db.c and db_sandbox.c (db.c) ---------------------- */

/* cpdb_change: a write; types has one char per parameter ('t' text, NULL
 * binds NULL; 'i' int64_t). The rows changed, or -1 (what names it). */
int cpdb_change(struct cpdb *db, struct tt_err *err, const char *what,
                const char *sql, const char *types, ...);
/* cpdb_select: a read with parameters as cpdb_change; fn per row. 0/-1. */
int cpdb_select(struct cpdb *db, struct tt_err *err, const char *what,
                const char *sql, cpdb_row_fn fn, void *arg,
                const char *types, ...);
/* cpdb_get1: the first row of sql (text parameter p1, may be NULL),
 * decoded by row into out. 1 found, 0 none, -1 error. */
int cpdb_get1(struct cpdb *db, const char *sql, const char *p1,
              void (*row)(const struct cpdb_row *, void *), void *out,
              const char *what, struct tt_err *err);
/* What cpdb_one_row decodes with: row into out; found once it has. */
struct cpdb_one {
	void (*row)(const struct cpdb_row *, void *);
	void *out;
	int found;
};
/* cpdb_one_row: a cpdb_row_fn taking the first row (arg: cpdb_one). */
int cpdb_one_row(const struct cpdb_row *r, void *arg);
/* cpdb_int_row: column 0 into the int64_t at out. */
void cpdb_int_row(const struct cpdb_row *r, void *out);
/* What cpdb_int_first reads into. */
struct cpdb_prev {
	int64_t *out;
	int found;
};
/* cpdb_int_first: a cpdb_row_fn: column 0 of the first row (arg:
 * cpdb_prev). */
int cpdb_int_first(const struct cpdb_row *r, void *arg);
/* cpdb_scalar: one integer from a query (a text parameter, may be NULL). */
int cpdb_scalar(struct cpdb *db, const char *sql, const char *p1,
                int64_t *out, struct tt_err *err);
int64_t cpdb_int(const struct cpdb_row *r, int i);
/* cpdb_text: column i (NULL reads "") into buf. */
void cpdb_text(const struct cpdb_row *r, int i, char *buf, size_t cap);
int cpdb_is_null(const struct cpdb_row *r, int i);
/* cpdb_txn: fn in one write transaction, committed when it returns >= 0
 * (its value is returned), rolled back otherwise; run again (a bounded
 * number of times) when the backend says the failure was a serialization
 * failure or deadlock. fn must be safe to run again: it may only change
 * the database, and what it writes to its argument is rewritten on the
 * next run. */
int cpdb_txn(struct cpdb *db, int (*fn)(struct cpdb *, void *, struct tt_err *),
             void *arg, struct tt_err *err);
/* cpdb_feed_insert: one feed row inside a transaction; *rev its rev. */
int cpdb_feed_insert(struct cpdb *db, const char *kind, const char *worker,
                     json_t *body, int64_t now, int64_t *rev,
                     struct tt_err *err);
/* cpdb_lock: sandbox id's row is this transaction's (PostgreSQL). */
int cpdb_lock(struct cpdb *db, const char *id, struct tt_err *err);
/* cpdb_idem_record: inside a lifecycle write's transaction: what an armed
 * call started (nothing when not armed). */
int cpdb_idem_record(struct cpdb *db, const struct cpdb_idem *rec, int64_t now,
                     struct tt_err *err);

/* The base schema's later columns, in each backend's add order (db.c). */
struct cpdb_column {
	const char *table, *name, *decl;
};
extern const struct cpdb_column cpdb_columns[];
extern const size_t cpdb_ncolumns;
/* cpdb_add_columns: adds the listed columns a database lacks. */
int cpdb_add_columns(struct cpdb *db, struct tt_err *err);

#endif

/* The store's PostgreSQL backend (dbdrv.h), for several cp replicas on
 * one database (libpq, synchronous calls on the cp's loop, like SQLite's).
 *
 * Transactions run at READ COMMITTED: every lifecycle compare-and-swap is
 * one guarded UPDATE, which takes the sandbox's row; a concurrent one
 * waits for that row, then evaluates its guard against the committed row
 * and changes nothing (the loser). Where a read decides a write, the row
 * is locked first (lock_sql). Feed revs come from a one-row counter
 * (feed_seq) updated in the appending transaction: its row lock is held
 * until COMMIT, so revs are allocated in commit order and a reader that
 * sees rev N has every rev below it visible too (none commits later with
 * a lower number), and a rolled-back append frees its rev for the next.
 * Serialization failures and deadlocks (SQLSTATE 40001, 40P01), and a
 * connection lost before COMMIT, are retried by cpdb_txn; a connection
 * lost during COMMIT is an error (the outcome is not known).
 *
 * Replicas tell each other through NOTIFY on channel tether_cp, received
 * on a second connection that LISTENs (listen_fd for the cp's loop). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "cp/dbdrv.h"
#include "log.h"

#define PG_CHANNEL "tether_cp"
#define PG_INT8OID 20
#define PG_TEXTOID 25


static const struct cpdb_drv pg_drv;

#define PG_STMTS 128 /* statements prepared per connection (db.c has ~60) */

/* A statement prepared on the connection, by its (translated) text. */
struct pg_stmt {
	char *sql;       /* owned; NULL: a free slot */
	char name[12];
};

/* The connections of one store. */
struct pg {
	PGconn *c;       /* statements */
	struct pg_stmt stmts[PG_STMTS]; /* prepared on c (parsed and planned
	                                 * once: a statement costs one round
	                                 * trip, not a parse each time) */
	unsigned nstmts;
	PGconn *lc;      /* LISTEN; NULL until asked, or after it broke */
	int self_pid;    /* c's backend pid: our own NOTIFYs come from it */
	int retry;       /* the last failure is retryable */
	char url[1024];
};

static const char pg_schema[] =
	"CREATE TABLE IF NOT EXISTS api_keys("
	" hash TEXT PRIMARY KEY, name TEXT NOT NULL, created_at BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS workers("
	" id TEXT PRIMARY KEY, node_url TEXT NOT NULL,"
	" registered_at BIGINT NOT NULL, last_seen BIGINT NOT NULL,"
	" acked_rev BIGINT NOT NULL DEFAULT 0);"
	"CREATE TABLE IF NOT EXISTS sandboxes("
	" id TEXT PRIMARY KEY, state TEXT NOT NULL,"
	" generation BIGINT NOT NULL CHECK (generation >= 1),"
	" worker TEXT NOT NULL, substrate TEXT NOT NULL, pod TEXT NOT NULL,"
	" activation BIGINT NOT NULL CHECK (activation >= 1),"
	" created_at BIGINT NOT NULL, error TEXT);"
	"CREATE TABLE IF NOT EXISTS feed("
	" rev BIGINT PRIMARY KEY, kind TEXT NOT NULL,"
	" worker TEXT, body TEXT NOT NULL, created_at BIGINT NOT NULL);"
	"CREATE INDEX IF NOT EXISTS feed_worker ON feed(worker, rev);"
	/* the feed's one sequence (see above) */
	"CREATE TABLE IF NOT EXISTS feed_seq("
	" one INTEGER PRIMARY KEY CHECK (one = 1), rev BIGINT NOT NULL);"
	"INSERT INTO feed_seq VALUES(1, 0) ON CONFLICT DO NOTHING;"
	"CREATE TABLE IF NOT EXISTS snapshots("
	" sandbox TEXT NOT NULL, generation BIGINT NOT NULL,"
	" key TEXT NOT NULL, size BIGINT NOT NULL CHECK (size >= 0),"
	" checksum TEXT NOT NULL, created_at BIGINT NOT NULL,"
	" PRIMARY KEY (sandbox, generation));"
	"CREATE TABLE IF NOT EXISTS worker_creds("
	" id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE,"
	" node_url TEXT NOT NULL, created_at BIGINT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS requests("
	" caller TEXT NOT NULL, key TEXT NOT NULL, op TEXT NOT NULL,"
	" sandbox TEXT NOT NULL, generation BIGINT NOT NULL, rev BIGINT NOT NULL,"
	" worker TEXT NOT NULL, target TEXT NOT NULL, forced BIGINT NOT NULL,"
	" resumed_from BIGINT NOT NULL, created_at BIGINT NOT NULL,"
	" PRIMARY KEY (caller, key));"
	/* facts every replica must agree on (the feed key) */
	"CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS leases("
	" sandbox TEXT PRIMARY KEY, generation BIGINT NOT NULL,"
	" activation BIGINT NOT NULL, until_ms BIGINT NOT NULL);";

/* pg_of: the store's connections. */
static struct pg *pg_of(struct cpdb *db)
{
	return db->h;
}

/* pg_sql: sql with SQLite's "?N" (and bare "?", numbered in order) as
 * "$N"; quoted strings are copied as they are. -1 if it does not fit. */
static int pg_sql(const char *sql, char *out, size_t cap)
{
	size_t o = 0;
	int next = 1, quoted = 0;

	for (const char *p = sql; *p != '\0'; p++) {
		if (o + 8 >= cap)
			return -1;
		if (*p == '\'')
			quoted = !quoted;
		if (quoted || *p != '?') {
			out[o++] = *p;
			continue;
		}
		out[o++] = '$';
		if (p[1] >= '0' && p[1] <= '9')
			continue; /* "?N": the digits follow as they are */
		o += (size_t)snprintf(out + o, cap - o, "%d", next++);
	}
	out[o] = '\0';
	return 0;
}

/* pg_fail: err from a failed result (or the connection), retryability
 * noted; returns -1. commit: the failure was of a COMMIT. */
static int pg_fail(struct cpdb *db, PGresult *res, int commit, struct tt_err *err)
{
	struct pg *pg = pg_of(db);
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = res ? PQresultErrorMessage(res) : "";

	if (msg == NULL || msg[0] == '\0')
		msg = PQerrorMessage(pg->c);
	pg->retry = (state != NULL && (strcmp(state, "40001") == 0 ||
	                               strcmp(state, "40P01") == 0)) ||
	            (!commit && PQstatus(pg->c) == CONNECTION_BAD);
	tt_err_set(err, TT_ERR_IO, "postgresql: %.*s", (int)strcspn(msg, "\n"), msg);
	return -1;
}

/* pg_forget: the statements prepared on a connection that is gone. */
static void pg_forget(struct pg *pg)
{
	for (unsigned i = 0; i < PG_STMTS; i++) {
		free(pg->stmts[i].sql);
		pg->stmts[i].sql = NULL;
	}
	pg->nstmts = 0;
}

/* pg_prepared: the name of text prepared on c (prepared now if it was
 * not), or NULL with the failed result in *res. */
static const char *pg_prepared(struct pg *pg, const char *text, int n,
                               const Oid *types, PGresult **res)
{
	uint32_t h = 2166136261u;
	unsigned i;

	*res = NULL;
	for (const char *p = text; *p != '\0'; p++)
		h = (h ^ (unsigned char)*p) * 16777619u;
	for (unsigned k = 0; k < PG_STMTS; k++) {
		i = (h + k) % PG_STMTS;
		if (pg->stmts[i].sql == NULL)
			break;
		if (strcmp(pg->stmts[i].sql, text) == 0)
			return pg->stmts[i].name;
	}
	if (pg->nstmts >= PG_STMTS * 3 / 4)
		return ""; /* full (never with db.c's statements): unnamed */
	i = h % PG_STMTS;
	while (pg->stmts[i].sql != NULL)
		i = (i + 1) % PG_STMTS;
	snprintf(pg->stmts[i].name, sizeof(pg->stmts[i].name), "s%u", pg->nstmts);
	*res = PQprepare(pg->c, pg->stmts[i].name, text, n, types);
	if (PQresultStatus(*res) != PGRES_COMMAND_OK)
		return NULL;
	PQclear(*res);
	*res = NULL;
	pg->stmts[i].sql = strdup(text);
	if (pg->stmts[i].sql == NULL)
		return ""; /* prepared, but not remembered: unnamed next time */
	pg->nstmts++;
	return pg->stmts[i].name;
}

/* pg_reset: a broken connection is made again (before a statement that
 * is not inside a transaction: the transaction died with it). */
static void pg_reset(struct cpdb *db)
{
	struct pg *pg = pg_of(db);

	if (PQstatus(pg->c) != CONNECTION_BAD)
		return;
	log_warn("postgresql: connection lost; reconnecting");
	pg_forget(pg);
	PQreset(pg->c);
	if (PQstatus(pg->c) == CONNECTION_OK)
		pg->self_pid = PQbackendPID(pg->c);
}

/* pg_exec: SQL without parameters or rows. */
static int pg_exec(struct cpdb *db, const char *sql, struct tt_err *err)
{
	struct pg *pg = pg_of(db);
	PGresult *res;
	int rc = 0;

	if (!db->in_txn)
		pg_reset(db);
	res = PQexec(pg->c, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK &&
	    PQresultStatus(res) != PGRES_TUPLES_OK)
		rc = pg_fail(db, res, strcmp(sql, "COMMIT") == 0, err);
	PQclear(res);
	return rc;
}

/* pg_run: one statement, its rows to fn. */
static int pg_run(struct cpdb *db, const char *sql, const struct cpdb_arg *a,
                  int n, cpdb_row_fn fn, void *arg, int64_t *changes,
                  struct tt_err *err)
{
	struct pg *pg = pg_of(db);
	char text[CPDB_SQL_MAX], nums[CPDB_ARGS_MAX][24];
	const char *vals[CPDB_ARGS_MAX];
	Oid types[CPDB_ARGS_MAX];
	struct cpdb_row row = { &pg_drv, NULL, 0 };
	PGresult *res;
	ExecStatusType st;
	const char *name;
	int rc = 0;

	if (n > CPDB_ARGS_MAX || pg_sql(sql, text, sizeof(text)) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "postgresql: statement too long");
	for (int i = 0; i < n; i++) {
		if (a[i].t == 't') {
			types[i] = PG_TEXTOID;
			vals[i] = a[i].s;
		} else {
			types[i] = PG_INT8OID;
			snprintf(nums[i], sizeof(nums[i]), "%lld", (long long)a[i].i);
			vals[i] = nums[i];
		}
	}
	name = pg_prepared(pg, text, n, types, &res);
	if (name == NULL) {
		rc = pg_fail(db, res, 0, err);
		PQclear(res);
		return rc;
	}
	if (name[0] == '\0')
		res = PQexecParams(pg->c, text, n, types, vals, NULL, NULL, 0);
	else
		res = PQexecPrepared(pg->c, name, n, vals, NULL, NULL, 0);
	st = PQresultStatus(res);
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		rc = pg_fail(db, res, 0, err);
		PQclear(res);
		return rc;
	}
	row.h = res;
	for (int i = 0; fn != NULL && i < PQntuples(res); i++) {
		row.n = i;
		rc = fn(&row, arg);
		if (rc != 0)
			break;
	}
	if (changes != NULL)
		*changes = strtoll(PQcmdTuples(res), NULL, 10);
	PQclear(res);
	return rc < 0 ? -1 : 0;
}

/* pg_query: pg_run; outside a transaction, once more on a fresh
 * connection when the one it had was broken (a restarted server). */
static int pg_query(struct cpdb *db, const char *sql, const struct cpdb_arg *a,
                    int n, cpdb_row_fn fn, void *arg, int64_t *changes,
                    struct tt_err *err)
{
	int rc;

	if (!db->in_txn)
		pg_reset(db);
	rc = pg_run(db, sql, a, n, fn, arg, changes, err);
	if (rc < 0 && !db->in_txn && PQstatus(pg_of(db)->c) == CONNECTION_BAD) {
		pg_reset(db);
		rc = pg_run(db, sql, a, n, fn, arg, changes, err);
	}
	return rc;
}

/* pg_col_int: column i as an integer (NULL reads 0). */
static int64_t pg_col_int(const struct cpdb_row *r, int i)
{
	if (PQgetisnull(r->h, r->n, i))
		return 0;
	return strtoll(PQgetvalue(r->h, r->n, i), NULL, 10);
}

/* pg_col_text: column i, NULL for NULL. */
static const char *pg_col_text(const struct cpdb_row *r, int i)
{
	if (PQgetisnull(r->h, r->n, i))
		return NULL;
	return PQgetvalue(r->h, r->n, i);
}

/* pg_begin: READ COMMITTED (see the top of this file). */
static int pg_begin(struct cpdb *db, struct tt_err *err)
{
	pg_of(db)->retry = 0;
	return pg_exec(db, "BEGIN", err);
}

/* pg_commit: COMMIT; a lost connection here is not retryable. */
static int pg_commit(struct cpdb *db, struct tt_err *err)
{
	return pg_exec(db, "COMMIT", err);
}

/* pg_rollback: ROLLBACK, unless the connection is gone (so is the
 * transaction). */
static void pg_rollback(struct cpdb *db)
{
	struct pg *pg = pg_of(db);

	if (PQstatus(pg->c) == CONNECTION_OK)
		PQclear(PQexec(pg->c, "ROLLBACK"));
}

/* pg_retryable: see dbdrv.h. */
static int pg_retryable(struct cpdb *db)
{
	return pg_of(db)->retry;
}

/* What pg_has_column counts. */
struct pg_count {
	int64_t n;
};

/* pg_count_row: column 0. */
static int pg_count_row(const struct cpdb_row *r, void *arg)
{
	((struct pg_count *)arg)->n = pg_col_int(r, 0);
	return 1;
}

/* pg_has_column: information_schema, in the connection's schema. */
static int pg_has_column(struct cpdb *db, const char *table, const char *col,
                         struct tt_err *err)
{
	struct pg_count c = { 0 };
	struct cpdb_arg a[2] = { { 't', table, 0 }, { 't', col, 0 } };

	if (pg_query(db, "SELECT count(*) FROM information_schema.columns WHERE"
	             " table_schema=current_schema() AND table_name=?1 AND"
	             " column_name=?2", a, 2, pg_count_row, &c, NULL, err) < 0)
		return -1;
	return c.n > 0;
}

/* pg_add_column: the decl as db.c writes it; an INTEGER there is made
 * BIGINT (SQLite's INTEGER holds 64 bits, PostgreSQL's 32). */
static int pg_add_column(struct cpdb *db, const char *table, const char *decl,
                         struct tt_err *err)
{
	char sql[320], type[200];
	const char *p = strstr(decl, " INTEGER");

	if (p != NULL)
		snprintf(type, sizeof(type), "%.*s BIGINT%s", (int)(p - decl), decl,
		         p + strlen(" INTEGER"));
	else
		snprintf(type, sizeof(type), "%s", decl);
	snprintf(sql, sizeof(sql), "ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s",
	         table, type);
	return pg_exec(db, sql, err);
}

/* pg_notify: NOTIFY tether_cp, msg (delivered at once: no transaction). */
static int pg_notify(struct cpdb *db, const char *msg, struct tt_err *err)
{
	struct cpdb_arg a = { 't', msg, 0 };

	return pg_query(db, "SELECT pg_notify('" PG_CHANNEL "', ?1)", &a, 1, NULL,
	                NULL, NULL, err);
}

/* pg_connect: a connection to url with the cp's settings: bounded
 * connect, statements, and time idle in a transaction (a cp killed in
 * one releases its locks within 30 s even when its host vanished). */
static PGconn *pg_connect(const char *url, struct tt_err *err)
{
	static const char *const keys[] = {
		"dbname", "connect_timeout", "application_name", "options", NULL
	};
	const char *const vals[] = {
		url, "5", "tether-cp",
		"-c statement_timeout=15000 -c idle_in_transaction_session_timeout=30000",
		NULL
	};
	PGconn *c = PQconnectdbParams(keys, vals, 1);

	if (c == NULL || PQstatus(c) != CONNECTION_OK) {
		const char *m = c ? PQerrorMessage(c) : "out of memory";

		tt_err_set(err, TT_ERR_IO, "postgresql: %.*s", (int)strcspn(m, "\n"), m);
		PQfinish(c);
		return NULL;
	}
	PQclear(PQexec(c, "SET client_min_messages=warning"));
	return c;
}

/* pg_listen_fd: the LISTEN connection's socket, made on first use and
 * again after it broke (-1 while the server cannot be reached). */
static int pg_listen_fd(struct cpdb *db)
{
	struct pg *pg = pg_of(db);
	struct tt_err err = { 0 };
	PGresult *res;

	if (pg->lc == NULL) {
		pg->lc = pg_connect(pg->url, &err);
		if (pg->lc == NULL)
			return -1;
		res = PQexec(pg->lc, "LISTEN " PG_CHANNEL);
		if (PQresultStatus(res) != PGRES_COMMAND_OK) {
			PQclear(res);
			PQfinish(pg->lc);
			pg->lc = NULL;
			return -1;
		}
		PQclear(res);
		PQsetnonblocking(pg->lc, 1);
	}
	return PQsocket(pg->lc);
}

/* pg_listen_read: the notifications that arrived, less our own. A broken
 * connection is dropped (the next pg_listen_fd makes another). */
static int pg_listen_read(struct cpdb *db, void (*fn)(const char *msg, void *arg),
                          void *arg, struct tt_err *err)
{
	struct pg *pg = pg_of(db);
	PGnotify *nt;

	if (pg->lc == NULL)
		return 0;
	if (PQconsumeInput(pg->lc) == 0) {
		tt_err_set(err, TT_ERR_IO, "postgresql listen: %.*s",
		           (int)strcspn(PQerrorMessage(pg->lc), "\n"),
		           PQerrorMessage(pg->lc));
		PQfinish(pg->lc);
		pg->lc = NULL;
		return -1;
	}
	while ((nt = PQnotifies(pg->lc)) != NULL) {
		if (nt->be_pid != pg->self_pid)
			fn(nt->extra, arg);
		PQfreemem(nt);
	}
	return 0;
}

/* pg_close: both connections. */
static void pg_close(struct cpdb *db)
{
	struct pg *pg = pg_of(db);

	if (pg == NULL)
		return;
	PQfinish(pg->c);
	PQfinish(pg->lc);
	pg_forget(pg);
	free(pg);
	db->h = NULL;
}

static const struct cpdb_drv pg_drv = {
	.name = "postgresql",
	.close = pg_close,
	.exec = pg_exec,
	.query = pg_query,
	.col_int = pg_col_int,
	.col_text = pg_col_text,
	.begin = pg_begin,
	.commit = pg_commit,
	.rollback = pg_rollback,
	.retryable = pg_retryable,
	.has_column = pg_has_column,
	.add_column = pg_add_column,
	.feed_sql = "WITH s AS (UPDATE feed_seq SET rev=rev+1 WHERE one=1"
	            " RETURNING rev) INSERT INTO feed(rev,kind,worker,body,"
	            "created_at) SELECT rev,?1,?2,?3,?4 FROM s RETURNING rev",
	.lock_sql = "SELECT id FROM sandboxes WHERE id=?1 FOR UPDATE",
	.notify = pg_notify,
	.listen_fd = pg_listen_fd,
	.listen_read = pg_listen_read,
};

/* cpdb_pg_open: connects, then makes the schema under an advisory lock
 * (replicas starting together would race on CREATE TABLE). */
int cpdb_pg_open(struct cpdb *db, const char *url, struct tt_err *err)
{
	struct pg *pg = calloc(1, sizeof(*pg));
	int rc;

	if (pg == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	if (strlen(url) >= sizeof(pg->url)) {
		free(pg);
		return tt_err_set(err, TT_ERR_INVALID, "--db: URL too long");
	}
	snprintf(pg->url, sizeof(pg->url), "%s", url);
	db->drv = &pg_drv;
	db->h = pg;
	pg->c = pg_connect(url, err);
	if (pg->c == NULL)
		return -1;
	pg->self_pid = PQbackendPID(pg->c);
	if (pg_exec(db, "SELECT pg_advisory_lock(1952805992)", err) < 0)
		return -1;
	rc = pg_exec(db, pg_schema, err) < 0 || cpdb_add_columns(db, err) < 0 ? -1 : 0;
	PQclear(PQexec(pg->c, "SELECT pg_advisory_unlock(1952805992)"));
	return rc;
}

/* sbx-manager runtime store on SQLite (see records.h). */
#include "manager/records.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "timefmt.h"

#define RECORDS_SCHEMA_VERSION 3 /* 2: executions.adopt_key; 3: .cpu_millis */

/* The store: the database handle plus the committed mirror. The mirror
 * array is owned by the struct and only changed after a COMMIT. */
struct records {
	sqlite3 *db;
	struct rec_exec *execs;
	size_t n, cap;
	struct tt_keyring keys;
	uint64_t applied_rev;
};

static const char *const schema_sql =
	"CREATE TABLE IF NOT EXISTS schema_version(version INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS executions("
	" sbx TEXT PRIMARY KEY, gen INTEGER NOT NULL, wrk TEXT NOT NULL,"
	" sst TEXT NOT NULL, pod TEXT NOT NULL, att INTEGER NOT NULL,"
	" retired INTEGER NOT NULL, epoch INTEGER NOT NULL, state TEXT NOT NULL,"
	" slot INTEGER NOT NULL, init_pid INTEGER NOT NULL,"
	" init_start INTEGER NOT NULL, bridge_pid INTEGER NOT NULL,"
	" bridge_start INTEGER NOT NULL, updated_at INTEGER NOT NULL,"
	" adopt_key BLOB, cpu_millis INTEGER NOT NULL DEFAULT 0);"
	"CREATE TABLE IF NOT EXISTS keys(kid TEXT PRIMARY KEY,"
	" public BLOB NOT NULL, not_before INTEGER NOT NULL,"
	" not_after INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS meta(id INTEGER PRIMARY KEY CHECK (id = 1),"
	" applied_rev INTEGER NOT NULL);"
	"INSERT OR IGNORE INTO meta(id, applied_rev) VALUES (1, 0);";

static const char *const state_names[] = {
	[REC_STARTING] = "starting", [REC_RUNNING] = "running",
	[REC_FAILED] = "failed", [REC_LOST] = "lost", [REC_STOPPED] = "stopped",
};

/* rec_state_name: the persisted spelling of a state. */
const char *rec_state_name(enum rec_state s)
{
	if ((size_t)s < sizeof(state_names) / sizeof(state_names[0]))
		return state_names[s];
	return "unknown";
}

/* state_from_name: inverse of rec_state_name; unknown -> lost (fail closed:
 * admission treats lost as retired). */
static enum rec_state state_from_name(const char *s)
{
	for (size_t i = 0; i < sizeof(state_names) / sizeof(state_names[0]); i++)
		if (s != NULL && strcmp(s, state_names[i]) == 0)
			return (enum rec_state)i;
	return REC_LOST;
}

/* db_err: fills err from the connection's last error. */
static int db_err(struct records *db, struct tt_err *err, const char *what)
{
	return tt_err_set(err, TT_ERR_IO, "runtime.db: %s: %s", what,
	                  sqlite3_errmsg(db->db));
}

/* db_exec: runs SQL without results. */
static int db_exec(struct records *db, const char *sql, struct tt_err *err)
{
	char *msg = NULL;

	if (sqlite3_exec(db->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
		tt_err_set(err, TT_ERR_IO, "runtime.db: %s", msg ? msg : "error");
		sqlite3_free(msg);
		return -1;
	}
	return 0;
}

/* db_begin: an immediate write transaction. */
static int db_begin(struct records *db, struct tt_err *err)
{
	return db_exec(db, "BEGIN IMMEDIATE", err);
}

/* db_finish: commits when ok, else rolls back; returns 0 only on commit. */
static int db_finish(struct records *db, int ok, struct tt_err *err)
{
	if (ok && db_exec(db, "COMMIT", err) == 0)
		return 0;
	sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
	return -1;
}

/* db_set_rev: the meta update inside an open transaction. */
static int db_set_rev(struct records *db, uint64_t rev, struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if (sqlite3_prepare_v2(db->db, "UPDATE meta SET applied_rev = ? WHERE id = 1",
	                       -1, &st, NULL) != SQLITE_OK)
		return db_err(db, err, "prepare");
	sqlite3_bind_int64(st, 1, (sqlite3_int64)rev);
	rc = sqlite3_step(st);
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return db_err(db, err, "update applied_rev");
	return 0;
}

/* mirror_find: index of sbx in the mirror, or -1. */
static ssize_t mirror_find(const struct records *db, const char *sbx)
{
	for (size_t i = 0; i < db->n; i++)
		if (strcmp(db->execs[i].id.sbx, sbx) == 0)
			return (ssize_t)i;
	return -1;
}

/* mirror_set: inserts or replaces a record in the mirror. Capacity is
 * reserved before the transaction (mirror_reserve) so this cannot fail. */
static void mirror_set(struct records *db, const struct rec_exec *e)
{
	ssize_t i = mirror_find(db, e->id.sbx);

	if (i >= 0)
		db->execs[i] = *e;
	else
		db->execs[db->n++] = *e;
}

/* mirror_reserve: room for one more record. */
static int mirror_reserve(struct records *db, struct tt_err *err)
{
	struct rec_exec *p;
	size_t cap;

	if (db->n < db->cap)
		return 0;
	if (db->n >= RECORDS_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "runtime.db: more than %d executions",
		                  RECORDS_MAX);
	cap = db->cap ? db->cap * 2 : 16;
	p = realloc(db->execs, cap * sizeof(*p));
	if (p == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "runtime.db: out of memory");
	db->execs = p;
	db->cap = cap;
	return 0;
}

/* copy_text: bounded copy of a column; too long -> -1. */
static int copy_text(char *dst, size_t cap, const unsigned char *src)
{
	size_t len = src ? strlen((const char *)src) : 0;

	if (len >= cap)
		return -1;
	memcpy(dst, src ? (const char *)src : "", len + 1);
	return 0;
}

/* load_execs: reads every execution row into the mirror. */
static int load_execs(struct records *db, struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if (sqlite3_prepare_v2(db->db,
	        "SELECT sbx, gen, wrk, sst, pod, att, retired, epoch, state, slot,"
	        " init_pid, init_start, bridge_pid, bridge_start, updated_at, adopt_key,"
	        " cpu_millis FROM executions ORDER BY sbx", -1, &st, NULL) != SQLITE_OK)
		return db_err(db, err, "prepare");
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct rec_exec e = { 0 };

		if (mirror_reserve(db, err) < 0)
			goto fail;
		if (copy_text(e.id.sbx, sizeof(e.id.sbx), sqlite3_column_text(st, 0)) ||
		    copy_text(e.id.wrk, sizeof(e.id.wrk), sqlite3_column_text(st, 2)) ||
		    copy_text(e.id.sst, sizeof(e.id.sst), sqlite3_column_text(st, 3)) ||
		    copy_text(e.id.pod, sizeof(e.id.pod), sqlite3_column_text(st, 4))) {
			tt_err_set(err, TT_ERR_MALFORMED, "runtime.db: oversized field");
			goto fail;
		}
		e.id.gen = (uint64_t)sqlite3_column_int64(st, 1);
		e.id.att = (uint32_t)sqlite3_column_int64(st, 5);
		e.retired = sqlite3_column_int(st, 6) != 0;
		e.epoch = (uint64_t)sqlite3_column_int64(st, 7);
		e.state = state_from_name((const char *)sqlite3_column_text(st, 8));
		e.slot = (uint32_t)sqlite3_column_int64(st, 9);
		e.init_pid = (pid_t)sqlite3_column_int64(st, 10);
		e.init_start = (unsigned long long)sqlite3_column_int64(st, 11);
		e.bridge_pid = (pid_t)sqlite3_column_int64(st, 12);
		e.bridge_start = (unsigned long long)sqlite3_column_int64(st, 13);
		e.updated_at = sqlite3_column_int64(st, 14);
		if (sqlite3_column_type(st, 15) == SQLITE_BLOB &&
		    sqlite3_column_bytes(st, 15) == (int)sizeof(e.adopt_key)) {
			memcpy(e.adopt_key, sqlite3_column_blob(st, 15), sizeof(e.adopt_key));
			e.has_adopt_key = true;
		}
		e.cpu_millis = (uint32_t)sqlite3_column_int64(st, 16);
		db->execs[db->n++] = e;
	}
	if (rc != SQLITE_DONE) {
		db_err(db, err, "read executions");
		goto fail;
	}
	sqlite3_finalize(st);
	return 0;
fail:
	sqlite3_finalize(st);
	return -1;
}

/* load_keys: reads the key ring. Kids were checked when the ring was
 * received (keyring_from_json); the store is trusted local state. */
static int load_keys(struct records *db, struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if (sqlite3_prepare_v2(db->db,
	        "SELECT kid, public, not_before, not_after FROM keys ORDER BY kid",
	        -1, &st, NULL) != SQLITE_OK)
		return db_err(db, err, "prepare");
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct tt_key *k;

		if (db->keys.n >= TT_KEYRING_MAX ||
		    sqlite3_column_bytes(st, 1) != PASETO_PK_BYTES) {
			tt_err_set(err, TT_ERR_MALFORMED, "runtime.db: bad key row");
			goto fail;
		}
		k = &db->keys.keys[db->keys.n];
		if (copy_text(k->kid, sizeof(k->kid), sqlite3_column_text(st, 0))) {
			tt_err_set(err, TT_ERR_MALFORMED, "runtime.db: bad kid");
			goto fail;
		}
		memcpy(k->pk, sqlite3_column_blob(st, 1), PASETO_PK_BYTES);
		k->not_before = sqlite3_column_int64(st, 2);
		k->not_after = sqlite3_column_int64(st, 3);
		db->keys.n++;
	}
	if (rc != SQLITE_DONE) {
		db_err(db, err, "read keys");
		goto fail;
	}
	sqlite3_finalize(st);
	return 0;
fail:
	sqlite3_finalize(st);
	memset(&db->keys, 0, sizeof(db->keys));
	return -1;
}

/* load_meta: schema version check and applied revision. */
static int load_meta(struct records *db, struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	int version = 0, rc;

	if (sqlite3_prepare_v2(db->db, "SELECT version FROM schema_version", -1, &st,
	                       NULL) != SQLITE_OK)
		return db_err(db, err, "prepare");
	if (sqlite3_step(st) == SQLITE_ROW)
		version = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	if (version == 0) {
		if (db_exec(db, "INSERT INTO schema_version(version) VALUES (3)", err) < 0)
			return -1;
		version = RECORDS_SCHEMA_VERSION;
	}
	if (version == 1) {
		/* v1 -> v2 (same transaction): executions recorded before have
		 * no adoption key, so a restarted manager cannot adopt them. */
		if (db_exec(db, "ALTER TABLE executions ADD COLUMN adopt_key BLOB;"
		            "UPDATE schema_version SET version = 2", err) < 0)
			return -1;
		version = 2;
	}
	if (version == 2) {
		/* v2 -> v3: executions installed before asked no CPU cap of
		 * their own (the manager's default applied). */
		if (db_exec(db, "ALTER TABLE executions ADD COLUMN cpu_millis INTEGER"
		            " NOT NULL DEFAULT 0; UPDATE schema_version SET version = 3",
		            err) < 0)
			return -1;
		version = 3;
	}
	if (version != RECORDS_SCHEMA_VERSION)
		return tt_err_set(err, TT_ERR_INVALID,
		                  "runtime.db: schema version %d, expected %d", version,
		                  RECORDS_SCHEMA_VERSION);
	if (sqlite3_prepare_v2(db->db, "SELECT applied_rev FROM meta WHERE id = 1", -1,
	                       &st, NULL) != SQLITE_OK)
		return db_err(db, err, "prepare");
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		db->applied_rev = (uint64_t)sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	if (rc != SQLITE_ROW)
		return tt_err_set(err, TT_ERR_IO, "runtime.db: meta row missing");
	return 0;
}

/* records_open: opens the file with WAL + synchronous=FULL, creates the
 * schema, loads the mirror. */
/* records_private: path exists as a regular file of mode 0600 (made so
 * if missing, narrowed if wider). */
static int records_private(const char *path, struct tt_err *err)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	struct stat st;
	int rc = 0;

	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "runtime.db: open %s", path);
	if (fstat(fd, &st) < 0 || ((st.st_mode & 077) != 0 && fchmod(fd, st.st_mode & 0700) < 0))
		rc = tt_err_sys(err, TT_ERR_IO, "runtime.db: making %s private", path);
	else if (!S_ISREG(st.st_mode))
		rc = tt_err_set(err, TT_ERR_IO, "runtime.db: %s is not a regular file", path);
	close(fd);
	return rc;
}

int records_open(const char *path, struct records **out, struct tt_err *err)
{
	struct records *db = calloc(1, sizeof(*db));

	*out = NULL;
	if (db == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "runtime.db: out of memory");
	/* SQLite's own pathname bound (its journal's name adds 8 bytes). */
	if (strlen(path) > (size_t)sqlite3_vfs_find(NULL)->mxPathname - 8) {
		free(db);
		return tt_err_set(err, TT_ERR_INVALID, "runtime.db: its path is %zu bytes long;"
		                  " SQLite takes at most %d", strlen(path),
		                  sqlite3_vfs_find(NULL)->mxPathname - 8);
	}
	/* It holds adoption keys: 0600 whatever the umask or the state dir's
	 * mode (SQLite gives its -wal and -shm files the database's mode). */
	if (records_private(path, err) < 0) {
		free(db);
		return -1;
	}
	if (sqlite3_open_v2(path, &db->db,
	                    SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
	                        SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
		tt_err_set(err, TT_ERR_IO, "runtime.db: open %s: %s", path,
		           db->db ? sqlite3_errmsg(db->db) : "out of memory");
		records_close(db);
		return -1;
	}
	sqlite3_busy_timeout(db->db, 5000);
	/* WAL + FULL: a committed transaction survives power loss, and the
	 * manager acknowledges updates only after the commit returned. */
	if (db_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", err) < 0 ||
	    db_exec(db, "BEGIN IMMEDIATE", err) < 0) {
		records_close(db);
		return -1;
	}
	if (db_finish(db, db_exec(db, schema_sql, err) == 0 && load_meta(db, err) == 0,
	              err) < 0 ||
	    load_execs(db, err) < 0 || load_keys(db, err) < 0) {
		records_close(db);
		return -1;
	}
	*out = db;
	return 0;
}

/* records_close: closes the handle and frees the mirror. */
void records_close(struct records *db)
{
	if (db == NULL)
		return;
	sqlite3_close(db->db);
	free(db->execs);
	memset(&db->keys, 0, sizeof(db->keys));
	free(db);
}

/* db_write_exec: the INSERT OR REPLACE inside an open transaction. */
static int db_write_exec(struct records *db, const struct rec_exec *e,
                         struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	int rc;

	if (sqlite3_prepare_v2(db->db,
	        "INSERT OR REPLACE INTO executions(sbx, gen, wrk, sst, pod, att,"
	        " retired, epoch, state, slot, init_pid, init_start, bridge_pid,"
	        " bridge_start, updated_at, adopt_key, cpu_millis)"
	        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", -1, &st, NULL) != SQLITE_OK)
		return db_err(db, err, "prepare");
	sqlite3_bind_text(st, 1, e->id.sbx, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, (sqlite3_int64)e->id.gen);
	sqlite3_bind_text(st, 3, e->id.wrk, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 4, e->id.sst, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 5, e->id.pod, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 6, e->id.att);
	sqlite3_bind_int(st, 7, e->retired ? 1 : 0);
	sqlite3_bind_int64(st, 8, (sqlite3_int64)e->epoch);
	sqlite3_bind_text(st, 9, rec_state_name(e->state), -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 10, e->slot);
	sqlite3_bind_int64(st, 11, e->init_pid);
	sqlite3_bind_int64(st, 12, (sqlite3_int64)e->init_start);
	sqlite3_bind_int64(st, 13, e->bridge_pid);
	sqlite3_bind_int64(st, 14, (sqlite3_int64)e->bridge_start);
	sqlite3_bind_int64(st, 15, e->updated_at);
	if (e->has_adopt_key)
		sqlite3_bind_blob(st, 16, e->adopt_key, (int)sizeof(e->adopt_key), SQLITE_STATIC);
	else
		sqlite3_bind_null(st, 16);
	sqlite3_bind_int64(st, 17, e->cpu_millis);
	rc = sqlite3_step(st);
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE)
		return db_err(db, err, "write execution");
	return 0;
}

/* records_put: persists one record (and the revision), then mirrors it. */
int records_put(struct records *db, const struct rec_exec *e, uint64_t rev,
                struct tt_err *err)
{
	struct rec_exec copy = *e;
	int ok;

	if (!sbx_id_valid(e->id.sbx))
		return tt_err_set(err, TT_ERR_INVALID, "runtime.db: bad sandbox id");
	if (mirror_find(db, e->id.sbx) < 0 && mirror_reserve(db, err) < 0)
		return -1;
	copy.updated_at = tt_now();
	if (db_begin(db, err) < 0)
		return -1;
	ok = db_write_exec(db, &copy, err) == 0 &&
	     (rev == 0 || db_set_rev(db, rev, err) == 0);
	if (db_finish(db, ok, err) < 0)
		return -1;
	mirror_set(db, &copy);
	if (rev > 0)
		db->applied_rev = rev;
	return 0;
}

/* records_get: mirror lookup. */
const struct rec_exec *records_get(const struct records *db, const char *sbx)
{
	ssize_t i = mirror_find(db, sbx);

	return i >= 0 ? &db->execs[i] : NULL;
}

/* records_retire: persists retired = 1 for (sbx, gen). */
int records_retire(struct records *db, const char *sbx, uint64_t gen,
                   uint64_t rev, struct tt_err *err)
{
	const struct rec_exec *cur = records_get(db, sbx);
	struct rec_exec e;

	if (cur == NULL || cur->id.gen != gen) {
		if (rev > 0 && records_set_applied_rev(db, rev, err) < 0)
			return -1;
		return 0;
	}
	e = *cur;
	e.retired = true;
	if (records_put(db, &e, rev, err) < 0) {
		/* Fail closed: the retirement could not be persisted (e.g. a full
		 * disk), but admission must refuse this execution from now on
		 * (SPEC §7), so the mirror says retired anyway; the caller still
		 * sees the error and stops the execution. */
		db->execs[mirror_find(db, sbx)].retired = true;
		return -1;
	}
	return 1;
}

/* records_delete: removes a row and its mirror entry. */
int records_delete(struct records *db, const char *sbx, uint64_t rev,
                   struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	ssize_t i;
	int ok;

	if (db_begin(db, err) < 0)
		return -1;
	ok = sqlite3_prepare_v2(db->db, "DELETE FROM executions WHERE sbx = ?", -1,
	                        &st, NULL) == SQLITE_OK;
	if (ok) {
		sqlite3_bind_text(st, 1, sbx, -1, SQLITE_STATIC);
		ok = sqlite3_step(st) == SQLITE_DONE;
	}
	sqlite3_finalize(st);
	if (!ok)
		db_err(db, err, "delete execution");
	ok = ok && (rev == 0 || db_set_rev(db, rev, err) == 0);
	if (db_finish(db, ok, err) < 0)
		return -1;
	i = mirror_find(db, sbx);
	if (i >= 0)
		db->execs[i] = db->execs[--db->n];
	if (rev > 0)
		db->applied_rev = rev;
	return 0;
}

/* records_count: number of mirrored records. */
size_t records_count(const struct records *db)
{
	return db->n;
}

/* records_at: the i-th mirrored record, or NULL. */
const struct rec_exec *records_at(const struct records *db, size_t i)
{
	return i < db->n ? &db->execs[i] : NULL;
}

/* records_free_slot_except: lowest slot unused and not except (linear:
 * RECORDS_MAX bounds it). */
uint32_t records_free_slot_except(const struct records *db, uint32_t except)
{
	for (uint32_t s = 0;; s++) {
		bool used = s == except;

		for (size_t i = 0; i < db->n && !used; i++)
			used = db->execs[i].slot == s;
		if (!used)
			return s;
	}
}

/* records_free_slot: lowest unused slot. */
uint32_t records_free_slot(const struct records *db)
{
	return records_free_slot_except(db, UINT32_MAX);
}

/* records_keys_replace: rewrites the keys table in one transaction. */
int records_keys_replace(struct records *db, const struct tt_keyring *kr,
                         uint64_t rev, struct tt_err *err)
{
	sqlite3_stmt *st = NULL;
	int ok;

	if (kr->n > TT_KEYRING_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "key ring too large");
	if (db_begin(db, err) < 0)
		return -1;
	ok = db_exec(db, "DELETE FROM keys", err) == 0 &&
	     sqlite3_prepare_v2(db->db,
	                        "INSERT INTO keys(kid, public, not_before, not_after)"
	                        " VALUES (?,?,?,?)", -1, &st, NULL) == SQLITE_OK;
	for (size_t i = 0; ok && i < kr->n; i++) {
		const struct tt_key *k = &kr->keys[i];

		sqlite3_reset(st);
		sqlite3_bind_text(st, 1, k->kid, -1, SQLITE_STATIC);
		sqlite3_bind_blob(st, 2, k->pk, PASETO_PK_BYTES, SQLITE_STATIC);
		sqlite3_bind_int64(st, 3, k->not_before);
		sqlite3_bind_int64(st, 4, k->not_after);
		ok = sqlite3_step(st) == SQLITE_DONE;
		if (!ok)
			db_err(db, err, "write key");
	}
	sqlite3_finalize(st);
	ok = ok && (rev == 0 || db_set_rev(db, rev, err) == 0);
	if (db_finish(db, ok, err) < 0)
		return -1;
	db->keys = *kr;
	if (rev > 0)
		db->applied_rev = rev;
	return 0;
}

/* records_keys: the committed key ring. */
const struct tt_keyring *records_keys(const struct records *db)
{
	return &db->keys;
}

/* records_set_applied_rev: moves the revision alone. */
int records_set_applied_rev(struct records *db, uint64_t rev, struct tt_err *err)
{
	if (db_begin(db, err) < 0)
		return -1;
	if (db_finish(db, db_set_rev(db, rev, err) == 0, err) < 0)
		return -1;
	db->applied_rev = rev;
	return 0;
}

/* records_applied_rev: the last committed feed revision. */
uint64_t records_applied_rev(const struct records *db)
{
	return db->applied_rev;
}

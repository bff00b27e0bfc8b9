/* src/manager/records: the sbx-manager's SQLite runtime store, on real files:
 * persistence across reopen, retire/delete, key ring, applied revision, and
 * crash safety (a writer killed mid-transaction leaves the last commit). */
#include <setjmp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "manager/records.h"

#define SBX_A "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SBX_B "sbx_bbbbbbbbbbbbbbbbbbbbbbbbbb"

static char dir[64];
static char path[128];

/* setup: a fresh temp dir per test. */
static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/tt-records.XXXXXX");
	if (mkdtemp(dir) == NULL)
		return -1;
	snprintf(path, sizeof(path), "%s/runtime.db", dir);
	return 0;
}

/* teardown: removes the temp dir. */
static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* mkexec: a record for sbx at generation gen on w1. */
static struct rec_exec mkexec(const char *sbx, uint64_t gen)
{
	struct rec_exec e = { 0 };

	snprintf(e.id.sbx, sizeof(e.id.sbx), "%s", sbx);
	e.id.gen = gen;
	snprintf(e.id.wrk, sizeof(e.id.wrk), "w1");
	snprintf(e.id.sst, sizeof(e.id.sst), "ns");
	e.id.att = 1;
	e.epoch = gen;
	e.state = REC_RUNNING;
	e.init_pid = 1234;
	e.init_start = 987654321ULL;
	e.bridge_pid = 1240;
	e.bridge_start = 987654400ULL;
	return e;
}

/* reopen: closes and opens the store again. */
static struct records *reopen(struct records *db)
{
	struct tt_err err = { 0 };
	struct records *out = NULL;

	records_close(db);
	assert_int_equal(records_open(path, &out, &err), 0);
	return out;
}

/* test_put_get_reopen: every field survives a reopen. */
static void test_put_get_reopen(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	struct rec_exec e = mkexec(SBX_A, 7);
	const struct rec_exec *g;

	(void)state;
	assert_int_equal(records_open(path, &db, &err), 0);
	assert_int_equal(records_applied_rev(db), 0);
	assert_null(records_get(db, SBX_A));
	snprintf(e.id.pod, sizeof(e.id.pod), "pod-1");
	e.slot = 3;
	assert_int_equal(records_put(db, &e, 11, &err), 0);
	assert_int_equal(records_applied_rev(db), 11);
	db = reopen(db);
	g = records_get(db, SBX_A);
	assert_non_null(g);
	assert_int_equal(g->id.gen, 7);
	assert_string_equal(g->id.wrk, "w1");
	assert_string_equal(g->id.sst, "ns");
	assert_string_equal(g->id.pod, "pod-1");
	assert_int_equal(g->id.att, 1);
	assert_int_equal(g->state, REC_RUNNING);
	assert_int_equal(g->slot, 3);
	assert_int_equal(g->init_pid, 1234);
	assert_true(g->init_start == 987654321ULL);
	assert_int_equal(g->bridge_pid, 1240);
	assert_false(g->retired);
	assert_true(g->updated_at > 0);
	assert_int_equal(records_applied_rev(db), 11);
	assert_int_equal(records_count(db), 1);
	/* Invalid ids are refused before touching the file. */
	snprintf(e.id.sbx, sizeof(e.id.sbx), "sbx_../../etc");
	assert_int_equal(records_put(db, &e, 0, &err), -1);
	assert_int_equal(records_count(db), 1);
	records_close(db);
}

/* test_retire_delete_slots: retire only matches the generation; delete
 * frees the slot. */
static void test_retire_delete_slots(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	struct rec_exec a = mkexec(SBX_A, 2), b = mkexec(SBX_B, 1);

	(void)state;
	assert_int_equal(records_open(path, &db, &err), 0);
	a.slot = records_free_slot(db);
	assert_int_equal(a.slot, 0);
	assert_int_equal(records_put(db, &a, 1, &err), 0);
	b.slot = records_free_slot(db);
	assert_int_equal(b.slot, 1);
	assert_int_equal(records_put(db, &b, 2, &err), 0);
	/* A retire for another generation changes nothing but the revision. */
	assert_int_equal(records_retire(db, SBX_A, 1, 3, &err), 0);
	assert_false(records_get(db, SBX_A)->retired);
	assert_int_equal(records_applied_rev(db), 3);
	assert_int_equal(records_retire(db, SBX_A, 2, 4, &err), 1);
	db = reopen(db);
	assert_true(records_get(db, SBX_A)->retired);
	assert_false(records_get(db, SBX_B)->retired);
	assert_int_equal(records_applied_rev(db), 4);
	assert_int_equal(records_delete(db, SBX_A, 5, &err), 0);
	assert_int_equal(records_free_slot(db), 0);
	assert_int_equal(records_free_slot_except(db, 0), 2); /* 1 is B's */
	db = reopen(db);
	assert_null(records_get(db, SBX_A));
	assert_non_null(records_get(db, SBX_B));
	assert_int_equal(records_count(db), 1);
	assert_int_equal(records_applied_rev(db), 5);
	records_close(db);
}

/* test_retire_fails_closed: a retirement that cannot be persisted (another
 * connection holds the database locked past the busy timeout) reports the
 * error, yet the mirror admission reads says retired: never fail open. */
static void test_retire_fails_closed(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	struct rec_exec a = mkexec(SBX_A, 2);
	sqlite3 *lock = NULL;

	(void)state;
	assert_int_equal(records_open(path, &db, &err), 0);
	assert_int_equal(records_put(db, &a, 1, &err), 0);
	assert_int_equal(sqlite3_open(path, &lock), SQLITE_OK);
	assert_int_equal(sqlite3_exec(lock, "BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);
	assert_int_equal(records_retire(db, SBX_A, 2, 2, &err), -1);
	assert_true(records_get(db, SBX_A)->retired);
	sqlite3_exec(lock, "ROLLBACK", NULL, NULL, NULL);
	sqlite3_close(lock);
	/* Honest path: once the lock is gone the retirement persists. */
	assert_int_equal(records_retire(db, SBX_A, 2, 3, &err), 1);
	db = reopen(db);
	assert_true(records_get(db, SBX_A)->retired);
	records_close(db);
}

/* test_keys: the key ring is replaced as a whole and survives reopen. */
static void test_keys(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	struct tt_keyring kr = { 0 };
	const struct tt_keyring *got;

	(void)state;
	kr.n = 2;
	snprintf(kr.keys[0].kid, sizeof(kr.keys[0].kid), "k4.pid.one");
	memset(kr.keys[0].pk, 0x11, PASETO_PK_BYTES);
	kr.keys[0].not_before = 100;
	snprintf(kr.keys[1].kid, sizeof(kr.keys[1].kid), "k4.pid.two");
	memset(kr.keys[1].pk, 0x22, PASETO_PK_BYTES);
	kr.keys[1].not_before = 200;
	kr.keys[1].not_after = 300;
	assert_int_equal(records_open(path, &db, &err), 0);
	assert_int_equal(records_keys(db)->n, 0);
	assert_int_equal(records_keys_replace(db, &kr, 9, &err), 0);
	db = reopen(db);
	got = records_keys(db);
	assert_int_equal(got->n, 2);
	assert_string_equal(got->keys[0].kid, "k4.pid.one");
	assert_memory_equal(got->keys[1].pk, kr.keys[1].pk, PASETO_PK_BYTES);
	assert_int_equal(got->keys[1].not_after, 300);
	assert_int_equal(records_applied_rev(db), 9);
	kr.n = 1;
	kr.keys[0] = kr.keys[1];
	assert_int_equal(records_keys_replace(db, &kr, 10, &err), 0);
	db = reopen(db);
	assert_int_equal(records_keys(db)->n, 1);
	assert_string_equal(records_keys(db)->keys[0].kid, "k4.pid.two");
	records_close(db);
}

/* test_crash_safety: a child commits one record then dies by SIGKILL in
 * the middle of a second, uncommitted write transaction: the commit is
 * there, the half-written one is not, and the file opens cleanly. */
static void test_crash_safety(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	int status;
	pid_t pid;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct records *cdb = NULL;
		struct rec_exec a = mkexec(SBX_A, 1);
		sqlite3 *raw = NULL;

		if (records_open(path, &cdb, NULL) < 0 || records_put(cdb, &a, 1, NULL) < 0)
			_exit(2);
		/* A second writer mid-transaction, killed before COMMIT. */
		if (sqlite3_open(path, &raw) != SQLITE_OK ||
		    sqlite3_exec(raw, "BEGIN IMMEDIATE;"
		                      "UPDATE meta SET applied_rev = 99;"
		                      "DELETE FROM executions;", NULL, NULL, NULL) != SQLITE_OK)
			_exit(3);
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_int_equal(records_open(path, &db, &err), 0);
	assert_non_null(records_get(db, SBX_A));
	assert_int_equal(records_applied_rev(db), 1);
	records_close(db);
}

/* test_bad_file: a file that is not a database is a clear error. */
static void test_bad_file(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	FILE *f = fopen(path, "w");

	(void)state;
	assert_non_null(f);
	fputs("this is not an sqlite database, just some text padding it out....\n", f);
	fclose(f);
	assert_int_equal(records_open(path, &db, &err), -1);
	assert_null(db);
	assert_true(strlen(err.msg) > 0);
}

/* test_private_file: the store holds adoption keys: created 0600 whatever
 * the umask, a wider existing one narrowed, its WAL file likewise. */
static void test_private_file(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	char wal[160];
	struct stat st;
	mode_t old = umask(022);

	(void)state;
	assert_int_equal(records_open(path, &db, &err), 0);
	assert_int_equal(records_set_applied_rev(db, 1, &err), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	snprintf(wal, sizeof(wal), "%s-wal", path);
	assert_int_equal(stat(wal, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	records_close(db);
	unlink(wal);
	assert_int_equal(chmod(path, 0644), 0);
	assert_int_equal(records_open(path, &db, &err), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	records_close(db);
	/* Not a regular file: refused. */
	unlink(path);
	assert_int_equal(mkfifo(path, 0600), 0);
	assert_int_equal(records_open(path, &db, &err), -1);
	assert_null(db);
	unlink(path);
	umask(old);
}

/* test_adopt_key_and_v1: the adoption key round-trips (and is absent when
 * not set); a schema-1 store (before adoption keys) opens, migrated in
 * place: its executions load without a key and keep every other field,
 * and a key can be stored from then on. */
static void test_adopt_key_and_v1(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	struct rec_exec a = mkexec(SBX_A, 3), b = mkexec(SBX_B, 4);
	const struct rec_exec *g;
	sqlite3 *raw;

	(void)state;
	/* A v1 store, as the previous schema wrote it. */
	assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
	assert_int_equal(sqlite3_exec(raw,
		"CREATE TABLE schema_version(version INTEGER NOT NULL);"
		"INSERT INTO schema_version(version) VALUES (1);"
		"CREATE TABLE executions(sbx TEXT PRIMARY KEY, gen INTEGER NOT NULL,"
		" wrk TEXT NOT NULL, sst TEXT NOT NULL, pod TEXT NOT NULL, att INTEGER NOT NULL,"
		" retired INTEGER NOT NULL, epoch INTEGER NOT NULL, state TEXT NOT NULL,"
		" slot INTEGER NOT NULL, init_pid INTEGER NOT NULL, init_start INTEGER NOT NULL,"
		" bridge_pid INTEGER NOT NULL, bridge_start INTEGER NOT NULL,"
		" updated_at INTEGER NOT NULL);"
		"INSERT INTO executions VALUES ('" SBX_A "', 3, 'w1', 'ns', '', 1, 0, 3,"
		" 'running', 2, 1234, 987654321, 1240, 987654400, 1);",
		NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(raw);
	assert_int_equal(records_open(path, &db, &err), 0);
	g = records_get(db, SBX_A);
	assert_non_null(g);
	assert_false(g->has_adopt_key);
	assert_int_equal(g->id.gen, 3);
	assert_int_equal(g->slot, 2);
	assert_int_equal(g->bridge_start, 987654400ULL);
	/* Keys from now on, persisted; none where none was set. */
	memset(a.adopt_key, 0xa5, sizeof(a.adopt_key));
	a.has_adopt_key = true;
	assert_int_equal(records_put(db, &a, 0, &err), 0);
	assert_int_equal(records_put(db, &b, 0, &err), 0);
	db = reopen(db);
	g = records_get(db, SBX_A);
	assert_non_null(g);
	assert_true(g->has_adopt_key);
	assert_memory_equal(g->adopt_key, a.adopt_key, sizeof(a.adopt_key));
	g = records_get(db, SBX_B);
	assert_non_null(g);
	assert_false(g->has_adopt_key);
	records_close(db);
	/* Migrated once, through 2 to 3: the file says schema 3. */
	assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
	{
		sqlite3_stmt *st = NULL;

		assert_int_equal(sqlite3_prepare_v2(raw, "SELECT version FROM schema_version",
		                                    -1, &st, NULL), SQLITE_OK);
		assert_int_equal(sqlite3_step(st), SQLITE_ROW);
		assert_int_equal(sqlite3_column_int(st, 0), 3);
		sqlite3_finalize(st);
	}
	sqlite3_close(raw);
}

/* test_cpu_and_v2: the CPU cap an install asked survives a reopen (a
 * manager restart), and a schema-2 store (before it) opens migrated to 3:
 * its executions asked none (0, the manager's default) and keep their
 * adoption key; a cap can be stored from then on. */
static void test_cpu_and_v2(void **state)
{
	struct tt_err err = { 0 };
	struct records *db = NULL;
	struct rec_exec b = mkexec(SBX_B, 4);
	const struct rec_exec *g;
	sqlite3 *raw;

	(void)state;
	assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
	assert_int_equal(sqlite3_exec(raw,
		"CREATE TABLE schema_version(version INTEGER NOT NULL);"
		"INSERT INTO schema_version(version) VALUES (2);"
		"CREATE TABLE executions(sbx TEXT PRIMARY KEY, gen INTEGER NOT NULL,"
		" wrk TEXT NOT NULL, sst TEXT NOT NULL, pod TEXT NOT NULL, att INTEGER NOT NULL,"
		" retired INTEGER NOT NULL, epoch INTEGER NOT NULL, state TEXT NOT NULL,"
		" slot INTEGER NOT NULL, init_pid INTEGER NOT NULL, init_start INTEGER NOT NULL,"
		" bridge_pid INTEGER NOT NULL, bridge_start INTEGER NOT NULL,"
		" updated_at INTEGER NOT NULL, adopt_key BLOB);"
		"INSERT INTO executions VALUES ('" SBX_A "', 3, 'w1', 'ns', '', 1, 0, 3,"
		" 'running', 2, 1234, 987654321, 1240, 987654400, 1, zeroblob(32));",
		NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(raw);
	assert_int_equal(records_open(path, &db, &err), 0);
	g = records_get(db, SBX_A);
	assert_non_null(g);
	assert_true(g->has_adopt_key);
	assert_int_equal(g->cpu_millis, 0);
	b.cpu_millis = 250;
	assert_int_equal(records_put(db, &b, 0, &err), 0);
	db = reopen(db);
	g = records_get(db, SBX_B);
	assert_non_null(g);
	assert_int_equal(g->cpu_millis, 250);
	assert_int_equal(records_get(db, SBX_A)->cpu_millis, 0);
	records_close(db);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_put_get_reopen, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retire_delete_slots, setup, teardown),
		cmocka_unit_test_setup_teardown(test_retire_fails_closed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
		cmocka_unit_test_setup_teardown(test_crash_safety, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_private_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_adopt_key_and_v1, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cpu_and_v2, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Control-plane SQLite store on real database files: generations and feed
 * revs are never reused across reopen, API keys are stored hashed, the feed
 * is filtered per worker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>
#include <sqlite3.h>

#include "cp/db.h"

struct dbfix {
	char dir[64];
	char path[128];
	struct cpdb *db;
};

/* setup: a fresh database file in a temp dir. */
static int setup(void **state)
{
	struct dbfix *f = calloc(1, sizeof(*f));
	struct tt_err err = { 0 };

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/tt-cpdb.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/cp.db", f->dir);
	f->db = cpdb_open(f->path, &err);
	assert_non_null(f->db);
	*state = f;
	return 0;
}

/* teardown: close and remove the files. */
static int teardown(void **state)
{
	struct dbfix *f = *state;
	char cmd[160];

	cpdb_close(f->db);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
	assert_int_equal(system(cmd), 0);
	free(f);
	return 0;
}

/* reopen: close and open the same file again (a cp restart). */
static void reopen(struct dbfix *f)
{
	struct tt_err err = { 0 };

	cpdb_close(f->db);
	f->db = cpdb_open(f->path, &err);
	assert_non_null(f->db);
}

/* raw_exec: SQL on the file behind the store's back. */
static void raw_exec(struct dbfix *f, const char *sql)
{
	sqlite3 *h;

	assert_int_equal(sqlite3_open(f->path, &h), SQLITE_OK);
	assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(h);
}

/* Generations only grow, across restarts and after deletion. */
static void test_generation_never_reused(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	struct cp_sandbox sb, got;
	const char *id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
	int64_t rev, rev2;
	uint64_t gen;

	assert_int_equal(cpdb_sandbox_create(f->db, id, "w1", 100, &sb, &rev,
	                                     &err), 0);
	assert_int_equal(sb.generation, 1);
	assert_int_equal(cpdb_generation_next(f->db, id, &gen, &err), 0);
	assert_int_equal(gen, 2);
	reopen(f);
	assert_int_equal(cpdb_generation_next(f->db, id, &gen, &err), 0);
	assert_int_equal(gen, 3);
	/* delete: the row stays with its high-water generation */
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_int_equal(cpdb_sandbox_destroy(f->db, &got, 101, &rev2, &err), 0);
	assert_true(rev2 > rev);
	assert_int_equal(cpdb_sandbox_set_state(f->db, id, "deleted", NULL,
	                                        &err), 0);
	reopen(f);
	assert_int_equal(cpdb_generation_next(f->db, id, &gen, &err), 0);
	assert_int_equal(gen, 4);
	/* the same id cannot be created again (it would restart at 1) */
	assert_int_equal(cpdb_sandbox_create(f->db, id, "w1", 102, &sb, &rev,
	                                     &err), -1);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_int_equal(got.generation, 4);
	/* an unknown sandbox has no generation to bump */
	assert_int_equal(cpdb_generation_next(f->db,
	        "sbx_bbbbbbbbbbbbbbbbbbbbbbbbbb", &gen, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
}

/* Feed revs are strictly increasing, even if the newest row is gone when
 * the store reopens (AUTOINCREMENT, not max(rowid)+1). */
static void test_feed_revs_monotonic(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	json_t *body = json_pack("{s:s}", "sandbox", "x");
	int64_t r1, r2, r3, r4, latest;

	assert_int_equal(cpdb_feed_append(f->db, "retire", "w1", body, 1, &r1,
	                                  &err), 0);
	assert_int_equal(cpdb_feed_append(f->db, "retire", "w1", body, 1, &r2,
	                                  &err), 0);
	assert_true(r2 > r1);
	reopen(f);
	assert_int_equal(cpdb_feed_append(f->db, "retire", NULL, body, 1, &r3,
	                                  &err), 0);
	assert_true(r3 > r2);
	cpdb_close(f->db);
	f->db = NULL;
	raw_exec(f, "DELETE FROM feed WHERE rev=(SELECT max(rev) FROM feed)");
	f->db = cpdb_open(f->path, &err);
	assert_non_null(f->db);
	assert_int_equal(cpdb_feed_append(f->db, "retire", "w1", body, 1, &r4,
	                                  &err), 0);
	assert_true(r4 > r3);
	assert_int_equal(cpdb_feed_latest(f->db, &latest, &err), 0);
	assert_int_equal(latest, r4);
	json_decref(body);
}

/* Keys are stored as SHA-256 hex only; lookups need the exact key. */
static void test_apikey_hashing(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	const char *key = "ttk_0123456789abcdef-secret";
	char name[64], hash[CPDB_HASH_HEX + 1];
	unsigned char h[crypto_hash_sha256_BYTES];
	char want[CPDB_HASH_HEX + 1];
	int64_t n;
	FILE *fp;
	char *buf;
	long sz;

	assert_int_equal(cpdb_apikey_count(f->db, &n, &err), 0);
	assert_int_equal(n, 0);
	assert_int_equal(cpdb_apikey_add(f->db, key, "alice", 5, &err), 0);
	assert_int_equal(cpdb_apikey_count(f->db, &n, &err), 0);
	assert_int_equal(n, 1);
	assert_int_equal(cpdb_apikey_lookup(f->db, key, name, sizeof(name),
	                                    &err), 1);
	assert_string_equal(name, "alice");
	assert_int_equal(cpdb_apikey_lookup(f->db, "ttk_0123456789abcdef-secreT",
	                                    name, sizeof(name), &err), 0);
	assert_int_equal(cpdb_apikey_lookup(f->db, "", name, sizeof(name),
	                                    &err), 0);
	/* the hash is SHA-256 hex of the key */
	crypto_hash_sha256(h, (const unsigned char *)key, strlen(key));
	sodium_bin2hex(want, sizeof(want), h, sizeof(h));
	cpdb_key_hash(key, hash);
	assert_string_equal(hash, want);
	/* and the plaintext is nowhere in the database files */
	cpdb_close(f->db);
	f->db = NULL;
	raw_exec(f, "PRAGMA wal_checkpoint(TRUNCATE)");
	fp = fopen(f->path, "rb");
	assert_non_null(fp);
	fseek(fp, 0, SEEK_END);
	sz = ftell(fp);
	rewind(fp);
	buf = malloc((size_t)sz);
	assert_int_equal(fread(buf, 1, (size_t)sz, fp), (size_t)sz);
	fclose(fp);
	assert_null(memmem(buf, (size_t)sz, key, strlen(key)));
	assert_non_null(memmem(buf, (size_t)sz, want, strlen(want)));
	free(buf);
	reopen(f);
	assert_int_equal(cpdb_apikey_lookup(f->db, key, name, sizeof(name),
	                                    &err), 1);
}

/* A worker sees its own updates and broadcast ones, in rev order. */
static void test_feed_per_worker(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	json_t *body = json_pack("{s:s}", "sandbox", "x"), *ups;
	int64_t r[4];

	assert_int_equal(cpdb_feed_append(f->db, "keys", NULL, body, 1, &r[0],
	                                  &err), 0);
	assert_int_equal(cpdb_feed_append(f->db, "retire", "w2", body, 1, &r[1],
	                                  &err), 0);
	assert_int_equal(cpdb_feed_append(f->db, "retire", "w1", body, 1, &r[2],
	                                  &err), 0);
	assert_int_equal(cpdb_feed_append(f->db, "destroy", "w1", body, 1,
	                                  &r[3], &err), 0);
	ups = cpdb_feed_since(f->db, "w1", 0, 100, &err);
	assert_non_null(ups);
	assert_int_equal(json_array_size(ups), 3);
	assert_int_equal(json_integer_value(json_object_get(
	        json_array_get(ups, 0), "rev")), r[0]);
	assert_true(json_is_null(json_object_get(json_array_get(ups, 0),
	                                         "worker")));
	assert_string_equal(json_string_value(json_object_get(
	        json_array_get(ups, 2), "kind")), "destroy");
	json_decref(ups);
	ups = cpdb_feed_since(f->db, "w1", r[2], 100, &err);
	assert_int_equal(json_array_size(ups), 1);
	json_decref(ups);
	ups = cpdb_feed_since(f->db, "w1", 0, 2, &err); /* bounded */
	assert_int_equal(json_array_size(ups), 2);
	json_decref(ups);
	json_decref(body);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_generation_never_reused,
		                                setup, teardown),
		cmocka_unit_test_setup_teardown(test_feed_revs_monotonic,
		                                setup, teardown),
		cmocka_unit_test_setup_teardown(test_apikey_hashing, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_feed_per_worker, setup,
		                                teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

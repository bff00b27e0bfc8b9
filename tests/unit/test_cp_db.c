/* Control-plane store on real databases, once on SQLite files and once on
 * a PostgreSQL server the test starts (scripts/pgtest.sh; skipped, with a
 * note, where PostgreSQL is not installed): generations and feed revs are
 * never reused across reopen, API keys are stored hashed, the feed is
 * filtered per worker, lifecycle transitions are compare-and-swaps that
 * commit together with their feed updates, older databases are migrated.
 * Then the races of several cp replicas, as processes with a connection
 * each: generations allocated concurrently are all distinct, concurrent
 * pauses and resumes of one sandbox have exactly one winner each, and a
 * reader of the feed never sees a rev before a lower one that commits
 * later. */
#include <setjmp.h>
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
#include <libpq-fe.h>
#include <sodium.h>
#include <sqlite3.h>

#include "cp/db.h"

/* The PostgreSQL server's URL while the PostgreSQL group runs, else NULL
 * (the SQLite group). */
static const char *g_pg;

struct dbfix {
	char dir[64];
	char path[1024];
	struct cpdb *db;
};

/* pg_sql: SQL on the test server behind the store's back. */
static void pg_sql(const char *sql)
{
	PGconn *c = PQconnectdb(g_pg);
	PGresult *r;

	assert_int_equal(PQstatus(c), CONNECTION_OK);
	PQclear(PQexec(c, "SET client_min_messages=warning"));
	r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
		fail_msg("%s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	PQfinish(c);
}

/* fresh_store: an empty store (SQLite: the file is gone; PostgreSQL: the
 * schema is dropped). */
static void fresh_store(struct dbfix *f)
{
	if (g_pg != NULL)
		pg_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public");
	else
		unlink(f->path);
}

/* setup: a fresh database (a file in a temp dir, or an empty schema). */
static int setup(void **state)
{
	struct dbfix *f = calloc(1, sizeof(*f));
	struct tt_err err = { 0 };

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/tt-cpdb.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	if (g_pg != NULL)
		snprintf(f->path, sizeof(f->path), "%s", g_pg);
	else
		snprintf(f->path, sizeof(f->path), "%s/cp.db", f->dir);
	fresh_store(f);
	f->db = cpdb_open(f->path, &err);
	if (f->db == NULL)
		fail_msg("open %s: %s", f->path, err.msg);
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

/* reopen: close and open the same store again (a cp restart). */
static void reopen(struct dbfix *f)
{
	struct tt_err err = { 0 };

	cpdb_close(f->db);
	f->db = cpdb_open(f->path, &err);
	assert_non_null(f->db);
}

/* raw_exec: SQL on the store behind its back. */
static void raw_exec(struct dbfix *f, const char *sql)
{
	sqlite3 *h;

	if (g_pg != NULL) {
		pg_sql(sql);
		return;
	}
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

	assert_int_equal(cpdb_sandbox_create(f->db, id, "w1", 0, 100, &sb, &rev,
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
	assert_int_equal(cpdb_sandbox_create(f->db, id, "w1", 0, 102, &sb, &rev,
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
	/* and the plaintext is nowhere in the database files (SQLite: the
	 * file itself; PostgreSQL: no column holds it) */
	if (g_pg != NULL) {
		assert_int_equal(cpdb_apikey_lookup(f->db, key, name, sizeof(name), &err), 1);
		return;
	}
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

/* Worker credentials: bound to one id and URL, replaced by a new one,
 * revoked; sent_rev only moves forward and survives a restart. */
static void test_worker_creds(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	char h1[CPDB_HASH_HEX + 1], h2[CPDB_HASH_HEX + 1];
	struct cp_cred c;
	struct cp_worker w;

	cpdb_key_hash("ttw_one", h1);
	cpdb_key_hash("ttw_two", h2);
	assert_int_equal(cpdb_cred_set(f->db, "w1", h1, "http://a:1", 5, &err), 0);
	assert_int_equal(cpdb_cred_by_hash(f->db, h1, &c, &err), 1);
	assert_string_equal(c.id, "w1");
	assert_string_equal(c.node_url, "http://a:1");
	assert_int_equal(cpdb_cred_by_hash(f->db, h2, &c, &err), 0);
	/* a second worker cannot take the same credential */
	assert_int_equal(cpdb_cred_set(f->db, "w2", h1, "http://b:1", 5, &err), -1);
	/* re-provisioning w1 replaces its credential and URL */
	assert_int_equal(cpdb_cred_set(f->db, "w1", h2, "http://a:2", 6, &err), 0);
	assert_int_equal(cpdb_cred_by_hash(f->db, h1, &c, &err), 0);
	assert_int_equal(cpdb_cred_get(f->db, "w1", &c, &err), 1);
	assert_string_equal(c.hash, h2);
	assert_string_equal(c.node_url, "http://a:2");
	/* the feed position */
	assert_int_equal(cpdb_worker_register(f->db, "w1", "http://a:2", 7, &err), 0);
	assert_int_equal(cpdb_worker_sent(f->db, "w1", 9, &err), 1);
	assert_int_equal(cpdb_worker_sent(f->db, "w1", 4, &err), 0);
	reopen(f);
	assert_int_equal(cpdb_worker_get(f->db, "w1", &w, &err), 1);
	assert_int_equal(w.sent_rev, 9);
	assert_int_equal(cpdb_cred_revoke(f->db, "w1", &err), 1);
	assert_int_equal(cpdb_cred_revoke(f->db, "w1", &err), 0);
	assert_int_equal(cpdb_cred_by_hash(f->db, h2, &c, &err), 0);
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

/* last_update: the newest feed update for worker (new reference). */
static json_t *last_update(struct dbfix *f, const char *worker)
{
	struct tt_err err = { 0 };
	json_t *ups = cpdb_feed_since(f->db, worker, 0, 1000, &err), *u;

	assert_non_null(ups);
	assert_true(json_array_size(ups) > 0);
	u = json_incref(json_array_get(ups, json_array_size(ups) - 1));
	json_decref(ups);
	return u;
}

/* running_sbx: a sandbox created on w1 and acked (running, gen 1). */
static void running_sbx(struct dbfix *f, const char *id, struct cp_sandbox *sb)
{
	struct tt_err err = { 0 };
	int64_t rev;

	assert_int_equal(cpdb_sandbox_create(f->db, id, "w1", 0, 100, sb, &rev,
	                                     &err), 0);
	assert_int_equal(cpdb_sandbox_set_state(f->db, id, "running", NULL,
	                                        &err), 0);
	assert_int_equal(cpdb_sandbox_get(f->db, id, sb, &err), 1);
}

/* a complete snapshot record for (id, gen). */
static struct cp_snapshot snap_of(const char *id, uint64_t gen)
{
	struct cp_snapshot sn = { .generation = gen, .size = 42,
	                          .created_at = 7 };

	snprintf(sn.sandbox, sizeof(sn.sandbox), "%s", id);
	snprintf(sn.key, sizeof(sn.key), "%s/%llu", id, (unsigned long long)gen);
	snprintf(sn.checksum, sizeof(sn.checksum), "blake2b:%02llx",
	         (unsigned long long)gen);
	return sn;
}

/* Pause is a CAS: the second of two pauses from the same view loses and
 * appends nothing; only the matching ack (gen + rev) completes it. */
static void test_pause_cas(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	const char *id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
	struct cp_sandbox sb, got;
	struct cp_snapshot sn = snap_of(id, 1), latest;
	int64_t rev, rev2, latest_rev;
	json_t *u;

	running_sbx(f, id, &sb);
	assert_int_equal(cpdb_snapshot_latest(f->db, id, &latest, &err), 0);
	assert_int_equal(cpdb_sandbox_pause(f->db, &sb, NULL, NULL, 200, &rev, &err), 1);
	assert_int_equal(cpdb_sandbox_pause(f->db, &sb, NULL, NULL, 200, &rev2, &err), 0);
	assert_int_equal(cpdb_feed_latest(f->db, &latest_rev, &err), 0);
	assert_int_equal(latest_rev, rev); /* the loser appended nothing */
	u = last_update(f, "w1");
	assert_string_equal(json_string_value(json_object_get(u, "kind")),
	                    "pause");
	assert_int_equal(json_integer_value(json_object_get(u, "generation")), 1);
	assert_string_equal(json_string_value(json_object_get(u, "snapshot")),
	                    sn.key);
	json_decref(u);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.state, "pausing");
	assert_int_equal(got.op_rev, rev);
	assert_int_equal(got.progress_bytes, -1);
	/* progress only for this pause's rev */
	assert_int_equal(cpdb_sandbox_progress(f->db, id, rev + 1, 5, 10, &err),
	                 0);
	assert_int_equal(cpdb_sandbox_progress(f->db, id, rev, 5, -1, &err), 1);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_int_equal(got.progress_bytes, 5);
	assert_int_equal(got.progress_total, -1);
	/* a stale ack (other rev or gen) records no snapshot */
	assert_int_equal(cpdb_sandbox_paused(f->db, id, 1, rev + 1, &sn, &err), 0);
	assert_int_equal(cpdb_sandbox_paused(f->db, id, 2, rev, &sn, &err), 0);
	assert_int_equal(cpdb_snapshot_latest(f->db, id, &latest, &err), 0);
	assert_int_equal(cpdb_sandbox_paused(f->db, id, 1, rev, &sn, &err), 1);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.state, "paused");
	assert_int_equal(got.op_rev, 0);
	assert_int_equal(cpdb_snapshot_latest(f->db, id, &latest, &err), 1);
	assert_string_equal(latest.key, sn.key);
	assert_string_equal(latest.checksum, "blake2b:01");
	assert_int_equal(latest.size, 42);
	/* a paused sandbox cannot be paused */
	assert_int_equal(cpdb_sandbox_pause(f->db, &got, NULL, NULL, 201, &rev2, &err), 0);
}

/* gens_str: the recorded snapshot generations of id, newest first. */
static void gens_str(struct dbfix *f, const char *id, char *out, size_t cap)
{
	struct tt_err err = { 0 };
	uint64_t g[16];
	size_t n = 0, at = 0;

	assert_int_equal(cpdb_snapshot_gens(f->db, id, g, 16, &n, &err), 0);
	out[0] = '\0';
	for (size_t i = 0; i < n; i++)
		at += (size_t)snprintf(out + at, cap - at, "%s%llu", i ? " " : "",
		                       (unsigned long long)g[i]);
}

/* pause_resume: pauses sb's generation (acked with its snapshot through
 * cpdb_snapshot_record, keeping keep older), then resumes it on w1; sb
 * is refreshed. The prune update's rev in *prune_rev. */
static void pause_resume(struct dbfix *f, struct cp_sandbox *sb, unsigned keep,
                         int64_t *prune_rev)
{
	struct tt_err err = { 0 };
	struct cp_snapshot sn = snap_of(sb->id, sb->generation);
	struct cpdb_record r = { .from = "pausing", .gen = sb->generation, .keep_older = keep,
	                         .worker = "w1", .now = 300 };
	int64_t rev, irev;
	uint64_t g;

	assert_int_equal(cpdb_sandbox_pause(f->db, sb, NULL, NULL, 200, &rev, &err), 1);
	r.op_rev = rev;
	assert_int_equal(cpdb_snapshot_record(f->db, sb->id, &r, &sn, prune_rev, &err), 1);
	assert_int_equal(cpdb_sandbox_get(f->db, sb->id, sb, &err), 1);
	assert_string_equal(sb->state, "paused");
	assert_int_equal(cpdb_sandbox_resume(f->db, sb->id, &(struct cpdb_resume){
	                 .from = "paused", .gen = sb->generation, .worker = "w1",
	                 .snapshot_key = sn.key }, 400, &g, &irev, NULL, &err), 1);
	assert_int_equal(cpdb_sandbox_set_state(f->db, sb->id, "running", NULL, &err), 0);
	assert_int_equal(cpdb_sandbox_get(f->db, sb->id, sb, &err), 1);
}

/* Retention: recording a snapshot keeps it and the configured number of
 * older ones in cp.db, and appends, in the same transaction, a prune
 * update for the worker naming what stays below it; 5 pauses with one
 * older kept leave 2 recorded; keep 0 leaves only the newest. */
static void test_snapshot_retention(void **state)
{
	struct dbfix *f = *state;
	const char *id = "sbx_bbbbbbbbbbbbbbbbbbbbbbbbbb";
	struct cp_sandbox sb;
	int64_t prune_rev = 0, latest;
	struct tt_err err = { 0 };
	char got[64];
	json_t *u;

	running_sbx(f, id, &sb);
	for (int i = 1; i <= 5; i++)
		pause_resume(f, &sb, CPDB_KEEP_DEFAULT, &prune_rev);
	gens_str(f, id, got, sizeof(got));
	assert_string_equal(got, "5 4");
	/* The last prune: generation 5, keep [5, 4], for w1 only. */
	assert_int_equal(cpdb_feed_get(f->db, prune_rev, got, sizeof(got), &u, &err), 1);
	assert_string_equal(got, "prune");
	assert_string_equal(json_string_value(json_object_get(u, "sandbox")), id);
	assert_int_equal(json_integer_value(json_object_get(u, "generation")), 5);
	assert_int_equal(json_array_size(json_object_get(u, "keep")), 2);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(u, "keep"), 0)), 5);
	assert_int_equal(json_integer_value(json_array_get(json_object_get(u, "keep"), 1)), 4);
	json_decref(u);
	u = cpdb_feed_since(f->db, "w2", prune_rev - 1, 10, &err);
	assert_int_equal(json_array_size(u), 0);
	json_decref(u);
	/* keep 0: only the newest. */
	pause_resume(f, &sb, 0, &prune_rev);
	gens_str(f, id, got, sizeof(got));
	assert_string_equal(got, "6");
	/* Without a worker (cpdb_sandbox_paused): everything kept, no update. */
	{
		struct cp_snapshot sn = snap_of(id, 7);
		int64_t rev;

		assert_int_equal(cpdb_sandbox_pause(f->db, &sb, NULL, NULL, 200, &rev, &err), 1);
		assert_int_equal(cpdb_sandbox_paused(f->db, id, 7, rev, &sn, &err), 1);
		assert_int_equal(cpdb_feed_latest(f->db, &latest, &err), 0);
		assert_int_equal(latest, rev);
	}
	gens_str(f, id, got, sizeof(got));
	assert_string_equal(got, "7 6");
}

/* A pause that failed (timed out: failed + retire) whose complete
 * snapshot arrives late: recorded, the sandbox paused; not once it moved
 * on to another generation; a snapshot of another generation is never
 * recorded. A pause asked again: the same pause, marked, for its worker;
 * a pending one waits for the new rev. */
static void test_late_snapshot(void **state)
{
	struct dbfix *f = *state;
	const char *id = "sbx_cccccccccccccccccccccccccc";
	struct tt_err err = { 0 };
	struct cp_sandbox sb, got;
	struct cp_snapshot sn = snap_of(id, 1), latest;
	struct cpdb_record late = { .from = "failed", .gen = 1, .op_rev = -1,
	                            .keep_older = 1, .worker = "w1", .now = 500 };
	int64_t rev, again, rr, prune_rev = 0;
	uint64_t g;
	json_t *u;

	running_sbx(f, id, &sb);
	assert_int_equal(cpdb_sandbox_pause(f->db, &sb, NULL, NULL, 200, &rev, &err), 1);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &sb, &err), 1);
	/* Asked again while pending: op_rev follows. */
	assert_int_equal(cpdb_pause_reask(f->db, &sb, 250, &again, &err), 0);
	assert_true(again > rev);
	u = last_update(f, "w1");
	assert_string_equal(json_string_value(json_object_get(u, "kind")), "pause");
	assert_int_equal(json_integer_value(json_object_get(u, "generation")), 1);
	assert_string_equal(json_string_value(json_object_get(u, "snapshot")), sn.key);
	assert_true(json_is_true(json_object_get(u, "again")));
	json_decref(u);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.state, "pausing");
	assert_int_equal(got.op_rev, again);
	assert_int_equal(got.op_at, sb.op_at);
	/* It times out: failed, retire appended. */
	assert_int_equal(cpdb_sandbox_cas(f->db, id, "pausing", 1, again, "failed",
	                                  "did not acknowledge in time", "w1", 260, &rr,
	                                  &err), 1);
	/* A wrong generation's snapshot changes nothing. */
	{
		struct cp_snapshot other = snap_of(id, 2);

		assert_int_equal(cpdb_snapshot_record(f->db, id, &late, &other, &prune_rev,
		                                      &err), 0);
	}
	assert_int_equal(cpdb_snapshot_latest(f->db, id, &latest, &err), 0);
	/* The late one: recorded, paused, error cleared. */
	assert_int_equal(cpdb_snapshot_record(f->db, id, &late, &sn, &prune_rev, &err), 1);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.state, "paused");
	assert_string_equal(got.error, "");
	assert_int_equal(cpdb_snapshot_latest(f->db, id, &latest, &err), 1);
	assert_int_equal(latest.generation, 1);
	assert_true(prune_rev > rr);
	/* Twice: nothing (it is paused now). */
	assert_int_equal(cpdb_snapshot_record(f->db, id, &late, &sn, &prune_rev, &err), 0);
	/* Resumed (gen 2), then gen 2 fails: a late gen-1 snapshot is not
	 * this generation's any more. */
	assert_int_equal(cpdb_sandbox_resume(f->db, id, &(struct cpdb_resume){
	                 .from = "paused", .gen = 1, .worker = "w1", .snapshot_key = sn.key },
	                 600, &g, &rev, NULL, &err), 1);
	assert_int_equal(cpdb_sandbox_cas(f->db, id, "resuming", 2, -1, "failed", "boom",
	                                  NULL, 610, NULL, &err), 1);
	assert_int_equal(cpdb_snapshot_record(f->db, id, &late, &sn, &prune_rev, &err), 0);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.state, "failed");
	assert_int_equal(got.generation, 2);
}

/* Resume allocates N+1 together with its install; a racing resume from
 * the same view loses; generations continue across reopen; a failure
 * appends the retire in the same transaction. */
static void test_resume_generations(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	const char *id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
	struct cp_sandbox sb, got;
	struct cp_snapshot sn = snap_of(id, 1);
	struct cpdb_resume r = { .from = "paused", .gen = 1, .worker = "w2",
	                         .snapshot_key = sn.key };
	int64_t rev, irev, irev2, rrev = 0, latest;
	uint64_t gen = 0;
	json_t *u;

	running_sbx(f, id, &sb);
	assert_int_equal(cpdb_sandbox_pause(f->db, &sb, NULL, NULL, 200, &rev, &err), 1);
	assert_int_equal(cpdb_sandbox_paused(f->db, id, 1, rev, &sn, &err), 1);
	assert_int_equal(cpdb_sandbox_resume(f->db, id, &r, 300, &gen, &irev,
	                                     &rrev, &err), 1);
	assert_int_equal(gen, 2);
	assert_int_equal(cpdb_sandbox_resume(f->db, id, &r, 300, &gen, &irev2,
	                                     &rrev, &err), 0);
	assert_int_equal(cpdb_feed_latest(f->db, &latest, &err), 0);
	assert_int_equal(latest, irev);
	u = last_update(f, "w2");
	assert_string_equal(json_string_value(json_object_get(u, "kind")),
	                    "install");
	assert_int_equal(json_integer_value(json_object_get(u, "generation")), 2);
	assert_string_equal(json_string_value(json_object_get(u, "worker")), "w2");
	assert_string_equal(json_string_value(json_object_get(u, "snapshot")),
	                    sn.key);
	json_decref(u);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.state, "resuming");
	assert_string_equal(got.worker, "w2");
	assert_int_equal(got.op_rev, irev);
	/* the install fails: failed + retire{gen 2} for w2, atomically */
	assert_int_equal(cpdb_sandbox_cas(f->db, id, "resuming", 2, irev + 1,
	                                  "failed", "x", "w2", 301, &rrev, &err),
	                 0);
	assert_int_equal(cpdb_sandbox_cas(f->db, id, "resuming", 2, irev,
	                                  "failed", "no space", "w2", 301, &rrev,
	                                  &err), 1);
	assert_true(rrev > irev);
	u = last_update(f, "w2");
	assert_string_equal(json_string_value(json_object_get(u, "kind")),
	                    "retire");
	assert_int_equal(json_integer_value(json_object_get(u, "generation")), 2);
	json_decref(u);
	/* restart, then a forced resume from failed: gen 3, retire first */
	reopen(f);
	r.from = "failed";
	r.gen = 2;
	r.worker = "w1";
	r.retire_worker = "w2";
	assert_int_equal(cpdb_sandbox_resume(f->db, id, &r, 400, &gen, &irev2,
	                                     &rrev, &err), 1);
	assert_int_equal(gen, 3);
	assert_true(rrev < irev2);
	u = last_update(f, "w2");
	assert_string_equal(json_string_value(json_object_get(u, "kind")),
	                    "retire");
	json_decref(u);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.error, "");
	assert_int_equal(got.generation, 3);
}

/* install_cpu: the "cpu" of the install update at rev (-1: none). */
static int64_t install_cpu(struct dbfix *f, int64_t rev)
{
	struct tt_err err = { 0 };
	char kind[16];
	json_t *u, *v;
	int64_t cpu;

	assert_int_equal(cpdb_feed_get(f->db, rev, kind, sizeof(kind), &u, &err), 1);
	assert_string_equal(kind, "install");
	v = json_object_get(u, "cpu");
	cpu = v ? (int64_t)json_integer_value(v) : -1;
	json_decref(u);
	return cpu;
}

/* The CPU cap asked at create is stored with the sandbox (across a
 * restart) and carried in every install of it: the create's, a resume's
 * from a snapshot, a relaunch's from the layer, a re-activation's; a
 * sandbox created without one has none in any install. */
static void test_cpu_carried(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	const char *id = "sbx_dddddddddddddddddddddddddd", *plain = "sbx_eeeeeeeeeeeeeeeeeeeeeeeeee";
	struct cp_sandbox sb;
	struct cp_snapshot sn;
	struct cpdb_record r = { .from = "pausing", .keep_older = 1, .worker = "w1", .now = 300 };
	int64_t rev, prune_rev = 0;
	uint64_t g;

	assert_int_equal(cpdb_sandbox_create(f->db, id, "w1", 250, 100, &sb, &rev, &err), 0);
	assert_int_equal(sb.cpu, 250);
	assert_int_equal(install_cpu(f, rev), 250);
	assert_int_equal(cpdb_sandbox_create(f->db, plain, "w1", 0, 100, &sb, &rev, &err), 0);
	assert_int_equal(install_cpu(f, rev), -1);
	reopen(f);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &sb, &err), 1);
	assert_int_equal(sb.cpu, 250);
	assert_int_equal(cpdb_sandbox_set_state(f->db, id, "running", NULL, &err), 0);
	/* migrate: pause, snapshot, resume on w2 */
	assert_int_equal(cpdb_sandbox_get(f->db, id, &sb, &err), 1);
	assert_int_equal(cpdb_sandbox_pause(f->db, &sb, "w2", NULL, 200, &rev, &err), 1);
	sn = snap_of(id, sb.generation);
	r.gen = sb.generation;
	r.op_rev = rev;
	assert_int_equal(cpdb_snapshot_record(f->db, id, &r, &sn, &prune_rev, &err), 1);
	assert_int_equal(cpdb_sandbox_resume(f->db, id, &(struct cpdb_resume){
	                 .from = "paused", .gen = 1, .worker = "w2",
	                 .snapshot_key = sn.key }, 400, &g, &rev, NULL, &err), 1);
	assert_int_equal(install_cpu(f, rev), 250);
	/* relaunch from the layer after a lost execution, then a re-activation */
	assert_int_equal(cpdb_sandbox_set_state(f->db, id, "running", NULL, &err), 0);
	assert_int_equal(cpdb_sandbox_resume(f->db, id, &(struct cpdb_resume){
	                 .from = "running", .gen = g, .worker = "w2",
	                 .note = "relaunched" }, 500, &g, &rev, NULL, &err), 1);
	assert_int_equal(install_cpu(f, rev), 250);
	assert_int_equal(cpdb_sandbox_set_state(f->db, id, "running", NULL, &err), 0);
	assert_int_equal(cpdb_sandbox_resume(f->db, id, &(struct cpdb_resume){
	                 .from = "running", .gen = g, .worker = "w2",
	                 .reactivate = 1 }, 600, &g, &rev, NULL, &err), 1);
	assert_int_equal(install_cpu(f, rev), 250);
	/* the one without a cap: none in its resume either */
	assert_int_equal(cpdb_sandbox_set_state(f->db, plain, "running", NULL, &err), 0);
	assert_int_equal(cpdb_sandbox_resume(f->db, plain, &(struct cpdb_resume){
	                 .from = "running", .gen = 1, .worker = "w1",
	                 .note = "relaunched" }, 700, &g, &rev, NULL, &err), 1);
	assert_int_equal(install_cpu(f, rev), -1);
}

/* A database made before the lifecycle columns existed opens, gains them
 * with their defaults, and keeps its rows. */
static void test_migrate_old_schema(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	struct cp_sandbox got;
	const char *id = "sbx_cccccccccccccccccccccccccc";

	cpdb_close(f->db);
	f->db = NULL;
	fresh_store(f);
	raw_exec(f, "CREATE TABLE sandboxes(id TEXT PRIMARY KEY, state TEXT NOT"
	         " NULL, generation INTEGER NOT NULL, worker TEXT NOT NULL,"
	         " substrate TEXT NOT NULL, pod TEXT NOT NULL, activation"
	         " INTEGER NOT NULL, created_at INTEGER NOT NULL, error TEXT);"
	         "INSERT INTO sandboxes VALUES('sbx_cccccccccccccccccccccccccc',"
	         "'running',7,'w1','ns','',1,5,NULL);");
	f->db = cpdb_open(f->path, &err);
	assert_non_null(f->db);
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_int_equal(got.generation, 7);
	assert_int_equal(got.op_rev, 0);
	assert_int_equal(got.progress_bytes, -1);
	assert_int_equal(got.cpu, 0); /* no cap asked: the worker's default */
	reopen(f); /* migrating twice is a no-op */
	assert_int_equal(cpdb_sandbox_get(f->db, id, &got, &err), 1);
	assert_string_equal(got.state, "running");
}

/* mode_of: the permission bits of path, or -1. */
static int mode_of(const char *path)
{
	struct stat st;

	return stat(path, &st) < 0 ? -1 : (int)(st.st_mode & 07777);
}

/* test_private_files: cp.db and its -wal/-shm are 0600 under a lax umask
 * from the first byte; files left wider by an older run are narrowed. */
static void test_private_files(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	char wal[1100], shm[1100];
	mode_t old = umask(0);

	snprintf(wal, sizeof(wal), "%s-wal", f->path);
	snprintf(shm, sizeof(shm), "%s-shm", f->path);
	/* The fixture opened it under the test's umask: reopen under 0. */
	cpdb_close(f->db);
	unlink(f->path);
	unlink(wal);
	unlink(shm);
	f->db = cpdb_open(f->path, &err);
	assert_non_null(f->db);
	assert_int_equal(mode_of(f->path), 0600);
	assert_int_equal(mode_of(wal), 0600);
	assert_int_equal(mode_of(shm), 0600);
	/* An older run's wider files. */
	cpdb_close(f->db);
	assert_int_equal(chmod(f->path, 0644), 0);
	if (mode_of(wal) >= 0)
		assert_int_equal(chmod(wal, 0666), 0);
	f->db = cpdb_open(f->path, &err);
	assert_non_null(f->db);
	umask(old);
	assert_int_equal(mode_of(f->path), 0600);
	assert_true(mode_of(wal) == -1 || mode_of(wal) == 0600);
	assert_int_equal(mode_of(shm), 0600);
}

/* Idempotency records: an armed lifecycle write records what it started,
 * in its own transaction; a key used twice fails the second write whole
 * (nothing of it stays); a disarmed write records nothing. */
static void test_idem_records(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	struct cp_sandbox sb;
	struct cpdb_idem rec;
	int64_t rev, rev2;

	cpdb_idem_arm(f->db, "alice", "idem_1", "create");
	assert_int_equal(cpdb_sandbox_create(f->db, "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa", "w1",
	                                     0, 100, &sb, &rev, &err), 0);
	assert_int_equal(cpdb_idem_get(f->db, "alice", "idem_1", &rec, &err), 1);
	assert_string_equal(rec.op, "create");
	assert_string_equal(rec.sandbox, "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa");
	assert_string_equal(rec.worker, "w1");
	assert_int_equal(rec.rev, rev);
	assert_int_equal(rec.generation, 1);
	/* the same key again: the whole create fails, no sandbox, no update */
	assert_int_equal(cpdb_sandbox_create(f->db, "sbx_bbbbbbbbbbbbbbbbbbbbbbbbbb", "w1",
	                                     0, 100, &sb, &rev2, &err), -1);
	assert_int_equal(cpdb_sandbox_get(f->db, "sbx_bbbbbbbbbbbbbbbbbbbbbbbbbb", &sb,
	                                  &err), 0);
	assert_int_equal(cpdb_feed_latest(f->db, &rev2, &err), 0);
	assert_int_equal(rev2, rev);
	/* another caller's key space is its own */
	assert_int_equal(cpdb_idem_get(f->db, "bob", "idem_1", &rec, &err), 0);
	cpdb_idem_disarm(f->db);
	assert_int_equal(cpdb_sandbox_create(f->db, "sbx_cccccccccccccccccccccccccc", "w1",
	                                     0, 100, &sb, &rev2, &err), 0);
	assert_int_equal(cpdb_idem_prune(f->db, 101, &err), 0);
	assert_int_equal(cpdb_idem_get(f->db, "alice", "idem_1", &rec, &err), 0);
}

/* Leases: one per sandbox (the newest), for its execution, until its end. */
static void test_leases(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	const char *id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";

	assert_int_equal(cpdb_leased(f->db, id, 1, 1, 1000, &err), 0);
	assert_int_equal(cpdb_lease_set(f->db, id, 1, 1, 1500, &err), 0);
	assert_int_equal(cpdb_leased(f->db, id, 1, 1, 1000, &err), 1);
	assert_int_equal(cpdb_leased(f->db, id, 1, 2, 1000, &err), 0);
	assert_int_equal(cpdb_leased(f->db, id, 1, 1, 1500, &err), 0);
	assert_int_equal(cpdb_lease_set(f->db, id, 2, 1, 3000, &err), 0);
	assert_int_equal(cpdb_leased(f->db, id, 1, 1, 1000, &err), 0);
	assert_int_equal(cpdb_leased(f->db, id, 2, 1, 2999, &err), 1);
}

/* ---- races between replicas (processes, a connection each) ---------- */

#define RACERS 4

/* One result a racer reports: what it won, and the generation. */
struct race_rec {
	char what; /* 'G' generation allocated, 'P' pause won, 'R' resume won */
	uint64_t gen;
};

/* race_fn: a racer's work on its own store; writes race_recs to fd;
 * returns its exit status. */
typedef int (*race_fn)(struct cpdb *db, const char *path, int i, int fd);

/* race_run: RACERS processes run fn at once; their records are collected
 * into out (at most cap, *n of them). Every racer must exit 0. */
static void race_run(const char *path, race_fn fn, struct race_rec *out,
                     size_t cap, size_t *n)
{
	int p[2];
	pid_t pids[RACERS];
	ssize_t got;
	int status;

	assert_int_equal(pipe(p), 0);
	for (int i = 0; i < RACERS; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			struct tt_err err = { 0 };
			struct cpdb *db;

			close(p[0]);
			db = cpdb_open(path, &err);
			if (db == NULL) {
				fprintf(stderr, "racer %d: %s\n", i, err.msg);
				_exit(10);
			}
			status = fn(db, path, i, p[1]);
			cpdb_close(db);
			_exit(status);
		}
	}
	close(p[1]);
	*n = 0;
	while (*n < cap && (got = read(p[0], &out[*n], sizeof(out[0]))) == sizeof(out[0]))
		(*n)++;
	close(p[0]);
	for (int i = 0; i < RACERS; i++) {
		assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
}

/* race_put: one record to the parent. */
static int race_put(int fd, char what, uint64_t gen)
{
	struct race_rec r = { what, gen };

	return write(fd, &r, sizeof(r)) == sizeof(r) ? 0 : -1;
}

/* race_gens: 40 generations each. */
static int race_gens(struct cpdb *db, const char *path, int i, int fd)
{
	struct tt_err err = { 0 };
	uint64_t gen;

	(void)path;
	(void)i;
	for (int k = 0; k < 40; k++) {
		if (cpdb_generation_next(db, "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa", &gen, &err) < 0) {
			fprintf(stderr, "generation_next: %s\n", err.msg);
			return 1;
		}
		if (race_put(fd, 'G', gen) < 0)
			return 2;
	}
	return 0;
}

/* cmp_gen: sort race_recs by generation. */
static int cmp_gen(const void *a, const void *b)
{
	uint64_t x = ((const struct race_rec *)a)->gen, y = ((const struct race_rec *)b)->gen;

	return x < y ? -1 : x > y;
}

/* Generations allocated by several replicas at once are all distinct and
 * leave no hole: 2..161 after 4 x 40 allocations on generation 1. */
static void test_race_generations(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	struct race_rec recs[RACERS * 40];
	struct cp_sandbox sb;
	size_t n;
	int64_t rev;

	assert_int_equal(cpdb_sandbox_create(f->db, "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa", "w1",
	                                     0, 100, &sb, &rev, &err), 0);
	race_run(f->path, race_gens, recs, RACERS * 40, &n);
	assert_int_equal(n, RACERS * 40);
	qsort(recs, n, sizeof(recs[0]), cmp_gen);
	for (size_t k = 0; k < n; k++)
		assert_int_equal(recs[k].gen, k + 2);
	assert_int_equal(cpdb_sandbox_get(f->db, sb.id, &sb, &err), 1);
	assert_int_equal(sb.generation, n + 1);
}

/* race_lifecycle: pause what runs, resume what is paused, each step a
 * CAS from the state read; the winner completes its step (as the
 * worker's ack would), losers look again. */
static int race_lifecycle(struct cpdb *db, const char *path, int i, int fd)
{
	const char *id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
	struct tt_err err = { 0 };
	struct cp_sandbox sb;
	int64_t rev, rrev;
	uint64_t gen;
	int rc;

	(void)path;
	(void)i;
	for (int k = 0; k < 60; k++) {
		if (cpdb_sandbox_get(db, id, &sb, &err) != 1)
			return 1;
		if (strcmp(sb.state, "running") == 0) {
			struct cp_snapshot sn = { .generation = sb.generation, .size = 1 };

			rc = cpdb_sandbox_pause(db, &sb, NULL, NULL, 200, &rev, &err);
			if (rc < 0)
				return fprintf(stderr, "pause: %s\n", err.msg), 2;
			if (rc == 0)
				continue;
			if (race_put(fd, 'P', sb.generation) < 0)
				return 3;
			snprintf(sn.sandbox, sizeof(sn.sandbox), "%s", id);
			snprintf(sn.key, sizeof(sn.key), "%s/%llu", id,
			         (unsigned long long)sb.generation);
			snprintf(sn.checksum, sizeof(sn.checksum), "blake2b:00");
			if (cpdb_sandbox_paused(db, id, sb.generation, rev, &sn, &err) != 1)
				return fprintf(stderr, "paused: %s\n", err.msg), 4;
		} else if (strcmp(sb.state, "paused") == 0) {
			char key[CPDB_SNAPKEY_MAX];

			snprintf(key, sizeof(key), "%s/%llu", id, (unsigned long long)sb.generation);
			rc = cpdb_sandbox_resume(db, id, &(struct cpdb_resume){
			        .from = "paused", .gen = sb.generation, .worker = "w1",
			        .snapshot_key = key }, 300, &gen, &rev, &rrev, &err);
			if (rc < 0)
				return fprintf(stderr, "resume: %s\n", err.msg), 5;
			if (rc == 0)
				continue;
			if (race_put(fd, 'R', gen) < 0)
				return 6;
			if (cpdb_sandbox_cas(db, id, "resuming", gen, rev, "running", NULL,
			                     NULL, 300, NULL, &err) != 1)
				return fprintf(stderr, "running: %s\n", err.msg), 7;
		} else {
			usleep(200);
		}
	}
	return 0;
}

/* Concurrent pauses and resumes of one sandbox from several replicas:
 * each generation is paused once and created once, the resumes made
 * exactly the generations 2..final, and the feed holds one pause and one
 * install per step, nothing from a loser. */
static void test_race_lifecycle(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	const char *id = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa";
	struct race_rec recs[RACERS * 60], p[RACERS * 60], r[RACERS * 60];
	struct cp_sandbox sb;
	size_t n, np = 0, nr = 0, pauses = 0, installs = 0, i;
	json_t *ups, *u;
	int64_t rev;

	assert_int_equal(cpdb_sandbox_create(f->db, id, "w1", 0, 100, &sb, &rev, &err), 0);
	assert_int_equal(cpdb_sandbox_set_state(f->db, id, "running", NULL, &err), 0);
	race_run(f->path, race_lifecycle, recs, RACERS * 60, &n);
	for (size_t k = 0; k < n; k++) {
		if (recs[k].what == 'P')
			p[np++] = recs[k];
		else
			r[nr++] = recs[k];
	}
	assert_true(nr > 5); /* the race made progress */
	qsort(p, np, sizeof(p[0]), cmp_gen);
	qsort(r, nr, sizeof(r[0]), cmp_gen);
	for (size_t k = 0; k < np; k++)
		assert_int_equal(p[k].gen, k + 1); /* each generation paused once */
	for (size_t k = 0; k < nr; k++)
		assert_int_equal(r[k].gen, k + 2); /* each made once, in order */
	assert_int_equal(cpdb_sandbox_get(f->db, id, &sb, &err), 1);
	assert_int_equal(sb.generation, nr + 1);
	ups = cpdb_feed_since(f->db, "w1", 0, 100000, &err);
	assert_non_null(ups);
	json_array_foreach(ups, i, u) {
		const char *kind = json_string_value(json_object_get(u, "kind"));

		if (strcmp(kind, "pause") == 0)
			pauses++;
		if (strcmp(kind, "install") == 0) {
			assert_int_equal(json_integer_value(json_object_get(u, "generation")),
			                 installs + 1);
			installs++;
		}
	}
	json_decref(ups);
	assert_int_equal(pauses, np);
	assert_int_equal(installs, nr + 1);
}

#define FEED_PER_RACER 100

/* race_feed: appends, each in its own transaction. */
static int race_feed(struct cpdb *db, const char *path, int i, int fd)
{
	struct tt_err err = { 0 };
	json_t *body = json_pack("{s:i}", "racer", i);
	int64_t rev;

	(void)path;
	(void)fd;
	for (int k = 0; k < FEED_PER_RACER; k++) {
		if (cpdb_feed_append(db, "keys", NULL, body, 1, &rev, &err) < 0) {
			fprintf(stderr, "append: %s\n", err.msg);
			json_decref(body);
			return 1;
		}
	}
	json_decref(body);
	return 0;
}

/* The feed as a worker polls it while replicas append at once: after
 * reading the newest rev L, the updates after its position up to L are
 * exactly the next revs, without a gap: no rev becomes visible before a
 * lower one (which the worker would otherwise skip for good). */
static void test_race_feed_order(void **state)
{
	struct dbfix *f = *state;
	struct tt_err err = { 0 };
	struct race_rec none[1];
	int64_t after = 0, latest = 0;
	size_t n, polls = 0, i;
	json_t *ups, *u;
	pid_t pid;
	int status;

	/* the appenders run in a child, the parent polls meanwhile */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		race_run(f->path, race_feed, none, 0, &n);
		_exit(0);
	}
	for (int spins = 0; after < RACERS * FEED_PER_RACER && spins < 200000; spins++) {
		assert_int_equal(cpdb_feed_latest(f->db, &latest, &err), 0);
		ups = cpdb_feed_since(f->db, "w1", after, 100000, &err);
		assert_non_null(ups);
		json_array_foreach(ups, i, u) {
			int64_t rev = json_integer_value(json_object_get(u, "rev"));

			if (rev > latest)
				break;
			assert_int_equal(rev, after + 1);
			after = rev;
		}
		assert_int_equal(after, latest);
		json_decref(ups);
		polls++;
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(after, RACERS * FEED_PER_RACER);
	assert_true(polls > 1);
}

/* pg_start: a PostgreSQL server for the second group, from
 * scripts/pgtest.sh beside this binary's build tree; NULL when there is
 * none (not installed). TETHER_TEST_PG_URL names one to use instead. */
static char *pg_start(char *dir, size_t cap)
{
	char exe[512], cmd[1200], url[512];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	FILE *p;
	int rc;

	if (getenv("TETHER_TEST_PG_URL") != NULL)
		return strdup(getenv("TETHER_TEST_PG_URL"));
	if (n <= 0)
		return NULL;
	exe[n] = '\0';
	for (int up = 0; up < 3; up++) /* build/tests/test_cp_db -> the tree */
		*strrchr(exe, '/') = '\0';
	snprintf(dir, cap, "/tmp/tt-cpdb-pg.XXXXXX");
	if (mkdtemp(dir) == NULL || chmod(dir, 0711) < 0)
		return NULL; /* the server runs as nobody when we are root */
	snprintf(cmd, sizeof(cmd), "'%s/scripts/pgtest.sh' start '%s/pg'", exe, dir);
	p = popen(cmd, "r");
	if (p == NULL)
		return NULL;
	if (fgets(url, sizeof(url), p) == NULL)
		url[0] = '\0';
	rc = pclose(p);
	if (WIFEXITED(rc) && WEXITSTATUS(rc) == 3)
		return NULL; /* not installed */
	if (rc != 0 || url[0] == '\0')
		return strdup(""); /* installed, but it did not start */
	url[strcspn(url, "\n")] = '\0';
	snprintf(cmd, sizeof(cmd), "%s/scripts", exe);
	setenv("TT_PGTEST_SCRIPTS", cmd, 1);
	return strdup(url);
}

/* pg_stop: the server pg_start made, and its directory. */
static void pg_stop(const char *dir)
{
	char cmd[700];

	if (dir[0] == '\0' || getenv("TT_PGTEST_SCRIPTS") == NULL)
		return;
	snprintf(cmd, sizeof(cmd), "'%s/pgtest.sh' stop '%s/pg'; rmdir '%s'",
	         getenv("TT_PGTEST_SCRIPTS"), dir, dir);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not stop the test server in %s\n", dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_private_files, setup, teardown),
		cmocka_unit_test_setup_teardown(test_generation_never_reused,
		                                setup, teardown),
		cmocka_unit_test_setup_teardown(test_feed_revs_monotonic,
		                                setup, teardown),
		cmocka_unit_test_setup_teardown(test_apikey_hashing, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_feed_per_worker, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_worker_creds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pause_cas, setup, teardown),
		cmocka_unit_test_setup_teardown(test_snapshot_retention, setup, teardown),
		cmocka_unit_test_setup_teardown(test_late_snapshot, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resume_generations, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_cpu_carried, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migrate_old_schema, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_idem_records, setup, teardown),
		cmocka_unit_test_setup_teardown(test_leases, setup, teardown),
		cmocka_unit_test_setup_teardown(test_race_generations, setup, teardown),
		cmocka_unit_test_setup_teardown(test_race_lifecycle, setup, teardown),
		cmocka_unit_test_setup_teardown(test_race_feed_order, setup, teardown),
	};
	char dir[64] = "";
	char *url;
	int rc;

	rc = cmocka_run_group_tests_name("sqlite", tests, NULL, NULL);
	url = pg_start(dir, sizeof(dir));
	if (url == NULL) {
		printf("# PostgreSQL is not installed here (scripts/deps.sh): the"
		       " postgresql group is skipped\n");
		pg_stop(dir);
		return rc;
	}
	if (url[0] == '\0') {
		printf("# the PostgreSQL test server did not start\n");
		pg_stop(dir);
		free(url);
		return 1;
	}
	g_pg = url;
	/* all but test_private_files (the first: SQLite's files) */
	rc |= _cmocka_run_group_tests("postgresql", tests + 1,
	                              sizeof(tests) / sizeof(tests[0]) - 1, NULL, NULL);
	g_pg = NULL;
	pg_stop(dir);
	free(url);
	return rc;
}

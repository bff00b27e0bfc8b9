/* Control-plane SQLite store on real database files: generations and feed
 * revs are never reused across reopen, API keys are stored hashed, the feed
 * is filtered per worker, lifecycle transitions are compare-and-swaps that
 * commit together with their feed updates, older files are migrated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
	unlink(f->path);
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
	char wal[300], shm[300];
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
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

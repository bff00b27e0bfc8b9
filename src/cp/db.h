/* The control plane's store: API keys (hashed), workers, sandboxes,
 * snapshots, the update feed, worker credentials, rebuilt-attempt leases
 * and the idempotency records of lifecycle calls. Two backends behind one
 * interface: SQLite (a file; WAL, synchronous=FULL; the default, one cp)
 * and PostgreSQL (a database several cp replicas share). Lifecycle
 * transitions are compare-and-swaps (UPDATE ... WHERE id AND state AND
 * generation; one changed row wins, also between replicas), each in one
 * transaction with the feed updates it implies. Generations and feed revs
 * are allocated inside write transactions and never reused, also across
 * restarts; feed revs become visible in order, without gaps. The logic:
 * src/cp/db.c; the backends: src/cp/db_sqlite.c, src/cp/db_pg.c. */
#ifndef TT_CP_DB_H
#define TT_CP_DB_H

#include <stdint.h>

#include <jansson.h>

#include "claims.h"
#include "err.h"

#define CPDB_HASH_HEX 64 /* SHA-256 as lowercase hex */
#define CPDB_URL_MAX 256
#define CPDB_ERR_MAX 256
#define CPDB_SNAPKEY_MAX 80   /* "<sbx>/<gen>" */
#define CPDB_CHECKSUM_MAX 160 /* "blake2b:<hex>" */
#define CPDB_IDEM_KEY_MAX 64  /* an Idempotency-Key */

struct cpdb;

struct cp_worker {
	char id[TT_NAME_MAX + 1];
	char node_url[CPDB_URL_MAX];
	int64_t registered_at, last_seen, acked_rev;
	int64_t draining; /* stopping in order since then (0: not): nothing
	                   * new goes there until it registers again */
	int64_t sent_rev; /* the highest rev a feed answer gave it: an ack
	                   * beyond it (and beyond acked_rev) is refused */
};

/* A worker's credential as provisioned (tetherd worker add): only its
 * SHA-256 is stored, with the one node_url the worker may register. */
struct cp_cred {
	char id[TT_NAME_MAX + 1];
	char hash[CPDB_HASH_HEX + 1];
	char node_url[CPDB_URL_MAX];
};

struct cp_sandbox {
	char id[TT_SBX_ID_LEN + 1];
	/* starting|running|pausing|paused|resuming|failed|deleting|deleted */
	char state[16];
	uint64_t generation;
	char worker[TT_NAME_MAX + 1];
	char substrate[TT_NAME_MAX + 1];
	char pod[TT_NAME_MAX + 1];
	uint32_t activation;
	int64_t created_at;
	char error[CPDB_ERR_MAX];
	int64_t op_rev;         /* feed rev of the pending pause/install, or 0 */
	int64_t op_at;          /* when that operation started */
	int64_t progress_bytes; /* pause progress; -1 = no report yet */
	int64_t progress_total; /* -1 = unknown */
	/* a migrate's target while its pause runs, and until the resume on
	 * the target began ("" otherwise): the cp continues it from the
	 * pause's ack, whoever waits or not */
	char migrate_to[TT_NAME_MAX + 1];
	/* what happened to it that a caller should know, e.g. "relaunched as
	 * generation 4 from its own layer after …: files kept, processes
	 * not" ("" = nothing); cleared by the next pause */
	char note[CPDB_ERR_MAX];
	/* paused because its worker stopped: the cp resumes it there as soon
	 * as that worker is up again ("" otherwise) */
	char resume_on[TT_NAME_MAX + 1];
	/* relaunches after lost executions within CPDB_RELAUNCH_WINDOW s of
	 * each other, and when the last one began */
	int64_t relaunches, relaunch_at;
	/* the CPU cap asked at create, in millicores (0: none asked, the
	 * worker's --cpu-millis applies); in every install of the sandbox */
	int64_t cpu;
};

#define CPDB_RELAUNCH_WINDOW 600

/* A complete snapshot, as a worker's pause ack described it. */
struct cp_snapshot {
	char sandbox[TT_SBX_ID_LEN + 1];
	uint64_t generation;
	char key[CPDB_SNAPKEY_MAX];
	int64_t size;
	char checksum[CPDB_CHECKSUM_MAX];
	int64_t created_at;
};

/* cpdb_open: opens (creating) the store and its schema: a PostgreSQL
 * connection URI ("postgresql://…" or "postgres://…"), else the path of
 * a SQLite file. Owner: the caller. */
struct cpdb *cpdb_open(const char *path, struct tt_err *err);
void cpdb_close(struct cpdb *db);
/* cpdb_is_url: path names a PostgreSQL database (cpdb_open). */
int cpdb_is_url(const char *path);
/* cpdb_backend: "sqlite" or "postgresql". */
const char *cpdb_backend(const struct cpdb *db);
/* cpdb_shared: several cp replicas may use this store at once. */
int cpdb_shared(const struct cpdb *db);

/* Telling the other replicas (PostgreSQL NOTIFY; nothing on SQLite):
 * cpdb_notify sends msg (at most 200 bytes) to every other replica;
 * cpdb_listen_fd is readable when one told us something (-1: none can);
 * cpdb_listen_read calls fn for each message. */
int cpdb_notify(struct cpdb *db, const char *msg, struct tt_err *err);
int cpdb_listen_fd(struct cpdb *db);
int cpdb_listen_read(struct cpdb *db, void (*fn)(const char *msg, void *arg),
                     void *arg, struct tt_err *err);

/* Idempotency of lifecycle calls (an Idempotency-Key the edge sends with
 * each one): cpdb_idem_arm makes the next create, destroy, pause or
 * resume write record, in its own transaction, what the call started
 * under (caller, key); cpdb_idem_disarm ends that (each call's end).
 * A call repeated with the same key (the edge failing over to another
 * replica after the first one died) finds the record and waits for the
 * operation it started instead of starting another. */
struct cpdb_idem {
	char op[16];                /* create|delete|pause|resume|migrate */
	char sandbox[TT_SBX_ID_LEN + 1];
	uint64_t generation;        /* what its waiter waits for */
	int64_t rev;                /* the update whose ack answers it */
	char worker[TT_NAME_MAX + 1]; /* whose ack */
	char target[TT_NAME_MAX + 1]; /* migrate: where to */
	int forced;
	uint64_t resumed_from;
	int64_t created_at;
};
void cpdb_idem_arm(struct cpdb *db, const char *caller, const char *key,
                   const char *op);
void cpdb_idem_disarm(struct cpdb *db);
/* cpdb_idem_get: 1 and *out, 0 when (caller, key) started nothing. */
int cpdb_idem_get(struct cpdb *db, const char *caller, const char *key,
                  struct cpdb_idem *out, struct tt_err *err);
/* cpdb_idem_prune: records made before `before` go. */
int cpdb_idem_prune(struct cpdb *db, int64_t before, struct tt_err *err);

/* cpdb_meta_claim: value is recorded under name unless another one is;
 * the one recorded comes back in out (cap bytes). */
int cpdb_meta_claim(struct cpdb *db, const char *name, const char *value,
                    char *out, size_t cap, struct tt_err *err);

/* Rebuilt-attempt leases (cp.c, cp_lease): sandbox id's execution (gen,
 * att) stays put until until_ms (unix ms) for every replica. */
int cpdb_lease_set(struct cpdb *db, const char *id, uint64_t gen,
                   uint32_t att, int64_t until_ms, struct tt_err *err);
/* cpdb_leased: 1 when that execution is leased at now_ms, else 0. */
int cpdb_leased(struct cpdb *db, const char *id, uint64_t gen, uint32_t att,
                int64_t now_ms, struct tt_err *err);

/* cpdb_key_hash: SHA-256 hex of an API key (what is stored). */
void cpdb_key_hash(const char *key, char out[CPDB_HASH_HEX + 1]);
int cpdb_apikey_add(struct cpdb *db, const char *key, const char *name,
                    int64_t now, struct tt_err *err);
/* cpdb_apikey_count: number of stored keys (0 on a fresh database). */
int cpdb_apikey_count(struct cpdb *db, int64_t *n, struct tt_err *err);
/* cpdb_apikey_lookup: 1 and the key's name if key is known, 0 if not. */
int cpdb_apikey_lookup(struct cpdb *db, const char *key, char *name,
                       size_t cap, struct tt_err *err);

int cpdb_worker_register(struct cpdb *db, const char *id, const char *url,
                         int64_t now, struct tt_err *err);
/* cpdb_worker_seen: last_seen = now; 0 if the worker is unknown. */
int cpdb_worker_seen(struct cpdb *db, const char *id, int64_t now,
                     struct tt_err *err);
/* cpdb_worker_get: 1 and *out, or 0 if unknown. */
int cpdb_worker_get(struct cpdb *db, const char *id, struct cp_worker *out,
                    struct tt_err *err);
/* cpdb_worker_drain: the worker stops in order from now (the first call
 * counts; cleared by register). */
int cpdb_worker_drain(struct cpdb *db, const char *id, int64_t now,
                      struct tt_err *err);
int cpdb_worker_set_acked(struct cpdb *db, const char *id, int64_t rev,
                          struct tt_err *err);
/* cpdb_batch_begin / cpdb_batch_end: one transaction (one commit, one
 * fsync) around plain single-statement calls (cpdb_sandbox_set_state,
 * cpdb_worker_acked_seen, reads); never around the functions that open
 * their own transaction. end commits when rc >= 0, else rolls back, and
 * returns rc (or -1 if the commit failed). */
int cpdb_batch_begin(struct cpdb *db, struct tt_err *err);
int cpdb_batch_end(struct cpdb *db, int rc, struct tt_err *err);
/* cpdb_worker_acked_seen: cpdb_worker_set_acked + cpdb_worker_seen in one
 * statement (one commit, one fsync, on the create path's ack). */
int cpdb_worker_acked_seen(struct cpdb *db, const char *id, int64_t rev,
                           int64_t now, struct tt_err *err);
/* cpdb_workers_each: calls fn for each worker, ordered by id. */
int cpdb_workers_each(struct cpdb *db,
                      void (*fn)(const struct cp_worker *, void *), void *arg,
                      struct tt_err *err);
/* cpdb_worker_load: sandboxes placed on worker and not deleted/failed. */
int cpdb_worker_load(struct cpdb *db, const char *id, int64_t *n,
                     struct tt_err *err);

/* cpdb_sandbox_create: in one transaction, inserts the sandbox (starting,
 * generation 1, substrate "ns", pod "", activation 1, its CPU cap cpu in
 * millicores, 0 = the worker's default) and its install feed update;
 * *rev is that update's rev. */
int cpdb_sandbox_create(struct cpdb *db, const char *id, const char *worker,
                        int64_t cpu, int64_t now, struct cp_sandbox *out,
                        int64_t *rev, struct tt_err *err);
/* cpdb_sandbox_create_on: cpdb_sandbox_create on substrate sst ("ns",
 * "microvm"), which every later execution of the sandbox keeps. */
int cpdb_sandbox_create_on(struct cpdb *db, const char *id, const char *worker,
                           const char *sst, int64_t cpu, int64_t now,
                           struct cp_sandbox *out, int64_t *rev, struct tt_err *err);
/* cpdb_generation_next: allocates the next generation of sandbox id in a
 * write transaction (for resume/migrate; deleted sandboxes keep counting). */
int cpdb_generation_next(struct cpdb *db, const char *id, uint64_t *gen,
                         struct tt_err *err);
/* cpdb_sandbox_get: 1 and *out, 0 if unknown. */
int cpdb_sandbox_get(struct cpdb *db, const char *id, struct cp_sandbox *out,
                     struct tt_err *err);
/* cpdb_sandboxes_each: every sandbox not deleted, oldest first. */
int cpdb_sandboxes_each(struct cpdb *db,
                        void (*fn)(const struct cp_sandbox *, void *),
                        void *arg, struct tt_err *err);
int cpdb_sandbox_set_state(struct cpdb *db, const char *id, const char *state,
                           const char *error, struct tt_err *err);
/* cpdb_sandbox_destroy: state deleting + destroy feed update (one
 * transaction); *rev is the update's rev. */
int cpdb_sandbox_destroy(struct cpdb *db, const struct cp_sandbox *s,
                         int64_t now, int64_t *rev, struct tt_err *err);

/* cpdb_sandbox_pause: CAS running(gen) -> pausing plus the pause update
 * {sandbox, generation, snapshot:"<sbx>/<gen>"} for the sandbox's worker,
 * in one transaction. 1 = won (*rev set), 0 = the sandbox was not in that
 * state any more (nothing changed), -1 = error. */
int cpdb_sandbox_pause(struct cpdb *db, const struct cp_sandbox *s,
                       const char *migrate_to, const char *resume_on,
                       int64_t now, int64_t *rev, struct tt_err *err);
/* cpdb_sandbox_migrate_clear: a paused sandbox whose migrate could not
 * go on stays paused, error set, its target dropped. */
int cpdb_sandbox_migrate_clear(struct cpdb *db, const char *id, uint64_t gen,
                               const char *error, struct tt_err *err);
/* cpdb_sandbox_paused: CAS pausing(gen, op_rev) -> paused and records the
 * snapshot (complete, per the worker's ack), in one transaction; older
 * snapshots are all kept (cpdb_snapshot_record prunes). 1/0/-1. */
int cpdb_sandbox_paused(struct cpdb *db, const char *id, uint64_t gen,
                        int64_t op_rev, const struct cp_snapshot *snap,
                        struct tt_err *err);

/* Snapshot retention (tetherd cp --keep-snapshots N): the newest complete
 * snapshot of a sandbox and N older ones are kept; the cp decides, the
 * worker that made the newest removes the store's files (a "prune"
 * update). */
#define CPDB_KEEP_DEFAULT 1  /* older snapshots kept by default */
#define CPDB_KEEP_MAX 64
/* What recording a complete snapshot changes. */
struct cpdb_record {
	const char *from;      /* "pausing": the pause's own ack; "failed": a
	                        * late one, after the pause had failed */
	uint64_t gen;          /* the sandbox's generation, the snapshot's */
	int64_t op_rev;        /* >= 0: the pending pause's rev must be this */
	unsigned keep_older;   /* older complete snapshots kept (<= KEEP_MAX) */
	const char *worker;    /* gets the prune update; NULL: no pruning */
	int64_t now;
};
/* cpdb_snapshot_record: in one transaction: CAS from(gen[, op_rev]) ->
 * paused (error cleared), the snapshot row, and, with r->worker, the rows
 * past the newest keep_older + 1 deleted and a prune update {sandbox,
 * generation: gen, keep: [the generations still recorded]} appended for
 * r->worker (*prune_rev): it removes the store's complete snapshots of
 * the sandbox below gen that are not kept, including any the cp never
 * recorded. 1 = recorded, 0 = the sandbox was not in that state (nothing
 * changed), -1 = error. */
int cpdb_snapshot_record(struct cpdb *db, const char *id, const struct cpdb_record *r,
                         const struct cp_snapshot *snap, int64_t *prune_rev,
                         struct tt_err *err);
/* cpdb_snapshot_gens: the generations with a recorded snapshot, newest
 * first (at most cap; *n of them). */
int cpdb_snapshot_gens(struct cpdb *db, const char *id, uint64_t *out, size_t cap,
                       size_t *n, struct tt_err *err);
/* cpdb_install_reask: appends the install up (a feed row, borrowed) again
 * for s's worker, marked "again": true, for an ack that covered it without
 * its result (node-api acknowledged what its manager applied after a
 * restart): the worker answers the new one from its record (already
 * running: ok; failed: tried again), instead of the install counting as
 * done. The sandbox waits for that rev (op_rev). 0 and *rev, or -1. */
int cpdb_install_reask(struct cpdb *db, const struct cp_sandbox *s, json_t *up,
                       int64_t now, int64_t *rev, struct tt_err *err);
/* cpdb_pause_reask: appends a pause of s's generation again for its worker
 * (body marked "again": true, so it is asked once more at most), for an
 * ack that covered the pause without its result: the worker answers from
 * the store. A sandbox still pausing then waits for that rev (op_rev; its
 * op_at, the bound on the whole pause, stays). 0 and *rev, or -1. */
int cpdb_pause_reask(struct cpdb *db, const struct cp_sandbox *s, int64_t now,
                     int64_t *rev, struct tt_err *err);
/* cpdb_sandbox_cas: CAS from(gen[, op_rev when >= 0]) -> to with error
 * (NULL clears); with retire_worker, also appends retire{sandbox, gen} for
 * that worker (*retire_rev). Clears op_rev and progress. 1/0/-1. */
int cpdb_sandbox_cas(struct cpdb *db, const char *id, const char *from,
                     uint64_t gen, int64_t op_rev, const char *to,
                     const char *error, const char *retire_worker,
                     int64_t now, int64_t *retire_rev, struct tt_err *err);

/* A resume: the sandbox must still be in state `from` with generation
 * `gen`; it becomes resuming with generation gen+1 on worker, and the
 * install update (with "snapshot": snapshot_key) is appended in the same
 * transaction. retire_worker (forced resume) also appends retire{sandbox,
 * gen} for the old worker first. A relaunch after a lost execution has no
 * snapshot_key (the worker starts it on its own layer, "from_layer") and
 * a note; reactivate keeps the generation and bumps the activation (the
 * same execution, re-activated in place). */
struct cpdb_resume {
	const char *from;
	uint64_t gen;
	const char *worker;
	const char *snapshot_key;  /* NULL: from the worker's own layer */
	const char *retire_worker; /* NULL: no retire */
	int reactivate;
	const char *note;          /* NULL: cleared */
};
/* cpdb_sandbox_resume: 1 = won (*new_gen, *rev = the install's rev,
 * *retire_rev when asked), 0 = lost the CAS, -1 = error. */
int cpdb_sandbox_resume(struct cpdb *db, const char *id,
                        const struct cpdb_resume *r, int64_t now,
                        uint64_t *new_gen, int64_t *rev, int64_t *retire_rev,
                        struct tt_err *err);
/* cpdb_sandbox_progress: pause progress, only while pausing under op_rev
 * (a late report of an older pause changes nothing). total < 0 = unknown.
 * 1/0/-1. */
int cpdb_sandbox_progress(struct cpdb *db, const char *id, int64_t op_rev,
                          int64_t bytes, int64_t total, struct tt_err *err);
/* cpdb_snapshot_latest: the newest complete snapshot of id (highest
 * generation): 1 and *out, 0 if none. */
int cpdb_snapshot_latest(struct cpdb *db, const char *id,
                         struct cp_snapshot *out, struct tt_err *err);

/* cpdb_cred_set: provisions worker id (replacing its credential, if any:
 * the old one is refused from then on). */
int cpdb_cred_set(struct cpdb *db, const char *id, const char *hash,
                  const char *url, int64_t now, struct tt_err *err);
/* cpdb_cred_revoke: 1 when id had a credential (now gone), 0 if not. */
int cpdb_cred_revoke(struct cpdb *db, const char *id, struct tt_err *err);
/* cpdb_cred_by_hash / cpdb_cred_get: 1 and *out, 0 when unknown. */
int cpdb_cred_by_hash(struct cpdb *db, const char *hash, struct cp_cred *out,
                      struct tt_err *err);
int cpdb_cred_get(struct cpdb *db, const char *id, struct cp_cred *out,
                  struct tt_err *err);
/* cpdb_worker_sent: a feed answer gave worker id revs up to rev. */
int cpdb_worker_sent(struct cpdb *db, const char *id, int64_t rev,
                     struct tt_err *err);

/* cpdb_feed_append: appends an update (body: the kind's own fields,
 * borrowed); worker NULL = for every worker. */
int cpdb_feed_append(struct cpdb *db, const char *kind, const char *worker,
                     json_t *body, int64_t now, int64_t *rev,
                     struct tt_err *err);
/* cpdb_feed_latest: highest rev (0 if empty). */
int cpdb_feed_latest(struct cpdb *db, int64_t *rev, struct tt_err *err);
/* cpdb_feed_prev: the rev of worker's update (its own or broadcast)
 * right before rev, 0 when there is none. */
int cpdb_feed_prev(struct cpdb *db, const char *worker, int64_t rev,
                   int64_t *prev, struct tt_err *err);
/* cpdb_feed_since: array of updates for worker with rev > after (at most
 * limit), each {"rev","kind","worker",...body}. New reference. */
json_t *cpdb_feed_since(struct cpdb *db, const char *worker, int64_t after,
                        int limit, struct tt_err *err);
/* cpdb_feed_get: one update's kind (cap bytes) and body (new reference);
 * 0 if there is no such rev. */
int cpdb_feed_get(struct cpdb *db, int64_t rev, char *kind, size_t cap,
                  json_t **body, struct tt_err *err);
/* cpdb_feed_last_body: body of the newest update of kind, or NULL (and
 * err->code TT_OK) if there is none. */
json_t *cpdb_feed_last_body(struct cpdb *db, const char *kind,
                            struct tt_err *err);

#endif

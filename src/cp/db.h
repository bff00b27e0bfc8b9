/* Control-plane state in SQLite (WAL, synchronous=FULL, foreign keys):
 * API keys (hashed), workers, sandboxes and the update feed. Generations
 * and feed revs are allocated inside write transactions and never reused,
 * also across restarts. Implementation: src/cp/db.c. */
#ifndef TT_CP_DB_H
#define TT_CP_DB_H

#include <stdint.h>

#include <jansson.h>

#include "claims.h"
#include "err.h"

#define CPDB_HASH_HEX 64 /* SHA-256 as lowercase hex */
#define CPDB_URL_MAX 256
#define CPDB_ERR_MAX 256

struct cpdb;

struct cp_worker {
	char id[TT_NAME_MAX + 1];
	char node_url[CPDB_URL_MAX];
	int64_t registered_at, last_seen, acked_rev;
};

struct cp_sandbox {
	char id[TT_SBX_ID_LEN + 1];
	char state[16];     /* starting|running|failed|deleting|deleted */
	uint64_t generation;
	char worker[TT_NAME_MAX + 1];
	char substrate[TT_NAME_MAX + 1];
	char pod[TT_NAME_MAX + 1];
	uint32_t activation;
	int64_t created_at;
	char error[CPDB_ERR_MAX];
};

/* cpdb_open: opens (creating) path and its schema. Owner: the caller. */
struct cpdb *cpdb_open(const char *path, struct tt_err *err);
void cpdb_close(struct cpdb *db);

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
int cpdb_worker_set_acked(struct cpdb *db, const char *id, int64_t rev,
                          struct tt_err *err);
/* cpdb_workers_each: calls fn for each worker, ordered by id. */
int cpdb_workers_each(struct cpdb *db,
                      void (*fn)(const struct cp_worker *, void *), void *arg,
                      struct tt_err *err);
/* cpdb_worker_load: sandboxes placed on worker and not deleted/failed. */
int cpdb_worker_load(struct cpdb *db, const char *id, int64_t *n,
                     struct tt_err *err);

/* cpdb_sandbox_create: in one transaction, inserts the sandbox (starting,
 * generation 1, substrate "ns", pod "", activation 1) and its install feed
 * update; *rev is that update's rev. */
int cpdb_sandbox_create(struct cpdb *db, const char *id, const char *worker,
                        int64_t now, struct cp_sandbox *out, int64_t *rev,
                        struct tt_err *err);
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

/* cpdb_feed_append: appends an update (body: the kind's own fields,
 * borrowed); worker NULL = for every worker. */
int cpdb_feed_append(struct cpdb *db, const char *kind, const char *worker,
                     json_t *body, int64_t now, int64_t *rev,
                     struct tt_err *err);
/* cpdb_feed_latest: highest rev (0 if empty). */
int cpdb_feed_latest(struct cpdb *db, int64_t *rev, struct tt_err *err);
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

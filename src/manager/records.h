/* The sbx-manager's durable runtime store (SPEC §4, §10): one SQLite file
 * <state>/runtime.db (WAL, synchronous=FULL) holding the executions this
 * worker installed, the verification key ring and the last applied feed
 * revision. Every mutator commits one transaction first and only then
 * updates the in-memory mirror that admission reads, so admission never sees
 * a record that is not durable (persist, then apply, then acknowledge).
 * Mutators take a feed revision: when rev > 0 the applied revision is moved
 * to rev in the same transaction. Implementation: src/manager/records.c. */
#ifndef TT_MANAGER_RECORDS_H
#define TT_MANAGER_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "claims.h"
#include "err.h"
#include "keyring.h"

#define RECORDS_MAX 4096 /* executions one worker may hold */

enum rec_state {
	REC_STARTING = 0, /* persisted before the sandbox starts */
	REC_RUNNING,      /* sandbox and bridge up */
	REC_FAILED,       /* install failed */
	REC_LOST,         /* init found dead (after a restart or an exit) */
	REC_STOPPED,      /* retired and stopped */
};

/* One execution as recorded on this worker. */
struct rec_exec {
	struct tt_identity id;
	bool retired;
	uint64_t epoch;          /* bumped on every replacement (SPEC §6) */
	enum rec_state state;
	uint32_t slot;           /* uid_base = 1000000 + 65536 * slot */
	pid_t init_pid;
	unsigned long long init_start;   /* /proc/<pid>/stat field 22 */
	pid_t bridge_pid;
	unsigned long long bridge_start;
	int64_t updated_at;      /* unix seconds */
	/* What a restarted manager proves to this execution's bridge to take
	 * over from its dead predecessor (lib/hello.h, "Adoption"); none
	 * for executions recorded before schema 2. */
	uint8_t adopt_key[32];
	bool has_adopt_key;
	/* The CPU cap its install asked, in millicores (0: none asked, the
	 * manager's --cpu-millis applied); schema 3. */
	uint32_t cpu_millis;
};

struct records;

/* records_open: opens (creating) the store at path and loads the mirror. */
int records_open(const char *path, struct records **out, struct tt_err *err);
void records_close(struct records *db);

/* records_put: inserts or replaces the record of e->id.sbx. */
int records_put(struct records *db, const struct rec_exec *e, uint64_t rev,
                struct tt_err *err);
/* records_get: the mirrored record of sbx, or NULL. Valid until the next
 * mutator call. */
const struct rec_exec *records_get(const struct records *db, const char *sbx);
/* records_retire: marks sbx retired if its record has generation gen;
 * returns 1 if it did, 0 if there was nothing to retire. If persisting
 * fails it returns -1 but the mirror is retired all the same (fail closed:
 * admission refuses the execution from then on). */
int records_retire(struct records *db, const char *sbx, uint64_t gen,
                   uint64_t rev, struct tt_err *err);
/* records_delete: removes sbx's record (absent is not an error). */
int records_delete(struct records *db, const char *sbx, uint64_t rev,
                   struct tt_err *err);
/* records_count / records_at: iterate the mirror (index order is stable
 * until the next mutator call). */
size_t records_count(const struct records *db);
const struct rec_exec *records_at(const struct records *db, size_t i);
/* records_free_slot: the lowest slot no record uses. */
uint32_t records_free_slot(const struct records *db);
/* records_free_slot_except: likewise, never except (a slot held outside the
 * records: a spare sandbox's; UINT32_MAX = none). */
uint32_t records_free_slot_except(const struct records *db, uint32_t except);

/* records_keys_replace: replaces the whole key ring. */
int records_keys_replace(struct records *db, const struct tt_keyring *kr,
                         uint64_t rev, struct tt_err *err);
/* records_keys: the mirrored key ring. */
const struct tt_keyring *records_keys(const struct records *db);

/* records_set_applied_rev: moves the applied revision alone (updates that
 * change nothing here, e.g. an install for another worker). */
int records_set_applied_rev(struct records *db, uint64_t rev,
                            struct tt_err *err);
uint64_t records_applied_rev(const struct records *db);

const char *rec_state_name(enum rec_state s);

#endif

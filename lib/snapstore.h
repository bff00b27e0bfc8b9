/* Snapshot store (SPEC §7): where paused sandboxes' snapshots live between
 * workers. An interface (a vtable of blob operations addressed by key
 * "<sandbox>/<generation>") so object storage can be added later; one
 * implementation today, "dir": a local directory shared by a local
 * cluster's workers. Implementation: lib/snapstore.c.
 *
 * Publication rule: a blob becomes visible only through put_commit, which
 * verifies its checksum first; only a complete snapshot (content plus its
 * metadata record) is ever listed, returned by snapstore_latest, or opened.
 * Readers verify the checksum again while reading: get_read fails at the
 * end of a blob whose bytes do not match.
 *
 * Dir layout: <root>/.partial/<random>        blob being written
 *             <root>/<sbx>/<gen>.snap         content
 *             <root>/<sbx>/<gen>.meta         JSON {generation, size,
 *                                             blake2b, created_at}: written
 *                                             last, atomically; it is the
 *                                             publication marker. */
#ifndef TT_SNAPSTORE_H
#define TT_SNAPSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "snapshot.h"

#define SNAPSTORE_HASH_LEN 32
#define SNAPSTORE_SBX_MAX  64   /* sandbox ids: [A-Za-z0-9_-], 1..64 chars */
#define SNAPSTORE_KEY_MAX  (SNAPSTORE_SBX_MAX + 1 + 20 + 1)

struct snapstore;
struct snapstore_put;   /* one blob being written (backend-defined) */
struct snapstore_get;   /* one blob being read (backend-defined) */

struct snapstore_info {
	uint64_t generation;
	uint64_t size;                       /* bytes of the blob */
	uint8_t blake2b[SNAPSTORE_HASH_LEN]; /* BLAKE2b-256 of the whole blob */
	int64_t created_at;                  /* unix seconds at commit */
	bool complete;                       /* published (metadata present) */
};

/* The backend vtable. Keys reaching a backend were validated by the
 * snapstore_* wrappers ("<sbx>/<gen>", gen >= 1, no leading zero). Every
 * int-returning op returns 0 or -1 with err. */
struct snapstore_ops {
	const char *name;
	/* Starts a blob; nothing is visible until put_commit. */
	int (*put_begin)(struct snapstore *s, const char *key,
	                 struct snapstore_put **out, struct tt_err *err);
	int (*put_write)(struct snapstore_put *p, const void *buf, size_t len,
	                 struct tt_err *err);
	/* Verifies the blob against expect (NULL: no expectation), makes it
	 * durable, then publishes it; a key already published is a
	 * TT_ERR_CONFLICT. Always consumes p (aborting it on failure). */
	int (*put_commit)(struct snapstore_put *p,
	                  const uint8_t expect[SNAPSTORE_HASH_LEN],
	                  struct snapstore_info *info, struct tt_err *err);
	/* Discards an unpublished blob; consumes p. */
	void (*put_abort)(struct snapstore_put *p);
	/* Opens a complete blob (TT_ERR_NOT_FOUND if none); info may be NULL. */
	int (*get_open)(struct snapstore *s, const char *key,
	                struct snapstore_get **out, struct snapstore_info *info,
	                struct tt_err *err);
	/* Up to len bytes; 0 at the end (after the checksum matched); -1. */
	ssize_t (*get_read)(struct snapstore_get *g, void *buf, size_t len,
	                    struct tt_err *err);
	void (*get_close)(struct snapstore_get *g);
	/* Complete blob: info with complete = true; content without its
	 * metadata: complete = false; nothing: TT_ERR_NOT_FOUND. */
	int (*stat)(struct snapstore *s, const char *key,
	            struct snapstore_info *info, struct tt_err *err);
	/* Generations of sbx with a complete snapshot, ascending; *gens is
	 * malloc'd (NULL when *n == 0), the caller frees it. */
	int (*list)(struct snapstore *s, const char *sbx, uint64_t **gens,
	            size_t *n, struct tt_err *err);
	/* Unpublishes then deletes; a missing key is success. */
	int (*remove)(struct snapstore *s, const char *key, struct tt_err *err);
	/* Deletes unfinished blobs untouched for older_than_s seconds. */
	int (*gc)(struct snapstore *s, int64_t older_than_s, unsigned *removed,
	          struct tt_err *err);
	void (*close)(struct snapstore *s);
};

/* Every backend's store begins with this. */
struct snapstore {
	const struct snapstore_ops *ops;
};

/* snapstore_dir_open: the "dir" backend rooted at root (created 0700 when
 * missing, with its .partial directory). Caller closes with
 * snapstore_close. */
int snapstore_dir_open(const char *root, struct snapstore **out,
                       struct tt_err *err);
/* snapstore_close: releases the store (NULL is fine). */
void snapstore_close(struct snapstore *s);

/* snapstore_sbx_valid: sandbox id charset and length check. */
bool snapstore_sbx_valid(const char *sbx);
/* snapstore_key: formats "<sbx>/<gen>"; -1 if sbx is invalid or gen is 0. */
int snapstore_key(char out[SNAPSTORE_KEY_MAX], const char *sbx, uint64_t gen,
                  struct tt_err *err);
/* snapstore_key_parse: the inverse, strict. sbx gets SNAPSTORE_SBX_MAX + 1. */
int snapstore_key_parse(const char *key, char *sbx, uint64_t *gen,
                        struct tt_err *err);

/* Wrappers over the vtable, by sandbox and generation. */
int snapstore_put_begin(struct snapstore *s, const char *sbx, uint64_t gen,
                        struct snapstore_put **out, struct tt_err *err);
int snapstore_put_write(struct snapstore *s, struct snapstore_put *p,
                        const void *buf, size_t len, struct tt_err *err);
int snapstore_put_commit(struct snapstore *s, struct snapstore_put *p,
                         const uint8_t expect[SNAPSTORE_HASH_LEN],
                         struct snapstore_info *info, struct tt_err *err);
void snapstore_put_abort(struct snapstore *s, struct snapstore_put *p);
int snapstore_get_open(struct snapstore *s, const char *sbx, uint64_t gen,
                       struct snapstore_get **out, struct snapstore_info *info,
                       struct tt_err *err);
ssize_t snapstore_get_read(struct snapstore *s, struct snapstore_get *g,
                           void *buf, size_t len, struct tt_err *err);
void snapstore_get_close(struct snapstore *s, struct snapstore_get *g);
int snapstore_stat(struct snapstore *s, const char *sbx, uint64_t gen,
                   struct snapstore_info *info, struct tt_err *err);
int snapstore_list(struct snapstore *s, const char *sbx, uint64_t **gens,
                   size_t *n, struct tt_err *err);
int snapstore_remove(struct snapstore *s, const char *sbx, uint64_t gen,
                     struct tt_err *err);
int snapstore_gc(struct snapstore *s, int64_t older_than_s, unsigned *removed,
                 struct tt_err *err);
/* snapstore_prune: removes every complete snapshot of sbx whose
 * generation is below `below` and not one of keep[0..nkeep) (generations
 * at or above `below` are never touched: a newer pause may be publishing
 * them); *removed (may be NULL) counts what went. -1 with the first error
 * (the other removals are still tried). */
int snapstore_prune(struct snapstore *s, const char *sbx, uint64_t below,
                    const uint64_t *keep, size_t nkeep, unsigned *removed,
                    struct tt_err *err);
/* snapstore_latest: the highest generation of sbx with a complete
 * snapshot; TT_ERR_NOT_FOUND when there is none. */
int snapstore_latest(struct snapstore *s, const char *sbx, uint64_t *gen,
                     struct tt_err *err);

/* snapstore_put_tree: packs the tree under src_dirfd straight into the
 * store as sbx/gen and publishes it (nothing is published on failure).
 * opts and st may be NULL. */
int snapstore_put_tree(struct snapstore *s, const char *sbx, uint64_t gen,
                       int src_dirfd, const struct snapshot_pack_opts *opts,
                       struct snapshot_stats *st, struct tt_err *err);
/* snapstore_get_tree: unpacks complete snapshot sbx/gen as
 * parent_dirfd/name (see snapshot_unpack: all or nothing). The progress
 * total defaults to the blob size. */
int snapstore_get_tree(struct snapstore *s, const char *sbx, uint64_t gen,
                       int parent_dirfd, const char *name,
                       const struct snapshot_unpack_opts *opts,
                       struct snapshot_stats *st, struct tt_err *err);

#endif

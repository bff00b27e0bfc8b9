/* Snapshot archives (SPEC §7): a streaming, bounded, versioned archive of a
 * directory tree (a sandbox's writable layer). Only regular files,
 * directories and symlinks are stored; everything else is skipped and
 * counted. Implementation: lib/snapshot.c.
 *
 * Format (all integers big-endian):
 *   header  "TTSNAP" u8 version(=1) u8 flags(=0)
 *   entry   u8 type  u8 0  u16 path_len  u32 mode(07777 bits)  u32 uid
 *           u32 gid  i64 mtime_sec  u32 mtime_nsec  u64 size
 *           path[path_len]  data[size]
 *           (file: content; symlink: target, stored as-is; dir: size 0)
 *   trailer u8 0xff  u8 0  u16 0  u64 entry_count  u64 data_bytes
 *           blake2b256[32] over every byte before it
 * The first entry is the root directory (type dir, empty path); then entries
 * in depth-first order: an entry's parent is the root or the most recent
 * directory entry still "open" (an ancestor of the previous entry). uid/gid
 * are relative to the sandbox's id base (< SNAPSHOT_ID_RANGE).
 *
 * The packer walks from a directory fd and never follows a symlink (the
 * tree is written by untrusted sandbox code). The unpacker creates
 * everything relative to a fresh temporary directory with *at() calls and
 * openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), and renames it into place
 * only after the trailer checksum verified: a bad archive leaves nothing. */
#ifndef TT_SNAPSHOT_H
#define TT_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

#define SNAPSHOT_VERSION  1
#define SNAPSHOT_HDR_LEN  8
#define SNAPSHOT_ENTRY_HDR_LEN 36
#define SNAPSHOT_TRAILER_LEN (4 + 16 + 32)
#define SNAPSHOT_HASH_LEN 32
#define SNAPSHOT_BUF_LEN  (64u * 1024u)  /* streaming buffers */
#define SNAPSHOT_ID_RANGE 65536u         /* ids stored relative to a base */
#define SNAPSHOT_NOBODY   65534u         /* stored for ids outside the range */

enum snapshot_type {
	SNAPSHOT_FILE = 1,
	SNAPSHOT_DIR = 2,
	SNAPSHOT_SYMLINK = 3,
	SNAPSHOT_END = 0xff,
};

/* Bounds for both sides; a zero field takes the default below. */
struct snapshot_limits {
	uint64_t max_entries;    /* default 1,000,000 */
	uint64_t max_entry_size; /* bytes per file; default 64 GiB */
	uint64_t max_total;      /* sum of file bytes; default 1 TiB */
	uint32_t max_path;       /* bytes of a relative path; default and max 4095 */
};
#define SNAPSHOT_DEF_MAX_ENTRIES    1000000ull
#define SNAPSHOT_DEF_MAX_ENTRY_SIZE (64ull << 30)
#define SNAPSHOT_DEF_MAX_TOTAL      (1ull << 40)
#define SNAPSHOT_MAX_PATH           4095u

/* Output sink: writes all len bytes or fails (0 / -1 with err). */
typedef int (*snapshot_write_fn)(void *ctx, const void *buf, size_t len,
                                 struct tt_err *err);
/* Input source: up to len bytes; returns the count, 0 at end, -1 with err. */
typedef ssize_t (*snapshot_read_fn)(void *ctx, void *buf, size_t len,
                                    struct tt_err *err);
/* Progress: stream bytes done so far, and the total (0 when unknown). */
typedef void (*snapshot_progress_fn)(void *ctx, uint64_t done, uint64_t total);

struct snapshot_stats {
	uint64_t entries;      /* including the root directory */
	uint64_t files, dirs, symlinks;
	uint64_t skipped;      /* sockets, fifos, devices (pack only) */
	uint64_t data_bytes;   /* file content bytes */
	uint64_t stream_bytes; /* whole archive, trailer included */
	uint8_t digest[SNAPSHOT_HASH_LEN]; /* the trailer's checksum */
};

struct snapshot_pack_opts {
	const struct snapshot_limits *limits; /* NULL = defaults */
	uid_t id_base;      /* stored uid = st_uid - id_base (gid likewise) when
	                     * within SNAPSHOT_ID_RANGE, else SNAPSHOT_NOBODY */
	gid_t gid_base;
	snapshot_progress_fn progress;
	void *progress_ctx;
	uint64_t total_hint; /* passed to progress as total (0 = unknown) */
};

struct snapshot_unpack_opts {
	const struct snapshot_limits *limits; /* NULL = defaults */
	bool chown;         /* chown entries to id_base + stored ids; without
	                     * it they belong to the caller and set-id bits are
	                     * dropped */
	uid_t id_base;
	gid_t gid_base;
	snapshot_progress_fn progress;
	void *progress_ctx;
	uint64_t total_hint; /* archive size if known (progress only) */
};

/* snapshot_pack: archives the tree under src_dirfd (not followed if it is a
 * symlink: pass a directory fd) into the sink. opts and st may be NULL. */
int snapshot_pack(int src_dirfd, snapshot_write_fn sink, void *sink_ctx,
                  const struct snapshot_pack_opts *opts,
                  struct snapshot_stats *st, struct tt_err *err);

/* snapshot_unpack: reads one archive from the source and creates it as
 * parent_dirfd/name, which must not exist or be an empty directory. The
 * archive must end exactly after its trailer. On any error nothing is left
 * behind (the temporary directory is removed). */
int snapshot_unpack(int parent_dirfd, const char *name,
                    snapshot_read_fn source, void *source_ctx,
                    const struct snapshot_unpack_opts *opts,
                    struct snapshot_stats *st, struct tt_err *err);

/* snapshot_write_fd / snapshot_read_fd: sink and source over a plain fd
 * (ctx points to an int). */
int snapshot_write_fd(void *ctx, const void *buf, size_t len,
                      struct tt_err *err);
ssize_t snapshot_read_fd(void *ctx, void *buf, size_t len, struct tt_err *err);

/* snapshot_rm_tree: removes dirfd/name and everything below it without
 * following symlinks; a missing name is success. */
int snapshot_rm_tree(int dirfd, const char *name, struct tt_err *err);

#endif

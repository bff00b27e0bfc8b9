/* Snapshot archives: pack a directory tree into a stream and unpack it.
 * The format is described in snapshot.h. Both directions stream through
 * 64 KiB buffers; memory does not grow with file sizes (the packer holds one
 * directory listing per level of the walk, the unpacker a small stack of
 * open directories). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sodium.h>

#include "cleanup.h"
#include "fsutil.h"
#include "snapshot.h"

static const uint8_t snap_magic[6] = { 'T', 'T', 'S', 'N', 'A', 'P' };

/* put_be16 / put_be32 / put_be64 / get_be*: big-endian integer codec. */
static void put_be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static void put_be64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint16_t get_be16(const uint8_t *p)
{
	return (uint16_t)((p[0] << 8) | p[1]);
}

static uint32_t get_be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
	       ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t get_be64(const uint8_t *p)
{
	return ((uint64_t)get_be32(p) << 32) | get_be32(p + 4);
}

/* limits_fill: the caller's limits with zero fields set to defaults. */
static void limits_fill(struct snapshot_limits *out,
                        const struct snapshot_limits *in)
{
	struct snapshot_limits l = { 0 };

	if (in != NULL)
		l = *in;
	if (l.max_entries == 0)
		l.max_entries = SNAPSHOT_DEF_MAX_ENTRIES;
	if (l.max_entry_size == 0)
		l.max_entry_size = SNAPSHOT_DEF_MAX_ENTRY_SIZE;
	if (l.max_total == 0)
		l.max_total = SNAPSHOT_DEF_MAX_TOTAL;
	if (l.max_path == 0 || l.max_path > SNAPSHOT_MAX_PATH)
		l.max_path = SNAPSHOT_MAX_PATH;
	*out = l;
}

/* open_beneath: opens rel under dirfd without crossing any symlink or
 * leaving dirfd (the tree belongs to untrusted code). */
static int open_beneath(int dirfd, const char *rel, int flags)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW),
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
		           RESOLVE_NO_MAGICLINKS,
	};

	return fsutil_openat2(dirfd, rel, &how);
}

/* snapshot_write_fd: sink over a plain fd; ctx points to the fd. */
int snapshot_write_fd(void *ctx, const void *buf, size_t len,
                      struct tt_err *err)
{
	if (fsutil_write_all(*(int *)ctx, buf, len) < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapshot write");
	return 0;
}

/* snapshot_read_fd: source over a plain fd; ctx points to the fd. */
ssize_t snapshot_read_fd(void *ctx, void *buf, size_t len, struct tt_err *err)
{
	int fd = *(int *)ctx;

	for (;;) {
		ssize_t n = read(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return tt_err_sys(err, TT_ERR_IO, "snapshot read");
		return n;
	}
}

/* ---- packing ---------------------------------------------------------- */

struct packer {
	snapshot_write_fn sink;
	void *sink_ctx;
	const struct snapshot_pack_opts *o;
	struct snapshot_limits lim;
	crypto_generichash_state h;
	uint8_t *buf;       /* output buffer, SNAPSHOT_BUF_LEN; owned */
	size_t len;
	uint8_t *io;        /* file read buffer, SNAPSHOT_BUF_LEN; owned */
	struct snapshot_stats st;
	int rootfd;
	char path[SNAPSHOT_MAX_PATH + 1]; /* current relative path */
	size_t plen;
};

/* pk_flush: hands the buffered bytes to the sink. */
static int pk_flush(struct packer *p, struct tt_err *err)
{
	if (p->len == 0)
		return 0;
	if (p->sink(p->sink_ctx, p->buf, p->len, err) < 0)
		return -1;
	p->st.stream_bytes += p->len;
	p->len = 0;
	if (p->o != NULL && p->o->progress != NULL)
		p->o->progress(p->o->progress_ctx, p->st.stream_bytes,
		               p->o->total_hint);
	return 0;
}

/* pk_put: appends bytes to the stream (hashed unless it is the digest). */
static int pk_put(struct packer *p, const void *data, size_t n, bool hash,
                  struct tt_err *err)
{
	const uint8_t *d = data;

	if (hash)
		crypto_generichash_update(&p->h, d, n);
	while (n > 0) {
		size_t k = SNAPSHOT_BUF_LEN - p->len;

		if (k > n)
			k = n;
		memcpy(p->buf + p->len, d, k);
		p->len += k;
		d += k;
		n -= k;
		if (p->len == SNAPSHOT_BUF_LEN && pk_flush(p, err) < 0)
			return -1;
	}
	return 0;
}

/* pk_id: an owner id relative to the base, or nobody when outside. */
static uint32_t pk_id(uint64_t id, uint64_t base)
{
	if (id >= base && id - base < SNAPSHOT_ID_RANGE)
		return (uint32_t)(id - base);
	return SNAPSHOT_NOBODY;
}

/* pk_entry: writes one entry header plus the current path. */
static int pk_entry(struct packer *p, enum snapshot_type type,
                    const struct stat *sb, uint64_t size, struct tt_err *err)
{
	uint8_t h[SNAPSHOT_ENTRY_HDR_LEN] = { 0 };
	uint64_t ub = p->o != NULL ? p->o->id_base : 0;
	uint64_t gb = p->o != NULL ? p->o->gid_base : 0;

	if (p->st.entries + 1 > p->lim.max_entries)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "snapshot: more than %llu entries",
		                  (unsigned long long)p->lim.max_entries);
	if (type == SNAPSHOT_FILE &&
	    (size > p->lim.max_entry_size ||
	     p->st.data_bytes + size > p->lim.max_total))
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "snapshot: %s is too large", p->path);
	h[0] = (uint8_t)type;
	put_be16(h + 2, (uint16_t)p->plen);
	put_be32(h + 4, (uint32_t)(sb->st_mode & 07777));
	put_be32(h + 8, pk_id(sb->st_uid, ub));
	put_be32(h + 12, pk_id(sb->st_gid, gb));
	put_be64(h + 16, (uint64_t)(int64_t)sb->st_mtim.tv_sec);
	put_be32(h + 24, (uint32_t)sb->st_mtim.tv_nsec);
	put_be64(h + 28, size);
	if (pk_put(p, h, sizeof(h), true, err) < 0 ||
	    pk_put(p, p->path, p->plen, true, err) < 0)
		return -1;
	p->st.entries++;
	if (type == SNAPSHOT_FILE) {
		p->st.files++;
		p->st.data_bytes += size;
	} else if (type == SNAPSHOT_DIR) {
		p->st.dirs++;
	} else {
		p->st.symlinks++;
	}
	return 0;
}

/* pk_file: one regular file, opened without following a symlink; exactly
 * the size seen at open time is stored. */
static int pk_file(struct packer *p, int dfd, const char *name,
                   const struct stat *lsb, struct tt_err *err)
{
	_cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW |
	                                O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	struct stat sb;
	uint64_t left;

	if (fd < 0) {
		if (errno == ENOENT || errno == ELOOP || errno == ENXIO) {
			p->st.skipped++; /* vanished or replaced meanwhile */
			return 0;
		}
		return tt_err_sys(err, TT_ERR_IO, "snapshot: open %s", p->path);
	}
	if (fstat(fd, &sb) < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapshot: stat %s", p->path);
	if (!S_ISREG(sb.st_mode) || sb.st_ino != lsb->st_ino ||
	    sb.st_dev != lsb->st_dev) {
		p->st.skipped++;
		return 0;
	}
	if (pk_entry(p, SNAPSHOT_FILE, &sb, (uint64_t)sb.st_size, err) < 0)
		return -1;
	left = (uint64_t)sb.st_size;
	while (left > 0) {
		size_t want = left < SNAPSHOT_BUF_LEN ? (size_t)left : SNAPSHOT_BUF_LEN;
		ssize_t n = read(fd, p->io, want);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return tt_err_sys(err, TT_ERR_IO, "snapshot: read %s", p->path);
		if (n == 0)
			return tt_err_set(err, TT_ERR_CONFLICT,
			                  "snapshot: %s shrank while being read", p->path);
		if (pk_put(p, p->io, (size_t)n, true, err) < 0)
			return -1;
		left -= (uint64_t)n;
	}
	return 0;
}

/* pk_symlink: one symlink, its target stored as-is (never followed). */
static int pk_symlink(struct packer *p, int dfd, const char *name,
                      const struct stat *sb, struct tt_err *err)
{
	char target[SNAPSHOT_MAX_PATH + 1];
	ssize_t n = readlinkat(dfd, name, target, sizeof(target));

	if (n < 0) {
		if (errno == ENOENT || errno == EINVAL) {
			p->st.skipped++;
			return 0;
		}
		return tt_err_sys(err, TT_ERR_IO, "snapshot: readlink %s", p->path);
	}
	if (n == 0 || (size_t)n > SNAPSHOT_MAX_PATH)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "snapshot: symlink target of %s too long", p->path);
	if (pk_entry(p, SNAPSHOT_SYMLINK, sb, (uint64_t)n, err) < 0)
		return -1;
	return pk_put(p, target, (size_t)n, true, err);
}

/* pk_path_push: appends "/name" (or "name" at the root) to the path;
 * returns the previous length to restore, or -1 when too long. */
static ssize_t pk_path_push(struct packer *p, const char *name,
                            struct tt_err *err)
{
	size_t old = p->plen, nl = strlen(name);
	size_t need = old + (old > 0) + nl;

	if (need > p->lim.max_path)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "snapshot: path longer than %u bytes under %s",
		                  p->lim.max_path, old > 0 ? p->path : ".");
	if (old > 0)
		p->path[p->plen++] = '/';
	memcpy(p->path + p->plen, name, nl);
	p->plen += nl;
	p->path[p->plen] = '\0';
	return (ssize_t)old;
}

/* pk_path_pop: restores the path to a previous length. */
static void pk_path_pop(struct packer *p, size_t old)
{
	p->plen = old;
	p->path[old] = '\0';
}

/* cmp_name: qsort order for char * names (sorted: reproducible archives). */
static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* free_names: frees a names array and every name in it. */
static void free_names(char **names, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

/* list_dir: the sorted names in a directory (without "." and ".."); the
 * caller owns the array and the strings. */
static int list_dir(int dfd, char ***out, size_t *count, struct tt_err *err)
{
	int fd = dup(dfd);
	DIR *d;
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;

	if (fd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "snapshot: dup");
	d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return tt_err_sys(err, TT_ERR_SYS, "snapshot: fdopendir");
	}
	errno = 0;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			char **nn = realloc(names, nc * sizeof(*nn));

			if (nn == NULL)
				goto nomem;
			names = nn;
			cap = nc;
		}
		names[n] = strdup(de->d_name);
		if (names[n] == NULL)
			goto nomem;
		n++;
		errno = 0;
	}
	if (errno != 0) {
		tt_err_sys(err, TT_ERR_IO, "snapshot: readdir");
		closedir(d);
		free_names(names, n);
		return -1;
	}
	closedir(d);
	if (n > 1)
		qsort(names, n, sizeof(*names), cmp_name);
	*out = names;
	*count = n;
	return 0;
nomem:
	closedir(d);
	free_names(names, n);
	return tt_err_set(err, TT_ERR_NOMEM, "snapshot: out of memory");
}

/* pk_dir: the directory at p->path (relative to the root, "" = root): its
 * entry, its non-directory children, then each subdirectory in turn. Only
 * one directory fd is open at a time; subdirectories are reopened from the
 * root with openat2 so a directory swapped for a symlink is never
 * followed. */
static int pk_dir(struct packer *p, struct tt_err *err)
{
	_cleanup_close_ int dfd = -1;
	char **names = NULL;
	size_t n = 0, ndirs = 0;
	struct stat sb;
	int rc = -1;

	dfd = p->plen == 0 ? openat(p->rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
	                   : open_beneath(p->rootfd, p->path, O_RDONLY | O_DIRECTORY);
	if (dfd < 0) {
		if (p->plen > 0 && (errno == ELOOP || errno == ENOTDIR ||
		                    errno == ENOENT || errno == EXDEV)) {
			p->st.skipped++; /* replaced while we walked: not followed */
			return 0;
		}
		return tt_err_sys(err, TT_ERR_IO, "snapshot: open dir %s",
		                  p->plen ? p->path : ".");
	}
	if (fstat(dfd, &sb) < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapshot: stat %s", p->path);
	if (pk_entry(p, SNAPSHOT_DIR, &sb, 0, err) < 0 ||
	    list_dir(dfd, &names, &n, err) < 0)
		return -1;
	/* Non-directories first, with this fd; directory names are compacted
	 * to the front of the array for the second pass. */
	for (size_t i = 0; i < n; i++) {
		struct stat lsb;
		ssize_t old = pk_path_push(p, names[i], err);
		int r = 0;

		if (old < 0)
			goto out;
		if (fstatat(dfd, names[i], &lsb, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT) {
				tt_err_sys(err, TT_ERR_IO, "snapshot: stat %s", p->path);
				goto out;
			}
			p->st.skipped++;
		} else if (S_ISDIR(lsb.st_mode)) {
			char *keep = names[i];

			names[i] = names[ndirs];
			names[ndirs++] = keep;
		} else if (S_ISREG(lsb.st_mode)) {
			r = pk_file(p, dfd, names[i], &lsb, err);
		} else if (S_ISLNK(lsb.st_mode)) {
			r = pk_symlink(p, dfd, names[i], &lsb, err);
		} else {
			p->st.skipped++; /* socket, fifo, device: not stored */
		}
		pk_path_pop(p, (size_t)old);
		if (r < 0)
			goto out;
	}
	close(tt_steal_fd(&dfd));
	/* Swapping moved names around; restore order for reproducibility. */
	if (ndirs > 1)
		qsort(names, ndirs, sizeof(*names), cmp_name);
	for (size_t i = 0; i < ndirs; i++) {
		ssize_t old = pk_path_push(p, names[i], err);
		int r;

		if (old < 0)
			goto out;
		r = pk_dir(p, err);
		pk_path_pop(p, (size_t)old);
		if (r < 0)
			goto out;
	}
	rc = 0;
out:
	free_names(names, n);
	return rc;
}

/* snapshot_pack: header, the walk, trailer with the checksum. */
int snapshot_pack(int src_dirfd, snapshot_write_fn sink, void *sink_ctx,
                  const struct snapshot_pack_opts *opts,
                  struct snapshot_stats *st, struct tt_err *err)
{
	struct packer *p;
	uint8_t hdr[SNAPSHOT_HDR_LEN], tr[SNAPSHOT_TRAILER_LEN - SNAPSHOT_HASH_LEN];
	uint8_t digest[SNAPSHOT_HASH_LEN];
	int rc = -1;

	if (sink == NULL || src_dirfd < 0)
		return tt_err_set(err, TT_ERR_INVALID, "snapshot_pack: bad arguments");
	if (sodium_init() < 0)
		return tt_err_set(err, TT_ERR_SYS, "snapshot: sodium_init failed");
	p = calloc(1, sizeof(*p)); /* owned here; path buffer is 4 KiB */
	if (p == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "snapshot: out of memory");
	p->buf = malloc(SNAPSHOT_BUF_LEN);
	p->io = malloc(SNAPSHOT_BUF_LEN);
	if (p->buf == NULL || p->io == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "snapshot: out of memory");
		goto out;
	}
	p->sink = sink;
	p->sink_ctx = sink_ctx;
	p->o = opts;
	p->rootfd = src_dirfd;
	limits_fill(&p->lim, opts != NULL ? opts->limits : NULL);
	crypto_generichash_init(&p->h, NULL, 0, SNAPSHOT_HASH_LEN);
	memcpy(hdr, snap_magic, sizeof(snap_magic));
	hdr[6] = SNAPSHOT_VERSION;
	hdr[7] = 0;
	if (pk_put(p, hdr, sizeof(hdr), true, err) < 0 || pk_dir(p, err) < 0)
		goto out;
	memset(tr, 0, sizeof(tr));
	tr[0] = SNAPSHOT_END;
	put_be64(tr + 4, p->st.entries);
	put_be64(tr + 12, p->st.data_bytes);
	if (pk_put(p, tr, sizeof(tr), true, err) < 0)
		goto out;
	crypto_generichash_final(&p->h, digest, sizeof(digest));
	if (pk_put(p, digest, sizeof(digest), false, err) < 0 ||
	    pk_flush(p, err) < 0)
		goto out;
	memcpy(p->st.digest, digest, sizeof(digest));
	if (st != NULL)
		*st = p->st;
	rc = 0;
out:
	free(p->buf);
	free(p->io);
	free(p);
	return rc;
}

/* ---- unpacking -------------------------------------------------------- */

/* One directory still open for children; its metadata is applied when the
 * stream leaves it (so children can be created and its mtime sticks). */
struct up_level {
	uint32_t len;       /* its path is unpacker.path[0..len) */
	uint32_t mode, uid, gid, nsec;
	int64_t sec;
};

struct unpacker {
	snapshot_read_fn src;
	void *src_ctx;
	const struct snapshot_unpack_opts *o;
	struct snapshot_limits lim;
	crypto_generichash_state h;
	uint8_t *buf;       /* input buffer, SNAPSHOT_BUF_LEN; owned */
	size_t pos, len;
	uint64_t consumed, reported;
	struct snapshot_stats st;
	int tmpfd;          /* the temporary root, owned by snapshot_unpack */
	char path[SNAPSHOT_MAX_PATH + 1]; /* path of the top directory */
	char ent[SNAPSHOT_MAX_PATH + 1];  /* path of the current entry */
	char scratch[SNAPSHOT_MAX_PATH + 1];
	struct up_level *stack; /* SNAPSHOT_MAX_PATH / 2 + 2 levels; owned */
	size_t depth;
};
#define UP_MAX_DEPTH (SNAPSHOT_MAX_PATH / 2 + 2)

/* up_avail: makes at least one byte available; 0, or -1 at a truncated
 * end (with err) or on a read error. */
static int up_avail(struct unpacker *u, struct tt_err *err)
{
	while (u->pos == u->len) {
		ssize_t n = u->src(u->src_ctx, u->buf, SNAPSHOT_BUF_LEN, err);

		if (n < 0)
			return -1;
		if (n == 0)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "snapshot: truncated archive");
		if ((size_t)n > SNAPSHOT_BUF_LEN)
			return tt_err_set(err, TT_ERR_IO, "snapshot: source overran");
		u->pos = 0;
		u->len = (size_t)n;
	}
	return 0;
}

/* up_take: up to max bytes of the stream, in place; *got is their count. */
static const uint8_t *up_take(struct unpacker *u, size_t max, size_t *got,
                              bool hash, struct tt_err *err)
{
	const uint8_t *p;
	size_t n;

	if (up_avail(u, err) < 0)
		return NULL;
	n = u->len - u->pos;
	if (n > max)
		n = max;
	p = u->buf + u->pos;
	u->pos += n;
	u->consumed += n;
	if (hash)
		crypto_generichash_update(&u->h, p, n);
	/* Progress at most every 64 KiB (and once at the end, in up_run). */
	if (u->o != NULL && u->o->progress != NULL &&
	    u->consumed - u->reported >= SNAPSHOT_BUF_LEN) {
		u->reported = u->consumed;
		u->o->progress(u->o->progress_ctx, u->consumed, u->o->total_hint);
	}
	*got = n;
	return p;
}

/* up_read: exactly n bytes into dst. */
static int up_read(struct unpacker *u, void *dst, size_t n, bool hash,
                   struct tt_err *err)
{
	uint8_t *d = dst;

	while (n > 0) {
		size_t got;
		const uint8_t *p = up_take(u, n, &got, hash, err);

		if (p == NULL)
			return -1;
		memcpy(d, p, got);
		d += got;
		n -= got;
	}
	return 0;
}

/* path_valid: a relative path of clean components: no empty, ".", ".."
 * component, no NUL, each at most NAME_MAX bytes. */
static bool path_valid(const char *p, size_t n)
{
	size_t comp = 0;

	if (n == 0 || p[0] == '/' || p[n - 1] == '/')
		return false;
	for (size_t i = 0; i <= n; i++) {
		if (i == n || p[i] == '/') {
			const char *c = p + i - comp;

			if (comp == 0 || comp > NAME_MAX ||
			    (comp == 1 && c[0] == '.') ||
			    (comp == 2 && c[0] == '.' && c[1] == '.'))
				return false;
			comp = 0;
		} else if (p[i] == '\0') {
			return false;
		} else {
			comp++;
		}
	}
	return true;
}

/* up_meta: applies owner, mode and times to an fd (or, for symlinks, to
 * dfd/name without following). Owner first: chown clears set-id bits. */
static int up_meta(struct unpacker *u, int fd, int dfd, const char *name,
                   uint32_t mode, uint32_t uid, uint32_t gid, int64_t sec,
                   uint32_t nsec, struct tt_err *err)
{
	struct timespec ts[2] = { { .tv_sec = sec, .tv_nsec = nsec },
	                          { .tv_sec = sec, .tv_nsec = nsec } };
	bool own = u->o != NULL && u->o->chown;

	if (own) {
		/* Privileged: give the restored tree to the sandbox's mapped ids
		 * (the caller is the root-owned sandbox manager). */
		uid_t nu = (uid_t)(u->o->id_base + uid);
		gid_t ng = (gid_t)(u->o->gid_base + gid);
		int r = fd >= 0 ? fchown(fd, nu, ng)
		                : fchownat(dfd, name, nu, ng, AT_SYMLINK_NOFOLLOW);

		if (r < 0)
			return tt_err_sys(err, TT_ERR_SYS, "snapshot: chown %s", u->ent);
	} else {
		mode &= ~(uint32_t)(S_ISUID | S_ISGID); /* not ours to grant */
	}
	if (fd >= 0) {
		if (fchmod(fd, (mode_t)mode) < 0 || futimens(fd, ts) < 0)
			return tt_err_sys(err, TT_ERR_SYS, "snapshot: set mode/time");
	} else if (utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0) {
		return tt_err_sys(err, TT_ERR_SYS, "snapshot: set symlink time");
	}
	return 0;
}

/* up_pop: leaves the top directory, applying its metadata. */
static int up_pop(struct unpacker *u, struct tt_err *err)
{
	struct up_level *l = &u->stack[--u->depth];
	_cleanup_close_ int fd = -1;

	if (l->len == 0) {
		fd = dup(u->tmpfd);
	} else {
		memcpy(u->scratch, u->path, l->len);
		u->scratch[l->len] = '\0';
		fd = open_beneath(u->tmpfd, u->scratch, O_RDONLY | O_DIRECTORY);
	}
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "snapshot: reopen directory");
	return up_meta(u, fd, -1, NULL, l->mode, l->uid, l->gid, l->sec,
	               l->nsec, err);
}

/* up_file_data: streams size bytes of content into fd. */
static int up_file_data(struct unpacker *u, int fd, uint64_t size,
                        struct tt_err *err)
{
	while (size > 0) {
		size_t got;
		const uint8_t *p = up_take(u, size < SNAPSHOT_BUF_LEN ? (size_t)size
		                                                      : SNAPSHOT_BUF_LEN,
		                           &got, true, err);

		if (p == NULL)
			return -1;
		size -= got;
		while (got > 0) {
			ssize_t n = write(fd, p, got);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return tt_err_sys(err, TT_ERR_IO, "snapshot: write %s", u->ent);
			p += n;
			got -= (size_t)n;
		}
	}
	return 0;
}

/* up_entry: one entry after its 4 first header bytes h[0..4). */
static int up_entry(struct unpacker *u, uint8_t *h, struct tt_err *err)
{
	uint8_t type = h[0];
	uint16_t plen = get_be16(h + 2);
	uint32_t mode, uid, gid, nsec;
	int64_t sec;
	uint64_t size;
	const char *name;
	size_t parent_len;
	_cleanup_close_ int pfd = -1;

	if (up_read(u, h + 4, SNAPSHOT_ENTRY_HDR_LEN - 4, true, err) < 0)
		return -1;
	mode = get_be32(h + 4);
	uid = get_be32(h + 8);
	gid = get_be32(h + 12);
	sec = (int64_t)get_be64(h + 16);
	nsec = get_be32(h + 24);
	size = get_be64(h + 28);
	if (h[1] != 0 || (mode & ~07777u) != 0 || uid >= SNAPSHOT_ID_RANGE ||
	    gid >= SNAPSHOT_ID_RANGE || nsec >= 1000000000u)
		return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: bad entry header");
	if (type != SNAPSHOT_FILE && type != SNAPSHOT_DIR && type != SNAPSHOT_SYMLINK)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "snapshot: unknown entry type %u", type);
	if (u->st.entries + 1 > u->lim.max_entries)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "snapshot: too many entries");
	if (plen > u->lim.max_path)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "snapshot: path too long");
	if ((type == SNAPSHOT_DIR && size != 0) ||
	    (type == SNAPSHOT_SYMLINK && (size == 0 || size > SNAPSHOT_MAX_PATH)))
		return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: bad entry size");
	if (type == SNAPSHOT_FILE &&
	    (size > u->lim.max_entry_size ||
	     size > u->lim.max_total - u->st.data_bytes))
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "snapshot: entry of %llu bytes over the limit",
		                  (unsigned long long)size);
	if (up_read(u, u->ent, plen, true, err) < 0)
		return -1;
	u->ent[plen] = '\0';

	/* The root directory comes first, once, with an empty path. */
	if (u->st.entries == 0) {
		if (type != SNAPSHOT_DIR || plen != 0)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "snapshot: archive does not start with its root");
		u->stack[0] = (struct up_level){ .len = 0, .mode = mode, .uid = uid,
		                                 .gid = gid, .sec = sec, .nsec = nsec };
		u->depth = 1;
		u->st.entries++;
		u->st.dirs++;
		return 0;
	}
	if (!path_valid(u->ent, plen))
		return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: unsafe path \"%.*s\"",
		                  (int)(plen > 64 ? 64 : plen), u->ent);
	name = strrchr(u->ent, '/');
	parent_len = name == NULL ? 0 : (size_t)(name - u->ent);
	name = name == NULL ? u->ent : name + 1;
	/* Depth-first order: the parent must be an open directory; leaving a
	 * directory finalises it. */
	while (u->depth > 1 &&
	       !(u->stack[u->depth - 1].len == parent_len &&
	         memcmp(u->path, u->ent, parent_len) == 0))
		if (up_pop(u, err) < 0)
			return -1;
	if (u->stack[u->depth - 1].len != parent_len)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "snapshot: entry \"%.64s\" outside its directory", u->ent);
	if (parent_len == 0) {
		pfd = dup(u->tmpfd);
	} else {
		memcpy(u->scratch, u->ent, parent_len);
		u->scratch[parent_len] = '\0';
		pfd = open_beneath(u->tmpfd, u->scratch, O_RDONLY | O_DIRECTORY);
	}
	if (pfd < 0)
		return tt_err_sys(err, TT_ERR_MALFORMED,
		                  "snapshot: parent of \"%.64s\"", u->ent);

	if (type == SNAPSHOT_DIR) {
		if (u->depth >= UP_MAX_DEPTH)
			return tt_err_set(err, TT_ERR_TOO_LARGE, "snapshot: too deep");
		if (mkdirat(pfd, name, 0700) < 0)
			return tt_err_sys(err, TT_ERR_MALFORMED, "snapshot: mkdir \"%.64s\"",
			                  u->ent);
		memcpy(u->path, u->ent, plen);
		u->stack[u->depth++] = (struct up_level){ .len = plen, .mode = mode,
		                                          .uid = uid, .gid = gid,
		                                          .sec = sec, .nsec = nsec };
		u->st.dirs++;
	} else if (type == SNAPSHOT_FILE) {
		_cleanup_close_ int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL |
		                                O_NOFOLLOW | O_CLOEXEC, 0600);

		if (fd < 0)
			return tt_err_sys(err, TT_ERR_MALFORMED, "snapshot: create \"%.64s\"",
			                  u->ent);
		if (up_file_data(u, fd, size, err) < 0 ||
		    up_meta(u, fd, -1, NULL, mode, uid, gid, sec, nsec, err) < 0)
			return -1;
		u->st.files++;
		u->st.data_bytes += size;
	} else {
		char target[SNAPSHOT_MAX_PATH + 1];

		if (up_read(u, target, (size_t)size, true, err) < 0)
			return -1;
		target[size] = '\0';
		if (memchr(target, '\0', (size_t)size) != NULL)
			return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: NUL in link target");
		/* The target is stored verbatim and never resolved here. */
		if (symlinkat(target, pfd, name) < 0)
			return tt_err_sys(err, TT_ERR_MALFORMED, "snapshot: symlink \"%.64s\"",
			                  u->ent);
		if (up_meta(u, -1, pfd, name, mode, uid, gid, sec, nsec, err) < 0)
			return -1;
		u->st.symlinks++;
	}
	u->st.entries++;
	return 0;
}

/* up_run: the whole stream into u->tmpfd; 0 once the checksum verified. */
static int up_run(struct unpacker *u, struct tt_err *err)
{
	uint8_t h[SNAPSHOT_ENTRY_HDR_LEN], digest[SNAPSHOT_HASH_LEN];
	uint8_t want[SNAPSHOT_HASH_LEN];

	if (up_read(u, h, SNAPSHOT_HDR_LEN, true, err) < 0)
		return -1;
	if (memcmp(h, snap_magic, sizeof(snap_magic)) != 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: bad magic");
	if (h[6] != SNAPSHOT_VERSION || h[7] != 0)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "snapshot: unsupported version %u", h[6]);
	for (;;) {
		if (up_read(u, h, 4, true, err) < 0)
			return -1;
		if (h[0] == SNAPSHOT_END)
			break;
		if (up_entry(u, h, err) < 0)
			return -1;
	}
	if (up_read(u, h + 4, 16, true, err) < 0)
		return -1;
	if (h[1] != 0 || get_be16(h + 2) != 0 || u->st.entries == 0 ||
	    get_be64(h + 4) != u->st.entries || get_be64(h + 12) != u->st.data_bytes)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "snapshot: trailer does not match the entries");
	crypto_generichash_final(&u->h, digest, sizeof(digest));
	if (up_read(u, want, sizeof(want), false, err) < 0)
		return -1;
	if (sodium_memcmp(digest, want, sizeof(want)) != 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: checksum mismatch");
	/* Nothing may follow the trailer. */
	if (u->pos < u->len)
		return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: bytes after trailer");
	for (;;) {
		ssize_t n = u->src(u->src_ctx, u->buf, SNAPSHOT_BUF_LEN, err);

		if (n < 0)
			return -1;
		if (n == 0)
			break;
		return tt_err_set(err, TT_ERR_MALFORMED, "snapshot: bytes after trailer");
	}
	while (u->depth > 0)
		if (up_pop(u, err) < 0)
			return -1;
	memcpy(u->st.digest, digest, sizeof(digest));
	u->st.stream_bytes = u->consumed;
	if (u->o != NULL && u->o->progress != NULL)
		u->o->progress(u->o->progress_ctx, u->consumed, u->o->total_hint);
	return 0;
}

/* snapshot_unpack: into a fresh hidden directory next to the target, then
 * renamed into place once everything verified. */
int snapshot_unpack(int parent_dirfd, const char *name,
                    snapshot_read_fn source, void *source_ctx,
                    const struct snapshot_unpack_opts *opts,
                    struct snapshot_stats *st, struct tt_err *err)
{
	struct unpacker *u;
	char tmp[NAME_MAX + 1];
	unsigned char rnd[8];
	int rc = -1;

	if (source == NULL || name == NULL || strchr(name, '/') != NULL ||
	    !path_valid(name, strlen(name)) || strlen(name) > NAME_MAX - 30)
		return tt_err_set(err, TT_ERR_INVALID, "snapshot_unpack: bad target name");
	if (sodium_init() < 0)
		return tt_err_set(err, TT_ERR_SYS, "snapshot: sodium_init failed");
	randombytes_buf(rnd, sizeof(rnd));
	snprintf(tmp, sizeof(tmp), ".%s.unpack-%02x%02x%02x%02x%02x%02x%02x%02x",
	         name, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	if (mkdirat(parent_dirfd, tmp, 0700) < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapshot: mkdir %s", tmp);
	u = calloc(1, sizeof(*u)); /* owned here */
	if (u == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "snapshot: out of memory");
		goto out_rm;
	}
	u->tmpfd = -1;
	u->buf = malloc(SNAPSHOT_BUF_LEN);
	u->stack = calloc(UP_MAX_DEPTH, sizeof(*u->stack));
	if (u->buf == NULL || u->stack == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "snapshot: out of memory");
		goto out;
	}
	u->src = source;
	u->src_ctx = source_ctx;
	u->o = opts;
	limits_fill(&u->lim, opts != NULL ? opts->limits : NULL);
	crypto_generichash_init(&u->h, NULL, 0, SNAPSHOT_HASH_LEN);
	u->tmpfd = openat(parent_dirfd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
	                  O_CLOEXEC);
	if (u->tmpfd < 0) {
		tt_err_sys(err, TT_ERR_IO, "snapshot: open %s", tmp);
		goto out;
	}
	if (up_run(u, err) < 0)
		goto out;
	/* Publish: into a missing name, or over an empty directory. */
	if (renameat2(parent_dirfd, tmp, parent_dirfd, name, RENAME_NOREPLACE) < 0 &&
	    (errno != EEXIST || renameat(parent_dirfd, tmp, parent_dirfd, name) < 0)) {
		tt_err_sys(err, errno == ENOTEMPTY || errno == EEXIST ? TT_ERR_CONFLICT
		                                                     : TT_ERR_IO,
		           "snapshot: target %s is not empty", name);
		goto out;
	}
	if (st != NULL)
		*st = u->st;
	rc = 0;
out:
	if (u->tmpfd >= 0)
		close(u->tmpfd);
	free(u->buf);
	free(u->stack);
	free(u);
out_rm:
	if (rc < 0)
		(void)snapshot_rm_tree(parent_dirfd, tmp, NULL);
	return rc;
}

/* ---- removal ---------------------------------------------------------- */

/* rm_pass: unlinks every non-directory in path (under dirfd) and reports
 * the first subdirectory left in sub (empty when none). */
static int rm_pass(int dirfd, const char *path, char *sub, size_t subsz,
                   struct tt_err *err)
{
	int fd = open_beneath(dirfd, path, O_RDONLY | O_DIRECTORY);
	DIR *d;
	struct dirent *de;

	sub[0] = '\0';
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "rm_tree: open %s", path);
	d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return tt_err_sys(err, TT_ERR_IO, "rm_tree: fdopendir");
	}
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (unlinkat(fd, de->d_name, 0) == 0 || errno == ENOENT)
			continue;
		if (errno == EISDIR && sub[0] == '\0') {
			snprintf(sub, subsz, "%s", de->d_name);
			continue;
		}
		if (errno != EISDIR) {
			tt_err_sys(err, TT_ERR_IO, "rm_tree: unlink %s/%s", path, de->d_name);
			closedir(d);
			return -1;
		}
	}
	closedir(d);
	return 0;
}

/* snapshot_rm_tree: iterative (one fd at a time, whatever the depth). */
int snapshot_rm_tree(int dirfd, const char *name, struct tt_err *err)
{
	char path[2 * PATH_MAX], sub[NAME_MAX + 1];
	size_t root_len = strlen(name);

	if (root_len == 0 || root_len >= sizeof(path))
		return tt_err_set(err, TT_ERR_INVALID, "rm_tree: bad name");
	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno != EISDIR)
		return tt_err_sys(err, TT_ERR_IO, "rm_tree: unlink %s", name);
	memcpy(path, name, root_len + 1);
	for (;;) {
		size_t len = strlen(path);

		if (rm_pass(dirfd, path, sub, sizeof(sub), err) < 0)
			return -1;
		if (sub[0] != '\0') {
			if (len + 1 + strlen(sub) >= sizeof(path))
				return tt_err_set(err, TT_ERR_TOO_LARGE, "rm_tree: too deep");
			path[len] = '/';
			strcpy(path + len + 1, sub);
			continue;
		}
		if (unlinkat(dirfd, path, AT_REMOVEDIR) < 0 && errno != ENOENT)
			return tt_err_sys(err, TT_ERR_IO, "rm_tree: rmdir %s", path);
		if (len == root_len)
			return 0;
		*strrchr(path, '/') = '\0';
	}
}

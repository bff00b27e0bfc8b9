/* Snapshot store: the key helpers, the vtable wrappers, the tree helpers
 * and the "dir" backend (layout in snapstore.h). Commits for one sandbox
 * are serialised with flock on its directory, so a blob renamed into place
 * but not yet published is never mistaken for an orphan. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "cleanup.h"
#include "fsutil.h"
#include "snapstore.h"
#include "timefmt.h"

#define META_MAX 4096 /* bytes of a .meta record */

/* ---- keys ------------------------------------------------------------- */

/* snapstore_sbx_valid: [A-Za-z0-9_-], 1..SNAPSTORE_SBX_MAX characters. */
bool snapstore_sbx_valid(const char *sbx)
{
	size_t n = 0;

	if (sbx == NULL)
		return false;
	for (; sbx[n] != '\0'; n++) {
		char c = sbx[n];

		if (n >= SNAPSTORE_SBX_MAX ||
		    !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return false;
	}
	return n > 0;
}

/* snapstore_key: "<sbx>/<gen>". */
int snapstore_key(char out[SNAPSTORE_KEY_MAX], const char *sbx, uint64_t gen,
                  struct tt_err *err)
{
	if (!snapstore_sbx_valid(sbx) || gen == 0)
		return tt_err_set(err, TT_ERR_INVALID, "snapstore: bad sandbox id or generation");
	snprintf(out, SNAPSTORE_KEY_MAX, "%s/%llu", sbx, (unsigned long long)gen);
	return 0;
}

/* parse_gen: strict decimal, 1..UINT64_MAX, no sign or leading zero; n is
 * the number of characters to read. */
static bool parse_gen(const char *s, size_t n, uint64_t *gen)
{
	uint64_t v = 0;

	if (n == 0 || n > 20 || s[0] == '0')
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9' || v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*gen = v;
	return true;
}

/* snapstore_key_parse: "<sbx>/<gen>" back into its parts. */
int snapstore_key_parse(const char *key, char *sbx, uint64_t *gen,
                        struct tt_err *err)
{
	const char *slash = key != NULL ? strchr(key, '/') : NULL;
	size_t n;

	if (slash == NULL || (n = (size_t)(slash - key)) == 0 ||
	    n > SNAPSTORE_SBX_MAX || !parse_gen(slash + 1, strlen(slash + 1), gen))
		return tt_err_set(err, TT_ERR_INVALID, "snapstore: bad key");
	memcpy(sbx, key, n);
	sbx[n] = '\0';
	if (!snapstore_sbx_valid(sbx))
		return tt_err_set(err, TT_ERR_INVALID, "snapstore: bad key");
	return 0;
}

/* ---- wrappers --------------------------------------------------------- */

/* snapstore_close: through the vtable. */
void snapstore_close(struct snapstore *s)
{
	if (s != NULL)
		s->ops->close(s);
}

/* snapstore_put_begin: validates the key, then the backend. */
int snapstore_put_begin(struct snapstore *s, const char *sbx, uint64_t gen,
                        struct snapstore_put **out, struct tt_err *err)
{
	char key[SNAPSTORE_KEY_MAX];

	if (snapstore_key(key, sbx, gen, err) < 0)
		return -1;
	return s->ops->put_begin(s, key, out, err);
}

/* snapstore_put_write: through the vtable. */
int snapstore_put_write(struct snapstore *s, struct snapstore_put *p,
                        const void *buf, size_t len, struct tt_err *err)
{
	return s->ops->put_write(p, buf, len, err);
}

/* snapstore_put_commit: through the vtable; consumes p. */
int snapstore_put_commit(struct snapstore *s, struct snapstore_put *p,
                         const uint8_t expect[SNAPSTORE_HASH_LEN],
                         struct snapstore_info *info, struct tt_err *err)
{
	return s->ops->put_commit(p, expect, info, err);
}

/* snapstore_put_abort: through the vtable; consumes p (NULL is fine). */
void snapstore_put_abort(struct snapstore *s, struct snapstore_put *p)
{
	if (p != NULL)
		s->ops->put_abort(p);
}

/* snapstore_get_open: validates the key, then the backend. */
int snapstore_get_open(struct snapstore *s, const char *sbx, uint64_t gen,
                       struct snapstore_get **out, struct snapstore_info *info,
                       struct tt_err *err)
{
	char key[SNAPSTORE_KEY_MAX];

	if (snapstore_key(key, sbx, gen, err) < 0)
		return -1;
	return s->ops->get_open(s, key, out, info, err);
}

/* snapstore_get_read: through the vtable. */
ssize_t snapstore_get_read(struct snapstore *s, struct snapstore_get *g,
                           void *buf, size_t len, struct tt_err *err)
{
	return s->ops->get_read(g, buf, len, err);
}

/* snapstore_get_close: through the vtable (NULL is fine). */
void snapstore_get_close(struct snapstore *s, struct snapstore_get *g)
{
	if (g != NULL)
		s->ops->get_close(g);
}

/* snapstore_stat: validates the key, then the backend. */
int snapstore_stat(struct snapstore *s, const char *sbx, uint64_t gen,
                   struct snapstore_info *info, struct tt_err *err)
{
	char key[SNAPSTORE_KEY_MAX];

	if (snapstore_key(key, sbx, gen, err) < 0)
		return -1;
	return s->ops->stat(s, key, info, err);
}

/* snapstore_list: validates the sandbox id, then the backend. */
int snapstore_list(struct snapstore *s, const char *sbx, uint64_t **gens,
                   size_t *n, struct tt_err *err)
{
	if (!snapstore_sbx_valid(sbx))
		return tt_err_set(err, TT_ERR_INVALID, "snapstore: bad sandbox id");
	return s->ops->list(s, sbx, gens, n, err);
}

/* snapstore_remove: validates the key, then the backend. */
int snapstore_remove(struct snapstore *s, const char *sbx, uint64_t gen,
                     struct tt_err *err)
{
	char key[SNAPSTORE_KEY_MAX];

	if (snapstore_key(key, sbx, gen, err) < 0)
		return -1;
	return s->ops->remove(s, key, err);
}

/* snapstore_gc: through the vtable. */
int snapstore_gc(struct snapstore *s, int64_t older_than_s, unsigned *removed,
                 struct tt_err *err)
{
	unsigned dummy = 0;

	return s->ops->gc(s, older_than_s, removed != NULL ? removed : &dummy, err);
}

/* snapstore_latest: the last element of the (ascending) complete list. */
int snapstore_latest(struct snapstore *s, const char *sbx, uint64_t *gen,
                     struct tt_err *err)
{
	uint64_t *gens = NULL;
	size_t n = 0;

	if (snapstore_list(s, sbx, &gens, &n, err) < 0)
		return -1;
	if (n == 0) {
		free(gens);
		return tt_err_set(err, TT_ERR_NOT_FOUND,
		                  "snapstore: no complete snapshot of %s", sbx);
	}
	*gen = gens[n - 1];
	free(gens);
	return 0;
}

/* snapstore_prune: list, then remove what is older than below and not
 * kept; every removal is tried, the first failure is reported. */
int snapstore_prune(struct snapstore *s, const char *sbx, uint64_t below,
                    const uint64_t *keep, size_t nkeep, unsigned *removed,
                    struct tt_err *err)
{
	uint64_t *gens = NULL;
	size_t n = 0;
	unsigned dummy = 0;
	int rc = 0;

	if (removed == NULL)
		removed = &dummy;
	*removed = 0;
	if (snapstore_list(s, sbx, &gens, &n, err) < 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		bool kept = gens[i] >= below;
		struct tt_err e2 = { 0 };

		for (size_t k = 0; k < nkeep && !kept; k++)
			kept = keep[k] == gens[i];
		if (kept)
			continue;
		if (snapstore_remove(s, sbx, gens[i], &e2) == 0) {
			(*removed)++;
		} else if (rc == 0) {
			if (err != NULL)
				*err = e2;
			rc = -1;
		}
	}
	free(gens);
	return rc;
}

/* ---- tree helpers ----------------------------------------------------- */

struct tree_sink {
	struct snapstore *s;
	struct snapstore_put *p;
	crypto_generichash_state h; /* what we handed over, for put_commit */
};

/* tree_sink_write: snapshot_write_fn into a put. */
static int tree_sink_write(void *ctx, const void *buf, size_t len,
                           struct tt_err *err)
{
	struct tree_sink *t = ctx;

	crypto_generichash_update(&t->h, buf, len);
	return snapstore_put_write(t->s, t->p, buf, len, err);
}

/* snapstore_put_tree: pack -> put -> commit with our own checksum. */
int snapstore_put_tree(struct snapstore *s, const char *sbx, uint64_t gen,
                       int src_dirfd, const struct snapshot_pack_opts *opts,
                       struct snapshot_stats *st, struct tt_err *err)
{
	struct tree_sink t = { .s = s };
	uint8_t sum[SNAPSTORE_HASH_LEN];

	if (sodium_init() < 0)
		return tt_err_set(err, TT_ERR_SYS, "snapstore: sodium_init failed");
	crypto_generichash_init(&t.h, NULL, 0, sizeof(sum));
	if (snapstore_put_begin(s, sbx, gen, &t.p, err) < 0)
		return -1;
	if (snapshot_pack(src_dirfd, tree_sink_write, &t, opts, st, err) < 0) {
		snapstore_put_abort(s, t.p);
		return -1;
	}
	crypto_generichash_final(&t.h, sum, sizeof(sum));
	return snapstore_put_commit(s, t.p, sum, NULL, err);
}

struct tree_source {
	struct snapstore *s;
	struct snapstore_get *g;
};

/* tree_source_read: snapshot_read_fn from a get. */
static ssize_t tree_source_read(void *ctx, void *buf, size_t len,
                                struct tt_err *err)
{
	struct tree_source *t = ctx;

	return snapstore_get_read(t->s, t->g, buf, len, err);
}

/* snapstore_get_tree: get -> unpack (the store verifies the blob checksum
 * at its end, the archive its own trailer). */
int snapstore_get_tree(struct snapstore *s, const char *sbx, uint64_t gen,
                       int parent_dirfd, const char *name,
                       const struct snapshot_unpack_opts *opts,
                       struct snapshot_stats *st, struct tt_err *err)
{
	struct tree_source t = { .s = s };
	struct snapshot_unpack_opts o = { 0 };
	struct snapstore_info info;
	int rc;

	if (opts != NULL)
		o = *opts;
	if (snapstore_get_open(s, sbx, gen, &t.g, &info, err) < 0)
		return -1;
	if (o.total_hint == 0)
		o.total_hint = info.size;
	rc = snapshot_unpack(parent_dirfd, name, tree_source_read, &t, &o, st, err);
	snapstore_get_close(s, t.g);
	return rc;
}

/* ---- the dir backend -------------------------------------------------- */

struct dir_store {
	struct snapstore base;
	int rootfd;  /* owned */
	int partfd;  /* <root>/.partial, owned */
};

struct dir_put {
	struct dir_store *ds;
	int fd;                   /* the partial file, owned */
	char tmp[48];             /* its name in .partial */
	char sbx[SNAPSTORE_SBX_MAX + 1];
	uint64_t gen, size;
	crypto_generichash_state h;
};

struct dir_get {
	int fd;                   /* the .snap, owned */
	uint64_t size, done;
	uint8_t want[SNAPSTORE_HASH_LEN];
	crypto_generichash_state h;
	bool failed;
};

/* write_all: the whole buffer to fd. */
static int write_all(int fd, const void *buf, size_t len, struct tt_err *err)
{
	if (fsutil_write_all(fd, buf, len) < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: write");
	return 0;
}

/* random_name: prefix + 32 hex characters + suffix. */
static void random_name(char *out, size_t outsz, const char *suffix)
{
	unsigned char r[16];
	char hex[2 * sizeof(r) + 1];

	randombytes_buf(r, sizeof(r));
	sodium_bin2hex(hex, sizeof(hex), r, sizeof(r));
	snprintf(out, outsz, "%s%s", hex, suffix);
}

/* sbx_dir_open: the sandbox's directory (created when create is set). */
static int sbx_dir_open(struct dir_store *ds, const char *sbx, bool create,
                        struct tt_err *err)
{
	int fd;

	if (create) {
		if (mkdirat(ds->rootfd, sbx, 0700) == 0) {
			if (fsync(ds->rootfd) < 0)
				return tt_err_sys(err, TT_ERR_IO, "snapstore: fsync root");
		} else if (errno != EEXIST) {
			return tt_err_sys(err, TT_ERR_IO, "snapstore: mkdir %s", sbx);
		}
	}
	fd = openat(ds->rootfd, sbx, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT
		       ? tt_err_set(err, TT_ERR_NOT_FOUND, "snapstore: no snapshots of %s", sbx)
		       : tt_err_sys(err, TT_ERR_IO, "snapstore: open %s", sbx);
	return fd;
}

/* lock_dir: an exclusive flock on a directory fd (commit/remove/gc). */
static int lock_dir(int fd, struct tt_err *err)
{
	while (flock(fd, LOCK_EX) < 0)
		if (errno != EINTR)
			return tt_err_sys(err, TT_ERR_IO, "snapstore: lock");
	return 0;
}

/* meta_read: parses <gen>.meta under sbxfd; TT_ERR_NOT_FOUND when absent,
 * TT_ERR_MALFORMED when it does not parse or does not match gen. */
static int meta_read(int sbxfd, uint64_t gen, struct snapstore_info *info,
                     struct tt_err *err)
{
	char name[32], buf[META_MAX];
	_cleanup_close_ int fd = -1;
	json_t *root, *jg, *js, *jb, *jc;
	json_error_t jerr;
	ssize_t n;
	size_t hexlen = 0;
	int rc = -1;

	snprintf(name, sizeof(name), "%llu.meta", (unsigned long long)gen);
	fd = openat(sbxfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT
		       ? tt_err_set(err, TT_ERR_NOT_FOUND, "snapstore: generation %llu not published",
		                    (unsigned long long)gen)
		       : tt_err_sys(err, TT_ERR_IO, "snapstore: open %s", name);
	do
		n = read(fd, buf, sizeof(buf));
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: read %s", name);
	if ((size_t)n == sizeof(buf))
		return tt_err_set(err, TT_ERR_TOO_LARGE, "snapstore: %s too large", name);
	root = json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "snapstore: %s: %s", name, jerr.text);
	jg = json_object_get(root, "generation");
	js = json_object_get(root, "size");
	jb = json_object_get(root, "blake2b");
	jc = json_object_get(root, "created_at");
	if (!json_is_object(root) || !json_is_integer(jg) || !json_is_integer(js) ||
	    !json_is_string(jb) || !json_is_integer(jc) ||
	    json_integer_value(js) < 0 || json_integer_value(jg) <= 0 ||
	    (uint64_t)json_integer_value(jg) != gen ||
	    json_string_length(jb) != 2 * SNAPSTORE_HASH_LEN ||
	    sodium_hex2bin(info->blake2b, SNAPSTORE_HASH_LEN, json_string_value(jb),
	                   json_string_length(jb), NULL, &hexlen, NULL) != 0 ||
	    hexlen != SNAPSTORE_HASH_LEN) {
		tt_err_set(err, TT_ERR_MALFORMED, "snapstore: %s is not a valid record", name);
		goto out;
	}
	info->generation = gen;
	info->size = (uint64_t)json_integer_value(js);
	info->created_at = (int64_t)json_integer_value(jc);
	info->complete = true;
	rc = 0;
out:
	json_decref(root);
	return rc;
}

/* dir_stat_in: stat of gen under an open sandbox directory. */
static int dir_stat_in(int sbxfd, uint64_t gen, struct snapstore_info *info,
                       struct tt_err *err)
{
	char snap[32];
	struct tt_err me = { 0 };
	struct stat sb;
	int have;

	snprintf(snap, sizeof(snap), "%llu.snap", (unsigned long long)gen);
	have = fstatat(sbxfd, snap, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
	memset(info, 0, sizeof(*info));
	if (meta_read(sbxfd, gen, info, &me) == 0) {
		if (!have || (uint64_t)sb.st_size != info->size)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "snapstore: generation %llu content does not match its record",
			                  (unsigned long long)gen);
		return 0;
	}
	if (me.code != TT_ERR_NOT_FOUND) {
		if (err != NULL)
			*err = me;
		return -1;
	}
	if (!have)
		return tt_err_set(err, TT_ERR_NOT_FOUND, "snapstore: no generation %llu",
		                  (unsigned long long)gen);
	info->generation = gen;
	info->size = (uint64_t)sb.st_size;
	info->complete = false; /* content without its record: never used */
	return 0;
}

/* dir_put_begin: a new file in .partial. */
static int dir_put_begin(struct snapstore *s, const char *key,
                         struct snapstore_put **out, struct tt_err *err)
{
	struct dir_store *ds = (struct dir_store *)s;
	struct dir_put *p = calloc(1, sizeof(*p)); /* owned by the caller until
	                                            * commit/abort frees it */

	if (p == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "snapstore: out of memory");
	if (snapstore_key_parse(key, p->sbx, &p->gen, err) < 0) {
		free(p);
		return -1;
	}
	p->ds = ds;
	random_name(p->tmp, sizeof(p->tmp), ".part");
	p->fd = openat(ds->partfd, p->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
	               O_CLOEXEC, 0600);
	if (p->fd < 0) {
		tt_err_sys(err, TT_ERR_IO, "snapstore: create partial blob");
		free(p);
		return -1;
	}
	crypto_generichash_init(&p->h, NULL, 0, SNAPSTORE_HASH_LEN);
	*out = (struct snapstore_put *)p;
	return 0;
}

/* dir_put_write: appends and hashes. */
static int dir_put_write(struct snapstore_put *sp, const void *buf, size_t len,
                         struct tt_err *err)
{
	struct dir_put *p = (struct dir_put *)sp;

	if (write_all(p->fd, buf, len, err) < 0)
		return -1;
	crypto_generichash_update(&p->h, buf, len);
	p->size += len;
	return 0;
}

/* dir_put_abort: deletes the partial file. */
static void dir_put_abort(struct snapstore_put *sp)
{
	struct dir_put *p = (struct dir_put *)sp;

	if (p->fd >= 0)
		close(p->fd);
	(void)unlinkat(p->ds->partfd, p->tmp, 0);
	free(p);
}

/* meta_write: the record for p, via a durable temp file renamed into
 * place without replacing anything (one publisher per key). */
static int meta_write(struct dir_put *p, int sbxfd, const uint8_t sum[SNAPSTORE_HASH_LEN],
                      int64_t now, struct tt_err *err)
{
	char hex[2 * SNAPSTORE_HASH_LEN + 1], tmp[48], name[32];
	_cleanup_free_ char *txt = NULL;
	_cleanup_close_ int fd = -1;
	json_t *o;

	sodium_bin2hex(hex, sizeof(hex), sum, SNAPSTORE_HASH_LEN);
	o = json_pack("{s:I,s:I,s:s,s:I}", "generation", (json_int_t)p->gen,
	              "size", (json_int_t)p->size, "blake2b", hex,
	              "created_at", (json_int_t)now);
	if (o == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "snapstore: out of memory");
	txt = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (txt == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "snapstore: out of memory");
	random_name(tmp, sizeof(tmp), ".meta");
	fd = openat(p->ds->partfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
	            O_CLOEXEC, 0600);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: create record");
	if (write_all(fd, txt, strlen(txt), err) < 0 || fsync(fd) < 0) {
		if (err != NULL && err->code == TT_OK)
			tt_err_sys(err, TT_ERR_IO, "snapstore: fsync record");
		(void)unlinkat(p->ds->partfd, tmp, 0);
		return -1;
	}
	snprintf(name, sizeof(name), "%llu.meta", (unsigned long long)p->gen);
	if (renameat2(p->ds->partfd, tmp, sbxfd, name, RENAME_NOREPLACE) < 0) {
		int e = errno;

		(void)unlinkat(p->ds->partfd, tmp, 0);
		errno = e;
		return tt_err_sys(err, e == EEXIST ? TT_ERR_CONFLICT : TT_ERR_IO,
		                  "snapstore: publish %s/%llu", p->sbx,
		                  (unsigned long long)p->gen);
	}
	return 0;
}

/* dir_put_commit: checksum, fsync, rename content, fsync, record, fsync. */
static int dir_put_commit(struct snapstore_put *sp,
                          const uint8_t expect[SNAPSTORE_HASH_LEN],
                          struct snapstore_info *info, struct tt_err *err)
{
	struct dir_put *p = (struct dir_put *)sp;
	uint8_t sum[SNAPSTORE_HASH_LEN];
	_cleanup_close_ int sbxfd = -1;
	char snap[32], meta[32];
	int64_t now = tt_now();

	crypto_generichash_final(&p->h, sum, sizeof(sum));
	if (expect != NULL && sodium_memcmp(sum, expect, sizeof(sum)) != 0) {
		tt_err_set(err, TT_ERR_MALFORMED, "snapstore: %s/%llu checksum mismatch",
		           p->sbx, (unsigned long long)p->gen);
		goto fail;
	}
	if (fsync(p->fd) < 0) {
		tt_err_sys(err, TT_ERR_IO, "snapstore: fsync blob");
		goto fail;
	}
	close(p->fd);
	p->fd = -1;
	sbxfd = sbx_dir_open(p->ds, p->sbx, true, err);
	if (sbxfd < 0 || lock_dir(sbxfd, err) < 0)
		goto fail;
	snprintf(snap, sizeof(snap), "%llu.snap", (unsigned long long)p->gen);
	snprintf(meta, sizeof(meta), "%llu.meta", (unsigned long long)p->gen);
	if (faccessat(sbxfd, meta, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		tt_err_set(err, TT_ERR_CONFLICT, "snapstore: %s/%llu already published",
		           p->sbx, (unsigned long long)p->gen);
		goto fail;
	}
	/* Under the lock a .snap without a record is a dead writer's. */
	if (renameat2(p->ds->partfd, p->tmp, sbxfd, snap, RENAME_NOREPLACE) < 0 &&
	    (errno != EEXIST || unlinkat(sbxfd, snap, 0) < 0 ||
	     renameat2(p->ds->partfd, p->tmp, sbxfd, snap, RENAME_NOREPLACE) < 0)) {
		tt_err_sys(err, TT_ERR_IO, "snapstore: place %s/%s", p->sbx, snap);
		goto fail;
	}
	if (fsync(sbxfd) < 0) {
		tt_err_sys(err, TT_ERR_IO, "snapstore: fsync %s", p->sbx);
		goto fail_placed;
	}
	if (meta_write(p, sbxfd, sum, now, err) < 0)
		goto fail_placed;
	if (fsync(sbxfd) < 0) {
		/* The record may or may not be durable: take it back. */
		tt_err_sys(err, TT_ERR_IO, "snapstore: fsync %s", p->sbx);
		(void)unlinkat(sbxfd, meta, 0);
		goto fail_placed;
	}
	if (info != NULL) {
		info->generation = p->gen;
		info->size = p->size;
		memcpy(info->blake2b, sum, sizeof(sum));
		info->created_at = now;
		info->complete = true;
	}
	free(p);
	return 0; /* the flock goes with sbxfd */
fail_placed:
	(void)unlinkat(sbxfd, snap, 0);
fail:
	dir_put_abort(sp);
	return -1;
}

/* dir_get_open: the record first (no record, no snapshot), then content
 * whose size must match. */
static int dir_get_open(struct snapstore *s, const char *key,
                        struct snapstore_get **out, struct snapstore_info *info,
                        struct tt_err *err)
{
	struct dir_store *ds = (struct dir_store *)s;
	char sbx[SNAPSTORE_SBX_MAX + 1], snap[32];
	struct snapstore_info mi;
	_cleanup_close_ int sbxfd = -1, fd = -1;
	struct dir_get *g;
	struct stat sb;
	uint64_t gen;

	if (snapstore_key_parse(key, sbx, &gen, err) < 0)
		return -1;
	sbxfd = sbx_dir_open(ds, sbx, false, err);
	if (sbxfd < 0 || meta_read(sbxfd, gen, &mi, err) < 0)
		return -1;
	snprintf(snap, sizeof(snap), "%llu.snap", (unsigned long long)gen);
	fd = openat(sbxfd, snap, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_MALFORMED, "snapstore: %s content missing", key);
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != mi.size)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "snapstore: %s content does not match its record", key);
	g = calloc(1, sizeof(*g)); /* owned by the caller until get_close */
	if (g == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "snapstore: out of memory");
	g->fd = tt_steal_fd(&fd);
	g->size = mi.size;
	memcpy(g->want, mi.blake2b, sizeof(g->want));
	crypto_generichash_init(&g->h, NULL, 0, SNAPSTORE_HASH_LEN);
	if (info != NULL)
		*info = mi;
	*out = (struct snapstore_get *)g;
	return 0;
}

/* dir_get_read: reads and hashes; the end is only reported once the whole
 * blob matched its record. */
static ssize_t dir_get_read(struct snapstore_get *sg, void *buf, size_t len,
                            struct tt_err *err)
{
	struct dir_get *g = (struct dir_get *)sg;
	uint8_t sum[SNAPSTORE_HASH_LEN];
	ssize_t n;

	if (g->failed)
		return tt_err_set(err, TT_ERR_MALFORMED, "snapstore: blob failed verification");
	if (len > g->size - g->done + 1)
		len = (size_t)(g->size - g->done + 1); /* +1 notices growth */
	do
		n = read(g->fd, buf, len);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: read blob");
	if (n > 0) {
		g->done += (uint64_t)n;
		if (g->done > g->size) {
			g->failed = true;
			return tt_err_set(err, TT_ERR_MALFORMED, "snapstore: blob longer than its record");
		}
		crypto_generichash_update(&g->h, buf, (size_t)n);
		return n;
	}
	crypto_generichash_final(&g->h, sum, sizeof(sum));
	if (g->done != g->size || sodium_memcmp(sum, g->want, sizeof(sum)) != 0) {
		g->failed = true;
		return tt_err_set(err, TT_ERR_MALFORMED, "snapstore: blob checksum mismatch");
	}
	g->failed = true; /* finalised: a second end is an error, not a pass */
	return 0;
}

/* dir_get_close: frees the reader. */
static void dir_get_close(struct snapstore_get *sg)
{
	struct dir_get *g = (struct dir_get *)sg;

	close(g->fd);
	free(g);
}

/* dir_stat: see dir_stat_in. */
static int dir_stat(struct snapstore *s, const char *key,
                    struct snapstore_info *info, struct tt_err *err)
{
	struct dir_store *ds = (struct dir_store *)s;
	char sbx[SNAPSTORE_SBX_MAX + 1];
	_cleanup_close_ int sbxfd = -1;
	uint64_t gen;

	if (snapstore_key_parse(key, sbx, &gen, err) < 0)
		return -1;
	sbxfd = sbx_dir_open(ds, sbx, false, err);
	if (sbxfd < 0)
		return -1;
	return dir_stat_in(sbxfd, gen, info, err);
}

/* cmp_u64: qsort order. */
static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* dir_list: every "<gen>.meta" whose record and content check out. */
static int dir_list(struct snapstore *s, const char *sbx, uint64_t **gens,
                    size_t *count, struct tt_err *err)
{
	struct dir_store *ds = (struct dir_store *)s;
	struct tt_err e2 = { 0 };
	int sbxfd = sbx_dir_open(ds, sbx, false, &e2);
	uint64_t *v = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;

	*gens = NULL;
	*count = 0;
	if (sbxfd < 0) {
		if (e2.code == TT_ERR_NOT_FOUND)
			return 0;
		if (err != NULL)
			*err = e2;
		return -1;
	}
	d = fdopendir(sbxfd);
	if (d == NULL) {
		close(sbxfd);
		return tt_err_sys(err, TT_ERR_IO, "snapstore: list %s", sbx);
	}
	while ((de = readdir(d)) != NULL) {
		size_t len = strlen(de->d_name);
		struct snapstore_info info;
		uint64_t gen;

		if (len <= 5 || strcmp(de->d_name + len - 5, ".meta") != 0 ||
		    !parse_gen(de->d_name, len - 5, &gen) ||
		    dir_stat_in(dirfd(d), gen, &info, NULL) < 0 || !info.complete)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 8;
			uint64_t *nv = realloc(v, nc * sizeof(*nv));

			if (nv == NULL) {
				free(v);
				closedir(d);
				return tt_err_set(err, TT_ERR_NOMEM, "snapstore: out of memory");
			}
			v = nv;
			cap = nc;
		}
		v[n++] = gen;
	}
	closedir(d);
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_u64);
	*gens = v;
	*count = n;
	return 0;
}

/* dir_remove: record first (unpublish), then content. */
static int dir_remove(struct snapstore *s, const char *key, struct tt_err *err)
{
	struct dir_store *ds = (struct dir_store *)s;
	char sbx[SNAPSTORE_SBX_MAX + 1], name[32];
	struct tt_err e2 = { 0 };
	_cleanup_close_ int sbxfd = -1;
	uint64_t gen;

	if (snapstore_key_parse(key, sbx, &gen, err) < 0)
		return -1;
	sbxfd = sbx_dir_open(ds, sbx, false, &e2);
	if (sbxfd < 0) {
		if (e2.code == TT_ERR_NOT_FOUND)
			return 0;
		if (err != NULL)
			*err = e2;
		return -1;
	}
	if (lock_dir(sbxfd, err) < 0)
		return -1;
	snprintf(name, sizeof(name), "%llu.meta", (unsigned long long)gen);
	if (unlinkat(sbxfd, name, 0) < 0 && errno != ENOENT)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: remove %s", key);
	if (fsync(sbxfd) < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: fsync %s", sbx);
	snprintf(name, sizeof(name), "%llu.snap", (unsigned long long)gen);
	if (unlinkat(sbxfd, name, 0) < 0 && errno != ENOENT)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: remove %s", key);
	return 0;
}

/* gc_orphans: in one sandbox directory (locked), content without a record
 * older than the cutoff. */
static void gc_orphans(struct dir_store *ds, const char *sbx, int64_t cutoff,
                       unsigned *removed)
{
	_cleanup_close_ int sbxfd = sbx_dir_open(ds, sbx, false, NULL);
	struct dirent *de;
	DIR *d;
	int fd2;

	if (sbxfd < 0 || lock_dir(sbxfd, NULL) < 0 || (fd2 = dup(sbxfd)) < 0)
		return;
	d = fdopendir(fd2);
	if (d == NULL) {
		close(fd2);
		return;
	}
	while ((de = readdir(d)) != NULL) {
		size_t len = strlen(de->d_name);
		char meta[32];
		struct stat sb;
		uint64_t gen;

		if (len <= 5 || strcmp(de->d_name + len - 5, ".snap") != 0 ||
		    !parse_gen(de->d_name, len - 5, &gen))
			continue;
		snprintf(meta, sizeof(meta), "%llu.meta", (unsigned long long)gen);
		if (faccessat(sbxfd, meta, F_OK, AT_SYMLINK_NOFOLLOW) == 0 ||
		    fstatat(sbxfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    sb.st_mtim.tv_sec > cutoff)
			continue;
		if (unlinkat(sbxfd, de->d_name, 0) == 0)
			(*removed)++;
	}
	closedir(d);
}

/* dir_gc: stale partial files, then orphaned content. */
static int dir_gc(struct snapstore *s, int64_t older_than_s, unsigned *removed,
                  struct tt_err *err)
{
	struct dir_store *ds = (struct dir_store *)s;
	int64_t cutoff = tt_now() - older_than_s;
	struct dirent *de;
	DIR *d;
	int fd = dup(ds->partfd);

	*removed = 0;
	if (fd < 0 || (d = fdopendir(fd)) == NULL) {
		if (fd >= 0)
			close(fd);
		return tt_err_sys(err, TT_ERR_IO, "snapstore: gc");
	}
	rewinddir(d); /* the dup shares its offset with the store's fd */
	while ((de = readdir(d)) != NULL) {
		struct stat sb;

		if (de->d_name[0] == '.' ||
		    fstatat(ds->partfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0 ||
		    sb.st_mtim.tv_sec > cutoff)
			continue;
		if (unlinkat(ds->partfd, de->d_name, 0) == 0)
			(*removed)++;
	}
	closedir(d);
	fd = dup(ds->rootfd);
	if (fd < 0 || (d = fdopendir(fd)) == NULL) {
		if (fd >= 0)
			close(fd);
		return tt_err_sys(err, TT_ERR_IO, "snapstore: gc");
	}
	rewinddir(d); /* the dup shares its offset with the store's fd */
	while ((de = readdir(d)) != NULL)
		if (snapstore_sbx_valid(de->d_name))
			gc_orphans(ds, de->d_name, cutoff, removed);
	closedir(d);
	return 0;
}

/* dir_close: frees the store. */
static void dir_close(struct snapstore *s)
{
	struct dir_store *ds = (struct dir_store *)s;

	close(ds->rootfd);
	close(ds->partfd);
	free(ds);
}

static const struct snapstore_ops dir_ops = {
	.name = "dir",
	.put_begin = dir_put_begin,
	.put_write = dir_put_write,
	.put_commit = dir_put_commit,
	.put_abort = dir_put_abort,
	.get_open = dir_get_open,
	.get_read = dir_get_read,
	.get_close = dir_get_close,
	.stat = dir_stat,
	.list = dir_list,
	.remove = dir_remove,
	.gc = dir_gc,
	.close = dir_close,
};

/* snapstore_dir_open: opens (creating) the root and its .partial. */
int snapstore_dir_open(const char *root, struct snapstore **out,
                       struct tt_err *err)
{
	struct dir_store *ds;
	_cleanup_close_ int rfd = -1, pfd = -1;

	if (root == NULL || root[0] == '\0')
		return tt_err_set(err, TT_ERR_INVALID, "snapstore: no root directory");
	if (sodium_init() < 0)
		return tt_err_set(err, TT_ERR_SYS, "snapstore: sodium_init failed");
	if (mkdir(root, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: mkdir %s", root);
	rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rfd < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: open %s", root);
	if (mkdirat(rfd, ".partial", 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: mkdir %s/.partial", root);
	pfd = openat(rfd, ".partial", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (pfd < 0)
		return tt_err_sys(err, TT_ERR_IO, "snapstore: open %s/.partial", root);
	ds = calloc(1, sizeof(*ds)); /* owned by the caller: snapstore_close */
	if (ds == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "snapstore: out of memory");
	ds->base.ops = &dir_ops;
	ds->rootfd = tt_steal_fd(&rfd);
	ds->partfd = tt_steal_fd(&pfd);
	*out = &ds->base;
	return 0;
}

/* Snapshot archives: round trips of real trees (empty, 1-byte and 5 MiB
 * files, nested dirs, modes, symlinks incl. one to /etc/passwd), symlink
 * swap races during packing, and hostile archives (crafted with a valid
 * checksum, so the path checks themselves are what refuses them) leaving
 * nothing behind. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "snapshot.h"

/* ---- helpers ---------------------------------------------------------- */

struct membuf {
	uint8_t *p;
	size_t len, cap;
};

/* mem_sink: snapshot_write_fn appending to a membuf. */
static int mem_sink(void *ctx, const void *buf, size_t len, struct tt_err *err)
{
	struct membuf *m = ctx;

	(void)err;
	if (m->len + len > m->cap) {
		size_t nc = (m->len + len) * 2;

		m->p = realloc(m->p, nc);
		assert_non_null(m->p);
		m->cap = nc;
	}
	memcpy(m->p + m->len, buf, len);
	m->len += len;
	return 0;
}

struct memsrc {
	const uint8_t *p;
	size_t len, pos, chunk; /* chunk: max bytes per read (0 = any) */
};

/* mem_source: snapshot_read_fn over a buffer, chunk bytes at a time. */
static ssize_t mem_source(void *ctx, void *buf, size_t len, struct tt_err *err)
{
	struct memsrc *m = ctx;
	size_t n = m->len - m->pos;

	(void)err;
	if (n > len)
		n = len;
	if (m->chunk != 0 && n > m->chunk)
		n = m->chunk;
	memcpy(buf, m->p + m->pos, n);
	m->pos += n;
	return (ssize_t)n;
}

/* mk_base: a fresh scratch directory; returns an fd, path in out. */
static int mk_base(char out[64])
{
	int fd;

	strcpy(out, "/tmp/tt-snap-XXXXXX");
	assert_non_null(mkdtemp(out));
	fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	return fd;
}

/* put_file: writes a file under dfd with a mode and a fixed mtime. */
static void put_file(int dfd, const char *path, const void *data, size_t n,
                     mode_t mode)
{
	int fd = openat(dfd, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	struct timespec ts[2] = { { 1700000000, 123456789 }, { 1700000000, 123456789 } };

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	assert_int_equal(fchmod(fd, mode), 0);
	assert_int_equal(futimens(fd, ts), 0);
	close(fd);
}

/* count_entries: names in dfd/sub (or dfd itself when sub is "."),
 * fifos not counted. */
static int count_entries(int dfd, const char *sub)
{
	int fd = openat(dfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d;
	struct dirent *de;
	int n = 0;

	assert_true(fd >= 0);
	d = fdopendir(fd);
	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    de->d_type != DT_FIFO) /* fifos are not archived */
			n++;
	closedir(d);
	return n;
}

/* trees_equal: recursive comparison of type, mode, size, content, link
 * target and file mtime (strip: set-id bits expected dropped in b). */
static void trees_equal(int a, int b, const char *path, bool strip)
{
	struct stat sa, sb;

	assert_int_equal(fstatat(a, path, &sa, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(fstatat(b, path, &sb, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(sa.st_mode & S_IFMT, sb.st_mode & S_IFMT);
	if (S_ISLNK(sa.st_mode)) {
		char ta[4096], tb[4096];
		ssize_t na = readlinkat(a, path, ta, sizeof(ta));
		ssize_t nb = readlinkat(b, path, tb, sizeof(tb));

		assert_true(na > 0);
		assert_int_equal(na, nb);
		assert_memory_equal(ta, tb, (size_t)na);
		return;
	}
	assert_int_equal(sa.st_mode & (strip ? 01777 : 07777), sb.st_mode & 07777);
	if (S_ISREG(sa.st_mode)) {
		int fa = openat(a, path, O_RDONLY | O_CLOEXEC);
		int fb = openat(b, path, O_RDONLY | O_CLOEXEC);
		static uint8_t ba[65536], bb[65536];
		ssize_t na, nb;

		assert_int_equal(sa.st_size, sb.st_size);
		assert_int_equal(sa.st_mtim.tv_sec, sb.st_mtim.tv_sec);
		assert_int_equal(sa.st_mtim.tv_nsec, sb.st_mtim.tv_nsec);
		assert_true(fa >= 0 && fb >= 0);
		do {
			na = read(fa, ba, sizeof(ba));
			nb = read(fb, bb, sizeof(bb));
			assert_int_equal(na, nb);
			assert_memory_equal(ba, bb, (size_t)(na > 0 ? na : 0));
		} while (na > 0);
		close(fa);
		close(fb);
	} else if (S_ISDIR(sa.st_mode)) {
		int fd = openat(a, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		DIR *d = fdopendir(fd);
		struct dirent *de;

		assert_non_null(d);
		assert_int_equal(count_entries(a, path), count_entries(b, path));
		assert_int_equal(sa.st_mtim.tv_sec, sb.st_mtim.tv_sec);
		while ((de = readdir(d)) != NULL) {
			char sub[4096];

			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			if (de->d_type == DT_FIFO)
				continue;
			snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
			trees_equal(a, b, sub, strip);
		}
		closedir(d);
	}
}

/* rm_base: removes a scratch directory. */
static void rm_base(int fd, const char *path)
{
	int tmp = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	close(fd);
	assert_true(tmp >= 0);
	/* Relative to /tmp: rm_tree never resolves outside its dirfd. */
	assert_int_equal(snapshot_rm_tree(tmp, path + strlen("/tmp/"), NULL), 0);
	close(tmp);
}

/* build_tree: the standard test tree under dfd/src. */
static void build_tree(int dfd)
{
	uint8_t *big = malloc(5u << 20);
	struct timespec ts[2] = { { 1600000000, 0 }, { 1600000000, 0 } };

	assert_non_null(big);
	randombytes_buf(big, 5u << 20);
	assert_int_equal(mkdirat(dfd, "src", 0755), 0);
	put_file(dfd, "src/empty", "", 0, 0644);
	put_file(dfd, "src/one", "x", 1, 0600);
	put_file(dfd, "src/big.bin", big, 5u << 20, 0755);
	put_file(dfd, "src/suid", "#!/bin/sh\n", 10, 04755);
	assert_int_equal(mkdirat(dfd, "src/a", 0750), 0);
	assert_int_equal(mkdirat(dfd, "src/a/b", 0700), 0);
	assert_int_equal(mkdirat(dfd, "src/a/b/c", 0755), 0);
	put_file(dfd, "src/a/b/c/deep.txt", "deep\n", 5, 0640);
	assert_int_equal(mkdirat(dfd, "src/ro", 0755), 0);
	put_file(dfd, "src/ro/inside", "ro", 2, 0444);
	assert_int_equal(fchmodat(dfd, "src/ro", 0555, 0), 0);
	assert_int_equal(symlinkat("/etc/passwd", dfd, "src/passwd"), 0);
	assert_int_equal(symlinkat("a/b", dfd, "src/rel"), 0);
	assert_int_equal(symlinkat("../../../nowhere", dfd, "src/a/dangling"), 0);
	assert_int_equal(mkfifoat(dfd, "src/fifo", 0644), 0);
	assert_int_equal(utimensat(dfd, "src/a/b", ts, 0), 0);
	assert_int_equal(utimensat(dfd, "src/a/b/c", ts, 0), 0);
	assert_int_equal(utimensat(dfd, "src/a", ts, 0), 0);
	free(big);
}

/* pack_at: packs dfd/path into m. */
static void pack_at(int dfd, const char *path, struct membuf *m,
                    struct snapshot_stats *st)
{
	int fd = openat(dfd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct tt_err err = { 0 };

	assert_true(fd >= 0);
	assert_int_equal(snapshot_pack(fd, mem_sink, m, NULL, st, &err), 0);
	close(fd);
}

/* unpack_mem: unpacks a buffer as dfd/name. */
static int unpack_mem(int dfd, const char *name, const uint8_t *p, size_t n,
                      const struct snapshot_unpack_opts *o,
                      struct snapshot_stats *st, struct tt_err *err)
{
	struct memsrc src = { .p = p, .len = n };

	return snapshot_unpack(dfd, name, mem_source, &src, o, st, err);
}

/* ---- round trips ------------------------------------------------------ */

static void test_roundtrip(void **state)
{
	char base[64];
	int dfd = mk_base(base);
	struct membuf m = { 0 };
	struct snapshot_stats ps, us;
	struct tt_err err = { 0 };
	struct stat sb;
	char target[64];
	ssize_t n;

	(void)state;
	build_tree(dfd);
	pack_at(dfd, "src", &m, &ps);
	assert_int_equal(ps.files, 6);
	assert_int_equal(ps.dirs, 5);     /* root, a, a/b, a/b/c, ro */
	assert_int_equal(ps.symlinks, 3);
	assert_int_equal(ps.skipped, 1);  /* the fifo */
	assert_int_equal(ps.data_bytes, (5u << 20) + 1 + 10 + 5 + 2);
	assert_int_equal(ps.stream_bytes, m.len);
	/* The link to /etc/passwd was stored, not its target's content. */
	assert_null(memmem(m.p, m.len, "root:x:0:0", 10));

	assert_int_equal(unpack_mem(dfd, "out", m.p, m.len, NULL, &us, &err), 0);
	assert_int_equal(us.entries, ps.entries);
	assert_int_equal(us.data_bytes, ps.data_bytes);
	assert_memory_equal(us.digest, ps.digest, sizeof(ps.digest));
	trees_equal(dfd, dfd, "src", false); /* sanity of the comparator */
	{
		/* Compare src against out by opening both as roots. */
		int a = openat(dfd, "src", O_RDONLY | O_DIRECTORY);
		int b = openat(dfd, "out", O_RDONLY | O_DIRECTORY);

		trees_equal(a, b, ".", true);
		close(a);
		close(b);
	}
	assert_int_equal(fstatat(dfd, "out/passwd", &sb, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISLNK(sb.st_mode));
	n = readlinkat(dfd, "out/passwd", target, sizeof(target));
	assert_int_equal(n, 11);
	assert_memory_equal(target, "/etc/passwd", 11);
	/* Without chown, set-id bits are not granted. */
	assert_int_equal(fstatat(dfd, "out/suid", &sb, 0), 0);
	assert_int_equal(sb.st_mode & 07777, 0755);
	assert_int_equal(fstatat(dfd, "out/fifo", &sb, AT_SYMLINK_NOFOLLOW), -1);
	/* Exactly src and out: no temporary left behind. */
	assert_int_equal(count_entries(dfd, "."), 2);

	/* Into an existing empty directory: fine; into a non-empty one: no. */
	assert_int_equal(mkdirat(dfd, "empty", 0700), 0);
	assert_int_equal(unpack_mem(dfd, "empty", m.p, m.len, NULL, NULL, &err), 0);
	assert_int_equal(fstatat(dfd, "empty/big.bin", &sb, 0), 0);
	assert_int_equal(unpack_mem(dfd, "out", m.p, m.len, NULL, NULL, &err), -1);
	assert_int_equal(err.code, TT_ERR_CONFLICT);
	assert_int_equal(count_entries(dfd, "."), 3);

	/* Deterministic: packing the same tree again gives the same bytes. */
	{
		struct membuf m2 = { 0 };

		pack_at(dfd, "src", &m2, NULL);
		assert_int_equal(m2.len, m.len);
		assert_memory_equal(m2.p, m.p, m.len);
		free(m2.p);
	}
	free(m.p);
	rm_base(dfd, base);
}

static void test_chown_and_ids(void **state)
{
	char base[64];
	int dfd = mk_base(base);
	struct membuf m = { 0 };
	struct snapshot_pack_opts po = { .id_base = 100000, .gid_base = 100000 };
	struct snapshot_unpack_opts uo = { .chown = true, .id_base = 300000,
	                                   .gid_base = 300000 };
	struct tt_err err = { 0 };
	struct stat sb;
	int fd;

	(void)state;
	assert_int_equal(mkdirat(dfd, "src", 0755), 0);
	put_file(dfd, "src/mine", "m", 1, 04755);
	put_file(dfd, "src/foreign", "f", 1, 0644);
	assert_int_equal(symlinkat("/etc/shadow", dfd, "src/link"), 0);
	/* Privileged (test runs as root): sandbox-owned files. */
	assert_int_equal(fchownat(dfd, "src", 100000, 100000, 0), 0);
	assert_int_equal(fchownat(dfd, "src/mine", 100005, 100007, 0), 0);
	assert_int_equal(fchmodat(dfd, "src/mine", 04755, 0), 0);
	assert_int_equal(fchownat(dfd, "src/link", 100001, 100001, AT_SYMLINK_NOFOLLOW), 0);
	/* foreign stays root-owned: outside the range, stored as nobody. */
	fd = openat(dfd, "src", O_RDONLY | O_DIRECTORY);
	assert_int_equal(snapshot_pack(fd, mem_sink, &m, &po, NULL, &err), 0);
	close(fd);
	assert_int_equal(unpack_mem(dfd, "out", m.p, m.len, &uo, NULL, &err), 0);
	assert_int_equal(fstatat(dfd, "out", &sb, 0), 0);
	assert_int_equal(sb.st_uid, 300000);
	assert_int_equal(fstatat(dfd, "out/mine", &sb, 0), 0);
	assert_int_equal(sb.st_uid, 300005);
	assert_int_equal(sb.st_gid, 300007);
	assert_int_equal(sb.st_mode & 07777, 04755); /* kept: owned by the sandbox */
	assert_int_equal(fstatat(dfd, "out/foreign", &sb, 0), 0);
	assert_int_equal(sb.st_uid, 300000 + SNAPSHOT_NOBODY);
	assert_int_equal(fstatat(dfd, "out/link", &sb, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISLNK(sb.st_mode));
	assert_int_equal(sb.st_uid, 300001);
	free(m.p);
	rm_base(dfd, base);
}

/* swapper: flips src/x between a directory and a symlink to the secret
 * directory outside the tree, until killed. */
static void swapper(int dfd)
{
	/* Never outlive the test, even if it is killed mid-way. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	alarm(60);
	for (;;) {
		(void)renameat(dfd, "src/x", dfd, "src/x.tmp");
		(void)symlinkat("../secret", dfd, "src/x");
		(void)unlinkat(dfd, "src/x", 0);
		(void)renameat(dfd, "src/x.tmp", dfd, "src/x");
	}
}

static void test_symlink_swap_race(void **state)
{
	char base[64];
	int dfd = mk_base(base), status;
	struct membuf m = { 0 };
	struct tt_err err = { 0 };
	pid_t pid;
	int seen_link = 0, seen_dir = 0;

	(void)state;
	assert_int_equal(mkdirat(dfd, "secret", 0700), 0);
	put_file(dfd, "secret/SECRET-NAME", "SECRET-CONTENT", 14, 0600);
	assert_int_equal(mkdirat(dfd, "src", 0755), 0);
	assert_int_equal(mkdirat(dfd, "src/x", 0755), 0);
	put_file(dfd, "src/x/honest", "HONEST", 6, 0644);
	{
		/* Files are packed before subdirectories: a 1 MiB sibling widens
		 * the window between seeing x as a directory and opening it. */
		uint8_t *pad = calloc(1, 1u << 20);

		assert_non_null(pad);
		put_file(dfd, "src/zpad", pad, 1u << 20, 0644); /* after x */
		free(pad);
	}
	/* Static case first: a directory already replaced by a link. */
	assert_int_equal(symlinkat("../secret", dfd, "src/y"), 0);
	pack_at(dfd, "src", &m, NULL);
	assert_null(memmem(m.p, m.len, "SECRET", 6));
	assert_non_null(memmem(m.p, m.len, "HONEST", 6));
	assert_int_equal(unlinkat(dfd, "src/y", 0), 0);

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		swapper(dfd);
	for (int i = 0; i < 300; i++) {
		int fd = openat(dfd, "src", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		int r;

		m.len = 0;
		err.code = TT_OK;
		r = snapshot_pack(fd, mem_sink, &m, NULL, NULL, &err);
		close(fd);
		if (r < 0)
			continue; /* a vanished entry may fail a pass; never leak */
		assert_null(memmem(m.p, m.len, "SECRET", 6));
		if (memmem(m.p, m.len, "HONEST", 6) != NULL)
			seen_dir++;
		if (memmem(m.p, m.len, "../secret", 9) != NULL)
			seen_link++;
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	/* Both shapes were observed, so the race was really exercised. */
	assert_true(seen_dir > 0);
	assert_true(seen_link > 0);
	free(m.p);
	rm_base(dfd, base);
}

/* ---- crafted archives ------------------------------------------------- */

struct craft {
	struct membuf m;
	uint64_t entries, data;
};

/* be: v as n big-endian bytes. */
static void be(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

/* craft_start: the header and the root directory. */
static void craft_start(struct craft *c)
{
	static const uint8_t hdr[8] = { 'T', 'T', 'S', 'N', 'A', 'P', 1, 0 };

	memset(c, 0, sizeof(*c));
	mem_sink(&c->m, hdr, sizeof(hdr), NULL);
}

/* craft_entry: one entry with the given declared size and data bytes. */
static void craft_entry(struct craft *c, int type, const char *path,
                        uint32_t mode, uint64_t size, const void *data,
                        size_t dlen)
{
	uint8_t h[SNAPSHOT_ENTRY_HDR_LEN] = { 0 };

	h[0] = (uint8_t)type;
	be(h + 2, strlen(path), 2);
	be(h + 4, mode, 4);
	be(h + 16, 1700000000, 8);
	be(h + 28, size, 8);
	mem_sink(&c->m, h, sizeof(h), NULL);
	mem_sink(&c->m, path, strlen(path), NULL);
	if (dlen)
		mem_sink(&c->m, data, dlen, NULL);
	c->entries++;
	if (type == SNAPSHOT_FILE)
		c->data += size;
}

/* craft_end: trailer with a correct checksum. */
static void craft_end(struct craft *c)
{
	uint8_t t[20] = { 0xff }, sum[32];

	be(t + 4, c->entries, 8);
	be(t + 12, c->data, 8);
	mem_sink(&c->m, t, sizeof(t), NULL);
	crypto_generichash(sum, sizeof(sum), c->m.p, c->m.len, NULL, 0);
	mem_sink(&c->m, sum, sizeof(sum), NULL);
}

/* expect_refused: unpack fails with code and leaves base as it was
 * (only "outside" present, and empty). */
static void expect_refused(int dfd, struct craft *c, enum tt_errc code,
                           const struct snapshot_unpack_opts *o)
{
	struct tt_err err = { 0 };

	assert_int_equal(unpack_mem(dfd, "out", c->m.p, c->m.len, o, NULL, &err), -1);
	if (err.code != code)
		fail_msg("expected %s, got %s: %s", tt_errc_name(code),
		         tt_errc_name(err.code), err.msg);
	assert_int_equal(count_entries(dfd, "."), 1);
	assert_int_equal(count_entries(dfd, "outside"), 0);
	free(c->m.p);
	memset(c, 0, sizeof(*c));
}

static void test_crafted_honest(void **state)
{
	char base[64];
	int dfd = mk_base(base);
	struct craft c;
	struct tt_err err = { 0 };
	char t[32];

	(void)state;
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_DIR, "a", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "a/f", 0644, 2, "hi", 2);
	craft_entry(&c, SNAPSHOT_SYMLINK, "s", 0777, 11, "/etc/passwd", 11);
	craft_end(&c);
	assert_int_equal(unpack_mem(dfd, "out", c.m.p, c.m.len, NULL, NULL, &err), 0);
	assert_int_equal(readlinkat(dfd, "out/s", t, sizeof(t)), 11);
	{
		int fd = openat(dfd, "out/a/f", O_RDONLY);

		assert_true(fd >= 0);
		assert_int_equal(read(fd, t, sizeof(t)), 2);
		assert_memory_equal(t, "hi", 2);
		close(fd);
	}
	/* One byte at a time through the source: same result. */
	{
		struct memsrc src = { .p = c.m.p, .len = c.m.len, .chunk = 1 };

		assert_int_equal(snapshot_unpack(dfd, "out2", mem_source, &src, NULL,
		                                 NULL, &err), 0);
	}
	free(c.m.p);
	rm_base(dfd, base);
}

static void test_crafted_hostile(void **state)
{
	char base[64];
	int dfd = mk_base(base);
	struct craft c;
	char longname[300];

	(void)state;
	assert_int_equal(mkdirat(dfd, "outside", 0700), 0);
	/* "..": escapes upward. */
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "../outside/x", 0644, 1, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "..", 0644, 1, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	/* Absolute path. */
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "/tmp/tt-snap-abs", 0644, 1, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	assert_int_equal(access("/tmp/tt-snap-abs", F_OK), -1);
	/* Through a symlink: link to outside, then a file "under" it. */
	{
		char tgt[128];

		snprintf(tgt, sizeof(tgt), "%s/outside", base);
		craft_start(&c);
		craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
		craft_entry(&c, SNAPSHOT_SYMLINK, "l", 0777, strlen(tgt), tgt, strlen(tgt));
		craft_entry(&c, SNAPSHOT_FILE, "l/pwned", 0644, 1, "x", 1);
		craft_end(&c);
		expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
		/* ... and a directory entry of the same name after the link. */
		craft_start(&c);
		craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
		craft_entry(&c, SNAPSHOT_SYMLINK, "l", 0777, strlen(tgt), tgt, strlen(tgt));
		craft_entry(&c, SNAPSHOT_DIR, "l", 0755, 0, NULL, 0);
		craft_entry(&c, SNAPSHOT_FILE, "l/pwned", 0644, 1, "x", 1);
		craft_end(&c);
		expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	}
	/* Odd components, duplicate names, out-of-order parents. */
	{
		static const char *bad[] = { "a/./b", "a//b", "a/", ".", "a/../b" };

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			craft_start(&c);
			craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
			craft_entry(&c, SNAPSHOT_DIR, "a", 0755, 0, NULL, 0);
			craft_entry(&c, SNAPSHOT_FILE, bad[i], 0644, 1, "x", 1);
			craft_end(&c);
			expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
		}
	}
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "x", 0644, 1, "x", 1);
	craft_entry(&c, SNAPSHOT_FILE, "x", 0644, 1, "y", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "nodir/x", 0644, 1, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	/* Missing root, over-long component, bad mode bits. */
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_FILE, "x", 0644, 1, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	memset(longname, 'n', 256);
	longname[256] = '\0';
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, longname, 0644, 1, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "x", 0100644, 1, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	/* Huge declared size: refused before reading any data. */
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "big", 0644, 1ull << 62, "x", 1);
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_TOO_LARGE, NULL);
	/* Entry count over the caller's limit. */
	{
		struct snapshot_limits lim = { .max_entries = 3 };
		struct snapshot_unpack_opts o = { .limits = &lim };

		craft_start(&c);
		craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
		for (int i = 0; i < 4; i++) {
			char nm[16];

			snprintf(nm, sizeof(nm), "f%d", i);
			craft_entry(&c, SNAPSHOT_FILE, nm, 0644, 0, NULL, 0);
		}
		craft_end(&c);
		expect_refused(dfd, &c, TT_ERR_TOO_LARGE, &o);
	}
	/* Trailer disagreeing with the entries (checksum still right). */
	craft_start(&c);
	craft_entry(&c, SNAPSHOT_DIR, "", 0755, 0, NULL, 0);
	craft_entry(&c, SNAPSHOT_FILE, "x", 0644, 1, "x", 1);
	c.entries++;
	craft_end(&c);
	expect_refused(dfd, &c, TT_ERR_MALFORMED, NULL);
	rm_base(dfd, base);
}

static void test_damaged_streams(void **state)
{
	char base[64];
	int dfd = mk_base(base);
	struct membuf m = { 0 };
	struct tt_err err = { 0 };
	uint8_t *copy;
	size_t cuts[] = { 0, 1, 7, 8, 20, 44, 45, 100, 4000, 70000 };

	(void)state;
	assert_int_equal(mkdirat(dfd, "outside", 0700), 0);
	assert_int_equal(mkdirat(dfd, "src", 0755), 0);
	{
		uint8_t *d = malloc(200000);

		randombytes_buf(d, 200000);
		put_file(dfd, "src/data", d, 200000, 0644);
		free(d);
	}
	put_file(dfd, "src/small", "small", 5, 0644);
	pack_at(dfd, "src", &m, NULL);
	assert_int_equal(snapshot_rm_tree(dfd, "src", NULL), 0);
	copy = malloc(m.len + 1);
	/* Truncated anywhere, including inside the trailer's checksum. */
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]) + 3; i++) {
		size_t cut = i < sizeof(cuts) / sizeof(cuts[0]) ? cuts[i]
		             : m.len - (i - sizeof(cuts) / sizeof(cuts[0]) + 1) * 7;

		assert_int_equal(unpack_mem(dfd, "out", m.p, cut, NULL, NULL, &err), -1);
		assert_int_equal(err.code, TT_ERR_MALFORMED);
		assert_int_equal(count_entries(dfd, "."), 1);
	}
	/* One flipped bit in file content: only the checksum notices. */
	memcpy(copy, m.p, m.len);
	copy[1000] ^= 0x01;
	assert_int_equal(unpack_mem(dfd, "out", copy, m.len, NULL, NULL, &err), -1);
	assert_non_null(strstr(err.msg, "checksum"));
	assert_int_equal(count_entries(dfd, "."), 1);
	/* A flipped bit in the stored checksum. */
	memcpy(copy, m.p, m.len);
	copy[m.len - 1] ^= 0x80;
	assert_int_equal(unpack_mem(dfd, "out", copy, m.len, NULL, NULL, &err), -1);
	assert_non_null(strstr(err.msg, "checksum"));
	/* Bytes after the trailer. */
	memcpy(copy, m.p, m.len);
	copy[m.len] = 0;
	assert_int_equal(unpack_mem(dfd, "out", copy, m.len + 1, NULL, NULL, &err), -1);
	assert_int_equal(count_entries(dfd, "."), 1);
	/* And the intact stream still unpacks. */
	assert_int_equal(unpack_mem(dfd, "out", m.p, m.len, NULL, NULL, &err), 0);
	assert_int_equal(count_entries(dfd, "out"), 2);
	free(copy);
	free(m.p);
	rm_base(dfd, base);
}

struct prog {
	uint64_t last, calls, total;
	bool monotonic;
};

/* on_progress: checks that progress only moves forward. */
static void on_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct prog *p = ctx;

	if (done < p->last)
		p->monotonic = false;
	p->last = done;
	p->total = total;
	p->calls++;
}

static void test_progress_and_fd(void **state)
{
	char base[64];
	int dfd = mk_base(base), fd, src;
	struct prog pp = { .monotonic = true }, up = { .monotonic = true };
	struct snapshot_pack_opts po = { .progress = on_progress, .progress_ctx = &pp };
	struct snapshot_unpack_opts uo = { .progress = on_progress, .progress_ctx = &up };
	struct snapshot_stats st;
	struct tt_err err = { 0 };
	struct stat sb;

	(void)state;
	build_tree(dfd);
	fd = openat(dfd, "archive", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	src = openat(dfd, "src", O_RDONLY | O_DIRECTORY);
	assert_int_equal(snapshot_pack(src, snapshot_write_fd, &fd, &po, &st, &err), 0);
	assert_int_equal(fstat(fd, &sb), 0);
	assert_int_equal((uint64_t)sb.st_size, st.stream_bytes);
	assert_true(pp.monotonic && pp.calls > 10);
	assert_int_equal(pp.last, st.stream_bytes);
	uo.total_hint = st.stream_bytes;
	assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
	assert_int_equal(snapshot_unpack(dfd, "out", snapshot_read_fd, &fd, &uo, NULL,
	                                 &err), 0);
	assert_true(up.monotonic);
	assert_int_equal(up.last, st.stream_bytes);
	assert_int_equal(up.total, st.stream_bytes);
	close(fd);
	close(src);
	rm_base(dfd, base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_chown_and_ids),
		cmocka_unit_test(test_symlink_swap_race),
		cmocka_unit_test(test_crafted_honest),
		cmocka_unit_test(test_crafted_hostile),
		cmocka_unit_test(test_damaged_streams),
		cmocka_unit_test(test_progress_and_fd),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}

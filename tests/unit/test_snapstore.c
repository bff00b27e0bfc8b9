/* Snapshot store, dir backend: publish/get round trips through real files,
 * key validation, a writer SIGKILLed mid-put leaving nothing complete,
 * content without its record never used, concurrent commits from separate
 * processes, tampered blobs refused at read time, gc. */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "snapstore.h"

#define SBX "sbx_test-01"

struct env {
	char base[64];
	char root[96];
	int basefd;
	struct snapstore *s;
};

/* setup: a scratch dir with a store under it and a small layer tree. */
static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct tt_err err = { 0 };
	int fd;

	if (e == NULL)
		return -1;
	strcpy(e->base, "/tmp/tt-store-XXXXXX");
	if (mkdtemp(e->base) == NULL)
		return -1;
	snprintf(e->root, sizeof(e->root), "%s/store", e->base);
	e->basefd = open(e->base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (e->basefd < 0 || snapstore_dir_open(e->root, &e->s, &err) < 0)
		return -1;
	if (mkdirat(e->basefd, "layer", 0755) < 0 ||
	    mkdirat(e->basefd, "layer/workspace", 0755) < 0)
		return -1;
	fd = openat(e->basefd, "layer/workspace/notes.txt", O_WRONLY | O_CREAT, 0644);
	if (fd < 0 || write(fd, "acknowledged write\n", 19) != 19)
		return -1;
	close(fd);
	*state = e;
	return 0;
}

/* teardown: closes the store and removes the scratch dir. */
static int teardown(void **state)
{
	struct env *e = *state;
	int tmp = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	snapstore_close(e->s);
	close(e->basefd);
	snapshot_rm_tree(tmp, e->base + strlen("/tmp/"), NULL);
	close(tmp);
	free(e);
	return 0;
}

/* layer_fd: the test layer directory. */
static int layer_fd(struct env *e)
{
	int fd = openat(e->basefd, "layer", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	assert_true(fd >= 0);
	return fd;
}

/* put_layer: the layer as sbx/gen. */
static int put_layer(struct env *e, struct snapstore *s, uint64_t gen,
                     struct tt_err *err)
{
	int fd = layer_fd(e), rc;

	rc = snapstore_put_tree(s, SBX, gen, fd, NULL, NULL, err);
	close(fd);
	return rc;
}

/* expect_notes: name/workspace/notes.txt under base holds the write. */
static void expect_notes(struct env *e, const char *name)
{
	char path[128], buf[64];
	int fd;

	snprintf(path, sizeof(path), "%s/workspace/notes.txt", name);
	fd = openat(e->basefd, path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, buf, sizeof(buf)), 19);
	assert_memory_equal(buf, "acknowledged write\n", 19);
	close(fd);
}

/* partial_count: files in <root>/.partial. */
static int partial_count(struct env *e)
{
	char path[128];
	DIR *d;
	struct dirent *de;
	int n = 0;

	snprintf(path, sizeof(path), "%s/.partial", e->root);
	d = opendir(path);
	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

static void test_keys(void **state)
{
	char key[SNAPSTORE_KEY_MAX], sbx[SNAPSTORE_SBX_MAX + 1];
	struct tt_err err = { 0 };
	uint64_t gen;
	struct env *e = *state;
	struct snapstore_put *p = NULL;

	assert_int_equal(snapstore_key(key, SBX, 42, &err), 0);
	assert_string_equal(key, SBX "/42");
	assert_int_equal(snapstore_key_parse(key, sbx, &gen, &err), 0);
	assert_string_equal(sbx, SBX);
	assert_int_equal(gen, 42);
	assert_int_equal(snapstore_key_parse("a/18446744073709551615", sbx, &gen, &err), 0);
	assert_int_equal(gen, UINT64_MAX);
	static const char *badkeys[] = { "a/0", "a/01", "a/", "/1", "a/1/2", "../1",
	                                 "a/18446744073709551616", "a/-1", "a b/1",
	                                 "a/1x" };
	for (size_t i = 0; i < sizeof(badkeys) / sizeof(badkeys[0]); i++)
		assert_int_equal(snapstore_key_parse(badkeys[i], sbx, &gen, &err), -1);
	assert_int_equal(snapstore_key(key, "..", 1, &err), -1);
	assert_int_equal(snapstore_key(key, "a/b", 1, &err), -1);
	assert_int_equal(snapstore_key(key, "", 1, &err), -1);
	assert_int_equal(snapstore_key(key, SBX, 0, &err), -1);
	/* The wrappers refuse a bad key before the backend sees it. */
	assert_int_equal(snapstore_put_begin(e->s, "../escape", 1, &p, &err), -1);
	assert_int_equal(err.code, TT_ERR_INVALID);
	assert_null(p);
}

static void test_roundtrip(void **state)
{
	struct env *e = *state;
	struct tt_err err = { 0 };
	struct snapstore_info info;
	struct snapshot_stats st;
	uint64_t gen = 0, *gens = NULL;
	size_t n = 0;

	assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	assert_int_equal(put_layer(e, e->s, 1, &err), 0);
	assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), 0);
	assert_int_equal(gen, 1);
	assert_int_equal(snapstore_stat(e->s, SBX, 1, &info, &err), 0);
	assert_true(info.complete);
	assert_int_equal(info.generation, 1);
	assert_true(info.size > 19);
	assert_int_equal(partial_count(e), 0);
	assert_int_equal(snapstore_get_tree(e->s, SBX, 1, e->basefd, "restored",
	                                    NULL, &st, &err), 0);
	assert_int_equal(st.stream_bytes, info.size);
	expect_notes(e, "restored");
	/* A published key is never replaced. */
	assert_int_equal(put_layer(e, e->s, 1, &err), -1);
	assert_int_equal(err.code, TT_ERR_CONFLICT);
	assert_int_equal(partial_count(e), 0);
	assert_int_equal(put_layer(e, e->s, 2, &err), 0);
	assert_int_equal(snapstore_list(e->s, SBX, &gens, &n, &err), 0);
	assert_int_equal(n, 2);
	assert_int_equal(gens[0], 1);
	assert_int_equal(gens[1], 2);
	free(gens);
	/* Remove unpublishes; latest falls back. */
	assert_int_equal(snapstore_remove(e->s, SBX, 2, &err), 0);
	assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), 0);
	assert_int_equal(gen, 1);
	assert_int_equal(snapstore_stat(e->s, SBX, 2, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	assert_int_equal(snapstore_remove(e->s, SBX, 2, &err), 0); /* idempotent */
	/* Another store handle on the same root (another worker) sees it. */
	{
		struct snapstore *s2 = NULL;

		assert_int_equal(snapstore_dir_open(e->root, &s2, &err), 0);
		assert_int_equal(snapstore_latest(s2, SBX, &gen, &err), 0);
		assert_int_equal(gen, 1);
		assert_int_equal(snapstore_get_tree(s2, SBX, 1, e->basefd, "other",
		                                    NULL, NULL, &err), 0);
		expect_notes(e, "other");
		snapstore_close(s2);
	}
}

/* list_str: the complete generations of SBX, "1 2 3". */
static void list_str(struct env *e, char *out, size_t cap)
{
	struct tt_err err = { 0 };
	uint64_t *gens = NULL;
	size_t n = 0, at = 0;

	assert_int_equal(snapstore_list(e->s, SBX, &gens, &n, &err), 0);
	out[0] = '\0';
	for (size_t i = 0; i < n; i++)
		at += (size_t)snprintf(out + at, cap - at, "%s%llu", i ? " " : "",
		                       (unsigned long long)gens[i]);
	free(gens);
}

/* Pruning after a newer snapshot was acknowledged: every complete
 * snapshot below it goes but the ones kept; it and newer ones (a pause
 * publishing now) are never touched; content without its record is
 * left to gc; pruning again is a no-op. */
static void test_prune(void **state)
{
	struct env *e = *state;
	struct tt_err err = { 0 };
	uint64_t keep[2] = { 5, 4 };
	unsigned removed = 9;
	char got[64];

	for (uint64_t g = 1; g <= 6; g++)
		assert_int_equal(put_layer(e, e->s, g, &err), 0);
	list_str(e, got, sizeof(got));
	assert_string_equal(got, "1 2 3 4 5 6");
	/* 5 acknowledged, 4 kept as the one older; 6 is newer: untouched. */
	assert_int_equal(snapstore_prune(e->s, SBX, 5, keep, 2, &removed, &err), 0);
	assert_int_equal(removed, 3);
	list_str(e, got, sizeof(got));
	assert_string_equal(got, "4 5 6");
	{
		char path[160];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s/1.snap", e->root, SBX);
		assert_int_equal(stat(path, &st), -1);
		snprintf(path, sizeof(path), "%s/%s/1.meta", e->root, SBX);
		assert_int_equal(stat(path, &st), -1);
	}
	assert_int_equal(snapstore_prune(e->s, SBX, 5, keep, 2, &removed, &err), 0);
	assert_int_equal(removed, 0);
	/* Nothing kept but the acknowledged one (--keep-snapshots 0). */
	assert_int_equal(snapstore_prune(e->s, SBX, 6, (uint64_t[]){ 6 }, 1, &removed, &err), 0);
	assert_int_equal(removed, 2);
	list_str(e, got, sizeof(got));
	assert_string_equal(got, "6");
	/* The survivor restores; a sandbox with nothing stored is fine. */
	assert_int_equal(snapstore_get_tree(e->s, SBX, 6, e->basefd, "after-prune", NULL,
	                                    NULL, &err), 0);
	expect_notes(e, "after-prune");
	assert_int_equal(snapstore_prune(e->s, "sbx_other", 9, NULL, 0, &removed, &err), 0);
	assert_int_equal(removed, 0);
}

static void test_bad_expect_and_abort(void **state)
{
	struct env *e = *state;
	struct tt_err err = { 0 };
	struct snapstore_put *p = NULL;
	struct snapstore_info info;
	uint8_t wrong[SNAPSTORE_HASH_LEN] = { 0 }, right[SNAPSTORE_HASH_LEN];

	assert_int_equal(snapstore_put_begin(e->s, SBX, 5, &p, &err), 0);
	assert_int_equal(snapstore_put_write(e->s, p, "hello", 5, &err), 0);
	assert_int_equal(partial_count(e), 1);
	assert_int_equal(snapstore_put_commit(e->s, p, wrong, NULL, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	assert_int_equal(partial_count(e), 0);
	assert_int_equal(snapstore_stat(e->s, SBX, 5, &info, &err), -1);
	assert_int_equal(snapstore_put_begin(e->s, SBX, 5, &p, &err), 0);
	assert_int_equal(snapstore_put_write(e->s, p, "hello", 5, &err), 0);
	snapstore_put_abort(e->s, p);
	assert_int_equal(partial_count(e), 0);
	/* Honest: the right checksum publishes. */
	crypto_generichash(right, sizeof(right), (const uint8_t *)"hello", 5, NULL, 0);
	assert_int_equal(snapstore_put_begin(e->s, SBX, 5, &p, &err), 0);
	assert_int_equal(snapstore_put_write(e->s, p, "hello", 5, &err), 0);
	assert_int_equal(snapstore_put_commit(e->s, p, right, &info, &err), 0);
	assert_true(info.complete);
	assert_memory_equal(info.blake2b, right, sizeof(right));
	/* A raw get reads exactly the bytes, then a verified end. */
	{
		struct snapstore_get *g = NULL;
		char buf[16];

		assert_int_equal(snapstore_get_open(e->s, SBX, 5, &g, &info, &err), 0);
		assert_int_equal(snapstore_get_read(e->s, g, buf, sizeof(buf), &err), 5);
		assert_memory_equal(buf, "hello", 5);
		assert_int_equal(snapstore_get_read(e->s, g, buf, sizeof(buf), &err), 0);
		snapstore_get_close(e->s, g);
	}
}

static void test_killed_writer(void **state)
{
	struct env *e = *state;
	struct tt_err err = { 0 };
	struct snapstore_info info;
	uint64_t gen = 0;
	unsigned removed = 0;
	int sync[2], status;
	pid_t pid;
	char c;

	assert_int_equal(put_layer(e, e->s, 1, &err), 0);
	assert_int_equal(pipe(sync), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* The writer: half a snapshot of generation 2, then it waits to
		 * be killed. */
		struct snapstore_put *p = NULL;
		static uint8_t half[1 << 20];

		close(sync[0]);
		if (snapstore_put_begin(e->s, SBX, 2, &p, &err) < 0 ||
		    snapstore_put_write(e->s, p, half, sizeof(half), &err) < 0)
			_exit(1);
		(void)write(sync[1], "w", 1);
		pause();
		_exit(0);
	}
	close(sync[1]);
	assert_int_equal(read(sync[0], &c, 1), 1);
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	close(sync[0]);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(partial_count(e), 1);
	assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), 0);
	assert_int_equal(gen, 1);
	assert_int_equal(snapstore_stat(e->s, SBX, 2, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);

	/* A writer that died between placing content and its record: the
	 * content exists but is not complete and is never opened. */
	{
		char path[160];
		int fd;

		snprintf(path, sizeof(path), "%s/%s/3.snap", e->root, SBX);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
		assert_true(fd >= 0);
		assert_int_equal(write(fd, "junk", 4), 4);
		close(fd);
		assert_int_equal(snapstore_stat(e->s, SBX, 3, &info, &err), 0);
		assert_false(info.complete);
		assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), 0);
		assert_int_equal(gen, 1);
		assert_int_equal(snapstore_get_tree(e->s, SBX, 3, e->basefd, "r3", NULL,
		                                    NULL, &err), -1);
		assert_int_equal(err.code, TT_ERR_NOT_FOUND);
		/* gc with a long horizon keeps fresh files ... */
		assert_int_equal(snapstore_gc(e->s, 3600, &removed, &err), 0);
		assert_int_equal(removed, 0);
		assert_int_equal(partial_count(e), 1);
		/* ... and removes them once old enough. */
		struct timespec old[2] = { { 1000, 0 }, { 1000, 0 } };

		assert_int_equal(utimensat(AT_FDCWD, path, old, 0), 0);
		assert_int_equal(snapstore_gc(e->s, 60, &removed, &err), 0);
		assert_int_equal(removed, 1);
		assert_int_equal(access(path, F_OK), -1);
		assert_int_equal(snapstore_gc(e->s, 0, &removed, &err), 0);
		assert_int_equal(removed, 1);
		assert_int_equal(partial_count(e), 0);
	}
	/* The complete one is untouched by gc and still restores. */
	assert_int_equal(snapstore_get_tree(e->s, SBX, 1, e->basefd, "r1", NULL,
	                                    NULL, &err), 0);
	expect_notes(e, "r1");
	/* The crashed generation can be written again by a new writer. */
	assert_int_equal(put_layer(e, e->s, 3, &err), 0);
	assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), 0);
	assert_int_equal(gen, 3);
}

static void test_concurrent_commits(void **state)
{
	struct env *e = *state;
	struct tt_err err = { 0 };
	uint64_t *gens = NULL;
	size_t n = 0;
	enum { ROUNDS = 10 };

	for (int r = 0; r < ROUNDS; r++) {
		int go[2], status;
		pid_t pids[2];

		assert_int_equal(pipe(go), 0);
		for (int k = 0; k < 2; k++) {
			pids[k] = fork();
			assert_true(pids[k] >= 0);
			if (pids[k] == 0) {
				/* Each child: its own store handle, a full snapshot
				 * written, then commit as soon as the gate opens. */
				struct snapstore *s = NULL;
				struct snapstore_put *p = NULL;
				static uint8_t data[256 << 10];
				uint8_t sum[SNAPSTORE_HASH_LEN];
				char ch;

				close(go[1]);
				randombytes_buf(data, sizeof(data));
				crypto_generichash(sum, sizeof(sum), data, sizeof(data), NULL, 0);
				if (snapstore_dir_open(e->root, &s, &err) < 0 ||
				    snapstore_put_begin(s, SBX, (uint64_t)(2 * r + k + 1), &p, &err) < 0 ||
				    snapstore_put_write(s, p, data, sizeof(data), &err) < 0 ||
				    read(go[0], &ch, 1) != 0 ||
				    snapstore_put_commit(s, p, sum, NULL, &err) < 0)
					_exit(1);
				snapstore_close(s);
				_exit(0);
			}
		}
		close(go[0]);
		close(go[1]); /* both children see EOF at once */
		for (int k = 0; k < 2; k++) {
			assert_int_equal(waitpid(pids[k], &status, 0), pids[k]);
			assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		}
	}
	assert_int_equal(snapstore_list(e->s, SBX, &gens, &n, &err), 0);
	assert_int_equal(n, 2 * ROUNDS);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(gens[i], i + 1);
	free(gens);
	assert_int_equal(partial_count(e), 0);
}

static void test_tampered(void **state)
{
	struct env *e = *state;
	struct tt_err err = { 0 };
	struct snapstore_info info;
	uint64_t gen;
	char path[160];
	int fd;
	uint8_t b;

	assert_int_equal(put_layer(e, e->s, 1, &err), 0);
	assert_int_equal(put_layer(e, e->s, 2, &err), 0);
	/* Flip one byte of generation 2's content on disk. */
	snprintf(path, sizeof(path), "%s/%s/2.snap", e->root, SBX);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, 40), 1);
	b ^= 0x20;
	assert_int_equal(pwrite(fd, &b, 1, 40), 1);
	assert_int_equal(snapstore_get_tree(e->s, SBX, 2, e->basefd, "r2", NULL,
	                                    NULL, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	assert_int_equal(faccessat(e->basefd, "r2", F_OK, 0), -1);
	/* Truncated content no longer matches its record: not complete. */
	assert_int_equal(ftruncate(fd, 10), 0);
	close(fd);
	assert_int_equal(snapstore_stat(e->s, SBX, 2, &info, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), 0);
	assert_int_equal(gen, 1);
	/* A record that does not parse (duplicate keys) is not complete. */
	snprintf(path, sizeof(path), "%s/%s/1.meta", e->root, SBX);
	fd = open(path, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	{
		const char *dup = "{\"generation\":1,\"generation\":1,\"size\":1,"
		                  "\"blake2b\":\"00\",\"created_at\":1}";

		assert_int_equal(write(fd, dup, strlen(dup)), (ssize_t)strlen(dup));
	}
	close(fd);
	assert_int_equal(snapstore_latest(e->s, SBX, &gen, &err), -1);
	assert_int_equal(err.code, TT_ERR_NOT_FOUND);
	assert_int_equal(snapstore_get_tree(e->s, SBX, 1, e->basefd, "r1", NULL,
	                                    NULL, &err), -1);
	assert_int_equal(faccessat(e->basefd, "r1", F_OK, 0), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_keys, setup, teardown),
		cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prune, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_expect_and_abort, setup, teardown),
		cmocka_unit_test_setup_teardown(test_killed_writer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_concurrent_commits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tampered, setup, teardown),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}

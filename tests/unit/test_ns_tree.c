/* ns_tree_remove (src/substrate/ns/ns_tree.c) on real trees: one deeper than
 * PATH_MAX (3000 levels, a 6000-byte path) and wide, gone entirely;
 * symlinks inside pointing at a directory and a file outside are removed
 * themselves, their targets untouched; a tree with a mount point inside
 * fails with the other filesystem's files intact (mount tests need root). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "substrate/ns/ns.h"

#define DEEP 3000

static char base[64];

/* setup: a fresh base directory under /tmp. */
static int setup(void **state)
{
	(void)state;
	snprintf(base, sizeof(base), "/tmp/tt-tree-XXXXXX");
	return mkdtemp(base) == NULL ? -1 : 0;
}

/* teardown: whatever is left (only after a failed test). */
static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf %s 2>/dev/null", base);
	return system(cmd) < 0 ? -1 : 0;
}

/* deep_tree: dir with DEEP nested "d" directories (a file at each tenth
 * level, a few siblings at the bottom), made fd-relative. */
static void deep_tree(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);

	assert_true(fd >= 0);
	for (int i = 0; i < DEEP; i++) {
		assert_int_equal(mkdirat(fd, "d", 0755), 0);
		if (i % 10 == 0) {
			int f = openat(fd, "f", O_CREAT | O_WRONLY, 0644);

			assert_true(f >= 0);
			assert_int_equal(write(f, "x", 1), 1);
			close(f);
		}
		int next = openat(fd, "d", O_RDONLY | O_DIRECTORY);

		assert_true(next >= 0);
		close(fd);
		fd = next;
	}
	for (int i = 0; i < 40; i++) {
		char n[16];

		snprintf(n, sizeof(n), "s%d", i);
		assert_int_equal(mkdirat(fd, n, 0755), 0);
	}
	close(fd);
}

/* test_deeper_than_path_max: rm -r style walks fail here; we do not. */
static void test_deeper_than_path_max(void **state)
{
	char tree[128], outside[128], keep[160], link1[160], link2[160];
	struct stat st;

	(void)state;
	snprintf(tree, sizeof(tree), "%s/sbx", base);
	snprintf(outside, sizeof(outside), "%s/outside", base);
	snprintf(keep, sizeof(keep), "%s/keep", outside);
	assert_int_equal(mkdir(tree, 0700), 0);
	assert_int_equal(mkdir(outside, 0700), 0);
	assert_int_equal(close(open(keep, O_CREAT | O_WRONLY, 0600)), 0);
	deep_tree(tree);
	/* Links planted inside: to a directory and to a file outside. */
	snprintf(link1, sizeof(link1), "%s/to-dir", tree);
	snprintf(link2, sizeof(link2), "%s/to-file", tree);
	assert_int_equal(symlink(outside, link1), 0);
	assert_int_equal(symlink(keep, link2), 0);
	assert_true(DEEP * 2 > PATH_MAX);

	struct tt_err err = { 0 };
	if (ns_tree_remove(tree, &err) < 0)
		fail_msg("ns_tree_remove: %s", err.msg);
	assert_int_equal(lstat(tree, &st), -1);
	assert_int_equal(errno, ENOENT);
	assert_int_equal(stat(keep, &st), 0);
	assert_int_equal(stat(outside, &st), 0);
	/* Absent is fine. */
	assert_int_equal(ns_tree_remove(tree, &err), 0);
}

/* test_symlink_top_and_mount: a symlink in the tree's own place is
 * unlinked, not followed; a mount point inside is never entered. */
static void test_symlink_top_and_mount(void **state)
{
	char tree[96], target[96], inner[128], mnt[160], f[224];
	struct tt_err err = { 0 };
	struct stat st;

	(void)state;
	snprintf(tree, sizeof(tree), "%s/link", base);
	snprintf(target, sizeof(target), "%s/target", base);
	snprintf(inner, sizeof(inner), "%s/inner", target);
	assert_int_equal(mkdir(target, 0700), 0);
	assert_int_equal(mkdir(inner, 0700), 0);
	assert_int_equal(symlink(target, tree), 0);
	assert_int_equal(ns_tree_remove(tree, &err), 0);
	assert_int_equal(lstat(tree, &st), -1);
	assert_int_equal(stat(inner, &st), 0);
	/* A symlink among the directories leading to it: refused. */
	snprintf(f, sizeof(f), "%s/link2/inner", base);
	snprintf(tree, sizeof(tree), "%s/link2", base);
	assert_int_equal(symlink(target, tree), 0);
	assert_int_equal(ns_tree_remove(f, &err), -1);
	assert_int_equal(stat(inner, &st), 0);
	if (geteuid() != 0)
		return;
	snprintf(mnt, sizeof(mnt), "%s/m", inner);
	assert_int_equal(mkdir(mnt, 0700), 0);
	assert_int_equal(mount("tmpfs", mnt, "tmpfs", 0, "size=1m"), 0);
	snprintf(f, sizeof(f), "%s/other-fs", mnt);
	assert_int_equal(close(open(f, O_CREAT | O_WRONLY, 0600)), 0);
	assert_int_equal(ns_tree_remove(target, &err), -1);
	assert_int_equal(stat(f, &st), 0);
	assert_int_equal(umount(mnt), 0);
	assert_int_equal(ns_tree_remove(target, &err), 0);
	assert_int_equal(lstat(target, &st), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_deeper_than_path_max, setup, teardown),
		cmocka_unit_test_setup_teardown(test_symlink_top_and_mount, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

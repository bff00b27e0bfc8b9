/* Removal of sandbox directory trees of any depth, fd-relative. A tenant
 * shapes what is under its sandbox's directory (its layer, its run dir):
 * nftw() walks by path and fails past PATH_MAX (a tree deeper than that
 * survived `rm`), and a path walk can be raced into a symlink. Here every
 * step is openat/unlinkat on a directory fd opened O_NOFOLLOW: no symlink
 * is ever followed (a symlink is unlinked, never entered), no mount point
 * is entered (another filesystem's directory is left, and the removal
 * fails), and the walk is iterative: at most NS_TREE_DEPTH directories are
 * open at once; a directory found deeper is first renamed up to the top of
 * the tree (same filesystem: rename never crosses one), and removed from
 * there. So neither the C stack nor the fd table grows with the depth. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"
#include "substrate/ns/ns.h"

/* Directories open at once: the walk's depth before it flattens. */
#define NS_TREE_DEPTH 32

/* One open directory of the walk, and the name it has in its parent. */
struct tree_level {
	DIR *d;
	char name[NAME_MAX + 1];
};

/* tree_flatten_name: a fresh name for a subtree moved to the top. */
static int tree_flatten(int from_fd, const char *name, int top_fd, uint64_t *serial)
{
	char to[48];

	for (int tries = 0; tries < 1000; tries++) {
		snprintf(to, sizeof(to), ".tt-rm-%" PRIu64, (*serial)++);
		if (renameat2(from_fd, name, top_fd, to, RENAME_NOREPLACE) == 0)
			return 0;
		if (errno != EEXIST)
			return -1;
	}
	errno = EEXIST;
	return -1;
}

/* tree_empty: removes everything inside the directory top_fd (which stays),
 * never leaving dev. 0, or -1 with errno of the first failure (the walk goes
 * on past it and removes what it can). */
static int tree_empty(int top_fd, dev_t dev)
{
	struct tree_level lv[NS_TREE_DEPTH];
	int depth = 0, first_errno = 0;
	uint64_t serial = 0;
	bool progress = true;
	int fd0 = fcntl(top_fd, F_DUPFD_CLOEXEC, 0);

	if (fd0 < 0 || (lv[0].d = fdopendir(fd0)) == NULL) {
		if (fd0 >= 0)
			close(fd0);
		return -1;
	}
	lv[0].name[0] = '\0';
	for (;;) {
		DIR *d = lv[depth].d;
		int dfd = dirfd(d);
		struct dirent *de;
		struct stat st;

		errno = 0;
		de = readdir(d);
		if (de == NULL) {
			if (depth == 0) {
				/* Subtrees renamed up here may come after the end
				 * of this pass: pass again while anything went. */
				if (!progress)
					break;
				progress = false;
				rewinddir(d);
				continue;
			}
			closedir(d);
			depth--;
			if (unlinkat(dirfd(lv[depth].d), lv[depth + 1].name, AT_REMOVEDIR) < 0) {
				if (first_errno == 0)
					first_errno = errno;
			} else {
				progress = true;
			}
			continue;
		}
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT && first_errno == 0)
				first_errno = errno;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			/* A symlink is removed itself, never followed. */
			if (unlinkat(dfd, de->d_name, 0) == 0)
				progress = true;
			else if (errno != ENOENT && first_errno == 0)
				first_errno = errno;
			continue;
		}
		if (st.st_dev != dev) {
			/* A mount point: another filesystem, never entered. */
			if (first_errno == 0)
				first_errno = EBUSY;
			continue;
		}
		if (unlinkat(dfd, de->d_name, AT_REMOVEDIR) == 0) {
			progress = true; /* it was empty */
			continue;
		}
		if (depth + 1 >= NS_TREE_DEPTH) {
			/* Too deep to keep open: continue it from the top. */
			if (tree_flatten(dfd, de->d_name, dirfd(lv[0].d), &serial) == 0)
				progress = true;
			else if (first_errno == 0)
				first_errno = errno;
			continue;
		}
		int cfd = openat(dfd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		DIR *cd = cfd >= 0 ? fdopendir(cfd) : NULL;
		struct stat cst;

		if (cd == NULL || fstat(cfd, &cst) < 0 || cst.st_dev != dev ||
		    cst.st_ino != st.st_ino) {
			/* Gone, replaced or mounted on since the fstatat. */
			if (first_errno == 0)
				first_errno = cd == NULL ? errno : EBUSY;
			if (cd != NULL)
				closedir(cd);
			else if (cfd >= 0)
				close(cfd);
			continue;
		}
		depth++;
		lv[depth].d = cd;
		snprintf(lv[depth].name, sizeof(lv[depth].name), "%s", de->d_name);
	}
	closedir(lv[0].d);
	if (first_errno != 0) {
		errno = first_errno;
		return -1;
	}
	return 0;
}

/* ns_tree_remove: see ns.h. */
int ns_tree_remove(const char *path, struct tt_err *err)
{
	char parent[PATH_MAX];
	const char *slash = path != NULL ? strrchr(path, '/') : NULL;
	struct open_how how = {
		.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	struct stat st;
	int pfd, fd, rc;

	if (slash == NULL || path[0] != '/' || slash[1] == '\0' ||
	    (size_t)(slash - path) >= sizeof(parent))
		return tt_err_set(err, TT_ERR_INVALID, "remove: %.200s is not an absolute path "
		                  "to a directory", path != NULL ? path : "(null)");
	memcpy(parent, path, (size_t)(slash - path));
	parent[slash - path] = '\0';
	/* Our own directories down to the tree: no symlink anywhere. */
	pfd = fsutil_openat2(AT_FDCWD, parent[0] ? parent : "/", &how);
	if (pfd < 0)
		return errno == ENOENT ? 0 : tt_err_sys(err, TT_ERR_IO, "remove: open %.200s",
		                                          parent);
	fd = openat(pfd, slash + 1, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;

		if (e == ENOENT) {
			close(pfd);
			return 0;
		}
		/* Not a directory (or a symlink in its place): unlink the entry. */
		rc = (e == ENOTDIR || e == ELOOP) ? unlinkat(pfd, slash + 1, 0) : -1;
		close(pfd);
		if (rc < 0 && errno != ENOENT) {
			errno = e;
			return tt_err_sys(err, TT_ERR_IO, "remove: open %.200s", path);
		}
		return 0;
	}
	if (fstat(fd, &st) < 0) {
		tt_err_sys(err, TT_ERR_IO, "remove: stat %.200s", path);
		close(fd);
		close(pfd);
		return -1;
	}
	rc = tree_empty(fd, st.st_dev);
	close(fd);
	if (rc < 0) {
		tt_err_sys(err, TT_ERR_IO, "remove: emptying %.200s", path);
		close(pfd);
		return -1;
	}
	rc = unlinkat(pfd, slash + 1, AT_REMOVEDIR);
	close(pfd);
	if (rc < 0 && errno != ENOENT)
		return tt_err_sys(err, TT_ERR_IO, "remove: rmdir %.200s", path);
	return 0;
}

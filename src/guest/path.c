/* Request paths: validation and resolution confined to the guest root.
 * Every lookup goes through openat2(RESOLVE_IN_ROOT): ".." and absolute
 * symlinks are resolved as if the root were "/", so no path or symlink can
 * lead outside it; magic links (/proc/PID/fd/…) are refused outright. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fsutil.h"
#include "guest/guest.h"

/* path_check: absolute, bounded, no NUL, no ".." component. */
int path_check(const char *path, size_t len, struct tt_err *err)
{
	const char *p;

	if (path == NULL || len == 0)
		return tt_err_set(err, TT_ERR_INVALID, "path is empty");
	if (len > GUEST_PATH_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "path longer than %d bytes", GUEST_PATH_MAX);
	if (strlen(path) != len)
		return tt_err_set(err, TT_ERR_INVALID, "path contains a NUL byte");
	if (path[0] != '/')
		return tt_err_set(err, TT_ERR_INVALID, "path is not absolute");
	for (p = path; *p != '\0';) {
		size_t n;

		p += strspn(p, "/");
		n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.')
			return tt_err_set(err, TT_ERR_INVALID,
			                  "path has a \"..\" component");
		p += n;
	}
	return 0;
}

/* openat2_in_root: one confined lookup relative to the root; retries the
 * EAGAIN the kernel returns when a concurrent rename raced the walk. */
static int openat2_in_root(int dirfd, const char *rel, int flags, mode_t mode)
{
	struct open_how how = {
		.flags = (uint64_t)(flags | O_CLOEXEC),
		.mode = (flags & (O_CREAT | O_TMPFILE)) ? mode : 0,
		.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
	};

	return fsutil_openat2(dirfd, rel, &how);
}

/* path_open: resolves the whole path inside the root. */
int path_open(const struct guest_ctx *g, const char *path, int flags,
              mode_t mode)
{
	const char *rel = path + strspn(path, "/");

	if (*rel == '\0')
		rel = ".";
	return openat2_in_root(g->root_fd, rel, flags, mode);
}

/* path_open_parent: splits off the last component and opens its directory
 * inside the root; the component is then used with *at() calls on that fd,
 * where it is a single name that cannot walk anywhere. */
int path_open_parent(const struct guest_ctx *g, const char *path,
                     char base[NAME_MAX + 1])
{
	char dir[GUEST_PATH_MAX + 2];
	size_t len = strlen(path);
	const char *slash;
	size_t blen;

	while (len > 1 && path[len - 1] == '/')
		len--;
	if (len >= sizeof(dir)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(dir, path, len);
	dir[len] = '\0';
	slash = strrchr(dir, '/');
	if (slash == NULL || slash[1] == '\0') {
		errno = EINVAL; /* the root itself has no parent */
		return -1;
	}
	blen = strlen(slash + 1);
	if (blen > NAME_MAX) {
		errno = ENAMETOOLONG;
		return -1;
	}
	if (strcmp(slash + 1, ".") == 0 || strcmp(slash + 1, "..") == 0) {
		errno = EINVAL;
		return -1;
	}
	memcpy(base, slash + 1, blen + 1);
	dir[slash - dir] = '\0';
	return path_open(g, dir[0] == '\0' ? "/" : dir,
	                 O_RDONLY | O_DIRECTORY, 0);
}

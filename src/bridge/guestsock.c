/* The guest socket, reached fd-relative (guestsock.h). The sandbox's root
 * owns the directory the socket lives in (its /run/tether, a tmpfs of its
 * own mounted nosymfollow on a root-only directory of the manager's), so
 * it can put anything at the socket's name at any moment: a symlink to a
 * host socket, another socket, a FIFO. Nothing here follows a link, and
 * the file checked is the file connected to. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bridge/guestsock.h"
#include "fsutil.h"

/* guestsock_open: see guestsock.h. */
int guestsock_open(struct guestsock *g, const char *path, struct tt_err *err)
{
	char dir[PATH_MAX];
	const char *slash = path != NULL ? strrchr(path, '/') : NULL;
	struct open_how how = {
		.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};

	g->dir_fd = -1;
	g->name[0] = '\0';
	if (slash == NULL || path[0] != '/' || slash[1] == '\0' ||
	    strlen(slash + 1) > NAME_MAX || (size_t)(slash - path) >= sizeof(dir))
		return tt_err_set(err, TT_ERR_INVALID, "guest socket path %.200s: not absolute "
		                  "or no file name", path != NULL ? path : "(null)");
	memcpy(dir, path, (size_t)(slash - path));
	dir[slash - path] = '\0';
	g->dir_fd = fsutil_openat2(AT_FDCWD, dir[0] ? dir : "/", &how);
	if (g->dir_fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open the guest socket's directory %.200s "
		                  "(no symlinks)", dir);
	snprintf(g->name, sizeof(g->name), "%s", slash + 1);
	snprintf(g->via_fd, sizeof(g->via_fd), "/proc/self/fd/%d/%s", g->dir_fd, g->name);
	return 0;
}

/* guestsock_file: see guestsock.h. */
int guestsock_file(const struct guestsock *g, struct unixaddr *ua, struct tt_err *err)
{
	struct stat st = { 0 };

	memset(ua, 0, sizeof(*ua));
	ua->sa.sun_family = AF_UNIX;
	ua->fd = -1;
	if (g->dir_fd < 0)
		return tt_err_set(err, TT_ERR_INVALID, "guest socket directory not open");
	/* O_PATH opens nothing (a FIFO or device there does not block or
	 * act); with O_NOFOLLOW it opens a symlink itself: refused below. */
	ua->fd = openat(g->dir_fd, g->name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (ua->fd < 0)
		return tt_err_sys(err, errno == ENOENT ? TT_ERR_NOT_FOUND : TT_ERR_IO,
		                  "open %s in the guest socket's directory", g->name);
	if (fstat(ua->fd, &st) < 0 || !S_ISSOCK(st.st_mode)) {
		int e = S_ISLNK(st.st_mode) ? ELOOP : ENOTSOCK;

		unixaddr_done(ua);
		errno = e;
		return tt_err_sys(err, TT_ERR_INVALID, "%s is not a socket file", g->name);
	}
	snprintf(ua->sa.sun_path, sizeof(ua->sa.sun_path), "/proc/self/fd/%d", ua->fd);
	return 0;
}

/* guestsock_close: see guestsock.h. */
void guestsock_close(struct guestsock *g)
{
	if (g->dir_fd >= 0)
		close(g->dir_fd);
	g->dir_fd = -1;
}

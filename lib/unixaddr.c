/* Unix socket addresses for paths of any length (see unixaddr.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "cleanup.h"
#include "unixaddr.h"

/* fits: path can be put in sun_path as it is (with its NUL). */
static bool fits(const char *path)
{
	return strlen(path) < sizeof(((struct sockaddr_un *)0)->sun_path);
}

/* unixaddr_dir: see unixaddr.h. */
int unixaddr_dir(const char *path, struct unixaddr *ua, struct tt_err *err)
{
	char dir[PATH_MAX];
	const char *slash, *name;
	size_t dlen;
	int n;

	memset(ua, 0, sizeof(*ua));
	ua->sa.sun_family = AF_UNIX;
	ua->fd = -1;
	if (path == NULL || path[0] == '\0')
		return tt_err_set(err, TT_ERR_INVALID, "empty unix socket path");
	if (fits(path)) {
		memcpy(ua->sa.sun_path, path, strlen(path) + 1);
		return 0;
	}
	slash = strrchr(path, '/');
	if (slash == NULL) /* a relative name that long: one component */
		return tt_err_set(err, TT_ERR_INVALID, "unix socket name too long: %.64s...",
		                  path);
	name = slash + 1;
	dlen = slash == path ? 1 : (size_t)(slash - path);
	if (dlen >= sizeof(dir) || name[0] == '\0')
		return tt_err_set(err, TT_ERR_INVALID, "bad unix socket path %.64s...", path);
	memcpy(dir, path, dlen);
	dir[dlen] = '\0';
	ua->fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (ua->fd < 0)
		return tt_err_sys(err, errno == ENOENT ? TT_ERR_NOT_FOUND : TT_ERR_IO,
		                  "open the socket's directory %.200s", dir);
	n = snprintf(ua->sa.sun_path, sizeof(ua->sa.sun_path), "/proc/self/fd/%d/%s", ua->fd,
	             name);
	if (n < 0 || (size_t)n >= sizeof(ua->sa.sun_path)) {
		unixaddr_done(ua);
		return tt_err_set(err, TT_ERR_INVALID, "unix socket name too long: %.64s", name);
	}
	return 0;
}

/* unixaddr_file: see unixaddr.h. */
int unixaddr_file(const char *path, struct unixaddr *ua, struct tt_err *err)
{
	struct stat st = { 0 };

	memset(ua, 0, sizeof(*ua));
	ua->sa.sun_family = AF_UNIX;
	ua->fd = -1;
	if (path == NULL || path[0] == '\0')
		return tt_err_set(err, TT_ERR_INVALID, "empty unix socket path");
	/* O_PATH opens nothing (a FIFO or device there does not block or
	 * act); O_NOFOLLOW: a symlink is refused (ELOOP), not followed. */
	ua->fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (ua->fd < 0)
		return tt_err_sys(err, errno == ENOENT ? TT_ERR_NOT_FOUND : TT_ERR_IO,
		                  "open %.200s", path);
	/* With O_PATH, O_NOFOLLOW opens a symlink itself rather than fail:
	 * only a socket file is taken. */
	if (fstat(ua->fd, &st) < 0 || !S_ISSOCK(st.st_mode)) {
		int e = S_ISLNK(st.st_mode) ? ELOOP : ENOTSOCK;

		unixaddr_done(ua);
		errno = e;
		return tt_err_sys(err, TT_ERR_INVALID, "%.200s is not a socket file", path);
	}
	snprintf(ua->sa.sun_path, sizeof(ua->sa.sun_path), "/proc/self/fd/%d", ua->fd);
	return 0;
}

/* unixaddr_done: see unixaddr.h. */
void unixaddr_done(struct unixaddr *ua)
{
	if (ua->fd >= 0)
		close(ua->fd);
	ua->fd = -1;
}

/* unixaddr_bind: see unixaddr.h. */
int unixaddr_bind(const char *path, struct tt_err *err)
{
	_cleanup_close_ int fd = -1;
	struct unixaddr ua;
	mode_t old;
	int rc;

	if (unixaddr_dir(path, &ua, err) < 0)
		return -1;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		unixaddr_done(&ua);
		return tt_err_sys(err, TT_ERR_SYS, "socket");
	}
	unlink(path);
	old = umask(077);
	rc = bind(fd, (struct sockaddr *)&ua.sa, sizeof(ua.sa)) < 0 ? errno : 0;
	umask(old);
	unixaddr_done(&ua);
	if (rc != 0) {
		errno = rc;
		return tt_err_sys(err, TT_ERR_IO, "bind %.200s", path);
	}
	if (chmod(path, 0600) < 0)
		return tt_err_sys(err, TT_ERR_IO, "chmod %.200s", path);
	return tt_steal_fd(&fd);
}

/* unixaddr_connect: see unixaddr.h. */
int unixaddr_connect(const char *path, int timeout_ms, struct tt_err *err)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000 };
	_cleanup_close_ int fd = -1;
	struct unixaddr ua;
	int rc;

	if (unixaddr_dir(path, &ua, err) < 0)
		return -1;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || (timeout_ms > 0 &&
	               (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	                setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0))) {
		rc = errno;
		unixaddr_done(&ua);
		errno = rc;
		return tt_err_sys(err, TT_ERR_SYS, "socket");
	}
	do
		rc = connect(fd, (struct sockaddr *)&ua.sa, sizeof(ua.sa)) < 0 ? errno : 0;
	while (rc == EINTR);
	unixaddr_done(&ua);
	if (rc != 0) {
		errno = rc;
		return tt_err_sys(err, TT_ERR_TRANSPORT, "connect %.200s", path);
	}
	return tt_steal_fd(&fd);
}

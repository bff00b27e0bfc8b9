/* File-descriptor helpers (see fsutil.h). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fsutil.h"

/* fsutil_openat2: the kernel returns EAGAIN when a concurrent rename raced
 * the confined walk; a few retries, never an endless loop on a tree that
 * untrusted code keeps renaming. */
int fsutil_openat2(int dirfd, const char *rel, const struct open_how *how)
{
	long fd = -1;

	for (int i = 0; i < 16; i++) {
		fd = syscall(SYS_openat2, dirfd, rel, how, sizeof(*how));
		if (fd >= 0 || (errno != EAGAIN && errno != EINTR))
			break;
	}
	return (int)fd;
}

/* fsutil_write_all: short writes continue where they stopped. */
int fsutil_write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			errno = EIO;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* fsutil_read_to_eof: see fsutil.h; one byte past cap tells "too big"
 * from "exactly cap". */
ssize_t fsutil_read_to_eof(int fd, void *buf, size_t cap)
{
	size_t got = 0;

	for (;;) {
		char extra;
		ssize_t n = got < cap ? read(fd, (char *)buf + got, cap - got)
		                      : read(fd, &extra, 1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			return (ssize_t)got;
		if (got == cap) {
			errno = EFBIG;
			return -1;
		}
		got += (size_t)n;
	}
}

/* fsutil_sibling_bin: see fsutil.h. */
int fsutil_sibling_bin(const char *name, char *out, size_t cap, struct tt_err *err)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash;

	if (n <= 0)
		return tt_err_sys(err, TT_ERR_SYS, "readlink /proc/self/exe");
	self[n] = '\0';
	slash = strrchr(self, '/');
	if (slash == NULL)
		return tt_err_set(err, TT_ERR_SYS, "odd /proc/self/exe: %.200s", self);
	*slash = '\0';
	if ((size_t)snprintf(out, cap, "%s/%s", self, name) >= cap)
		return tt_err_set(err, TT_ERR_INVALID, "%s: path too long", name);
	return 0;
}

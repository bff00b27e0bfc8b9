/* Small file-descriptor helpers shared by the snapshot code (lib/) and the
 * static guest agent (src/guest/), which links this object on its own: no
 * libuv, jansson or sodium here. Implementation: lib/fsutil.c. */
#ifndef TT_FSUTIL_H
#define TT_FSUTIL_H

#include <linux/openat2.h>
#include <stddef.h>
#include <sys/types.h>

#include "err.h"

/* fsutil_openat2: openat2(dirfd, rel, how), retried on EAGAIN / EINTR (a
 * bounded number of times); the fd, or -1 with errno. */
int fsutil_openat2(int dirfd, const char *rel, const struct open_how *how);
/* fsutil_write_all: all len bytes to fd, EINTR retried; 0, or -1 with
 * errno (EIO when the kernel accepted nothing). */
int fsutil_write_all(int fd, const void *buf, size_t len);
/* fsutil_read_to_eof: everything fd holds until EOF (a pipe its writer
 * filled and closed), at most cap bytes, EINTR retried; the byte count,
 * or -1 with errno (EFBIG when more than cap bytes came). Blocks until
 * EOF. */
ssize_t fsutil_read_to_eof(int fd, void *buf, size_t cap);

/* fsutil_sibling_bin: DIR/name, where DIR holds this process's own
 * executable (the lean binaries tether-bridge, tether-signer live next
 * to tetherd); -1 + err when /proc/self/exe is odd or out is too small. */
int fsutil_sibling_bin(const char *name, char *out, size_t cap, struct tt_err *err);

#endif

/* Unix socket addresses for paths of any length. sun_path holds 108 bytes,
 * so a socket under a long state directory cannot be named directly; the
 * kernel resolves the name given to bind/connect like any path, though,
 * and /proc/self/fd/N names our own open fd N (a magic link the lookup
 * follows, also for a process that dropped privileges: the fd table is
 * always its own). So:
 *  - unixaddr_dir: the path itself when it fits, else
 *    "/proc/self/fd/<D>/<name>" with D an O_PATH fd of its directory:
 *    bind creates the socket file in that directory, connect looks the
 *    name up there, exactly as with the full path;
 *  - unixaddr_file: "/proc/self/fd/<F>" with F an O_PATH, O_NOFOLLOW fd
 *    of the socket file itself, always (whatever the length): a connect
 *    reaches exactly that inode, the one the caller checked through F,
 *    even if the name is replaced meanwhile.
 * Limits: /proc must be mounted, the last component must be short (the
 * alias is at most 25 + its length bytes), and the alias means something
 * only to the process that made it (the kernel records it as the
 * socket's bound name, e.g. in `ss -x` or getsockname; nothing here reads
 * that name back). The fd is held until unixaddr_done: bind or connect
 * before that (a connect on a unix socket is resolved within the call).
 * Implementation: lib/unixaddr.c. */
#ifndef TT_UNIXADDR_H
#define TT_UNIXADDR_H

#include <sys/socket.h>
#include <sys/un.h>

#include "err.h"

struct unixaddr {
	struct sockaddr_un sa;  /* sun_path: the name to bind or connect */
	int fd;                 /* O_PATH fd the name goes through, or -1 */
};

/* unixaddr_dir: see above. -1 with err when the directory cannot be
 * opened (errno kept) or the last component is too long. */
int unixaddr_dir(const char *path, struct unixaddr *ua, struct tt_err *err);
/* unixaddr_file: see above; fstat(ua->fd) is the socket file reached. -1
 * with err (errno kept) when it cannot be opened (e.g. ENOENT) or is not
 * a socket file (ELOOP for a symlink, ENOTSOCK otherwise). */
int unixaddr_file(const char *path, struct unixaddr *ua, struct tt_err *err);
/* unixaddr_done: closes the fd (idempotent). */
void unixaddr_done(struct unixaddr *ua);
/* unixaddr_bind: a SOCK_STREAM unix socket (close-on-exec) bound at path
 * (any length, via unixaddr_dir) under umask 077, so that it is never
 * reachable by others, then chmod 0600; a stale file there is replaced.
 * Returns the fd, or -1 with err. */
int unixaddr_bind(const char *path, struct tt_err *err);
/* unixaddr_connect: a blocking SOCK_STREAM connection (close-on-exec) to
 * the socket at path (any length, via unixaddr_dir); with timeout_ms > 0
 * the connect and every later send and receive on it are bounded by that
 * (SO_SNDTIMEO, SO_RCVTIMEO). -1 with err. */
int unixaddr_connect(const char *path, int timeout_ms, struct tt_err *err);

#endif

/* Kernel socket evidence for bridge verification (SPEC §5): which unix
 * socket listens at a path (NETLINK_SOCK_DIAG / UNIX_DIAG with
 * UDIAG_SHOW_VFS), and which process holds it (/proc/<pid>/fd). sock_diag
 * answers only for the caller's network namespace: a sandbox's listener is
 * found with sockdiag_unix_listener_in_netns(/proc/<init>/ns/net fd). */
#ifndef TT_SOCKDIAG_H
#define TT_SOCKDIAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "procid.h"

/* At most this many fds of a process are scanned for a socket inode. */
#define SOCKDIAG_MAX_FDS 4096

struct unix_listener_info {
	uint32_t ino;       /* socket inode (udiag_ino), as in "socket:[ino]" */
	uint32_t vfs_ino;   /* inode of the bound socket file */
	uint32_t vfs_dev;   /* kernel-internal dev_t of its file system */
	uint32_t uid;       /* socket owner uid (UNIX_DIAG_UID) if has_uid */
	bool has_uid;
	uint8_t state;      /* TCP_LISTEN (10) */
	char name[109];     /* bound name as the kernel reports it ("" if none) */
};

/* sockdiag_kdev: st_dev (userspace encoding) as the kernel-internal dev_t
 * that sock_diag reports in udiag_vfs_dev: major << 20 | minor. */
uint32_t sockdiag_kdev(dev_t st_dev);

/* sockdiag_reply_parse: one received buffer of n bytes (nlmsghdr-aligned)
 * of a UNIX_DIAG dump tagged seq: looks for the LISTENING socket bound to
 * the file (kdev, vfs_ino), every length bounded by n. 1: the answer is
 * known (a match, in *out, and *found set; with to_end only at the dump's
 * NLMSG_DONE); 0: read the next buffer; -1 with err: malformed, the
 * kernel's error, or the dump ended without a match (NOT_FOUND). *found
 * starts false and carries across the buffers of one dump. Exposed for
 * fuzz/fuzz_sockdiag.c. */
int sockdiag_reply_parse(const void *buf, size_t n, uint32_t seq, bool to_end,
                         uint32_t kdev, uint32_t vfs_ino,
                         struct unix_listener_info *out, bool *found,
                         struct tt_err *err);

/* sockdiag_unix_find_vfs: the LISTENING unix socket whose bound file is
 * (kdev, vfs_ino), in the caller's network namespace. -1 with NOT_FOUND
 * when there is none. */
int sockdiag_unix_find_vfs(uint32_t kdev, uint32_t vfs_ino,
                           struct unix_listener_info *out, struct tt_err *err);

/* sockdiag_unix_listener: the LISTENING unix socket bound at path (matched
 * by the socket file's dev + inode), caller's network namespace. */
int sockdiag_unix_listener(const char *path, struct unix_listener_info *out,
                           struct tt_err *err);

/* sockdiag_unix_listener_in_netns: the same, queried from a short-lived
 * thread that setns()'d into netns_fd (e.g. open("/proc/<pid>/ns/net")).
 * netns_fd < 0 means the caller's own namespace. */
int sockdiag_unix_listener_in_netns(int netns_fd, const char *path,
                                    struct unix_listener_info *out,
                                    struct tt_err *err);

/* sockdiag_open_in_netns: a NETLINK_SOCK_DIAG socket (owned by the caller)
 * created once inside netns_fd's network namespace (< 0: the caller's own).
 * The calling thread joins that namespace just to create the socket and
 * returns to its own; should the return fail, -1 with *stuck (may be NULL)
 * set says the thread is still there and must not go on. A socket stays
 * bound to the namespace it was created in, so queries on it need no
 * further setns. */
int sockdiag_open_in_netns(int netns_fd, bool *stuck, struct tt_err *err);

/* sockdiag_unix_find_vfs_on: sockdiag_unix_find_vfs on such a socket nl,
 * reused across queries (fresh sequence number each, dump read to its
 * end). Not for concurrent use of one nl from several threads. */
int sockdiag_unix_find_vfs_on(int nl, uint32_t kdev, uint32_t vfs_ino,
                              struct unix_listener_info *out, struct tt_err *err);

/* sockdiag_inode_owned_by: 0 if pid has an fd on socket inode socket_ino
 * ("socket:[ino]" in /proc/<pid>/fd), -1 with NOT_FOUND if not (or
 * TOO_LARGE past SOCKDIAG_MAX_FDS fds). */
int sockdiag_inode_owned_by(pid_t pid, uint32_t socket_ino, struct tt_err *err);

/* verify_listener: the unix socket file at path is owned by expected->uid,
 * a LISTENING socket is bound to that very file (sock_diag, in netns_fd or
 * the caller's namespace if < 0), and the expected process (pid + start
 * time + exe + uid, pinned by pidfd and rechecked) holds that socket.
 * -1 with TT_ERR_VERIFY and the reason. Clients should also run
 * verify_peer() on the connected fd (SO_PEERCRED of a connection names the
 * process that called listen()) before sending anything. */
int verify_listener(const char *path, int netns_fd,
                    const struct proc_identity *expected, struct tt_err *err);

/* verify_listener_nl: verify_listener with the sock_diag query sent on nl
 * (from sockdiag_open_in_netns, in the listener's namespace) instead of a
 * thread + setns + fresh socket per call. The same checks. */
int verify_listener_nl(const char *path, int nl,
                       const struct proc_identity *expected, struct tt_err *err);

/* verify_listener_fd_nl: verify_listener_nl of the socket file file_fd
 * holds (an O_PATH fd, e.g. unixaddr_file's): the file checked is the one
 * a connect through "/proc/self/fd/<file_fd>" reaches, whatever the path
 * names meanwhile; path must still name it at the end (the recheck), and
 * is used in messages. */
int verify_listener_fd_nl(int file_fd, const char *path, int nl,
                          const struct proc_identity *expected, struct tt_err *err);

#endif

/* Kernel socket evidence: sock_diag UNIX_DIAG and /proc fd scans (see
 * sockdiag.h, SPEC §5). */
#include "sockdiag.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "cleanup.h"
#include "refusal.h"

#define UNIX_STATE_LISTEN 10 /* TCP_LISTEN: unix sockets reuse TCP states */
/* A dump is read in rounds of one buffer each; this bounds the work on a
 * host with very many sockets (~300 listeners per round). */
#define DIAG_MAX_ROUNDS 65536
#define DIAG_SEQ 0x7e7e

/* sockdiag_kdev: userspace st_dev to the kernel-internal dev_t. */
uint32_t sockdiag_kdev(dev_t st_dev)
{
	/* The kernel keeps dev_t as major << 20 | minor (MINORBITS = 20);
	 * stat() reports it re-encoded (new_encode_dev), so convert back. */
	return (uint32_t)((major(st_dev) << 20) | (minor(st_dev) & 0xfffff));
}

/* diag_parse_one: fills info from one SOCK_DIAG_BY_FAMILY message of hlen
 * bytes (header included, already checked to hold a unix_diag_msg); walks
 * its attributes with bounds checks. has_vfs tells whether VFS came. */
static void diag_parse_one(const struct nlmsghdr *h, uint32_t hlen,
                           struct unix_listener_info *info, bool *has_vfs)
{
	const struct unix_diag_msg *d = NLMSG_DATA(h);
	const char *a = (const char *)d + NLMSG_ALIGN(sizeof(*d));
	const char *end = (const char *)h + hlen;

	memset(info, 0, sizeof(*info));
	*has_vfs = false;
	info->ino = d->udiag_ino;
	info->state = d->udiag_state;
	while (end - a >= (ptrdiff_t)sizeof(struct rtattr)) {
		const struct rtattr *rta = (const struct rtattr *)(const void *)a;
		size_t rlen = rta->rta_len, plen;
		const char *payload = a + RTA_LENGTH(0);

		if (rlen < RTA_LENGTH(0) || rlen > (size_t)(end - a))
			break; /* malformed attribute: stop, keep what we have */
		plen = rlen - RTA_LENGTH(0);
		switch (rta->rta_type) {
		case UNIX_DIAG_VFS:
			if (plen >= sizeof(struct unix_diag_vfs)) {
				struct unix_diag_vfs v;

				memcpy(&v, payload, sizeof(v));
				info->vfs_ino = v.udiag_vfs_ino;
				info->vfs_dev = v.udiag_vfs_dev;
				*has_vfs = true;
			}
			break;
		case UNIX_DIAG_UID:
			if (plen >= sizeof(uint32_t)) {
				memcpy(&info->uid, payload, sizeof(uint32_t));
				info->has_uid = true;
			}
			break;
		case UNIX_DIAG_NAME: {
			size_t n = plen < sizeof(info->name) - 1 ? plen :
			           sizeof(info->name) - 1;

			memcpy(info->name, payload, n);
			info->name[n] = '\0';
			if (n > 0 && info->name[0] == '\0')
				info->name[0] = '@'; /* abstract name */
			break;
		}
		default:
			break;
		}
		if (RTA_ALIGN(rlen) >= (size_t)(end - a))
			break;
		a += RTA_ALIGN(rlen);
	}
}

/* diag_request: sends the dump request for listening unix sockets, tagged
 * with seq so that its answer is told apart from any other. */
static int diag_request(int nl, uint32_t seq, struct tt_err *err)
{
	struct {
		struct nlmsghdr nlh;
		struct unix_diag_req req;
	} msg = {
		.nlh = {
			.nlmsg_len = sizeof(msg),
			.nlmsg_type = SOCK_DIAG_BY_FAMILY,
			.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP,
			.nlmsg_seq = seq,
		},
		.req = {
			.sdiag_family = AF_UNIX,
			.udiag_states = 1u << UNIX_STATE_LISTEN,
			.udiag_show = UDIAG_SHOW_VFS | UDIAG_SHOW_PEER |
			              UDIAG_SHOW_NAME | UDIAG_SHOW_UID,
		},
	};
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };

	if (sendto(nl, &msg, sizeof(msg), 0, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "sock_diag request");
	return 0;
}

/* diag_drain: discards whatever an earlier, abandoned query left queued on
 * a reused socket (never blocks). */
static void diag_drain(int nl)
{
	uint32_t buf[1024];

	for (int i = 0; i < DIAG_MAX_ROUNDS; i++)
		if (recv(nl, buf, sizeof(buf), MSG_DONTWAIT) < 0 && errno != EINTR)
			return;
}

/* sockdiag_reply_parse: see sockdiag.h. */
int sockdiag_reply_parse(const void *buf, size_t n, uint32_t seq, bool to_end,
                         uint32_t kdev, uint32_t vfs_ino,
                         struct unix_listener_info *out, bool *found,
                         struct tt_err *err)
{
	const char *p = buf, *end = p + n;

	while (end - p >= (ptrdiff_t)sizeof(struct nlmsghdr)) {
		const struct nlmsghdr *h = (const struct nlmsghdr *)(const void *)p;
		uint32_t hlen = h->nlmsg_len;

		if (hlen < sizeof(*h) || hlen > (size_t)(end - p))
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "sock_diag: bad message length %u", hlen);
		if (h->nlmsg_seq == seq) {
			if (h->nlmsg_type == NLMSG_DONE) {
				if (*found)
					return 1;
				return tt_err_set(err, TT_ERR_NOT_FOUND,
				                  "no listening unix socket on that file");
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);

				if (hlen >= NLMSG_LENGTH(sizeof(*e)) && e->error < 0)
					errno = -e->error;
				else
					errno = EPROTO;
				return tt_err_sys(err, TT_ERR_SYS, "sock_diag");
			}
			if (!*found && h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
			    hlen >= NLMSG_LENGTH(sizeof(struct unix_diag_msg))) {
				struct unix_listener_info info;
				bool has_vfs;

				diag_parse_one(h, hlen, &info, &has_vfs);
				if (has_vfs && info.vfs_ino == vfs_ino &&
				    info.vfs_dev == kdev &&
				    info.state == UNIX_STATE_LISTEN) {
					*out = info;
					*found = true;
					if (!to_end)
						return 1;
				}
			}
		}
		if (NLMSG_ALIGN(hlen) >= (size_t)(end - p))
			break;
		p += NLMSG_ALIGN(hlen);
	}
	return 0;
}

/* diag_find_on: one dump on nl (tagged seq), matching the VFS pair. With
 * to_end the dump is read up to NLMSG_DONE even after a match, so a reused
 * socket is left idle (the kernel refuses a new dump while one runs). */
static int diag_find_on(int nl, uint32_t seq, bool to_end, uint32_t kdev,
                        uint32_t vfs_ino, struct unix_listener_info *out,
                        struct tt_err *err)
{
	uint32_t buf[8192]; /* 32 KiB, nlmsghdr-aligned */
	bool found = false;

	if (diag_request(nl, seq, err) < 0)
		return -1;
	for (int round = 0; round < DIAG_MAX_ROUNDS; round++) {
		struct sockaddr_nl from;
		struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
		struct msghdr mh = {
			.msg_name = &from, .msg_namelen = sizeof(from),
			.msg_iov = &iov, .msg_iovlen = 1,
		};
		ssize_t n;
		int rc;

		do
			n = recvmsg(nl, &mh, 0);
		while (n < 0 && errno == EINTR);
		if (n < 0)
			return tt_err_sys(err, TT_ERR_SYS, "sock_diag recv");
		if (n == 0)
			return tt_err_set(err, TT_ERR_MALFORMED, "sock_diag: dump ended early");
		if (mh.msg_flags & MSG_TRUNC)
			return tt_err_set(err, TT_ERR_MALFORMED, "sock_diag: reply truncated");
		if (mh.msg_namelen < sizeof(from) || from.nl_pid != 0)
			continue; /* only the kernel answers sock_diag */
		rc = sockdiag_reply_parse(buf, (size_t)n, seq, to_end, kdev, vfs_ino, out,
		                          &found, err);
		if (rc != 0)
			return rc < 0 ? -1 : 0;
	}
	return tt_err_set(err, TT_ERR_TOO_LARGE, "sock_diag: dump over %d rounds",
	                  DIAG_MAX_ROUNDS);
}

/* sockdiag_unix_find_vfs: dumps listening unix sockets, matches the VFS pair. */
int sockdiag_unix_find_vfs(uint32_t kdev, uint32_t vfs_ino,
                           struct unix_listener_info *out, struct tt_err *err)
{
	_cleanup_close_ int nl = -1;

	nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return tt_err_sys(err, TT_ERR_SYS, "socket(NETLINK_SOCK_DIAG)");
	return diag_find_on(nl, DIAG_SEQ, false, kdev, vfs_ino, out, err);
}

/* sockdiag_unix_find_vfs_on: the same on a reused socket nl (see
 * sockdiag_open_in_netns): leftovers drained first, a fresh sequence
 * number per query, the dump read to its end. */
int sockdiag_unix_find_vfs_on(int nl, uint32_t kdev, uint32_t vfs_ino,
                              struct unix_listener_info *out, struct tt_err *err)
{
	static uint32_t seq_next = DIAG_SEQ;
	uint32_t seq = __atomic_add_fetch(&seq_next, 1, __ATOMIC_RELAXED);

	if (nl < 0)
		return tt_err_set(err, TT_ERR_INVALID, "no sock_diag socket");
	diag_drain(nl);
	return diag_find_on(nl, seq, true, kdev, vfs_ino, out, err);
}

/* stat_socket_file: stat of path, which must be a socket file. */
static int stat_socket_file(const char *path, struct stat *st, struct tt_err *err)
{
	if (path == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "no socket path");
	if (lstat(path, st) < 0)
		return tt_err_sys(err, errno == ENOENT ? TT_ERR_NOT_FOUND : TT_ERR_IO,
		                  "stat %s", path);
	if (!S_ISSOCK(st->st_mode))
		return tt_err_set(err, TT_ERR_INVALID, "%s is not a socket", path);
	return 0;
}

/* sockdiag_unix_listener: the listener bound to the socket file at path. */
int sockdiag_unix_listener(const char *path, struct unix_listener_info *out,
                           struct tt_err *err)
{
	struct stat st;

	if (stat_socket_file(path, &st, err) < 0)
		return -1;
	return sockdiag_unix_find_vfs(sockdiag_kdev(st.st_dev), (uint32_t)st.st_ino,
	                              out, err);
}

/* One query run in another network namespace. */
struct netns_query {
	int netns_fd;
	uint32_t kdev, vfs_ino;
	struct unix_listener_info info;
	struct tt_err err;
	int rc;
};

/* netns_thread: joins the target netns (this thread only: a thread's
 * network namespace is its own) and runs the query; the thread then ends,
 * so the namespace switch never leaks into the rest of the process. */
static void *netns_thread(void *arg)
{
	struct netns_query *q = arg;

	/* Privileged: setns(CLONE_NEWNET) needs CAP_SYS_ADMIN over the target
	 * namespace; sock_diag only answers for the caller's namespace. */
	if (setns(q->netns_fd, CLONE_NEWNET) < 0) {
		q->rc = tt_err_sys(&q->err, TT_ERR_SYS, "setns(net)");
		return NULL;
	}
	q->rc = sockdiag_unix_find_vfs(q->kdev, q->vfs_ino, &q->info, &q->err);
	return NULL;
}

/* sockdiag_unix_listener_in_netns: the same, seen from netns_fd. */
int sockdiag_unix_listener_in_netns(int netns_fd, const char *path,
                                    struct unix_listener_info *out,
                                    struct tt_err *err)
{
	struct netns_query q = { .netns_fd = netns_fd, .rc = -1 };
	struct stat st;
	pthread_t t;
	int rc;

	if (netns_fd < 0)
		return sockdiag_unix_listener(path, out, err);
	/* The path is resolved here, in the caller's mount namespace. */
	if (stat_socket_file(path, &st, err) < 0)
		return -1;
	q.kdev = sockdiag_kdev(st.st_dev);
	q.vfs_ino = (uint32_t)st.st_ino;
	rc = pthread_create(&t, NULL, netns_thread, &q);
	if (rc != 0) {
		errno = rc;
		return tt_err_sys(err, TT_ERR_SYS, "pthread_create");
	}
	pthread_join(t, NULL);
	if (q.rc < 0) {
		if (err != NULL)
			*err = q.err;
		return -1;
	}
	*out = q.info;
	return 0;
}

/* sockdiag_open_in_netns: a sock_diag socket of netns_fd's namespace,
 * created by this very thread: it joins the namespace, creates the socket
 * and returns to its own namespace. No helper thread: starting one costs
 * up to milliseconds here (waking an idle vCPU), on the create path. */
int sockdiag_open_in_netns(int netns_fd, bool *stuck, struct tt_err *err)
{
	_cleanup_close_ int self = -1;
	int nl, saved;

	if (stuck != NULL)
		*stuck = false;
	if (netns_fd < 0) {
		nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
		if (nl < 0)
			return tt_err_sys(err, TT_ERR_SYS, "socket(NETLINK_SOCK_DIAG)");
		return nl;
	}
	/* setns(CLONE_NEWNET) changes the calling thread only. */
	self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (self < 0)
		return tt_err_sys(err, TT_ERR_SYS, "open /proc/thread-self/ns/net");
	/* Privileged: setns(CLONE_NEWNET) needs CAP_SYS_ADMIN over the target
	 * namespace; a NETLINK_SOCK_DIAG socket answers for the namespace it
	 * was created in, whatever namespace its user is in later. */
	if (setns(netns_fd, CLONE_NEWNET) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "setns(net)");
	nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	saved = errno;
	/* Privileged: straight back to our own namespace. Should that ever
	 * fail, the thread would stay in the other one: report it so the
	 * caller stops (the bridge then refuses to start). */
	if (setns(self, CLONE_NEWNET) < 0) {
		if (nl >= 0)
			close(nl);
		if (stuck != NULL)
			*stuck = true;
		return tt_err_sys(err, TT_ERR_SYS,
		                  "setns back to our network namespace failed: "
		                  "this thread is stuck in another one");
	}
	if (nl < 0) {
		errno = saved;
		return tt_err_sys(err, TT_ERR_SYS, "socket(NETLINK_SOCK_DIAG)");
	}
	return nl;
}

/* sockdiag_inode_owned_by: scans /proc/<pid>/fd for "socket:[ino]". */
int sockdiag_inode_owned_by(pid_t pid, uint32_t socket_ino, struct tt_err *err)
{
	char path[64], want[40], link[64];
	DIR *d;
	struct dirent *e;
	int seen = 0, rc = -1;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof(want), "socket:[%u]", socket_ino);
	d = opendir(path);
	if (d == NULL)
		return tt_err_sys(err, errno == ENOENT || errno == ESRCH ?
		                  TT_ERR_NOT_FOUND : TT_ERR_IO, "open %s", path);
	errno = 0;
	while ((e = readdir(d)) != NULL) {
		ssize_t n;

		if (e->d_name[0] == '.')
			continue;
		if (++seen > SOCKDIAG_MAX_FDS) {
			tt_err_set(err, TT_ERR_TOO_LARGE, "%s: over %d fds", path,
			           SOCKDIAG_MAX_FDS);
			goto out;
		}
		n = readlinkat(dirfd(d), e->d_name, link, sizeof(link) - 1);
		if (n < 0)
			continue; /* fd closed meanwhile */
		link[n] = '\0';
		if (strcmp(link, want) == 0) {
			rc = 0;
			goto out;
		}
	}
	tt_err_set(err, TT_ERR_NOT_FOUND, "pid %d holds no %s", (int)pid, want);
out:
	closedir(d);
	return rc;
}

/* listener_query: the kernel listener on st's file: on the reused socket
 * nl when nl >= 0, else from netns_fd's namespace (or ours when < 0). */
static int listener_query(const char *path, const struct stat *st, int nl,
                          int netns_fd, struct unix_listener_info *info,
                          struct tt_err *err)
{
	if (nl >= 0)
		return sockdiag_unix_find_vfs_on(nl, sockdiag_kdev(st->st_dev),
		                                 (uint32_t)st->st_ino, info, err);
	return sockdiag_unix_listener_in_netns(netns_fd, path, info, err);
}

/* fstat_socket_file: fstat of file_fd (O_PATH is enough), which must be a
 * socket file; path only names it in messages. */
static int fstat_socket_file(int file_fd, const char *path, struct stat *st,
                             struct tt_err *err)
{
	if (fstat(file_fd, st) < 0)
		return tt_err_sys(err, TT_ERR_IO, "stat %s", path);
	if (!S_ISSOCK(st->st_mode))
		return tt_err_set(err, TT_ERR_INVALID, "%s is not a socket", path);
	return 0;
}

/* listener_check: verify_listener's body, the query made by listener_query;
 * the socket file is the one file_fd holds when file_fd >= 0, else the
 * one path names now. */
static int listener_check(const char *path, int file_fd, int nl, int netns_fd,
                          const struct proc_identity *expected, struct tt_err *err)
{
	_cleanup_close_ int pidfd = -1;
	struct unix_listener_info info;
	struct proc_identity got;
	struct stat st, again;
	unsigned long long start = 0;
	const char *field;
	int alive;

	if (expected == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "verify_listener: no expectation");
	if ((file_fd >= 0 ? fstat_socket_file(file_fd, path, &st, err)
	                  : stat_socket_file(path, &st, err)) < 0)
		return tt_err_verify(err, REFUSAL_LISTENER_REPLACED, "no socket file at %s", path);
	if (st.st_uid != expected->uid)
		return tt_err_verify(err, REFUSAL_OWNER_CHANGED,
		                  "socket file owner differs (uid %u, want %u)",
		                  (unsigned)st.st_uid, (unsigned)expected->uid);
	if (listener_query(path, &st, nl, netns_fd, &info, err) < 0) {
		if (err != NULL && err->code == TT_ERR_NOT_FOUND)
			return tt_err_verify(err, REFUSAL_LISTENER_REPLACED,
			                  "no listener bound in that network namespace at %s",
			                  path);
		return -1;
	}
	/* Pin the expected process, then check who it is. */
	if (procid_pin(expected->pid, &got, &pidfd, err) < 0) {
		if (err != NULL && (err->code == TT_ERR_NOT_FOUND ||
		                    err->code == TT_ERR_VERIFY))
			return tt_err_verify(err, REFUSAL_PEER_EXITED,
			                  "listener owner exited (pid %d)", (int)expected->pid);
		return -1;
	}
	field = proc_identity_diff(expected, &got);
	if (field != NULL)
		return tt_err_verify(err, procid_verify_detail(field), "listener owner: %s (pid %d)",
		                  procid_verify_reason(field), (int)expected->pid);
	if (sockdiag_inode_owned_by(expected->pid, info.ino, err) < 0) {
		if (err != NULL && err->code == TT_ERR_NOT_FOUND)
			return tt_err_verify(err, REFUSAL_LISTENER_REPLACED,
			                  "listener socket:[%u] not held by expected pid %d",
			                  info.ino, (int)expected->pid);
		return -1;
	}
	/* Recheck: the owner is still the same live process, and the path
	 * still names the socket file we matched. */
	alive = procid_pidfd_alive(pidfd, err);
	if (alive < 0)
		return -1;
	if (alive == 0 || procid_start_time(expected->pid, &start, NULL) < 0 ||
	    start != expected->start_time)
		return tt_err_verify(err, REFUSAL_PEER_EXITED, "listener owner exited (pid %d)",
		                  (int)expected->pid);
	if (lstat(path, &again) < 0 || again.st_dev != st.st_dev ||
	    again.st_ino != st.st_ino)
		return tt_err_verify(err, REFUSAL_LISTENER_REPLACED, "socket file replaced during check: %s",
		                  path);
	return 0;
}

/* verify_listener: file owner, kernel listener, owning process, recheck. */
int verify_listener(const char *path, int netns_fd,
                    const struct proc_identity *expected, struct tt_err *err)
{
	return listener_check(path, -1, -1, netns_fd, expected, err);
}

/* verify_listener_nl: the same checks, the sock_diag query sent on nl. */
int verify_listener_nl(const char *path, int nl,
                       const struct proc_identity *expected, struct tt_err *err)
{
	if (nl < 0)
		return tt_err_set(err, TT_ERR_INVALID, "verify_listener_nl: no socket");
	return listener_check(path, -1, nl, -1, expected, err);
}

/* verify_listener_fd_nl: the same checks on the socket file file_fd holds. */
int verify_listener_fd_nl(int file_fd, const char *path, int nl,
                          const struct proc_identity *expected, struct tt_err *err)
{
	if (nl < 0 || file_fd < 0)
		return tt_err_set(err, TT_ERR_INVALID, "verify_listener_fd_nl: no socket");
	return listener_check(path, file_fd, nl, -1, expected, err);
}

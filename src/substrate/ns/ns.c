/* The ns substrate: starts one sandbox execution (SPEC §9).
 *
 * Shape, chosen so the sandbox's own root owns as little as possible:
 *  - The manager clone()s the init directly (it stays our child, we reap it)
 *    into new pid, mount, net, uts and ipc namespaces, still as host root.
 *  - The manager puts it in its cgroups, then lets it go on. The child makes
 *    a cgroup namespace, builds the root filesystem, brings up loopback,
 *    pivots, and only then unshares a user namespace. So the mount, net,
 *    uts, ipc and pid namespaces belong to the host's user namespace: root
 *    in the sandbox (host uid_base) has no capability over them (cannot
 *    mount, configure the network or write sysctls even without seccomp).
 *  - The child takes the sandbox's host uid (so the user namespace, and
 *    what the kernel charges per user of it, belong to that uid), the
 *    manager writes uid/gid maps, the child becomes uid 0 inside, sets
 *    no_new_privs, loads the seccomp filter and execs the init with the
 *    readiness pipe as fd 3. The manager returns once "ready\n" arrives.
 * The child runs after a raw clone of a possibly multi-threaded process, so
 * it allocates nothing: every path, argv and the BPF program are prepared
 * by the parent beforehand, and the child only makes system calls. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <linux/close_range.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "log.h"
#include "substrate/ns/ns.h"
#include "substrate/ns/ns_int.h"

#define NS_HOSTNAME "sandbox"

/* Everything the child needs, computed before clone (no allocation after). */
struct ns_plan {
	char root[PATH_MAX];            /* <dir>/root: the new root's mount point */
	char layer_home[PATH_MAX], layer_tmp[PATH_MAX], layer_ws[PATH_MAX];
	char run[PATH_MAX];             /* <dir>/run -> /run/tether */
	const char *guest_bin;          /* host path or NULL */
	char gen_s[24], att_s[16], id_s[72];
	char *argv_buf[16];             /* default guest argv */
	char *const *argv;
	const struct sock_fprog *seccomp;
	int sock;                       /* child end of the control socketpair */
	int ready_wr;                   /* write end of the readiness pipe */
	int secret_rd;                  /* read end of the secret pipe, or -1 */
	int log_fd;                     /* > 2 or -1 */
	int cg_tasks[3];                /* v1 "tasks" files to join (-1: none) */
	int netns_fd;                   /* a made-ahead netns to join, or -1 */
	int mntns_fd;                   /* a clean mount ns to copy, or -1 */
	uid_t uid_base;                 /* the sandbox's host id range start */
	int layer_tree[4];              /* detached binds of home, tmp,
	                                 * workspace and run (with mntns_fd),
	                                 * or -1 */
};

/* Control messages child -> parent on the SEQPACKET socketpair. */
enum { MSG_USERNS = 'U', MSG_FAIL = 'E' };
struct ns_msg {
	char kind;
	int sys_errno;
	char what[120];
};

static char *const child_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/home", "LANG=C.UTF-8", NULL,
};

/* Fresh /etc: nothing of the host's configuration is exposed. */
static const struct { const char *name, *text; } etc_files[] = {
	{ "etc/passwd", "root:x:0:0:root:/home:/bin/bash\n"
	                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n" },
	{ "etc/group", "root:x:0:\nnogroup:x:65534:\n" },
	{ "etc/hosts", "127.0.0.1\tlocalhost " NS_HOSTNAME "\n::1\tlocalhost ip6-localhost\n" },
	{ "etc/hostname", NS_HOSTNAME "\n" },
	{ "etc/nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\n"
	                       "hosts: files\nnetworks: files\nprotocols: files\n"
	                       "services: files\n" },
	{ "etc/resolv.conf", "" },
};

/* Device nodes bind-mounted from the host: harmless, and expected. */
static const char *const dev_nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };

/* ---- child side: system calls only ---- */

/* child_fail: reports the failed step and errno to the parent, then exits.
 * what is always a literal (no formatting after clone). */
__attribute__((noreturn)) static void child_fail(const struct ns_plan *p, const char *what)
{
	struct ns_msg m = { .kind = MSG_FAIL, .sys_errno = errno };
	size_t n = strlen(what);
	if (n >= sizeof m.what)
		n = sizeof m.what - 1;
	memcpy(m.what, what, n);
	(void)!send(p->sock, &m, sizeof m, MSG_NOSIGNAL);
	_exit(127);
}

/* child_wait: blocks until the parent sends its go byte; EOF (parent gone
 * or gave up) ends the child quietly. */
static void child_wait(const struct ns_plan *p)
{
	char c;
	ssize_t n;
	do
		n = recv(p->sock, &c, 1, 0);
	while (n < 0 && errno == EINTR);
	if (n != 1)
		_exit(126);
}

/* child_bind: bind-mounts src on dst, then remounts with flags (a bind
 * ignores flags on creation). */
static void child_bind(const struct ns_plan *p, const char *src, const char *dst,
                       unsigned long flags, const char *what)
{
	/* Privileged: host root, in the sandbox's private mount namespace. */
	if (mount(src, dst, NULL, MS_BIND, NULL) < 0 ||
	    mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | flags, NULL) < 0)
		child_fail(p, what);
}

/* child_file: creates a file in the new root with fixed content. */
static void child_file(const struct ns_plan *p, const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		child_fail(p, "create file in sandbox root");
	size_t n = strlen(text);
	if (n && write(fd, text, n) != (ssize_t)n)
		child_fail(p, "write file in sandbox root");
	close(fd);
}

/* child_mkdir: makes a directory in the new root. */
static void child_mkdir(const struct ns_plan *p, const char *path, mode_t mode)
{
	if (mkdir(path, mode) < 0)
		child_fail(p, "mkdir in sandbox root");
}

/* child_loopback: brings up lo in the new (otherwise empty) netns. */
static void child_loopback(const struct ns_plan *p)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		child_fail(p, "socket for loopback");
	struct ifreq ifr;
	memset(&ifr, 0, sizeof ifr);
	memcpy(ifr.ifr_name, "lo", 3);
	/* Privileged: CAP_NET_ADMIN over the sandbox's own netns. */
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		child_fail(p, "SIOCGIFFLAGS lo");
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		child_fail(p, "SIOCSIFFLAGS lo up");
	close(s);
}

/* child_dev: a minimal /dev on a tmpfs. */
static void child_dev(const struct ns_plan *p)
{
	child_mkdir(p, "dev", 0755);
	/* Privileged: tmpfs for /dev; no exec, no suid. */
	if (mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k") < 0)
		child_fail(p, "mount tmpfs on /dev");
	for (size_t i = 0; i < sizeof dev_nodes / sizeof dev_nodes[0]; i++) {
		char host[32] = "/dev/", in[32] = "dev/";
		size_t n = strlen(dev_nodes[i]);
		memcpy(host + 5, dev_nodes[i], n + 1);
		memcpy(in + 4, dev_nodes[i], n + 1);
		child_file(p, in, "", 0666);
		child_bind(p, host, in, MS_NOSUID | MS_NOEXEC, "bind-mount a /dev node");
	}
	child_mkdir(p, "dev/pts", 0755);
	/* Privileged: a private devpts instance, so host ptys stay invisible. */
	if (mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
	          "newinstance,ptmxmode=0666,mode=0620") < 0)
		child_fail(p, "mount devpts");
	child_mkdir(p, "dev/shm", 0755);
	/* Privileged: tmpfs for POSIX shared memory (charged to the cgroup). */
	if (mount("tmpfs", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
	          "mode=1777,size=64m") < 0)
		child_fail(p, "mount /dev/shm");
	if (symlink("pts/ptmx", "dev/ptmx") < 0 || symlink("/proc/self/fd", "dev/fd") < 0 ||
	    symlink("/proc/self/fd/0", "dev/stdin") < 0 ||
	    symlink("/proc/self/fd/1", "dev/stdout") < 0 ||
	    symlink("/proc/self/fd/2", "dev/stderr") < 0)
		child_fail(p, "symlinks in /dev");
	/* Privileged: freeze /dev's layout (nodes are separate mounts). */
	if (mount(NULL, "dev", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC,
	          "mode=0755,size=64k") < 0)
		child_fail(p, "remount /dev read-only");
}

/* child_rootfs: builds the new root under p->root and pivots into it. */
static void child_rootfs(const struct ns_plan *p)
{
	/* Privileged: nothing we mount may propagate back to the host. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		child_fail(p, "make mounts private");
	/* Privileged: the root is a fresh tmpfs, made read-only below. */
	if (mount("tmpfs", p->root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") < 0)
		child_fail(p, "mount tmpfs root");
	if (chdir(p->root) < 0)
		child_fail(p, "chdir to new root");

	child_mkdir(p, "usr", 0755);
	/* Privileged: host /usr, read-only, no suid/devices (setuid binaries
	 * in /usr must not gain anything in here). */
	child_bind(p, "/usr", "usr", MS_RDONLY | MS_NOSUID | MS_NODEV, "bind-mount /usr read-only");
	if (symlink("usr/bin", "bin") < 0 || symlink("usr/sbin", "sbin") < 0 ||
	    symlink("usr/lib", "lib") < 0 || symlink("usr/lib64", "lib64") < 0)
		child_fail(p, "merged-/usr symlinks");

	child_mkdir(p, "etc", 0755);
	for (size_t i = 0; i < sizeof etc_files / sizeof etc_files[0]; i++)
		child_file(p, etc_files[i].name, etc_files[i].text, 0644);
	/* Debian's /usr/bin/{awk,vi,...} are symlinks through
	 * /etc/alternatives: expose just that (symlinks only), read-only. */
	if (access("/etc/alternatives", F_OK) == 0) {
		child_mkdir(p, "etc/alternatives", 0755);
		child_bind(p, "/etc/alternatives", "etc/alternatives",
		           MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "bind-mount /etc/alternatives");
	}

	/* Privileged: the writable layer (owned by uid_base on the host). */
	child_mkdir(p, "home", 0755);
	child_mkdir(p, "tmp", 01777);
	child_mkdir(p, "workspace", 0755);
	if (p->layer_tree[0] >= 0) {
		/* The parent's detached binds (nosuid, nodev already), made in
		 * its namespace where the layer is mounted: attached here. */
		static const char *const at[3] = { "home", "tmp", "workspace" };
		for (int i = 0; i < 3; i++)
			if (move_mount(p->layer_tree[i], "", AT_FDCWD, at[i],
			               MOVE_MOUNT_F_EMPTY_PATH) < 0)
				child_fail(p, "attach a layer directory");
	} else {
		child_bind(p, p->layer_home, "home", MS_NOSUID | MS_NODEV, "bind-mount /home");
		child_bind(p, p->layer_tmp, "tmp", MS_NOSUID | MS_NODEV, "bind-mount /tmp");
		child_bind(p, p->layer_ws, "workspace", MS_NOSUID | MS_NODEV,
		           "bind-mount /workspace");
	}
	child_mkdir(p, "run", 0755);
	child_mkdir(p, "run/tether", 0755);
	/* Privileged: the guest socket dir, shared with the host bridge: the
	 * sandbox's capped run tmpfs (ns_run.c), as the parent's detached
	 * bind or bound from its mount point. */
	if (p->layer_tree[3] >= 0) {
		if (move_mount(p->layer_tree[3], "", AT_FDCWD, "run/tether",
		               MOVE_MOUNT_F_EMPTY_PATH) < 0)
			child_fail(p, "attach /run/tether");
	} else {
		child_bind(p, p->run, "run/tether", MS_NOSUID | MS_NODEV | MS_NOEXEC,
		           "bind-mount /run/tether");
	}

	child_mkdir(p, ".tether", 0755);
	if (p->guest_bin) {
		child_file(p, ".tether/tether-guest", "", 0755);
		/* Privileged: the guest binary, read-only so it cannot be swapped. */
		child_bind(p, p->guest_bin, ".tether/tether-guest", MS_RDONLY | MS_NOSUID | MS_NODEV,
		           "bind-mount the guest binary");
	}

	child_mkdir(p, "proc", 0555);
	/* Privileged: proc of the new pid namespace (we are its PID 1). */
	if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		child_fail(p, "mount /proc");
	child_dev(p);

	/* Privileged: pivot_root(".", ".") stacks the old root under the new
	 * one; detaching it leaves no path back to the host filesystem. */
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		child_fail(p, "pivot_root");
	if (umount2(".", MNT_DETACH) < 0)
		child_fail(p, "detach old root");
	if (chdir("/") < 0)
		child_fail(p, "chdir /");
	/* Privileged: the root tmpfs itself becomes read-only. */
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
	          "mode=0755,size=1m") < 0)
		child_fail(p, "remount root read-only");
}

/* child_stdio: fds 0-2 (/dev/null or the log fd) and the ready pipe as fd
 * 3; everything else is marked close-on-exec (the control socket included,
 * so its EOF tells the parent the exec happened). */
static void child_stdio(const struct ns_plan *p)
{
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0)
		child_fail(p, "open /dev/null");
	/* Move our fds above 3 so the dup2s below cannot clobber them. */
	int hi_null = fcntl(null, F_DUPFD_CLOEXEC, 64);
	int hi_ready = fcntl(p->ready_wr, F_DUPFD_CLOEXEC, 64);
	int hi_log = p->log_fd > 2 ? fcntl(p->log_fd, F_DUPFD_CLOEXEC, 64) : hi_null;
	int hi_secret = p->secret_rd >= 0 ? fcntl(p->secret_rd, F_DUPFD_CLOEXEC, 64) : -1;
	if (hi_null < 0 || hi_ready < 0 || hi_log < 0 || (p->secret_rd >= 0 && hi_secret < 0))
		child_fail(p, "dup fds");
	if (dup2(hi_null, 0) < 0 || dup2(hi_log, 1) < 0 || dup2(hi_log, 2) < 0 ||
	    dup2(hi_ready, NS_READY_FD) < 0)
		child_fail(p, "dup2 stdio");
	/* The activation secret's pipe: the only other fd the init gets. */
	if (hi_secret >= 0 && dup2(hi_secret, NS_SECRET_FD) < 0)
		child_fail(p, "dup2 secret");
	if (syscall(SYS_close_range, hi_secret >= 0 ? NS_SECRET_FD + 1 : NS_READY_FD + 1, ~0u,
	            CLOSE_RANGE_CLOEXEC) < 0)
		child_fail(p, "close_range");
}

/* child_cgroups: v1: moves this (single-threaded) process into each of
 * its cgroups by writing "0" (= the calling thread) to their tasks files,
 * before anything else; the parent then has no pid to move. */
static void child_cgroups(const struct ns_plan *p)
{
	for (int i = 0; i < 3; i++) {
		if (p->cg_tasks[i] < 0)
			continue;
		/* Privileged: joining the sandbox's own cgroup. */
		if (write(p->cg_tasks[i], "0", 1) != 1)
			child_fail(p, "join the sandbox cgroup");
		close(p->cg_tasks[i]);
	}
}

/* child_main: the cloned child, PID 1 of the sandbox. Never returns. */
__attribute__((noreturn)) static void child_main(const struct ns_plan *p)
{
	if (p->netns_fd >= 0) {
		/* Privileged: join the fresh network namespace made for us
		 * (instead of CLONE_NEWNET): the caller's, never shared. */
		if (setns(p->netns_fd, CLONE_NEWNET) < 0)
			child_fail(p, "join the sandbox network namespace");
		close(p->netns_fd);
	}
	child_cgroups(p);
	child_wait(p); /* we (v1) or the parent (v2) put us in our cgroups */
	if (p->mntns_fd >= 0) {
		/* Privileged: our mount namespace is a private copy of the
		 * clean one (ns_mntns_clean), not of the caller's, which holds
		 * one layer mount per sandbox: copying, privatising and
		 * detaching those on every start would cost each create in
		 * proportion to the sandboxes running. We are single-threaded
		 * with our own fs_struct (no CLONE_FS), as setns requires. */
		if (setns(p->mntns_fd, CLONE_NEWNS) < 0)
			child_fail(p, "join the clean mount namespace");
		close(p->mntns_fd);
		if (unshare(CLONE_NEWNS) < 0)
			child_fail(p, "unshare mount namespace");
	}
	/* Privileged: cgroup namespace rooted at the sandbox's own cgroup. */
	if (unshare(CLONE_NEWCGROUP) < 0)
		child_fail(p, "unshare cgroup namespace");
	/* Privileged: hostname in the sandbox's own uts namespace. */
	if (sethostname(NS_HOSTNAME, strlen(NS_HOSTNAME)) < 0)
		child_fail(p, "sethostname");
	child_loopback(p);
	child_rootfs(p);
	child_stdio(p);
	/* Drop the host's supplementary groups while we still may; after
	 * setgroups is denied they could never be dropped. */
	if (setgroups(0, NULL) < 0)
		child_fail(p, "setgroups");
	/* Privileged: we become the sandbox's own host uid and gid (its
	 * mapped root) before making the user namespace, so that namespace
	 * is owned by that uid and everything the kernel counts per user of
	 * it (inotify instances, user namespaces) is charged to this
	 * sandbox, not to host root. Every capability goes with the change;
	 * the parent, still root, writes the maps. */
	if (setresgid(p->uid_base, p->uid_base, p->uid_base) < 0 ||
	    setresuid(p->uid_base, p->uid_base, p->uid_base) < 0)
		child_fail(p, "become the sandbox's host uid");
	/* The user namespace comes last, so it owns none of the namespaces
	 * above. */
	if (unshare(CLONE_NEWUSER) < 0)
		child_fail(p, "unshare user namespace");
	struct ns_msg m = { .kind = MSG_USERNS };
	if (send(p->sock, &m, sizeof m, MSG_NOSIGNAL) != (ssize_t)sizeof m)
		_exit(126);
	child_wait(p); /* parent has written uid_map/gid_map */
	if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0)
		child_fail(p, "become root of the user namespace");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		child_fail(p, "no_new_privs");
	/* Last step before exec: the filter denies mount etc. used above. */
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, p->seccomp) < 0)
		child_fail(p, "load seccomp filter");
	execve(p->argv[0], p->argv, child_env);
	child_fail(p, "exec sandbox init");
}

/* ---- parent side ---- */

/* ns_id_ok: sandbox ids become path components: keep them plain. */
static int ns_id_ok(const char *id)
{
	size_t n = id ? strlen(id) : 0;
	if (n == 0 || n > 64)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = id[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

/* ns_path: out = a/b, bounded. */
static int ns_path(char out[PATH_MAX], const char *a, const char *b, struct tt_err *err)
{
	if (snprintf(out, PATH_MAX, "%s/%s", a, b) >= PATH_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "sandbox path too long: %s/%s", a, b);
	return 0;
}

/* ns_mkdir_owned: makes dir (if missing) and sets its owner and mode; a
 * symlink in its place is refused. */
static int ns_mkdir_owned(const char *dir, uid_t uid, mode_t mode, struct tt_err *err)
{
	if (mkdir(dir, mode) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", dir);
	_cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open %s", dir);
	/* Privileged: hand the layer to the sandbox's mapped root. */
	if (fchown(fd, uid, uid) < 0 || fchmod(fd, mode) < 0)
		return tt_err_sys(err, TT_ERR_IO, "chown/chmod %s", dir);
	return 0;
}

/* ns_mkdir_root: makes a root-only dir if missing (an existing one keeps
 * its owner and mode: the manager may have made it); must be a real dir. */
static int ns_mkdir_root(const char *dir, struct tt_err *err)
{
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", dir);
	struct stat st;
	if (lstat(dir, &st) < 0)
		return tt_err_sys(err, TT_ERR_IO, "stat %s", dir);
	if (!S_ISDIR(st.st_mode))
		return tt_err_set(err, TT_ERR_INVALID, "%s is not a directory", dir);
	return 0;
}

/* ns_prepare_dirs: the host-side layout under sandbox_dir. */
static int ns_prepare_dirs(const struct ns_config *cfg, struct ns_plan *p,
                           struct ns_sandbox *sb, struct tt_err *err)
{
	const char *d = cfg->sandbox_dir;
	char layer[PATH_MAX];
	/* The host side of the layout stays root-only: the child mounts as
	 * host root, so the sandbox's uid never needs to traverse it. */
	if (ns_mkdir_root(d, err) < 0 || ns_path(layer, d, "layer", err) < 0 ||
	    ns_mkdir_root(layer, err) < 0 ||
	    (cfg->layer_bytes > 0 &&
	     ns_layer_ensure(d, cfg->layer_template, cfg->layer_bytes, cfg->layer_inodes,
	                     err) < 0) ||
	    ns_path(p->root, d, "root", err) < 0 ||
	    ns_mkdir_root(p->root, err) < 0 ||
	    ns_path(p->layer_home, layer, "home", err) < 0 ||
	    ns_path(p->layer_tmp, layer, "tmp", err) < 0 ||
	    ns_path(p->layer_ws, layer, "workspace", err) < 0 || ns_path(p->run, d, "run", err) < 0)
		return -1;
	if (ns_mkdir_owned(p->layer_home, cfg->uid_base, 0755, err) < 0 ||
	    ns_mkdir_owned(p->layer_tmp, cfg->uid_base, 01777, err) < 0 ||
	    ns_mkdir_owned(p->layer_ws, cfg->uid_base, 0755, err) < 0 ||
	    ns_mkdir_root(p->run, err) < 0 || ns_run_mount(p->run, cfg->uid_base, err) < 0)
		return -1;
	if (ns_path(sb->guest_socket, p->run, "guest.sock", err) < 0)
		return -1;
	/* A socket left by an older execution must never be mistaken for ours. */
	if (unlink(sb->guest_socket) < 0 && errno != ENOENT)
		return tt_err_sys(err, TT_ERR_IO, "removing stale %s", sb->guest_socket);
	return 0;
}

/* ns_sandbox_dirs_spare: the host-side layout, made ahead of time (the
 * layer's own subdirectories come with its filesystem: ns_layer_make). */
int ns_sandbox_dirs_spare(const char *dir, struct tt_err *err)
{
	static const char *const subs[] = { "layer", "root", "run" };
	char path[PATH_MAX];

	if (!dir || dir[0] != '/')
		return tt_err_set(err, TT_ERR_INVALID, "spare dir must be an absolute path");
	if (ns_mkdir_root(dir, err) < 0)
		return -1;
	for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
		if (ns_path(path, dir, subs[i], err) < 0 || ns_mkdir_root(path, err) < 0)
			return -1;
	return 0;
}

/* ns_netns_make: unshare on this thread, keep an fd, go back home. */
int ns_netns_make(bool *stuck, struct tt_err *err)
{
	_cleanup_close_ int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	int fd, saved;

	*stuck = false;
	if (self < 0)
		return tt_err_sys(err, TT_ERR_SYS, "open /proc/thread-self/ns/net");
	/* Privileged: a new network namespace (host root owns it), made for
	 * the next sandbox ahead of time; this thread leaves it right away. */
	if (unshare(CLONE_NEWNET) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "unshare(CLONE_NEWNET)");
	fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	saved = errno;
	/* Privileged: back to our own network namespace. */
	if (setns(self, CLONE_NEWNET) < 0) {
		if (fd >= 0)
			close(fd);
		*stuck = true;
		return tt_err_sys(err, TT_ERR_SYS, "setns back to our network namespace "
		                  "failed: this thread is stuck in a new one");
	}
	if (fd < 0) {
		errno = saved;
		return tt_err_sys(err, TT_ERR_SYS, "open the new network namespace");
	}
	return fd;
}

/* ns_plan_argv: the init's argv (default: the guest agent). */
static int ns_plan_argv(const struct ns_config *cfg, struct ns_plan *p, struct tt_err *err)
{
	if (cfg->init_argv) {
		if (!cfg->init_argv[0] || cfg->init_argv[0][0] != '/')
			return tt_err_set(err, TT_ERR_INVALID, "init_argv[0] must be an absolute path");
		p->argv = cfg->init_argv;
		return 0;
	}
	if (!cfg->guest_bin)
		return tt_err_set(err, TT_ERR_INVALID, "no guest_bin and no init_argv");
	snprintf(p->gen_s, sizeof p->gen_s, "%" PRIu64, cfg->gen);
	snprintf(p->att_s, sizeof p->att_s, "%" PRIu32, cfg->att);
	snprintf(p->id_s, sizeof p->id_s, "%s", cfg->sbx_id);
	char *const v[] = { NS_GUEST_BIN_IN, "--listen", NS_GUEST_SOCKET_IN, "--sbx", p->id_s,
	                    "--gen", p->gen_s, "--att", p->att_s, "--ready-fd", "3",
	                    cfg->secret ? "--secret-fd" : NULL, "4", NULL };
	/* A spare: the identity and the secret come later on the same fd. */
	char *const spare[] = { NS_GUEST_BIN_IN, "--listen", NS_GUEST_SOCKET_IN,
	                        "--ready-fd", "3", "--assign-fd", "4", NULL };
	_Static_assert(NS_SECRET_FD == 4 && NS_READY_FD == 3, "fd numbers in argv");
	_Static_assert(sizeof v <= sizeof p->argv_buf, "argv_buf too small");
	_Static_assert(sizeof spare <= sizeof p->argv_buf, "argv_buf too small");
	if (cfg->assign_later) {
		if (cfg->secret)
			return tt_err_set(err, TT_ERR_INVALID, "a spare gets its secret later");
		memcpy(p->argv_buf, spare, sizeof spare);
	} else {
		memcpy(p->argv_buf, v, sizeof v);
	}
	p->argv = p->argv_buf;
	return 0;
}

/* ns_now_ms: monotonic milliseconds. */
static int64_t ns_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ns_wait_fd: waits until fd is readable, or fails if the init exits
 * (pidfd readable) or the deadline passes. */
static int ns_wait_fd(int fd, int pidfd, int64_t deadline, const char *phase,
                      struct tt_err *err)
{
	for (;;) {
		int64_t left = deadline - ns_now_ms();
		if (left <= 0)
			return tt_err_set(err, TT_ERR_TRANSPORT, "sandbox init: timed out %s", phase);
		struct pollfd pf[2] = { { .fd = fd, .events = POLLIN }, { .fd = pidfd, .events = POLLIN } };
		int n = poll(pf, 2, (int)left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return tt_err_sys(err, TT_ERR_SYS, "poll");
		if (pf[0].revents)
			return 0;
		if (pf[1].revents)
			return tt_err_set(err, TT_ERR_TRANSPORT, "sandbox init exited %s", phase);
	}
}

/* ns_recv_msg: reads one control message; 0 = message, 1 = EOF. */
static int ns_recv_msg(int sock, int pidfd, int64_t deadline, const char *phase,
                       struct ns_msg *m, struct tt_err *err)
{
	if (ns_wait_fd(sock, pidfd, deadline, phase, err) < 0)
		return -1;
	ssize_t n = recv(sock, m, sizeof *m, 0);
	if (n == 0)
		return 1;
	if (n != (ssize_t)sizeof *m)
		return tt_err_sys(err, TT_ERR_TRANSPORT, "sandbox init: bad control message");
	if (m->kind == MSG_FAIL) {
		m->what[sizeof m->what - 1] = '\0';
		errno = m->sys_errno;
		return tt_err_sys(err, TT_ERR_SYS, "sandbox setup failed: %s", m->what);
	}
	return 0;
}

/* ns_write_map: writes one /proc/<pid>/{uid_map,gid_map,setgroups}. */
static int ns_write_map(pid_t pid, const char *file, const char *text, struct tt_err *err)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
	_cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "open %s", path);
	size_t n = strlen(text);
	if (write(fd, text, n) != (ssize_t)n)
		return tt_err_sys(err, TT_ERR_SYS, "write %s", path);
	return 0;
}

/* ns_why_eof: the readiness pipe hit EOF: name the init's exit if that is
 * the cause (its fds close just before it turns zombie, so wait a bit). */
static int ns_why_eof(int pidfd, struct tt_err *err)
{
	struct pollfd pf = { .fd = pidfd, .events = POLLIN };
	siginfo_t si;
	memset(&si, 0, sizeof si);
	if (poll(&pf, 1, 200) == 1 && waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOWAIT) == 0) {
		if (si.si_code == CLD_EXITED)
			return tt_err_set(err, TT_ERR_TRANSPORT, "sandbox init exited with status %d "
			                  "before signalling readiness", si.si_status);
		return tt_err_set(err, TT_ERR_TRANSPORT, "sandbox init killed by signal %d "
		                  "before signalling readiness", si.si_status);
	}
	return tt_err_set(err, TT_ERR_TRANSPORT,
	                  "sandbox init closed its readiness fd without \"ready\"");
}

/* ns_read_ready: expects exactly "ready\n" on the readiness pipe. */
static int ns_read_ready(int fd, int pidfd, int64_t deadline, struct tt_err *err)
{
	char buf[8];
	size_t got = 0;
	while (got < 6) {
		if (ns_wait_fd(fd, pidfd, deadline, "before signalling readiness", err) < 0)
			return -1;
		ssize_t n = read(fd, buf + got, 6 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return tt_err_sys(err, TT_ERR_IO, "reading readiness pipe");
		if (n == 0)
			return ns_why_eof(pidfd, err);
		got += (size_t)n;
		if (memchr(buf, '\n', got))
			break; /* a short line is complete: judge it now */
	}
	if (got != 6 || memcmp(buf, "ready\n", 6) != 0)
		return tt_err_set(err, TT_ERR_TRANSPORT, "sandbox init sent a bad readiness line");
	return 0;
}

/* Inits that had not exited NS_REAP_WAIT_MS after their SIGKILL (stuck in
 * the kernel): their pids, reaped by a later ns_kill_reap or
 * ns_reap_pending. A pid cannot be reused while it is our zombie, so
 * waitpid on it reaches that very process. */
#define NS_REAP_WAIT_MS 5000
#define NS_UNREAPED_MAX 256
static pid_t ns_unreaped[NS_UNREAPED_MAX];
static size_t ns_unreaped_n;
static pthread_mutex_t ns_unreaped_mu = PTHREAD_MUTEX_INITIALIZER;

/* ns_reap_pending: see ns.h. */
size_t ns_reap_pending(void)
{
	size_t left;

	pthread_mutex_lock(&ns_unreaped_mu);
	for (size_t i = 0; i < ns_unreaped_n;) {
		pid_t r = waitpid(ns_unreaped[i], NULL, WNOHANG);

		if (r == 0 || (r < 0 && errno == EINTR)) {
			i++;
			continue;
		}
		/* Reaped, or not ours any more (ECHILD): off the list. */
		ns_unreaped[i] = ns_unreaped[--ns_unreaped_n];
	}
	left = ns_unreaped_n;
	pthread_mutex_unlock(&ns_unreaped_mu);
	return left;
}

/* ns_unreaped_add: remembers a killed init still to be reaped. */
static void ns_unreaped_add(pid_t pid)
{
	pthread_mutex_lock(&ns_unreaped_mu);
	if (ns_unreaped_n < NS_UNREAPED_MAX)
		ns_unreaped[ns_unreaped_n++] = pid;
	else
		log_warn("ns: init pid %d left unreaped (too many pending)", (int)pid);
	pthread_mutex_unlock(&ns_unreaped_mu);
}

/* ns_kill_reap: SIGKILL the init through its pidfd and reap it. The pidfd
 * may be non-blocking (the manager watches it with libuv, which sets
 * O_NONBLOCK): waitid then says EAGAIN until the init has exited, so it
 * is polled first; a blocking waitid on such a pidfd left every stopped
 * init a zombie of the manager. Bounded: an init that outlives its
 * SIGKILL by NS_REAP_WAIT_MS is reaped later (ns_reap_pending). */
static void ns_kill_reap(struct ns_sandbox *sb)
{
	int64_t deadline = ns_now_ms() + NS_REAP_WAIT_MS;
	siginfo_t si;
	int rc;

	ns_reap_pending();
	/* Privileged: killing our own child; the pidfd cannot hit a reused pid. */
	if (syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0) < 0 && errno != ESRCH)
		log_warn("ns: pidfd_send_signal(%d): %s", (int)sb->init_pid, strerror(errno));
	for (;;) {
		memset(&si, 0, sizeof si);
		rc = waitid(P_PIDFD, (id_t)sb->pidfd, &si, WEXITED | WNOHANG);
		if (rc == 0 && si.si_pid != 0)
			break;
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0 && errno != EAGAIN)
			return; /* ECHILD: reaped already, or not our child (adopted) */
		int64_t left = deadline - ns_now_ms();
		if (left <= 0) {
			log_warn("ns: init pid %d has not exited %d ms after SIGKILL; reaped later",
			         (int)sb->init_pid, NS_REAP_WAIT_MS);
			ns_unreaped_add(sb->init_pid);
			return;
		}
		struct pollfd pf = { .fd = sb->pidfd, .events = POLLIN };
		poll(&pf, 1, (int)(left < 1000 ? left : 1000));
	}
	sb->exit_status = si.si_code == CLD_EXITED ? W_EXITCODE(si.si_status, 0)
	                                           : si.si_status;
}

void ns_sandbox_init(struct ns_sandbox *sb)
{
	memset(sb, 0, sizeof *sb);
	sb->pidfd = -1;
	sb->exit_status = -1;
	sb->ready_fd = -1;
	sb->assign_fd = -1;
}

/* ns_layer_trees_close: drops the parent's handles on them (a detached
 * mount no one attached goes with its last fd). */
static void ns_layer_trees_close(struct ns_plan *p)
{
	for (int i = 0; i < 4; i++) {
		if (p->layer_tree[i] >= 0)
			close(p->layer_tree[i]);
		p->layer_tree[i] = -1;
	}
}

/* ns_layer_trees: detached bind mounts (nosuid, nodev) of the layer's
 * home, tmp and workspace and of the run tmpfs (also noexec), made here where the layer is mounted, for a
 * child that starts from the clean mount namespace (close-on-exec; the
 * child inherits them). */
static int ns_layer_trees(struct ns_plan *p, struct tt_err *err)
{
	const char *src[4] = { p->layer_home, p->layer_tmp, p->layer_ws, p->run };

	for (int i = 0; i < 4; i++) {
		struct mount_attr a = { .attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
		                                    (i == 3 ? MOUNT_ATTR_NOEXEC : 0) };

		/* Privileged: a private, detached copy of one layer directory
		 * (no submounts), to be attached in the sandbox's namespace. */
		p->layer_tree[i] = open_tree(AT_FDCWD, src[i], OPEN_TREE_CLONE |
		                             OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
		if (p->layer_tree[i] < 0 ||
		    mount_setattr(p->layer_tree[i], "", AT_EMPTY_PATH, &a, sizeof(a)) < 0) {
			tt_err_sys(err, TT_ERR_SYS, "detached bind of %s", src[i]);
			ns_layer_trees_close(p);
			return -1;
		}
	}
	return 0;
}

/* ns_mntns_detach_layers: in a fresh private copy of the mount tree,
 * detaches every layer filesystem (ext4 on a loop device, mounted on a
 * ".../layer" dir) and run tmpfs: the clean namespace must not pin any. Child of fork:
 * stdio only, bounded buffer. Returns how many it could not detach. */
static int ns_mntns_detach_layers(void)
{
	static char buf[1 << 18];
	size_t got = 0;
	int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC), bad = 0;

	if (fd < 0)
		return 1;
	for (ssize_t n; got + 1 < sizeof(buf) &&
	                (n = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0;)
		got += (size_t)n;
	close(fd);
	buf[got] = '\0';
	if (got + 1 >= sizeof(buf))
		return 1; /* too many mounts to judge: fail rather than pin */
	for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l;
	     l = strtok_r(NULL, "\n", &save)) {
		/* id parent maj:min root mountpoint opts... - fstype source ... */
		char *f[5] = { 0 }, *sep = strstr(l, " - "), *q = l;
		for (int i = 0; i < 5 && q; i++) {
			f[i] = q;
			q = strchr(q, ' ');
			if (q)
				*q++ = '\0';
		}
		if (sep == NULL || f[4] == NULL)
			continue;
		size_t ml = strlen(f[4]);
		bool layer = strncmp(sep + 3, "ext4 /dev/loop", 14) == 0 && ml >= 6 &&
		             strcmp(f[4] + ml - 6, "/layer") == 0;
		/* A sandbox's run tmpfs (ns_run.c), there for an execution
		 * running when the manager started. */
		bool run = strncmp(sep + 3, "tmpfs ", 6) == 0 && ml >= 4 &&
		           strcmp(f[4] + ml - 4, "/run") == 0 && strstr(f[4], "/sandboxes/");
		if (!layer && !run)
			continue;
		/* Privileged: only in this private copy of the tree. */
		if (umount2(f[4], MNT_DETACH) < 0)
			bad++;
	}
	return bad;
}

/* ns_mntns_clean: fork a child that unshares a private copy of our mount
 * namespace, detaches the layers in it and waits; keep its namespace. */
int ns_mntns_clean(struct tt_err *err)
{
	int go[2], done[2], fd = -1, st;
	char path[64], c = 0;
	pid_t pid;

	if (pipe2(go, O_CLOEXEC) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "pipe");
	if (pipe2(done, O_CLOEXEC) < 0) {
		close(go[0]);
		close(go[1]);
		return tt_err_sys(err, TT_ERR_SYS, "pipe");
	}
	pid = fork();
	if (pid == 0) {
		close(go[0]);
		close(done[1]);
		/* Privileged: a new mount namespace for this helper only,
		 * nothing propagating back to ours. */
		c = unshare(CLONE_NEWNS) == 0 &&
		    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
		    ns_mntns_detach_layers() == 0 ? 'y' : 'n';
		(void)!write(go[1], &c, 1);
		(void)!read(done[0], &c, 1); /* until the parent holds the ns */
		_exit(0);
	}
	close(go[1]);
	close(done[0]);
	if (pid < 0) {
		tt_err_sys(err, TT_ERR_SYS, "fork");
		goto out;
	}
	if (read(go[0], &c, 1) != 1 || c != 'y') {
		tt_err_set(err, TT_ERR_SYS, "could not make a clean mount namespace");
		goto out;
	}
	snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		tt_err_sys(err, TT_ERR_SYS, "open %s", path);
out:
	close(go[0]);
	close(done[1]); /* the helper exits; the fd keeps its namespace */
	if (pid > 0)
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
	return fd;
}

/* ns_sandbox_launch: plan, cgroups, clone, setup handshake, up to exec. */
int ns_sandbox_launch(const struct ns_config *cfg, struct ns_sandbox *out,
                      struct tt_err *err)
{
	ns_sandbox_init(out);
	if (!cfg || !ns_id_ok(cfg->sbx_id))
		return tt_err_set(err, TT_ERR_INVALID, "sandbox id must be 1-64 chars of [A-Za-z0-9_-]");
	if (!cfg->sandbox_dir || cfg->sandbox_dir[0] != '/')
		return tt_err_set(err, TT_ERR_INVALID, "sandbox_dir must be an absolute path");
	uint32_t count = cfg->uid_count ? cfg->uid_count : NS_DEFAULT_UID_COUNT;
	if (cfg->uid_base == 0 || (uint64_t)cfg->uid_base + count > UINT32_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "uid range must be non-root and fit in 32 bits");
	if (cfg->guest_bin && cfg->guest_bin[0] != '/')
		return tt_err_set(err, TT_ERR_INVALID, "guest_bin must be an absolute path");
	if (cfg->guest_bin && access(cfg->guest_bin, X_OK) < 0)
		return tt_err_sys(err, TT_ERR_INVALID, "guest binary %s", cfg->guest_bin);
	if (geteuid() != 0)
		return tt_err_set(err, TT_ERR_DENIED, "the ns substrate needs root on the host");

	struct ns_plan p;
	memset(&p, 0, sizeof p);
	p.guest_bin = cfg->guest_bin;
	p.uid_base = cfg->uid_base;
	p.log_fd = cfg->log_fd > 2 ? cfg->log_fd : -1;
	p.cg_tasks[0] = p.cg_tasks[1] = p.cg_tasks[2] = -1;
	p.netns_fd = cfg->use_netns ? cfg->netns_fd : -1;
	p.mntns_fd = cfg->use_mntns ? cfg->mntns_fd : -1;
	p.layer_tree[0] = p.layer_tree[1] = p.layer_tree[2] = p.layer_tree[3] = -1;
	if (cfg->use_netns && cfg->netns_fd < 0)
		return tt_err_set(err, TT_ERR_INVALID, "use_netns without a netns fd");
	if (cfg->use_mntns && cfg->mntns_fd < 0)
		return tt_err_set(err, TT_ERR_INVALID, "use_mntns without a mount ns fd");
	if (ns_plan_argv(cfg, &p, err) < 0 || ns_prepare_dirs(cfg, &p, out, err) < 0 ||
	    (p.mntns_fd >= 0 && ns_layer_trees(&p, err) < 0))
		return -1;

	struct sock_fprog prog;
	if (ns_seccomp_build(&prog, err) < 0) {
		ns_layer_trees_close(&p);
		return -1;
	}
	p.seccomp = &prog;

	char cgname[128];
	snprintf(cgname, sizeof cgname, "%s-g%" PRIu64, cfg->sbx_id, cfg->gen);
	if (ns_cgroup_create(cgname, cfg->memory_max ? cfg->memory_max : NS_DEFAULT_MEMORY_MAX,
	                     cfg->pids_max ? cfg->pids_max : NS_DEFAULT_PIDS_MAX,
	                     cfg->cpu_millis, out, err) < 0) {
		ns_seccomp_free(&prog);
		ns_layer_trees_close(&p);
		return -1;
	}

	int rc = -1;
	int sv[2] = { -1, -1 }, ready[2] = { -1, -1 }, secret[2] = { -1, -1 };
	int ncg = ns_cgroup_self_fds(out, p.cg_tasks, err);
	if (ncg < 0)
		goto fail;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
	    pipe2(ready, O_CLOEXEC) < 0) {
		tt_err_sys(err, TT_ERR_SYS, "socketpair/pipe");
		goto fail;
	}
	p.sock = sv[1];
	p.ready_wr = ready[1];
	p.secret_rd = -1;
	if (cfg->assign_later) {
		/* The write end stays ours (sb->assign_fd) until the
		 * assignment; the init inherits the read end only. */
		if (pipe2(secret, O_CLOEXEC) < 0) {
			tt_err_sys(err, TT_ERR_SYS, "assignment pipe");
			goto fail;
		}
		p.secret_rd = secret[0];
	} else if (cfg->secret) {
		/* Filled and closed before the clone: the init inherits only the
		 * read end, reads the secret and then EOF (32 bytes always fit a
		 * pipe's buffer, so the write cannot block). */
		if (pipe2(secret, O_CLOEXEC) < 0) {
			tt_err_sys(err, TT_ERR_SYS, "secret pipe");
			goto fail;
		}
		if (write(secret[1], cfg->secret, NS_SECRET_LEN) != NS_SECRET_LEN) {
			tt_err_sys(err, TT_ERR_SYS, "writing the activation secret");
			goto fail;
		}
		close(secret[1]);
		secret[1] = -1;
		p.secret_rd = secret[0];
	}

	int pidfd = -1;
	/* Privileged: new pid, mount, net, uts and ipc namespaces (host root
	 * owns them; see the file comment). Raw clone: like fork, plus pidfd. */
	long pid = syscall(SYS_clone, CLONE_PIDFD | CLONE_NEWPID |
	                   (p.mntns_fd >= 0 ? 0 : CLONE_NEWNS) |
	                   (p.netns_fd >= 0 ? 0 : CLONE_NEWNET) |
	                   CLONE_NEWUTS | CLONE_NEWIPC | SIGCHLD, NULL, &pidfd, NULL, NULL);
	if (pid < 0) {
		tt_err_sys(err, TT_ERR_SYS, "clone sandbox init");
		goto fail;
	}
	if (pid == 0) {
		close(sv[0]);
		close(ready[0]);
		child_main(&p);
	}
	out->init_pid = (pid_t)pid;
	out->pidfd = pidfd;
	if (secret[0] >= 0) {
		close(secret[0]);
		secret[0] = -1;
	}
	if (cfg->assign_later) {
		out->assign_fd = secret[1];
		secret[1] = -1;
	}
	close(sv[1]);
	sv[1] = -1;
	close(ready[1]);
	ready[1] = -1;
	int64_t deadline = ns_now_ms() +
		(cfg->ready_timeout_ms ? cfg->ready_timeout_ms : NS_DEFAULT_READY_MS);

	for (int i = 0; i < 3; i++) {
		if (p.cg_tasks[i] >= 0)
			close(p.cg_tasks[i]);
		p.cg_tasks[i] = -1;
	}
	if (proc_start_time(out->init_pid, &out->init_start_time, err) < 0)
		goto fail;
	/* v2: into the cgroups before the child does anything at all (v1:
	 * the child joined them itself, first thing, see child_cgroups). */
	if (ncg == 0 && ns_cgroup_attach(out, out->init_pid, err) < 0)
		goto fail;
	if (send(sv[0], "c", 1, MSG_NOSIGNAL) != 1) {
		tt_err_sys(err, TT_ERR_TRANSPORT, "sandbox init: control socket");
		goto fail;
	}
	struct ns_msg m;
	int r = ns_recv_msg(sv[0], out->pidfd, deadline, "during setup", &m, err);
	if (r < 0)
		goto fail;
	if (r == 1 || m.kind != MSG_USERNS) {
		tt_err_set(err, TT_ERR_TRANSPORT, "sandbox init: unexpected control message");
		goto fail;
	}
	char map[64];
	snprintf(map, sizeof map, "0 %u %u\n", (unsigned)cfg->uid_base, count);
	/* Privileged: map sandbox ids 0..count-1 to the host range; setgroups
	 * denied so the sandbox cannot drop groups to bypass deny ACLs. */
	if (ns_write_map(out->init_pid, "setgroups", "deny", err) < 0 ||
	    ns_write_map(out->init_pid, "uid_map", map, err) < 0 ||
	    ns_write_map(out->init_pid, "gid_map", map, err) < 0)
		goto fail;
	if (send(sv[0], "m", 1, MSG_NOSIGNAL) != 1) {
		tt_err_sys(err, TT_ERR_TRANSPORT, "sandbox init: control socket");
		goto fail;
	}
	/* EOF on the control socket = exec happened (it is close-on-exec). */
	r = ns_recv_msg(sv[0], out->pidfd, deadline, "before exec", &m, err);
	if (r < 0)
		goto fail;
	if (r != 1) {
		tt_err_set(err, TT_ERR_TRANSPORT, "sandbox init: unexpected control message");
		goto fail;
	}
	/* Exec'd: the readiness pipe is handed over to ns_sandbox_wait_ready. */
	out->ready_fd = ready[0];
	out->ready_open = true;
	out->ready_deadline_ms = deadline;
	ready[0] = -1;
	rc = 0;
	log_info("ns: sandbox %s gen %" PRIu64 " init pid %d exec'd", cfg->sbx_id, cfg->gen,
	         (int)out->init_pid);
fail:
	for (int i = 0; i < 3; i++)
		if (p.cg_tasks[i] >= 0)
			close(p.cg_tasks[i]);
	for (int i = 0; i < 2; i++) {
		if (sv[i] >= 0)
			close(sv[i]);
		if (ready[i] >= 0)
			close(ready[i]);
		if (secret[i] >= 0)
			close(secret[i]);
	}
	ns_seccomp_free(&prog);
	ns_layer_trees_close(&p);
	if (rc < 0) {
		struct tt_err ignored;
		ns_sandbox_stop(out, &ignored);
		ns_sandbox_init(out);
	}
	return rc;
}

/* ns_sandbox_assign: see ns.h. The assignment is one write into an empty
 * pipe (under PIPE_BUF: never blocks, never short), then EOF. */
int ns_sandbox_assign(struct ns_sandbox *sb, const char *sbx_id, uint64_t gen,
                      uint32_t att, const uint8_t secret[NS_SECRET_LEN],
                      struct tt_err *err)
{
	char buf[NS_SECRET_LEN + 128], cgname[128];
	int n, rc = 0;

	if (sb->assign_fd < 0 || !sb->ready_open)
		return tt_err_set(err, TT_ERR_INVALID, "not a launched spare");
	if (!ns_id_ok(sbx_id))
		return tt_err_set(err, TT_ERR_INVALID, "sandbox id must be 1-64 chars of "
		                  "[A-Za-z0-9_-]");
	snprintf(cgname, sizeof cgname, "%s-g%" PRIu64, sbx_id, gen);
	if (ns_cgroup_rename(sb, cgname, err) < 0)
		return -1;
	memcpy(buf, secret, NS_SECRET_LEN);
	n = snprintf(buf + NS_SECRET_LEN, sizeof(buf) - NS_SECRET_LEN, "%s%c%" PRIu64 "%c%"
	             PRIu32 "%c", sbx_id, '\0', gen, '\0', att, '\0');
	_Static_assert(NS_SECRET_LEN + 128 <= PIPE_BUF, "one atomic write");
	if (n < 0 || (size_t)n >= sizeof(buf) - NS_SECRET_LEN)
		rc = tt_err_set(err, TT_ERR_INVALID, "assignment too long");
	else if (write(sb->assign_fd, buf, NS_SECRET_LEN + (size_t)n) !=
	         (ssize_t)(NS_SECRET_LEN + (size_t)n))
		rc = tt_err_sys(err, TT_ERR_TRANSPORT, "assigning the sandbox init");
	explicit_bzero(buf, sizeof(buf));
	close(sb->assign_fd);
	sb->assign_fd = -1;
	sb->ready_deadline_ms = ns_now_ms() + NS_DEFAULT_READY_MS;
	return rc;
}

/* ns_sandbox_wait_ready: "ready\n" from a launched init, or stop it. */
int ns_sandbox_wait_ready(struct ns_sandbox *sb, struct tt_err *err)
{
	int rc;

	if (!sb->ready_open)
		return tt_err_set(err, TT_ERR_INVALID, "sandbox was not launched");
	rc = ns_read_ready(sb->ready_fd, sb->pidfd, sb->ready_deadline_ms, err);
	close(sb->ready_fd);
	sb->ready_fd = -1;
	sb->ready_open = false;
	if (rc < 0) {
		struct tt_err ignored;

		ns_sandbox_stop(sb, &ignored);
		ns_sandbox_init(sb);
		return -1;
	}
	log_info("ns: sandbox init pid %d ready", (int)sb->init_pid);
	return 0;
}

/* ns_sandbox_start: launch, then wait for readiness. */
int ns_sandbox_start(const struct ns_config *cfg, struct ns_sandbox *out,
                     struct tt_err *err)
{
	if (ns_sandbox_launch(cfg, out, err) < 0)
		return -1;
	return ns_sandbox_wait_ready(out, err);
}

/* ---- freezer (pause, SPEC §7) ------------------------------------------ */

#define NS_FREEZER_ROOT "/sys/fs/cgroup/freezer"
#define NS_FREEZE_PASSES 50

/* ns_fz_write: writes val to dir/file in one write. */
static int ns_fz_write(const char *dir, const char *file, const char *val,
                       struct tt_err *err)
{
	char path[PATH_MAX];

	if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path)
		return tt_err_set(err, TT_ERR_INVALID, "freezer path too long");
	_cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "freezer: open %s", path);
	ssize_t w = write(fd, val, strlen(val));
	if (w < 0 || (size_t)w != strlen(val))
		return tt_err_sys(err, TT_ERR_SYS, "freezer: write %s", path);
	return 0;
}

/* ns_fz_read: reads dir/file (bounded) into buf; -1 when unreadable. */
static ssize_t ns_fz_read(const char *dir, const char *file, char *buf, size_t cap)
{
	char path[PATH_MAX];
	size_t got = 0;

	if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path)
		return -1;
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	while (got + 1 < cap) {
		ssize_t n = read(fd, buf + got, cap - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	buf[got] = '\0';
	return (ssize_t)got;
}

/* ns_fz_pids_cgroup: the pids cgroup dir of pid from /proc/<pid>/cgroup
 * (v1 line "N:pids:/path"). */
static int ns_fz_pids_cgroup(pid_t pid, char out[PATH_MAX], struct tt_err *err)
{
	char dir[64], buf[4096];

	snprintf(dir, sizeof dir, "/proc/%d", (int)pid);
	if (ns_fz_read(dir, "cgroup", buf, sizeof buf) < 0)
		return tt_err_sys(err, TT_ERR_NOT_FOUND, "cannot read /proc/%d/cgroup", (int)pid);
	for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l;
	     l = strtok_r(NULL, "\n", &save)) {
		char *c1 = strchr(l, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (c2 == NULL || (size_t)(c2 - c1 - 1) != 4 || strncmp(c1 + 1, "pids", 4) != 0)
			continue;
		/* The path must be one of ours: tether/<name>, nothing else. */
		if (strncmp(c2 + 1, "/tether/", 8) != 0 || strchr(c2 + 9, '/') != NULL ||
		    !ns_id_ok(c2 + 9))
			break;
		if (snprintf(out, PATH_MAX, "/sys/fs/cgroup/pids%s", c2 + 1) >= PATH_MAX)
			break;
		return 0;
	}
	return tt_err_set(err, TT_ERR_SYS, "sandbox init %d is not in a tether pids cgroup",
	                  (int)pid);
}

/* ns_fz_exiting: pid is past the point where cgroups change: a zombie, or
 * a task the kernel skipped when asked to move it (an exiting one: the
 * write succeeds, the task stays where it was). Such a task runs nothing
 * more, so it neither needs freezing nor counts as one that appeared. */
static bool ns_fz_exiting(const char *pid, const char *fz)
{
	char path[64], buf[4096], want[PATH_MAX];
	const char *name = strrchr(fz, '/');
	_cleanup_close_ int fd = -1;
	ssize_t n;
	char *rp;

	if (snprintf(path, sizeof(path), "/proc/%s/stat", pid) >= (int)sizeof(path) ||
	    (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return true; /* gone */
	n = read(fd, buf, sizeof(buf) - 1);
	if (n <= 0)
		return true;
	buf[n] = '\0';
	rp = strrchr(buf, ')');
	if (rp == NULL || rp[1] != ' ' || rp[2] == 'Z' || rp[2] == 'X')
		return true;
	close(fd);
	fd = -1;
	if (name == NULL ||
	    snprintf(path, sizeof(path), "/proc/%s/cgroup", pid) >= (int)sizeof(path) ||
	    snprintf(want, sizeof(want), ":freezer:/tether%s\n", name) >= (int)sizeof(want) ||
	    (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return true;
	n = read(fd, buf, sizeof(buf) - 1);
	if (n <= 0)
		return true;
	buf[n] = '\0';
	return strstr(buf, want) == NULL;
}

/* ns_fz_move: moves every task listed in src/cgroup.procs that is not yet
 * in the freezer; returns how many it moved, -1 on error. */
static int ns_fz_move(const char *src, const char *fz, struct tt_err *err)
{
	static char have[65536], want[65536]; /* manager is single-threaded here */
	char procs[PATH_MAX];
	int moved = 0;

	if (snprintf(procs, sizeof procs, "%s/cgroup.procs", fz) >= (int)sizeof procs)
		return tt_err_set(err, TT_ERR_INVALID, "freezer path too long");
	_cleanup_close_ int pfd = open(procs, O_WRONLY | O_CLOEXEC);
	if (pfd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "freezer: open %s", procs);
	if (ns_fz_read(src, "cgroup.procs", want, sizeof want) < 0 ||
	    ns_fz_read(fz, "cgroup.procs", have, sizeof have) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "freezer: cannot list tasks");
	for (char *save = NULL, *t = strtok_r(want, "\n", &save); t;
	     t = strtok_r(NULL, "\n", &save)) {
		char needle[32];
		size_t tl = strlen(t);
		int found = 0;

		if (tl == 0 || tl > 20)
			continue;
		snprintf(needle, sizeof needle, "%s\n", t);
		for (const char *h = have; (h = strstr(h, needle)) != NULL; h++)
			if (h == have || h[-1] == '\n') {
				found = 1;
				break;
			}
		if (found)
			continue;
		/* Privileged: moving the sandbox's tasks into its freezer cgroup. */
		if (write(pfd, t, tl) != (ssize_t)tl) {
			if (errno == ESRCH)
				continue; /* exited meanwhile */
			return tt_err_sys(err, TT_ERR_SYS, "freezer: move task %s", t);
		}
		/* an exiting task is skipped silently: not "moved", else each
		 * pass would count it again (a false fork storm: pauses failed
		 * while an aborted command's processes were on their way out) */
		if (!ns_fz_exiting(t, fz))
			moved++;
	}
	return moved;
}

int ns_sandbox_freeze(struct ns_sandbox *sb, unsigned timeout_ms, struct tt_err *err)
{
	char src[PATH_MAX], fz[PATH_MAX], state[64];
	const char *name;
	struct timespec t0;

	if (sb->init_pid <= 0)
		return tt_err_set(err, TT_ERR_INVALID, "freeze: sandbox not running");
	if (access(NS_FREEZER_ROOT "/cgroup.procs", F_OK) < 0)
		return tt_err_set(err, TT_ERR_SYS, "freeze: no cgroup v1 freezer at %s",
		                  NS_FREEZER_ROOT);
	if (ns_fz_pids_cgroup(sb->init_pid, src, err) < 0)
		return -1;
	name = strrchr(src, '/') + 1;
	if (snprintf(fz, sizeof fz, "%s/tether/%s", NS_FREEZER_ROOT, name) >= (int)sizeof fz)
		return tt_err_set(err, TT_ERR_INVALID, "freezer path too long");
	/* Privileged: a freezer cgroup per sandbox, made on demand. */
	if ((mkdir(NS_FREEZER_ROOT "/tether", 0755) < 0 && errno != EEXIST) ||
	    (mkdir(fz, 0755) < 0 && errno != EEXIST))
		return tt_err_sys(err, TT_ERR_SYS, "freeze: mkdir %s", fz);
	memcpy(sb->cgroup_freezer, fz, sizeof fz);
	/* Tasks forked while we move others land in the pids cgroup of their
	 * parent: repeat until a pass after FROZEN finds nobody left out
	 * (a task moved into a frozen cgroup is frozen too). */
	int passes = 0, moved;
	do {
		moved = ns_fz_move(src, fz, err);
		if (moved < 0)
			goto fail;
		if (passes == 0 && ns_fz_write(fz, "freezer.state", "FROZEN", err) < 0)
			goto fail;
	} while ((moved > 0 || passes == 0) && ++passes < NS_FREEZE_PASSES);
	if (moved > 0) {
		tt_err_set(err, TT_ERR_SYS, "freeze: tasks keep appearing (fork storm)");
		goto fail;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct timespec t1;

		if (ns_fz_read(fz, "freezer.state", state, sizeof state) < 0) {
			tt_err_sys(err, TT_ERR_SYS, "freeze: read freezer.state");
			goto fail;
		}
		if (strncmp(state, "FROZEN", 6) == 0)
			return 0;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >
		    (long)timeout_ms) {
			tt_err_set(err, TT_ERR_SYS, "freeze: not FROZEN after %u ms", timeout_ms);
			goto fail;
		}
		/* FREEZING: writing FROZEN again retries tasks that were busy. */
		ns_fz_write(fz, "freezer.state", "FROZEN", &(struct tt_err){ 0 });
		nanosleep(&(struct timespec){ .tv_nsec = 2 * 1000 * 1000 }, NULL);
	}
fail:
	ns_sandbox_thaw(sb, &(struct tt_err){ 0 });
	return -1;
}

int ns_sandbox_thaw(struct ns_sandbox *sb, struct tt_err *err)
{
	if (!sb->cgroup_freezer[0])
		return 0;
	/* Privileged: thawing the sandbox's freezer cgroup. */
	return ns_fz_write(sb->cgroup_freezer, "freezer.state", "THAWED", err);
}

/* ns_fz_remove: removes the freezer cgroup once its tasks are gone. */
static void ns_fz_remove(struct ns_sandbox *sb)
{
	if (!sb->cgroup_freezer[0])
		return;
	for (int i = 0; i < 200; i++) {
		if (rmdir(sb->cgroup_freezer) == 0 || errno == ENOENT)
			break;
		if (errno != EBUSY) {
			log_warn("ns: rmdir %s: %s", sb->cgroup_freezer, strerror(errno));
			break;
		}
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	sb->cgroup_freezer[0] = '\0';
}

void ns_freezer_release(const char *sbx_id, uint64_t gen)
{
	struct ns_sandbox sb;

	if (!ns_id_ok(sbx_id))
		return;
	ns_sandbox_init(&sb);
	snprintf(sb.cgroup_freezer, sizeof sb.cgroup_freezer, "%s/tether/%s-g%" PRIu64,
	         NS_FREEZER_ROOT, sbx_id, gen);
	if (access(sb.cgroup_freezer, F_OK) < 0)
		return;
	ns_sandbox_thaw(&sb, &(struct tt_err){ 0 });
	ns_fz_remove(&sb);
}

int ns_sandbox_stop(struct ns_sandbox *sb, struct tt_err *err)
{
	if (sb->assign_fd >= 0) {
		close(sb->assign_fd);
		sb->assign_fd = -1;
	}
	if (sb->ready_open) {
		close(sb->ready_fd);
		sb->ready_fd = -1;
		sb->ready_open = false;
	}
	if (sb->init_pid > 0 && sb->pidfd >= 0) {
		/* A frozen init cannot die: kill it first (nothing may run
		 * after a pause's snapshot), then thaw so the kill lands. */
		if (sb->cgroup_freezer[0]) {
			syscall(SYS_pidfd_send_signal, sb->pidfd, SIGKILL, NULL, 0);
			ns_sandbox_thaw(sb, &(struct tt_err){ 0 });
		}
		ns_kill_reap(sb);
		close(sb->pidfd);
	}
	sb->pidfd = -1;
	sb->init_pid = 0;
	ns_sandbox_thaw(sb, &(struct tt_err){ 0 });
	ns_fz_remove(sb);
	/* The pid namespace's other processes died with its init (the kernel
	 * reaps them before the init's own exit completes). */
	return ns_cgroup_remove(sb, err);
}

int proc_start_time(pid_t pid, unsigned long long *out, struct tt_err *err)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, errno == ENOENT ? TT_ERR_NOT_FOUND : TT_ERR_IO, "open %s", path);
	ssize_t n = read(fd, buf, sizeof buf - 1);
	if (n <= 0)
		return tt_err_sys(err, TT_ERR_IO, "read %s", path);
	buf[n] = '\0';
	/* comm may hold ')' and spaces: fields start after the last ')'. */
	char *s = strrchr(buf, ')');
	if (!s)
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: no ')'", path);
	s++;
	/* Field 3 (state) is the first after ')': field 22 is the 20th. */
	for (int field = 3; field < 22; field++) {
		while (*s == ' ')
			s++;
		while (*s && *s != ' ')
			s++;
		if (!*s)
			return tt_err_set(err, TT_ERR_MALFORMED, "%s: too few fields", path);
	}
	while (*s == ' ')
		s++;
	if (*s < '0' || *s > '9')
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: bad starttime", path);
	errno = 0;
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || (*end != ' ' && *end != '\n' && *end != '\0'))
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: bad starttime", path);
	*out = v;
	return 0;
}

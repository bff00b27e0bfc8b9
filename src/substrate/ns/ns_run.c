/* The sandbox's /run/tether: a small tmpfs of its own, capped in bytes and
 * inodes, mounted on <sandbox_dir>/run in the manager's (host) mount
 * namespace, where the host bridge reaches the guest socket, and bound
 * into the sandbox. Before, it was a plain host directory outside the
 * writable layer's caps: a sandbox wrote 1.2 GiB there while its layer
 * stopped at 957 MiB. Its pages are charged to the sandbox's memory cgroup
 * (the writer's), and it is unmounted whenever the layer is. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "cleanup.h"
#include "log.h"
#include "substrate/ns/ns.h"
#include "substrate/ns/ns_int.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

/* run_mounted: a tmpfs is mounted on dir (its device differs from its
 * parent's and statfs says tmpfs); no symlink is followed. */
static bool run_mounted(const char *dir)
{
	char parent[PATH_MAX];
	struct stat sd, sp;
	struct statfs fs;
	const char *slash = strrchr(dir, '/');

	if (slash == NULL || (size_t)(slash - dir) >= sizeof(parent))
		return false;
	memcpy(parent, dir, (size_t)(slash - dir));
	parent[slash - dir] = '\0';
	if (lstat(dir, &sd) < 0 || !S_ISDIR(sd.st_mode) ||
	    lstat(parent[0] ? parent : "/", &sp) < 0 || sd.st_dev == sp.st_dev)
		return false;
	_cleanup_close_ int fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd >= 0 && fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

/* ns_run_mount: see ns_int.h. */
int ns_run_mount(const char *dir, uid_t uid, struct tt_err *err)
{
	char opts[128];
	struct stat st;

	if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return tt_err_set(err, TT_ERR_INVALID, "%s is not a directory", dir);
	if (run_mounted(dir)) {
		/* One left by a stop without a layer unmount (unit tests), or
		 * a spare's tree taken by a sandbox of another slot (a
		 * resume): same caps; its root is handed to uid below. */
		_cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
		                              O_CLOEXEC);

		/* Privileged: the run tmpfs's root to this sandbox's root. */
		if (fd < 0 || fchown(fd, uid, uid) < 0 || fchmod(fd, 0700) < 0)
			return tt_err_sys(err, TT_ERR_SYS, "handing %s to uid %u", dir,
			                  (unsigned)uid);
		return 0;
	}
	snprintf(opts, sizeof(opts), "mode=0700,uid=%u,gid=%u,size=%llu,nr_inodes=%u",
	         (unsigned)uid, (unsigned)uid, (unsigned long long)NS_RUN_BYTES,
	         NS_RUN_INODES);
	/* Privileged: the sandbox's /run/tether as a tmpfs of its own, capped
	 * (size, nr_inodes), owned by its mapped root, nothing executable or
	 * setuid; mounted on a root-only dir of ours (no symlink followed). */
	if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOSYMFOLLOW,
	          opts) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "mount the run tmpfs on %s", dir);
	return 0;
}

/* ns_run_umount: see ns_int.h. */
int ns_run_umount(const char *sandbox_dir, struct tt_err *err)
{
	char dir[PATH_MAX];

	if (snprintf(dir, sizeof(dir), "%s/run", sandbox_dir) >= (int)sizeof(dir))
		return tt_err_set(err, TT_ERR_INVALID, "sandbox path too long: %s/run",
		                  sandbox_dir);
	for (int i = 0; i < 4 && run_mounted(dir); i++) {
		/* Privileged: unmounting the run tmpfs we mounted; lazily if a
		 * host process still holds it (nothing there is needed). */
		if (umount2(dir, UMOUNT_NOFOLLOW) < 0 && errno == EBUSY &&
		    umount2(dir, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
			return tt_err_sys(err, TT_ERR_SYS, "umount %s", dir);
	}
	if (run_mounted(dir))
		return tt_err_set(err, TT_ERR_SYS, "%s still mounted", dir);
	return 0;
}

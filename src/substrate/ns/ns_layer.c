/* The sandbox's writable layer as its own filesystem (ns.h, "writable
 * layer"): <dir>/layer.img, a sparse file formatted ext4 with a fixed size
 * and inode count, loop-mounted (nosuid, nodev) on <dir>/layer, so a
 * sandbox that fills its disk or its inodes gets ENOSPC inside its own
 * filesystem while the worker's filesystem (runtime.db, other sandboxes)
 * loses at most the image's size.
 *
 * Choices (measured on this host, 1 GiB image, kernel 6.18):
 *  - ext4 WITH its journal: mkfs ~14 ms either way (lazy_journal_init: the
 *    journal is not written; a sparse file reads as zeros), but the image
 *    outlives the manager (restarts, `tether up` stop/start) and a host
 *    crash must not leave a layer that needs fsck before it can be trusted.
 *    The journal costs 32 MiB of the image's 1 GiB (not of the host: only
 *    blocks written are allocated), and ~14 ms at umount (commit).
 *  - -m 0 (no root-reserved blocks: the cap is what the sandbox gets),
 *    -N (the inode cap), -b 4096, lazy_itable_init and the mount option
 *    noinit_itable: the inode tables of a fresh sparse image already read
 *    as zeros, so neither mkfs nor the kernel's lazyinit thread writes
 *    (and allocates on the host) 16 MiB of zeros per sandbox.
 *  - mount: nosuid, nodev (the sandbox's own binds add the same), discard
 *    (blocks the sandbox frees are punched out of the image, so host usage
 *    follows live data, capped), errors=remount-ro.
 *  - the loop device: LOOP_CTL_GET_FREE + LOOP_CONFIGURE with
 *    LO_FLAGS_AUTOCLEAR: once the filesystem is unmounted (and no sandbox
 *    mount namespace holds it any more) the device frees itself; we never
 *    keep its fd. Direct I/O avoids caching every block twice.
 * The image is only ever written through the mounted filesystem (never by
 * the sandbox as raw bytes, and snapshots move files, not images), so the
 * kernel never parses an image crafted by untrusted code. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/loop.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "log.h"
#include "substrate/ns/ns.h"
#include "substrate/ns/ns_int.h"

#define LAYER_MNT_OPTS "errors=remount-ro,noinit_itable,discard"
#define LAYER_MOUNT_FLAGS (MS_NOSUID | MS_NODEV)
#define LAYER_ATTACH_TRIES 8
#define LAYER_DETACH_WAIT_MS 1000
/* ext4's shutdown ioctl (linux/fs/ext4/ext4.h; not in this libc's uapi
 * headers): NOLOGFLUSH drops dirty data and the journal's tail. */
#ifndef EXT4_IOC_SHUTDOWN
#define EXT4_IOC_SHUTDOWN _IOR('X', 125, uint32_t)
#endif
#define LAYER_GOING_NOLOGFLUSH 0x2u

/* layer_paths: <dir>/layer.img and <dir>/layer, bounded. */
static int layer_paths(const char *dir, char img[PATH_MAX], char mnt[PATH_MAX],
                       struct tt_err *err)
{
	if (dir == NULL || dir[0] != '/')
		return tt_err_set(err, TT_ERR_INVALID, "layer: sandbox dir must be absolute");
	if (snprintf(img, PATH_MAX, "%s/" NS_LAYER_IMG, dir) >= PATH_MAX ||
	    snprintf(mnt, PATH_MAX, "%s/layer", dir) >= PATH_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "layer: path too long under %s", dir);
	return 0;
}

/* ns_layer_mounted: <dir>/layer is a directory on another device than
 * <dir>: our filesystem is mounted there (nothing else mounts on it). */
bool ns_layer_mounted(const char *dir)
{
	char img[PATH_MAX], mnt[PATH_MAX];
	struct stat sd, sm;

	if (layer_paths(dir, img, mnt, NULL) < 0 || lstat(dir, &sd) < 0 ||
	    lstat(mnt, &sm) < 0)
		return false;
	return S_ISDIR(sm.st_mode) && sm.st_dev != sd.st_dev;
}

/* layer_mkfs: mkfs.ext4 on img, run as a child and waited for. */
static int layer_mkfs(const char *img, uint64_t inodes, struct tt_err *err)
{
	static const char *const bins[] = { "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4" };
	static char *const envp[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C", NULL };
	char n_s[24];
	const char *bin = NULL;
	pid_t pid;
	int st = 0, rc;

	for (size_t i = 0; i < sizeof(bins) / sizeof(bins[0]) && bin == NULL; i++)
		if (access(bins[i], X_OK) == 0)
			bin = bins[i];
	if (bin == NULL)
		return tt_err_set(err, TT_ERR_SYS, "layer: mkfs.ext4 not found (install "
		                  "e2fsprogs)");
	snprintf(n_s, sizeof(n_s), "%" PRIu64, inodes);
	char *const argv[] = { (char *)bin, "-q", "-F", "-t", "ext4", "-b", "4096",
	                       "-m", "0", "-N", n_s, "-E",
	                       "lazy_itable_init=1,lazy_journal_init=1,nodiscard,"
	                       "root_owner=0:0",
	                       (char *)img, NULL };
	/* Privileged (runs as root): formats our own image file, nothing else. */
	rc = posix_spawn(&pid, bin, NULL, NULL, argv, envp);
	if (rc != 0) {
		errno = rc;
		return tt_err_sys(err, TT_ERR_SYS, "layer: cannot run %s", bin);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return tt_err_sys(err, TT_ERR_SYS, "layer: waiting for mkfs");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return tt_err_set(err, TT_ERR_SYS, "layer: mkfs.ext4 %s failed (status %d)",
		                  img, st);
	return 0;
}

/* layer_attached: the loop device (/dev/loopN in out) already backed by
 * img's inode, if any: an image must never be mounted twice (two ext4
 * instances on one image corrupt it), e.g. while a dying sandbox's mount
 * namespace still holds the first. */
static bool layer_attached(const char *img, char out[32])
{
	_cleanup_close_ int fd = -1;
	struct stat si;
	struct dirent *de;
	DIR *d;
	bool found = false;

	if (stat(img, &si) < 0 || (d = opendir("/sys/block")) == NULL)
		return false;
	while (!found && (de = readdir(d)) != NULL) {
		char path[300], back[PATH_MAX];
		struct stat sb;
		ssize_t n;

		if (strncmp(de->d_name, "loop", 4) != 0)
			continue;
		snprintf(path, sizeof(path), "/sys/block/%.64s/loop/backing_file", de->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, back, sizeof(back) - 1);
		close(fd);
		fd = -1;
		if (n <= 0)
			continue;
		back[n] = '\0';
		back[strcspn(back, "\n")] = '\0';
		if (stat(back, &sb) == 0 && sb.st_dev == si.st_dev && sb.st_ino == si.st_ino) {
			snprintf(out, 32, "/dev/%.20s", de->d_name);
			found = true;
		}
	}
	closedir(d);
	return found;
}

/* layer_attach: a free loop device backed by img (autoclear); returns its
 * fd (the caller closes it once mounted: then the mount holds the device)
 * and its path in dev. */
static int layer_attach(const char *img, char dev[32], struct tt_err *err)
{
	_cleanup_close_ int ctl = -1, ffd = -1;

	ffd = open(img, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (ffd < 0)
		return tt_err_sys(err, TT_ERR_IO, "layer: open %s", img);
	ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
	if (ctl < 0)
		return tt_err_sys(err, TT_ERR_SYS, "layer: open /dev/loop-control");
	for (int i = 0; i < LAYER_ATTACH_TRIES; i++) {
		struct loop_config cfg;
		int n, lfd;

		/* Privileged: allocates (or finds) a free loop device. */
		n = ioctl(ctl, LOOP_CTL_GET_FREE);
		if (n < 0)
			return tt_err_sys(err, TT_ERR_SYS, "layer: LOOP_CTL_GET_FREE");
		snprintf(dev, 32, "/dev/loop%d", n);
		lfd = open(dev, O_RDWR | O_CLOEXEC);
		if (lfd < 0)
			return tt_err_sys(err, TT_ERR_SYS, "layer: open %s", dev);
		memset(&cfg, 0, sizeof(cfg));
		cfg.fd = (unsigned)ffd;
		cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
		snprintf((char *)cfg.info.lo_file_name, LO_NAME_SIZE, "%s", img);
		/* Privileged: binds the device to our image; autoclear frees it
		 * when its last user (the mount) goes. */
		if (ioctl(lfd, LOOP_CONFIGURE, &cfg) == 0)
			return lfd;
		if (errno == EINVAL) { /* no direct I/O on this backing fs */
			cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
			if (ioctl(lfd, LOOP_CONFIGURE, &cfg) == 0)
				return lfd;
		}
		close(lfd);
		if (errno != EBUSY) /* EBUSY: another process took it first */
			return tt_err_sys(err, TT_ERR_SYS, "layer: LOOP_CONFIGURE %s", dev);
	}
	return tt_err_set(err, TT_ERR_SYS, "layer: no free loop device after %d tries",
	                  LAYER_ATTACH_TRIES);
}

/* layer_mount: attaches img and mounts it on mnt (an existing dir). fresh:
 * img was just created (O_EXCL) by us, so no loop device can hold it: a
 * device keeps its file's inode alive, so the number cannot be reused
 * while attached. This skips layer_attached, whose scan of every loop
 * device costs ~2 syscalls per running sandbox. */
static int layer_mount(const char *img, const char *mnt, bool fresh, struct tt_err *err)
{
	char dev[32];
	int lfd, rc;

	/* A sandbox stopped just now may hold its filesystem a little longer
	 * (the kernel drops an exiting task's mounts asynchronously). */
	for (int i = 0; !fresh && layer_attached(img, dev); i++) {
		if (i == LAYER_DETACH_WAIT_MS / 10)
			return tt_err_set(err, TT_ERR_CONFLICT, "layer: %s is still attached to "
			                  "%s (a process still holds it); not mounting it twice",
			                  img, dev);
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	lfd = layer_attach(img, dev, err);
	if (lfd < 0)
		return -1;
	/* Privileged: mounts the sandbox's own filesystem in the manager's
	 * (the host's) mount namespace; nosuid/nodev: nothing on it may
	 * gain privileges or reach devices, even from the host side. */
	rc = mount(dev, mnt, "ext4", LAYER_MOUNT_FLAGS, LAYER_MNT_OPTS);
	if (rc < 0)
		tt_err_sys(err, TT_ERR_SYS, "layer: mount %s on %s", dev, mnt);
	close(lfd); /* mounted: the mount holds it; failed: autoclear detaches */
	return rc;
}

/* layer_dir_ready: mnt is an empty directory (or missing: made 0700). */
static int layer_dir_ready(const char *mnt, struct tt_err *err)
{
	struct stat st;
	struct dirent *de;
	DIR *d;
	int n = 0;

	if (mkdir(mnt, 0700) == 0)
		return 0;
	if (errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "layer: mkdir %s", mnt);
	if (lstat(mnt, &st) < 0 || !S_ISDIR(st.st_mode))
		return tt_err_set(err, TT_ERR_INVALID, "layer: %s is not a directory", mnt);
	d = opendir(mnt);
	if (d == NULL)
		return tt_err_sys(err, TT_ERR_IO, "layer: opendir %s", mnt);
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
			n++;
	closedir(d);
	/* Mounting over files would hide them (a layer from before disk
	 * quotas, say): refuse rather than lose them silently. */
	if (n > 0)
		return tt_err_set(err, TT_ERR_CONFLICT, "layer: %s holds files but no "
		                  NS_LAYER_IMG "; move them away first", mnt);
	return 0;
}

/* layer_populate: the freshly mounted filesystem on mnt: no lost+found
 * (it would be packed into snapshots and costs inodes; e2fsck remakes it),
 * a root-only root, empty root-only home, tmp and workspace. */
static int layer_populate(const char *mnt, struct tt_err *err)
{
	static const char *const subs[] = { "home", "tmp", "workspace" };
	char p[PATH_MAX + 16];

	snprintf(p, sizeof(p), "%s/lost+found", mnt);
	if (rmdir(p) < 0 && errno != ENOENT)
		return tt_err_sys(err, TT_ERR_IO, "layer: rmdir %s", p);
	if (chmod(mnt, 0700) < 0)
		return tt_err_sys(err, TT_ERR_IO, "layer: chmod %s", mnt);
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", mnt, subs[i]);
		if (mkdir(p, 0700) < 0 && errno != EEXIST)
			return tt_err_sys(err, TT_ERR_IO, "layer: mkdir %s", p);
	}
	return 0;
}

/* layer_format: a new sparse file img of bytes, formatted with inodes. */
static int layer_format(const char *img, uint64_t bytes, uint64_t inodes, struct tt_err *err)
{
	_cleanup_close_ int fd = -1;

	if (bytes < NS_LAYER_MIN_BYTES || bytes % 4096 != 0)
		return tt_err_set(err, TT_ERR_INVALID, "layer: size must be a multiple of "
		                  "4 KiB, at least %u MiB", (unsigned)(NS_LAYER_MIN_BYTES >> 20));
	if (inodes == 0)
		inodes = bytes / NS_LAYER_BYTES_PER_INODE;
	if (inodes < 64 || inodes > UINT32_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "layer: inode count out of range");
	fd = open(img, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "layer: create %s", img);
	/* Sparse: the host pays only for blocks written, never above bytes. */
	if (ftruncate(fd, (off_t)bytes) < 0) {
		tt_err_sys(err, TT_ERR_IO, "layer: size %s", img);
		unlink(img);
		return -1;
	}
	if (layer_mkfs(img, inodes, err) < 0) {
		unlink(img);
		return -1;
	}
	return 0;
}

/* layer_copy: img as a sparse copy of the template tmpl (only its data
 * extents are copied: ~0.7 MiB for a fresh 1 GiB image). */
static int layer_copy(const char *tmpl, const char *img, struct tt_err *err)
{
	_cleanup_close_ int in = open(tmpl, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_close_ int out = -1;
	struct stat st;
	off_t pos = 0;

	if (in < 0 || fstat(in, &st) < 0)
		return tt_err_sys(err, TT_ERR_IO, "layer: open template %s", tmpl);
	out = open(img, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0)
		return tt_err_sys(err, TT_ERR_IO, "layer: create %s", img);
	while (pos < st.st_size) {
		off_t data = lseek(in, pos, SEEK_DATA), hole;

		if (data < 0 && errno == ENXIO)
			break; /* only a hole left */
		if (data < 0 || (hole = lseek(in, data, SEEK_HOLE)) < 0)
			goto fail;
		for (off_t o_in = data, o_out = data; o_in < hole;) {
			ssize_t n = copy_file_range(in, &o_in, out, &o_out, (size_t)(hole - o_in), 0);
			if (n <= 0)
				goto fail;
		}
		pos = hole;
	}
	if (ftruncate(out, st.st_size) < 0)
		goto fail;
	return 0;
fail:
	tt_err_sys(err, TT_ERR_IO, "layer: copy %s to %s", tmpl, img);
	unlink(img);
	return -1;
}

/* layer_make: <dir>/layer.img copied from tmpl, or (tmpl NULL) formatted
 * anew, then mounted on <dir>/layer and populated; -1: nothing left
 * mounted or created. */
static int layer_make(const char *dir, const char *tmpl, uint64_t bytes, uint64_t inodes,
                      struct tt_err *err)
{
	char img[PATH_MAX], mnt[PATH_MAX];

	if (layer_paths(dir, img, mnt, err) < 0 || layer_dir_ready(mnt, err) < 0)
		return -1;
	if (tmpl != NULL ? layer_copy(tmpl, img, err) < 0
	                 : layer_format(img, bytes, inodes, err) < 0)
		return -1;
	if (layer_mount(img, mnt, true, err) < 0)
		goto fail;
	if (layer_populate(mnt, err) < 0) {
		ns_layer_umount(dir, NULL);
		goto fail;
	}
	return 0;
fail:
	unlink(img);
	return -1;
}

/* ns_layer_make: a fresh image, formatted and mounted, with empty
 * root-only home, tmp and workspace (ns_sandbox_launch sets their owners). */
int ns_layer_make(const char *dir, uint64_t bytes, uint64_t inodes, struct tt_err *err)
{
	return layer_make(dir, NULL, bytes, inodes, err);
}

/* ns_layer_make_from: likewise, copying a template (ns_layer_template). */
int ns_layer_make_from(const char *dir, const char *tmpl, struct tt_err *err)
{
	return layer_make(dir, tmpl, 0, 0, err);
}

/* ns_layer_template: formats tmpl (replacing any), then mounts it once in
 * a scratch dir next to it to populate it like a fresh layer. */
int ns_layer_template(const char *tmpl, uint64_t bytes, uint64_t inodes, struct tt_err *err)
{
	char mnt[PATH_MAX];
	int rc;

	if (snprintf(mnt, sizeof(mnt), "%s.mnt", tmpl) >= (int)sizeof(mnt))
		return tt_err_set(err, TT_ERR_INVALID, "layer: template path too long");
	/* A template left by an earlier run may be for another size. */
	if ((umount2(mnt, UMOUNT_NOFOLLOW) < 0 && errno != EINVAL && errno != ENOENT) ||
	    (unlink(tmpl) < 0 && errno != ENOENT) || (rmdir(mnt) < 0 && errno != ENOENT))
		return tt_err_sys(err, TT_ERR_IO, "layer: removing the old template %s", tmpl);
	if (layer_format(tmpl, bytes, inodes, err) < 0)
		return -1;
	if (mkdir(mnt, 0700) < 0) {
		tt_err_sys(err, TT_ERR_IO, "layer: mkdir %s", mnt);
		unlink(tmpl);
		return -1;
	}
	if (layer_mount(tmpl, mnt, true, err) < 0) {
		rmdir(mnt);
		unlink(tmpl);
		return -1;
	}
	rc = layer_populate(mnt, err);
	/* Privileged: unmounting the template's one-time mount. */
	if (umount2(mnt, UMOUNT_NOFOLLOW) < 0 && rc == 0)
		rc = tt_err_sys(err, TT_ERR_SYS, "layer: umount %s", mnt);
	rmdir(mnt);
	if (rc < 0)
		unlink(tmpl);
	return rc;
}

/* ns_layer_ensure: mounted already, or the existing image mounted, or a
 * fresh one made (copied from tmpl when given: ~1 ms instead of mkfs's
 * ~7 ms, when no spare was ready). */
int ns_layer_ensure(const char *dir, const char *tmpl, uint64_t bytes, uint64_t inodes,
                    struct tt_err *err)
{
	char img[PATH_MAX], mnt[PATH_MAX];
	struct stat st;

	if (layer_paths(dir, img, mnt, err) < 0)
		return -1;
	if (ns_layer_mounted(dir))
		return 0;
	if (lstat(img, &st) < 0) {
		if (errno != ENOENT)
			return tt_err_sys(err, TT_ERR_IO, "layer: stat %s", img);
		return tmpl != NULL ? ns_layer_make_from(dir, tmpl, err)
		                    : ns_layer_make(dir, bytes, inodes, err);
	}
	if (!S_ISREG(st.st_mode))
		return tt_err_set(err, TT_ERR_INVALID, "layer: %s is not a file", img);
	if (layer_dir_ready(mnt, err) < 0)
		return -1;
	/* The image keeps the size it was made with (files stay as they are). */
	return layer_mount(img, mnt, false, err);
}

/* ns_layer_umount: unmounts <dir>/layer if mounted; keeps the image. */
int ns_layer_umount(const char *dir, struct tt_err *err)
{
	char img[PATH_MAX], mnt[PATH_MAX];

	if (layer_paths(dir, img, mnt, err) < 0)
		return -1;
	/* The run tmpfs goes with the layer: mounted exactly as long. */
	if (ns_run_umount(dir, err) < 0)
		return -1;
	for (int i = 0; i < 4 && ns_layer_mounted(dir); i++) {
		/* Privileged: unmounting the layer we mounted (no symlink is
		 * followed: the path is ours, this is belt and braces). */
		if (umount2(mnt, UMOUNT_NOFOLLOW) == 0)
			continue;
		if (errno != EBUSY)
			return tt_err_sys(err, TT_ERR_SYS, "layer: umount %s", mnt);
		/* Something on the host still uses it (a shell's cwd, an open
		 * file): detach it from the tree now; the kernel drops it, and
		 * autoclear frees the loop device, when that user goes. Safe
		 * because nobody can reach it by path any more, and a later
		 * mount of the same image is refused while it stays attached. */
		log_warn("layer: %s busy; detaching it lazily", mnt);
		/* Privileged: lazy unmount of our own layer. */
		if (umount2(mnt, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
			return tt_err_sys(err, TT_ERR_SYS, "layer: umount -l %s", mnt);
	}
	if (ns_layer_mounted(dir))
		return tt_err_set(err, TT_ERR_SYS, "layer: %s still mounted", mnt);
	return 0;
}

/* ns_layer_remove: unmount, then delete the image and the (now empty)
 * mount point. */
int ns_layer_remove(const char *dir, struct tt_err *err)
{
	char img[PATH_MAX], mnt[PATH_MAX];

	if (layer_paths(dir, img, mnt, err) < 0)
		return -1;
	if (ns_layer_mounted(dir)) {
		/* The image is deleted next: its dirty data need not be
		 * written back first (with 10 MiB just written, an ordinary
		 * unmount costs a pause ~12 ms). Shut the filesystem down
		 * without flushing; best effort (then the unmount writes). */
		_cleanup_close_ int fd = open(mnt, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
		                              O_CLOEXEC);
		uint32_t how = LAYER_GOING_NOLOGFLUSH;

		/* Privileged: shutting down our own layer's filesystem. */
		if (fd >= 0 && ioctl(fd, EXT4_IOC_SHUTDOWN, &how) < 0)
			log_warn("layer: shutdown %s: %s", mnt, strerror(errno));
	}
	if (ns_layer_umount(dir, err) < 0)
		return -1;
	if (unlink(img) < 0 && errno != ENOENT)
		return tt_err_sys(err, TT_ERR_IO, "layer: unlink %s", img);
	return 0;
}

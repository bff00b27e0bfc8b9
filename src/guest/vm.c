/* tether-guest as the init of a microVM (vm.h): from the initramfs to a
 * served channel. The layout it expects, made by the asset builder
 * (src/substrate/microvm/tether-vm-assets.sh):
 *   initramfs: /init (this binary), /dev /proc /sys /newroot, and
 *              /lib/tether-modules/{*.ko,order}
 *   /dev/vda:  the root (a template's tree, ext4), mounted read-only; it
 *              has the mount points home tmp workspace run dev proc sys
 *              .layer
 *   /dev/vdb:  the sandbox's writable layer (ext4 holding home, tmp,
 *              workspace), mounted nosuid,nodev on /.layer and bound
 *              onto /home, /tmp and /workspace, as the `ns` substrate
 *              binds its layer's.
 * Every step that fails is logged to the console and ends the VM. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "guest/vm.h"
#include "log.h"

#define VM_DEV_WAIT_MS 15000
#define VM_MODULE_PASSES 4

/* guest_vm_wanted: see vm.h. */
bool guest_vm_wanted(int argc, char **argv)
{
	(void)argv;
	return getpid() == 1 && argc == 1;
}

/* vm_mount: mount(2) with a logged failure. */
static int vm_mount(const char *src, const char *dst, const char *type, unsigned long flags,
                    const char *data)
{
	if (mount(src, dst, type, flags, data) == 0)
		return 0;
	log_error("mount %s on %s (%s): %s", src, dst, type ? type : "bind", strerror(errno));
	return -1;
}

/* vm_modules: loads the listed modules in order; a module whose
 * dependencies are not in yet (ENOENT: unknown symbol) is tried again on
 * the next pass. */
static void vm_modules(void)
{
	static char list[4096];
	char *names[64];
	bool done[64] = { false };
	size_t n = 0;
	ssize_t len;
	int fd = open(GUEST_VM_MODULES_LIST, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return; /* a kernel with the drivers built in */
	len = read(fd, list, sizeof(list) - 1);
	close(fd);
	if (len <= 0)
		return;
	list[len] = '\0';
	for (char *save = NULL, *t = strtok_r(list, "\n", &save); t && n < 64;
	     t = strtok_r(NULL, "\n", &save))
		if (t[0] != '\0' && strchr(t, '/') == NULL)
			names[n++] = t;
	for (int pass = 0; pass < VM_MODULE_PASSES; pass++) {
		bool again = false;

		for (size_t i = 0; i < n; i++) {
			char path[512];
			int mfd;

			if (done[i])
				continue;
			snprintf(path, sizeof(path), "%s/%s", GUEST_VM_MODULES_DIR, names[i]);
			mfd = open(path, O_RDONLY | O_CLOEXEC);
			if (mfd < 0) {
				log_warn("module %s: %s", names[i], strerror(errno));
				done[i] = true;
				continue;
			}
			if (syscall(SYS_finit_module, mfd, "", 0) == 0 || errno == EEXIST)
				done[i] = true;
			else if (errno == ENOENT && pass + 1 < VM_MODULE_PASSES)
				again = true;
			else {
				log_warn("module %s: %s", names[i], strerror(errno));
				done[i] = true;
			}
			close(mfd);
		}
		if (!again)
			break;
	}
}

/* vm_wait_path: path appears within the bound (devtmpfs fills /dev as
 * the drivers probe). */
static int vm_wait_path(const char *path)
{
	struct timespec ts = { .tv_nsec = 10 * 1000000L };

	for (int waited = 0; waited < VM_DEV_WAIT_MS; waited += 10) {
		if (access(path, F_OK) == 0)
			return 0;
		nanosleep(&ts, NULL);
	}
	log_error("%s did not appear within %d ms", path, VM_DEV_WAIT_MS);
	return -1;
}

/* vm_port_open: the virtio-serial port named GUEST_VM_PORT_NAME. */
static int vm_port_open(void)
{
	struct timespec ts = { .tv_nsec = 10 * 1000000L };

	for (int waited = 0; waited < VM_DEV_WAIT_MS; waited += 10) {
		DIR *d = opendir("/sys/class/virtio-ports");
		struct dirent *e;

		while (d != NULL && (e = readdir(d)) != NULL) {
			char path[300], name[64] = { 0 }, dev[300];
			int fd;
			ssize_t n;

			if (e->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "/sys/class/virtio-ports/%s/name", e->d_name);
			fd = open(path, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				continue;
			n = read(fd, name, sizeof(name) - 1);
			close(fd);
			while (n > 0 && name[n - 1] == '\n')
				name[--n] = '\0';
			if (n <= 0 || strcmp(name, GUEST_VM_PORT_NAME) != 0)
				continue;
			snprintf(dev, sizeof(dev), "/dev/%s", e->d_name);
			closedir(d);
			if (vm_wait_path(dev) < 0)
				return -1;
			fd = open(dev, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
			if (fd < 0)
				log_error("open %s: %s", dev, strerror(errno));
			return fd;
		}
		if (d != NULL)
			closedir(d);
		nanosleep(&ts, NULL);
	}
	log_error("no virtio-serial port named %s", GUEST_VM_PORT_NAME);
	return -1;
}

/* vm_loopback_up: lo up (services inside the VM bind 127.0.0.1). */
static void vm_loopback_up(void)
{
	struct ifreq ifr = { 0 };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
		ifr.ifr_flags |= IFF_UP;
		(void)ioctl(fd, SIOCSIFFLAGS, &ifr);
	}
	close(fd);
}

/* vm_root: the root and the layer mounted under /newroot, the kernel's
 * filesystems moved there, then /newroot becomes / (the initramfs stays
 * below it, unreachable). */
static int vm_root(void)
{
	static const char *const subs[] = { "home", "tmp", "workspace" };
	const unsigned long ms = MS_NOSUID | MS_NODEV;

	if (vm_wait_path("/dev/vda") < 0 || vm_wait_path("/dev/vdb") < 0)
		return -1;
	if (vm_mount("/dev/vda", "/newroot", "ext4", MS_RDONLY | MS_NODEV, "") < 0 ||
	    vm_mount("/dev/vdb", "/newroot/.layer", "ext4", ms, "") < 0)
		return -1;
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
		char src[64], dst[64];

		snprintf(src, sizeof(src), "/newroot/.layer/%s", subs[i]);
		snprintf(dst, sizeof(dst), "/newroot/%s", subs[i]);
		if (mkdir(src, strcmp(subs[i], "tmp") == 0 ? 01777 : 0755) < 0 && errno != EEXIST)
			log_warn("mkdir %s: %s", src, strerror(errno));
		if (vm_mount(src, dst, NULL, MS_BIND, NULL) < 0)
			return -1;
	}
	if (vm_mount("tmpfs", "/newroot/run", "tmpfs", ms | MS_NOEXEC, "mode=755,size=16m") < 0 ||
	    vm_mount("/dev", "/newroot/dev", NULL, MS_MOVE, NULL) < 0 ||
	    vm_mount("/proc", "/newroot/proc", NULL, MS_MOVE, NULL) < 0 ||
	    vm_mount("/sys", "/newroot/sys", NULL, MS_MOVE, NULL) < 0)
		return -1;
	if (chdir("/newroot") < 0 || vm_mount(".", "/", NULL, MS_MOVE, NULL) < 0 ||
	    chroot(".") < 0 || chdir("/") < 0) {
		log_error("switching root: %s", strerror(errno));
		return -1;
	}
	(void)mkdir("/dev/pts", 0755);
	(void)mkdir("/dev/shm", 01777);
	(void)vm_mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
	               "newinstance,ptmxmode=0666,mode=0620");
	(void)vm_mount("tmpfs", "/dev/shm", "tmpfs", ms, "mode=1777,size=64m");
	(void)mkdir("/run/tether", 0755);
	return 0;
}

/* vm_probe_only: the kernel command line asks only whether we boot. */
static bool vm_probe_only(void)
{
	char line[1024];
	ssize_t n;
	int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	n = read(fd, line, sizeof(line) - 1);
	close(fd);
	if (n <= 0)
		return false;
	line[n] = '\0';
	return strstr(line, "tether.probe=1") != NULL;
}

/* guest_vm_main: see vm.h. */
int guest_vm_main(void)
{
	struct guest_ctx g = { .idle_timeout_s = GUEST_IDLE_TIMEOUT_DEFAULT_S };
	int port;

	tt_log_init("guest", TT_LOG_INFO);
	prctl(PR_SET_DUMPABLE, 0);
	if (sodium_init() < 0)
		goto fail;
	(void)vm_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
	(void)vm_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
	(void)vm_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "");
	if (vm_probe_only()) {
		/* a probe boot (microvm.c): the kernel reached our init */
		reboot(RB_POWER_OFF);
		return 0;
	}
	vm_modules();
	if (vm_root() < 0)
		goto fail;
	vm_loopback_up();
	(void)sethostname("sandbox", 7);
	g.root_fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	port = vm_port_open();
	if (g.root_fd < 0 || port < 0)
		goto fail;
	signal(SIGPIPE, SIG_IGN);
	log_info("microVM up; serving the host on port %s", GUEST_VM_PORT_NAME);
	vmchan_serve(port, &g);
fail:
	log_error("%s", "microVM init failed: powering off");
	sync();
	reboot(RB_POWER_OFF);
	return 1;
}

/* The `microvm` substrate: see microvm.h. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "fsutil.h"
#include "log.h"
#include "procid.h"
#include "substrate/microvm/microvm.h"
#include "substrate/microvm/qmp.h"
#include "unixaddr.h"

#define QEMU_BIN "/usr/bin/qemu-system-x86_64"
#define MICROVM_QMP_MS 10000
#define MICROVM_INCOMING_MS 60000
/* The fds QEMU inherits (dup2'd into place in the child). */
enum { FD_CHAN = 3, FD_QMP, FD_ROOT, FD_LAYER, FD_LAYER_RO, FD_KERNEL, FD_INITRD, FD_STATE, FD_LOG,
       FD_N };

/* now_ms: monotonic milliseconds. */
static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* microvm_init: see microvm.h. */
void microvm_init(struct microvm *vm)
{
	memset(vm, 0, sizeof(*vm));
	vm->pidfd = -1;
}

/* copy_file: src into a new dst (mode 0600), the plain way. */
static int copy_file(const char *src, const char *dst, struct tt_err *err)
{
	_cleanup_close_ int in = open(src, O_RDONLY | O_CLOEXEC);
	_cleanup_close_ int out = -1;
	char buf[65536];
	ssize_t n;

	if (in < 0)
		return tt_err_sys(err, TT_ERR_IO, "open %s", src);
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (out < 0)
		return tt_err_sys(err, TT_ERR_IO, "create %s", dst);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (fsutil_write_all(out, buf, (size_t)n) < 0)
			return tt_err_sys(err, TT_ERR_IO, "write %s", dst);
	if (n < 0 || fsync(out) < 0)
		return tt_err_sys(err, TT_ERR_IO, "copy to %s", dst);
	return 0;
}

/* vm_dirs: <dir>/vm (root-only) and vm/disk (the VM's uid), the layer in
 * it (copied from the template when there is none). */
static int vm_dirs(const struct microvm_config *cfg, struct tt_err *err)
{
	char p[PATH_MAX], tmpl[PATH_MAX];

	snprintf(p, sizeof(p), "%.4000s/" MICROVM_DIR, cfg->dir);
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", p);
	snprintf(p, sizeof(p), "%.4000s/" MICROVM_DISK_DIR, cfg->dir);
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", p);
	snprintf(p, sizeof(p), "%.4000s/" MICROVM_DISK_DIR "/" MICROVM_LAYER, cfg->dir);
	snprintf(tmpl, sizeof(tmpl), "%.4000s/layer.qcow2", cfg->assets);
	if (access(p, F_OK) < 0 && copy_file(tmpl, p, err) < 0)
		return -1;
	if (chown(p, cfg->uid, cfg->uid) < 0)
		return tt_err_sys(err, TT_ERR_IO, "chown %s", p);
	return 0;
}

/* kvm_gid: the group owning /dev/kvm (QEMU keeps it under KVM), or -1. */
static gid_t kvm_gid(void)
{
	struct stat st;

	return stat("/dev/kvm", &st) == 0 ? st.st_gid : (gid_t)-1;
}

/* qemu_argv: QEMU's command line for cfg into argv (strings in store). */
static void qemu_argv(const struct microvm_config *cfg, bool incoming, bool probe,
                      char *store, size_t cap, char **argv)
{
	uint64_t mem = cfg->memory_bytes ? cfg->memory_bytes : MICROVM_DEFAULT_MEMORY;
	unsigned cpus = cfg->cpu_millis ? (cfg->cpu_millis + 999) / 1000 : 1;
	size_t at = 0;
	int n = 0;
	const char *console = getenv("TETHER_MICROVM_CONSOLE");

#define ARG(...) do { \
		int w_ = snprintf(store + at, cap - at, __VA_ARGS__); \
		argv[n++] = store + at; \
		at += (size_t)w_ + 1; \
	} while (0)
	ARG("qemu-system-x86_64");
	ARG("-M");
	ARG("microvm,x-option-roms=off,pit=on,rtc=on%s", console ? "" : ",isa-serial=off");
	ARG("-no-user-config");
	ARG("-nodefaults");
	ARG("-display");
	ARG("none");
	ARG("-accel");
	ARG("%s", cfg->kvm ? "kvm" : "tcg");
	ARG("-m");
	ARG("%" PRIu64 "M", mem >> 20);
	ARG("-smp");
	ARG("%u", cpus);
	ARG("-kernel");
	ARG("/proc/self/fd/%d", FD_KERNEL);
	ARG("-initrd");
	ARG("/proc/self/fd/%d", FD_INITRD);
	ARG("-append");
	ARG("console=ttyS0 quiet panic=-1 tsc_early_khz=2000000%s", probe ? " tether.probe=1" : "");
	ARG("-no-reboot");
	if (console) {
		ARG("-serial");
		ARG("file:%s", console);
	}
	if (!probe) {
		ARG("-chardev");
		ARG("socket,id=ch0,fd=%d,server=on,wait=off", FD_CHAN);
		ARG("-chardev");
		ARG("socket,id=qmp,fd=%d,server=on,wait=off", FD_QMP);
		ARG("-mon");
		ARG("chardev=qmp,mode=control");
		ARG("-device");
		ARG("virtio-serial-device");
		ARG("-device");
		ARG("virtserialport,chardev=ch0,name=tether.0");
		ARG("-add-fd");
		ARG("fd=%d,set=1", FD_ROOT);
		ARG("-drive");
		ARG("id=root,file=/dev/fdset/1,format=raw,if=none,readonly=on");
		ARG("-device");
		ARG("virtio-blk-device,drive=root");
		/* QEMU opens it read-only first, then read-write: one fd of
		 * each mode in the set */
		ARG("-add-fd");
		ARG("fd=%d,set=2", FD_LAYER);
		ARG("-add-fd");
		ARG("fd=%d,set=2", FD_LAYER_RO);
		ARG("-drive");
		ARG("id=layer,file=/dev/fdset/2,format=qcow2,if=none,discard=unmap");
		ARG("-device");
		ARG("virtio-blk-device,drive=layer");
		if (incoming) {
			ARG("-incoming");
			ARG("fd:%d", FD_STATE);
		}
	}
	argv[n] = NULL;
#undef ARG
}

/* qemu_spawn: forks QEMU with fds[i] as its fd i (3..), as uid; *pid and
 * *pidfd. It stays in the host's network namespace: its chardev listener
 * was made there (by us), where sock_diag must find it; QEMU has no network
 * device and no privilege. */
static int qemu_spawn(char **argv, const int fds[FD_N], uid_t uid, bool kvm, pid_t *pid,
                      int *pidfd, struct tt_err *err)
{
	gid_t kg = kvm ? kvm_gid() : (gid_t)-1;
	pid_t p = fork();

	if (p < 0)
		return tt_err_sys(err, TT_ERR_SYS, "fork");
	if (p == 0) {
		/* async-signal-safe only from here to exec */
		int tmp[FD_N];

		setsid();
		for (int i = 3; i < FD_N; i++)
			tmp[i] = fds[i] >= 0 ? fcntl(fds[i], F_DUPFD_CLOEXEC, 64) : -1;
		for (int i = 3; i < FD_N; i++)
			if (tmp[i] >= 0 && dup2(tmp[i], i) < 0)
				_exit(126);
		if (fds[FD_LOG] >= 0) {
			dup2(FD_LOG, 1);
			dup2(FD_LOG, 2);
		}
		if (syscall(SYS_close_range, FD_N, ~0U, 0) < 0)
			_exit(126);
		if ((kg != (gid_t)-1 ? setgroups(1, &kg) : setgroups(0, NULL)) < 0 ||
		    setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
			_exit(126);
		prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
		umask(077);
		execv(QEMU_BIN, argv);
		_exit(127);
	}
	*pid = p;
	*pidfd = (int)syscall(SYS_pidfd_open, p, 0);
	if (*pidfd < 0) {
		kill(p, SIGKILL);
		waitpid(p, NULL, 0);
		return tt_err_sys(err, TT_ERR_SYS, "pidfd_open");
	}
	return 0;
}

/* close_fds: closes the parent's copies. */
static void close_fds(int fds[FD_N])
{
	for (int i = 3; i < FD_N; i++)
		if (fds[i] >= 0) {
			close(fds[i]);
			fds[i] = -1;
		}
}

/* wait_running: QMP answers, and (resumed) the incoming state is loaded
 * and the VM runs. */
static int wait_running(struct microvm *vm, bool incoming, struct tt_err *err)
{
	struct qmp q = { .fd = -1 };
	int64_t deadline = now_ms() + (incoming ? MICROVM_INCOMING_MS : MICROVM_QMP_MS);
	struct tt_err e2 = { 0 };

	while (qmp_open(&q, vm->qmp, MICROVM_QMP_MS, &e2) < 0) {
		if (procid_pidfd_alive(vm->pidfd, NULL) != 1 || now_ms() > deadline)
			return tt_err_set(err, TT_ERR_IO, "QEMU did not come up: %s", e2.msg);
		usleep(20000);
	}
	while (incoming) {
		json_t *r = NULL;
		const char *st;

		if (qmp_cmd(&q, "{\"execute\":\"query-status\"}", -1, &r, err) < 0) {
			qmp_close(&q);
			return -1;
		}
		st = json_string_value(json_object_get(r, "status"));
		if (st != NULL && strcmp(st, "running") == 0) {
			json_decref(r);
			break;
		}
		if (st != NULL && strcmp(st, "paused") == 0) {
			/* loaded: the snapshot was taken of a stopped VM, so
			 * QEMU keeps it stopped until told */
			json_decref(r);
			if (qmp_cmd(&q, "{\"execute\":\"cont\"}", -1, NULL, err) < 0) {
				qmp_close(&q);
				return -1;
			}
			continue;
		}
		if (st != NULL && strcmp(st, "inmigrate") != 0) {
			tt_err_set(err, TT_ERR_IO, "resuming the VM: status %s", st);
			json_decref(r);
			qmp_close(&q);
			return -1;
		}
		json_decref(r);
		if (now_ms() > deadline) {
			qmp_close(&q);
			return tt_err_set(err, TT_ERR_IO, "resuming the VM: not running within %d ms",
			                  MICROVM_INCOMING_MS);
		}
		usleep(20000);
	}
	qmp_close(&q);
	return 0;
}

/* open_in: an fd of dir/name opened with flags (no symlink followed for
 * the sandbox's own files). */
static int open_in(const char *dir, const char *name, int flags, struct tt_err *err)
{
	char p[PATH_MAX];
	int fd;

	snprintf(p, sizeof(p), "%.4000s/%.64s", dir, name);
	fd = open(p, flags | O_CLOEXEC, 0600);
	if (fd < 0)
		tt_err_sys(err, TT_ERR_IO, "open %s", p);
	return fd;
}

/* microvm_launch: see microvm.h. */
int microvm_launch(const struct microvm_config *cfg, struct microvm *vm, struct tt_err *err)
{
	int fds[FD_N];
	char store[8192], *argv[96], disk[PATH_MAX], state[PATH_MAX];
	bool incoming;
	int rc = -1;

	for (int i = 0; i < FD_N; i++)
		fds[i] = -1;
	microvm_init(vm);
	if (vm_dirs(cfg, err) < 0)
		return -1;
	snprintf(disk, sizeof(disk), "%.4000s/" MICROVM_DISK_DIR, cfg->dir);
	snprintf(state, sizeof(state), "%.4000s/" MICROVM_STATE, disk);
	incoming = access(state, F_OK) == 0;
	snprintf(vm->chan, sizeof(vm->chan), "%.4000s/" MICROVM_CHAN, cfg->dir);
	snprintf(vm->qmp, sizeof(vm->qmp), "%.4000s/" MICROVM_DIR "/qmp.sock", cfg->dir);
	fds[FD_CHAN] = unixaddr_bind(vm->chan, err);
	if (fds[FD_CHAN] < 0)
		goto out;
	/* the bridge connects as a uid of its own, through its held fd of
	 * this root-only directory (src/bridge/guestsock.c); the file is
	 * QEMU's, as the bridge checks (the listener owner's uid) */
	if (chmod(vm->chan, 0666) < 0 || chown(vm->chan, cfg->uid, cfg->uid) < 0 ||
	    listen(fds[FD_CHAN], 8) < 0) {
		tt_err_sys(err, TT_ERR_SYS, "listen %s", vm->chan);
		goto out;
	}
	fds[FD_QMP] = unixaddr_bind(vm->qmp, err);
	if (fds[FD_QMP] < 0 || listen(fds[FD_QMP], 4) < 0)
		goto out;
	if ((fds[FD_ROOT] = open_in(cfg->assets, "root.img", O_RDONLY, err)) < 0 ||
	    (fds[FD_LAYER] = open_in(disk, MICROVM_LAYER, O_RDWR | O_NOFOLLOW, err)) < 0 ||
	    (fds[FD_LAYER_RO] = open_in(disk, MICROVM_LAYER, O_RDONLY | O_NOFOLLOW, err)) < 0 ||
	    (fds[FD_KERNEL] = open_in(cfg->assets, "vmlinuz", O_RDONLY, err)) < 0 ||
	    (fds[FD_INITRD] = open_in(cfg->assets, "initrd.gz", O_RDONLY, err)) < 0 ||
	    (incoming &&
	     (fds[FD_STATE] = open_in(disk, MICROVM_STATE, O_RDONLY | O_NOFOLLOW, err)) < 0) ||
	    (fds[FD_LOG] = open_in(cfg->dir, MICROVM_DIR "/qemu.log",
	                           O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, err)) < 0)
		goto out;
	qemu_argv(cfg, incoming, false, store, sizeof(store), argv);
	if (qemu_spawn(argv, fds, cfg->uid, cfg->kvm, &vm->pid, &vm->pidfd, err) < 0)
		goto out;
	close_fds(fds);
	if (procid_start_time(vm->pid, &vm->start_time, err) < 0 ||
	    wait_running(vm, incoming, err) < 0) {
		struct tt_err e2 = { 0 };

		microvm_stop(vm, &e2);
		goto out;
	}
	if (incoming)
		unlink(state); /* in the VM's memory now; a relaunch boots afresh */
	vm->resumed = incoming;
	rc = 0;
out:
	close_fds(fds);
	return rc;
}

/* microvm_snapshot: see microvm.h. */
int microvm_snapshot(const struct microvm *vm, const char *dir, uid_t uid,
                     unsigned timeout_ms, struct tt_err *err)
{
	struct qmp q = { .fd = -1 };
	char state[PATH_MAX];
	_cleanup_close_ int fd = -1;
	int64_t deadline = now_ms() + timeout_ms;
	int rc = -1;

	snprintf(state, sizeof(state), "%.4000s/" MICROVM_DISK_DIR "/" MICROVM_STATE, dir);
	unlink(state);
	fd = open(state, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "create %s", state);
	if (fchown(fd, uid, uid) < 0)
		return tt_err_sys(err, TT_ERR_IO, "chown %s", state);
	if (qmp_open(&q, vm->qmp, MICROVM_QMP_MS, err) < 0)
		return -1;
	if (qmp_cmd(&q, "{\"execute\":\"stop\"}", -1, NULL, err) < 0 ||
	    qmp_cmd(&q, "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"snap\"}}", fd, NULL,
	            err) < 0 ||
	    qmp_cmd(&q, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:snap\"}}", -1, NULL,
	            err) < 0)
		goto out;
	for (;;) {
		json_t *r = NULL;
		const char *st;

		if (qmp_cmd(&q, "{\"execute\":\"query-migrate\"}", -1, &r, err) < 0)
			goto out;
		st = json_string_value(json_object_get(r, "status"));
		if (st != NULL && strcmp(st, "completed") == 0) {
			json_decref(r);
			break;
		}
		if (st != NULL && (strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0)) {
			const char *why = json_string_value(json_object_get(r, "error-desc"));

			tt_err_set(err, TT_ERR_IO, "VM snapshot %s: %.200s", st, why ? why : "?");
			json_decref(r);
			goto out;
		}
		json_decref(r);
		if (now_ms() > deadline) {
			tt_err_set(err, TT_ERR_IO, "VM snapshot: not done within %u ms", timeout_ms);
			goto out;
		}
		usleep(20000);
	}
	if (fsync(fd) < 0) {
		tt_err_sys(err, TT_ERR_IO, "fsync %s", state);
		goto out;
	}
	rc = 0;
out:
	qmp_close(&q);
	return rc;
}

/* microvm_pause: see microvm.h. */
int microvm_pause(const struct microvm *vm, unsigned timeout_ms, struct tt_err *err)
{
	struct qmp q = { .fd = -1 };
	int rc;

	if (qmp_open(&q, vm->qmp, (int)timeout_ms, err) < 0)
		return -1;
	rc = qmp_cmd(&q, "{\"execute\":\"stop\"}", -1, NULL, err);
	qmp_close(&q);
	return rc;
}

/* microvm_stop: see microvm.h. */
int microvm_stop(struct microvm *vm, struct tt_err *err)
{
	(void)err;
	if (vm->pidfd >= 0) {
		syscall(SYS_pidfd_send_signal, vm->pidfd, SIGKILL, NULL, 0);
		/* ours: reap it (an adopted QEMU is reaped by init) */
		if (waitpid(vm->pid, NULL, 0) < 0 && errno != ECHILD)
			log_warn("reaping QEMU pid %d: %s", (int)vm->pid, strerror(errno));
		close(vm->pidfd);
	}
	vm->pidfd = -1;
	vm->pid = 0;
	return 0;
}

/* microvm_assets: see microvm.h. */
int microvm_assets(const char *cache, const char *guest_bin, const char *script,
                   char *out, size_t cap, struct tt_err *err)
{
	unsigned char h[16];
	char hex[33], ready[PATH_MAX + 8], cmd[PATH_MAX * 3];
	crypto_generichash_state st;
	_cleanup_close_ int fd = open(guest_bin, O_RDONLY | O_CLOEXEC);
	uint8_t buf[65536];
	ssize_t n;
	int rc;

	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open %s", guest_bin);
	crypto_generichash_init(&st, NULL, 0, sizeof(h));
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		crypto_generichash_update(&st, buf, (size_t)n);
	crypto_generichash_final(&st, h, sizeof(h));
	sodium_bin2hex(hex, sizeof(hex), h, 8);
	if ((size_t)snprintf(out, cap, "%s/g-%s", cache, hex) >= cap)
		return tt_err_set(err, TT_ERR_INVALID, "asset path too long");
	snprintf(ready, sizeof(ready), "%.4000s/ready", out);
	if (access(ready, F_OK) == 0)
		return 0;
	if (mkdir(cache, 0755) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", cache);
	log_info("building microVM assets in %s (kernel, initramfs, base root; once)", out);
	snprintf(cmd, sizeof(cmd), "sh '%s' '%s' '%s' %u", script, out, guest_bin,
	         MICROVM_LAYER_MB);
	rc = system(cmd);
	if (rc != 0 || access(ready, F_OK) < 0)
		return tt_err_set(err, TT_ERR_IO, "building microVM assets failed (%s exit %d)",
		                  script, rc);
	return 0;
}

/* probe_one: one probe boot under kvm or TCG: powered off within bound. */
static int probe_one(const char *assets, bool kvm)
{
	struct microvm_config cfg = { .assets = assets, .kvm = kvm, .uid = 0 };
	int fds[FD_N];
	char store[4096], *argv[64];
	pid_t pid;
	int pidfd, status = -1, rc = -1;
	struct tt_err err = { 0 };
	int64_t deadline = now_ms() + MICROVM_PROBE_MS;

	for (int i = 0; i < FD_N; i++)
		fds[i] = -1;
	if ((fds[FD_KERNEL] = open_in(assets, "vmlinuz", O_RDONLY, &err)) < 0 ||
	    (fds[FD_INITRD] = open_in(assets, "initrd.gz", O_RDONLY, &err)) < 0) {
		close_fds(fds);
		return -1;
	}
	qemu_argv(&cfg, false, true, store, sizeof(store), argv);
	if (qemu_spawn(argv, fds, 65534, kvm, &pid, &pidfd, &err) < 0) {
		close_fds(fds);
		return -1;
	}
	close_fds(fds);
	while (now_ms() < deadline) {
		pid_t w = waitpid(pid, &status, WNOHANG);

		if (w == pid) {
			rc = WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
			close(pidfd);
			return rc;
		}
		usleep(50000);
	}
	syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
	waitpid(pid, NULL, 0);
	close(pidfd);
	return -1;
}

/* microvm_probe: see microvm.h. */
int microvm_probe(const char *assets, bool *kvm, struct tt_err *err)
{
	char path[PATH_MAX], v[16] = { 0 };
	int fd;
	ssize_t n;

	/* beside the kernel: one verdict per kernel, whatever the guest */
	{
		char k[PATH_MAX], real[PATH_MAX];

		snprintf(k, sizeof(k), "%.4000s/vmlinuz", assets);
		if (realpath(k, real) == NULL || strrchr(real, '/') == NULL)
			return tt_err_sys(err, TT_ERR_IO, "no kernel in %s", assets);
		*strrchr(real, '/') = '\0';
		snprintf(path, sizeof(path), "%.4000s/probe", real);
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		n = read(fd, v, sizeof(v) - 1);
		close(fd);
		if (n > 0 && (strncmp(v, "kvm", 3) == 0 || strncmp(v, "tcg", 3) == 0)) {
			*kvm = v[0] == 'k';
			return 0;
		}
	}
	if (access("/dev/kvm", R_OK | W_OK) == 0 && probe_one(assets, true) == 0)
		*kvm = true;
	else if (probe_one(assets, false) == 0)
		*kvm = false;
	else
		return tt_err_set(err, TT_ERR_IO, "no microVM boots here: neither KVM nor TCG "
		                  "powered a probe VM off within %d ms", MICROVM_PROBE_MS);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd >= 0) {
		(void)!write(fd, *kvm ? "kvm\n" : "tcg\n", 4);
		close(fd);
	}
	return 0;
}

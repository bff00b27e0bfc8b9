/* The `microvm` substrate (SPEC §9): one sandbox execution as a QEMU
 * virtual machine (machine type microvm, KVM when a probe boot succeeds,
 * else TCG), booting Debian's cloud kernel with tether-guest as the init
 * of its initramfs, the template's root read-only on one virtio block
 * device and the sandbox's writable layer (a qcow2 file) on another.
 * Host <-> guest: one virtio-serial port on a chardev unix socket that
 * QEMU listens on (src/bridge/vmchan.c, lib/mux.h).
 *
 * QEMU is spawned by the root sbx-manager and owned by it like an `ns`
 * sandbox init: it runs as the sandbox's host uid (no supplementary
 * groups but kvm's, no new privileges, no network device); every host file it uses is opened by the manager
 * and inherited (chardev and QMP listeners, the disks, the kernel, the
 * incoming state), so it needs no path on the host. Files of one VM live
 * in <sandbox_dir>/vm: chan.sock, qmp.sock, qemu.log and disk/ (the
 * layer, and vm.state while paused: what a snapshot holds).
 *
 * Limits come from QEMU's own options: -m (memory) and -smp (vCPUs:
 * the CPU cap rounded up to whole CPUs). */
#ifndef TT_MICROVM_H
#define TT_MICROVM_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

#define MICROVM_DEFAULT_MEMORY (256ull << 20)
#define MICROVM_LAYER_MB 256u
/* Below the sandbox dir. */
#define MICROVM_DIR "vm"
#define MICROVM_DISK_DIR "vm/disk"
#define MICROVM_CHAN "vm/chan.sock"
#define MICROVM_LAYER "layer.qcow2"
#define MICROVM_STATE "vm.state"
/* A probe boot (KVM, then TCG) must power off within this. */
#define MICROVM_PROBE_MS 20000

struct microvm_config {
	const char *sbx_id;
	uint64_t gen;
	uint32_t att;
	const char *dir;          /* the sandbox dir (root-only) */
	const char *assets;       /* microvm_assets' dir */
	uid_t uid;                /* QEMU's uid and gid */
	uint64_t memory_bytes;    /* 0 = MICROVM_DEFAULT_MEMORY */
	uint32_t cpu_millis;      /* 0 = one vCPU */
	bool kvm;                 /* the probe's verdict */
};

struct microvm {
	pid_t pid;                /* QEMU; 0 when not running */
	int pidfd;
	unsigned long long start_time;
	char chan[PATH_MAX];      /* the chardev socket QEMU listens on */
	char qmp[PATH_MAX];
	bool resumed;             /* started from disk/vm.state */
};

/* microvm_init: a VM record in the "not running" state. */
void microvm_init(struct microvm *vm);
/* microvm_launch: spawns QEMU for cfg; a fresh layer is copied from the
 * template unless disk/ holds one; disk/vm.state present: the VM resumes
 * from it (its processes go on) and the file goes once QEMU runs it.
 * Returns once QEMU answers on QMP (not when the guest has booted: the
 * bridge's first stream waits for that). -1: nothing left running. */
int microvm_launch(const struct microvm_config *cfg, struct microvm *vm, struct tt_err *err);
/* microvm_snapshot: the VM stopped and its memory and device state
 * written to <dir>/vm/disk/vm.state by QEMU's migration (to an fd passed
 * over QMP); the block devices are flushed and released by it, so disk/
 * is then the whole, consistent snapshot. Blocking, bounded by
 * timeout_ms; may run on any thread. */
int microvm_snapshot(const struct microvm *vm, const char *dir, uid_t uid,
                     unsigned timeout_ms, struct tt_err *err);
/* microvm_pause: the VM's vCPUs stopped (QMP stop): nothing in it runs. */
int microvm_pause(const struct microvm *vm, unsigned timeout_ms, struct tt_err *err);
/* microvm_stop: SIGKILL through the pidfd, reap (ours), close. Idempotent. */
int microvm_stop(struct microvm *vm, struct tt_err *err);
/* microvm_assets: the asset dir for guest_bin under cache (made by
 * script when missing; may take a minute on a fresh machine). */
int microvm_assets(const char *cache, const char *guest_bin, const char *script,
                   char *out, size_t cap, struct tt_err *err);
/* microvm_probe: can this host run our VMs? KVM only when a probe boot
 * under it powers off within MICROVM_PROBE_MS (a PVM /dev/kvm hangs
 * without an error), else TCG when that boots. The verdict is cached in
 * the asset dir. 0 with *kvm, or -1 (neither boots; err says why). */
int microvm_probe(const char *assets, bool *kvm, struct tt_err *err);

#endif

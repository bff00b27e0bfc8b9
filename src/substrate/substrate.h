/* The substrate interface (SPEC §9): what the sbx-manager needs of the
 * thing an execution runs in, whatever it is. Two substrates:
 *   ns       namespaces, pivot_root, seccomp, cgroups (src/substrate/ns/)
 *   microvm  a QEMU virtual machine (src/substrate/microvm/)
 * Every substrate reports the process that owns the guest transport
 * (substrate_owner), so bridge verification is the same for both: the
 * bridge pins that process and checks the listener it holds.
 *
 * Per execution: launch (the manager's exec_start picks the substrate's
 * path; the ns one keeps its spares), stop, freeze (a pause's first
 * step), snapshot (the pause's second, off the loop) and the tree a
 * snapshot packs, and the limits each applies (ns: cgroups; microvm:
 * QEMU's -m and -smp). The ns substrate's own extras (spare sandboxes,
 * layer filesystems, cgroup sweeps after a restart) stay behind ns.h and
 * are called for ns executions only. */
#ifndef TT_SUBSTRATE_H
#define TT_SUBSTRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "err.h"
#include "substrate/microvm/microvm.h"
#include "substrate/ns/ns.h"

enum substrate_kind {
	SUBSTRATE_NS = 0,
	SUBSTRATE_MICROVM = 1,
};

/* One execution's substrate state: the part of its kind is used. */
struct substrate_exec {
	enum substrate_kind kind;
	struct ns_sandbox ns;
	struct microvm vm;
};

/* The process that owns the guest transport, as the bridge must find it
 * (SPEC §5): ns: the sandbox init, listening on its unix socket; microvm:
 * QEMU, listening on the chardev socket of the VM's channel. */
struct substrate_owner {
	pid_t pid;
	int pidfd;
	unsigned long long start_time;
	const char *socket;      /* host path of the listener */
	const char *transport;   /* the bridge's --transport: "unix", "vmchan" */
};

/* substrate_parse: "ns" / "microvm" into *k; -1 for another name. */
int substrate_parse(const char *name, enum substrate_kind *k);
/* substrate_name: the name the identity carries (claims' "sst"). */
const char *substrate_name(enum substrate_kind k);
/* substrate_exec_init: a "not running" state of kind k. */
void substrate_exec_init(struct substrate_exec *s, enum substrate_kind k);
/* substrate_owner: see above; pointers into s. */
void substrate_owner(const struct substrate_exec *s, struct substrate_owner *o);
/* substrate_stop: every process of the execution ends (ns: the pid
 * namespace; microvm: QEMU); idempotent. */
int substrate_stop(struct substrate_exec *s, struct tt_err *err);
/* substrate_freeze: nothing in the execution runs any more (ns: the
 * cgroup freezer; microvm: the VM's vCPUs stopped over QMP). */
int substrate_freeze(struct substrate_exec *s, unsigned timeout_ms, struct tt_err *err);
/* substrate_snapshot_prepare: after the freeze, off the loop: whatever
 * must reach the disk before the tree is packed (ns: nothing, the layer
 * is the tree; microvm: memory and devices into vm.state). */
int substrate_snapshot_prepare(const struct substrate_exec *s, const char *dir, uid_t uid,
                               struct tt_err *err);
/* substrate_snapshot_tree: the directory a snapshot of an execution of
 * kind k in sandbox dir holds (ns: <dir>/layer; microvm: <dir>/vm/disk). */
int substrate_snapshot_tree(enum substrate_kind k, const char *dir, char *out, size_t cap);

#endif

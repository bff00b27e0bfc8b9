/* Internals of the ns substrate shared by ns.c, ns_cgroup.c and
 * ns_seccomp.c. Not for other modules: use ns.h. */
#ifndef TT_NS_INT_H
#define TT_NS_INT_H

#include <linux/filter.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "substrate/ns/ns.h"

/* ns_cgroup_create: makes the memory/pids(/cpu) cgroups named
 * tether/<name> (v1 controllers, else a v2 hierarchy with them), applies
 * the limits and records the paths in sb. Fails closed: any limit that
 * cannot be written is an error, and what was made is removed. */
int ns_cgroup_create(const char *name, uint64_t memory_max, uint32_t pids_max,
                     uint32_t cpu_millis, struct ns_sandbox *sb,
                     struct tt_err *err);
/* ns_cgroup_attach: moves pid into every cgroup recorded in sb. */
int ns_cgroup_attach(const struct ns_sandbox *sb, pid_t pid, struct tt_err *err);
/* ns_cgroup_self_fds: for v1 cgroups, opens the "tasks" file of each
 * cgroup recorded in sb (O_WRONLY, close-on-exec; owned by the caller) into
 * fds, returning how many (0 for a v2 hierarchy: use ns_cgroup_attach).
 * A new sandbox init writes "0" to each: it moves itself, a single thread,
 * which spares the kernel's global threadgroup lock that a write of its pid
 * to cgroup.procs takes (an RCU grace period: up to ~15 ms per create). */
int ns_cgroup_self_fds(const struct ns_sandbox *sb, int fds[3], struct tt_err *err);
/* ns_cgroup_rename: every cgroup of sb renamed to name (same hierarchy). */
int ns_cgroup_rename(struct ns_sandbox *sb, const char *name, struct tt_err *err);
/* ns_cgroup_remove: removes the cgroups recorded in sb (waiting briefly for
 * dying tasks to leave) and clears the paths. Idempotent. */
int ns_cgroup_remove(struct ns_sandbox *sb, struct tt_err *err);

/* The sandbox's /run/tether (ns_run.c): a tmpfs of this many bytes and
 * inodes (the guest socket needs one of each; the rest is the tenant's). */
#define NS_RUN_BYTES  (4ull << 20)
#define NS_RUN_INODES 256u
/* ns_run_mount: mounts the capped tmpfs on dir (a root-only directory of
 * ours), owned by uid, unless one is mounted there already. */
int ns_run_mount(const char *dir, uid_t uid, struct tt_err *err);
/* ns_run_umount: unmounts <sandbox_dir>/run if a tmpfs is mounted there
 * (lazily when busy). Absent is fine. */
int ns_run_umount(const char *sandbox_dir, struct tt_err *err);

/* ns_seccomp_build: compiles the sandbox filter to classic BPF in the
 * caller's memory (prog->filter is malloc'd; caller frees with
 * ns_seccomp_free), so the child only has to load it, no allocation. */
int ns_seccomp_build(struct sock_fprog *prog, struct tt_err *err);
/* ns_seccomp_free: releases a program from ns_seccomp_build. */
void ns_seccomp_free(struct sock_fprog *prog);

#endif

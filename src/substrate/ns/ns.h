/* The `ns` substrate (SPEC §9): one sandbox execution as a tree of processes
 * in fresh pid, mount, net, uts, ipc, cgroup and user namespaces, rooted in
 * a tmpfs built under <sandbox_dir>/root, with a seccomp filter, no new
 * privileges, memory/pids(/cpu) cgroup limits and a loopback-only network.
 *
 * The sandbox manager (root on the host) calls ns_sandbox_start() (or its
 * two halves, ns_sandbox_launch() + ns_sandbox_wait_ready()) and
 * ns_sandbox_stop(); all are synchronous and bounded in time. The init of
 * the sandbox is a direct child of the caller: the caller reaps it (or lets
 * ns_sandbox_stop() do it) and may poll sb->pidfd for its exit. */
#ifndef TT_NS_H
#define TT_NS_H

#include <limits.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

/* Defaults used when the corresponding ns_config field is 0. */
#define NS_DEFAULT_UID_COUNT  65536u
#define NS_DEFAULT_MEMORY_MAX (512ull << 20)
#define NS_DEFAULT_PIDS_MAX   512u
#define NS_DEFAULT_READY_MS   10000u
/* The writable layer as its own filesystem (src/substrate/ns/ns_layer.c): the
 * image's name under sandbox_dir, the default and smallest sizes, and the
 * default bytes per inode (-N = size / this, when no inode cap is given). */
#define NS_LAYER_IMG             "layer.img"
#define NS_DEFAULT_LAYER_BYTES   (1024ull << 20)
#define NS_LAYER_MIN_BYTES       (16ull << 20)
#define NS_LAYER_BYTES_PER_INODE 16384u
/* Path of the guest socket inside the sandbox and of the guest binary. */
#define NS_GUEST_SOCKET_IN "/run/tether/guest.sock"
#define NS_GUEST_BIN_IN    "/.tether/tether-guest"
/* The init always gets its readiness pipe as this descriptor. */
#define NS_READY_FD 3
/* With ns_config.secret set, the init gets a pipe holding exactly the
 * secret (then EOF) as this descriptor; the guest reads it once and closes
 * it (--secret-fd). */
#define NS_SECRET_FD 4
#define NS_SECRET_LEN 32

struct ns_config {
	const char *sbx_id;       /* [A-Za-z0-9_-], 1..64 chars: used in paths */
	uint64_t gen;
	uint32_t att;
	const char *sandbox_dir;  /* absolute host dir owned by the manager; we
	                           * create layer/{home,tmp,workspace}, run/,
	                           * root/ under it */
	const char *guest_bin;    /* host path of the static tether-guest;
	                           * bind-mounted read-only when set */
	char *const *init_argv;   /* NULL = run the guest (see ns.c); else an
	                           * argv run as PID 1 with fd 3 = ready pipe */
	uid_t uid_base;           /* host id range mapped to 0.. inside; must
	                           * be > 0 (host root is never mapped) */
	uint32_t uid_count;       /* 0 = NS_DEFAULT_UID_COUNT */
	uint64_t memory_max;      /* bytes; 0 = NS_DEFAULT_MEMORY_MAX */
	uint32_t pids_max;        /* 0 = NS_DEFAULT_PIDS_MAX */
	/* Added beyond the brief (all optional, 0 = default): */
	uint32_t cpu_millis;      /* CPU bandwidth in millicores; 0 = no limit */
	uint32_t ready_timeout_ms;/* 0 = NS_DEFAULT_READY_MS */
	int log_fd;               /* > 2: init's stdout+stderr; else /dev/null */
	/* With use_netns, the init joins netns_fd (caller's; a fresh, unused
	 * network namespace the caller made ahead of time, e.g. with
	 * ns_netns_make) instead of creating one at clone: creating a netns
	 * is the costliest part of the clone (~0.5 ms). Never shared. */
	bool use_netns;
	int netns_fd;
	/* With use_mntns, the init's mount namespace is a private copy of
	 * mntns_fd (from ns_mntns_clean; the caller's, shared by every
	 * start) instead of the caller's own, and the layer's directories
	 * reach it as detached binds made beforehand in the caller's. */
	bool use_mntns;
	int mntns_fd;
	/* Per-activation secret (NS_SECRET_LEN bytes, caller's memory) or
	 * NULL: passed to the init on NS_SECRET_FD through a pipe, never on
	 * argv, env or disk. The caller zeroes it. */
	const uint8_t *secret;
	/* The writable layer's cap: with layer_bytes > 0, <sandbox_dir>/layer
	 * is (made, if need be, and) mounted from <sandbox_dir>/layer.img, an
	 * ext4 image of layer_bytes with layer_inodes inodes (0 = one per
	 * NS_LAYER_BYTES_PER_INODE), before home/tmp/workspace are set up;
	 * an image there already keeps its size. 0 = plain directories on
	 * the host's filesystem (no cap; unit tests). The layer stays mounted
	 * after ns_sandbox_stop: the caller unmounts it (ns_layer_umount). */
	uint64_t layer_bytes;
	uint64_t layer_inodes;
	/* A formatted layer image (ns_layer_template) that a fresh layer is
	 * copied from, or NULL (mkfs with layer_bytes, layer_inodes). */
	const char *layer_template;
	/* A spare (guest only, secret NULL): the guest waits for its identity
	 * and secret (ns_sandbox_assign); until then sbx_id and gen name only
	 * the cgroups. Everything else (uid range, layer, namespaces, seccomp)
	 * is as given here. */
	bool assign_later;
};

struct ns_sandbox {
	pid_t init_pid;                   /* host pid; 0 when not running */
	int pidfd;                        /* -1 when closed */
	unsigned long long init_start_time; /* /proc/<pid>/stat field 22 */
	char guest_socket[PATH_MAX];      /* host path: <sandbox_dir>/run/guest.sock */
	char cgroup_memory[PATH_MAX];     /* v1 memory cgroup dir (v2: the one dir) */
	char cgroup_pids[PATH_MAX];       /* v1 pids cgroup dir (v2: same as memory) */
	char cgroup_cpu[PATH_MAX];        /* v1 cpu cgroup dir, "" when unused */
	int exit_status;                  /* wait status once reaped, else -1 */
	char cgroup_freezer[PATH_MAX];    /* v1 freezer dir while frozen by
	                                   * ns_sandbox_freeze, else "" */
	/* Between ns_sandbox_launch and ns_sandbox_wait_ready only (ready_open
	 * set): the init's readiness pipe and the start's deadline. */
	bool ready_open;
	int ready_fd;
	int64_t ready_deadline_ms;
	/* A spare's assignment pipe (write end) until ns_sandbox_assign, or
	 * -1. Closing it unassigned makes the guest exit, and the sandbox. */
	int assign_fd;
};

/* ns_sandbox_start: builds and starts one execution; returns 0 once the init
 * wrote "ready\n" on fd 3, or -1 with a clear error and no process, cgroup
 * or mount left behind. Must run as root on the host. */
int ns_sandbox_start(const struct ns_config *cfg, struct ns_sandbox *out,
                     struct tt_err *err);
/* ns_sandbox_launch: the first half of ns_sandbox_start: returns once the
 * init has exec'd the guest (its identity is final: pid, start time,
 * executable, ids) but maybe before it listens, so the caller can start
 * work that needs only that (the bridge) while the guest comes up. Then
 * ns_sandbox_wait_ready, or ns_sandbox_stop. -1: nothing left behind. */
int ns_sandbox_launch(const struct ns_config *cfg, struct ns_sandbox *out,
                      struct tt_err *err);
/* ns_sandbox_assign: gives a spare (launched with assign_later) its
 * execution: its cgroups renamed "<sbx_id>-g<gen>", then the guest's
 * identity and activation secret, after which it listens; the readiness
 * deadline starts now. Then ns_sandbox_wait_ready. -1: the caller stops
 * it (ns_sandbox_stop). */
int ns_sandbox_assign(struct ns_sandbox *sb, const char *sbx_id, uint64_t gen,
                      uint32_t att, const uint8_t secret[NS_SECRET_LEN],
                      struct tt_err *err);
/* ns_cgroup_find: fills sb's cgroup paths with those of "<sbx_id>-g<gen>"
 * that exist (an execution adopted or found lost after a restart), so
 * ns_sandbox_stop removes them. */
void ns_cgroup_find(const char *sbx_id, uint64_t gen, struct ns_sandbox *sb);
/* ns_cgroup_set_cpu: rewrites the CPU cap of a running sandbox (a spare
 * taken by an install that asks another cap than the one it was launched
 * with) to cpu_millis millicores. -1 when it has no cpu cgroup (launched
 * with cpu_millis 0) or the write fails. */
int ns_cgroup_set_cpu(const struct ns_sandbox *sb, uint32_t cpu_millis, struct tt_err *err);
/* ns_cgroup_kill: SIGKILLs every process in sb's pids cgroup (v2: its
 * one cgroup) until it is empty, for a sandbox whose init is not known
 * (e.g. a manager killed between starting it and recording its pid). Each
 * pid is held by a pidfd and checked to be in the cgroup before the
 * signal, so a recycled pid is never hit. 0, or -1 with err. */
int ns_cgroup_kill(const struct ns_sandbox *sb, struct tt_err *err);
/* ns_cgroup_sweep: removes empty sandbox cgroups whose name starts with
 * prefix (a dead manager's spares); busy ones stay. */
void ns_cgroup_sweep(const char *prefix);
/* ns_sandbox_wait_ready: the second half: the init's "ready\n" within the
 * launch's deadline. -1: the sandbox is stopped (nothing left behind). */
int ns_sandbox_wait_ready(struct ns_sandbox *sb, struct tt_err *err);
/* ns_sandbox_dirs_spare: makes, ahead of time, the host-side directories
 * ns_sandbox_start lays out under a sandbox_dir (all root-only 0700 and
 * empty; ns_sandbox_start sets owners and modes when it finds them), so a
 * caller can rename such a tree into place on the create path instead of
 * making them there: on this host's ext4 (no journal), allocating an inode
 * costs ~0.3 ms after much churn. The layer's home/tmp/workspace come with
 * its filesystem (ns_layer_make into the same dir), or are made at start. */
int ns_sandbox_dirs_spare(const char *dir, struct tt_err *err);
/* ---- the writable layer as a capped filesystem (ns_layer.c) ----
 * All need root; each is synchronous (mkfs runs as a child process). */
/* ns_layer_make: <dir>/layer.img (sparse, bytes long, inodes inodes; 0 =
 * one per NS_LAYER_BYTES_PER_INODE), formatted ext4 and mounted nosuid,
 * nodev on <dir>/layer (made if missing; must be empty), holding empty
 * root-only home, tmp, workspace. -1: nothing left mounted or created. */
int ns_layer_make(const char *dir, uint64_t bytes, uint64_t inodes, struct tt_err *err);
/* ns_layer_template: formats tmpl (replacing any file there) like
 * ns_layer_make's image, populated (mounted once beside it, at tmpl.mnt,
 * then unmounted). Copying it is cheaper than running mkfs per layer
 * (every copy shares its UUID and directory hash seed: harmless, each is
 * its own filesystem, and the seed only shapes a sandbox's own
 * directories). */
int ns_layer_template(const char *tmpl, uint64_t bytes, uint64_t inodes, struct tt_err *err);
/* ns_layer_make_from: ns_layer_make with a sparse copy of tmpl (from
 * ns_layer_template; its size and inodes) instead of mkfs. */
int ns_layer_make_from(const char *dir, const char *tmpl, struct tt_err *err);
/* ns_layer_ensure: <dir>/layer mounted: already, from the existing image
 * (refused while that image is still attached to a loop device), or made
 * with ns_layer_make_from(tmpl) or, tmpl NULL, ns_layer_make. */
int ns_layer_ensure(const char *dir, const char *tmpl, uint64_t bytes, uint64_t inodes,
                    struct tt_err *err);
/* ns_layer_mounted: a filesystem is mounted on <dir>/layer. */
bool ns_layer_mounted(const char *dir);
/* ns_layer_umount: unmounts <dir>/layer if mounted (lazily when busy; see
 * ns_layer.c), keeping the image; the loop device frees itself. */
int ns_layer_umount(const char *dir, struct tt_err *err);
/* ns_layer_remove: ns_layer_umount, then deletes <dir>/layer.img (the
 * empty mount point dir stays: the caller removes the tree). */
int ns_layer_remove(const char *dir, struct tt_err *err);
/* ns_mntns_clean: a mount namespace for sandboxes to start from, held by
 * the returned fd (close-on-exec, the caller's): a private copy of the
 * caller's, made now, with every layer filesystem (ext4 on a loop device
 * mounted on a ".../layer" dir) detached from it, so it pins none. The
 * caller's namespace holds one layer mount per sandbox; a start that
 * copied it would copy, privatise and detach them all (measured here: 100
 * extra mounts double the create p50). Needs root; forks a helper. */
int ns_mntns_clean(struct tt_err *err);
/* ns_tree_remove: removes the directory tree at path (absolute; no symlink
 * in its directories), of any depth, fd-relative (ns_tree.c): symlinks in
 * it are unlinked, never followed, and it never enters another filesystem
 * (a mount point left inside makes it fail: unmount first). Absent is
 * fine. 0, or -1 with err (what could be removed is gone). */
int ns_tree_remove(const char *path, struct tt_err *err);
/* ns_netns_make: a new, empty network namespace held by the returned fd
 * (close-on-exec, owned by the caller), for ns_config.netns_fd. The calling
 * thread creates it and returns to its own namespace; should that return
 * fail, -1 with *stuck set: the thread is in the new namespace and must
 * not go on. Needs root. */
int ns_netns_make(bool *stuck, struct tt_err *err);
/* ns_sandbox_stop: SIGKILL via pidfd (the whole pid namespace dies with its
 * init), reap (also through a non-blocking pidfd; an init that has not
 * exited within 5 s is reaped later, see ns_reap_pending), remove the
 * cgroups, close fds. Idempotent; a zeroed or already stopped sandbox is
 * fine. */
int ns_sandbox_stop(struct ns_sandbox *sb, struct tt_err *err);
/* ns_reap_pending: reaps the killed inits ns_sandbox_stop could not wait
 * for (never blocks); returns how many are still to be reaped. Every
 * ns_sandbox_stop calls it too. */
size_t ns_reap_pending(void);
/* ns_sandbox_freeze: stops every process of the sandbox (cgroup v1
 * freezer, SPEC §7 pause): moves the tasks of its pids cgroup (found from
 * /proc/<init>/cgroup, so adopted executions work too) into a freezer
 * cgroup, freezes it and waits, up to timeout_ms, until the kernel reports
 * FROZEN. On failure the sandbox is thawed again. */
int ns_sandbox_freeze(struct ns_sandbox *sb, unsigned timeout_ms,
                      struct tt_err *err);
/* ns_sandbox_thaw: lets a frozen sandbox run again; the freezer cgroup
 * stays until ns_sandbox_stop (which kills, thaws and removes it). */
int ns_sandbox_thaw(struct ns_sandbox *sb, struct tt_err *err);
/* ns_freezer_release: thaws and removes the freezer cgroup a pause left
 * for execution sbx_id/gen (after a manager restart, once its tasks were
 * sent SIGKILL: frozen tasks only die when thawed). Absent is fine. */
void ns_freezer_release(const char *sbx_id, uint64_t gen);
/* ns_sandbox_init: puts a sandbox record in the "not running" state (so
 * ns_sandbox_stop on it is a no-op). */
void ns_sandbox_init(struct ns_sandbox *sb);
/* proc_start_time: field 22 (starttime) of /proc/<pid>/stat, parsed after
 * the LAST ')' so a hostile comm cannot shift fields. */
int proc_start_time(pid_t pid, unsigned long long *out, struct tt_err *err);

#endif

/* The sandbox seccomp filter: default allow, EPERM for a deny list of calls
 * that reach kernel surface an agent never needs and that are the usual
 * first step of a container escape or host interference. Only the native
 * x86_64 ABI is allowed (i386 and x32 calls kill the process: they would
 * bypass a filter written in x86_64 numbers). Compiled in the manager with
 * libseccomp and exported as classic BPF, so the sandbox child only loads
 * it (no allocation after clone). socket(2) and socketpair(2) are allowed
 * only for the address families a sandbox has a use for. */
#include <errno.h>
#include <linux/netlink.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <unistd.h>

#include "cleanup.h"
#include "substrate/ns/ns_int.h"

/* Calls refused outright with EPERM, grouped by reason. */
static const char *const deny_list[] = {
	/* Filesystem topology: the sandbox root is fixed at start; remounting
	 * or re-rooting could uncover or alter what the manager hid. The new
	 * mount API is listed too, else it would bypass the mount(2) rule. */
	"mount", "umount2", "pivot_root", "chroot",
	"fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount",
	"mount_setattr",
	/* Namespaces: new user namespaces re-grant every capability and are
	 * the entry point of most kernel LPEs; setns/unshare change what the
	 * manager set up. clone with namespace flags is filtered below. */
	"unshare", "setns",
	/* Whole-machine state: reboot, kernels, modules, swap, accounting,
	 * quotas, the kernel log, the clock. */
	"reboot", "kexec_load", "kexec_file_load", "init_module",
	"finit_module", "delete_module", "swapon", "swapoff", "acct",
	"quotactl", "quotactl_fd", "syslog", "settimeofday", "clock_settime",
	"clock_adjtime", "adjtimex", "iopl", "ioperm", "lookup_dcookie",
	"vhangup", "nfsservctl", "sysfs", "_sysctl",
	/* Large kernel attack surface with no agent use: eBPF, perf,
	 * userfaultfd (a race-widening primitive), io_uring (bypasses this
	 * filter for the ops it performs), kernel keyrings (not namespaced). */
	"bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
	"io_uring_enter", "io_uring_register", "keyctl", "add_key",
	"request_key",
	/* Cross-process access: reading or writing other processes' memory.
	 * The sandbox is one tenant, but the init (guest agent) holds the
	 * execution's transport and must not be taken over. */
	"ptrace", "process_vm_readv", "process_vm_writev",
	"kcmp", "pidfd_getfd",
	/* File handles bypass path-based checks (the "shocker" escape). */
	"open_by_handle_at", "name_to_handle_at",
	/* NUMA/page moves on other processes, and obsolete calls. */
	"move_pages", "migrate_pages", "uselib", "ustat",
};

/* Namespace flags refused on clone(2); CLONE_NEWTIME (0x80) is not listed:
 * in clone(2) that bit is part of the exit signal (it only means NEWTIME
 * for clone3/unshare, both refused whole). */
static const unsigned long clone_ns_flags[] = {
	CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUTS,
	CLONE_NEWIPC, CLONE_NEWCGROUP,
};

/* personality(2) flags that weaken the process's own hardening (W^X,
 * ASLR, mapping page zero for NULL-deref exploits). The query value
 * 0xffffffff has bit 31 set; real personalities never do, so the mask
 * includes bit 31 and the query stays allowed. */
static const unsigned long bad_personality[] = {
	READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO,
};

/* Address families a sandbox may open sockets of: local, IPv4/IPv6 (its
 * own loopback-only network namespace) and netlink (ip, ss). Every other
 * family answers EAFNOSUPPORT: AF_VSOCK reaches the worker VM's host side
 * (a sandbox bound ports in the VM's vsock space), AF_PACKET, AF_BLUETOOTH,
 * AF_ALG, AF_XDP and the rest are kernel surface with no agent use. */
static const int allowed_families[] = { AF_UNIX, AF_INET, AF_INET6, AF_NETLINK };
/* Netlink protocols a sandbox may use: rtnetlink (ip) and sock_diag (ss);
 * audit, uevents, netfilter, crypto and the others answer EPROTONOSUPPORT. */
static const int allowed_netlink[] = { NETLINK_ROUTE, NETLINK_SOCK_DIAG };
/* The kernel refuses families >= this (AF_MAX) and netlink protocols >=
 * this (MAX_LINKS) itself. */
#define SC_FAMILIES 46
#define SC_NETLINK_PROTOS 32

/* sc_in: v is one of the n values of set. */
static bool sc_in(const int *set, size_t n, int v)
{
	for (size_t i = 0; i < n; i++)
		if (set[i] == v)
			return true;
	return false;
}

/* sc_rule: adds one rule; unknown names (older kernels/libseccomp) are
 * skipped, any other failure is an error (fail closed). */
static int sc_rule(scmp_filter_ctx ctx, uint32_t action, const char *name,
                   unsigned n, const struct scmp_arg_cmp *cmp, struct tt_err *err)
{
	int nr = seccomp_syscall_resolve_name(name);
	if (nr == __NR_SCMP_ERROR)
		return 0;
	int rc = seccomp_rule_add_array(ctx, action, nr, n, cmp);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_SYS, "seccomp: rule for %s: %s", name, strerror(-rc));
	return 0;
}

/* sc_socket_rules: socket(2) and socketpair(2) only for the allowed
 * families (socketpair: AF_UNIX alone, the only family with pairs we
 * allow), netlink only for the allowed protocols. The kernel reads these
 * arguments as int: each comparison looks at the low 32 bits alone
 * (masked), so high bits set by a caller cannot slip past a rule. */
static int sc_socket_rules(scmp_filter_ctx ctx, struct tt_err *err)
{
	const size_t nfam = sizeof allowed_families / sizeof allowed_families[0];
	const size_t nnl = sizeof allowed_netlink / sizeof allowed_netlink[0];

	for (int fam = 0; fam < SC_FAMILIES; fam++) {
		struct scmp_arg_cmp c = SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, (uint64_t)fam);

		if (!sc_in(allowed_families, nfam, fam) &&
		    sc_rule(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), "socket", 1, &c, err) < 0)
			return -1;
		if (fam != AF_UNIX &&
		    sc_rule(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), "socketpair", 1, &c, err) < 0)
			return -1;
	}
	for (int proto = 0; proto < SC_NETLINK_PROTOS; proto++) {
		struct scmp_arg_cmp c[2] = {
			SCMP_A0(SCMP_CMP_MASKED_EQ, 0xffffffffu, (uint64_t)AF_NETLINK),
			SCMP_A2(SCMP_CMP_MASKED_EQ, 0xffffffffu, (uint64_t)proto),
		};

		if (!sc_in(allowed_netlink, nnl, proto) &&
		    sc_rule(ctx, SCMP_ACT_ERRNO(EPROTONOSUPPORT), "socket", 2, c, err) < 0)
			return -1;
	}
	return 0;
}

/* sc_rules: adds every rule of the sandbox policy to ctx. */
static int sc_rules(scmp_filter_ctx ctx, struct tt_err *err)
{
	for (size_t i = 0; i < sizeof deny_list / sizeof deny_list[0]; i++)
		if (sc_rule(ctx, SCMP_ACT_ERRNO(EPERM), deny_list[i], 0, NULL, err) < 0)
			return -1;
	/* clone3 passes flags in memory where BPF cannot look: ENOSYS makes
	 * glibc fall back to clone(2), whose flags we can check. */
	if (sc_rule(ctx, SCMP_ACT_ERRNO(ENOSYS), "clone3", 0, NULL, err) < 0)
		return -1;
	for (size_t i = 0; i < sizeof clone_ns_flags / sizeof clone_ns_flags[0]; i++) {
		struct scmp_arg_cmp c = SCMP_A0(SCMP_CMP_MASKED_EQ, clone_ns_flags[i],
		                                clone_ns_flags[i]);
		if (sc_rule(ctx, SCMP_ACT_ERRNO(EPERM), "clone", 1, &c, err) < 0)
			return -1;
	}
	for (size_t i = 0; i < sizeof bad_personality / sizeof bad_personality[0]; i++) {
		struct scmp_arg_cmp c = SCMP_A0(SCMP_CMP_MASKED_EQ,
		                                bad_personality[i] | 0x80000000ul,
		                                bad_personality[i]);
		if (sc_rule(ctx, SCMP_ACT_ERRNO(EPERM), "personality", 1, &c, err) < 0)
			return -1;
	}
	return sc_socket_rules(ctx, err);
}

/* The compiled filter never changes: compiled once per process (on the
 * first start) and copied out afterwards, sparing libseccomp's ~0.1 ms
 * compile on every create. Guarded: starts may come from several threads. */
static pthread_mutex_t sc_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sock_filter *sc_cache;
static unsigned short sc_cache_len;

/* sc_compile: builds the filter with libseccomp (see ns_seccomp_build). */
static int sc_compile(struct sock_fprog *prog, struct tt_err *err)
{
	prog->len = 0;
	prog->filter = NULL;
	_cleanup_close_ int mfd = -1;
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
	if (!ctx)
		return tt_err_set(err, TT_ERR_NOMEM, "seccomp: init failed");
	int rc = -1;
	/* seccomp_init adds only the native arch; anything else is killed. */
	if (seccomp_arch_native() != SCMP_ARCH_X86_64) {
		tt_err_set(err, TT_ERR_SYS, "seccomp: only x86_64 is supported");
		goto out;
	}
	if (seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS) < 0 ||
	    seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0) < 0) {
		tt_err_set(err, TT_ERR_SYS, "seccomp: setting filter attributes failed");
		goto out;
	}
	if (sc_rules(ctx, err) < 0)
		goto out;
	/* Export through a memfd: libseccomp 2.5 has no export-to-memory. */
	mfd = memfd_create("tether-seccomp", MFD_CLOEXEC);
	if (mfd < 0) {
		tt_err_sys(err, TT_ERR_SYS, "seccomp: memfd_create");
		goto out;
	}
	int erc = seccomp_export_bpf(ctx, mfd);
	if (erc < 0) {
		tt_err_set(err, TT_ERR_SYS, "seccomp: export: %s", strerror(-erc));
		goto out;
	}
	off_t size = lseek(mfd, 0, SEEK_END);
	if (size <= 0 || size % (off_t)sizeof(struct sock_filter) != 0 ||
	    size / (off_t)sizeof(struct sock_filter) > BPF_MAXINSNS) {
		tt_err_set(err, TT_ERR_SYS, "seccomp: exported filter has a bad size");
		goto out;
	}
	/* Owned by prog until ns_seccomp_free. */
	struct sock_filter *insns = malloc((size_t)size);
	if (!insns) {
		tt_err_set(err, TT_ERR_NOMEM, "seccomp: out of memory");
		goto out;
	}
	if (pread(mfd, insns, (size_t)size, 0) != size) {
		free(insns);
		tt_err_sys(err, TT_ERR_IO, "seccomp: reading exported filter");
		goto out;
	}
	prog->filter = insns;
	prog->len = (unsigned short)(size / (off_t)sizeof(struct sock_filter));
	rc = 0;
out:
	seccomp_release(ctx);
	return rc;
}

/* ns_seccomp_build: a copy (owned by prog) of the compiled filter. */
int ns_seccomp_build(struct sock_fprog *prog, struct tt_err *err)
{
	int rc = 0;

	prog->len = 0;
	prog->filter = NULL;
	pthread_mutex_lock(&sc_cache_lock);
	if (sc_cache == NULL) {
		struct sock_fprog fresh;

		rc = sc_compile(&fresh, err);
		if (rc == 0) {
			sc_cache = fresh.filter; /* owned by the cache for good */
			sc_cache_len = fresh.len;
		}
	}
	if (rc == 0) {
		prog->filter = malloc(sc_cache_len * sizeof(struct sock_filter));
		if (prog->filter == NULL)
			rc = tt_err_set(err, TT_ERR_NOMEM, "seccomp: out of memory");
		else {
			memcpy(prog->filter, sc_cache, sc_cache_len * sizeof(struct sock_filter));
			prog->len = sc_cache_len;
		}
	}
	pthread_mutex_unlock(&sc_cache_lock);
	return rc;
}

void ns_seccomp_free(struct sock_fprog *prog)
{
	free(prog->filter);
	prog->filter = NULL;
	prog->len = 0;
}

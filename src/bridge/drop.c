/* The bridge drops root once it is set up (issue 13: every bridge kept
 * root and all capabilities). What it did as root, before the drop: pin
 * the manager and the sandbox init (pidfds), open the init's network
 * namespace and make the sock_diag sockets inside it (setns needs
 * CAP_SYS_ADMIN), open the guest socket's directory (under the manager's
 * root-only tree), and bind bridge.sock there. What it still does after,
 * and why each kept capability (BRIDGE_KEPT_CAPS):
 *  - CAP_SYS_PTRACE: /proc/<pid>/exe of its peers (the manager: root; the
 *    init: the sandbox's uid, not dumpable) and readlink of the init's
 *    /proc/<pid>/fd entries (the listener-owner check) need ptrace read
 *    access to processes of another uid;
 *  - CAP_DAC_READ_SEARCH: /proc/<init>/fd belongs to the sandbox's root
 *    (mode 0500), and the run dir holding guest.sock (0700, the sandbox's
 *    root) must be searched to open the socket inside it.
 * Connecting needs write permission on guest.sock: the guest makes it
 * 0666 (inside a directory no other host user can reach). Everything
 * else goes: the bounding set is cut to these two, so not even an exec
 * regains more, and no_new_privs is set. A compromised bridge keeps what
 * CAP_SYS_PTRACE gives (ptrace of other processes), which is the price of
 * checking the listener's owner from here. */
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bridge/drop.h"
#include "unixaddr.h"

/* caps_set: permitted = effective = mask, inheritable none (capset(2)). */
static int caps_set(uint64_t mask)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2] = {
		{ .effective = (uint32_t)mask, .permitted = (uint32_t)mask },
		{ .effective = (uint32_t)(mask >> 32), .permitted = (uint32_t)(mask >> 32) },
	};

	return (int)syscall(SYS_capset, &h, d);
}

/* caps_get: the effective, permitted and inheritable sets. */
static int caps_get(uint64_t *eff, uint64_t *prm, uint64_t *inh)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2] = { { 0 }, { 0 } };

	if (syscall(SYS_capget, &h, d) < 0)
		return -1;
	*eff = d[0].effective | (uint64_t)d[1].effective << 32;
	*prm = d[0].permitted | (uint64_t)d[1].permitted << 32;
	*inh = d[0].inheritable | (uint64_t)d[1].inheritable << 32;
	return 0;
}

/* bridge_drop: see drop.h. */
int bridge_drop(uid_t id, struct tt_err *err)
{
	uid_t r, e, s;
	gid_t gr, ge, gs;
	uint64_t eff, prm, inh;

	if (id == 0)
		return tt_err_set(err, TT_ERR_INVALID, "drop: refusing to run as uid 0");
	/* Privileged (CAP_SETPCAP): the bounding set cut to what we keep,
	 * while we still may; the kernel's last cap bounds the loop. */
	for (int c = 0; c <= 63; c++) {
		if (BRIDGE_KEPT_CAPS & (1ull << c))
			continue;
		if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break; /* past the kernel's last capability */
			return tt_err_sys(err, TT_ERR_SYS, "drop: bounding set, cap %d", c);
		}
	}
	/* Keep the permitted set across the uid change, to cut it below. */
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "drop: PR_SET_KEEPCAPS");
	/* Privileged (CAP_SETGID, CAP_SETUID): our own unprivileged ids. */
	if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "drop: becoming uid/gid %u", (unsigned)id);
	if (caps_set(BRIDGE_KEPT_CAPS) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "drop: capset");
	if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0 ||
	    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 ||
	    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "drop: prctl");
	/* Verify: every id is ours, root cannot be regained, the sets are
	 * exactly what we keep. */
	if (getresuid(&r, &e, &s) < 0 || getresgid(&gr, &ge, &gs) < 0 || r != id || e != id ||
	    s != id || gr != id || ge != id || gs != id)
		return tt_err_set(err, TT_ERR_SYS, "drop: ids not all %u", (unsigned)id);
	if (setuid(0) == 0)
		return tt_err_set(err, TT_ERR_SYS, "drop: setuid(0) still works");
	if (caps_get(&eff, &prm, &inh) < 0 || eff != BRIDGE_KEPT_CAPS ||
	    prm != BRIDGE_KEPT_CAPS || inh != 0)
		return tt_err_set(err, TT_ERR_SYS, "drop: capabilities not as set");
	return 0;
}

/* bridge_listen_as: see drop.h. bridge.sock's directory is the manager's
 * (root-only): only root can bind there, so the bind comes first. */
int bridge_listen_as(uv_loop_t *loop, uv_pipe_t *server, const char *path, uid_t run_as,
                     uv_connection_cb cb, struct tt_err *err)
{
	void *data = server->data;
	int fd, rc;

	uv_pipe_init(loop, server, 0);
	server->data = data;
	fd = unixaddr_bind(path, err);
	if (fd < 0)
		return -1;
	if (run_as != 0 && bridge_drop(run_as, err) < 0) {
		close(fd);
		return -1;
	}
	rc = uv_pipe_open(server, fd);
	if (rc < 0) {
		close(fd);
		return tt_err_set(err, TT_ERR_IO, "listen on %s: %s", path, uv_strerror(rc));
	}
	rc = uv_listen((uv_stream_t *)server, 64, cb);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_IO, "listen on %s: %s", path, uv_strerror(rc));
	return 0;
}

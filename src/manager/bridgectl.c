/* Starting tether-bridge processes: see bridgectl.h. The assignment's
 * format is bridge.c's: the activation secret, then the execution's
 * command-line options as NUL-terminated words, then EOF. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "fsutil.h"
#include "manager/bridgectl.h"
#include "procid.h"

extern char **environ;

/* bc_now_ms: monotonic milliseconds. */
static int64_t bc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* bridgectl_bin: tether-bridge, next to this executable (a lean binary of
 * its own: tetherd's 40-odd shared libraries would cost milliseconds). */
int bridgectl_bin(char *out, size_t cap, struct tt_err *err)
{
	return fsutil_sibling_bin("tether-bridge", out, cap, err);
}

/* bp_close: closes and forgets fd. */
static void bp_close(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* The uid every bridge we spawn drops to once set up (0: none given). */
static uid_t bc_run_as;

/* bridgectl_run_as: see bridgectl.h. */
void bridgectl_run_as(uid_t id)
{
	bc_run_as = id;
}

/* bridgectl_spawn: posix_spawn (vfork-like: no copy of our page tables)
 * of `tether-bridge --manager-pid OURS --assign-fd 3 --ready-fd 4`. The
 * bridge inherits nothing but stdio and those two pipes: not our
 * listening socket, not other executions' pidfds, not the database. Both
 * pipe ends are first moved above every fd involved, so neither dup2 can
 * clobber the other; dup2 clears close-on-exec. */
int bridgectl_spawn(const char *bin, struct bridge_proc *bp, struct tt_err *err)
{
	char mpid[16], run_as[16];
	char *argv[] = { "tether-bridge", "--manager-pid", mpid, "--assign-fd", "3",
	                 "--ready-fd", "4", NULL, NULL, NULL };
	posix_spawn_file_actions_t fa;
	int assign[2], ready[2], hi, rc;
	pid_t pid;

	*bp = (struct bridge_proc){ .pid = 0, .pidfd = -1, .assign_fd = -1, .ready_fd = -1 };
	if (access(bin, X_OK) < 0)
		return tt_err_sys(err, TT_ERR_NOT_FOUND, "bridge binary %s", bin);
	snprintf(mpid, sizeof(mpid), "%d", (int)getpid());
	if (bc_run_as != 0) {
		snprintf(run_as, sizeof(run_as), "%u", (unsigned)bc_run_as);
		argv[7] = "--run-as";
		argv[8] = run_as;
	}
	if (pipe2(assign, O_CLOEXEC) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "bridge assignment pipe");
	if (pipe2(ready, O_CLOEXEC) < 0) {
		close(assign[0]);
		close(assign[1]);
		return tt_err_sys(err, TT_ERR_SYS, "bridge readiness pipe");
	}
	hi = (assign[0] > ready[1] ? assign[0] : ready[1]) + 1;
	if (hi < 5)
		hi = 5;
	rc = posix_spawn_file_actions_init(&fa);
	if (rc == 0) {
		if (posix_spawn_file_actions_adddup2(&fa, assign[0], hi) != 0 ||
		    posix_spawn_file_actions_adddup2(&fa, ready[1], hi + 1) != 0 ||
		    posix_spawn_file_actions_adddup2(&fa, hi, 3) != 0 ||
		    posix_spawn_file_actions_adddup2(&fa, hi + 1, 4) != 0 ||
		    posix_spawn_file_actions_addclosefrom_np(&fa, 5) != 0)
			rc = ENOMEM;
		else
			rc = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
		posix_spawn_file_actions_destroy(&fa);
	}
	close(assign[0]);
	close(ready[1]);
	if (rc != 0) {
		close(assign[1]);
		close(ready[0]);
		errno = rc;
		return tt_err_sys(err, TT_ERR_SYS, "spawn bridge %s", bin);
	}
	bp->pid = pid;
	bp->assign_fd = assign[1];
	bp->ready_fd = ready[0];
	bp->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (bp->pidfd < 0) {
		tt_err_sys(err, TT_ERR_SYS, "pidfd_open bridge");
		bridgectl_discard(bp);
		return -1;
	}
	return 0;
}

/* put_word: appends "--key value" (as two NUL-terminated words) to buf. */
static int put_word(char *buf, size_t cap, size_t *len, const char *key, const char *val)
{
	size_t kl = strlen(key) + 1, vl = strlen(val) + 1;

	if (*len + kl + vl > cap)
		return -1;
	memcpy(buf + *len, key, kl);
	memcpy(buf + *len + kl, val, vl);
	*len += kl + vl;
	return 0;
}

/* bridgectl_assign: the whole assignment in one write to an empty pipe
 * (at most BRIDGECTL_ASSIGN_MAX bytes, within the pipe's buffer: never
 * blocks, never short), then EOF. A bridge that died waiting shows as
 * EPIPE (SIGPIPE is ignored by the manager). */
int bridgectl_assign(struct bridge_proc *bp, const struct bridge_assignment *a,
                     struct tt_err *err)
{
	char buf[BRIDGECTL_ASSIGN_MAX];
	char gen[24], att[16], ipid[16], istart[24];
	size_t len = NS_SECRET_LEN;
	ssize_t n;
	int rc = 0;

	if (bp->assign_fd < 0)
		return tt_err_set(err, TT_ERR_INVALID, "bridge pid %d already assigned",
		                  (int)bp->pid);
	snprintf(gen, sizeof(gen), "%" PRIu64, a->gen);
	snprintf(att, sizeof(att), "%" PRIu32, a->att);
	snprintf(ipid, sizeof(ipid), "%d", (int)a->init_pid);
	snprintf(istart, sizeof(istart), "%llu", a->init_start);
	memcpy(buf, a->secret, NS_SECRET_LEN);
	if (put_word(buf, sizeof(buf), &len, "--sbx", a->sbx) < 0 ||
	    put_word(buf, sizeof(buf), &len, "--gen", gen) < 0 ||
	    put_word(buf, sizeof(buf), &len, "--att", att) < 0 ||
	    put_word(buf, sizeof(buf), &len, "--listen", a->listen_path) < 0 ||
	    put_word(buf, sizeof(buf), &len, "--guest-socket", a->guest_socket) < 0 ||
	    put_word(buf, sizeof(buf), &len, "--init-pid", ipid) < 0 ||
	    put_word(buf, sizeof(buf), &len, "--init-start", istart) < 0 ||
	    (a->transport != NULL &&
	     put_word(buf, sizeof(buf), &len, "--transport", a->transport) < 0))
		rc = tt_err_set(err, TT_ERR_INVALID, "bridge assignment too long");
	else if ((n = write(bp->assign_fd, buf, len)) != (ssize_t)len)
		rc = n < 0 ? tt_err_sys(err, TT_ERR_TRANSPORT, "assigning bridge pid %d",
		                        (int)bp->pid)
		           : tt_err_set(err, TT_ERR_TRANSPORT, "short assignment to bridge "
		                        "pid %d", (int)bp->pid);
	sodium_memzero(buf, sizeof(buf));
	bp_close(&bp->assign_fd);
	return rc;
}

/* bridgectl_wait_ready: "ready\n" on the readiness pipe, or a clear error
 * when the bridge exits first (its pidfd) or misses the deadline. Blocks
 * only until the line arrives (the bridge writes it right after listen). */
int bridgectl_wait_ready(struct bridge_proc *bp, int timeout_ms, struct tt_err *err)
{
	int64_t deadline = bc_now_ms() + timeout_ms;
	char buf[8];
	size_t got = 0;
	int rc = -1;

	while (got < 6 && memchr(buf, '\n', got) == NULL) {
		struct pollfd pf[2] = { { .fd = bp->ready_fd, .events = POLLIN },
		                        { .fd = bp->pidfd, .events = POLLIN } };
		int64_t left = deadline - bc_now_ms();
		ssize_t n;
		int r;

		if (left <= 0) {
			tt_err_set(err, TT_ERR_TRANSPORT, "bridge not ready within %d ms",
			           timeout_ms);
			goto out;
		}
		r = poll(pf, 2, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			tt_err_sys(err, TT_ERR_SYS, "poll bridge readiness");
			goto out;
		}
		if (r == 0)
			continue;
		/* The line first: a bridge that said ready and then died is
		 * the exit watcher's business, not a start failure. */
		if (pf[0].revents == 0) {
			tt_err_set(err, TT_ERR_TRANSPORT, "bridge exited at start (see its log)");
			goto out;
		}
		n = read(bp->ready_fd, buf + got, 6 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n < 0)
				tt_err_sys(err, TT_ERR_IO, "reading bridge readiness");
			else
				tt_err_set(err, TT_ERR_TRANSPORT, "bridge exited at start "
				           "(see its log)");
			goto out;
		}
		got += (size_t)n;
	}
	if (got != 6 || memcmp(buf, "ready\n", 6) != 0)
		tt_err_set(err, TT_ERR_TRANSPORT, "bridge sent a bad readiness line");
	else
		rc = 0;
out:
	bp_close(&bp->ready_fd);
	return rc;
}

/* bridgectl_alive: a pidfd polls readable once its process exited. */
bool bridgectl_alive(const struct bridge_proc *bp)
{
	struct pollfd pf = { .fd = bp->pidfd, .events = POLLIN };

	return bp->pid > 0 && bp->pidfd >= 0 && poll(&pf, 1, 0) == 0;
}

/* bridgectl_runs: /proc/<pid>/exe is bin's file (dev + inode): our
 * unreaped child, so the pid cannot name another process. */
bool bridgectl_runs(const struct bridge_proc *bp, const char *bin)
{
	return procid_runs_file(bp->pid, bin);
}

/* bridgectl_discard: SIGKILL (through the pidfd: no pid-reuse race) and
 * reap; the bridge never served anything, so there is nothing to drain. */
void bridgectl_discard(struct bridge_proc *bp)
{
	if (bp->pid > 0) {
		if (bp->pidfd >= 0)
			syscall(SYS_pidfd_send_signal, bp->pidfd, SIGKILL, NULL, 0);
		else
			kill(bp->pid, SIGKILL); /* our unreaped child: the pid is ours */
		while (waitpid(bp->pid, NULL, 0) < 0 && errno == EINTR)
			;
	}
	bp_close(&bp->assign_fd);
	bp_close(&bp->ready_fd);
	bp_close(&bp->pidfd);
	bp->pid = 0;
}

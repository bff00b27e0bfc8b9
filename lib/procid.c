/* Process identity evidence (see procid.h, SPEC §5). */
#include "procid.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cleanup.h"
#include "refusal.h"

/* /proc/<pid>/stat is well under 1 KiB (comm is at most 16 bytes). */
#define STAT_MAX 2048
/* Uid:/Gid: are near the top of /proc/<pid>/status; the rest (a Groups:
 * line can be long) is not needed, so only this much is read. */
#define STATUS_HEAD 4096
#define FDINFO_MAX 4096

/* The PIDFD_GET_INFO ioctl (Linux 6.13+; Debian 12's headers lack it):
 * pid and credentials of a pidfd's own process, from the kernel, instead of
 * rendering /proc/self/fdinfo and /proc/<pid>/status texts (those reads
 * were the largest cost of verify_peer). Layout of struct pidfd_info v0. */
struct procid_pidfd_info {
	uint64_t mask;
	uint64_t cgroupid;
	uint32_t pid, tgid, ppid;
	uint32_t ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
	int32_t exit_code;
	uint32_t coredump_mask;
	uint32_t spare1;
};
#define PROCID_PIDFD_GET_INFO _IOWR(0xFF, 11, struct procid_pidfd_info)
#define PROCID_INFO_PID 1u
#define PROCID_INFO_CREDS 2u

/* pidfd_info_get: 1 with pid and creds (uids/gids mapped into our user
 * namespace, as /proc shows them), -1 when the kernel says the process is
 * gone or not in our pid namespace (ESRCH), 0 when the ioctl is not
 * available (callers then read /proc). */
static int pidfd_info_get(int pidfd, struct procid_pidfd_info *info)
{
	const uint64_t want = PROCID_INFO_PID | PROCID_INFO_CREDS;

	memset(info, 0, sizeof(*info));
	info->mask = want;
	if (ioctl(pidfd, PROCID_PIDFD_GET_INFO, info) == 0)
		return (info->mask & want) == want ? 1 : 0;
	return errno == ESRCH ? -1 : 0;
}

/* read_head: reads at most cap bytes of path into buf; *len gets the count
 * and *truncated whether the file had more. NOT_FOUND for a gone process. */
static int read_head(const char *path, char *buf, size_t cap, size_t *len,
                     bool *truncated, struct tt_err *err)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	size_t got = 0;

	if (fd < 0)
		return tt_err_sys(err, errno == ENOENT || errno == ESRCH ?
		                  TT_ERR_NOT_FOUND : TT_ERR_IO, "open %s", path);
	while (got < cap) {
		ssize_t r = read(fd, buf + got, cap - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return tt_err_sys(err, errno == ESRCH ? TT_ERR_NOT_FOUND :
			                  TT_ERR_IO, "read %s", path);
		if (r == 0)
			break;
		got += (size_t)r;
	}
	*len = got;
	if (truncated != NULL) {
		char extra;

		*truncated = got == cap && read(fd, &extra, 1) == 1;
	}
	return 0;
}

/* parse_ull_token: decimal digits at [p, end) up to a space, newline or the
 * end; overflow-checked. */
static int parse_ull_token(const char *p, const char *end,
                           unsigned long long *out)
{
	unsigned long long v = 0;
	const char *start = p;

	for (; p < end && *p >= '0' && *p <= '9'; p++) {
		unsigned d = (unsigned)(*p - '0');

		if (v > (~0ULL - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	if (p == start || (p < end && *p != ' ' && *p != '\n'))
		return -1;
	*out = v;
	return 0;
}

/* proc_stat_parse_start_time: field 22 after the last ')', bounded by len. */
int proc_stat_parse_start_time(const char *buf, size_t len,
                               unsigned long long *out, struct tt_err *err)
{
	const char *end, *p;

	if (buf == NULL || out == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "proc stat: no buffer");
	end = buf + len;
	/* comm (field 2) may hold ')' and spaces, the later fields never do:
	 * counting starts after the last ')'. */
	p = memrchr(buf, ')', len);
	if (p == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "proc stat: no ')'");
	p++;
	/* The first field after ')' is 3 (state); skip fields 3..21. */
	for (int field = 3; field < 22; field++) {
		if (p >= end || *p != ' ')
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "proc stat: too few fields");
		p++;
		while (p < end && *p != ' ' && *p != '\n')
			p++;
	}
	if (p >= end || *p != ' ')
		return tt_err_set(err, TT_ERR_MALFORMED, "proc stat: too few fields");
	p++;
	if (parse_ull_token(p, end, out) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "proc stat: bad start time");
	return 0;
}

/* procid_start_time: reads and parses /proc/<pid>/stat. */
int procid_start_time(pid_t pid, unsigned long long *out, struct tt_err *err)
{
	char path[64], buf[STAT_MAX];
	size_t len = 0;
	bool trunc = false;

	if (pid <= 0)
		return tt_err_set(err, TT_ERR_INVALID, "bad pid %d", (int)pid);
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (read_head(path, buf, sizeof(buf), &len, &trunc, err) < 0)
		return -1;
	if (trunc)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "%s over %d bytes", path,
		                  STAT_MAX);
	if (proc_stat_parse_start_time(buf, len, out, err) < 0)
		return -1;
	return 0;
}

/* find_line: the value after "key" at the start of a line in buf[0..len),
 * copied NUL-terminated into val (cap bytes); -1 if absent. */
static int find_line(const char *buf, size_t len, const char *key, char *val,
                     size_t cap)
{
	size_t klen = strlen(key);

	for (size_t i = 0; i + klen <= len; i++) {
		if ((i == 0 || buf[i - 1] == '\n') && memcmp(buf + i, key, klen) == 0) {
			size_t j = i + klen, n = 0;

			while (j < len && buf[j] != '\n' && n + 1 < cap)
				val[n++] = buf[j++];
			val[n] = '\0';
			return 0;
		}
	}
	return -1;
}

/* read_status_ids: effective uid and gid from /proc/<pid>/status. */
static int read_status_ids(pid_t pid, uid_t *uid, gid_t *gid, struct tt_err *err)
{
	char path[64], buf[STATUS_HEAD], line[128];
	unsigned long r, e;
	size_t len = 0;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (read_head(path, buf, sizeof(buf), &len, NULL, err) < 0)
		return -1;
	if (find_line(buf, len, "Uid:", line, sizeof(line)) < 0 ||
	    sscanf(line, "%lu %lu", &r, &e) != 2)
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: no Uid line", path);
	*uid = (uid_t)e;
	if (find_line(buf, len, "Gid:", line, sizeof(line)) < 0 ||
	    sscanf(line, "%lu %lu", &r, &e) != 2)
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: no Gid line", path);
	*gid = (gid_t)e;
	return 0;
}

/* identity_read_exe: pid, start time and executable of pid into out (the
 * part both readers share; the ids are theirs to fill). */
static int identity_read_exe(pid_t pid, struct proc_identity *out, struct tt_err *err)
{
	char path[64];
	struct stat st;

	if (pid <= 0 || out == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "bad pid %d", (int)pid);
	memset(out, 0, sizeof(*out));
	out->pid = pid;
	if (procid_start_time(pid, &out->start_time, err) < 0)
		return -1;
	/* stat() follows the magic link to the mapped executable itself, even
	 * across mount namespaces (needs ptrace-read access: root here). */
	snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
	if (stat(path, &st) < 0)
		return tt_err_sys(err, errno == ENOENT || errno == ESRCH ?
		                  TT_ERR_NOT_FOUND : TT_ERR_IO, "stat %s", path);
	out->exe_dev = st.st_dev;
	out->exe_ino = st.st_ino;
	return 0;
}

/* proc_identity_read: start time, executable and effective ids of pid. */
int proc_identity_read(pid_t pid, struct proc_identity *out, struct tt_err *err)
{
	if (identity_read_exe(pid, out, err) < 0)
		return -1;
	return read_status_ids(pid, &out->uid, &out->gid, err);
}

/* identity_read_pidfd: proc_identity_read, the effective ids taken from
 * pidfd (which refers to the process expected at pid) when the kernel
 * offers PIDFD_GET_INFO, else from /proc/<pid>/status as before. */
static int identity_read_pidfd(pid_t pid, int pidfd, struct proc_identity *out,
                               struct tt_err *err)
{
	struct procid_pidfd_info info;
	int got;

	if (identity_read_exe(pid, out, err) < 0)
		return -1;
	got = pidfd_info_get(pidfd, &info);
	if (got < 0)
		return tt_err_set(err, TT_ERR_NOT_FOUND, "pid %d exited", (int)pid);
	if (got == 0)
		return read_status_ids(pid, &out->uid, &out->gid, err);
	out->uid = (uid_t)info.euid;
	out->gid = (gid_t)info.egid;
	return 0;
}

/* proc_identity_equal: no field differs. */
bool proc_identity_equal(const struct proc_identity *a,
                         const struct proc_identity *b)
{
	return proc_identity_diff(a, b) == NULL;
}

/* proc_identity_diff: first differing field name, most telling first. */
const char *proc_identity_diff(const struct proc_identity *expected,
                               const struct proc_identity *got)
{
	if (expected->pid != got->pid)
		return "pid";
	if (expected->start_time != got->start_time)
		return "start_time";
	if (expected->exe_dev != got->exe_dev || expected->exe_ino != got->exe_ino)
		return "exe";
	if (expected->uid != got->uid)
		return "uid";
	if (expected->gid != got->gid)
		return "gid";
	return NULL;
}

/* procid_verify_reason: human reason for a differing field. */
const char *procid_verify_reason(const char *field)
{
	if (field == NULL)
		return "identity matches";
	if (strcmp(field, "pid") == 0)
		return "peer pid differs";
	if (strcmp(field, "start_time") == 0)
		return "pid reused: start time differs";
	if (strcmp(field, "exe") == 0)
		return "executable differs";
	if (strcmp(field, "uid") == 0)
		return "uid differs";
	if (strcmp(field, "gid") == 0)
		return "gid differs";
	return "identity differs";
}

/* procid_verify_detail: the refusal reason for a differing field. */
int procid_verify_detail(const char *field)
{
	if (field != NULL && strcmp(field, "start_time") == 0)
		return REFUSAL_PID_REUSED;
	if (field != NULL && strcmp(field, "exe") == 0)
		return REFUSAL_EXE_CHANGED;
	if (field != NULL && (strcmp(field, "uid") == 0 || strcmp(field, "gid") == 0))
		return REFUSAL_UID;
	return REFUSAL_WRONG_PEER;
}

/* procid_pidfd_alive: 1 while the pidfd's process has not exited. */
int procid_pidfd_alive(int pidfd, struct tt_err *err)
{
	/* A pidfd polls readable once its process has exited (zombie or
	 * reaped); a live one never does. */
	struct pollfd pf = { .fd = pidfd, .events = POLLIN };
	int r;

	do
		r = poll(&pf, 1, 0);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return tt_err_sys(err, TT_ERR_SYS, "poll pidfd");
	return r == 0 ? 1 : 0;
}

/* pidfd_pid: the pid (in our pid namespace) of pidfd's process from
 * /proc/self/fdinfo "Pid:"; -1 or 0 means exited or not visible. */
static int pidfd_pid(int pidfd, pid_t *out, struct tt_err *err)
{
	char path[64], buf[FDINFO_MAX], line[32];
	struct procid_pidfd_info info;
	size_t len = 0;
	long v;

	/* The same answer without rendering fdinfo, where the kernel has it:
	 * ESRCH (exited, or not in our pid namespace) is fdinfo's -1 / 0. */
	switch (pidfd_info_get(pidfd, &info)) {
	case 1:
		*out = (pid_t)info.pid;
		return 0;
	case -1:
		*out = -1;
		return 0;
	default:
		break;
	}
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
	if (read_head(path, buf, sizeof(buf), &len, NULL, err) < 0)
		return -1;
	if (find_line(buf, len, "Pid:", line, sizeof(line)) < 0 ||
	    sscanf(line, "%ld", &v) != 1)
		return tt_err_set(err, TT_ERR_MALFORMED, "%s: no Pid line", path);
	*out = (pid_t)v;
	return 0;
}

/* pin_checked: reads the identity of pid, given a pidfd already referring to
 * the process that should hold pid, and closes the pid-reuse race:
 *  1. pidfd (opened before) pins one process P;
 *  2. /proc/<pid> is read (start time, exe; ids from the pidfd itself
 *     where the kernel has PIDFD_GET_INFO, else /proc/<pid>/status);
 *  3. P is alive afterwards, so pid still named P during step 2 (a pid is
 *     only freed once its process is reaped), so the reads were of P;
 *  4. the start time is re-read and must be unchanged (belt and braces
 *     against a bug in the reasoning above: it costs one small read). */
static int pin_checked(pid_t pid, int pidfd, struct proc_identity *out,
                       struct tt_err *err)
{
	unsigned long long again = 0;
	int alive;

	if (identity_read_pidfd(pid, pidfd, out, err) < 0) {
		if (err != NULL && err->code == TT_ERR_NOT_FOUND)
			return tt_err_verify(err, REFUSAL_PEER_EXITED, "peer exited (pid %d)",
			                  (int)pid);
		return -1;
	}
	alive = procid_pidfd_alive(pidfd, err);
	if (alive < 0)
		return -1;
	if (alive == 0)
		return tt_err_verify(err, REFUSAL_PEER_EXITED, "peer exited (pid %d)", (int)pid);
	if (procid_start_time(pid, &again, err) < 0)
		return tt_err_verify(err, REFUSAL_PEER_EXITED, "peer exited (pid %d)", (int)pid);
	if (again != out->start_time)
		return tt_err_verify(err, REFUSAL_PID_REUSED,
		                  "pid reused: start time changed during check (pid %d)",
		                  (int)pid);
	return 0;
}

/* sys_pidfd_open: pidfd_open(2) without needing glibc >= 2.36. */
static int sys_pidfd_open(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* procid_pin: pidfd_open + identity read + liveness recheck. */
int procid_pin(pid_t pid, struct proc_identity *out, int *out_pidfd,
               struct tt_err *err)
{
	_cleanup_close_ int pidfd = -1;

	if (pid <= 0 || out == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "bad pid %d", (int)pid);
	pidfd = sys_pidfd_open(pid);
	if (pidfd < 0)
		return tt_err_sys(err, errno == ESRCH ? TT_ERR_NOT_FOUND : TT_ERR_SYS,
		                  "pidfd_open %d", (int)pid);
	if (pin_checked(pid, pidfd, out, err) < 0)
		return -1;
	if (out_pidfd != NULL)
		*out_pidfd = tt_steal_fd(&pidfd);
	return 0;
}

/* peer_pidfd: a pidfd for the peer of fd whose pid is cr_pid. With
 * SO_PEERPIDFD the kernel hands the pidfd of the exact peer (it keeps a
 * reference to the peer's struct pid since connect); we still compare its
 * pid with SO_PEERCRED's. Without it (ENOPROTOOPT, kernels < 6.5) we fall
 * back to pidfd_open(cr_pid), which is racy: the peer may have exited and
 * its pid been given to another process between connect and pidfd_open, so
 * the pidfd may pin an impostor. pin_checked() then reads that impostor's
 * start time, which differs from the expected one, so verify_peer refuses:
 * the start time is what ties the pid number to the expected process. */
static int peer_pidfd(int fd, pid_t cr_pid, bool *exact, struct tt_err *err)
{
	int pidfd = -1;
	socklen_t len = sizeof(pidfd);
	pid_t fdpid = 0;

	*exact = false;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0) {
		_cleanup_close_ int owned = pidfd;

		*exact = true;
		if (pidfd_pid(owned, &fdpid, err) < 0)
			return -1;
		if (fdpid <= 0)
			return tt_err_verify(err, REFUSAL_PEER_EXITED, "peer exited (pid %d)",
			                  (int)cr_pid);
		if (fdpid != cr_pid)
			return tt_err_verify(err, REFUSAL_WRONG_PEER,
			                  "peer pidfd names pid %d, SO_PEERCRED %d",
			                  (int)fdpid, (int)cr_pid);
		return tt_steal_fd(&owned);
	}
	if (errno == ESRCH)
		return tt_err_verify(err, REFUSAL_PEER_EXITED, "peer exited (pid %d)", (int)cr_pid);
	if (errno != ENOPROTOOPT && errno != EINVAL)
		return tt_err_sys(err, TT_ERR_SYS, "SO_PEERPIDFD");
	pidfd = sys_pidfd_open(cr_pid);
	if (pidfd < 0 && errno == ESRCH)
		return tt_err_verify(err, REFUSAL_PEER_EXITED, "peer exited (pid %d)", (int)cr_pid);
	if (pidfd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "pidfd_open %d", (int)cr_pid);
	return pidfd;
}

/* peer_identity: SO_PEERCRED + pidfd + /proc identity of fd's peer. */
int peer_identity(int fd, struct proc_identity *out, int *out_pidfd,
                  bool *used_peerpidfd, struct tt_err *err)
{
	_cleanup_close_ int pidfd = -1;
	struct ucred cr;
	socklen_t len = sizeof(cr);
	bool exact = false;

	if (out == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "peer_identity: no output");
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "SO_PEERCRED");
	/* pid 0: the peer lives in a pid namespace we cannot see into. */
	if (cr.pid <= 0)
		return tt_err_verify(err, REFUSAL_WRONG_PEER, "peer pid not visible");
	pidfd = peer_pidfd(fd, cr.pid, &exact, err);
	if (pidfd < 0)
		return -1;
	if (pin_checked(cr.pid, pidfd, out, err) < 0)
		return -1;
	/* The credentials that count are those the peer connected (or
	 * listened) with, not whatever it switched to later. */
	out->uid = cr.uid;
	out->gid = cr.gid;
	if (used_peerpidfd != NULL)
		*used_peerpidfd = exact;
	if (out_pidfd != NULL)
		*out_pidfd = tt_steal_fd(&pidfd);
	return 0;
}

/* verify_peer_pidfd: peer_identity compared field by field with expected. */
int verify_peer_pidfd(int fd, const struct proc_identity *expected,
                      int *out_pidfd, struct tt_err *err)
{
	_cleanup_close_ int pidfd = -1;
	struct proc_identity got;
	const char *field;
	int alive;

	if (expected == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "verify_peer: no expectation");
	if (peer_identity(fd, &got, &pidfd, NULL, err) < 0)
		return -1;
	field = proc_identity_diff(expected, &got);
	if (field != NULL && strcmp(field, "pid") == 0)
		return tt_err_verify(err, REFUSAL_WRONG_PEER, "peer pid differs (pid %d, want %d)",
		                  (int)got.pid, (int)expected->pid);
	if (field != NULL && strcmp(field, "start_time") == 0)
		return tt_err_verify(err, REFUSAL_PID_REUSED,
		                  "pid reused: start time differs (pid %d: %llu, want %llu)",
		                  (int)got.pid, got.start_time, expected->start_time);
	if (field != NULL && (strcmp(field, "uid") == 0 || strcmp(field, "gid") == 0))
		return tt_err_verify(err, REFUSAL_UID, "%s (pid %d: %u:%u, want %u:%u)",
		                  procid_verify_reason(field), (int)got.pid,
		                  (unsigned)got.uid, (unsigned)got.gid,
		                  (unsigned)expected->uid, (unsigned)expected->gid);
	if (field != NULL)
		return tt_err_verify(err, procid_verify_detail(field), "%s (pid %d)",
		                  procid_verify_reason(field), (int)got.pid);
	/* Last look: still the same live process after the comparison. */
	alive = procid_pidfd_alive(pidfd, err);
	if (alive < 0)
		return -1;
	if (alive == 0)
		return tt_err_verify(err, REFUSAL_PEER_EXITED, "peer exited (pid %d)", (int)got.pid);
	if (out_pidfd != NULL)
		*out_pidfd = tt_steal_fd(&pidfd);
	return 0;
}

/* verify_peer: verify_peer_pidfd without keeping the pidfd. */
int verify_peer(int fd, const struct proc_identity *expected, struct tt_err *err)
{
	return verify_peer_pidfd(fd, expected, NULL, err);
}

/* procid_runs_file: see procid.h. */
bool procid_runs_file(pid_t pid, const char *path)
{
	char exe[64];
	struct stat sp, se;

	snprintf(exe, sizeof(exe), "/proc/%d/exe", (int)pid);
	return pid > 0 && stat(path, &sp) == 0 && stat(exe, &se) == 0 &&
	       sp.st_dev == se.st_dev && sp.st_ino == se.st_ino;
}

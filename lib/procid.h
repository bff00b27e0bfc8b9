/* Process identity evidence for bridge verification (SPEC §5): a pid alone
 * names nothing durable (pids are reused), so a process is identified by
 * pid + start time (/proc/<pid>/stat field 22) + executable (dev, inode of
 * /proc/<pid>/exe) + effective uid/gid. Peers of unix sockets are checked
 * with SO_PEERCRED and a pidfd (SO_PEERPIDFD where the kernel has it).
 * Everything reads the caller's /proc, so pids are those of the caller's
 * pid namespace. */
#ifndef TT_PROCID_H
#define TT_PROCID_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "err.h"

/* SO_PEERPIDFD: Linux 6.5+, value 77; Debian 12's headers lack it. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

struct proc_identity {
	pid_t pid;
	uid_t uid;                     /* effective uid (SO_PEERCRED's uid) */
	gid_t gid;                     /* effective gid */
	unsigned long long start_time; /* /proc/<pid>/stat field 22, clock ticks */
	dev_t exe_dev;                 /* stat("/proc/<pid>/exe") */
	ino_t exe_ino;
};

/* proc_stat_parse_start_time: field 22 of a /proc/<pid>/stat text of len
 * bytes (not necessarily NUL-terminated). Fields are counted after the LAST
 * ')' since comm may hold spaces and parentheses. 0 or -1 (MALFORMED). */
int proc_stat_parse_start_time(const char *buf, size_t len,
                               unsigned long long *out, struct tt_err *err);

/* procid_start_time: start time of pid from /proc/<pid>/stat; -1 with
 * NOT_FOUND when the process is gone. */
int procid_start_time(pid_t pid, unsigned long long *out, struct tt_err *err);

/* proc_identity_read: the identity of pid now (stat, exe, status). -1 with
 * NOT_FOUND when the process is gone. Racy on its own against pid reuse:
 * callers pin the process with a pidfd and recheck (see peer_identity). */
int proc_identity_read(pid_t pid, struct proc_identity *out, struct tt_err *err);

/* proc_identity_equal: all fields equal. */
bool proc_identity_equal(const struct proc_identity *a,
                         const struct proc_identity *b);

/* proc_identity_diff: the first differing field of expected vs got, in the
 * order "pid", "start_time", "exe", "uid", "gid"; NULL when equal. */
const char *proc_identity_diff(const struct proc_identity *expected,
                               const struct proc_identity *got);

/* procid_pidfd_alive: 1 if the pidfd's process has not exited (a zombie
 * counts as exited), 0 if it has, -1 on error. */
int procid_pidfd_alive(int pidfd, struct tt_err *err);
/* procid_runs_file: pid's executable is the file at path as it is now
 * (same dev and inode): false once path was replaced (an upgrade), or
 * when either cannot be read. */
bool procid_runs_file(pid_t pid, const char *path);

/* procid_pin: opens a pidfd for pid, reads its identity and rechecks that
 * the pidfd's process is alive and its start time unchanged, so *out is the
 * identity of the process the pidfd refers to. *out_pidfd (owned by the
 * caller) may be NULL. -1: NOT_FOUND / VERIFY ("exited") or other. */
int procid_pin(pid_t pid, struct proc_identity *out, int *out_pidfd,
               struct tt_err *err);

/* peer_identity: the identity of the peer of unix socket fd: SO_PEERCRED
 * pid/uid/gid, then a pidfd (SO_PEERPIDFD, else pidfd_open), /proc start
 * time and exe, and the pid-recheck. *out_pidfd (owned by the caller, may
 * be NULL) refers to the peer. *used_peerpidfd (may be NULL) tells whether
 * the kernel handed the exact pidfd. -1 with TT_ERR_VERIFY when the peer is
 * gone or changed during the check. */
int peer_identity(int fd, struct proc_identity *out, int *out_pidfd,
                  bool *used_peerpidfd, struct tt_err *err);

/* verify_peer: the peer of fd is exactly expected (pid, uid, gid, start
 * time, executable) and alive after the check. Call it BEFORE writing
 * anything to fd. -1 with TT_ERR_VERIFY and a specific reason ("pid reused:
 * start time differs", "executable differs", "uid differs", "peer exited",
 * "peer pid differs", ...). */
int verify_peer(int fd, const struct proc_identity *expected,
                struct tt_err *err);

/* verify_peer_pidfd: verify_peer that also hands out the peer's pidfd (owned
 * by the caller) so the caller can watch the peer's exit (POLLIN). */
int verify_peer_pidfd(int fd, const struct proc_identity *expected,
                      int *out_pidfd, struct tt_err *err);

/* procid_verify_reason: the TT_ERR_VERIFY message for a field name from
 * proc_identity_diff ("pid reused: start time differs", ...). */
const char *procid_verify_reason(const char *field);
/* procid_verify_detail: the enum refusal (lib/refusal.h) for a field name
 * from proc_identity_diff (REFUSAL_WRONG_PEER for pid or an unknown one). */
int procid_verify_detail(const char *field);

#endif

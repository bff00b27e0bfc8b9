/* tether-bridge's options: its command line, and a spare's assignment
 * (the activation secret, then the execution's options as NUL-terminated
 * words; src/manager/bridgectl.c writes it). Parsing only: no I/O but the
 * assignment's read, so the parser is fuzzed (fuzz/fuzz_assign.c). */
#ifndef TETHER_BRIDGE_ARGS_H
#define TETHER_BRIDGE_ARGS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "claims.h"
#include "err.h"
#include "hello.h"

/* A spare's assignment: the secret, then at most this many bytes/words. */
#define BRIDGE_ASSIGN_MAX 4096
#define BRIDGE_ASSIGN_WORDS 32

struct bridge_args {
	char sbx[TT_SBX_ID_LEN + 1];
	uint64_t gen;
	uint32_t att;
	char listen_path[PATH_MAX];
	char guest_socket[PATH_MAX];
	pid_t init_pid;
	unsigned long long init_start;
	pid_t manager_pid;
	int secret_fd;   /* the secret alone, or -1 */
	int assign_fd;   /* a spare's assignment, or -1 */
	int ready_fd;    /* -1: nobody waits for readiness */
	/* --run-as ID: once set up, the bridge becomes uid/gid ID with only
	 * the capabilities it needs (drop.h); 0 = unset (stays as started). */
	uid_t run_as;
	/* --transport unix|vmchan (optional; unix by default): how the guest
	 * is reached: its own unix listener (ns), or streams on a microVM's
	 * virtio-serial channel whose listener is the VMM's (vmchan.h). */
	bool vmchan;
};

/* bridge_args_init: nothing set, every fd -1. */
void bridge_args_init(struct bridge_args *a);

/* bridge_args_parse: the command line (assigned false): the execution's
 * options with --manager-pid and --secret-fd, or only --manager-pid and
 * --assign-fd (a spare); or (assigned) an assignment's words, which may
 * name only the execution, each option once. 0, or -1 (usage printed for
 * a command line). */
int bridge_args_parse(struct bridge_args *a, int argc, char **argv, bool assigned);

/* bridge_assignment_parse: buf[0..len) as an assignment: secret out, the
 * execution's options into a. 0, or -1 (err says why; secret untouched). */
int bridge_assignment_parse(const uint8_t *buf, size_t len, struct bridge_args *a,
                            uint8_t secret[HELLO_SECRET_LEN], struct tt_err *err);

/* bridge_assignment_read: the whole assignment from fd (blocking, at most
 * BRIDGE_ASSIGN_MAX bytes, until EOF), parsed; closes fd. 1: EOF before
 * any byte (nothing assigned); 0: assigned; -1: unreadable or malformed. */
int bridge_assignment_read(int fd, struct bridge_args *a,
                           uint8_t secret[HELLO_SECRET_LEN], struct tt_err *err);

#endif

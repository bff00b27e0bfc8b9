/* Starting tether-bridge processes (the sbx-manager's side of
 * src/bridge/bridge.c): spawned waiting, then assigned their execution
 * over a pipe, so one can be started ahead of the create that needs it
 * (spawn, exec and loading its libraries: ~1.5 ms off the create path).
 * Process-level only; the execution's bookkeeping is the manager's
 * (exec.c). */
#ifndef TT_MANAGER_BRIDGECTL_H
#define TT_MANAGER_BRIDGECTL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "substrate/substrate.h"

/* A spawned bridge: our child until reaped. pid 0 = none. */
struct bridge_proc {
	pid_t pid;
	int pidfd;
	int assign_fd;  /* write end of its assignment pipe until assigned */
	int ready_fd;   /* read end of its readiness pipe until it said ready */
};

/* What a bridge serves: one execution (SPEC §5). */
struct bridge_assignment {
	const char *sbx;
	uint64_t gen;
	uint32_t att;
	const char *listen_path;   /* the manager's socket to it */
	const char *guest_socket;  /* the guest's listener, host side */
	pid_t init_pid;
	unsigned long long init_start;
	const uint8_t *secret;     /* NS_SECRET_LEN bytes */
	const char *transport;     /* "unix" (NULL too) or "vmchan" */
};

/* Bytes of an assignment at most (secret and options; bridge.c reads no
 * more). */
#define BRIDGECTL_ASSIGN_MAX 4096

/* bridgectl_bin: tether-bridge next to this executable. */
int bridgectl_bin(char *out, size_t cap, struct tt_err *err);

/* bridgectl_run_as: every bridge spawned from now on drops to uid/gid id
 * once set up (tether-bridge --run-as; src/bridge/drop.c). */
void bridgectl_run_as(uid_t id);
/* bridgectl_spawn: starts bin waiting for its assignment; bp filled. */
int bridgectl_spawn(const char *bin, struct bridge_proc *bp, struct tt_err *err);

/* bridgectl_assign: hands bp its execution (one write, then EOF). */
int bridgectl_assign(struct bridge_proc *bp, const struct bridge_assignment *a,
                     struct tt_err *err);

/* bridgectl_wait_ready: its "ready\n", or an error when it exits first or
 * misses timeout_ms. Closes the readiness pipe either way. */
int bridgectl_wait_ready(struct bridge_proc *bp, int timeout_ms, struct tt_err *err);

/* bridgectl_alive: bp has not exited (its pidfd is not readable). */
bool bridgectl_alive(const struct bridge_proc *bp);

/* bridgectl_runs: bp still runs bin as it is now (same file). */
bool bridgectl_runs(const struct bridge_proc *bp, const char *bin);

/* bridgectl_discard: kills and reaps a bridge that serves nothing yet. */
void bridgectl_discard(struct bridge_proc *bp);

#endif

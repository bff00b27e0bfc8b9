/* The bridge's privilege drop once set up (drop.c). */
#ifndef TETHER_BRIDGE_DROP_H
#define TETHER_BRIDGE_DROP_H

#include <sys/types.h>
#include <uv.h>

#include "err.h"

/* Capabilities a bridge keeps after the drop, as a mask of CAP_* bits:
 * CAP_DAC_READ_SEARCH (search the sandbox's root-only run dir; list
 * /proc/<init>/fd, owned by the sandbox's root) and CAP_SYS_PTRACE (read
 * /proc/<pid>/exe and the fd links of the init and the manager, neither
 * of our uid). */
#define BRIDGE_KEPT_CAPS ((1ull << 2) | (1ull << 19))

/* bridge_drop: becomes uid and gid `id` (no supplementary groups) with
 * only BRIDGE_KEPT_CAPS permitted and effective, nothing inheritable or
 * ambient, the bounding set cut to them, no_new_privs set, not dumpable;
 * verified afterwards (all ids equal id, setuid(0) fails, the sets read
 * back). Must run as root. 0, or -1 with err (the caller exits). */
int bridge_drop(uid_t id, struct tt_err *err);

/* bridge_listen_as: server (initialised here; its data kept) bound at path
 * as root, then (run_as != 0) bridge_drop(run_as), then listening with cb:
 * a connection's SO_PEERCRED is the listener's credentials at listen()
 * time, which must be the uid the manager pins us with. 0, or -1. */
int bridge_listen_as(uv_loop_t *loop, uv_pipe_t *server, const char *path, uid_t run_as,
                     uv_connection_cb cb, struct tt_err *err);

#endif

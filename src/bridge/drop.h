/* The bridge's privilege drop once set up (drop.c). */
#ifndef TETHER_BRIDGE_DROP_H
#define TETHER_BRIDGE_DROP_H

#include <sys/types.h>

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

#endif

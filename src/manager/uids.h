/* Host uid/gid layout of a worker, shared by the sbx-manager and `tether
 * up`. A manager's range starts at its --uid-base (default
 * TT_UID_BASE_DEFAULT): sandbox slot s maps ids 0..65535 inside to
 * base + 65536*s.. on the host (slots 0..TT_UID_SLOTS-1: every record plus
 * the spare), and the slot after the last (TT_UID_BRIDGE_SLOT) is the
 * worker's bridges' own uid and gid (base + 65536*TT_UID_BRIDGE_SLOT),
 * mapped into no sandbox. Managers on one host must have disjoint ranges
 * (`tether up` gives worker i base + (i-1)*TT_UID_PER_WORKER), so no two
 * sandboxes on different workers ever share host ids, nor what the kernel
 * charges per uid (inotify instances, user namespaces, ...). */
#ifndef TT_NODE_UIDS_H
#define TT_NODE_UIDS_H

#define TT_UID_BASE_DEFAULT 1000000u
#define TT_UID_PER_SANDBOX  65536u
/* records.h RECORDS_MAX (4096) executions, plus the spare. */
#define TT_UID_SLOTS        4097u
#define TT_UID_BRIDGE_SLOT  TT_UID_SLOTS
#define TT_UID_PER_WORKER   ((unsigned long long)TT_UID_PER_SANDBOX * (TT_UID_SLOTS + 1))

#endif

/* Path limits of a worker, shared by node-api, the sbx-manager and
 * `tether up` (which checks them before starting anything). Unix socket
 * paths have no limit of their own (lib/unixaddr.h); what bounds a
 * worker's state directory is what is derived from it: <state>/runtime.db
 * must fit SQLite's pathname bound (512 bytes with its journal's suffix:
 * 504 for the file; records_open says so too), and each sandbox's tree
 * (<state>/sandboxes/<sbx>/layer/...) with the sandbox's own files inside
 * it, walked by full path when a pause packs them, must stay within
 * PATH_MAX (4096) with room for their depth. */
#ifndef TT_MANAGER_PATHS_H
#define TT_MANAGER_PATHS_H

/* Longest worker state directory (--state of tetherd node / manager). */
#define TT_WORKER_STATE_MAX 480

#endif

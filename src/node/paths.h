/* Path limits of a worker, shared by node-api, the sbx-manager and
 * `tether up` (which checks them before starting anything). Unix socket
 * paths have no limit of their own (lib/unixaddr.h); what bounds a
 * worker's state directory is what is derived from it: each sandbox's
 * tree (<state>/sandboxes/<sbx>/layer/...) and the files of the sandbox
 * inside it, walked by full path when a pause packs them, must stay
 * within PATH_MAX (4096) with room for the sandbox's own depth. */
#ifndef TT_NODE_PATHS_H
#define TT_NODE_PATHS_H

/* Longest worker state directory (--state of tetherd node / manager). */
#define TT_WORKER_STATE_MAX 900

#endif

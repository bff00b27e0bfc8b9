/* The bridge's hold on the guest socket: its directory opened once at
 * start without following a symlink in any component, then the socket
 * file opened inside that directory fd for each new connection, so every
 * check and the connect are about one file the tenant cannot redirect. */
#ifndef TETHER_BRIDGE_GUESTSOCK_H
#define TETHER_BRIDGE_GUESTSOCK_H

#include <limits.h>

#include "err.h"
#include "unixaddr.h"

struct guestsock {
	int dir_fd;              /* O_PATH of the socket's directory, or -1 */
	char name[NAME_MAX + 1]; /* the socket's name in it */
	/* "/proc/self/fd/<dir_fd>/<name>": names the same file through the
	 * held directory, for path-based rechecks (no ancestor searched). */
	char via_fd[64 + NAME_MAX];
};

/* guestsock_open: opens path's directory (O_PATH, no symlink anywhere on
 * the path, no magic link). 0, or -1 with err. */
int guestsock_open(struct guestsock *g, const char *path, struct tt_err *err);

/* guestsock_file: ua = the socket file named in the held directory, opened
 * O_PATH | O_NOFOLLOW (a symlink, FIFO or regular file there is refused),
 * with sun_path "/proc/self/fd/<F>": a connect through it reaches exactly
 * that file. 0, or -1 with err (TT_ERR_NOT_FOUND when absent). */
int guestsock_file(const struct guestsock *g, struct unixaddr *ua, struct tt_err *err);

/* guestsock_close: releases the directory fd. */
void guestsock_close(struct guestsock *g);

#endif

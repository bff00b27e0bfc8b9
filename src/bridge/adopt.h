/* A restarted sbx-manager taking over a bridge whose manager died (the
 * protocol is in lib/hello.h, "Adoption"): the bridge's side of one
 * adoption connection, on its libuv loop. bridge.c decides when a
 * connection may adopt (the pinned manager has exited, the peer runs as
 * our uid) and re-pins its manager when the proof holds. */
#ifndef TETHER_BRIDGE_ADOPT_H
#define TETHER_BRIDGE_ADOPT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "refusal.h"

/* What the bridge does with a valid proof: re-pin the peer of conn_fd
 * (pid peer, from SO_PEERCRED) as its manager. Returns 0 (adopted) or -1
 * (msg says why; the peer is refused). */
typedef int (*adopt_accept_fn)(void *data, int conn_fd, pid_t peer, char *msg,
                               size_t cap);
/* How it ended: REFUSAL_NONE when adopted, else the refusal's reason. */
typedef void (*adopt_done_fn)(void *data, pid_t peer, enum refusal reason,
                              const char *msg);

struct adopt_spec {
	uv_loop_t *loop;
	const char *sbx;
	uint64_t gen;
	uint32_t att;
	const uint8_t *key;      /* the activation's adoption key (32 bytes) */
	adopt_accept_fn accept;
	adopt_done_fn done;
	void *data;
};

/* adopt_start: challenges the peer (pid, from SO_PEERCRED) on conn, which
 * it owns from now on (closed at the end, adopted or not); spec is copied
 * (its strings and key must outlive the connection). */
void adopt_start(uv_pipe_t *conn, pid_t peer, const struct adopt_spec *spec);

#endif

/* The edge's streamed exec relay (docs/API.md "Streamed exec"): the client
 * WebSocket GET /v1/sandboxes/{id}/exec/ws ("tether.exec.v1", Bearer auth)
 * is relayed to the node's endpoint over an lws client connection on the
 * same context and loop, with the capability from the route cache.
 * Implementation: src/edge/ws.c. */
#ifndef TT_EDGE_WS_H
#define TT_EDGE_WS_H

#include <libwebsockets.h>
#include <uv.h>

#include "edge/routes.h"
#include "http.h"

#define EDGEWS_PROTOCOL "tether.exec.v1"
#define EDGEWS_RX_BUFFER (64u << 10)

struct edgews;

/* Per-session data of the client-facing side (owned by the session). */
struct edgews_pss {
	struct edgews *x;
};

/* edgews_setup: what the relay shares with the HTTP edge (borrowed; they
 * outlive every stream): the curl client, the cp URL and the route cache. */
void edgews_setup(struct httpc *hc, struct routes *routes);
/* edgews_callback: lws callback of the "tether.exec.v1" protocol, for both
 * the client-facing (server) and the node-facing (client) connections. */
int edgews_callback(struct lws *wsi, enum lws_callback_reasons reason,
                    void *user, void *in, size_t len);

#endif

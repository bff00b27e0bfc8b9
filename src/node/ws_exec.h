/* node-api's streamed exec (docs/API.md "Streamed exec"): GET
 * /v1/sandboxes/{id}/exec/ws upgraded to WebSocket, subprotocol
 * "tether.exec.v1". The upgrade is authorized in
 * LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION (a well-formed capability header on
 * the right path); the sbx-manager admits the first client message (the start
 * message) before anything runs. Implementation: src/node/ws_exec.c. */
#ifndef TT_NODE_WS_EXEC_H
#define TT_NODE_WS_EXEC_H

#include <stddef.h>

#include <libwebsockets.h>

#define WSEXEC_PROTOCOL "tether.exec.v1"
#define WSEXEC_RX_BUFFER (64u << 10)

struct wsexec;

/* Per-session data of the protocol: the stream (owned by the session). */
struct wsexec_pss {
	struct wsexec *x;
};

/* wsexec_callback: the lws callback of the "tether.exec.v1" protocol; the
 * context user pointer must be the node's struct node. */
int wsexec_callback(struct lws *wsi, enum lws_callback_reasons reason,
                    void *user, void *in, size_t len);

#endif

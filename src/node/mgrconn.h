/* node-api's calls to its sbx-manager, on lib/wireconn (the connection,
 * its pool and the reuse rule are there, shared with the other hops):
 * opening an operation on the node's pool (counted), the DECISION frame
 * parsed and counted, and whole control calls (status). The pool: at most
 * MGRCONN_POOL_MAX idle connections, each kept MGRCONN_IDLE_MS (see
 * docs/ARCHITECTURE.md, "Connections"). Implementation:
 * src/node/mgrconn.c. */
#ifndef TT_NODE_MGRCONN_H
#define TT_NODE_MGRCONN_H

#include <jansson.h>

#include "decision.h"
#include "err.h"
#include "wire.h"
#include "wireconn.h"

struct node;

#define MGRCONN_POOL_MAX 4            /* idle connections to the manager */
#define MGRCONN_IDLE_MS (30u * 1000u) /* an idle connection is closed after */

/* mgrconn_open: wireconn_open on the node's pool towards its manager,
 * counted in tether_node_manager_connections_total{conn}. */
struct wireconn *mgrconn_open(struct node *n, json_t *req,
                              const struct wireconn_cbs *cbs, void *arg,
                              struct tt_err *err);
/* mgrconn_decision: parses the manager's DECISION frame (JSON_REJECT_
 * DUPLICATES), counts it in tether_node_admission_total{decision,reason}
 * and returns the object (caller decrefs) with *verdict set; NULL when the
 * frame is not a decision (a protocol error: answer "transport"). */
json_t *mgrconn_decision(const struct wire_frame *f, enum tt_verdict *verdict);

/* A whole control call (status): request -> the final RESULT object (or
 * an error). result is owned by the callee (decref it). */
typedef void (*mgrconn_call_fn)(void *arg, json_t *result,
                                const struct tt_err *err);
int mgrconn_call(struct node *n, json_t *req, mgrconn_call_fn done, void *arg,
                 struct tt_err *err);

#endif

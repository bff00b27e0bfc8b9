/* Helpers the HTTP edge (edge.c) and its streamed exec relay (ws.c) share:
 * the route an attempt uses, route-cache lookups and the capability fetch
 * from the control plane. Implementation: src/edge/common.c. */
#ifndef TT_EDGE_INT_H
#define TT_EDGE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libwebsockets.h>

#include "access.h"
#include "edge/routes.h"
#include "err.h"

#define EDGE_IDEM_MAX 64 /* an Idempotency-Key */

/* The ops of every capability the edge asks for: the ones it relays. */
#define EDGE_CAP_OPS "[\"exec\",\"fs.read\",\"fs.write\"]"

/* The route of a request's (or stream's) next attempt. */
struct edge_route {
	char *token;       /* capability in use (owned, secret) */
	char node_url[256];
	uint64_t version;  /* route-cache tag of token (0: uncached) */
	uint64_t gen;      /* the generation token selects */
	uint32_t att;      /* and its activation */
};

/* edge_route_take: ent (a route-cache copy) becomes rt; its token moves
 * into rt and the previous one is wiped. */
void edge_route_take(struct edge_route *rt, struct route_entry *ent);
/* edge_route_clear: wipes and frees rt's token. */
void edge_route_clear(struct edge_route *rt);
/* edge_route_lookup: routes_repair_begin (a rebuilt attempt refused on
 * rt_version) or routes_acquire, counting the outcome in
 * tether_edge_capcache_total (and a ROUTE_FETCH, which the caller starts at
 * once, in tether_edge_cap_fetch_total). Returns what they return. */
int edge_route_lookup(struct routes *r, const unsigned char *kh,
                      const char *sbx, int retried, uint64_t rt_version,
                      struct route_waiter *w, struct route_entry *ent,
                      struct route_ticket *t);
/* edge_cap_parse: checks a capability answer j and fills *f from it (f's
 * token borrowed from j). 0, or -1 when unusable. */
int edge_cap_parse(json_t *j, struct route_entry *f);
/* edge_cap_commit: stores f in the route cache if the slot is still t's
 * (this ends the fetch and wakes the waiters); *take is then the cached
 * copy, else a private copy of f (version 0). Free with route_entry_clear.
 * 0, or -1 when out of memory. */
int edge_cap_commit(struct routes *r, const unsigned char *kh, const char *sbx,
                    const struct route_ticket *t, const struct route_entry *f,
                    struct route_entry *take);
/* The control-plane replicas the edge calls (--cp URL[,URL…], lib/urllist.h):
 * edge_cp_set parses them; edge_cp_url is the one the next call goes to
 * (spread over those up); edge_cp_failed, after a transfer to one, passes
 * it over for a while when rc says it refused, timed out or lost the
 * answer (1 then). */
int edge_cp_set(const char *csv, struct tt_err *err);
const char *edge_cp_url(void);
int edge_cp_failed(CURL *e, CURLcode rc);
/* edge_idem_key: the key a lifecycle call carries to the cp
 * (Idempotency-Key): the client's own when it sent a valid one, else a
 * fresh random one; the same key goes to every replica the call is tried
 * on, so the one that started it is the only one that does. */
void edge_idem_key(struct lws *wsi, char out[EDGE_IDEM_MAX + 1]);
/* edge_idem_eligible: a call the cp dedupes by its Idempotency-Key (create,
 * delete, pause, resume, migrate) or that changes nothing (a capability):
 * one whose lost answer may be asked again of another replica. */
bool edge_idem_eligible(const char *method, const char *path);

/* edge_cap_request: makes c a capability request for
 * sbx to cp_url with the caller's auth ("Bearer …"); the header list goes
 * to *hdrs (owned by the caller until the transfer ends). The cp waits up
 * to wait_s for a transition of the sandbox to end (SPEC §7), and, with
 * stale (the route a receiver just refused as RefreshRoute; NULL: none),
 * until it runs another execution than that one. */
void edge_cap_request(CURL *c, const char *cp_url, const char *sbx,
                      const char *auth, int wait_s,
                      const struct edge_route *stale, struct curl_slist **hdrs);

/* One answered request (or ended stream) as the access log records it
 * (src/edge/access.c; docs/CLI.md "Logs"). Strings borrowed; NULL or ""
 * leaves a field out. */
/* edge_access_log: one access line for a (lib/access.h), noted in the
 * ring of recent operations the status page shows, its decision counted
 * (tether_edge_decisions_total). */
void edge_access_log(const struct tt_access *a);
/* edge_access_recent: the last operations on a sandbox the access log
 * recorded (at most 64), newest first, as the status page's JSON array
 * (caller owns it). */
json_t *edge_access_recent(void);

#endif

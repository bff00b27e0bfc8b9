/* The edge's route cache (SPEC §8): per (caller key hash, sandbox) the
 * capability in use and the route it names. Repair is compare-and-swap: a
 * rejection names the token it was rejected with, and only an entry still
 * holding that token is replaced, so a delayed rejection never evicts a newer
 * entry. At most one capability fetch runs per slot; other requests that need
 * the slot meanwhile wait for its outcome (no refresh storm). A repair keeps
 * the slot's caller-authorization expiry: re-fetching a route never extends
 * the caller's authorization, only a fresh authentication does.
 * Single-threaded (the edge's event loop). Implementation: src/edge/routes.c. */
#ifndef TT_EDGE_ROUTES_H
#define TT_EDGE_ROUTES_H

#include <stddef.h>
#include <stdint.h>

#define ROUTES_KEYHASH_LEN 32

/* One cached route; what lookups hand out (a copy: tokens are owned). */
struct route_entry {
	unsigned char keyhash[ROUTES_KEYHASH_LEN];
	char sbx[64];
	char *token;                 /* owned */
	uint64_t generation;
	uint32_t activation;
	char worker[64];
	char node_url[256];
	int64_t expires_at;          /* the capability's expiry (unix s) */
	int64_t caller_auth_expires; /* caller authorization ends (unix s) */
	uint64_t version;            /* unique per stored route: the CAS tag */
};

/* A caller waiting for a slot's fetch; embedded in the caller's request.
 * fn runs once the fetch committed or failed; the caller then looks up
 * again. */
struct route_waiter {
	struct route_waiter *next;
	void (*fn)(void *arg);
	void *arg;
};

/* Proof that the caller owns a slot's fetch (from routes_acquire or
 * routes_repair_begin); pass it back to routes_commit or routes_abort. */
struct route_ticket {
	uint64_t version;  /* route being replaced, 0 for none */
	int fresh;         /* 1: a fresh authentication sets the caller expiry */
	int64_t caller_auth_expires; /* kept across a repair when !fresh */
};

enum route_verdict {
	ROUTE_USE,   /* *out is a live route: use it */
	ROUTE_FETCH, /* the caller fetches, then routes_commit / routes_abort */
	ROUTE_WAIT,  /* a fetch is in flight: w is queued, fn runs later */
};

struct routes;

/* routes_new: an empty cache bounded to max slots; margin_s: routes are
 * not handed out within margin_s seconds of either expiry. */
struct routes *routes_new(size_t max, int64_t margin_s);
/* routes_free: frees every slot; pending waiters are dropped, not run. */
void routes_free(struct routes *r);

/* routes_acquire: a live route for (kh, sbx) at time now (ROUTE_USE, *out
 * filled, free with route_entry_clear), else ROUTE_WAIT (w queued) while a
 * fetch is in flight, else ROUTE_FETCH with *t (the slot is marked
 * fetching). -1 when out of memory. */
int routes_acquire(struct routes *r, const unsigned char *kh, const char *sbx,
                   int64_t now, struct route_waiter *w, struct route_entry *out,
                   struct route_ticket *t);
/* routes_repair_begin: a request made with rejected_version was refused
 * (RefreshRoute, or a transport failure for a retryable read). If the slot
 * already holds another live route, ROUTE_USE with it (a delayed rejection:
 * the newer entry stays); if a fetch is in flight, ROUTE_WAIT; else the
 * rejected route is dropped and ROUTE_FETCH (a repair: the caller
 * authorization expiry is kept). -1 when out of memory. */
int routes_repair_begin(struct routes *r, const unsigned char *kh,
                        const char *sbx, uint64_t rejected_version, int64_t now,
                        struct route_waiter *w, struct route_entry *out,
                        struct route_ticket *t);
/* routes_commit: stores the fetched route (borrowed; token copied) if the
 * slot still holds what t was issued for (compare-and-swap), then wakes the
 * waiters. A repair keeps t's caller expiry; a fresh fetch sets it to the
 * capability's expiry. On success *out (may be NULL) is a copy of what was
 * stored, version included. Returns 0 stored, 1 not stored (the slot moved
 * on), -1 out of memory. */
int routes_commit(struct routes *r, const unsigned char *kh, const char *sbx,
                  const struct route_ticket *t, const struct route_entry *fetched,
                  struct route_entry *out);
/* routes_abort: the fetch failed; clears the in-flight mark and wakes the
 * waiters (the first of them to look up again becomes the next fetcher). */
void routes_abort(struct routes *r, const unsigned char *kh, const char *sbx);
/* routes_drop_if: removes the route of (kh, sbx) only if it still has
 * version (a transport failure invalidating what it used). 1 if dropped. */
int routes_drop_if(struct routes *r, const unsigned char *kh, const char *sbx,
                   uint64_t version);
/* routes_drop_sandbox: forgets every caller's route to sbx (the edge itself
 * proxied a pause/resume/migrate/delete of it). Leaves in-flight fetches. */
void routes_drop_sandbox(struct routes *r, const char *sbx);
/* routes_cancel_wait: removes w from whichever slot queues it. */
void routes_cancel_wait(struct routes *r, struct route_waiter *w);
/* routes_count: slots held (for tests and metrics). */
size_t routes_count(const struct routes *r);

/* route_entry_clear: frees a copy's token (wiped first). */
void route_entry_clear(struct route_entry *e);

#endif

/* The edge's route cache; see routes.h for the rules. Slots live in a list,
 * newest first (bounded, so a linear scan is cheap next to a capability
 * fetch); each slot owns its route's token. */
#include "edge/routes.h"

#include <stdlib.h>
#include <string.h>

#include <sodium.h>

struct slot {
	struct slot *next;
	struct route_entry route;     /* token NULL: no route held */
	int64_t auth_expires;         /* caller authorization, 0 = none yet */
	int fetching;                 /* a fetch owns this slot */
	int fetch_void;               /* the in-flight fetch must not be stored */
	struct route_waiter *waiters; /* FIFO */
	struct route_waiter **wtail;
};

struct routes {
	struct slot *slots;
	size_t n;
	size_t max;
	int64_t margin;
	uint64_t next_version;
};

/* route_entry_clear: frees a copy's token (wiped first). */
void route_entry_clear(struct route_entry *e)
{
	if (e->token) {
		sodium_memzero(e->token, strlen(e->token));
		free(e->token);
	}
	e->token = NULL;
}

/* slot_free: one slot and its token; waiters are the callers' memory. */
static void slot_free(struct slot *s)
{
	route_entry_clear(&s->route);
	free(s);
}

/* routes_new: an empty cache. */
struct routes *routes_new(size_t max, int64_t margin_s)
{
	struct routes *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	r->max = max ? max : 1;
	r->margin = margin_s;
	return r;
}

/* routes_free: every slot. */
void routes_free(struct routes *r)
{
	if (r == NULL)
		return;
	while (r->slots) {
		struct slot *s = r->slots;
		r->slots = s->next;
		slot_free(s);
	}
	free(r);
}

/* slot_find: the slot of (kh, sbx), or NULL. */
static struct slot *slot_find(struct routes *r, const unsigned char *kh,
                              const char *sbx)
{
	for (struct slot *s = r->slots; s; s = s->next)
		if (memcmp(s->route.keyhash, kh, ROUTES_KEYHASH_LEN) == 0 &&
		    strcmp(s->route.sbx, sbx) == 0)
			return s;
	return NULL;
}

/* slot_evict_one: drops the oldest slot nobody is fetching for or waiting
 * on, one that holds no route first: a failed fetch (a wrong API key:
 * anyone can send those) leaves such a slot, and a flood of them must not
 * push out the routes of real callers. A cache over its bound by busy
 * slots just stays over until they settle. */
static void slot_evict_one(struct routes *r)
{
	struct slot **victim = NULL, **empty = NULL;

	for (struct slot **pp = &r->slots; *pp; pp = &(*pp)->next)
		if (!(*pp)->fetching && (*pp)->waiters == NULL) {
			victim = pp;
			if ((*pp)->route.token == NULL)
				empty = pp;
		}
	if (empty != NULL)
		victim = empty;
	if (victim) {
		struct slot *s = *victim;
		*victim = s->next;
		slot_free(s);
		r->n--;
	}
}

/* slot_new: an empty slot for (kh, sbx) at the head. */
static struct slot *slot_new(struct routes *r, const unsigned char *kh,
                             const char *sbx)
{
	struct slot *s;

	if (strlen(sbx) >= sizeof(s->route.sbx))
		return NULL;
	if (r->n >= r->max)
		slot_evict_one(r);
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return NULL;
	memcpy(s->route.keyhash, kh, ROUTES_KEYHASH_LEN);
	memcpy(s->route.sbx, sbx, strlen(sbx) + 1);
	s->wtail = &s->waiters;
	s->next = r->slots;
	r->slots = s;
	r->n++;
	return s;
}

/* auth_live: the caller authorization behind the slot still holds. */
static int auth_live(const struct routes *r, const struct slot *s, int64_t now)
{
	return s->auth_expires - r->margin > now;
}

/* route_live: the slot holds a route that may be handed out at now. */
static int route_live(const struct routes *r, const struct slot *s, int64_t now)
{
	return s->route.token != NULL && s->route.expires_at - r->margin > now &&
	       auth_live(r, s, now);
}

/* entry_copy: *dst = *src with its own token; -1 out of memory. */
static int entry_copy(struct route_entry *dst, const struct route_entry *src,
                      int64_t auth_expires)
{
	*dst = *src;
	dst->caller_auth_expires = auth_expires;
	dst->token = src->token ? strdup(src->token) : NULL;
	return src->token && dst->token == NULL ? -1 : 0;
}

/* slot_wait: queues w on s. */
static void slot_wait(struct slot *s, struct route_waiter *w)
{
	w->next = NULL;
	*s->wtail = w;
	s->wtail = &w->next;
}

/* slot_begin_fetch: marks s as fetched for and fills the ticket. */
static void slot_begin_fetch(const struct routes *r, struct slot *s,
                             int64_t now, struct route_ticket *t)
{
	s->fetching = 1;
	s->fetch_void = 0;
	t->version = s->route.token ? s->route.version : 0;
	t->fresh = !auth_live(r, s, now);
	t->caller_auth_expires = t->fresh ? 0 : s->auth_expires;
}

/* routes_acquire: see routes.h. */
int routes_acquire(struct routes *r, const unsigned char *kh, const char *sbx,
                   int64_t now, struct route_waiter *w, struct route_entry *out,
                   struct route_ticket *t)
{
	struct slot *s = slot_find(r, kh, sbx);

	if (s == NULL && (s = slot_new(r, kh, sbx)) == NULL)
		return -1;
	if (s->fetching) {
		slot_wait(s, w);
		return ROUTE_WAIT;
	}
	if (route_live(r, s, now))
		return entry_copy(out, &s->route, s->auth_expires) < 0 ? -1 : ROUTE_USE;
	slot_begin_fetch(r, s, now, t);
	return ROUTE_FETCH;
}

/* routes_repair_begin: see routes.h. */
int routes_repair_begin(struct routes *r, const unsigned char *kh,
                        const char *sbx, uint64_t rejected_version, int64_t now,
                        struct route_waiter *w, struct route_entry *out,
                        struct route_ticket *t)
{
	struct slot *s = slot_find(r, kh, sbx);

	if (s == NULL && (s = slot_new(r, kh, sbx)) == NULL)
		return -1;
	if (s->fetching) { /* someone is already repairing: share their result */
		slot_wait(s, w);
		return ROUTE_WAIT;
	}
	if (s->route.token && s->route.version != rejected_version &&
	    route_live(r, s, now)) /* a delayed rejection: keep the newer entry */
		return entry_copy(out, &s->route, s->auth_expires) < 0 ? -1 : ROUTE_USE;
	if (s->route.token && s->route.version == rejected_version)
		route_entry_clear(&s->route); /* known stale: nobody may use it */
	slot_begin_fetch(r, s, now, t);
	return ROUTE_FETCH;
}

/* slot_wake: runs and forgets every waiter of s, in arrival order. The
 * list is detached first: a waiter may queue itself again. */
static void slot_wake(struct slot *s)
{
	struct route_waiter *w = s->waiters;

	s->waiters = NULL;
	s->wtail = &s->waiters;
	while (w) {
		struct route_waiter *next = w->next;
		w->next = NULL;
		w->fn(w->arg);
		w = next;
	}
}

/* routes_commit: see routes.h. */
int routes_commit(struct routes *r, const unsigned char *kh, const char *sbx,
                  const struct route_ticket *t, const struct route_entry *fetched,
                  struct route_entry *out)
{
	struct slot *s = slot_find(r, kh, sbx);
	uint64_t cur;
	char *tok;
	int rc = 0;

	if (out)
		memset(out, 0, sizeof(*out));
	if (s == NULL)
		return 1;
	cur = s->route.token ? s->route.version : 0;
	if (!s->fetching || s->fetch_void || cur != t->version) {
		rc = 1; /* the slot moved on: leave what it holds */
	} else if (fetched->token == NULL || (tok = strdup(fetched->token)) == NULL) {
		rc = -1;
	} else {
		route_entry_clear(&s->route);
		s->route = *fetched;
		memcpy(s->route.keyhash, kh, ROUTES_KEYHASH_LEN);
		memcpy(s->route.sbx, sbx, strlen(sbx) + 1);
		s->route.token = tok;
		s->route.version = ++r->next_version;
		/* only a fresh authentication moves the caller's expiry; a repair
		 * keeps the original one (and so never extends it) */
		if (t->fresh)
			s->auth_expires = fetched->expires_at;
		s->route.caller_auth_expires = s->auth_expires;
		if (out && entry_copy(out, &s->route, s->auth_expires) < 0)
			rc = -1;
	}
	s->fetching = 0;
	s->fetch_void = 0;
	slot_wake(s);
	return rc;
}

/* routes_abort: see routes.h. */
void routes_abort(struct routes *r, const unsigned char *kh, const char *sbx)
{
	struct slot *s = slot_find(r, kh, sbx);

	if (s == NULL)
		return;
	s->fetching = 0;
	s->fetch_void = 0;
	slot_wake(s);
}

/* routes_drop_if: see routes.h. */
int routes_drop_if(struct routes *r, const unsigned char *kh, const char *sbx,
                   uint64_t version)
{
	struct slot *s = slot_find(r, kh, sbx);

	if (s == NULL || s->route.token == NULL || s->route.version != version)
		return 0;
	route_entry_clear(&s->route);
	return 1;
}

/* routes_drop_sandbox: see routes.h. */
void routes_drop_sandbox(struct routes *r, const char *sbx)
{
	for (struct slot *s = r->slots; s; s = s->next) {
		if (strcmp(s->route.sbx, sbx) != 0)
			continue;
		route_entry_clear(&s->route);
		if (s->fetching)
			s->fetch_void = 1; /* it may have fetched the old route */
	}
}

/* routes_cancel_wait: see routes.h. */
void routes_cancel_wait(struct routes *r, struct route_waiter *w)
{
	for (struct slot *s = r->slots; s; s = s->next) {
		for (struct route_waiter **pp = &s->waiters; *pp; pp = &(*pp)->next) {
			if (*pp != w)
				continue;
			*pp = w->next;
			if (s->wtail == &w->next)
				s->wtail = pp;
			w->next = NULL;
			return;
		}
	}
}

/* routes_count: slots held. */
size_t routes_count(const struct routes *r)
{
	return r->n;
}

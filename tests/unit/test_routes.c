/* The edge route cache (src/edge/routes.c), SPEC §8: compare-and-swap
 * repair under the interleavings that break naive caches — a delayed
 * rejection of an old token after a repair, two racing repairs, and the
 * caller-authorization expiry kept across a refresh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "edge/routes.h"

#define SBX "sbx_abcdefghijklmnopqrstuvwxyz"
#define MARGIN 30
#define NOW 1000000

static const unsigned char KH[ROUTES_KEYHASH_LEN] = { 1, 2, 3 };
static const unsigned char KH2[ROUTES_KEYHASH_LEN] = { 9, 9, 9 };

/* A waiting request: counts wake-ups. */
struct req {
	struct route_waiter w;
	int woken;
};

/* req_wake: the waiter callback. */
static void req_wake(void *arg)
{
	((struct req *)arg)->woken++;
}

/* req_init: a request ready to wait. */
static void req_init(struct req *q)
{
	memset(q, 0, sizeof(*q));
	q->w.fn = req_wake;
	q->w.arg = q;
}

/* fetched: what a capability fetch returned (token borrowed). */
static struct route_entry fetched(const char *token, uint64_t gen,
                                  const char *worker, int64_t exp)
{
	struct route_entry e;

	memset(&e, 0, sizeof(e));
	e.token = (char *)token;
	e.generation = gen;
	snprintf(e.worker, sizeof(e.worker), "%s", worker);
	snprintf(e.node_url, sizeof(e.node_url), "http://127.0.0.1:7711");
	e.expires_at = exp;
	return e;
}

/* install: a fresh acquire + commit of token; returns the stored version. */
static uint64_t install(struct routes *r, const unsigned char *kh,
                        const char *token, uint64_t gen, int64_t now, int64_t exp)
{
	struct req q;
	struct route_entry out, f = fetched(token, gen, "w1", exp);
	struct route_ticket t;

	req_init(&q);
	assert_int_equal(routes_acquire(r, kh, SBX, now, &q.w, &out, &t), ROUTE_FETCH);
	assert_int_equal(routes_commit(r, kh, SBX, &t, &f, &out), 0);
	uint64_t v = out.version;
	route_entry_clear(&out);
	return v;
}

/* A miss fetches, a second caller waits instead of fetching too, and both
 * then use the same route. */
static void test_miss_then_hit(void **state)
{
	struct routes *r = routes_new(16, MARGIN);
	struct req a, b;
	struct route_entry out, f = fetched("tok-1", 7, "w1", NOW + 120);
	struct route_ticket ta, tb;

	(void)state;
	req_init(&a);
	req_init(&b);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &a.w, &out, &ta), ROUTE_FETCH);
	assert_true(ta.fresh);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &b.w, &out, &tb), ROUTE_WAIT);
	assert_int_equal(routes_commit(r, KH, SBX, &ta, &f, NULL), 0);
	assert_int_equal(b.woken, 1);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &b.w, &out, &tb), ROUTE_USE);
	assert_string_equal(out.token, "tok-1");
	assert_int_equal(out.generation, 7);
	assert_int_equal(out.caller_auth_expires, NOW + 120);
	route_entry_clear(&out);
	/* another caller key never sees this caller's route */
	assert_int_equal(routes_acquire(r, KH2, SBX, NOW, &b.w, &out, &tb), ROUTE_FETCH);
	routes_abort(r, KH2, SBX);
	routes_free(r);
}

/* A rejection of token 1 arrives after the cache was already repaired to
 * token 2 (the request that used token 1 was slow): the newer entry stays
 * and the late request reuses it, with no fetch. The honest repair path
 * (rejection of the current token) does replace it. */
static void test_delayed_rejection_after_repair(void **state)
{
	struct routes *r = routes_new(16, MARGIN);
	struct req q;
	struct route_entry out, f2 = fetched("tok-2", 8, "w2", NOW + 130);
	struct route_ticket t;
	uint64_t v1, v2;

	(void)state;
	req_init(&q);
	v1 = install(r, KH, "tok-1", 7, NOW, NOW + 120);
	/* request A used tok-1 and got RefreshRoute: it repairs */
	assert_int_equal(routes_repair_begin(r, KH, SBX, v1, NOW + 5, &q.w, &out, &t),
	                 ROUTE_FETCH);
	assert_false(t.fresh);
	assert_int_equal(routes_commit(r, KH, SBX, &t, &f2, &out), 0);
	v2 = out.version;
	assert_true(v2 != v1);
	route_entry_clear(&out);
	/* request B also used tok-1; its rejection arrives only now */
	assert_int_equal(routes_repair_begin(r, KH, SBX, v1, NOW + 6, &q.w, &out, &t),
	                 ROUTE_USE);
	assert_string_equal(out.token, "tok-2");
	assert_int_equal(out.version, v2);
	assert_int_equal(out.generation, 8);
	route_entry_clear(&out);
	/* a late transport-failure invalidation of tok-1 is a no-op too */
	assert_int_equal(routes_drop_if(r, KH, SBX, v1), 0);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 7, &q.w, &out, &t), ROUTE_USE);
	assert_string_equal(out.token, "tok-2");
	route_entry_clear(&out);
	/* and a stale commit (ticket issued for tok-1) does not overwrite it */
	struct route_ticket old = { .version = v1, .fresh = 0 };
	struct route_entry f3 = fetched("tok-3", 9, "w1", NOW + 140);
	assert_int_equal(routes_acquire(r, KH2, SBX, NOW, &q.w, &out, &t), ROUTE_FETCH);
	routes_abort(r, KH2, SBX);
	assert_int_equal(routes_commit(r, KH, SBX, &old, &f3, NULL), 1);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 8, &q.w, &out, &t), ROUTE_USE);
	assert_string_equal(out.token, "tok-2");
	route_entry_clear(&out);
	/* the honest path: tok-2 itself rejected -> dropped and refetched */
	assert_int_equal(routes_repair_begin(r, KH, SBX, v2, NOW + 9, &q.w, &out, &t),
	                 ROUTE_FETCH);
	assert_int_equal(routes_commit(r, KH, SBX, &t, &f3, &out), 0);
	assert_string_equal(out.token, "tok-3");
	route_entry_clear(&out);
	assert_int_equal(q.woken, 0);
	routes_free(r);
}

/* Two requests rejected with the same token: exactly one fetches, the
 * other waits, is woken once, and reuses the newer entry. Meanwhile a new
 * request waits too rather than using the known-stale route. */
static void test_two_racing_repairs(void **state)
{
	struct routes *r = routes_new(16, MARGIN);
	struct req a, b, c;
	struct route_entry out, f2 = fetched("tok-2", 8, "w2", NOW + 130);
	struct route_ticket ta, tb;
	uint64_t v1;
	int fetches = 0;

	(void)state;
	req_init(&a);
	req_init(&b);
	req_init(&c);
	v1 = install(r, KH, "tok-1", 7, NOW, NOW + 120);
	if (routes_repair_begin(r, KH, SBX, v1, NOW + 1, &a.w, &out, &ta) == ROUTE_FETCH)
		fetches++;
	if (routes_repair_begin(r, KH, SBX, v1, NOW + 1, &b.w, &out, &tb) == ROUTE_FETCH)
		fetches++;
	assert_int_equal(fetches, 1);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 1, &c.w, &out, &tb), ROUTE_WAIT);
	assert_int_equal(routes_commit(r, KH, SBX, &ta, &f2, NULL), 0);
	assert_int_equal(a.woken, 0);
	assert_int_equal(b.woken, 1);
	assert_int_equal(c.woken, 1);
	/* b, on waking, asks again with the token it was rejected with */
	assert_int_equal(routes_repair_begin(r, KH, SBX, v1, NOW + 2, &b.w, &out, &tb),
	                 ROUTE_USE);
	assert_string_equal(out.token, "tok-2");
	route_entry_clear(&out);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 2, &c.w, &out, &tb), ROUTE_USE);
	assert_string_equal(out.token, "tok-2");
	route_entry_clear(&out);
	assert_int_equal(routes_count(r), 1);
	routes_free(r);
}

/* A failed fetch wakes the waiters; the first to ask again becomes the
 * next fetcher and the rest wait again (no storm on failure either). A
 * cancelled waiter is never woken. */
static void test_failed_fetch_hands_over(void **state)
{
	struct routes *r = routes_new(16, MARGIN);
	struct req a, b, c;
	struct route_entry out;
	struct route_ticket t;

	(void)state;
	req_init(&a);
	req_init(&b);
	req_init(&c);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &a.w, &out, &t), ROUTE_FETCH);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &b.w, &out, &t), ROUTE_WAIT);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &c.w, &out, &t), ROUTE_WAIT);
	routes_cancel_wait(r, &c.w);
	routes_abort(r, KH, SBX);
	assert_int_equal(b.woken, 1);
	assert_int_equal(c.woken, 0);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &b.w, &out, &t), ROUTE_FETCH);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &a.w, &out, &t), ROUTE_WAIT);
	routes_abort(r, KH, SBX);
	assert_int_equal(a.woken, 1);
	routes_free(r);
}

/* The caller was authorized until NOW+120 by the first fetch. A repair at
 * NOW+60 brings a capability valid until NOW+180, but the entry still ends
 * with the original authorization (minus the margin): the repair did not
 * extend it. Past that, the next fetch is a fresh authentication that may
 * set a new expiry. */
static void test_expiry_kept_across_refresh(void **state)
{
	struct routes *r = routes_new(16, MARGIN);
	struct req q;
	struct route_entry out, f2 = fetched("tok-2", 8, "w2", NOW + 180);
	struct route_entry f3 = fetched("tok-3", 8, "w2", NOW + 250);
	struct route_ticket t;
	uint64_t v1;

	(void)state;
	req_init(&q);
	v1 = install(r, KH, "tok-1", 7, NOW, NOW + 120);
	assert_int_equal(routes_repair_begin(r, KH, SBX, v1, NOW + 60, &q.w, &out, &t),
	                 ROUTE_FETCH);
	assert_false(t.fresh);
	assert_int_equal(t.caller_auth_expires, NOW + 120);
	assert_int_equal(routes_commit(r, KH, SBX, &t, &f2, &out), 0);
	assert_int_equal(out.expires_at, NOW + 180);
	assert_int_equal(out.caller_auth_expires, NOW + 120);
	route_entry_clear(&out);
	/* still usable just before the original expiry minus the margin */
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 120 - MARGIN - 1, &q.w, &out, &t),
	                 ROUTE_USE);
	assert_string_equal(out.token, "tok-2");
	route_entry_clear(&out);
	/* and not after, although tok-2 itself has time left */
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 120 - MARGIN, &q.w, &out, &t),
	                 ROUTE_FETCH);
	assert_true(t.fresh);
	assert_int_equal(routes_commit(r, KH, SBX, &t, &f3, &out), 0);
	assert_int_equal(out.caller_auth_expires, NOW + 250);
	route_entry_clear(&out);
	/* a transport-failure drop followed by a fetch is a repair as well */
	v1 = 0;
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 100, &q.w, &out, &t), ROUTE_USE);
	v1 = out.version;
	route_entry_clear(&out);
	assert_int_equal(routes_drop_if(r, KH, SBX, v1), 1);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW + 101, &q.w, &out, &t), ROUTE_FETCH);
	assert_false(t.fresh);
	assert_int_equal(t.caller_auth_expires, NOW + 250);
	routes_abort(r, KH, SBX);
	routes_free(r);
}

/* The edge proxied a lifecycle call: every caller's route to the sandbox
 * goes, and a fetch that was in flight across it is not stored. */
static void test_drop_sandbox_voids_inflight(void **state)
{
	struct routes *r = routes_new(16, MARGIN);
	struct req q;
	struct route_entry out, f = fetched("tok-old", 7, "w1", NOW + 120);
	struct route_ticket t;

	(void)state;
	req_init(&q);
	install(r, KH2, "tok-x", 7, NOW, NOW + 120);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &q.w, &out, &t), ROUTE_FETCH);
	routes_drop_sandbox(r, SBX);
	assert_int_equal(routes_commit(r, KH, SBX, &t, &f, NULL), 1);
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &q.w, &out, &t), ROUTE_FETCH);
	routes_abort(r, KH, SBX);
	assert_int_equal(routes_acquire(r, KH2, SBX, NOW, &q.w, &out, &t), ROUTE_FETCH);
	routes_abort(r, KH2, SBX);
	routes_free(r);
}

/* The bound holds: idle slots are evicted oldest first, busy ones kept. */
static void test_bounded(void **state)
{
	struct routes *r = routes_new(4, MARGIN);
	unsigned char kh[ROUTES_KEYHASH_LEN] = { 0 };
	struct route_entry out;
	struct route_ticket t;
	struct req q;

	(void)state;
	req_init(&q);
	for (int i = 0; i < 10; i++) {
		kh[0] = (unsigned char)i;
		install(r, kh, "tok", 1, NOW, NOW + 120);
		assert_true(routes_count(r) <= 4);
	}
	kh[0] = 9; /* newest survives */
	assert_int_equal(routes_acquire(r, kh, SBX, NOW, &q.w, &out, &t), ROUTE_USE);
	route_entry_clear(&out);
	kh[0] = 0; /* oldest went */
	assert_int_equal(routes_acquire(r, kh, SBX, NOW, &q.w, &out, &t), ROUTE_FETCH);
	routes_abort(r, kh, SBX);
	routes_free(r);
}

/* test_failed_fetches_do_not_evict: a flood of fetches that fail (wrong
 * API keys, from anyone) fills the cache with empty slots; they are
 * evicted before a real caller's route, which stays usable. */
static void test_failed_fetches_do_not_evict(void **state)
{
	struct routes *r = routes_new(4, MARGIN);
	unsigned char kh[ROUTES_KEYHASH_LEN] = { 0 };
	struct route_entry out;
	struct route_ticket t;
	struct req q;

	(void)state;
	req_init(&q);
	install(r, KH, "real", 1, NOW, NOW + 120);
	for (int i = 0; i < 100; i++) {
		kh[0] = (unsigned char)(i + 1);
		kh[1] = 0xbb; /* never KH */
		assert_int_equal(routes_acquire(r, kh, SBX, NOW, &q.w, &out, &t), ROUTE_FETCH);
		routes_abort(r, kh, SBX); /* the cp refused the key */
		assert_true(routes_count(r) <= 4);
	}
	assert_int_equal(routes_acquire(r, KH, SBX, NOW, &q.w, &out, &t), ROUTE_USE);
	assert_string_equal(out.token, "real");
	route_entry_clear(&out);
	routes_free(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_miss_then_hit),
		cmocka_unit_test(test_delayed_rejection_after_repair),
		cmocka_unit_test(test_two_racing_repairs),
		cmocka_unit_test(test_failed_fetch_hands_over),
		cmocka_unit_test(test_expiry_kept_across_refresh),
		cmocka_unit_test(test_drop_sandbox_voids_inflight),
		cmocka_unit_test(test_bounded),
		cmocka_unit_test(test_failed_fetches_do_not_evict),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

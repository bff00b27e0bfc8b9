/* Parked HTTP requests of the control plane: feed long-polls waiting for
 * updates, create/delete/pause/resume/migrate calls waiting for the
 * worker's ack, and requests that met their sandbox in a transition
 * waiting for it to end (then run again). A parked
 * request gets its reply computed on the loop (wake, ack or timer), then
 * lws is asked for a writable callback, where the reply is written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "cp/cp.h"
#include "log.h"
#include "metrics.h"

enum park_kind { PARK_FEED, PARK_ACK, PARK_SETTLE };

/* One parked request. Owner: cp->parked; the timer handle lives inside, so
 * the struct is freed from the timer's close callback. */
struct cp_park {
	struct cp_park *next;
	struct cp *cp;
	struct lws *wsi;
	struct cp_sess *sess;
	enum park_kind kind;
	char worker[TT_NAME_MAX + 1];
	int64_t rev;        /* feed: "after"; ack: the rev awaited */
	char sbx[TT_SBX_ID_LEN + 1];
	enum cp_wait what;
	uint64_t gen;       /* see struct cp_waitspec */
	char target[TT_NAME_MAX + 1];
	int forced;
	uint64_t resumed_from;
	uv_timer_t timer;
	int64_t stamped;    /* feed: when last_seen was last written for it */
	unsigned status;    /* reply, once ready */
	json_t *reply;
	/* PARK_SETTLE: what it waits for, the request body kept for the
	 * re-run (owned), and whether the re-run is due */
	struct cp_settle settle;
	json_t *body;
	int rerun;
	uint64_t since_us;
};

static void settle_wake(struct cp *cp, const char *sbx);

/* park_closed: final free after uv released the timer. */
static void park_closed(uv_handle_t *h)
{
	free(h->data);
}

/* park_free: unlinks p, detaches it from its session, frees it. */
static void park_free(struct cp *cp, struct cp_park *p)
{
	for (struct cp_park **pp = &cp->parked; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	if (p->sess != NULL)
		p->sess->park = NULL;
	json_decref(p->reply);
	p->reply = NULL;
	json_decref(p->body);
	p->body = NULL;
	uv_timer_stop(&p->timer);
	uv_close((uv_handle_t *)&p->timer, park_closed);
}

/* park_ready: the reply is known; ask lws for a chance to write it. */
static void park_ready(struct cp_park *p, unsigned status, json_t *reply)
{
	if (p->reply != NULL) { /* already answered */
		json_decref(reply);
		return;
	}
	if (reply == NULL)
		reply = json_pack("{s:s,s:s}", "error", "internal", "message",
		                  "out of memory");
	uv_timer_stop(&p->timer);
	p->status = status;
	p->reply = reply;
	lws_callback_on_writable(p->wsi);
}

/* park_new: links a parked request with a timeout. */
static struct cp_park *park_new(struct cp *cp, struct cp_sess *s,
                                struct lws *wsi, enum park_kind kind,
                                const char *worker, int64_t rev,
                                unsigned timeout_ms, uv_timer_cb on_timeout)
{
	struct cp_park *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return NULL;
	p->cp = cp;
	p->wsi = wsi;
	p->sess = s;
	p->kind = kind;
	p->rev = rev;
	p->stamped = tt_now();
	snprintf(p->worker, sizeof(p->worker), "%s", worker);
	uv_timer_init(cp->loop, &p->timer);
	p->timer.data = p;
	uv_timer_start(&p->timer, on_timeout, timeout_ms, 0);
	p->next = cp->parked;
	cp->parked = p;
	s->park = p;
	return p;
}

/* feed_seal: the signed envelope of update u for worker (feedsig.h):
 * "to" and "prev" added, the body signed by the signer's feed key. A new
 * reference, or NULL + err. */
static json_t *feed_seal(struct cp *cp, const char *worker, json_t *u,
                         int64_t prev, struct tt_err *err)
{
	char sig[FEEDSIG_SIG_B64_LEN + 1];
	_cleanup_free_ char *body = NULL;
	json_t *inner = json_copy(u);

	if (inner == NULL || json_object_set_new(inner, "to", json_string(worker)) ||
	    json_object_set_new(inner, "prev", json_integer((json_int_t)prev))) {
		json_decref(inner);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	body = json_dumps(inner, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(inner);
	if (body == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	if (cp_signer_feed_sign(&cp->signer, body, sig, err) < 0)
		return NULL;
	return json_pack("{s:O,s:O,s:s,s:s}", "rev", json_object_get(u, "rev"),
	                 "kind", json_object_get(u, "kind"), "body", body, "sig", sig);
}

/* feed_seal_all: replaces each update of ups (worker's, in rev order) by
 * its signed envelope, chained by prev. */
static int feed_seal_all(struct cp *cp, const char *worker, json_t *ups,
                         struct tt_err *err)
{
	int64_t prev = 0;
	size_t i;
	json_t *u;

	if (json_array_size(ups) > 0 &&
	    cpdb_feed_prev(cp->db, worker, json_integer_value(json_object_get(
	                   json_array_get(ups, 0), "rev")), &prev, err) < 0)
		return -1;
	json_array_foreach(ups, i, u) {
		json_t *env = feed_seal(cp, worker, u, prev, err);

		if (env == NULL) {
			log_error("feed: cannot sign rev %" JSON_INTEGER_FORMAT " for %s: %s",
			          json_integer_value(json_object_get(u, "rev")), worker,
			          err->msg);
			return -1;
		}
		prev = json_integer_value(json_object_get(u, "rev"));
		json_array_set_new(ups, i, env);
	}
	return 0;
}

/* feed_answer: {"rev":R,"updates":[...]} for worker after rev, each update
 * signed (feed_seal); NULL when there is nothing and nonempty is asked, or
 * on error (*err set). The newest rev is read first and nothing past it
 * is served: revs become visible in order (db.h), so every rev up to it
 * is there, and one another replica commits meanwhile waits for the next
 * answer instead of being skipped by the position this one gives. */
static json_t *feed_answer(struct cp *cp, const char *worker, int64_t after,
                           int nonempty, struct tt_err *err)
{
	int64_t latest = 0;
	json_t *ups;
	size_t n, got;

	if (cpdb_feed_latest(cp->db, &latest, err) < 0)
		return NULL;
	ups = cpdb_feed_since(cp->db, worker, after, CP_FEED_BATCH, err);
	if (ups == NULL)
		return NULL;
	n = got = json_array_size(ups);
	while (n > 0 && json_integer_value(json_object_get(
	                        json_array_get(ups, n - 1), "rev")) > latest)
		json_array_remove(ups, --n);
	if (n == 0 && nonempty) {
		json_decref(ups);
		return NULL;
	}
	if (got == CP_FEED_BATCH && n > 0) /* truncated: resume after the last */
		latest = json_integer_value(json_object_get(
		        json_array_get(ups, n - 1), "rev"));
	/* what the worker may acknowledge from now on (src/cp/workers.c) */
	if (cp_worker_sent(cp, worker, latest, err) < 0) {
		json_decref(ups);
		return NULL;
	}
	if (latest < after) /* a node ahead of us (restored cp): echo back */
		latest = after;
	if (feed_seal_all(cp, worker, ups, err) < 0) {
		json_decref(ups);
		return NULL;
	}
	return json_pack("{s:I,s:o}", "rev", (json_int_t)latest, "updates", ups);
}

/* feed_poll_timeout: wait elapsed with nothing new: empty answer. */
static void feed_poll_timeout(uv_timer_t *t)
{
	struct cp_park *p = t->data;
	struct tt_err err = { 0 };
	json_t *a = feed_answer(p->cp, p->worker, p->rev, 0, &err);

	if (a == NULL)
		park_ready(p, 500, json_pack("{s:s,s:s}", "error", "internal",
		                             "message", err.msg));
	else
		park_ready(p, 200, a);
}

/* feed_poll: answers at once when there are updates (or wait is 0), else
 * parks until feed_wake or the wait ends. */
int feed_poll(struct cp *cp, struct cp_sess *s, struct lws *wsi,
              const char *worker, int64_t after, int wait_secs)
{
	struct tt_err err = { 0 };
	json_t *a = feed_answer(cp, worker, after, wait_secs > 0, &err);

	if (a != NULL)
		return http_reply_json(wsi, 200, a);
	if (err.code != TT_OK)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	if (park_new(cp, s, wsi, PARK_FEED, worker, after,
	             (unsigned)wait_secs * 1000u, feed_poll_timeout) == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	metrics_inc("tether_cp_feed_parked_total", NULL);
	return 0;
}

/* wake_here: parked polls of worker (or of all, for NULL) with something
 * new now get it. */
static void wake_here(struct cp *cp, const char *worker)
{
	for (struct cp_park *p = cp->parked; p != NULL; p = p->next) {
		struct tt_err err = { 0 };
		json_t *a;

		if (p->kind != PARK_FEED || p->reply != NULL)
			continue;
		if (worker != NULL && strcmp(worker, p->worker) != 0)
			continue;
		a = feed_answer(cp, p->worker, p->rev, 1, &err);
		if (a != NULL)
			park_ready(p, 200, a);
	}
}

/* ack_refusal: an error reply that also shows the sandbox as it is now. */
static json_t *ack_refusal(struct cp *cp, const char *code, const char *msg,
                           const struct cp_sandbox *sb)
{
	return json_pack("{s:s,s:s,s:s,s:o}", "error", code, "message", msg,
	                 "state", sb->state, "sandbox", cp_sandbox_json(cp, sb));
}

/* ack_migrate_on: the migrate's pause completed and the cp began the
 * resume on the target (cp_migrate_continue, on the pause's ack): this
 * waiter now waits for that install's ack. */
static void ack_migrate_on(struct cp_park *p, const struct cp_sandbox *sb)
{
	p->what = CP_WAIT_RESUME;
	p->resumed_from = p->gen; /* the snapshot the pause just made */
	p->rev = sb->op_rev;
	p->gen = sb->generation;
	snprintf(p->worker, sizeof(p->worker), "%s", sb->worker);
	uv_timer_again(&p->timer);
}

/* ack_lifecycle: pause/resume/migrate waiters; returns without an answer
 * while the operation awaited is still pending. */
static void ack_lifecycle(struct cp_park *p, const struct cp_sandbox *sb)
{
	struct cp *cp = p->cp;
	char msg[CPDB_ERR_MAX + 96];
	json_t *o;

	if (p->what == CP_WAIT_PAUSE || p->what == CP_WAIT_MIGRATE) {
		if (strcmp(sb->state, "pausing") == 0 && sb->generation == p->gen) {
			/* still this pause; asked again (cpdb_pause_reask) when
			 * its rev moved: that one's ack answers */
			p->rev = sb->op_rev;
			return;
		}
		/* (a resume elsewhere is a relaunch after a failed pause) */
		if (p->what == CP_WAIT_MIGRATE && strcmp(sb->state, "resuming") == 0 &&
		    sb->generation == p->gen + 1 && strcmp(sb->worker, p->target) == 0) {
			ack_migrate_on(p, sb);
			return;
		}
		if (strcmp(sb->state, "paused") == 0 && sb->generation == p->gen) {
			if (p->what == CP_WAIT_MIGRATE && sb->migrate_to[0] != '\0')
				return; /* its resume is about to begin */
			if (p->what == CP_WAIT_MIGRATE)
				park_ready(p, 409, ack_refusal(cp, "conflict", sb->error[0] ?
				           sb->error : "paused, but not resumed", sb));
			else
				park_ready(p, 200, cp_sandbox_json(cp, sb));
			return;
		}
		snprintf(msg, sizeof(msg), "pause of generation %llu did not "
		         "complete: %s", (unsigned long long)p->gen,
		         sb->error[0] ? sb->error : sb->note[0] ? sb->note : sb->state);
		park_ready(p, 503, ack_refusal(cp, "unavailable", msg, sb));
		return;
	}
	if (strcmp(sb->state, "resuming") == 0 && sb->generation == p->gen) {
		p->rev = sb->op_rev; /* its install asked again: that one's ack */
		return;
	}
	if (strcmp(sb->state, "running") == 0 && sb->generation == p->gen) {
		o = cp_sandbox_json(cp, sb);
		json_object_set_new(o, "resumed_from",
		                    json_integer((json_int_t)p->resumed_from));
		if (p->forced)
			json_object_set_new(o, "forced", json_true());
		park_ready(p, 200, o);
		return;
	}
	snprintf(msg, sizeof(msg), "resume as generation %llu did not complete:"
	         " %s", (unsigned long long)p->gen,
	         sb->error[0] ? sb->error : sb->state);
	park_ready(p, 503, ack_refusal(cp, "unavailable", msg, sb));
}

/* ack_answer: what a waiting caller gets once the worker acked (or the
 * operation was settled otherwise). */
static void ack_answer(struct cp_park *p)
{
	struct cp *cp = p->cp;
	struct tt_err err = { 0 };
	struct cp_sandbox sb;
	int rc = cpdb_sandbox_get(cp->db, p->sbx, &sb, &err);

	if (rc <= 0) {
		park_ready(p, 500, json_pack("{s:s,s:s}", "error", "internal",
		           "message", rc < 0 ? err.msg : "sandbox vanished"));
		return;
	}
	switch (p->what) {
	case CP_WAIT_DELETE:
		if (strcmp(sb.state, "deleted") == 0)
			park_ready(p, 200, json_pack("{s:s,s:b}", "id", sb.id,
			                             "deleted", 1));
		else
			park_ready(p, 503, json_pack("{s:s,s:s}", "error",
			           "unavailable", "message", sb.error[0] ? sb.error :
			           "worker did not confirm the destroy"));
		return;
	case CP_WAIT_CREATE:
		if (strcmp(sb.state, "starting") == 0 && sb.op_rev > p->rev) {
			p->rev = sb.op_rev; /* asked again: that one's ack answers */
			return;
		}
		if (strcmp(sb.state, "running") == 0) {
			park_ready(p, 201, cp_sandbox_json(cp, &sb));
			return;
		}
		park_ready(p, 503, ack_refusal(cp, "unavailable", sb.error[0] ?
		           sb.error : "install not confirmed", &sb));
		return;
	default:
		ack_lifecycle(p, &sb);
		return;
	}
}

/* ack_timeout: the worker stayed silent for CP_ACK_WAIT_SECS. */
static void ack_timeout(uv_timer_t *t)
{
	struct cp_park *p = t->data;
	int64_t rev = p->rev;

	log_warn("worker %s did not acknowledge rev %lld in time", p->worker,
	         (long long)p->rev);
	if (p->what != CP_WAIT_CREATE && p->what != CP_WAIT_DELETE) {
		/* fail the operation (durably), then answer from its state */
		cp_op_expire(p->cp, p->sbx, rev);
		ack_answer(p);
		if (p->reply != NULL || p->rev != rev)
			return;
	}
	park_ready(p, 503, json_pack("{s:s,s:s,s:s}", "error", "unavailable",
	           "message", "worker did not acknowledge in time",
	           "sandbox", p->sbx));
}

/* feed_wait_ack: parks a lifecycle call until the worker acks w->rev. */
int feed_wait_ack(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                  const struct cp_waitspec *w)
{
	struct cp_park *p = park_new(cp, s, wsi, PARK_ACK, w->worker, w->rev,
	                             CP_ACK_WAIT_SECS * 1000u, ack_timeout);

	if (p == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	snprintf(p->sbx, sizeof(p->sbx), "%s", w->sbx);
	p->what = w->what;
	p->gen = w->gen;
	snprintf(p->target, sizeof(p->target), "%s", w->target ? w->target : "");
	p->forced = w->forced;
	p->resumed_from = w->resumed_from;
	/* the timer repeats so a migrate can re-arm it for its second ack */
	uv_timer_set_repeat(&p->timer, CP_ACK_WAIT_SECS * 1000u);
	return 0;
}

/* acked_here: resolves every ack waiter of worker covered by rev. */
static void acked_here(struct cp *cp, const char *worker, int64_t rev)
{
	for (struct cp_park *p = cp->parked; p != NULL; p = p->next) {
		if (p->kind == PARK_ACK && p->reply == NULL && p->rev <= rev &&
		    strcmp(p->worker, worker) == 0)
			ack_answer(p);
	}
	settle_wake(cp, NULL);
}

/* settled_here: lifecycle waiters of sbx get their answer if done. */
static void settled_here(struct cp *cp, const char *sbx)
{
	struct tt_err err = { 0 };
	struct cp_sandbox sb;
	/* A create's waiter too, once its sandbox left "starting" without
	 * an ack (the sweep failed it): answered now, not at its timeout. */
	bool create_over = cpdb_sandbox_get(cp->db, sbx, &sb, &err) == 1 &&
	                   strcmp(sb.state, "starting") != 0;

	for (struct cp_park *p = cp->parked; p != NULL; p = p->next) {
		if (p->kind == PARK_ACK && p->reply == NULL &&
		    (p->what != CP_WAIT_CREATE || create_over) &&
		    p->what != CP_WAIT_DELETE && strcmp(p->sbx, sbx) == 0)
			ack_answer(p);
	}
	settle_wake(cp, sbx);
}

/* settle_check: the transition p waits for is over (or its sandbox gone),
 * or its deadline passed: the request runs again at the next writable. */
static void settle_check(struct cp_park *p)
{
	struct tt_err err = { 0 };
	struct cp_sandbox sb;
	int rc;

	if (p->rerun)
		return;
	rc = cpdb_sandbox_get(p->cp->db, p->sbx, &sb, &err);
	if (rc == 1 && cp_settle_waits(p->cp, &sb, &p->settle) &&
	    uv_now(p->cp->loop) < p->sess->settle_deadline)
		return;
	if (rc == 1 && cp_settle_waits(p->cp, &sb, &p->settle))
		p->sess->settle_over = 1; /* answered as things are */
	p->rerun = 1;
	uv_timer_stop(&p->timer);
	metrics_observe_us("tether_cp_transition_wait_seconds", NULL,
	                   (uint64_t)uv_hrtime() / 1000u - p->since_us);
	lws_callback_on_writable(p->wsi);
}

/* settle_tick: the backstop of the events below (every state change a
 * waiter can wake on comes through feed_acked or feed_settled). */
static void settle_tick(uv_timer_t *t)
{
	settle_check(t->data);
}

/* settle_wake: transition waiters of sbx (NULL: all) look again. */
static void settle_wake(struct cp *cp, const char *sbx)
{
	for (struct cp_park *p = cp->parked; p != NULL; p = p->next) {
		if (p->kind == PARK_SETTLE &&
		    (sbx == NULL || strcmp(p->sbx, sbx) == 0))
			settle_check(p);
	}
}

/* feed_wait_settle: the first wait of a request sets its deadline from
 * X-Tether-Wait; a re-run that must wait again keeps it. */
int feed_wait_settle(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                     const char *sbx, const struct cp_settle *w, json_t *body)
{
	struct cp_park *p = park_new(cp, s, wsi, PARK_SETTLE, "", 0,
	                             CP_SETTLE_POLL_MS, settle_tick);

	if (p == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	uv_timer_set_repeat(&p->timer, CP_SETTLE_POLL_MS);
	snprintf(p->sbx, sizeof(p->sbx), "%s", sbx);
	p->settle = *w;
	p->body = json_incref(body);
	p->since_us = (uint64_t)uv_hrtime() / 1000u;
	metrics_inc("tether_cp_transition_waits_total", NULL);
	return 0;
}

/* feed_polling: a parked long-poll means the worker is alive right now. */
int feed_polling(struct cp *cp, const char *worker)
{
	for (struct cp_park *p = cp->parked; p != NULL; p = p->next) {
		if (p->kind == PARK_FEED && strcmp(p->worker, worker) == 0)
			return 1;
	}
	return 0;
}

/* ---- replicas (several cp on one PostgreSQL store) ------------------- */

/* The messages replicas send each other (cpdb_notify): "f WORKER" (or
 * "f *": all) new updates; "a WORKER REV" an ack applied; "s SBX" a
 * sandbox's pending operation settled otherwise. Each replica does for
 * its own parked requests what the sender did for its. */

/* feed_tell: "KIND A[ REV]" to the other replicas (none: nothing). */
static void feed_tell(struct cp *cp, char kind, const char *a, int64_t rev)
{
	struct tt_err err = { 0 };
	char msg[TT_NAME_MAX + TT_SBX_ID_LEN + 32];

	if (!cpdb_shared(cp->db))
		return;
	if (kind == 'a')
		snprintf(msg, sizeof(msg), "a %s %lld", a, (long long)rev);
	else
		snprintf(msg, sizeof(msg), "%c %s", kind, a);
	if (cpdb_notify(cp->db, msg, &err) < 0)
		log_warn("replicas: cannot notify (%s): %s", msg, err.msg);
}

/* feed_wake: new updates for worker (NULL = all workers), here and on
 * the other replicas. */
void feed_wake(struct cp *cp, const char *worker)
{
	wake_here(cp, worker);
	feed_tell(cp, 'f', worker ? worker : "*", 0);
}

/* feed_acked: worker acknowledged everything up to rev, here and there. */
void feed_acked(struct cp *cp, const char *worker, int64_t rev)
{
	acked_here(cp, worker, rev);
	feed_tell(cp, 'a', worker, rev);
}

/* feed_settled: the pending operation of sbx settled, here and there. */
void feed_settled(struct cp *cp, const char *sbx)
{
	settled_here(cp, sbx);
	feed_tell(cp, 's', sbx, 0);
}

/* feed_told: one message from another replica (see feed_tell). */
void feed_told(struct cp *cp, const char *msg)
{
	char a[TT_NAME_MAX + TT_SBX_ID_LEN + 2];
	long long rev = 0;

	if (strlen(msg) < 3 || msg[1] != ' ' ||
	    sscanf(msg + 2, "%65s %lld", a, &rev) < 1)
		return;
	if (msg[0] == 'f')
		wake_here(cp, strcmp(a, "*") == 0 ? NULL : a);
	else if (msg[0] == 'a')
		acked_here(cp, a, rev);
	else if (msg[0] == 's')
		settled_here(cp, a);
}

/* ack_recheck: what a lost message would have told p: answered once its
 * worker's ack (in the store) covers it, or its operation settled. */
static void ack_recheck(struct cp_park *p)
{
	struct tt_err err = { 0 };
	struct cp_worker w;
	struct cp_sandbox sb;

	if (cpdb_worker_get(p->cp->db, p->worker, &w, &err) == 1 && w.acked_rev >= p->rev) {
		ack_answer(p);
		return;
	}
	if (p->what == CP_WAIT_DELETE ||
	    (p->what == CP_WAIT_CREATE &&
	     (cpdb_sandbox_get(p->cp->db, p->sbx, &sb, &err) != 1 ||
	      strcmp(sb.state, "starting") == 0)))
		return;
	ack_answer(p); /* a pending operation is still waited for */
}

/* feed_recheck: the backstop of the messages (a replica's LISTEN
 * connection may have broken, and one the store cannot deliver is lost):
 * parked polls look for updates, ack waiters at the store, and polls
 * parked here keep their worker's liveness stamp fresh for the other
 * replicas (which do not see this poll). From the sweep. */
void feed_recheck(struct cp *cp)
{
	struct tt_err err = { 0 };
	int64_t now = tt_now();
	int64_t every = cp->worker_timeout / 3 > 1 ? cp->worker_timeout / 3 : 1;

	wake_here(cp, NULL);
	for (struct cp_park *p = cp->parked; p != NULL; p = p->next) {
		if (p->kind == PARK_ACK && p->reply == NULL)
			ack_recheck(p);
		if (p->kind == PARK_FEED && p->reply == NULL && now - p->stamped >= every) {
			p->stamped = now;
			if (cpdb_worker_seen(cp->db, p->worker, now, &err) < 0)
				log_warn("replicas: stamping %s: %s", p->worker, err.msg);
		}
	}
	settle_wake(cp, NULL);
}

/* feed_writable: writes a ready reply of this connection's parked request,
 * or runs again a request whose transition is over. */
int feed_writable(struct cp *cp, struct cp_sess *s, struct lws *wsi)
{
	struct cp_park *p = s->park;
	json_t *reply;
	unsigned status;
	int rc;

	if (p == NULL || p->wsi != wsi)
		return 0;
	if (p->kind == PARK_SETTLE) {
		if (!p->rerun)
			return 0;
		reply = json_incref(p->body); /* the body, for the re-run */
		park_free(cp, p);
		rc = cp_dispatch(cp, s, wsi, reply);
		json_decref(reply);
		return rc;
	}
	if (p->reply == NULL)
		return 0;
	reply = p->reply;
	status = p->status;
	p->reply = NULL;
	park_free(cp, p);
	return http_reply_json(wsi, status, reply);
}

/* feed_closed: the client hung up while parked. */
void feed_closed(struct cp *cp, struct cp_sess *s)
{
	if (s->park != NULL)
		park_free(cp, s->park);
}

/* feed_shutdown: drops every parked request. */
void feed_shutdown(struct cp *cp)
{
	while (cp->parked != NULL)
		park_free(cp, cp->parked);
}

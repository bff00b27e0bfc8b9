/* What node-api tells the control plane besides the feed's acks (SPEC §7:
 * a daemon that dies is restarted and picks up its state; a guest agent or
 * bridge that dies is re-activated):
 *
 * - lost executions: a {"op":"watch"} connection to the sbx-manager hears
 *   of every execution lost (its guest agent or bridge died; found without
 *   its processes after a restart); each becomes POST /v1/feed/lost, resent
 *   until the cp took it (the cp then relaunches it from its layer). The
 *   manager repeats what is still lost whenever the watch is opened again.
 * - the orderly stop: POST /v1/feed/drain until the cp says none of this
 *   worker's pauses is pending: every sandbox here is paused (a complete
 *   snapshot) before the manager stops, to resume here when we are back.
 *
 * One POST at a time per kind; every transfer bounded. The worker's credential
 * is in each transfer's own header list, wiped when it ends. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <sodium.h>

#include "cleanup.h"
#include "http.h"
#include "log.h"
#include "node/mgrconn.h"
#include "node/node.h"
#include "wire.h"
#include "wireop.h"

#define EV_RETRY_MS 1000u         /* a failed report, a lost watch */
#define EV_PENDING_MAX 4096       /* lost reports held for the cp */
#define EV_ANSWER_MAX (64u << 10)
#define EV_DRAIN_POLL_MS 250u
#define EV_DRAIN_CP_MS 3000u      /* give up draining without the cp */

/* One POST to the cp: its header list holds the worker's credential. */
struct ev_post {
	struct node *n;
	struct curl_slist *hdrs;
	char *ans;
	size_t ans_len;
	node_cp_done_fn done;
	void *arg;
};

struct node_events {
	struct node *n;
	struct wireconn *watch;
	uv_timer_t watch_timer;  /* reopen the watch */
	uv_timer_t report_timer; /* resend a report the cp did not take */
	json_t *pending;         /* lost reports for the cp, oldest first */
	bool reporting;          /* a POST /v1/feed/lost in flight */
	/* the orderly stop */
	uv_timer_t drain_timer;
	bool draining, drain_posting;
	uint64_t drain_deadline, drain_cp_ok;
	node_drained_fn drained;
	bool stopping;
	int inflight;            /* POSTs not ended yet: ev is freed after */
	int timers_open;         /* timers not closed yet: likewise */
};

static void ev_report_next(struct node_events *ev);
static void ev_watch_open(struct node_events *ev);
static void ev_drain_post(struct node_events *ev);
static void ev_maybe_free(struct node_events *ev);

/* ev_tick: the one timer callback: each timer runs its own step. */
static void ev_tick(uv_timer_t *t)
{
	struct node_events *ev = t->data;

	if (t == &ev->watch_timer)
		ev_watch_open(ev);
	else if (t == &ev->report_timer)
		ev_report_next(ev);
	else
		ev_drain_post(ev);
}

/* ev_post_write: the cp's answer, bounded. */
static size_t ev_post_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct ev_post *p = arg;
	size_t len = size * nmemb;
	char *nb;

	if (p->ans_len + len > EV_ANSWER_MAX ||
	    (nb = realloc(p->ans, p->ans_len + len + 1)) == NULL)
		return 0;
	p->ans = nb;
	memcpy(p->ans + p->ans_len, data, len);
	p->ans_len += len;
	p->ans[p->ans_len] = '\0';
	return len;
}

/* ev_post_done: hands the answer on (status 0: no answer), then frees the
 * transfer, its token header wiped first. */
static void ev_post_done(CURL *easy, CURLcode rc, void *arg)
{
	struct ev_post *p = arg;
	long status = 0;
	json_t *ans = NULL;

	if (rc == CURLE_OK)
		curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
	else
		urllist_failed(&p->n->cps, easy, rc); /* the next goes elsewhere */
	curl_easy_cleanup(easy);
	if (status != 0 && p->ans != NULL)
		ans = json_loadb(p->ans, p->ans_len, JSON_REJECT_DUPLICATES, NULL);
	if (p->done != NULL)
		p->done(p->arg, status, ans);
	json_decref(ans);
	for (struct curl_slist *s = p->hdrs; s != NULL; s = s->next)
		sodium_memzero(s->data, strlen(s->data));
	curl_slist_free_all(p->hdrs);
	free(p->ans);
	free(p);
}

/* node_cp_post: see node.h. */
int node_cp_post(struct node *n, const char *path, json_t *body, long timeout_ms,
                 node_cp_done_fn done, void *arg)
{
	char url[1024], auth[NODE_TOKEN_MAX + 64];
	_cleanup_free_ char *enc = json_dumps(body, JSON_COMPACT);
	struct tt_err err = { 0 };
	struct ev_post *p = enc ? calloc(1, sizeof(*p)) : NULL;
	CURL *easy = p ? curl_easy_init() : NULL;

	if (easy == NULL) {
		free(p);
		return -1;
	}
	p->n = n;
	p->done = done;
	p->arg = arg;
	snprintf(auth, sizeof(auth), "Authorization: Worker %s", n->node_token);
	p->hdrs = curl_slist_append(NULL, auth);
	sodium_memzero(auth, sizeof(auth));
	if (p->hdrs != NULL)
		p->hdrs = curl_slist_append(p->hdrs, "Content-Type: application/json");
	snprintf(url, sizeof(url), "%s%s", urllist_pick(&n->cps, 0), path);
	curl_easy_setopt(easy, CURLOPT_URL, url);
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, p->hdrs);
	http_easy_direct(easy);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, ev_post_write);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, p);
	curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, enc);
	if (p->hdrs == NULL || httpc_start(n->httpc, easy, ev_post_done, p, &err) < 0) {
		curl_easy_cleanup(easy);
		curl_slist_free_all(p->hdrs);
		free(p);
		return -1;
	}
	return 0;
}

/* ev_post: node_cp_post for the events below (counted, so that a stopped
 * ev is freed only once none is in flight). */
static int ev_post(struct node_events *ev, const char *path, json_t *body,
                   long timeout_ms, node_cp_done_fn done)
{
	if (node_cp_post(ev->n, path, body, timeout_ms, done, ev) < 0)
		return -1;
	ev->inflight++;
	return 0;
}

/* ev_ended: one of ours ended: false when ev is stopped (freed when the
 * last one ends). */
static bool ev_ended(struct node_events *ev)
{
	ev->inflight--;
	if (!ev->stopping)
		return true;
	ev_maybe_free(ev);
	return false;
}

/* ---- lost executions ---------------------------------------------------- */

/* ev_report_done: taken (200, 4xx: never again) or resent later. */
static void ev_report_done(void *arg, long status, json_t *ans)
{
	struct node_events *ev = arg;
	json_t *r;

	if (!ev_ended(ev))
		return;
	r = json_array_get(ev->pending, 0);
	ev->reporting = false;
	if (status >= 200 && status < 500) {
		if (status != 200)
			log_warn("the control plane refused a lost-execution report "
			         "(%ld)", status);
		else if (json_is_true(json_object_get(ans, "relaunched")))
			log_info("lost %s generation %" JSON_INTEGER_FORMAT ": the control "
			         "plane relaunches it", json_string_value(json_object_get(r,
			         "sandbox")), json_integer_value(json_object_get(r,
			         "generation")));
		json_array_remove(ev->pending, 0);
		ev_report_next(ev);
		return;
	}
	uv_timer_start(&ev->report_timer, ev_tick, EV_RETRY_MS, 0);
}

/* ev_report_next: the oldest report not yet taken goes out. */
static void ev_report_next(struct node_events *ev)
{
	if (ev->stopping || ev->reporting || json_array_size(ev->pending) == 0)
		return;
	if (ev_post(ev, "/v1/feed/lost", json_array_get(ev->pending, 0), 5000L,
	            ev_report_done) < 0) {
		uv_timer_start(&ev->report_timer, ev_tick,
		               EV_RETRY_MS, 0);
		return;
	}
	ev->reporting = true;
}

/* ev_same: two reports of one execution. */
static bool ev_same(json_t *a, json_t *b)
{
	return json_equal(json_object_get(a, "sandbox"), json_object_get(b, "sandbox")) &&
	       json_equal(json_object_get(a, "generation"), json_object_get(b, "generation")) &&
	       json_equal(json_object_get(a, "activation"), json_object_get(b, "activation"));
}

/* ev_on_frame: {"lost":{…}} from the manager becomes a report (once). */
static void ev_on_frame(void *arg, const struct wire_frame *f)
{
	struct node_events *ev = arg;
	json_t *o, *l, *r, *q;
	size_t i;

	if (f->type != WIRE_DATA_OUT)
		return;
	o = json_loadb((const char *)f->payload, f->len, JSON_REJECT_DUPLICATES, NULL);
	l = json_object_get(o, "lost");
	r = json_is_object(l) ? json_pack("{s:s,s:O?,s:O?,s:O?,s:O?,s:O?}", "worker",
	                                  ev->n->id, "sandbox", json_object_get(l, "sandbox"),
	                                  "generation", json_object_get(l, "generation"),
	                                  "activation", json_object_get(l, "activation"),
	                                  "reason", json_object_get(l, "reason"),
	                                  "reactivate", json_object_get(l, "reactivate"))
	                      : NULL;
	json_decref(o);
	if (r == NULL)
		return;
	json_array_foreach(ev->pending, i, q) {
		if (ev_same(q, r)) {
			json_decref(r);
			return;
		}
	}
	log_warn("execution %s generation %" JSON_INTEGER_FORMAT " lost (%s): "
	         "asking the control plane to relaunch it",
	         json_string_value(json_object_get(r, "sandbox")),
	         json_integer_value(json_object_get(r, "generation")),
	         json_string_value(json_object_get(r, "reason")));
	if (json_array_size(ev->pending) >= EV_PENDING_MAX)
		json_array_remove(ev->pending, 0);
	json_array_append_new(ev->pending, r);
	ev_report_next(ev);
}

/* ev_on_end: the watch broke (the manager restarted?): opened again. */
static void ev_on_end(void *arg, const struct tt_err *err)
{
	struct node_events *ev = arg;

	wireconn_close(ev->watch);
	ev->watch = NULL;
	if (ev->stopping)
		return;
	log_warn("watching the manager for lost executions: %s; again in %u ms",
	         err->msg, EV_RETRY_MS);
	uv_timer_start(&ev->watch_timer, ev_tick, EV_RETRY_MS, 0);
}

/* ev_watch_open: {"op":"watch"} on its own connection (never pooled: it
 * does not end). */
static void ev_watch_open(struct node_events *ev)
{
	static const struct wireconn_cbs cbs = { ev_on_frame, ev_on_end, NULL };
	struct tt_err err = { 0 };
	json_t *req = json_pack("{s:s}", "op", wireop_name(WIRE_OP_WATCH));

	if (ev->stopping || ev->watch != NULL)
		goto out;
	ev->watch = req ? mgrconn_open(ev->n, req, &cbs, ev,
	                               &err) : NULL;
	if (ev->watch == NULL)
		uv_timer_start(&ev->watch_timer, ev_tick, EV_RETRY_MS, 0);
out:
	json_decref(req);
}

/* ---- the orderly stop ---------------------------------------------------- */

/* ev_drain_end: the pauses are done (or cannot be): the stop goes on. */
static void ev_drain_end(struct node_events *ev, const char *how)
{
	ev->draining = false;
	uv_timer_stop(&ev->drain_timer);
	log_info("stop: %s", how);
	ev->drained(ev->n);
}

/* ev_drain_done: {"pending":N}: again until 0. */
static void ev_drain_done(void *arg, long status, json_t *ans)
{
	struct node_events *ev = arg;
	json_t *pend = json_object_get(ans, "pending");
	uint64_t now;

	if (!ev_ended(ev))
		return;
	now = uv_now(ev->n->loop);
	ev->drain_posting = false;
	if (!ev->draining)
		return;
	if (status == 200 && json_is_integer(pend)) {
		ev->drain_cp_ok = now;
		if (json_integer_value(pend) == 0) {
			ev_drain_end(ev, "every sandbox here is paused");
			return;
		}
	}
	if (now >= ev->drain_deadline) {
		ev_drain_end(ev, "pauses still pending at the deadline; stopping anyway");
		return;
	}
	if (now - ev->drain_cp_ok >= EV_DRAIN_CP_MS) {
		ev_drain_end(ev, "the control plane does not answer; stopping without "
		             "pausing (sandboxes relaunch from their layers)");
		return;
	}
	uv_timer_start(&ev->drain_timer, ev_tick, EV_DRAIN_POLL_MS, 0);
}

/* ev_drain_post: one POST /v1/feed/drain. */
static void ev_drain_post(struct node_events *ev)
{
	json_t *body = json_pack("{s:s}", "worker", ev->n->id);

	if (ev->draining && !ev->drain_posting && body != NULL &&
	    ev_post(ev, "/v1/feed/drain", body, 5000L, ev_drain_done) == 0)
		ev->drain_posting = true;
	else if (ev->draining && !ev->drain_posting)
		uv_timer_start(&ev->drain_timer, ev_tick,
		               EV_DRAIN_POLL_MS, 0);
	json_decref(body);
}

/* node_drain: see node.h. */
void node_drain(struct node *n, uint64_t within_ms, node_drained_fn drained)
{
	struct node_events *ev = n->events;

	if (ev == NULL || n->httpc == NULL) {
		drained(n);
		return;
	}
	if (ev->draining) { /* asked again: stop now */
		ev_drain_end(ev, "asked again: stopping without waiting for pauses");
		return;
	}
	ev->draining = true;
	ev->drained = drained;
	ev->drain_deadline = uv_now(n->loop) + within_ms;
	ev->drain_cp_ok = uv_now(n->loop);
	log_info("stop: pausing this worker's sandboxes first (at most %" PRIu64
	         " s)", within_ms / 1000);
	ev_drain_post(ev);
}

/* ---- life -------------------------------------------------------------- */

/* node_events_start: see node.h. */
int node_events_start(struct node *n, struct tt_err *err)
{
	struct node_events *ev = calloc(1, sizeof(*ev));

	if (ev == NULL || (ev->pending = json_array()) == NULL) {
		free(ev);
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	}
	ev->n = n;
	uv_timer_init(n->loop, &ev->watch_timer);
	uv_timer_init(n->loop, &ev->report_timer);
	uv_timer_init(n->loop, &ev->drain_timer);
	ev->watch_timer.data = ev->report_timer.data = ev->drain_timer.data = ev;
	ev->timers_open = 3;
	n->events = ev;
	ev_watch_open(ev);
	return 0;
}

/* ev_maybe_free: once stopped, with no timer or transfer left. */
static void ev_maybe_free(struct node_events *ev)
{
	if (!ev->stopping || ev->inflight > 0 || ev->timers_open > 0)
		return;
	json_decref(ev->pending);
	free(ev);
}

/* ev_closed: one of the timers is closed. */
static void ev_closed(uv_handle_t *h)
{
	struct node_events *ev = h->data;

	ev->timers_open--;
	ev_maybe_free(ev);
}

/* node_events_stop: see node.h. */
void node_events_stop(struct node *n)
{
	struct node_events *ev = n->events;

	if (ev == NULL)
		return;
	n->events = NULL;
	ev->stopping = true;
	wireconn_close(ev->watch);
	ev->watch = NULL;
	uv_close((uv_handle_t *)&ev->watch_timer, ev_closed);
	uv_close((uv_handle_t *)&ev->report_timer, ev_closed);
	uv_close((uv_handle_t *)&ev->drain_timer, ev_closed);
}

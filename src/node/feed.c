/* The worker side of the update feed (protocol.md "cp <-> node"): register,
 * long-poll GET /v1/feed, hand the updates to the manager (feed.apply, which
 * persists before applying), then POST /v1/feed/ack with its results. On cp
 * errors it backs off and keeps going; the node keeps serving meanwhile. */
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

#define FEED_WAIT_S 25
#define FEED_POLL_TIMEOUT_MS ((FEED_WAIT_S + 15) * 1000L)
#define FEED_CALL_TIMEOUT_MS 10000L
#define FEED_RESP_MAX (16u << 20)
#define FEED_BACKOFF_MIN_MS 1000u
#define FEED_BACKOFF_MAX_MS 5000u
#define FEED_BATCH_MAX 64

enum feed_state { FS_REGISTER, FS_POLL, FS_APPLY, FS_ACK };

struct node_feed {
	struct node *n;
	uv_timer_t timer;
	unsigned backoff_ms;
	enum feed_state st;
	CURL *easy;               /* in flight (owned by the httpc meanwhile) */
	struct curl_slist *hdrs;  /* holds the credential: zeroed on stop */
	char *resp;               /* response body (owned) */
	size_t resp_len;
	bool resp_over;
	uint64_t poll_started;    /* uv_now of the last poll */
	json_t *updates;          /* updates being applied (owned) */
	size_t next;
	json_t *results;          /* ack results being gathered (owned) */
	bool refused;             /* the manager refused an update (its
	                           * signature or order): ack, then back off */
	bool stopping;
};

static void feed_step(struct node_feed *f);

/* feed_write: curl body sink, bounded. */
static size_t feed_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct node_feed *f = arg;
	size_t len = size * nmemb;
	char *nb;

	if (f->resp_len + len > FEED_RESP_MAX) {
		f->resp_over = true;
		return 0; /* aborts the transfer */
	}
	nb = realloc(f->resp, f->resp_len + len + 1);
	if (nb == NULL)
		return 0;
	f->resp = nb;
	memcpy(f->resp + f->resp_len, data, len);
	f->resp_len += len;
	f->resp[f->resp_len] = '\0';
	return len;
}

/* feed_on_timer: backoff over, retry the current step. */
static void feed_on_timer(uv_timer_t *t)
{
	feed_step(t->data);
}

/* feed_retry: schedules the current step again after the backoff, which
 * doubles up to its cap. */
static void feed_retry(struct node_feed *f)
{
	unsigned ms = f->backoff_ms ? f->backoff_ms : FEED_BACKOFF_MIN_MS;

	if (f->stopping)
		return;
	f->backoff_ms = ms * 2 > FEED_BACKOFF_MAX_MS ? FEED_BACKOFF_MAX_MS : ms * 2;
	uv_timer_start(&f->timer, feed_on_timer, ms, 0);
}

/* feed_next: moves to state st and runs it after delay_ms. */
static void feed_next(struct node_feed *f, enum feed_state st, uint64_t delay_ms)
{
	f->st = st;
	if (f->stopping)
		return;
	uv_timer_start(&f->timer, feed_on_timer, delay_ms, 0);
}

static void feed_on_http_done(CURL *easy, CURLcode rc, void *arg);

/* feed_http: starts one request to the cp; body (may be NULL) is sent as
 * JSON (POST). The answer lands in feed_on_http_done. */
static int feed_http(struct node_feed *f, const char *url, json_t *body,
                     long timeout_ms)
{
	struct tt_err err = { 0 };
	_cleanup_free_ char *enc = NULL;
	CURL *easy;

	if (body != NULL) {
		enc = json_dumps(body, JSON_COMPACT);
		if (enc == NULL)
			return -1;
	}
	easy = curl_easy_init();
	if (easy == NULL)
		return -1;
	free(f->resp);
	f->resp = NULL;
	f->resp_len = 0;
	f->resp_over = false;
	curl_easy_setopt(easy, CURLOPT_URL, url);
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, f->hdrs);
	http_easy_direct(easy);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, feed_write);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, f);
	if (enc != NULL)
		curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, enc);
	if (httpc_start(f->n->httpc, easy, feed_on_http_done, f, &err) < 0) {
		curl_easy_cleanup(easy);
		log_warn("feed: %s", err.msg);
		return -1;
	}
	f->easy = easy;
	return 0;
}

/* feed_register: POST /v1/workers/register (idempotent on the cp). */
static void feed_register(struct node_feed *f)
{
	struct node *n = f->n;
	char url[1024];
	json_t *body = json_pack("{s:s,s:s}", "id", n->id, "node_url", n->node_url);

	snprintf(url, sizeof(url), "%s/v1/workers/register", urllist_pick(&n->cps, 0));
	if (body == NULL || feed_http(f, url, body, FEED_CALL_TIMEOUT_MS) < 0)
		feed_retry(f);
	json_decref(body);
}

/* feed_poll: GET /v1/feed after the manager's applied revision. */
static void feed_poll(struct node_feed *f)
{
	struct node *n = f->n;
	char url[1024];

	snprintf(url, sizeof(url), "%s/v1/feed?worker=%s&after=%" PRIu64 "&wait=%d",
	         urllist_pick(&n->cps, 0), n->id, n->applied_rev, FEED_WAIT_S);
	f->poll_started = uv_now(n->loop);
	if (feed_http(f, url, NULL, FEED_POLL_TIMEOUT_MS) < 0)
		feed_retry(f);
}

/* feed_ack: POST /v1/feed/ack with what the manager reported. */
static void feed_ack(struct node_feed *f)
{
	struct node *n = f->n;
	char url[1024];
	json_t *body;

	if (f->results == NULL)
		f->results = json_array();
	body = json_pack("{s:s,s:I,s:O}", "worker", n->id, "rev",
	                 (json_int_t)n->applied_rev, "results", f->results);
	snprintf(url, sizeof(url), "%s/v1/feed/ack", urllist_pick(&n->cps, 0));
	if (body == NULL || feed_http(f, url, body, FEED_CALL_TIMEOUT_MS) < 0)
		feed_retry(f);
	json_decref(body);
}

static void feed_apply(struct node_feed *f);
static void feed_on_applied(void *arg, json_t *result, const struct tt_err *err);

/* ---- pause progress (manager -> node-api -> cp, best effort) ---------- */

#define FEED_PROGRESS_MIN_MS 200 /* at most 5 reports a second */

/* prog_done: the next report may go (the cp's answer is not needed). */
static void prog_done(void *arg, long status, json_t *answer)
{
	struct node *n = arg;

	(void)status;
	(void)answer;
	n->progress_inflight = false;
}

/* feed_progress: forwards one manager progress frame {"progress":{...}} as
 * POST /v1/feed/progress; dropped when one is running or the last was less
 * than FEED_PROGRESS_MIN_MS ago (the next one carries newer numbers). */
static void feed_progress(struct node_feed *f, json_t *frame)
{
	struct node *n = f->n;
	json_t *pr = json_object_get(frame, "progress");
	json_t *body;

	if (!json_is_object(pr) || n->progress_inflight ||
	    uv_now(n->loop) - n->progress_last_ms < FEED_PROGRESS_MIN_MS)
		return;
	body = json_pack("{s:s,s:O?,s:O?,s:O?,s:O?}", "worker", n->id, "rev",
	                 json_object_get(pr, "rev"), "sandbox",
	                 json_object_get(pr, "sandbox"), "bytes",
	                 json_object_get(pr, "bytes"), "total", json_object_get(pr, "total"));
	if (body != NULL &&
	    node_cp_post(n, "/v1/feed/progress", body, 3000L, prog_done, n) == 0) {
		n->progress_inflight = true;
		n->progress_last_ms = uv_now(n->loop);
	}
	json_decref(body);
}

/* Context of the feed.apply call in flight (one at a time). */
struct feed_callst {
	struct node_feed *f;
	struct wireconn *c;
};

/* call_end: reports the call's outcome once and closes it. */
static void call_end(struct feed_callst *st, json_t *result, const struct tt_err *err)
{
	struct node_feed *f = st->f;

	wireconn_close(st->c);
	free(st);
	feed_on_applied(f, result, err);
}

/* call_frame: progress frames (DATA_OUT) until RESULT or ERROR. */
static void call_frame(void *arg, const struct wire_frame *fr)
{
	struct feed_callst *st = arg;
	struct tt_err err = { 0 };
	json_t *obj;

	if (fr->type != WIRE_RESULT && fr->type != WIRE_ERROR && fr->type != WIRE_DATA_OUT)
		return;
	obj = json_loadb((const char *)fr->payload, fr->len, JSON_REJECT_DUPLICATES, NULL);
	if (!json_is_object(obj)) {
		json_decref(obj);
		if (fr->type == WIRE_DATA_OUT)
			return;
		tt_err_set(&err, TT_ERR_MALFORMED, "manager sent invalid JSON");
		call_end(st, NULL, &err);
		return;
	}
	if (fr->type == WIRE_DATA_OUT) {
		if (!st->f->stopping)
			feed_progress(st->f, obj);
		json_decref(obj);
		return;
	}
	if (fr->type == WIRE_RESULT) {
		call_end(st, obj, NULL);
		return;
	}
	tt_err_set(&err, TT_ERR_TRANSPORT, "manager: %s: %s",
	           json_string_value(json_object_get(obj, "error")) ?: "error",
	           json_string_value(json_object_get(obj, "message")) ?: "");
	json_decref(obj);
	call_end(st, NULL, &err);
}

/* call_gone: the manager connection ended before a RESULT. */
static void call_gone(void *arg, const struct tt_err *err)
{
	call_end(arg, NULL, err);
}

/* feed_call: sends one feed.apply to the manager; the answer (after any
 * progress frames) lands in feed_on_applied. */
static int feed_call(struct node_feed *f, json_t *req, struct tt_err *err)
{
	static const struct wireconn_cbs cbs = { .on_frame = call_frame, .on_end = call_gone };
	struct feed_callst *st = calloc(1, sizeof(*st));

	if (st == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	st->f = f;
	st->c = mgrconn_open(f->n, req, &cbs, st, err);
	if (st->c == NULL) {
		free(st);
		return -1;
	}
	return 0;
}

/* feed_on_applied: the manager's answer to one feed.apply batch. */
static void feed_on_applied(void *arg, json_t *result, const struct tt_err *err)
{
	struct node_feed *f = arg;
	json_t *rev, *res;
	size_t i;
	json_t *v;

	if (f->stopping) {
		json_decref(result);
		return;
	}
	if (result == NULL) {
		/* Nothing acknowledged: the same updates come again on the next
		 * poll (the manager skips what it already applied). */
		log_error("feed: manager did not apply updates: %s", err->msg);
		json_decref(f->updates);
		f->updates = NULL;
		f->st = FS_POLL;
		feed_retry(f);
		return;
	}
	rev = json_object_get(result, "applied_rev");
	res = json_object_get(result, "results");
	if (!json_is_integer(rev) || json_integer_value(rev) < 0 ||
	    !json_is_array(res)) {
		log_error("feed: manager answered feed.apply without applied_rev/results");
		json_decref(result);
		json_decref(f->updates);
		f->updates = NULL;
		f->st = FS_POLL;
		feed_retry(f);
		return;
	}
	f->n->applied_rev = (uint64_t)json_integer_value(rev);
	if (f->results == NULL)
		f->results = json_array();
	json_array_foreach(res, i, v) {
		json_t *ok = json_object_get(v, "ok");

		if (json_is_string(json_object_get(v, "refused"))) {
			/* Not from the cp as it was sent, or out of order: not
			 * applied. Reported in the ack; polled again after a
			 * backoff (the cp serves what it signed). */
			log_error("feed: the manager refused update rev %" JSON_INTEGER_FORMAT
			          ": %s", json_integer_value(json_object_get(v, "rev")),
			          json_string_value(json_object_get(v, "error")) ?: "?");
			f->refused = true;
		} else if (json_is_false(ok))
			log_warn("feed: update rev %" JSON_INTEGER_FORMAT " failed: %s",
			         json_integer_value(json_object_get(v, "rev")),
			         json_string_value(json_object_get(v, "error")) ?: "?");
		json_array_append(f->results, v);
	}
	json_decref(result);
	if (f->refused) { /* the rest of this answer cannot follow it */
		json_decref(f->updates);
		f->updates = NULL;
		f->st = FS_ACK;
		feed_ack(f);
		return;
	}
	feed_apply(f);
}

/* feed_apply: sends the next batch of updates (as many as fit in one wire
 * frame, at most FEED_BATCH_MAX) to the manager; acks once all are done. */
static void feed_apply(struct node_feed *f)
{
	struct node *n = f->n;
	struct tt_err err = { 0 };
	size_t total = json_array_size(f->updates);
	size_t count;
	json_t *req = NULL;

	/* Skip what the manager already applied (re-delivery after errors). */
	while (f->next < total) {
		json_t *r = json_object_get(json_array_get(f->updates, f->next), "rev");

		if ((uint64_t)json_integer_value(r) > n->applied_rev)
			break;
		f->next++;
	}
	if (f->next >= total) {
		json_decref(f->updates);
		f->updates = NULL;
		f->st = FS_ACK;
		feed_ack(f);
		return;
	}
	count = total - f->next;
	if (count > FEED_BATCH_MAX)
		count = FEED_BATCH_MAX;
	for (;;) {
		json_t *arr = json_array();
		_cleanup_free_ char *enc = NULL;

		for (size_t i = 0; i < count; i++)
			json_array_append(arr, json_array_get(f->updates, f->next + i));
		req = json_pack("{s:s,s:o}", "op", wireop_name(WIRE_OP_FEED_APPLY), "updates", arr);
		enc = req ? json_dumps(req, JSON_COMPACT) : NULL;
		if (enc != NULL && strlen(enc) <= WIRE_PAYLOAD_MAX)
			break;
		json_decref(req);
		req = NULL;
		if (enc == NULL || count == 1) {
			log_error("feed: update rev %" JSON_INTEGER_FORMAT
			          " does not fit in one frame; skipping the poll",
			          json_integer_value(json_object_get(
			                  json_array_get(f->updates, f->next), "rev")));
			json_decref(f->updates);
			f->updates = NULL;
			f->st = FS_POLL;
			feed_retry(f);
			return;
		}
		count /= 2;
	}
	f->next += count;
	if (feed_call(f, req, &err) < 0) {
		log_error("feed: %s", err.msg);
		f->next -= count;
		feed_retry(f);
	}
	json_decref(req);
}

/* feed_take_updates: validates a poll answer; keeps its updates. */
static int feed_take_updates(struct node_feed *f, json_t *obj)
{
	json_t *ups = json_object_get(obj, "updates");
	uint64_t last = f->n->applied_rev;
	size_t i;
	json_t *u;

	if (!json_is_array(ups))
		return -1;
	json_array_foreach(ups, i, u) {
		json_t *rev = json_object_get(u, "rev");

		if (!json_is_object(u) || !json_is_integer(rev) ||
		    json_integer_value(rev) <= 0 ||
		    !json_is_string(json_object_get(u, "kind")))
			return -1;
		/* The feed is ordered; anything else is a cp bug we refuse. */
		if ((uint64_t)json_integer_value(rev) <= last && i > 0)
			return -1;
		last = (uint64_t)json_integer_value(rev);
	}
	f->updates = json_incref(ups);
	f->next = 0;
	return 0;
}

/* feed_on_http_done: one cp request finished; advance the state machine. */
static void feed_on_http_done(CURL *easy, CURLcode rc, void *arg)
{
	struct node_feed *f = arg;
	long status = 0;
	json_t *obj = NULL;
	json_error_t jerr;

	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
	/* a replica gone: the next request goes to another (an ack too: its
	 * updates are in the one database; the position is ours) */
	if (rc != CURLE_OK && urllist_failed(&f->n->cps, easy, rc) && f->n->cps.n > 1)
		log_warn("feed: control plane %s failed (%s); failing over",
		         f->n->cps.url[f->n->cps.cur], curl_easy_strerror(rc));
	curl_easy_cleanup(easy);
	f->easy = NULL;
	if (f->stopping)
		return;
	if (rc == CURLE_OK && status == 409 && f->st == FS_ACK) {
		/* The cp has not sent us that rev (docs/API.md, /v1/feed/ack):
		 * a cp restored from an older state. Polling again makes it
		 * send what it has; the ack after the next apply covers ours. */
		log_warn("feed: the cp refused our ack of rev %" PRIu64 " as beyond what"
		         " it sent; polling again", f->n->applied_rev);
		json_decref(f->results);
		f->results = NULL;
		f->backoff_ms = 0;
		feed_next(f, FS_POLL, FEED_BACKOFF_MIN_MS);
		return;
	}
	if (rc != CURLE_OK || status != 200) {
		if (rc != CURLE_OK)
			log_warn("feed: cp unreachable (%s); retrying",
			         f->resp_over ? "answer too large" : curl_easy_strerror(rc));
		else
			log_warn("feed: cp answered %ld; retrying", status);
		/* Contact lost: register again first (the cp may have restarted),
		 * except for a pending ack, which is retried as such. */
		if (f->st != FS_ACK)
			f->st = FS_REGISTER;
		feed_retry(f);
		return;
	}
	if (f->resp != NULL)
		obj = json_loadb(f->resp, f->resp_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(obj)) {
		json_decref(obj);
		log_warn("feed: cp sent invalid JSON; retrying");
		feed_retry(f);
		return;
	}
	f->backoff_ms = 0;
	switch (f->st) {
	case FS_REGISTER:
		log_info("registered with the control plane as %s (%s), feed from rev %" PRIu64,
		         f->n->id, f->n->node_url, f->n->applied_rev);
		/* Acknowledge what the manager applied before polling: a node-api
		 * that died between a manager's apply and its ack left those
		 * updates applied but unacknowledged, and the cp learns their
		 * outcome only from an ack that covers them (a pause's: it asks
		 * again, answered from the store). Waiting for the next update
		 * to ack them let a pause time out (30 s), its sandbox fail and
		 * be resumed from the older snapshot, losing acknowledged writes. */
		feed_next(f, FS_ACK, 0);
		break;
	case FS_POLL:
		if (feed_take_updates(f, obj) < 0) {
			log_warn("feed: malformed feed answer; retrying");
			feed_retry(f);
			break;
		}
		if (json_array_size(f->updates) == 0) {
			json_decref(f->updates);
			f->updates = NULL;
			/* A cp that answers at once with nothing must not make us spin. */
			feed_next(f, FS_POLL,
			          uv_now(f->n->loop) - f->poll_started < 500 ? 500 : 0);
			break;
		}
		f->st = FS_APPLY;
		feed_apply(f);
		break;
	case FS_APPLY:
		break; /* no HTTP in this state */
	case FS_ACK:
		json_decref(f->results);
		f->results = NULL;
		if (f->refused) {
			f->refused = false;
			f->st = FS_POLL;
			feed_retry(f);
			break;
		}
		feed_next(f, FS_POLL, 0);
		break;
	}
	json_decref(obj);
}

/* feed_step: runs the current state (from the timer). */
static void feed_step(struct node_feed *f)
{
	switch (f->st) {
	case FS_REGISTER:
		feed_register(f);
		break;
	case FS_POLL:
		feed_poll(f);
		break;
	case FS_APPLY:
		feed_apply(f);
		break;
	case FS_ACK:
		feed_ack(f);
		break;
	}
}

/* node_feed_start: see node.h. */
int node_feed_start(struct node *n, struct tt_err *err)
{
	struct node_feed *f = calloc(1, sizeof(*f));
	char auth[NODE_TOKEN_MAX + 64];
	struct curl_slist *h;

	if (f == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	f->n = n;
	snprintf(auth, sizeof(auth), "Authorization: Worker %s", n->node_token);
	h = curl_slist_append(NULL, auth);
	sodium_memzero(auth, sizeof(auth));
	if (h != NULL)
		f->hdrs = curl_slist_append(h, "Content-Type: application/json");
	if (h == NULL || f->hdrs == NULL) {
		curl_slist_free_all(h);
		free(f);
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	}
	uv_timer_init(n->loop, &f->timer);
	f->timer.data = f;
	n->feed = f;
	feed_next(f, FS_REGISTER, 0);
	return 0;
}

/* feed_closed: frees the feed once its timer is closed. */
static void feed_closed(uv_handle_t *h)
{
	struct node_feed *f = h->data;

	for (struct curl_slist *s = f->hdrs; s != NULL; s = s->next)
		sodium_memzero(s->data, strlen(s->data));
	curl_slist_free_all(f->hdrs);
	free(f->resp);
	json_decref(f->updates);
	json_decref(f->results);
	free(f);
}

/* node_feed_stop: see node.h; a transfer in flight is aborted by httpc_free. */
void node_feed_stop(struct node *n)
{
	struct node_feed *f = n->feed;

	if (f == NULL)
		return;
	f->stopping = true;
	n->feed = NULL;
	uv_timer_stop(&f->timer);
	uv_close((uv_handle_t *)&f->timer, feed_closed);
}

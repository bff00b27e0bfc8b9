/* tetherd edge: the client entry point (docs/API.md "Edge"). Lifecycle calls
 * are proxied to the control plane with the caller's Authorization header;
 * operations get a capability from the control plane (cached per caller key
 * hash and sandbox until 30 s before it expires) and are forwarded to the
 * node it names with "Authorization: Capability". Bodies stream both ways;
 * a node RefreshRoute (409) triggers exactly one rebuilt attempt when the
 * request was not yet consumed (SPEC §8).
 *
 * Recovery (SPEC §8): RefreshRoute -> the route is repaired through the
 * route cache (src/edge/routes.c, compare-and-swap) -> exactly one rebuilt
 * attempt; Deny is final; a transport failure is retried once on a freshly
 * resolved route only for idempotent reads (GET files/stat/list), while exec
 * and writes are never repeated: the client is told whether the operation
 * may have run. Operation answers carry X-Tether-Generation: the execution
 * that served them.
 *
 * Each request is a struct xreq owned by the edge, not by lws: its curl
 * transfer (or its wait on another request's route fetch) can outlive the
 * client connection, so a request is freed only when the connection has let
 * go of it and no transfer is in flight (a wait is simply cancelled). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libwebsockets.h>
#include <sodium.h>
#include <uv.h>

#include "cleanup.h"
#include "curlonce.h"
#include "edge/edge_int.h"
#include "edge/routes.h"
#include "edge/status.h"
#include "edge/ws.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "tetherd/roles.h"
#include "timefmt.h"
#include "urllist.h"
#include "wirecode.h"

#define EDGE_CAP_MARGIN 30          /* refresh capabilities this early (s) */
#define EDGE_CACHE_MAX 1024         /* capability cache entries */
#define EDGE_OUT_HIGH (256u << 10)  /* pause the upstream above this */
#define EDGE_OUT_LOW (64u << 10)    /* and resume below this */
#define EDGE_IN_HIGH (1u << 20)     /* stop reading the client above this */
#define EDGE_IN_LOW (256u << 10)
#define EDGE_CHUNK (16u << 10)      /* one lws_write of body bytes */
#define EDGE_CAP_ANSWER_MAX (64u << 10)
#define EDGE_CAPTURE_MAX (64u << 10) /* a 409 kept for a possible retry */

struct edge {
	uv_loop_t *loop;
	struct httpc *hc;
	struct lws_context *ctx;
	struct routes *routes; /* owned */
};

enum xkind { X_LIFECYCLE, X_OP };
enum xphase { P_BODY, P_CAP, P_NODE, P_REPLY };

/* A growable byte buffer consumed from the front. */
struct bytes {
	char *buf;
	size_t len;
	size_t off;
	size_t cap;
};

struct xreq {
	struct edge *e;
	struct lws *wsi;           /* NULL once the client connection is gone */
	struct http_rxguard *rxg;  /* bodiless requests: bytes after (http.h) */
	enum xkind kind;
	enum xphase phase;
	char method[8];
	char path[512];            /* request path as lws decoded it */
	char query[2048];          /* re-encoded query string, no '?' */
	char auth[512];            /* the caller's Authorization value */
	char ctype_in[128];
	char sbx[64];
	unsigned char keyhash[crypto_hash_sha256_BYTES];
	int streamed_in;           /* PUT files: body streams to the node */
	curl_off_t in_length;      /* client Content-Length, -1 if none */
	struct bytes in;           /* request body (whole, or in flight) */
	struct curlonce_body in_once; /* a whole body, as curl reads it once */
	int in_done;               /* client body complete */
	uint64_t in_forwarded;     /* bytes handed to curl */
	int in_curl_paused;
	int rx_paused;
	int early;                 /* answered before the client body was in */
	CURL *easy;                /* in-flight transfer (owned), or NULL */
	struct curl_slist *hdrs;   /* its headers (owned) */
	struct edge_route rt;      /* the route of the next attempt (owned) */
	struct route_waiter waiter;
	struct route_ticket ticket;
	int waiting;               /* queued on another request's fetch */
	int fetching;              /* this request fetches the slot's route */
	int retried;               /* the one rebuilt attempt was made */
	int refreshed;             /* ... after a RefreshRoute of x->rt */
	int stale_skipped;         /* a cached copy of the refused route was
	                            * passed over once */
	int wait_s;                /* the caller's X-Tether-Wait (s) */
	/* A next hop that could not be connected to (restarting: nothing of
	 * the request reached it) is tried again until wait_s is over */
	uv_timer_t *retry;         /* pending retry (owned, or NULL) */
	enum { RETRY_ROUTE, RETRY_LIFECYCLE } retry_what;
	uint64_t deadline_ms;      /* uv_now() past which none begins */
	unsigned retry_ms;         /* the next backoff */
	int idempotent;            /* a read: may be retried after transport loss */
	uint64_t answer_gen;       /* X-Tether-Generation of the answer, 0 none */
	uint64_t reject_us;        /* when the stale route was refused */
	/* answer to the client */
	long status;
	char ctype[128];
	curl_off_t out_length;     /* -1 unknown */
	struct bytes out;
	int out_curl_paused;
	int capture;               /* holding a 409 for a possible retry */
	int resp_done;
	int resp_failed;           /* upstream broke after headers went out */
	int headers_sent;
	uint64_t t0_us;
	/* the access log (src/edge/access.c) */
	char rid[HTTP_RID_MAX + 1]; /* X-Request-Id, sent on to cp and node */
	char idem[EDGE_IDEM_MAX + 1]; /* lifecycle calls: Idempotency-Key */
	char decision[24];         /* a receiver's refusal, and why */
	char reason[48];
	uint64_t in_received;      /* request body bytes from the client */
	uint64_t out_sent;         /* answer body bytes to the client */
	int logged;
};

/* The lws per-session data points at the request in progress; draining:
 * it was answered before its body was in, whose rest is dropped until the
 * transaction completes at its end (lib/http.h). */
struct pss {
	struct xreq *x;
	int draining;
	uint64_t drained;
	struct edge_status_req *st; /* the status page's (src/edge/status.c) */
};

static int edge_stop_signal;

/* now_us: monotonic microseconds, for latency metrics. */
static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* xreq_log: the access-log line of x, once (status 0: no answer went
 * out, the client left). */
static void xreq_log(struct xreq *x, long status)
{
	struct tt_access a = {
		.rid = x->rid, .method = x->method, .path = x->path,
		.sbx = x->sbx, .status = status, .decision = x->decision,
		.reason = x->reason, .rebuilt = x->retried,
		.generation = x->answer_gen, .dur_us = now_us() - x->t0_us,
		.bytes_in = x->in_received, .bytes_out = x->out_sent,
	};

	if (x->logged)
		return;
	x->logged = 1;
	edge_access_log(&a);
}

/* bytes_append: appends; -1 when out of memory. */
static int bytes_append(struct bytes *b, const void *data, size_t n)
{
	if (b->off > 0 && b->off == b->len) {
		b->off = b->len = 0;
	} else if (b->off > b->cap / 2) { /* compact before growing */
		memmove(b->buf, b->buf + b->off, b->len - b->off);
		b->len -= b->off;
		b->off = 0;
	}
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 16384;
		while (cap < b->len + n)
			cap *= 2;
		char *nb = realloc(b->buf, cap);
		if (nb == NULL)
			return -1;
		b->buf = nb;
		b->cap = cap;
	}
	memcpy(b->buf + b->len, data, n);
	b->len += n;
	return 0;
}

/* bytes_pending: unread bytes. */
static size_t bytes_pending(const struct bytes *b)
{
	return b->len - b->off;
}

/* bytes_free: releases the buffer. */
static void bytes_free(struct bytes *b)
{
	free(b->buf);
	memset(b, 0, sizeof(*b));
}

/* ---- request lifetime --------------------------------------------------- */

/* retry_closed: the retry timer is closed: its memory goes. */
static void retry_closed(uv_handle_t *h)
{
	free(h);
}

/* retry_cancel: a pending retry will not run. */
static void retry_cancel(struct xreq *x)
{
	if (x->retry == NULL)
		return;
	uv_timer_stop(x->retry);
	uv_close((uv_handle_t *)x->retry, retry_closed);
	x->retry = NULL;
}

/* xreq_free: releases a request that neither lws nor curl holds. */
static void xreq_free(struct xreq *x)
{
	retry_cancel(x);
	http_rxguard_stop(x->rxg);
	if (x->hdrs)
		curl_slist_free_all(x->hdrs);
	edge_route_clear(&x->rt);
	bytes_free(&x->in);
	bytes_free(&x->out);
	sodium_memzero(x->auth, sizeof(x->auth));
	free(x);
}

/* xreq_detach: the connection closed; the request lives on only until its
 * transfer notices (every curl callback aborts once wsi is NULL). */
static void xreq_detach(struct xreq *x)
{
	xreq_log(x, x->headers_sent ? x->status : 0);
	x->wsi = NULL;
	http_rxguard_stop(x->rxg);
	x->rxg = NULL;
	if (x->waiting) {
		routes_cancel_wait(x->e->routes, &x->waiter);
		x->waiting = 0;
	}
	retry_cancel(x);
	if (x->easy == NULL) {
		xreq_free(x);
		return;
	}
	if (x->out_curl_paused || x->in_curl_paused) {
		x->out_curl_paused = x->in_curl_paused = 0;
		curl_easy_pause(x->easy, CURLPAUSE_CONT);
	}
}

/* xreq_want_write: the answer is ready to go out (or its next part). One
 * that begins before the client's body is complete (a refusal, a node's
 * early error): the rest of that body is dropped (drained after the
 * answer, lib/http.h), never misread as a next request; reads resume
 * first, because lws 4.1 never serves POLLOUT on a flow-controlled
 * connection (its buffered rx then spins the loop on
 * HTTP_BODY_COMPLETION instead: docs/ARCHITECTURE.md). */
static void xreq_want_write(struct xreq *x)
{
	if (x->wsi == NULL)
		return;
	if (!x->in_done) {
		x->early = 1;
		if (x->rx_paused) {
			x->rx_paused = 0;
			lws_rx_flow_control(x->wsi, 1);
		}
	}
	lws_callback_on_writable(x->wsi);
}

/* xreq_local: prepares a locally made answer and asks to write it. */
static void xreq_local(struct xreq *x, long status, const char *body)
{
	x->phase = P_REPLY;
	x->status = status;
	x->answer_gen = 0; /* made here: no execution served it */
	snprintf(x->ctype, sizeof(x->ctype), "application/json");
	bytes_free(&x->out);
	if (bytes_append(&x->out, body, strlen(body)) < 0)
		x->resp_failed = 1;
	x->out_length = (curl_off_t)strlen(body);
	x->resp_done = 1;
	xreq_want_write(x);
}

/* xreq_error: a local {"error","message"} answer. */
__attribute__((format(printf, 4, 5)))
static void xreq_error(struct xreq *x, long status, const char *code,
                       const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *j;
	char *s;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	j = json_pack("{s:s,s:s}", "error", code, "message", msg);
	s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	xreq_local(x, status, s ? s : "{\"error\":\"internal\"}");
	free(s);
}

/* ---- upstream transfers ------------------------------------------------- */

/* up_progress: aborts a transfer whose client went away. */
static int up_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c,
                       curl_off_t d)
{
	struct xreq *x = arg;

	(void)a, (void)b, (void)c, (void)d;
	return x->wsi == NULL;
}

/* up_note_headers: records status, type and length once they are known. */
static void up_note_headers(struct xreq *x)
{
	char *ct = NULL;
	curl_off_t len = -1;

	if (x->status != 0)
		return;
	curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
	curl_easy_getinfo(x->easy, CURLINFO_CONTENT_TYPE, &ct);
	curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
	snprintf(x->ctype, sizeof(x->ctype), "%s",
	         ct ? ct : "application/octet-stream");
	x->out_length = len;
}

/* retry_eligible: SPEC §8 — refused requests were never executed; a
 * streamed PUT only if none of its body went out. */
static int retry_eligible(const struct xreq *x)
{
	return x->kind == X_OP && !x->retried &&
	       (!x->streamed_in || x->in_forwarded == 0);
}

/* capture_status: node answers held back whole (they are small JSON) until
 * the edge decides: a RefreshRoute to repair, a transport error to retry
 * (reads) or to explain (exec, writes). */
static int capture_status(const struct xreq *x)
{
	return x->kind == X_OP &&
	       (x->status == 409 || x->status == 502 || x->status == 503);
}

/* up_write: upstream body -> client, through the out buffer. */
static size_t up_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct xreq *x = arg;
	size_t n = size * nmemb;

	if (x->wsi == NULL)
		return 0; /* client gone: abort */
	up_note_headers(x);
	if (capture_status(x)) {
		x->capture = 1; /* maybe a RefreshRoute we can repair */
		if (bytes_pending(&x->out) + n > EDGE_CAPTURE_MAX)
			return 0;
		return bytes_append(&x->out, data, n) < 0 ? 0 : n;
	}
	if (bytes_pending(&x->out) > 0 && bytes_pending(&x->out) + n > EDGE_OUT_HIGH) {
		x->out_curl_paused = 1;
		return CURL_WRITEFUNC_PAUSE; /* resumed from the writable callback */
	}
	if (bytes_append(&x->out, data, n) < 0)
		return 0;
	x->phase = P_REPLY;
	xreq_want_write(x);
	return n;
}

/* up_read: client body -> upstream (streamed PUT). */
static size_t up_read(char *buf, size_t size, size_t nitems, void *arg)
{
	struct xreq *x = arg;
	size_t want = size * nitems, avail;

	if (x->wsi == NULL)
		return CURL_READFUNC_ABORT;
	avail = bytes_pending(&x->in);
	if (avail == 0) {
		if (x->in_done)
			return 0;
		x->in_curl_paused = 1;
		return CURL_READFUNC_PAUSE; /* resumed when the client sends more */
	}
	if (want > avail)
		want = avail;
	memcpy(buf, x->in.buf + x->in.off, want);
	x->in.off += want;
	x->in_forwarded += want;
	if (x->rx_paused && bytes_pending(&x->in) < EDGE_IN_LOW) {
		x->rx_paused = 0;
		lws_rx_flow_control(x->wsi, 1 | LWS_RXFLOW_REASON_FLAG_PROCESS_NOW);
	}
	return want;
}

/* up_easy: a transfer to url with the common options. */
static CURL *up_easy(struct xreq *x, const char *url)
{
	CURL *c = curl_easy_init();

	if (c == NULL)
		return NULL;
	curl_easy_setopt(c, CURLOPT_URL, url);
	http_easy_direct(c);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
	curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, up_progress);
	curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
	curl_easy_setopt(c, CURLOPT_PRIVATE, x);
	return c;
}

/* up_body_opts: the request body: whole from memory, or streamed; never
 * rewound (lib/curlonce.h), so curl cannot resend it on its own. */
static void up_body_opts(struct xreq *x, CURL *c)
{
	if (x->streamed_in) {
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, up_read);
		curl_easy_setopt(c, CURLOPT_READDATA, x);
		curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, x->in_length);
		curlonce_forbid_rewind(c);
	} else if (strcmp(x->method, "POST") == 0 || strcmp(x->method, "PUT") == 0) {
		/* Each attempt (the one rebuilt after RefreshRoute too) sends
		 * the whole body, which stays in x->in. */
		curlonce_post(c, &x->in_once, x->in.buf ? (const char *)x->in.buf + x->in.off
		                                         : NULL, bytes_pending(&x->in));
	}
	if (strcmp(x->method, "GET") == 0)
		curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, x->method);
}

static void node_start(struct xreq *x);
static void cap_fetch(struct xreq *x);
static void route_resolve(struct xreq *x);
static void lifecycle_start(struct xreq *x);
static void up_release(struct xreq *x, CURL *easy);

/* retry_fire: the backoff is over: the request goes again, on a freshly
 * resolved route (or to the cp again). */
static void retry_fire(uv_timer_t *t)
{
	struct xreq *x = t->data;

	retry_cancel(x);
	if (x->wsi == NULL) { /* not reached: a detached request cancels it */
		if (x->easy == NULL)
			xreq_free(x);
		return;
	}
	if (x->retry_what == RETRY_LIFECYCLE)
		lifecycle_start(x);
	else
		route_resolve(x);
}

/* xreq_retry_later: the next hop refused the connection (restarting):
 * nothing of the request reached it, so it is tried again after a backoff
 * (50 ms doubling to 1 s) on a freshly resolved route, while the caller's
 * wait lasts (SPEC §7: a daemon that dies is restarted; its callers do not
 * see it). 1 = scheduled (easy released), 0 = the wait is over. */
static int xreq_retry_later(struct xreq *x, CURL *easy, int what)
{
	uint64_t now = uv_now(x->e->loop);

	x->retry_ms = x->retry_ms ? x->retry_ms * 2 : 50;
	if (x->retry_ms > 1000)
		x->retry_ms = 1000;
	if (x->wsi == NULL || now + x->retry_ms > x->deadline_ms ||
	    (x->retry = malloc(sizeof(*x->retry))) == NULL)
		return 0;
	up_release(x, easy);
	if (what == RETRY_ROUTE)
		routes_drop_if(x->e->routes, x->keyhash, x->sbx, x->rt.version);
	x->retry_what = what;
	x->status = 0;
	x->capture = 0;
	x->out_curl_paused = 0;
	bytes_free(&x->out);
	x->phase = P_CAP;
	uv_timer_init(x->e->loop, x->retry);
	x->retry->data = x;
	uv_timer_start(x->retry, retry_fire, x->retry_ms, 0);
	metrics_inc("tether_edge_connect_retries_total",
	            what == RETRY_ROUTE ? "to=\"node\"" : "to=\"cp\"");
	return 1;
}

/* up_headers: Authorization + content type; no Expect stall, except for a
 * streamed upload to a node, which holds its body until admitted (node-api
 * answers 100 Continue on Allow): a refusal then comes before any byte of
 * it went out, so the body is still whole for the rebuilt attempt. */
static struct curl_slist *up_headers(struct xreq *x, const char *auth,
                                     int expect)
{
	struct curl_slist *h = NULL;
	char line[4200];

	snprintf(line, sizeof(line), "Authorization: %s", auth);
	h = curl_slist_append(h, line);
	sodium_memzero(line, sizeof(line));
	if (x->ctype_in[0]) {
		snprintf(line, sizeof(line), "Content-Type: %s", x->ctype_in);
		h = curl_slist_append(h, line);
	}
	snprintf(line, sizeof(line), "X-Request-Id: %s", x->rid);
	h = curl_slist_append(h, line);
	return curl_slist_append(h, expect ? "Expect: 100-continue" : "Expect:");
}

/* up_finish: common end of a transfer whose answer goes to the client. */
static void up_finish(struct xreq *x, CURL *easy, CURLcode rc, const char *who)
{
	if (x->status == 0 && rc == CURLE_OK)
		up_note_headers(x);
	curl_easy_cleanup(easy);
	x->easy = NULL;
	curl_slist_free_all(x->hdrs);
	x->hdrs = NULL;
	if (x->wsi == NULL) {
		xreq_free(x);
		return;
	}
	if (rc != CURLE_OK && !x->headers_sent && bytes_pending(&x->out) == 0) {
		metrics_inc("tether_edge_upstream_failures_total",
		            x->kind == X_OP ? "upstream=\"node\"" : "upstream=\"cp\"");
		x->status = 0;
		xreq_error(x, 502, "unavailable", "%s did not answer: %s", who,
		           curl_easy_strerror(rc));
		return;
	}
	if (rc != CURLE_OK)
		x->resp_failed = 1; /* headers are out: the client sees a cut body */
	x->phase = P_REPLY;
	x->resp_done = 1;
	xreq_want_write(x);
}

/* lifecycle_done: the control plane answered a proxied lifecycle call. */
static void lifecycle_done(CURL *easy, CURLcode rc, void *arg)
{
	struct xreq *x = arg;
	long status = 0;

	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
	/* the cp restarts, or a replica died: a call that never reached it,
	 * a read, or one whose answer was lost but that carries its
	 * Idempotency-Key (the replica that started it recorded what; one
	 * that did not start it does so now) is asked again, on another
	 * replica where there is one; a transition is never made twice */
	int replica_failed = rc != CURLE_OK && edge_cp_failed(easy, rc);

	if (rc != CURLE_OK &&
	    ((rc == CURLE_COULDNT_CONNECT && !curlonce_sent(&x->in_once)) ||
	     strcmp(x->method, "GET") == 0 || (x->idem[0] != '\0' && replica_failed)) &&
	    xreq_retry_later(x, easy, RETRY_LIFECYCLE))
		return;
	/* a transition the edge itself carried replaces the execution: no
	 * caller should try the old route first */
	if (rc == CURLE_OK && status >= 200 && status < 300 && x->sbx[0] &&
	    strcmp(x->method, "GET") != 0)
		routes_drop_sandbox(x->e->routes, x->sbx);
	up_finish(x, easy, rc, "control plane");
}

/* lifecycle_start: proxies the call to the control plane unchanged. */
static void lifecycle_start(struct xreq *x)
{
	char url[3000];
	struct tt_err err;

	snprintf(url, sizeof(url), "%s%s%s%s", edge_cp_url(), x->path,
	         x->query[0] ? "?" : "", x->query);
	x->phase = P_NODE;
	x->easy = up_easy(x, url);
	if (x->easy == NULL) {
		xreq_error(x, 500, "internal", "out of memory");
		return;
	}
	up_body_opts(x, x->easy);
	curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, up_write);
	curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
	if (x->auth[0])
		x->hdrs = up_headers(x, x->auth, 0);
	else
		x->hdrs = curl_slist_append(NULL, "Expect:");
	{
		char w[HTTP_RID_MAX + 32];

		snprintf(w, sizeof(w), "X-Tether-Wait: %d", x->wait_s);
		x->hdrs = curl_slist_append(x->hdrs, w);
		if (!x->auth[0]) { /* up_headers adds it otherwise */
			snprintf(w, sizeof(w), "X-Request-Id: %s", x->rid);
			x->hdrs = curl_slist_append(x->hdrs, w);
		}
		if (x->idem[0] != '\0') {
			snprintf(w, sizeof(w), "Idempotency-Key: %s", x->idem);
			x->hdrs = curl_slist_append(x->hdrs, w);
		}
	}
	curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->hdrs);
	if (httpc_start(x->e->hc, x->easy, lifecycle_done, x, &err) < 0) {
		curl_easy_cleanup(x->easy);
		x->easy = NULL;
		xreq_error(x, 500, "internal", "%s", err.msg);
	}
}

/* op_name: the operation a request performs, for messages ("exec",
 * "GET files", …). */
static void op_name(const struct xreq *x, char *buf, size_t cap)
{
	const char *rest = strrchr(x->path, '/');

	rest = rest ? rest + 1 : x->path;
	if (strcmp(rest, "exec") == 0 || strcmp(rest, "mkdir") == 0)
		snprintf(buf, cap, "%.16s", rest);
	else
		snprintf(buf, cap, "%.7s %.16s", x->method, rest);
}

/* captured_field: a string field of the held-back node answer, or "". */
static void captured_field(const struct xreq *x, const char *name, char *buf,
                           size_t cap)
{
	json_t *j = json_loadb(x->out.buf ? x->out.buf + x->out.off : "",
	                       bytes_pending(&x->out), JSON_REJECT_DUPLICATES, NULL);
	const char *v = json_string_value(json_object_get(j, name));

	snprintf(buf, cap, "%s", v ? v : "");
	json_decref(j);
}

/* up_release: forgets the finished transfer of x. */
static void up_release(struct xreq *x, CURL *easy)
{
	curl_easy_cleanup(easy);
	x->easy = NULL;
	curl_slist_free_all(x->hdrs);
	x->hdrs = NULL;
}

/* route_fetch_end: x no longer fetches for its slot; wakes the waiters if
 * the fetch did not commit (one of them fetches next). */
static void route_fetch_end(struct xreq *x)
{
	if (!x->fetching)
		return;
	x->fetching = 0;
	routes_abort(x->e->routes, x->keyhash, x->sbx);
}

/* route_woken: the fetch x waited for is over: resolve again. */
static void route_woken(void *arg)
{
	struct xreq *x = arg;

	x->waiting = 0;
	if (x->wsi == NULL) { /* not reached: a detached request stops waiting */
		if (x->easy == NULL)
			xreq_free(x);
		return;
	}
	route_resolve(x);
}

/* route_resolve: the route for x's next attempt — cached, shared with a
 * fetch already in flight, or fetched by x. A rebuilt attempt goes through
 * repair: the route it was refused on is replaced only if it is still the
 * cached one (a delayed refusal reuses the newer entry). */
static void route_resolve(struct xreq *x)
{
	struct route_entry ent;
	int v;

	memset(&ent, 0, sizeof(ent));
	x->waiter.fn = route_woken;
	x->waiter.arg = x;
	v = edge_route_lookup(x->e->routes, x->keyhash, x->sbx, x->retried,
	                      x->rt.version, &x->waiter, &ent, &x->ticket);
	switch (v) {
	case ROUTE_USE:
		if (x->refreshed && !x->stale_skipped && ent.generation == x->rt.gen &&
		    ent.activation == x->rt.att) {
			/* another request cached the very execution that was just
			 * refused: repair that entry too, asking for another one */
			x->stale_skipped = 1;
			x->rt.version = ent.version;
			route_entry_clear(&ent);
			route_resolve(x);
			return;
		}
		edge_route_take(&x->rt, &ent);
		node_start(x);
		return;
	case ROUTE_WAIT:
		x->phase = P_CAP;
		x->waiting = 1;
		return;
	case ROUTE_FETCH:
		x->fetching = 1;
		cap_fetch(x);
		return;
	default:
		xreq_error(x, 500, "internal", "out of memory");
	}
}

/* node_retry: the one rebuilt attempt (SPEC §8), on a repaired route. */
static void node_retry(struct xreq *x, CURL *easy, const char *why)
{
	char labels[48];

	up_release(x, easy);
	snprintf(labels, sizeof(labels), "why=\"%s\"", why);
	metrics_inc(strcmp(why, "refresh_route") == 0 ? "tether_edge_refresh_total"
	                                               : "tether_edge_read_retries_total",
	            NULL);
	metrics_inc("tether_edge_rebuilt_attempts_total", labels);
	/* (why ?: gcc -O1 with UBSan sees a null path after the strcmps) */
	log_info("%s for %s (generation %" PRIu64 "): rebuilding the request once",
	         why ? why : "?", x->sbx, x->rt.gen);
	x->retried = 1;
	x->refreshed = strcmp(why, "refresh_route") == 0;
	x->reject_us = now_us();
	x->status = 0;
	x->capture = 0;
	x->out_curl_paused = 0;
	x->phase = P_CAP;
	bytes_free(&x->out);
	route_resolve(x);
}

/* node_transport_error: the node could not be reached or broke off, and
 * the request is not retried: a clear answer saying whether the operation
 * may have run. Exec and writes are never silently repeated (there is no
 * idempotency key the receiver honours). */
static void node_transport_error(struct xreq *x, CURL *easy, CURLcode rc)
{
	char op[32], detail[300], code[32] = "";
	int started;

	op_name(x, op, sizeof(op));
	if (rc == CURLE_OK) { /* the node itself answered 502/503 */
		captured_field(x, "error", code, sizeof(code));
		captured_field(x, "message", detail, sizeof(detail));
		started = strcmp(code, "unavailable") != 0;
	} else {
		snprintf(detail, sizeof(detail), "%s", curl_easy_strerror(rc));
		/* nothing was sent when the connection could not be made, unless
		 * curl's own retry failed so after a reused connection carried
		 * the body (lib/curlonce.h) */
		started = (rc != CURLE_COULDNT_CONNECT && rc != CURLE_COULDNT_RESOLVE_HOST) ||
		          curlonce_sent(&x->in_once) || x->in_forwarded > 0;
	}
	up_release(x, easy);
	/* the next operation resolves a fresh route, unless already repaired */
	routes_drop_if(x->e->routes, x->keyhash, x->sbx, x->rt.version);
	metrics_inc("tether_edge_upstream_failures_total", "upstream=\"node\"");
	x->status = 0;
	x->capture = 0;
	if (x->idempotent)
		xreq_error(x, started ? 502 : 503, "unavailable",
		           "%s on %s: worker node %s failed (%s); retried once on a "
		           "freshly resolved route, giving up", op, x->sbx,
		           x->rt.node_url, detail);
	else if (started) {
		metrics_inc("tether_edge_not_repeated_total", NULL);
		xreq_error(x, 502, "unavailable",
		           "%s on %s: worker node %s failed mid-request (%s); the "
		           "operation may or may not have run and was not repeated",
		           op, x->sbx, x->rt.node_url, detail);
	} else
		xreq_error(x, 503, "unavailable",
		           "%s on %s: cannot reach worker node %s (%s); the "
		           "operation did not start", op, x->sbx, x->rt.node_url, detail);
}

/* node_done: the node answered (or failed); repairs a RefreshRoute once,
 * retries a read once after a transport failure, else relays. */
static void node_done(CURL *easy, CURLcode rc, void *arg)
{
	struct xreq *x = arg;
	char v[32];
	enum wire_code wc = WIRE_E_INTERNAL;
	int transport;

	if (x->wsi == NULL) {
		up_finish(x, easy, rc, "node"); /* frees x */
		return;
	}
	if (rc == CURLE_OK && x->status == 0) {
		x->easy = easy;
		up_note_headers(x);
	}
	if (rc == CURLE_OK && x->capture && x->status == 409) {
		captured_field(x, "decision", v, sizeof(v));
		if (strcmp(v, "refresh_route") == 0) /* for the access log */
			access_refusal_note(x->out.buf ? x->out.buf + x->out.off : NULL,
			                  bytes_pending(&x->out), x->decision,
			                  sizeof(x->decision), x->reason,
			                  sizeof(x->reason));
		if (strcmp(v, "refresh_route") == 0 && retry_eligible(x)) {
			node_retry(x, easy, "refresh_route");
			return;
		}
		if (strcmp(v, "refresh_route") == 0) /* relayed as it came */
			metrics_inc("tether_edge_refresh_exhausted_total", NULL);
	}
	transport = rc != CURLE_OK ? !x->headers_sent : 0;
	if (rc == CURLE_OK && x->capture && (x->status == 502 || x->status == 503)) {
		captured_field(x, "error", v, sizeof(v));
		wc = wirecode_parse(v);
		transport = wc == WIRE_E_TRANSPORT || wc == WIRE_E_UNAVAILABLE;
	}
	if (transport) {
		/* nothing ran: the node refused the connection, or said so
		 * itself (its manager restarts or stops) */
		if (x->in_forwarded == 0 &&
		    ((rc == CURLE_COULDNT_CONNECT && !curlonce_sent(&x->in_once)) ||
		     (rc == CURLE_OK && wc == WIRE_E_UNAVAILABLE)) &&
		    xreq_retry_later(x, easy, RETRY_ROUTE))
			return;
		if (x->idempotent && retry_eligible(x))
			node_retry(x, easy, "transport");
		else
			node_transport_error(x, easy, rc);
		return;
	}
	x->answer_gen = x->rt.gen;
	if (x->retried && x->status >= 200 && x->status < 300)
		metrics_observe_us("tether_edge_route_repair_duration_seconds", NULL,
		                   now_us() - x->reject_us);
	up_finish(x, easy, rc, "node");
}

/* node_start: forwards the operation with the capability in x->rt.token. */
static void node_start(struct xreq *x)
{
	char url[3000], auth[4200];
	struct tt_err err;

	snprintf(url, sizeof(url), "%s%s%s%s", x->rt.node_url, x->path,
	         x->query[0] ? "?" : "", x->query);
	x->phase = P_NODE;
	x->status = 0;
	x->easy = up_easy(x, url);
	if (x->easy == NULL) {
		xreq_error(x, 500, "internal", "out of memory");
		return;
	}
	up_body_opts(x, x->easy);
	/* curl silently resends a request whose reused connection died before
	 * an answer: a body it cannot rewind (up_body_opts) stops that; a
	 * state-changing request without one gets a new connection */
	if (!x->idempotent && !x->streamed_in && strcmp(x->method, "POST") != 0 &&
	    strcmp(x->method, "PUT") != 0)
		curl_easy_setopt(x->easy, CURLOPT_FRESH_CONNECT, 1L);
	curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, up_write);
	curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
	snprintf(auth, sizeof(auth), "Capability %s", x->rt.token);
	x->hdrs = up_headers(x, auth, x->streamed_in);
	sodium_memzero(auth, sizeof(auth));
	if (x->streamed_in) /* bounds a node that never answers the Expect */
		curl_easy_setopt(x->easy, CURLOPT_EXPECT_100_TIMEOUT_MS, 10000L);
	curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->hdrs);
	if (httpc_start(x->e->hc, x->easy, node_done, x, &err) < 0) {
		curl_easy_cleanup(x->easy);
		x->easy = NULL;
		xreq_error(x, 500, "internal", "%s", err.msg);
	}
}

/* cap_write: the capability answer, bounded. */
static size_t cap_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct xreq *x = arg;
	size_t n = size * nmemb;

	if (x->wsi == NULL || bytes_pending(&x->out) + n > EDGE_CAP_ANSWER_MAX)
		return 0;
	return bytes_append(&x->out, data, n) < 0 ? 0 : n;
}

/* cap_use: takes a capability answer into the route cache (if the slot is
 * still ours to fill) and into x. */
static int cap_use(struct xreq *x, json_t *j)
{
	struct route_entry f, take;

	if (edge_cap_parse(j, &f) < 0)
		return -1;
	x->fetching = 0; /* the commit below ends the fetch and wakes waiters */
	if (edge_cap_commit(x->e->routes, x->keyhash, x->sbx, &x->ticket, &f,
	                    &take) < 0)
		return -1;
	edge_route_take(&x->rt, &take);
	return 0;
}

/* cap_done: the control plane issued (or refused) a capability. */
static void cap_done(CURL *easy, CURLcode rc, void *arg)
{
	struct xreq *x = arg;
	long status = 0;

	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
	if (rc != CURLE_OK)
		edge_cp_failed(easy, rc); /* the next fetch asks another replica */
	if (rc != CURLE_OK && x->wsi != NULL) {
		route_fetch_end(x);
		if (xreq_retry_later(x, easy, RETRY_ROUTE))
			return; /* the cp restarts: a capability is asked again */
	}
	if (x->wsi == NULL || rc != CURLE_OK || (status != 200 && status != 201)) {
		route_fetch_end(x);
		/* pass the cp's refusal (401/404/409…) through as it came */
		up_finish(x, easy, rc, "control plane");
		return;
	}
	up_release(x, easy);
	json_t *j = json_loadb(x->out.buf ? x->out.buf + x->out.off : "",
	                       bytes_pending(&x->out), JSON_REJECT_DUPLICATES, NULL);
	int ok = j != NULL && cap_use(x, j) == 0;
	json_decref(j);
	bytes_free(&x->out);
	route_fetch_end(x); /* no-op once committed */
	if (!ok) {
		xreq_error(x, 502, "unavailable",
		           "the control plane answered an unusable capability");
		return;
	}
	node_start(x);
}

/* cap_fetch: asks the control plane for a capability for x's caller (the
 * caller's own API key: the cp authenticates the caller every time). */
static void cap_fetch(struct xreq *x)
{
	struct tt_err err;

	x->phase = P_CAP;
	x->status = 0;
	x->easy = up_easy(x, "");
	if (x->easy == NULL) {
		route_fetch_end(x);
		xreq_error(x, 500, "internal", "out of memory");
		return;
	}
	/* a rebuilt attempt after RefreshRoute asks for another execution than
	 * the refused one (the cp waits for it, within wait_s) */
	edge_cap_request(x->easy, edge_cp_url(), x->sbx, x->auth, x->wait_s,
	                 x->refreshed ? &x->rt : NULL, &x->hdrs);
	{
		char rid[HTTP_RID_MAX + 16];

		snprintf(rid, sizeof(rid), "X-Request-Id: %s", x->rid);
		x->hdrs = curl_slist_append(x->hdrs, rid);
		curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->hdrs);
	}
	curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, cap_write);
	curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
	if (httpc_start(x->e->hc, x->easy, cap_done, x, &err) < 0) {
		curl_easy_cleanup(x->easy);
		x->easy = NULL;
		route_fetch_end(x);
		xreq_error(x, 500, "internal", "%s", err.msg);
	}
}

/* xreq_go: the request (or enough of it) is in; start upstream. */
static void xreq_go(struct xreq *x)
{
	if (x->kind == X_LIFECYCLE)
		lifecycle_start(x);
	else
		route_resolve(x);
}

/* ---- lws side ----------------------------------------------------------- */

/* edge_write: sends headers and the next body chunk; finishes the
 * transaction once everything is out. Returns the lws callback result. */
static int edge_write(struct lws *wsi, struct pss *pss, struct xreq *x)
{
	_cleanup_free_ unsigned char *buf = malloc(LWS_PRE + 1024 + EDGE_CHUNK);
	unsigned char *start, *p, *end;
	size_t n;
	int final;

	if (buf == NULL)
		return -1;
	if (x->phase != P_REPLY || (x->capture && !x->resp_done))
		return 0;
	start = p = buf + LWS_PRE;
	end = start + 1024;
	if (!x->headers_sent) {
		lws_filepos_t len = LWS_ILLEGAL_HTTP_CONTENT_LEN;
		if (x->resp_done && !x->resp_failed)
			len = (lws_filepos_t)bytes_pending(&x->out);
		else if (x->out_length >= 0)
			len = (lws_filepos_t)x->out_length;
		if (lws_add_http_common_headers(wsi, (unsigned)x->status |
		                                LWSAHH_FLAG_NO_SERVER_NAME,
		                                x->ctype, len, &p, end) ||
		    lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
		                                 (const unsigned char *)"no-store", 8,
		                                 &p, end))
			return -1;
		if ((x->status == 403 || x->status == 409) && x->kind == X_OP)
			access_refusal_note(x->out.buf ? x->out.buf + x->out.off : NULL,
			                  bytes_pending(&x->out), x->decision,
			                  sizeof(x->decision), x->reason,
			                  sizeof(x->reason));
		if (lws_add_http_header_by_name(wsi, (const unsigned char *)"x-request-id:",
		                                (const unsigned char *)x->rid,
		                                (int)strlen(x->rid), &p, end))
			return -1;
		if (x->answer_gen > 0) { /* the execution that served this answer */
			char g[24];
			int gl = snprintf(g, sizeof(g), "%" PRIu64, x->answer_gen);
			if (lws_add_http_header_by_name(wsi,
			        (const unsigned char *)"x-tether-generation:",
			        (const unsigned char *)g, gl, &p, end))
				return -1;
		}
		if (lws_finalize_http_header(wsi, &p, end))
			return -1;
		x->headers_sent = 1;
	}
	n = bytes_pending(&x->out);
	if (n > EDGE_CHUNK)
		n = EDGE_CHUNK;
	if (n)
		memcpy(p, x->out.buf + x->out.off, n);
	p += n;
	x->out.off += n;
	x->out_sent += n;
	final = x->resp_done && bytes_pending(&x->out) == 0;
	if (final && x->resp_failed) {
		xreq_log(x, x->status);
		return -1; /* the upstream broke: cut the connection */
	}
	if (p > start &&
	    lws_write(wsi, start, (size_t)(p - start),
	              final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) != (int)(p - start))
		return -1;
	if (x->out_curl_paused && x->easy && bytes_pending(&x->out) < EDGE_OUT_LOW) {
		x->out_curl_paused = 0;
		curl_easy_pause(x->easy, CURLPAUSE_CONT); /* may call up_write */
	}
	if (!final) {
		if (bytes_pending(&x->out) > 0)
			lws_callback_on_writable(wsi);
		return 0;
	}
	{
		char labels[64];
		snprintf(labels, sizeof(labels), "kind=\"%s\",status=\"%ld\"",
		         x->kind == X_OP ? "op" : "lifecycle", x->status);
		metrics_inc("tether_edge_requests_total", labels);
		metrics_observe_us("tether_edge_request_duration_seconds",
		                   x->kind == X_OP ? "kind=\"op\"" : "kind=\"lifecycle\"",
		                   now_us() - x->t0_us);
	}
	xreq_log(x, x->status);
	pss->x = NULL;
	final = http_rxguard_stop(x->rxg); /* bytes after the request: close */
	x->rxg = NULL;
	if (x->early && !x->in_done && !final) { /* its body still comes */
		xreq_free(x);
		pss->draining = 1;
		pss->drained = 0;
		http_drain_begin(wsi);
		return 0;
	}
	xreq_free(x);
	return final || lws_http_transaction_completed(wsi) ? -1 : 0;
}

/* sbx_from_path: the id after "/v1/sandboxes/" and what follows it. */
static int sbx_from_path(const char *path, char *id, size_t cap,
                         const char **rest)
{
	const char *p = path + strlen("/v1/sandboxes/");
	size_t n = strcspn(p, "/");

	if (n == 0 || n >= cap)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= '0' && p[i] <= '9') ||
		      p[i] == '_'))
			return -1;
	memcpy(id, p, n);
	id[n] = '\0';
	*rest = p + n;
	return 0;
}

/* route: classifies the request; 0 ok, else the HTTP status to refuse
 * with (404/405). */
static int route(struct xreq *x)
{
	const char *m = x->method, *rest = NULL;

	if (strcmp(x->path, "/v1/sandboxes") == 0)
		return (strcmp(m, "GET") == 0 || strcmp(m, "POST") == 0) ? 0 : 405;
	if (strcmp(x->path, "/v1/workers") == 0 || strcmp(x->path, "/v1/keys") == 0 ||
	    strcmp(x->path, "/v1/events") == 0)
		return strcmp(m, "GET") == 0 ? 0 : 405;
	if (strcmp(x->path, "/v1/admin/rotate-keys") == 0) /* the cp checks admin */
		return strcmp(m, "POST") == 0 ? 0 : 405;
	if (strcmp(x->path, "/v1/admin/keys") == 0)
		return strcmp(m, "GET") == 0 ? 0 : 405;
	if (strncmp(x->path, "/v1/sandboxes/", 14) != 0 ||
	    sbx_from_path(x->path, x->sbx, sizeof(x->sbx), &rest) < 0)
		return 404;
	if (rest[0] == '\0')
		return (strcmp(m, "GET") == 0 || strcmp(m, "DELETE") == 0) ? 0 : 405;
	if (strcmp(rest, "/capabilities") == 0)
		return strcmp(m, "POST") == 0 ? 0 : 405;
	/* lifecycle transitions (query such as ?wait=0 passes through) */
	if (strcmp(rest, "/pause") == 0 || strcmp(rest, "/resume") == 0 ||
	    strcmp(rest, "/migrate") == 0)
		return strcmp(m, "POST") == 0 ? 0 : 405;
	x->kind = X_OP;
	if (strcmp(rest, "/exec") == 0 || strcmp(rest, "/mkdir") == 0)
		return strcmp(m, "POST") == 0 ? 0 : 405;
	/* reads may be retried after a transport failure (SPEC §8) */
	x->idempotent = strcmp(m, "GET") == 0;
	if (strcmp(rest, "/stat") == 0 || strcmp(rest, "/list") == 0)
		return strcmp(m, "GET") == 0 ? 0 : 405;
	if (strcmp(rest, "/files") == 0) {
		if (strcmp(m, "PUT") == 0)
			x->streamed_in = 1;
		return (strcmp(m, "GET") == 0 || strcmp(m, "PUT") == 0 ||
		        strcmp(m, "DELETE") == 0) ? 0 : 405;
	}
	return 404;
}

/* method_of: the request method lws parsed. */
static const char *method_of(struct lws *wsi)
{
	if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI))
		return "GET";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI))
		return "POST";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_PUT_URI))
		return "PUT";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI))
		return "DELETE";
	return NULL;
}

/* query_rebuild: the URI arguments, each re-encoded (lws hands them to us
 * decoded), joined with '&'. */
static int query_rebuild(struct lws *wsi, char *out, size_t cap)
{
	char frag[2048];
	size_t len = 0;

	out[0] = '\0';
	for (int i = 0; lws_hdr_copy_fragment(wsi, frag, sizeof(frag),
	                                      WSI_TOKEN_HTTP_URI_ARGS, i) >= 0; i++) {
		char *eq = strchr(frag, '=');
		char *k, *v = NULL;
		if (eq)
			*eq = '\0';
		k = curl_easy_escape(NULL, frag, 0);
		if (eq)
			v = curl_easy_escape(NULL, eq + 1, 0);
		int n = snprintf(out + len, cap - len, "%s%s%s%s", len ? "&" : "",
		                 k ? k : "", eq ? "=" : "", v ? v : "");
		curl_free(k);
		curl_free(v);
		if (n < 0 || (size_t)n >= cap - len)
			return -1;
		len += (size_t)n;
	}
	return 0;
}

/* xreq_refuse: answers a request refused before it went anywhere, logs
 * it and frees it. Returns the lws callback result. */
__attribute__((format(printf, 5, 6)))
static int xreq_refuse(struct xreq *x, struct lws *wsi, unsigned status,
                       const char *code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	xreq_log(x, status);
	xreq_free(x);
	return http_reply_error(wsi, status, code, "%s", msg);
}

/* edge_http: a new request. */
static int edge_http(struct lws *wsi, struct pss *pss, struct edge *e,
                     const char *uri)
{
	const char *m = method_of(wsi);
	char clen[32];
	long long in_length;
	struct xreq *x;
	int rc;

	if (m == NULL)
		return http_reply_error(wsi, 405, "method_not_allowed", "method not allowed");
	if (strcmp(m, "GET") == 0 && strcmp(uri, "/healthz") == 0)
		return http_reply(wsi, 200, "application/json", "{\"ok\":true}", 11);
	if (strcmp(m, "GET") == 0 && strcmp(uri, "/metrics") == 0) {
		_cleanup_free_ char *text = metrics_render();
		if (text == NULL)
			return http_reply_error(wsi, 500, "internal", "out of memory");
		return http_reply(wsi, 200, "text/plain; version=0.0.4", text,
		                  strlen(text));
	}
	x = calloc(1, sizeof(*x));
	if (x == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	x->e = e;
	x->wsi = wsi;
	x->t0_us = now_us();
	x->out_length = -1;
	x->deadline_ms = uv_now(e->loop) + HTTP_WAIT_DEFAULT_S * 1000u;
	x->in_length = -1;
	snprintf(x->method, sizeof(x->method), "%s", m);
	http_request_id(wsi, x->rid);
	if (edge_idem_eligible(m, uri))
		edge_idem_key(wsi, x->idem);
	if (strlen(uri) >= sizeof(x->path) ||
	    query_rebuild(wsi, x->query, sizeof(x->query)) < 0)
		return xreq_refuse(x, wsi, 414, "too_large", "URI too long");
	snprintf(x->path, sizeof(x->path), "%s", uri);
	x->wait_s = http_wait_seconds(wsi);
	x->deadline_ms = uv_now(e->loop) + (uint64_t)(x->wait_s > 0 ? x->wait_s : 0) * 1000u;
	if (x->wait_s < 0)
		return xreq_refuse(x, wsi, 400, "bad_request", "X-Tether-Wait must "
		                   "be 0..%d seconds", HTTP_WAIT_MAX_S);
	if ((rc = route(x)) != 0) {
		if (rc == 405)
			return xreq_refuse(x, wsi, 405, "bad_request",
			                   "%s is not allowed on %s", m, uri);
		return xreq_refuse(x, wsi, 404, "not_found", "no such endpoint: %s", uri);
	}
	if (http_header(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, x->auth, sizeof(x->auth)) < 0)
		x->auth[0] = '\0';
	if (x->kind == X_OP) {
		if (strncmp(x->auth, "Bearer ", 7) != 0 || x->auth[7] == '\0') {
			return xreq_refuse(x, wsi, 401, "unauthorized",
			                   "an 'Authorization: Bearer <api key>' "
			                   "header is required");
		}
		crypto_hash_sha256(x->keyhash, (const unsigned char *)x->auth + 7,
		                   strlen(x->auth + 7));
	}
	if (http_header(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, x->ctype_in,
	                sizeof(x->ctype_in)) < 0)
		x->ctype_in[0] = '\0';
	switch (http_body_framing(wsi, &in_length)) {
	case HTTP_BODY_UNSIZED:
		return xreq_refuse(x, wsi, 411, "length_required",
		                   "request bodies need a Content-Length");
	case HTTP_BODY_BAD:
		return xreq_refuse(x, wsi, 400, "bad_request", "bad Content-Length");
	default:
		x->in_length = in_length;
	}
	if (x->in_length > 0 && !x->streamed_in &&
	    x->in_length > (curl_off_t)HTTP_BODY_MAX_DEFAULT)
		return xreq_refuse(x, wsi, 413, "too_large", "request body over %u bytes",
		                   HTTP_BODY_MAX_DEFAULT);
	if (x->streamed_in && x->in_length < 0)
		return xreq_refuse(x, wsi, 411, "length_required",
		                   "file uploads need a Content-Length");
	pss->x = x;
	x->in_done = x->in_length <= 0;
	/* lws reads nothing more for a bodiless request until its reply is
	 * complete; the guard keeps a client's extra bytes or half-close from
	 * spinning the loop meanwhile (http.h). */
	if (x->in_done && http_header(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING,
	                              clen, sizeof(clen)) <= 0) {
		struct tt_err gerr = { 0 };

		x->rxg = http_rxguard_start(e->loop, wsi, &gerr);
		if (x->rxg == NULL)
			log_warn("edge: %s", gerr.msg);
	}
	/* The edge takes the body itself (whole, or streamed behind the node's
	 * admission), so a client waiting for 100 Continue gets it now rather
	 * than after its own timeout (curl: 1 s) */
	if (!x->in_done && http_expects_continue(wsi) && http_continue(wsi) < 0) {
		pss->x = NULL;
		xreq_free(x);
		return -1;
	}
	if (x->streamed_in || x->in_done)
		xreq_go(x); /* a streamed PUT starts now; its body follows */
	return 0;
}

/* edge_body: a chunk of request body. */
static int edge_body(struct lws *wsi, struct xreq *x, const void *in, size_t len)
{
	if (x == NULL || x->in_done || x->early)
		return 0; /* early: answered already, the rest is dropped */
	if (!x->streamed_in && bytes_pending(&x->in) + len > HTTP_BODY_MAX_DEFAULT)
		return http_reply_error(wsi, 413, "too_large", "request body too large"), -1;
	if (bytes_append(&x->in, in, len) < 0)
		return -1;
	x->in_received += len;
	if (x->streamed_in) {
		if (bytes_pending(&x->in) > EDGE_IN_HIGH && !x->rx_paused) {
			x->rx_paused = 1; /* the node is slower than the client */
			lws_rx_flow_control(wsi, 0);
		}
		if (x->in_curl_paused && x->easy) {
			x->in_curl_paused = 0;
			curl_easy_pause(x->easy, CURLPAUSE_CONT);
		}
	}
	return 0;
}

/* edge_body_done: the request body is complete. */
static int edge_body_done(struct xreq *x)
{
	if (x == NULL || x->in_done)
		return 0;
	if (x->early) { /* answered already: nothing to drain any more */
		x->in_done = 1;
		return 0;
	}
	x->in_done = 1;
	if (!x->streamed_in) {
		xreq_go(x);
	} else if (x->in_curl_paused && x->easy) {
		x->in_curl_paused = 0;
		curl_easy_pause(x->easy, CURLPAUSE_CONT);
	}
	return 0;
}

/* edge_cb: the lws protocol callback. */
static int edge_cb(struct lws *wsi, enum lws_callback_reasons reason,
                   void *user, void *in, size_t len)
{
	struct pss *pss = user;
	struct edge *e = lws_context_user(lws_get_context(wsi));
	int rc;

	switch (reason) {
	case LWS_CALLBACK_HTTP:
		pss->draining = 0;
		http_request_started(wsi); /* a long download is not cut at 30 s */
		if (pss->x != NULL) { /* pipelined before the last one finished */
			xreq_detach(pss->x);
			pss->x = NULL;
		}
		edge_status_closed(&pss->st);
		if ((rc = edge_status_http(wsi, &pss->st, method_of(wsi), in)) !=
		    EDGE_STATUS_NOT_MINE)
			return rc;
		return edge_http(wsi, pss, e, in);
	case LWS_CALLBACK_HTTP_BODY:
		if (pss->draining) {
			pss->drained += len;
			return pss->drained > HTTP_DRAIN_MAX ? -1 : 0;
		}
		if (pss->st != NULL)
			return edge_status_body(wsi, &pss->st, in, len);
		return edge_body(wsi, pss->x, in, len);
	case LWS_CALLBACK_HTTP_BODY_COMPLETION:
		if (pss->draining) { /* answered and drained: keep-alive again */
			pss->draining = 0;
			return lws_http_transaction_completed(wsi) ? -1 : 0;
		}
		if (pss->st != NULL)
			return edge_status_body_done(wsi, &pss->st);
		return edge_body_done(pss->x);
	case LWS_CALLBACK_HTTP_WRITEABLE:
		if (pss->st != NULL)
			return edge_status_writable(wsi, &pss->st);
		if (pss->x == NULL)
			return 0;
		return edge_write(wsi, pss, pss->x);
	case LWS_CALLBACK_CLOSED_HTTP:
	case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
		if (pss != NULL && pss->x != NULL) {
			xreq_detach(pss->x);
			pss->x = NULL;
		}
		if (pss != NULL)
			edge_status_closed(&pss->st);
		return 0;
	default: /* upgrades refused, bounds, HTTP/2 (lib/http.h) */
		return http_callback_default(wsi, reason, user, in, len);
	}
}

static const struct lws_protocols edge_protocols[] = {
	/* tx_packet_size: lws 4.1 caps one send() at this + LWS_PRE + 4 (0 =
	 * rx_buffer_size, default 4096); edge_write's largest write (1024
	 * header bytes + EDGE_CHUNK) then goes in one send, no POLLOUT trip. */
	{ "http", edge_cb, sizeof(struct pss), 0, 0, NULL, EDGE_CHUNK + 1024 },
	/* streamed exec relay (src/edge/ws.c) */
	{ EDGEWS_PROTOCOL, edgews_callback, sizeof(struct edgews_pss),
	  EDGEWS_RX_BUFFER, 0, NULL, 0 },
	{ NULL, NULL, 0, 0, 0, NULL, 0 }
};

/* edge_on_signal: SIGINT/SIGTERM stop the loop. */
static void edge_on_signal(uv_signal_t *h, int sig)
{
	edge_stop_signal = sig;
	uv_stop(h->loop);
}

/* edge_parse_listen: "HOST:PORT". */
static int edge_parse_listen(const char *s, char *host, size_t cap, int *port)
{
	const char *colon = strrchr(s, ':');
	char *end;
	long p;

	if (colon == NULL || (size_t)(colon - s) >= cap || colon == s)
		return -1;
	memcpy(host, s, (size_t)(colon - s));
	host[colon - s] = '\0';
	p = strtol(colon + 1, &end, 10);
	if (*end || p < 1 || p > 65535)
		return -1;
	*port = (int)p;
	return 0;
}

/* edge_main: tetherd edge --listen HOST:PORT --cp URL[,URL…] (several:
 * control-plane replicas, failed over). */
int edge_main(int argc, char **argv)
{
	struct edge e;
	char host[128];
	int port = 0;
	const char *listen = NULL, *cp = NULL;
	uv_signal_t sigint, sigterm;
	struct tt_err err = { 0 };

	tt_log_init("edge", TT_LOG_INFO);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
			listen = argv[++i];
		else if (strcmp(argv[i], "--cp") == 0 && i + 1 < argc)
			cp = argv[++i];
		else {
			fprintf(stderr, "usage: tetherd edge --listen HOST:PORT --cp URL\n");
			return 1;
		}
	}
	if (listen == NULL || cp == NULL ||
	    edge_parse_listen(listen, host, sizeof(host), &port) < 0 ||
	    edge_cp_set(cp, &err) < 0) {
		fprintf(stderr, "%s%susage: tetherd edge --listen HOST:PORT --cp URL[,URL…]\n",
		        err.msg, err.msg[0] ? "\n" : "");
		return 1;
	}
	memset(&e, 0, sizeof(e));
	if (sodium_init() < 0) {
		log_error("sodium_init failed");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	e.routes = routes_new(EDGE_CACHE_MAX, EDGE_CAP_MARGIN);
	if (e.routes == NULL) {
		log_error("out of memory");
		return 1;
	}
	e.loop = uv_default_loop();
	e.hc = httpc_new(e.loop, &err);
	if (e.hc == NULL) {
		log_error("%s", err.msg);
		return 1;
	}
	edgews_setup(e.hc, e.routes);
	edge_status_setup(e.loop, e.hc);
	/* a client, its backend transfer and an rxguard dup */
	http_server_set_fds_per_conn(3);
	e.ctx = http_server_new(e.loop, host, port, edge_protocols, &e, &err);
	if (e.ctx == NULL) {
		log_error("%s", err.msg);
		return 1;
	}
	uv_signal_init(e.loop, &sigint);
	uv_signal_init(e.loop, &sigterm);
	uv_signal_start(&sigint, edge_on_signal, SIGINT);
	uv_signal_start(&sigterm, edge_on_signal, SIGTERM);
	log_info("listening on %s:%d, control plane %s", host, port, cp);
	uv_run(e.loop, UV_RUN_DEFAULT);
	log_info("signal %d: stopping", edge_stop_signal);
	http_server_free(e.ctx);
	routes_free(e.routes);
	return 0;
}

/* The edge's streamed exec relay (see ws.h, docs/API.md "Streamed exec").
 *
 * Client side: the upgrade is authorized in FILTER_PROTOCOL_CONNECTION (the
 * exact path and a Bearer header; the cp authenticates the key when the
 * capability is fetched). The first client message (the start message) is
 * kept; the route comes from the route cache (or a capability fetch), and an
 * lws client connection to the node's endpoint (same context, same libuv
 * loop) carries "Authorization: Capability …" and then the start message.
 *
 * The node's first message is its decision. RefreshRoute: the start message
 * was not executed (admission refused it), so the route is repaired by
 * compare-and-swap and exactly one rebuilt backend stream is opened; the
 * client's WebSocket stays open meanwhile (SPEC §6) and sees only the
 * decision that counts. Deny (or a second RefreshRoute) is passed on with
 * the node's close code (4403 / 4409). After Allow, messages are relayed
 * whole both ways; client input is held until Allow. A backend that fails
 * before Allow could not have run the command ("unavailable"); one that
 * drops afterwards without its exit message gives the client
 * {"type":"error","error":"transport"} — an exec is never repeated.
 *
 * Backpressure: each direction's queue stops reading its producer above
 * EWS_Q_HIGH and resumes below EWS_Q_LOW (lws_rx_flow_control).
 *
 * Ownership: a stream (struct edgews) belongs to the edge, not to either
 * connection: it is freed when the client connection is gone, the backend
 * connection detached and no capability fetch is in flight. */
#include "edge/ws.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>
#include <sodium.h>

#include "claims.h"
#include "edge/edge_int.h"
#include "cleanup.h"
#include "log.h"
#include "metrics.h"
#include "timefmt.h"
#include "wirecode.h"
#include "wsutil.h"

#define EWS_MSG_MAX ((1u << 20) + 16) /* one relayed message */
/* The start message comes before the caller is authenticated: it is
 * bounded as node-api bounds it (docs/API.md) and must arrive in time. */
#define EWS_START_MAX (60u << 10)
#define EWS_START_SECS 10
#define EWS_Q_HIGH (1u << 20)
#define EWS_Q_LOW (256u << 10)
#define EWS_CAP_ANSWER_MAX (64u << 10)
#define EWS_REASON_MAX 123

/* What the relay borrows from the HTTP edge (edgews_setup). */
static struct {
	struct httpc *hc;
	struct routes *routes;
} ews_env;

/* A message being assembled from fragments (owned buffer). */
struct ews_asm {
	uint8_t *buf;
	size_t len;
	bool binary;
};

enum ews_state { EWS_START, EWS_ROUTE, EWS_CONNECT, EWS_DECISION,
                 EWS_RUNNING, EWS_CLOSING };

struct edgews {
	struct lws *cwsi;            /* client-facing; NULL once gone */
	struct lws *bwsi;            /* current backend; NULL when none */
	struct lws_context *ctx;
	struct lws_vhost *vh;
	enum ews_state st;
	char sbx[64];
	unsigned char keyhash[crypto_hash_sha256_BYTES];
	char auth[512];              /* the caller's "Bearer …" (secret) */
	char *start;                 /* the start message (owned) */
	size_t start_len;
	bool start_sent;             /* to the current backend */
	struct edge_route rt;        /* the route of the next attempt (owned) */
	struct route_waiter waiter;
	struct route_ticket ticket;
	bool waiting, fetching, retried;
	int wait_s;                  /* the caller's X-Tether-Wait */
	/* a node or cp that refused the connection (restarting: nothing
	 * ran) is tried again, with a backoff, until deadline_us */
	lws_sorted_usec_list_t retry_sul;
	bool retry_pending;
	unsigned retry_ms;
	uint64_t deadline_us;
	CURL *easy;                  /* capability fetch in flight (owned) */
	struct curl_slist *hdrs;
	char *ans;                   /* its answer (owned, bounded) */
	size_t ans_len;
	struct ws_queue cq, bq;         /* to the client, to the backend */
	struct ews_asm cin, bin;     /* from the client, from the backend */
	bool cpaused, bpaused;       /* rx flow control of each side */
	bool backend_final;          /* exit / error / refusal seen */
	struct ws_close close;       /* for the client, once cq is drained */
	uint64_t t0_us, reject_us;
	/* the access log line, written when the client is closed or goes */
	char rid[HTTP_RID_MAX + 1];  /* X-Request-Id, sent on to cp and node */
	char decision[24], reason[48]; /* the node's refusal */
	uint64_t gen_served;         /* the execution that ran it */
	uint64_t bytes_in, bytes_out; /* client messages, either way */
	bool logged;
};

static void ews_resolve(struct edgews *x);
static bool ews_retry_later(struct edgews *x);

/* edgews_setup: see ws.h. */
void edgews_setup(struct httpc *hc, struct routes *routes)
{
	ews_env.hc = hc;
	ews_env.routes = routes;
}

/* ews_now_us: monotonic microseconds. */
static uint64_t ews_now_us(void)
{
	return uv_hrtime() / 1000u;
}

/* asm_add: appends a fragment; 1 when the message is complete, 0 when more
 * follows, -1 over the bound or out of memory. */
static int asm_add(struct ews_asm *a, struct lws *wsi, const void *in, size_t len,
                   size_t max)
{
	uint8_t *nb;

	if (a->len == 0)
		a->binary = lws_frame_is_binary(wsi) != 0;
	if (a->len + len > max)
		return -1;
	if (len > 0) {
		nb = realloc(a->buf, a->len + len);
		if (nb == NULL)
			return -1;
		a->buf = nb;
		memcpy(a->buf + a->len, in, len);
		a->len += len;
	}
	return lws_is_final_fragment(wsi) ? 1 : 0;
}

/* ews_maybe_free: frees x once nothing refers to it any more. */
static void ews_maybe_free(struct edgews *x)
{
	if (x->cwsi != NULL || x->bwsi != NULL || x->easy != NULL)
		return;
	if (x->retry_pending)
		lws_sul_cancel(&x->retry_sul);
	ws_close_cancel(&x->close);
	if (x->waiting)
		routes_cancel_wait(ews_env.routes, &x->waiter);
	ws_queue_clear(&x->cq);
	ws_queue_clear(&x->bq);
	free(x->cin.buf);
	free(x->bin.buf);
	free(x->start);
	free(x->ans);
	edge_route_clear(&x->rt);
	sodium_memzero(x->auth, sizeof(x->auth));
	free(x);
	metrics_gauge_add("tether_edge_streams_open", "kind=\"exec\"", -1);
}

/* ews_backend_drop: lets go of the current backend connection (it is
 * closed by lws; its late callbacks find no stream). */
static void ews_backend_drop(struct edgews *x)
{
	if (x->bwsi == NULL)
		return;
	lws_set_opaque_user_data(x->bwsi, NULL);
	lws_set_timeout(x->bwsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC);
	x->bwsi = NULL;
}

/* ews_to_client: queues a message for the client. */
static void ews_to_client(struct edgews *x, enum lws_write_protocol kind,
                          const void *data, size_t len)
{
	if (x->cwsi == NULL)
		return;
	x->bytes_out += len;
	if (ws_queue_push(&x->cq, kind, 0, data, len) < 0) {
		x->close.code = LWS_CLOSE_STATUS_UNEXPECTED_CONDITION;
		x->st = EWS_CLOSING;
	}
	lws_callback_on_writable(x->cwsi);
	if (x->cq.bytes > EWS_Q_HIGH && x->bwsi != NULL && !x->bpaused) {
		x->bpaused = true;
		lws_rx_flow_control(x->bwsi, 0);
	}
}

/* ews_log: the stream's access-log line, once; result as in
 * tether_edge_exec_streams_total. */
static void ews_log(struct edgews *x, const char *result)
{
	char path[128];
	struct tt_access a = {
		.rid = x->rid, .method = "GET", .path = path, .sbx = x->sbx,
		.status = 101, .result = result, .decision = x->decision,
		.reason = x->reason, .rebuilt = x->retried,
		.generation = x->gen_served, .dur_us = ews_now_us() - x->t0_us,
		.bytes_in = x->bytes_in, .bytes_out = x->bytes_out,
	};

	if (x->logged)
		return;
	x->logged = true;
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec/ws", x->sbx);
	edge_access_log(&a);
}

/* ews_close_client: the client is closed with code (and reason) once what
 * is queued for it has been written. */
static void ews_close_client(struct edgews *x, uint16_t code, const char *reason,
                             const char *result)
{
	char labels[64];

	if (x->st == EWS_CLOSING)
		return;
	x->st = EWS_CLOSING;
	ws_close_set(&x->close, code, reason);
	snprintf(labels, sizeof(labels), "result=\"%s\"", result);
	metrics_inc("tether_edge_exec_streams_total", labels);
	ews_log(x, result);
	if (x->cwsi != NULL) {
		if (x->cpaused) { /* let lws see the client's own close */
			x->cpaused = false;
			lws_rx_flow_control(x->cwsi, 1);
		}
		lws_callback_on_writable(x->cwsi);
	}
}

/* ews_error: {"type":"error",…} to the client, then close (code). */
static void ews_error(struct edgews *x, uint16_t code, const char *err,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void ews_error(struct edgews *x, uint16_t code, const char *err,
                      const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *o;
	char *s;

	if (x->st == EWS_CLOSING)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	o = json_pack("{s:s,s:s,s:s}", "type", "error", "error", err, "message", msg);
	s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (s != NULL)
		ews_to_client(x, LWS_WRITE_TEXT, s, strlen(s));
	free(s);
	ews_backend_drop(x);
	ews_close_client(x, code, err, err);
}

/* ews_connect: opens the backend stream to the node the route names. */
static void ews_connect(struct edgews *x)
{
	struct lws_client_connect_info cc;
	char url[sizeof(x->rt.node_url)], path[128];
	const char *prot, *host, *upath;
	struct lws *wsi;
	int port;

	snprintf(url, sizeof(url), "%s", x->rt.node_url);
	if (lws_parse_uri(url, &prot, &host, &port, &upath) != 0 ||
	    strcmp(prot, "http") != 0) {
		ews_error(x, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, "unavailable",
		          "unusable node address %s", x->rt.node_url);
		return;
	}
	snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec/ws", x->sbx);
	ws_connect_info(&cc, x->ctx, host, port, path, EDGEWS_PROTOCOL);
	cc.vhost = x->vh;
	cc.opaque_user_data = x;
	x->st = EWS_CONNECT;
	x->start_sent = false;
	wsi = lws_client_connect_via_info(&cc);
	if (x->st != EWS_CONNECT)
		return; /* a connection error was reported synchronously */
	x->bwsi = wsi;
	if (wsi == NULL)
		ews_error(x, 1011, "unavailable",
		          "exec on %s: cannot reach worker node %s; the command did "
		          "not start", x->sbx, x->rt.node_url);
}

/* ews_cap_write: the capability answer, bounded. */
static size_t ews_cap_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct edgews *x = arg;
	size_t n = size * nmemb;
	char *nb;

	if (x->ans_len + n > EWS_CAP_ANSWER_MAX)
		return 0;
	nb = realloc(x->ans, x->ans_len + n + 1);
	if (nb == NULL)
		return 0;
	x->ans = nb;
	memcpy(x->ans + x->ans_len, data, n);
	x->ans_len += n;
	x->ans[x->ans_len] = '\0';
	return n;
}

/* ews_cap_use: stores a capability answer in the route cache (if the slot
 * is still ours) and takes it for this stream. */
static int ews_cap_use(struct edgews *x, json_t *j)
{
	struct route_entry f, take;

	if (edge_cap_parse(j, &f) < 0)
		return -1;
	x->fetching = false; /* the commit ends the fetch and wakes waiters */
	if (edge_cap_commit(ews_env.routes, x->keyhash, x->sbx, &x->ticket, &f,
	                    &take) < 0)
		return -1;
	edge_route_take(&x->rt, &take);
	return 0;
}

/* ews_cap_done: the cp issued (or refused) a capability. */
static void ews_cap_done(CURL *easy, CURLcode rc, void *arg)
{
	struct edgews *x = arg;
	long status = 0;
	json_t *j;
	int ok;

	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
	if (rc != CURLE_OK)
		edge_cp_failed(easy, rc); /* the next fetch asks another replica */
	curl_easy_cleanup(easy);
	curl_slist_free_all(x->hdrs);
	x->hdrs = NULL;
	x->easy = NULL;
	j = x->ans ? json_loadb(x->ans, x->ans_len, JSON_REJECT_DUPLICATES, NULL) : NULL;
	free(x->ans);
	x->ans = NULL;
	x->ans_len = 0;
	if (x->cwsi == NULL || x->st == EWS_CLOSING) {
		json_decref(j);
		if (x->fetching)
			routes_abort(ews_env.routes, x->keyhash, x->sbx);
		x->fetching = false;
		ews_maybe_free(x);
		return;
	}
	if (rc != CURLE_OK) { /* asking for a capability changes nothing */
		if (x->fetching)
			routes_abort(ews_env.routes, x->keyhash, x->sbx);
		x->fetching = false;
		if (ews_retry_later(x)) {
			json_decref(j);
			return; /* the cp restarts: asked again */
		}
	}
	if (rc != CURLE_OK || (status != 200 && status != 201)) {
		const char *code = json_string_value(json_object_get(j, "error"));
		const char *msg = json_string_value(json_object_get(j, "message"));
		char c[48];

		if (x->fetching)
			routes_abort(ews_env.routes, x->keyhash, x->sbx);
		x->fetching = false;
		metrics_inc("tether_edge_upstream_failures_total", "upstream=\"cp\"");
		snprintf(c, sizeof(c), "%s", code ? code : "unavailable");
		if (rc != CURLE_OK)
			ews_error(x, 1011, "unavailable", "control plane: %s",
			          curl_easy_strerror(rc));
		else /* the cp's refusal (401/404/409…): close code 4000 + status */
			ews_error(x, (uint16_t)(4000 + (status < 1000 ? status : 0)),
			          c, "%s", msg ? msg : "the control plane refused");
		json_decref(j);
		return;
	}
	ok = j != NULL && ews_cap_use(x, j) == 0;
	json_decref(j);
	if (x->fetching)
		routes_abort(ews_env.routes, x->keyhash, x->sbx);
	x->fetching = false;
	if (!ok) {
		ews_error(x, 1011, "unavailable",
		          "the control plane answered an unusable capability");
		return;
	}
	ews_connect(x);
}

/* ews_cap_fetch: asks the cp for a capability with the caller's own key. */
static void ews_cap_fetch(struct edgews *x)
{
	struct tt_err err = { 0 };
	CURL *c;

	c = curl_easy_init();
	if (c == NULL)
		goto fail;
	/* the rebuilt attempt asks for another execution than the refused one */
	edge_cap_request(c, edge_cp_url(), x->sbx, x->auth, x->wait_s,
	                 x->retried ? &x->rt : NULL, &x->hdrs);
	{
		char rid[HTTP_RID_MAX + 16];

		snprintf(rid, sizeof(rid), "X-Request-Id: %s", x->rid);
		x->hdrs = curl_slist_append(x->hdrs, rid);
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, x->hdrs);
	}
	http_easy_direct(c);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)x->wait_s + 30L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, ews_cap_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
	x->easy = c;
	if (httpc_start(ews_env.hc, c, ews_cap_done, x, &err) == 0)
		return;
	x->easy = NULL;
	curl_easy_cleanup(c);
fail:
	curl_slist_free_all(x->hdrs);
	x->hdrs = NULL;
	routes_abort(ews_env.routes, x->keyhash, x->sbx);
	x->fetching = false;
	ews_error(x, 1011, "internal", "cannot ask the control plane");
}

/* ews_woken: the fetch this stream waited for is over: resolve again. */
static void ews_woken(void *arg)
{
	struct edgews *x = arg;

	x->waiting = false;
	if (x->cwsi == NULL) {
		ews_maybe_free(x);
		return;
	}
	ews_resolve(x);
}

/* ews_resolve: the route of the next attempt — cached, shared with a fetch
 * in flight, or fetched here. The rebuilt attempt repairs by CAS: the
 * refused route is replaced only if it is still the cached one. */
static void ews_resolve(struct edgews *x)
{
	struct route_entry ent;
	int v;

	memset(&ent, 0, sizeof(ent));
	x->st = EWS_ROUTE;
	x->waiter.fn = ews_woken;
	x->waiter.arg = x;
	v = edge_route_lookup(ews_env.routes, x->keyhash, x->sbx, x->retried,
	                      x->rt.version, &x->waiter, &ent, &x->ticket);
	switch (v) {
	case ROUTE_USE:
		edge_route_take(&x->rt, &ent);
		ews_connect(x);
		return;
	case ROUTE_WAIT:
		x->waiting = true;
		return;
	case ROUTE_FETCH:
		x->fetching = true;
		ews_cap_fetch(x);
		return;
	default:
		ews_error(x, 1011, "internal", "out of memory");
	}
}

/* ews_on_decision: the node's first message. Returns -1 when the backend
 * connection is to be closed at once (the rebuilt attempt replaces it). */
static int ews_on_decision(struct edgews *x, const uint8_t *msg, size_t len)
{
	json_t *j = json_loadb((const char *)msg, len, JSON_REJECT_DUPLICATES, NULL);
	const char *type = json_string_value(json_object_get(j, "type"));
	const char *d = json_string_value(json_object_get(j, "decision"));
	bool refresh = d != NULL && strcmp(d, "refresh_route") == 0, allow;
	char reason[EWS_REASON_MAX + 1];

	if (type != NULL && strcmp(type, "error") == 0) {
		/* the node failed before admission (manager unreachable…):
		 * "unavailable" means nothing ran, so it is tried again */
		const char *e = json_string_value(json_object_get(j, "error"));

		if (wirecode_parse(e) == WIRE_E_UNAVAILABLE && ews_retry_later(x)) {
			json_decref(j);
			routes_drop_if(ews_env.routes, x->keyhash, x->sbx, x->rt.version);
			lws_set_opaque_user_data(x->bwsi, NULL);
			x->bwsi = NULL;
			return -1;
		}
		json_decref(j);
		x->backend_final = true;
		ews_to_client(x, LWS_WRITE_TEXT, msg, len);
		ews_close_client(x, 1011, "error", "error");
		return 0;
	}
	if (type == NULL || strcmp(type, "decision") != 0 || d == NULL) {
		json_decref(j);
		ews_error(x, 1011, "transport", "the node sent no decision");
		return -1;
	}
	allow = strcmp(d, "allow") == 0;
	if (!allow)
		access_refusal_note((const char *)msg, len, x->decision,
		                  sizeof(x->decision), x->reason, sizeof(x->reason));
	json_decref(j); /* d pointed into j */
	if (allow) {
		x->st = EWS_RUNNING;
		if (x->retried)
			metrics_observe_us("tether_edge_route_repair_duration_seconds",
			                   NULL, ews_now_us() - x->reject_us);
		ews_to_client(x, LWS_WRITE_TEXT, msg, len);
		if (x->cpaused && x->bq.bytes < EWS_Q_LOW && x->cwsi != NULL) {
			x->cpaused = false;
			lws_rx_flow_control(x->cwsi, 1);
		}
		if (x->bq.head != NULL)
			lws_callback_on_writable(x->bwsi);
		return 0;
	}
	if (refresh && !x->retried) {
		/* Not executed (admission refused it): exactly one rebuilt
		 * attempt on a repaired route; the client stays connected. */
		metrics_inc("tether_edge_refresh_total", NULL);
		metrics_inc("tether_edge_rebuilt_attempts_total", "why=\"refresh_route\"");
		log_info("exec stream %s: refresh_route (generation %" PRIu64
		         "): rebuilding the backend stream once", x->sbx, x->rt.gen);
		x->retried = true;
		x->reject_us = ews_now_us();
		lws_set_opaque_user_data(x->bwsi, NULL);
		x->bwsi = NULL;
		ews_resolve(x);
		return -1;
	}
	if (refresh)
		metrics_inc("tether_edge_refresh_exhausted_total", NULL);
	x->backend_final = true;
	ews_to_client(x, LWS_WRITE_TEXT, msg, len);
	snprintf(reason, sizeof(reason), "%.*s", (int)len, (const char *)msg);
	ews_backend_drop(x);
	ews_close_client(x, refresh ? 4409 : 4403, reason,
	                 refresh ? "refresh_route" : "deny");
	return 0;
}

/* ews_from_backend: one whole message from the node. */
static int ews_from_backend(struct edgews *x, const uint8_t *msg, size_t len,
                            bool binary)
{
	json_t *j;
	const char *type;

	if (x->st == EWS_DECISION) {
		if (binary) {
			ews_error(x, 1011, "transport", "the node sent output before its decision");
			return -1;
		}
		return ews_on_decision(x, msg, len);
	}
	if (x->st != EWS_RUNNING)
		return 0;
	if (binary) {
		ews_to_client(x, LWS_WRITE_BINARY, msg, len);
		return 0;
	}
	j = json_loadb((const char *)msg, len, JSON_REJECT_DUPLICATES, NULL);
	type = json_string_value(json_object_get(j, "type"));
	ews_to_client(x, LWS_WRITE_TEXT, msg, len);
	if (type != NULL && strcmp(type, "exit") == 0) {
		x->backend_final = true;
		x->gen_served = (uint64_t)json_integer_value(json_object_get(j, "generation"));
		ews_close_client(x, LWS_CLOSE_STATUS_NORMAL, "", "exit");
	} else if (type != NULL && strcmp(type, "error") == 0) {
		x->backend_final = true;
		ews_close_client(x, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, "error", "error");
	}
	json_decref(j);
	return 0;
}

/* ews_retry_fire: the backoff is over: the route is resolved again. */
static void ews_retry_fire(lws_sorted_usec_list_t *sul)
{
	struct edgews *x = lws_container_of(sul, struct edgews, retry_sul);

	x->retry_pending = false;
	if (x->cwsi == NULL || x->st == EWS_CLOSING) {
		ews_maybe_free(x);
		return;
	}
	ews_resolve(x);
}

/* ews_retry_later: the next hop refused the connection (it restarts; the
 * start message reached no one): tried again after 50 ms doubling to 1 s
 * on a freshly resolved route, while the caller's X-Tether-Wait lasts
 * (SPEC §7). The client's WebSocket stays open meanwhile. */
static bool ews_retry_later(struct edgews *x)
{
	x->retry_ms = x->retry_ms ? x->retry_ms * 2 : 50;
	if (x->retry_ms > 1000)
		x->retry_ms = 1000;
	if (x->cwsi == NULL || x->st == EWS_CLOSING ||
	    ews_now_us() + x->retry_ms * 1000u > x->deadline_us)
		return false;
	x->st = EWS_ROUTE;
	x->retry_pending = true;
	lws_sul_schedule(x->ctx, 0, &x->retry_sul, ews_retry_fire,
	                 (lws_usec_t)x->retry_ms * 1000);
	metrics_inc("tether_edge_connect_retries_total", "to=\"stream\"");
	return true;
}

/* ews_backend_gone: the node's connection failed or closed. */
static void ews_backend_gone(struct edgews *x, bool connect_error, const char *why)
{
	x->bwsi = NULL;
	if (x->backend_final || x->st == EWS_CLOSING || x->st == EWS_ROUTE) {
		ews_maybe_free(x);
		return;
	}
	routes_drop_if(ews_env.routes, x->keyhash, x->sbx, x->rt.version);
	metrics_inc("tether_edge_upstream_failures_total", "upstream=\"node\"");
	if ((connect_error || x->st == EWS_CONNECT) && ews_retry_later(x))
		return; /* nothing ran: the node restarts or moved */
	if (connect_error || x->st == EWS_CONNECT)
		ews_error(x, 1011, "unavailable",
		          "exec on %s: cannot reach worker node %s (%s); the command "
		          "did not start", x->sbx, x->rt.node_url, why);
	else {
		metrics_inc("tether_edge_not_repeated_total", NULL);
		ews_error(x, 1011, "transport",
		          "exec on %s: worker node %s broke off the stream; the "
		          "command may or may not have run and was not repeated",
		          x->sbx, x->rt.node_url);
	}
	ews_maybe_free(x);
}

/* ews_filter: authorizes the client's upgrade (never in
 * HTTP_CONFIRM_UPGRADE): the exact path and a Bearer key. */
static int ews_filter(struct lws *wsi, struct edgews_pss *pss)
{
	char sbx[64];
	struct edgews *x;

	if (pss == NULL || http_ws_exec_path(wsi, sbx, sizeof(sbx)) < 0) {
		metrics_inc("tether_edge_exec_streams_total", "result=\"refused_upgrade\"");
		return 1;
	}
	x = calloc(1, sizeof(*x));
	if (x == NULL)
		return 1;
	if (http_header(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, x->auth, sizeof(x->auth)) < 0 ||
	    strncmp(x->auth, "Bearer ", 7) != 0 || x->auth[7] == '\0') {
		sodium_memzero(x->auth, sizeof(x->auth));
		free(x);
		metrics_inc("tether_edge_exec_streams_total", "result=\"unauthorized\"");
		return 1;
	}
	x->wait_s = http_wait_seconds(wsi);
	if (x->wait_s < 0) {
		sodium_memzero(x->auth, sizeof(x->auth));
		free(x);
		return 1;
	}
	crypto_hash_sha256(x->keyhash, (const unsigned char *)x->auth + 7,
	                   strlen(x->auth + 7));
	snprintf(x->sbx, sizeof(x->sbx), "%s", sbx);
	x->cwsi = wsi;
	x->close.wsi = &x->cwsi;
	x->ctx = lws_get_context(wsi);
	x->vh = lws_get_vhost(wsi);
	x->t0_us = ews_now_us();
	x->deadline_us = x->t0_us + (uint64_t)x->wait_s * 1000000u;
	http_request_id(wsi, x->rid);
	pss->x = x;
	metrics_gauge_add("tether_edge_streams_open", "kind=\"exec\"", 1);
	return 0;
}

/* ews_client_rx: a piece of a client message. */
static int ews_client_rx(struct lws *wsi, struct edgews *x, const void *in, size_t len)
{
	int rc;

	if (x->st == EWS_CLOSING)
		return 0;
	rc = asm_add(&x->cin, wsi, in, len, x->st == EWS_START ? EWS_START_MAX : EWS_MSG_MAX);
	if (rc < 0) {
		ews_error(x, 1009, "too_large", "message over %u bytes",
		          x->st == EWS_START ? EWS_START_MAX : EWS_MSG_MAX);
		return 0;
	}
	if (rc == 0)
		return 0;
	x->bytes_in += x->cin.len;
	if (x->st == EWS_START) {
		if (x->cin.binary) {
			ews_error(x, 1008, "bad_request",
			          "the first message must be the JSON start message");
			return 0;
		}
		x->start = (char *)tt_steal_ptr(&x->cin.buf);
		x->start_len = x->cin.len;
		x->cin.len = 0;
		lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0); /* the start came */
		/* input waits for the decision: nothing is forwarded before it */
		x->cpaused = true;
		lws_rx_flow_control(wsi, 0);
		ews_resolve(x);
		return 0;
	}
	if (ws_queue_push(&x->bq, x->cin.binary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT,
	                  0, x->cin.buf, x->cin.len) < 0) {
		ews_error(x, 1011, "internal", "out of memory");
		return 0;
	}
	x->cin.len = 0;
	if (x->st == EWS_RUNNING && x->bwsi != NULL)
		lws_callback_on_writable(x->bwsi);
	if ((x->bq.bytes > EWS_Q_HIGH || x->st != EWS_RUNNING) && !x->cpaused) {
		x->cpaused = true;
		lws_rx_flow_control(wsi, 0);
	}
	return 0;
}

/* ews_client_writeable: one message to the client; the close once drained. */
static int ews_client_writeable(struct lws *wsi, struct edgews *x)
{
	int rc = ws_queue_write(&x->cq, wsi);

	if (rc < 0)
		return -1;
	if (rc == 1) {
		if (x->bpaused && x->cq.bytes < EWS_Q_LOW && x->bwsi != NULL) {
			x->bpaused = false;
			lws_rx_flow_control(x->bwsi, 1);
		}
		if (x->cq.head != NULL || x->st == EWS_CLOSING)
			lws_callback_on_writable(wsi);
		return 0;
	}
	if (x->st == EWS_CLOSING) {
		ws_close_later(&x->close, wsi);
		return 0;
	}
	return 0;
}

/* ews_backend_writeable: the start message first, then (after Allow) the
 * client's input. */
static int ews_backend_writeable(struct lws *wsi, struct edgews *x)
{
	int rc;

	if (!x->start_sent) {
		uint8_t *b = malloc(LWS_PRE + x->start_len);
		int n;

		if (b == NULL)
			return -1;
		memcpy(b + LWS_PRE, x->start, x->start_len);
		n = lws_write(wsi, b + LWS_PRE, x->start_len, LWS_WRITE_TEXT);
		free(b);
		if (n < (int)x->start_len)
			return -1;
		x->start_sent = true;
		return 0;
	}
	if (x->st != EWS_RUNNING)
		return 0;
	rc = ws_queue_write(&x->bq, wsi);
	if (rc < 0)
		return -1;
	if (x->cpaused && x->bq.bytes < EWS_Q_LOW && x->cwsi != NULL) {
		x->cpaused = false;
		lws_rx_flow_control(x->cwsi, 1);
	}
	if (x->bq.head != NULL)
		lws_callback_on_writable(wsi);
	return 0;
}

/* edgews_callback: see ws.h. */
int edgews_callback(struct lws *wsi, enum lws_callback_reasons reason,
                    void *user, void *in, size_t len)
{
	struct edgews_pss *pss = user;
	struct edgews *x;
	int rc;

	switch (reason) {
	/* ---- the client-facing connection ---- */
	case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
		return ews_filter(wsi, pss);
	case LWS_CALLBACK_ESTABLISHED:
		if (pss == NULL || pss->x == NULL)
			return -1;
		/* no start message in time: closed (the key is not checked yet) */
		lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, EWS_START_SECS);
		return 0;
	case LWS_CALLBACK_RECEIVE:
		if (pss == NULL || pss->x == NULL)
			return -1;
		return ews_client_rx(wsi, pss->x, in, len);
	case LWS_CALLBACK_SERVER_WRITEABLE:
		if (pss == NULL || pss->x == NULL)
			return 0;
		return ews_client_writeable(wsi, pss->x);
	case LWS_CALLBACK_CLOSED:
		if (pss == NULL || (x = pss->x) == NULL)
			return 0;
		pss->x = NULL;
		if (x->st != EWS_CLOSING)
			metrics_inc("tether_edge_exec_streams_total", "result=\"client_gone\"");
		ews_log(x, "client_gone");
		x->st = EWS_CLOSING;
		x->cwsi = NULL;
		ews_backend_drop(x);
		ews_maybe_free(x);
		return 0;

	/* ---- the node-facing connection ---- */
	case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
		unsigned char **p = in, *end = *p + len;
		char auth[4200];

		x = lws_get_opaque_user_data(wsi);
		if (x == NULL || x->rt.token == NULL)
			return -1;
		rc = snprintf(auth, sizeof(auth), "Capability %s", x->rt.token);
		rc = rc < 0 || (size_t)rc >= sizeof(auth) ||
		     lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION,
		                                  (unsigned char *)auth, rc, p, end);
		sodium_memzero(auth, sizeof(auth));
		if (rc == 0 && lws_add_http_header_by_name(wsi,
		                   (const unsigned char *)HTTP_RID_HEADER ":",
		                   (const unsigned char *)x->rid, (int)strlen(x->rid), p, end))
			rc = 1;
		return rc ? -1 : 0;
	}
	case LWS_CALLBACK_CLIENT_ESTABLISHED:
		x = lws_get_opaque_user_data(wsi);
		if (x == NULL)
			return -1;
		x->st = EWS_DECISION;
		lws_callback_on_writable(wsi);
		return 0;
	case LWS_CALLBACK_CLIENT_RECEIVE:
		x = lws_get_opaque_user_data(wsi);
		if (x == NULL)
			return -1;
		rc = asm_add(&x->bin, wsi, in, len, EWS_MSG_MAX);
		if (rc < 0) {
			ews_error(x, 1011, "transport", "the node sent an oversized message");
			return -1;
		}
		if (rc == 0)
			return 0;
		rc = ews_from_backend(x, x->bin.buf, x->bin.len, x->bin.binary);
		x->bin.len = 0;
		return rc;
	case LWS_CALLBACK_CLIENT_WRITEABLE:
		x = lws_get_opaque_user_data(wsi);
		if (x == NULL)
			return -1;
		return ews_backend_writeable(wsi, x);
	case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
		x = lws_get_opaque_user_data(wsi);
		if (x == NULL)
			return 0;
		lws_set_opaque_user_data(wsi, NULL);
		if (x->bwsi != wsi && x->bwsi != NULL)
			return 0;
		x->st = x->st == EWS_ROUTE ? EWS_CONNECT : x->st;
		ews_backend_gone(x, true, in ? (const char *)in : "connection failed");
		return 0;
	case LWS_CALLBACK_CLIENT_CLOSED:
		x = lws_get_opaque_user_data(wsi);
		if (x == NULL)
			return 0;
		lws_set_opaque_user_data(wsi, NULL);
		ews_backend_gone(x, false, "closed");
		return 0;
	default:
		return 0;
	}
}

/* Streamed exec over WebSocket (see ws_exec.h, docs/API.md "Streamed exec").
 *
 * One stream = one lws session + one manager connection. The upgrade only
 * checks the path and that a Capability header is present and well-formed
 * (FILTER_PROTOCOL_CONNECTION cannot wait for the manager); the first client
 * message (text, the start message) opens the manager connection with op
 * exec, and the manager's DECISION is the first server message. A non-allow
 * decision closes the socket (4409 / 4403, the §4 body as reason): nothing
 * was forwarded. After Allow: manager DATA_OUT / STDERR become binary
 * messages (first byte 1 / 2), client binary messages become DATA_IN, a
 * {"type":"eof"} text message EOF_IN; RESULT ends with {"type":"exit"} and
 * close 1000, ERROR or a lost manager with {"type":"error"} and close 1011.
 *
 * Backpressure: the manager is paused while more than WSX_OUT_HIGH bytes
 * wait for lws; the client is not read while the manager's write queue is
 * above WIRECONN_HIGH_WATER (or before the decision). */
#include "node/ws_exec.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <sodium.h>

#include "access.h"
#include "claims.h"
#include "http.h"
#include "paseto.h"
#include "log.h"
#include "metrics.h"
#include "node/mgrconn.h"
#include "node/node.h"
#include "wire.h"
#include "wirecode.h"
#include "wireop.h"
#include "wsutil.h"

#define WSX_START_MAX (60u << 10)   /* the start message (fits one REQUEST) */
#define WSX_START_SECS 10           /* for the start message, from the 101 */
#define WSX_OUT_HIGH (1u << 20)     /* pause the manager above this */
#define WSX_OUT_LOW (256u << 10)
#define WSX_CLOSE_REASON_MAX WS_CLOSE_REASON_MAX

enum wsx_state { WSX_START, WSX_DECISION, WSX_RUNNING, WSX_CLOSING };

/* One stream. Owner: the lws session (pss->x); freed on LWS_CALLBACK_CLOSED. */
struct wsexec {
	struct node *n;
	struct lws *wsi;
	struct wireconn *mc;          /* owned; NULL once closed */
	enum wsx_state state;
	char sbx[TT_SBX_ID_LEN + 1];
	char token[PASETO_TOKEN_MAX + 1]; /* secret: zeroed once sent / on free */
	uint8_t *start;              /* start message being assembled (owned) */
	size_t start_len;
	bool want_stdin, eof_sent, rx_paused, mc_paused;
	struct ws_queue q;           /* server messages waiting for lws */
	struct ws_close close;       /* sent once the queue is drained */
	uint64_t generation;
	uint64_t t0_us;
	char rid[HTTP_RID_MAX + 1]; /* X-Request-Id, for the access line */
};

/* wsx_free: releases everything; the session lets go of x. */
static void wsx_free(struct wsexec *x)
{
	if (x == NULL)
		return;
	ws_close_cancel(&x->close);
	wireconn_close(x->mc);
	ws_queue_clear(&x->q);
	free(x->start);
	sodium_memzero(x->token, sizeof(x->token));
	free(x);
	metrics_gauge_add("tether_node_streams_open", "kind=\"exec\"", -1);
}

/* wsx_queue: queues one server message (copied) and asks for a write. */
static int wsx_queue(struct wsexec *x, enum lws_write_protocol kind,
                     uint8_t tag, const void *data, size_t len)
{
	if (ws_queue_push(&x->q, kind, tag, data, len) < 0)
		return -1;
	lws_callback_on_writable(x->wsi);
	return 0;
}

/* wsx_finish: queues a last text message (obj stolen, may be NULL) and the
 * close that follows it; the manager connection is done. */
static void wsx_finish(struct wsexec *x, json_t *obj, uint16_t code,
                       const char *reason, const char *result)
{
	char labels[64];
	char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;

	json_decref(obj);
	if (x->state == WSX_CLOSING) {
		free(s);
		return;
	}
	x->state = WSX_CLOSING;
	wireconn_close(x->mc);
	x->mc = NULL;
	if (s != NULL && wsx_queue(x, LWS_WRITE_TEXT, 0, s, strlen(s)) < 0)
		code = LWS_CLOSE_STATUS_UNEXPECTED_CONDITION;
	free(s);
	ws_close_set(&x->close, code, reason);
	snprintf(labels, sizeof(labels), "result=\"%s\"", result);
	metrics_inc("tether_node_exec_streams_total", labels);
	metrics_observe_us("tether_node_exec_stream_duration_seconds", NULL,
	                   uv_hrtime() / 1000u - x->t0_us);
	access_log(&(struct tt_access){ .rid = x->rid, .route = "exec_stream",
	                                .sbx = x->sbx, .status = 101,
	                                .result = result, .generation = x->generation,
	                                .dur_us = uv_hrtime() / 1000u - x->t0_us });
	if (x->rx_paused) { /* let lws see the peer's close */
		x->rx_paused = false;
		lws_rx_flow_control(x->wsi, 1);
	}
	lws_callback_on_writable(x->wsi);
}

/* wsx_fail: {"type":"error",…} then close 1011. */
static void wsx_fail(struct wsexec *x, enum wire_code code, const char *msg)
{
	const char *name = wirecode_name(code);

	wsx_finish(x, json_pack("{s:s,s:s,s:s}", "type", "error", "error", name,
	                        "message", msg),
	           LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, name, name);
}

/* wsx_on_decision: Allow lets the client's input through; anything else is
 * sent as is and closes the stream (nothing ran). */
static void wsx_on_decision(struct wsexec *x, const struct wire_frame *f)
{
	enum tt_verdict v;
	json_t *obj = mgrconn_decision(f, &v);

	if (obj == NULL) {
		wsx_fail(x, WIRE_E_TRANSPORT, "manager sent an invalid decision");
		return;
	}
	if (v != TT_ALLOW) {
		bool refresh = v == TT_REFRESH_ROUTE;
		char body[WSX_CLOSE_REASON_MAX + 1];

		json_object_set_new(obj, "type", json_string("decision"));
		snprintf(body, sizeof(body), "%.*s", (int)f->len, (const char *)f->payload);
		wsx_finish(x, obj, refresh ? 4409 : 4403, body,
		           decision_verdict_name(v));
		return;
	}
	json_object_set_new(obj, "type", json_string("decision"));
	{
		char *s = json_dumps(obj, JSON_COMPACT);

		json_decref(obj);
		if (s == NULL || wsx_queue(x, LWS_WRITE_TEXT, 0, s, strlen(s)) < 0) {
			free(s);
			wsx_fail(x, WIRE_E_INTERNAL, "out of memory");
			return;
		}
		free(s);
	}
	x->state = WSX_RUNNING;
	if (x->rx_paused) {
		x->rx_paused = false;
		lws_rx_flow_control(x->wsi, 1);
	}
}

/* wsx_on_frame: frames from the manager. */
static void wsx_on_frame(void *arg, const struct wire_frame *f)
{
	struct wsexec *x = arg;
	json_error_t jerr;
	json_t *obj;

	if (x->state == WSX_CLOSING)
		return;
	if (x->state == WSX_DECISION) {
		if (f->type == WIRE_DECISION)
			wsx_on_decision(x, f);
		else if (f->type == WIRE_ERROR)
			goto error;
		else
			wsx_fail(x, WIRE_E_TRANSPORT, "manager answered before its decision");
		return;
	}
	switch (f->type) {
	case WIRE_DATA_OUT:
	case WIRE_STDERR:
		if (wsx_queue(x, LWS_WRITE_BINARY, f->type == WIRE_DATA_OUT ? 1 : 2,
		              f->payload, f->len) < 0) {
			wsx_fail(x, WIRE_E_INTERNAL, "out of memory");
			return;
		}
		if (x->q.bytes > WSX_OUT_HIGH && !x->mc_paused) {
			x->mc_paused = true;
			wireconn_pause(x->mc);
		}
		return;
	case WIRE_RESULT:
		obj = json_loadb((const char *)f->payload, f->len,
		                 JSON_REJECT_DUPLICATES, &jerr);
		if (!json_is_integer(json_object_get(obj, "exit_code"))) {
			json_decref(obj);
			wsx_fail(x, WIRE_E_TRANSPORT, "manager sent an invalid result");
			return;
		}
		json_object_set_new(obj, "type", json_string("exit"));
		wsx_finish(x, obj, LWS_CLOSE_STATUS_NORMAL, "", "exit");
		return;
	case WIRE_ERROR:
		goto error;
	default:
		return; /* nothing else is meaningful for exec */
	}
error:
	obj = json_loadb((const char *)f->payload, f->len, JSON_REJECT_DUPLICATES,
	                 &jerr);
	{
		enum wire_code code = wirecode_parse(json_string_value(json_object_get(obj, "error")));
		const char *msg = json_string_value(json_object_get(obj, "message"));
		char m[256];

		snprintf(m, sizeof(m), "%s", msg ? msg : "operation failed");
		json_decref(obj);
		wsx_fail(x, code, m);
	}
}

/* wsx_on_end: the manager connection ended without RESULT/ERROR. */
static void wsx_on_end(void *arg, const struct tt_err *err)
{
	struct wsexec *x = arg;

	if (x->state == WSX_CLOSING)
		return;
	log_warn("exec stream %s: %s", x->sbx, err->msg);
	if (err->code == TT_ERR_IO && x->state == WSX_DECISION)
		wsx_fail(x, WIRE_E_UNAVAILABLE, "the sandbox manager is not reachable");
	else
		wsx_fail(x, WIRE_E_TRANSPORT, "lost the manager connection");
}

/* wsx_on_drain: stdin went out to the manager; read the client again. */
static void wsx_on_drain(void *arg)
{
	struct wsexec *x = arg;

	if (x->rx_paused && x->state == WSX_RUNNING) {
		x->rx_paused = false;
		lws_rx_flow_control(x->wsi, 1);
	}
}

/* wsx_start: the start message is complete: validate it, build the exec
 * REQUEST (token included, for the manager only) and open the connection. */
static void wsx_start(struct wsexec *x)
{
	static const struct wireconn_cbs cbs = {
		.on_frame = wsx_on_frame,
		.on_end = wsx_on_end,
		.on_drain = wsx_on_drain,
	};
	json_error_t jerr;
	json_t *body = json_loadb((const char *)x->start, x->start_len,
	                          JSON_REJECT_DUPLICATES, &jerr);
	json_t *cmd = json_object_get(body, "cmd"), *env = json_object_get(body, "env");
	json_t *cwd = json_object_get(body, "cwd"), *in = json_object_get(body, "stdin");
	json_t *req, *v;
	struct tt_err err = { 0 };
	const char *k, *bad = NULL;
	size_t i;

	free(x->start);
	x->start = NULL;
	if (!json_is_object(body))
		bad = "the start message must be a JSON object";
	else if (!json_is_array(cmd) || json_array_size(cmd) == 0 ||
	         json_array_size(cmd) > 1024)
		bad = "\"cmd\" must be a non-empty array of strings";
	json_array_foreach(cmd, i, v)
		if (!json_is_string(v))
			bad = "\"cmd\" must be a non-empty array of strings";
	if (env != NULL && !json_is_object(env))
		bad = "\"env\" must be an object";
	json_object_foreach(env, k, v)
		if (!json_is_string(v))
			bad = "\"env\" values must be strings";
	if (cwd != NULL && !json_is_string(cwd))
		bad = "\"cwd\" must be a string";
	if (in != NULL && !json_is_boolean(in))
		bad = "\"stdin\" must be a boolean";
	if (bad != NULL) {
		json_decref(body);
		wsx_fail(x, WIRE_E_BAD_REQUEST, bad);
		return;
	}
	x->want_stdin = json_is_true(in);
	/* "stream": the manager cancels it at a retirement like any stream
	 * (it strips the field before the bridge) */
	req = json_pack("{s:s,s:s,s:s,s:O,s:b,s:b}", "token", x->token, "sbx", x->sbx,
	                "op", wireop_name(WIRE_OP_EXEC), "cmd", cmd, "stdin", x->want_stdin, "stream", 1);
	sodium_memzero(x->token, sizeof(x->token));
	if (req != NULL && env != NULL)
		json_object_set(req, "env", env);
	if (req != NULL && cwd != NULL)
		json_object_set(req, "cwd", cwd);
	json_decref(body);
	if (req == NULL) {
		wsx_fail(x, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	x->state = WSX_DECISION;
	/* stdin waits for the decision: nothing is forwarded before Allow */
	x->rx_paused = true;
	lws_rx_flow_control(x->wsi, 0);
	x->mc = mgrconn_open(x->n, req, &cbs, x, &err);
	/* the encoded REQUEST (with the token) lives in mc until it is sent */
	json_object_set_new(req, "token", json_string(""));
	json_decref(req);
	if (x->mc == NULL)
		wsx_fail(x, err.code == TT_ERR_TOO_LARGE ? WIRE_E_TOO_LARGE : WIRE_E_INTERNAL,
		         err.msg);
}

/* wsx_receive: one client message piece. */
static int wsx_receive(struct lws *wsi, struct wsexec *x, const void *in,
                       size_t len)
{
	struct tt_err err = { 0 };
	bool binary = lws_frame_is_binary(wsi) != 0;

	if (x->state == WSX_CLOSING)
		return 0;
	if (x->state == WSX_START) {
		uint8_t *nb;

		if (binary || x->start_len + len > WSX_START_MAX) {
			wsx_fail(x, WIRE_E_BAD_REQUEST, binary ?
			         "the first message must be the JSON start message" :
			         "start message too large");
			return 0;
		}
		nb = realloc(x->start, x->start_len + len + 1);
		if (nb == NULL) {
			wsx_fail(x, WIRE_E_INTERNAL, "out of memory");
			return 0;
		}
		x->start = nb;
		memcpy(x->start + x->start_len, in, len);
		x->start_len += len;
		if (lws_is_final_fragment(wsi)) {
			lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0); /* it came */
			wsx_start(x);
		}
		return 0;
	}
	if (x->state != WSX_RUNNING)
		return 0; /* paused; cannot happen */
	if (binary) {
		if (!x->want_stdin || x->eof_sent) {
			wsx_fail(x, WIRE_E_BAD_REQUEST, "stdin was not requested or is closed");
			return 0;
		}
		if (len > 0 && wireconn_send_data(x->mc, WIRE_DATA_IN, in, len, &err) < 0) {
			wsx_fail(x, WIRE_E_TRANSPORT, "lost the manager connection");
			return 0;
		}
		if (wireconn_queued(x->mc) > WIRECONN_HIGH_WATER && !x->rx_paused) {
			x->rx_paused = true;
			lws_rx_flow_control(wsi, 0);
		}
		return 0;
	}
	/* text after the start: only {"type":"eof"} (small, one fragment) */
	if (len > 0 && len < 64 && memmem(in, len, "\"eof\"", 5) != NULL) {
		if (x->want_stdin && !x->eof_sent) {
			uint8_t none = 0;

			x->eof_sent = true;
			if (wireconn_send(x->mc, WIRE_EOF_IN, &none, 0, &err) < 0)
				wsx_fail(x, WIRE_E_TRANSPORT, "lost the manager connection");
		}
		return 0;
	}
	wsx_fail(x, WIRE_E_BAD_REQUEST, "unexpected text message");
	return 0;
}

/* wsx_writeable: one queued message per call; the close once drained. */
static int wsx_writeable(struct lws *wsi, struct wsexec *x)
{
	int rc = ws_queue_write(&x->q, wsi);

	if (rc < 0)
		return -1;
	if (rc == 1) {
		if (x->mc_paused && x->q.bytes < WSX_OUT_LOW && x->mc != NULL) {
			x->mc_paused = false;
			wireconn_resume(x->mc);
		}
		if (x->q.head != NULL || x->state == WSX_CLOSING)
			lws_callback_on_writable(wsi);
		return 0;
	}
	if (x->state == WSX_CLOSING)
		ws_close_later(&x->close, wsi);
	return 0;
}

/* wsexec_callback: see ws_exec.h. */
int wsexec_callback(struct lws *wsi, enum lws_callback_reasons reason,
                    void *user, void *in, size_t len)
{
	struct wsexec_pss *pss = user;
	struct node *n = lws_context_user(lws_get_context(wsi));
	char sbx[TT_SBX_ID_LEN + 2], tok[PASETO_TOKEN_MAX + 1];
	struct wsexec *x;

	switch (reason) {
	case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
		/* The upgrade is authorized here (never in
		 * HTTP_CONFIRM_UPGRADE): the exact path, a valid sandbox id and a
		 * well-formed capability. Admission proper is the manager's, on
		 * the start message; the token is checked again there. */
		if (pss == NULL || http_ws_exec_path(wsi, sbx, sizeof(sbx)) < 0) {
			metrics_inc("tether_node_exec_streams_total", "result=\"refused_upgrade\"");
			return 1;
		}
		if (http_capability_token(wsi, tok, sizeof(tok)) < 0) {
			metrics_inc("tether_node_admission_total",
			            "decision=\"deny\",reason=\"malformed\"");
			return 1;
		}
		x = calloc(1, sizeof(*x));
		if (x == NULL) {
			sodium_memzero(tok, sizeof(tok));
			return 1;
		}
		x->n = n;
		x->wsi = wsi;
		x->close.wsi = &x->wsi;
		x->t0_us = uv_hrtime() / 1000u;
		http_request_id(wsi, x->rid);
		memcpy(x->sbx, sbx, sizeof(x->sbx));
		memcpy(x->token, tok, sizeof(x->token));
		sodium_memzero(tok, sizeof(tok));
		pss->x = x;
		metrics_gauge_add("tether_node_streams_open", "kind=\"exec\"", 1);
		return 0;
	case LWS_CALLBACK_ESTABLISHED:
		if (pss == NULL || pss->x == NULL)
			return -1;
		pss->x->wsi = wsi;
		/* no (whole) start message in time: closed, as at the edge */
		lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, WSX_START_SECS);
		return 0;
	case LWS_CALLBACK_RECEIVE:
		if (pss == NULL || pss->x == NULL)
			return -1;
		return wsx_receive(wsi, pss->x, in, len);
	case LWS_CALLBACK_SERVER_WRITEABLE:
		if (pss == NULL || pss->x == NULL)
			return 0;
		return wsx_writeable(wsi, pss->x);
	case LWS_CALLBACK_CLOSED:
	case LWS_CALLBACK_WSI_DESTROY:
		if (pss != NULL && pss->x != NULL) {
			if (pss->x->state != WSX_CLOSING)
				metrics_inc("tether_node_exec_streams_total",
				            "result=\"client_gone\"");
			wsx_free(pss->x);
			pss->x = NULL;
		}
		return 0;
	default:
		return 0;
	}
}

/* node-api: one operation's life on its sbx-manager connection: the
 * REQUEST sent, the DECISION, the frames that follow (exec output, file
 * bytes, listing entries, uploads with backpressure both ways) and the
 * RESULT or ERROR that ends it, turned into the HTTP answer.
 *
 * Exec stdout/stderr are JSON strings: bytes that are not valid UTF-8 are
 * replaced by U+FFFD (binary output belongs in a file read). */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "access.h"
#include "cleanup.h"
#include "log.h"
#include "metrics.h"
#include "node/api_int.h"
#include "wirecode.h"

/* api_now_us: see api_int.h. */
uint64_t api_now_us(void)
{
	return uv_hrtime() / 1000u;
}

/* buf_append: see api_int.h. */
int buf_append(struct api_buf *b, const void *data, size_t len,
               size_t cap)
{
	uint8_t *nb;

	if (b->len + len > cap) {
		b->truncated = true;
		len = cap - b->len;
	}
	if (len == 0)
		return 0;
	nb = realloc(b->p, b->len + len);
	if (nb == NULL)
		return -1;
	b->p = nb;
	memcpy(b->p + b->len, data, len);
	b->len += len;
	return 0;
}

/* utf8_seq_len: length of the valid UTF-8 sequence at s, 0 if invalid. */
static size_t utf8_seq_len(const uint8_t *s, size_t n)
{
	uint8_t c = s[0];
	size_t len;
	uint32_t cp;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, cp = c & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates and values past U+10FFFF are invalid. */
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
	    (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return 0;
	return len;
}

/* utf8_json_string: bytes -> JSON string, invalid bytes as U+FFFD. */
static json_t *utf8_json_string(const uint8_t *s, size_t n)
{
	_cleanup_free_ char *o = malloc(n * 3 + 1);
	size_t i = 0, w = 0;

	if (o == NULL)
		return NULL;
	while (i < n) {
		size_t l = utf8_seq_len(s + i, n - i);

		if (l == 0) {
			memcpy(o + w, "\xef\xbf\xbd", 3);
			w += 3;
			i++;
			continue;
		}
		memcpy(o + w, s + i, l);
		w += l;
		i += l;
	}
	return json_stringn(o, w);
}

/* api_count: see api_int.h. */
void api_count(const struct api_done *d)
{
	char labels[96], dec[32] = "", reason[48] = "";
	uint64_t dur = api_now_us() - d->t0_us;

	snprintf(labels, sizeof(labels), "route=\"%s\",code=\"%u\"",
	         api_route_names[d->route], d->status);
	metrics_inc("tether_node_requests_total", labels);
	snprintf(labels, sizeof(labels), "route=\"%s\"", api_route_names[d->route]);
	metrics_observe_us("tether_node_request_duration_seconds", labels, dur);
	if (d->route == R_HEALTHZ || d->route == R_METRICS)
		return; /* probes and scrapes: not access lines (as at the edge) */
	if (d->body != NULL && (d->status == 403 || d->status == 409))
		access_refusal_note(d->body, d->body_len, dec, sizeof(dec), reason,
		                    sizeof(reason));
	access_log(&(struct tt_access){
	        .rid = d->rid, .route = api_route_names[d->route], .sbx = d->sbx,
	        .status = d->status, .decision = dec, .reason = reason,
	        .dur_us = dur, .bytes_in = d->bytes_in, .bytes_out = d->bytes_out });
}

/* api_op_count: see api_int.h. */
void api_op_count(const struct api_op *op, unsigned status)
{
	bool json = op->state == OP_REPLY || op->state == OP_DRAIN ||
	            op->reply != NULL;

	api_count(&(struct api_done){
	        .route = op->route, .status = status, .t0_us = op->t0_us,
	        .rid = op->rid, .sbx = op->sbx,
	        .body = json ? op->reply : NULL, .body_len = json ? op->reply_len : 0,
	        .bytes_out = op->reply != NULL ? op->reply_len : op->sent });
}

/* op_free: see api_int.h. */
void op_free(struct api_op *op)
{
	struct api_chunk *c, *next;

	if (op == NULL)
		return;
	wireconn_close(op->mc);
	http_rxguard_stop(op->rxg);
	json_decref(op->req);
	http_body_free(&op->body);
	if (op->stdin_data != NULL)
		sodium_memzero(op->stdin_data, op->stdin_len);
	free(op->stdin_data);
	free(op->out.p);
	free(op->err.p);
	free(op->pending.p);
	free(op->reply);
	for (c = op->q_head; c != NULL; c = next) {
		next = c->next;
		free(c);
	}
	free(op);
}

/* op_rx_resume: lets lws read the client again. lws 4.1's h1 handler
 * returns early for a wsi whose rx is flow-controlled, POLLOUT included:
 * a writable request made while paused is never served and never cleared,
 * so the level-triggered EPOLLOUT wakes the loop forever (a 100 % CPU spin)
 * and the reply never goes out. Every reply therefore resumes rx first. */
static void op_rx_resume(struct api_op *op)
{
	if (!op->rx_paused || op->wsi == NULL)
		return;
	op->rx_paused = false;
	lws_rx_flow_control(op->wsi, 1);
}

/* op_reply: records the final answer and asks lws for a write slot
 * (replies are written from LWS_CALLBACK_HTTP_WRITEABLE). body is taken. */
static void op_reply(struct api_op *op, unsigned status, char *body)
{
	wireconn_close(op->mc);
	op->mc = NULL;
	free(op->reply);
	op->status = status;
	op->reply = body;
	op->reply_len = body ? strlen(body) : 0;
	op->state = OP_REPLY;
	/* An upload answered before its body is in (a refusal, a guest
	 * error, no space): answered, then drained (OP_DRAIN). */
	op_rx_resume(op);
	if (op->wsi != NULL)
		lws_callback_on_writable(op->wsi);
}

/* op_reply_json: steals obj. */
static void op_reply_json(struct api_op *op, unsigned status, json_t *obj)
{
	char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;

	json_decref(obj);
	if (s == NULL) {
		op_reply(op, 500, strdup("{\"error\":\"internal\",\"message\":\"out of memory\"}"));
		return;
	}
	op_reply(op, status, s);
}

/* op_reply_error: see api_int.h. */
void op_reply_error(struct api_op *op, enum wire_code code, const char *msg)
{
	op_reply_json(op, wirecode_status(code),
	              json_pack("{s:s,s:s}", "error", wirecode_name(code), "message", msg));
}

/* deny_malformed_json: see api_int.h. */
char *deny_malformed_json(const char *sbx)
{
	json_t *o = json_pack("{s:s,s:s,s:s}", "decision", "deny", "reason",
	                      "malformed", "sandbox", sbx);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return s;
}

/* op_send: see api_int.h. */
bool op_send(struct api_op *op, uint8_t type, const void *data,
             size_t len)
{
	struct tt_err err = { 0 };
	int rc = len == 0 ? wireconn_send(op->mc, type, data, 0, &err)
	                  : wireconn_send_data(op->mc, type, data, len, &err);

	if (rc == 0)
		return true;
	log_warn("%s %s: %s", api_route_names[op->route], op->sbx, err.msg);
	op_reply_error(op, WIRE_E_TRANSPORT, "lost the manager connection");
	return false;
}

/* put_flush: see api_int.h. */
void put_flush(struct api_op *op)
{
	if (op->pending.len > 0) {
		if (!op_send(op, WIRE_DATA_IN, op->pending.p, op->pending.len))
			return;
		free(op->pending.p);
		op->pending.p = NULL;
		op->pending.len = 0;
	}
	if (op->body_done) {
		uint8_t none = 0;

		/* once: a drain after the last bytes calls here again */
		if (!op->eof_sent && !op_send(op, WIRE_EOF_IN, &none, 0))
			return;
		op->eof_sent = true;
		op_rx_resume(op);
		return;
	}
	if (wireconn_queued(op->mc) < WIRECONN_HIGH_WATER)
		op_rx_resume(op);
}

/* op_on_decision: Allow continues the operation; anything else is the
 * answer, passed on unchanged. */
static void op_on_decision(struct api_op *op, const struct wire_frame *f)
{
	enum tt_verdict v;
	json_t *obj = mgrconn_decision(f, &v);

	if (obj == NULL) {
		op_reply_error(op, WIRE_E_TRANSPORT, "manager sent an invalid decision");
		return;
	}
	json_decref(obj);
	if (v != TT_ALLOW) {
		op_reply(op, (unsigned)decision_http_status(v),
		         strndup((const char *)f->payload, f->len));
		return;
	}
	op->state = OP_RUNNING;
	op->allowed = true;
	if (op->route == R_EXEC && op->stdin_data != NULL) {
		uint8_t none = 0;

		if (!op_send(op, WIRE_DATA_IN, op->stdin_data, op->stdin_len) ||
		    !op_send(op, WIRE_EOF_IN, &none, 0))
			return;
	}
	if (op->route == R_FILES_PUT) {
		if (op->expect && !op->body_done && op->wsi != NULL &&
		    http_continue(op->wsi) < 0)
			log_warn("%s %s: cannot send 100 Continue", api_route_names[op->route],
			         op->sbx);
		put_flush(op);
	}
}

/* op_on_result: RESULT ends the operation successfully. */
static void op_on_result(struct api_op *op, const struct wire_frame *f)
{
	json_error_t jerr;
	json_t *res = json_loadb((const char *)f->payload, f->len,
	                         JSON_REJECT_DUPLICATES, &jerr);
	json_t *entries;

	if (!json_is_object(res)) {
		json_decref(res);
		if (op->route == R_FILES_GET) {
			stream_fail(op, WIRE_E_TRANSPORT, "manager sent an invalid result");
			return;
		}
		op_reply_error(op, WIRE_E_TRANSPORT, "manager sent an invalid result");
		return;
	}
	switch (op->route) {
	case R_EXEC:
		json_object_set_new(res, "stdout", utf8_json_string(op->out.p, op->out.len));
		json_object_set_new(res, "stderr", utf8_json_string(op->err.p, op->err.len));
		if (op->out.truncated || op->err.truncated)
			json_object_set_new(res, "truncated", json_true());
		op_reply_json(op, 200, res);
		return;
	case R_FILES_GET:
		/* Only the announced length, complete, ends a read well. */
		if (!op->have_meta || op->got != op->content_len ||
		    !json_is_integer(json_object_get(res, "size")) ||
		    (uint64_t)json_integer_value(json_object_get(res, "size")) !=
		            op->content_len) {
			json_decref(res);
			stream_fail(op, WIRE_E_TRANSPORT,
			            "the sandbox ended the read short of its size");
			return;
		}
		json_decref(res);
		wireconn_close(op->mc);
		op->mc = NULL;
		op->stream_end = true;
		op->state = OP_STREAM;
		lws_callback_on_writable(op->wsi);
		return;
	case R_LIST:
		entries = list_build(op, json_object_get(res, "entries_total"));
		if (entries == NULL) {
			json_decref(res);
			op_reply_error(op, WIRE_E_TRANSPORT,
			               "the sandbox sent an invalid listing");
			return;
		}
		json_object_del(res, "entries_total");
		json_object_set_new(res, "entries", entries);
		op_reply_json(op, 200, res);
		return;
	default:
		op_reply_json(op, 200, res);
		return;
	}
}

/* op_on_error: ERROR from the manager, bridge or guest. */
static void op_on_error(struct api_op *op, const struct wire_frame *f)
{
	json_error_t jerr;
	json_t *obj = json_loadb((const char *)f->payload, f->len,
	                         JSON_REJECT_DUPLICATES, &jerr);
	const char *code = json_string_value(json_object_get(obj, "error"));
	const char *msg = json_string_value(json_object_get(obj, "message"));
	enum wire_code wc = wirecode_parse(code);

	if (op->route == R_FILES_GET && op->headers_sent) {
		/* The headers promised a length: only a broken transfer tells
		 * the client the file is incomplete. */
		log_warn("files_get %s: error after the headers: %s: %s", op->sbx,
		         code ? code : "?", msg ? msg : "");
		json_decref(obj);
		stream_fail(op, WIRE_E_INTERNAL, "error after the headers");
		return;
	}
	/* A stream that got no byte yet answers like any other error. */
	op->state = OP_RUNNING;
	if (wc == WIRE_E_REFRESH_ROUTE) {
		/* admitted, then its execution was retired while it ran: it may
		 * have run, so it is a transport failure to the caller (a read
		 * is retried, a write or exec never repeated), not a refusal */
		op_reply_error(op, WIRE_E_TRANSPORT, "the execution was retired while "
		               "this operation ran: it may or may not have run");
		json_decref(obj);
		return;
	}
	op_reply_error(op, wc, msg ? msg : "operation failed");
	json_decref(obj);
}

/* op_on_frame: frames from the manager, by operation state. */
static void op_on_frame(void *arg, const struct wire_frame *f)
{
	struct api_op *op = arg;

	if (op->state == OP_REPLY)
		return;
	if (!op->allowed) {
		if (f->type == WIRE_DECISION)
			op_on_decision(op, f);
		else if (f->type == WIRE_ERROR)
			op_on_error(op, f);
		else
			op_reply_error(op, WIRE_E_TRANSPORT,
			               "manager answered before its decision");
		return;
	}
	switch (f->type) {
	case WIRE_META:
		if (op->route == R_FILES_GET)
			stream_on_meta(op, f);
		break;
	case WIRE_DATA_OUT:
		if (op->route == R_EXEC) {
			if (buf_append(&op->out, f->payload, f->len, API_OUT_MAX) < 0)
				op_reply_error(op, WIRE_E_INTERNAL, "out of memory");
		} else if (op->route == R_FILES_GET && f->len > 0) {
			stream_push(op, f->payload, f->len);
			if (op->state == OP_STREAM && !op->stream_abort &&
			    op->content_len > API_WHOLE_MAX) /* else: on RESULT */
				lws_callback_on_writable(op->wsi);
		} else if (op->route == R_LIST) {
			list_feed(op, f->payload, f->len);
		}
		break;
	case WIRE_STDERR:
		if (op->route == R_EXEC &&
		    buf_append(&op->err, f->payload, f->len, API_OUT_MAX) < 0)
			op_reply_error(op, WIRE_E_INTERNAL, "out of memory");
		break;
	case WIRE_RESULT:
		op_on_result(op, f);
		break;
	case WIRE_ERROR:
		op_on_error(op, f);
		break;
	default:
		break; /* nothing else is meaningful here; ignore */
	}
}

/* op_on_end: the manager connection ended without RESULT/ERROR. */
static void op_on_end(void *arg, const struct tt_err *err)
{
	struct api_op *op = arg;

	if (op->state == OP_REPLY || op->stream_end)
		return;
	log_warn("%s %s: %s", api_route_names[op->route], op->sbx, err->msg);
	if (op->route == R_FILES_GET && op->headers_sent) {
		stream_fail(op, WIRE_E_TRANSPORT, "lost the manager connection");
		return;
	}
	if (err->code == TT_ERR_IO)
		op_reply_error(op, WIRE_E_UNAVAILABLE, "the sandbox manager is not reachable");
	else
		op_reply_error(op, WIRE_E_TRANSPORT, "lost the manager connection");
}

/* op_on_drain: PUT bytes went out to the manager; read the client again. */
static void op_on_drain(void *arg)
{
	struct api_op *op = arg;

	if (op->route == R_FILES_PUT && op->allowed)
		put_flush(op);
}

/* op_start: see api_int.h. */
void op_start(struct api_op *op)
{
	static const struct wireconn_cbs cbs = {
		.on_frame = op_on_frame,
		.on_end = op_on_end,
		.on_drain = op_on_drain,
	};
	struct tt_err err = { 0 };

	op->state = OP_DECISION;
	op->mc = mgrconn_open(op->n, op->req, &cbs, op, &err);
	if (op->mc == NULL)
		op_reply_error(op, err.code == TT_ERR_TOO_LARGE ? WIRE_E_TOO_LARGE
		                                                : WIRE_E_INTERNAL, err.msg);
}

/* node-api: the worker's HTTP front door (docs/API.md "Node-api"): routes
 * each request, takes in its body (exec JSON, a streamed upload held until
 * admission) and writes its answer. Every operation opens its own
 * connection to the sbx-manager, which admits it (SPEC §4) before anything
 * reaches the sandbox (api_op.c); refusals are passed on unchanged. */
#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "log.h"
#include "metrics.h"
#include "node/api_int.h"
#include "node/ws_exec.h"
#include "paseto.h"
#include "wireop.h"

const char *const api_route_names[R_COUNT] = {
	"exec", "files_get", "files_put", "files_delete", "stat", "list",
	"mkdir", "metrics", "healthz", "other",
};

/* The operation each sandbox route sends its manager (lib/wireop.h). */
static const enum wire_op api_route_ops[R_COUNT] = {
	[R_EXEC] = WIRE_OP_EXEC, [R_FILES_GET] = WIRE_OP_FS_READ,
	[R_FILES_PUT] = WIRE_OP_FS_WRITE, [R_FILES_DELETE] = WIRE_OP_FS_REMOVE,
	[R_STAT] = WIRE_OP_FS_STAT, [R_LIST] = WIRE_OP_FS_LIST,
	[R_MKDIR] = WIRE_OP_FS_MKDIR,
};

/* exec_build: validates the exec body and builds the guest REQUEST. */
static int exec_build(struct api_op *op, json_t *body, struct tt_err *err)
{
	json_t *cmd = json_object_get(body, "cmd");
	json_t *env = json_object_get(body, "env");
	json_t *cwd = json_object_get(body, "cwd");
	json_t *in = json_object_get(body, "stdin");
	const char *k;
	size_t i;
	json_t *v;

	if (!json_is_array(cmd) || json_array_size(cmd) == 0 ||
	    json_array_size(cmd) > 1024)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "\"cmd\" must be a non-empty array of strings");
	json_array_foreach(cmd, i, v)
		if (!json_is_string(v))
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "\"cmd\" must be a non-empty array of strings");
	if (env != NULL) {
		if (!json_is_object(env))
			return tt_err_set(err, TT_ERR_MALFORMED, "\"env\" must be an object");
		json_object_foreach(env, k, v)
			if (!json_is_string(v))
				return tt_err_set(err, TT_ERR_MALFORMED,
				                  "\"env\" values must be strings");
	}
	if (cwd != NULL && !json_is_string(cwd))
		return tt_err_set(err, TT_ERR_MALFORMED, "\"cwd\" must be a string");
	if (in != NULL && !json_is_string(in))
		return tt_err_set(err, TT_ERR_MALFORMED, "\"stdin\" must be a string");
	json_object_set(op->req, "cmd", cmd);
	if (env != NULL)
		json_object_set(op->req, "env", env);
	if (cwd != NULL)
		json_object_set(op->req, "cwd", cwd);
	if (in != NULL) {
		op->stdin_len = json_string_length(in);
		op->stdin_data = malloc(op->stdin_len + 1);
		if (op->stdin_data == NULL)
			return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		memcpy(op->stdin_data, json_string_value(in), op->stdin_len);
		json_object_set_new(op->req, "stdin", json_true());
	} else {
		/* Nothing to send after the Allow: it may come with the answer
		 * (one wake-up here instead of two). */
		json_object_set_new(op->req, "allow_with_answer", json_true());
	}
	return 0;
}

/* api_method: the request method as a route-matching tag. */
static const char *api_method(struct lws *wsi)
{
	if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI) > 0)
		return "GET";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0)
		return "POST";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_PUT_URI) > 0)
		return "PUT";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI) > 0)
		return "DELETE";
	return "";
}

/* api_route_of: (method, "/v1/sandboxes/{id}/{verb}") -> route + id. */
static enum api_route api_route_of(const char *method, const char *uri,
                                   char *sbx, size_t cap, bool *bad_method)
{
	static const struct { const char *m, *verb; enum api_route r; } t[] = {
		{ "POST", "exec", R_EXEC }, { "GET", "files", R_FILES_GET },
		{ "PUT", "files", R_FILES_PUT }, { "DELETE", "files", R_FILES_DELETE },
		{ "GET", "stat", R_STAT }, { "GET", "list", R_LIST },
		{ "POST", "mkdir", R_MKDIR },
	};
	const char *p, *slash;
	size_t idlen;

	*bad_method = false;
	sbx[0] = '\0';
	if (strcmp(uri, "/healthz") == 0)
		return R_HEALTHZ;
	if (strcmp(uri, "/metrics") == 0)
		return R_METRICS;
	if (strncmp(uri, "/v1/sandboxes/", 14) != 0)
		return R_OTHER;
	p = uri + 14;
	slash = strchr(p, '/');
	if (slash == NULL)
		return R_OTHER;
	idlen = (size_t)(slash - p);
	if (idlen >= cap)
		idlen = cap - 1; /* too long: fails sbx_id_valid */
	memcpy(sbx, p, idlen);
	sbx[idlen] = '\0';
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (strcmp(slash + 1, t[i].verb) != 0)
			continue;
		if (strcmp(method, t[i].m) == 0)
			return t[i].r;
		*bad_method = true;
	}
	return R_OTHER;
}

/* api_has_body: whether the request announces a body (a length, or one
 * refused: chunked, or two lengths); *fr says how (lib/http.h). */
static bool api_has_body(struct lws *wsi, long long *clen,
                         enum http_framing *fr)
{
	*fr = http_body_framing(wsi, clen);
	return *fr == HTTP_BODY_UNSIZED || *fr == HTTP_BODY_BAD || *clen > 0;
}

/* api_reply_now: a synchronous reply from within an lws callback. */
static int api_reply_now(struct lws *wsi, enum api_route r, uint64_t t0,
                         unsigned status, const char *ctype, const char *body,
                         bool close_after)
{
	int rc = http_reply(wsi, status, ctype, body, strlen(body));
	char rid[HTTP_RID_MAX + 1];

	http_request_id(wsi, rid);
	api_count(&(struct api_done){ .route = r, .status = status, .t0_us = t0,
	                              .rid = rid, .body = body,
	                              .body_len = strlen(body),
	                              .bytes_out = strlen(body) });
	return close_after ? -1 : rc;
}

/* api_error_now: {"error","message"} from within an lws callback. */
static int api_error_now(struct lws *wsi, enum api_route r, uint64_t t0,
                         enum wire_code code, const char *msg, bool close_after)
{
	json_t *o = json_pack("{s:s,s:s}", "error", wirecode_name(code), "message", msg);
	_cleanup_free_ char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

	json_decref(o);
	return api_reply_now(wsi, r, t0, wirecode_status(code), "application/json",
	                     s ? s : "{\"error\":\"internal\"}", close_after);
}

/* api_on_http: a new request: route, check, and start the operation. */
static int api_on_http(struct lws *wsi, struct api_pss *pss, const char *uri)
{
	struct node *n = lws_context_user(lws_get_context(wsi));
	uint64_t t0 = api_now_us();
	char sbx[TT_SBX_ID_LEN + 2], path[API_PATH_MAX], v[32];
	char tok[PASETO_TOKEN_MAX + 1];
	bool bad_method, has_body;
	enum http_framing framing;
	long long clen;
	enum api_route r;
	struct api_op *op;

	r = api_route_of(api_method(wsi), uri, sbx, sizeof(sbx), &bad_method);
	has_body = api_has_body(wsi, &clen, &framing);
	/* as the cp and the edge: a body only with one Content-Length (the
	 * unread body closes the connection) */
	if (framing == HTTP_BODY_UNSIZED)
		return api_error_now(wsi, r, t0, WIRE_E_LENGTH_REQUIRED,
		                     "request bodies need a Content-Length", true);
	if (framing == HTTP_BODY_BAD)
		return api_error_now(wsi, r, t0, WIRE_E_BAD_REQUEST,
		                     "bad Content-Length", true);
	if (r == R_HEALTHZ)
		return api_reply_now(wsi, r, t0, 200, "application/json",
		                     "{\"ok\":true}", has_body);
	if (r == R_METRICS) {
		_cleanup_free_ char *m = metrics_render();

		return api_reply_now(wsi, r, t0, 200,
		                     "text/plain; version=0.0.4",
		                     m ? m : "", has_body);
	}
	if (r == R_OTHER)
		return api_error_now(wsi, r, t0,
		                     bad_method ? WIRE_E_METHOD_NOT_ALLOWED : WIRE_E_NOT_FOUND,
		                     bad_method ? "method not allowed" : "no such endpoint",
		                     has_body);
	if (!sbx_id_valid(sbx))
		return api_error_now(wsi, r, t0, WIRE_E_NOT_FOUND,
		                     "no such sandbox", has_body);
	if (http_capability_token(wsi, tok, sizeof(tok)) < 0) {
		_cleanup_free_ char *d = deny_malformed_json(sbx);

		metrics_inc("tether_node_admission_total",
		            "decision=\"deny\",reason=\"malformed\"");
		return api_reply_now(wsi, r, t0, 403, "application/json",
		                     d ? d : "{\"decision\":\"deny\"}", has_body);
	}
	if (r == R_EXEC && !has_body)
		return api_error_now(wsi, r, t0, WIRE_E_BAD_REQUEST,
		                     "a JSON body is required", false);
	if (r == R_EXEC && clen > (long long)HTTP_BODY_MAX_DEFAULT)
		return api_error_now(wsi, r, t0, WIRE_E_TOO_LARGE,
		                     "request body over 1 MiB", true);
	if (r != R_EXEC && http_query(wsi, "path", path, sizeof(path)) < 0)
		return api_error_now(wsi, r, t0, WIRE_E_BAD_REQUEST,
		                     "query parameter path is required", has_body);

	op = calloc(1, sizeof(*op));
	if (op == NULL)
		return -1;
	op->n = n;
	op->wsi = wsi;
	op->route = r;
	op->t0_us = t0;
	http_request_id(wsi, op->rid);
	op->body.max = HTTP_BODY_MAX_DEFAULT;
	memcpy(op->sbx, sbx, TT_SBX_ID_LEN + 1); /* validated above */
	op->req = json_pack("{s:s,s:s,s:s}", "token", tok, "sbx", sbx, "op",
	                    wireop_name(api_route_ops[r]));
	sodium_memzero(tok, sizeof(tok));
	pss->op = op;
	if (op->req == NULL)
		return -1;
	/* A long exec must not be cut by lws' idle timeouts; the manager ends
	 * every operation with RESULT or ERROR. */
	lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
	if (r != R_EXEC)
		json_object_set_new(op->req, "path", json_string(path));
	if (r == R_FILES_DELETE && http_query(wsi, "recursive", v, sizeof(v)) >= 0)
		json_object_set_new(op->req, "recursive", json_boolean(strcmp(v, "1") == 0 || strcmp(v, "true") == 0));
	if (r == R_MKDIR && http_query(wsi, "parents", v, sizeof(v)) >= 0)
		json_object_set_new(op->req, "parents", json_boolean(strcmp(v, "1") == 0 || strcmp(v, "true") == 0));
	if (r == R_FILES_PUT && http_query(wsi, "mode", v, sizeof(v)) >= 0) {
		char *end;
		unsigned long mode = strtoul(v, &end, 8);

		if (*end != '\0' || v[0] == '\0' || mode > 07777) {
			op->close_after = has_body;
			op_reply_error(op, WIRE_E_BAD_REQUEST, "mode must be octal, at most 07777");
			return 0;
		}
		json_object_set_new(op->req, "mode", json_integer((json_int_t)mode));
	}
	if (r == R_EXEC) {
		op->state = OP_BODY;
		return 0; /* the REQUEST goes out once the body is complete */
	}
	if (r == R_FILES_PUT) {
		op->body_done = !has_body;
		op->expect = has_body && http_expects_continue(wsi);
		/* Hold the body until the manager admits the request. */
		if (has_body) {
			op->rx_paused = true;
			lws_rx_flow_control(wsi, 0);
		}
	} else {
		op->close_after = has_body; /* a body we will not read */
	}
	/* lws reads nothing more for a bodiless request until its reply is
	 * complete; the guard keeps a client's extra bytes or half-close from
	 * spinning the loop meanwhile (http.h). Without it (no fd), only that
	 * protection is lost. */
	if (!has_body) {
		struct tt_err gerr = { 0 };

		op->rxg = http_rxguard_start(n->loop, wsi, &gerr);
		if (op->rxg == NULL)
			log_warn("%s: %s", api_route_names[r], gerr.msg);
	}
	op_start(op);
	return 0;
}

/* api_on_body: request body bytes (exec JSON, or PUT file content). */
static int api_on_body(struct lws *wsi, struct api_op *op, const void *in,
                       size_t len)
{
	struct tt_err err = { 0 };

	if (op != NULL && op->state == OP_DRAIN) {
		op->drained += len;
		return op->drained > HTTP_DRAIN_MAX ? -1 : 0;
	}
	if (op == NULL || op->state == OP_REPLY)
		return 0;
	if (op->route == R_EXEC) {
		if (http_body_append(&op->body, in, len, &err) < 0) {
			op->close_after = true;
			op_reply_error(op, WIRE_E_TOO_LARGE, "request body over 1 MiB");
		}
		return 0;
	}
	if (op->route != R_FILES_PUT)
		return 0; /* ignored */
	op->close_after = false;
	if (!op->allowed) {
		if (buf_append(&op->pending, in, len, API_PENDING_MAX) < 0 ||
		    op->pending.truncated) {
			op->close_after = true;
			op_reply_error(op, WIRE_E_INTERNAL, "cannot hold the body");
			return 0;
		}
		if (!op->rx_paused) {
			op->rx_paused = true;
			lws_rx_flow_control(wsi, 0);
		}
		return 0;
	}
	if (!op_send(op, WIRE_DATA_IN, in, len))
		return 0;
	if (wireconn_queued(op->mc) > WIRECONN_HIGH_WATER && !op->rx_paused) {
		op->rx_paused = true;
		lws_rx_flow_control(wsi, 0);
	}
	return 0;
}

/* api_on_body_done: the request body is complete. */
static int api_on_body_done(struct lws *wsi, struct api_pss *pss)
{
	struct api_op *op = pss->op;
	struct tt_err err = { 0 };
	json_t *body;

	if (op != NULL && op->state == OP_DRAIN) {
		/* answered and drained: the connection can serve the next one */
		pss->op = NULL;
		op_free(op);
		return lws_http_transaction_completed(wsi) ? -1 : 0;
	}
	if (op != NULL && op->state == OP_REPLY && op->route == R_FILES_PUT)
		op->body_done = true; /* all in before the answer went out */
	if (op == NULL || op->state == OP_REPLY)
		return 0;
	if (op->route == R_EXEC) {
		body = http_body_json(&op->body, &err);
		http_body_free(&op->body);
		if (body == NULL) {
			op_reply_error(op, WIRE_E_BAD_REQUEST, err.msg);
			return 0;
		}
		if (exec_build(op, body, &err) < 0) {
			json_decref(body);
			op_reply_error(op, WIRE_E_BAD_REQUEST, err.msg);
			return 0;
		}
		json_decref(body);
		op_start(op);
		return 0;
	}
	if (op->route == R_FILES_PUT) {
		op->body_done = true;
		if (op->allowed)
			put_flush(op);
	}
	op->close_after = false;
	return 0;
}

/* api_on_writeable: writes a pending reply or the next stream step. */
static int api_on_writeable(struct lws *wsi, struct api_pss *pss)
{
	struct api_op *op = pss->op;
	unsigned status;
	bool close_after;
	int rc;

	if (op == NULL)
		return 0;
	if (op->state == OP_STREAM)
		return stream_write(wsi, pss, op);
	if (op->state != OP_REPLY)
		return 0;
	status = op->status;
	if (op->route == R_FILES_PUT && !op->body_done && !op->close_after) {
		/* before the body is in: drained, completed at its end */
		rc = http_reply_early(wsi, status, "application/json", op->reply,
		                      op->reply_len);
		api_op_count(op, status);
		op->state = OP_DRAIN;
		return rc;
	}
	close_after = op->close_after | http_rxguard_stop(op->rxg);
	op->rxg = NULL;
	/* Detach first: completing the transaction may drop the session
	 * (LWS_CALLBACK_HTTP_DROP_PROTOCOL) from inside http_reply. */
	pss->op = NULL;
	rc = http_reply(wsi, status, "application/json", op->reply, op->reply_len);
	api_op_count(op, status);
	op_free(op);
	return close_after ? -1 : rc;
}

/* api_callback: the lws HTTP protocol handler. Upgrades are not served
 * here: streamed exec is its own protocol (src/node/ws_exec.c). */
static int api_callback(struct lws *wsi, enum lws_callback_reasons reason,
                        void *user, void *in, size_t len)
{
	struct api_pss *pss = user;

	switch (reason) {
	case LWS_CALLBACK_HTTP:
		http_request_started(wsi);
		if (pss->op != NULL) { /* a pipelined request on a busy session */
			pss->op->wsi = NULL;
			op_free(pss->op);
			pss->op = NULL;
		}
		return api_on_http(wsi, pss, in ? (const char *)in : "");
	case LWS_CALLBACK_HTTP_BODY:
		return api_on_body(wsi, pss->op, in, len);
	case LWS_CALLBACK_HTTP_BODY_COMPLETION:
		return api_on_body_done(wsi, pss);
	case LWS_CALLBACK_HTTP_WRITEABLE:
		return api_on_writeable(wsi, pss);
	case LWS_CALLBACK_CLOSED_HTTP:
	case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
		if (pss != NULL && pss->op != NULL) {
			pss->op->wsi = NULL;
			op_free(pss->op);
			pss->op = NULL;
		}
		return 0;
	default: /* upgrades refused, bounds, HTTP/2 (lib/http.h) */
		return http_callback_default(wsi, reason, user, in, len);
	}
}

const struct lws_protocols api_protocols[] = {
	/* tx_packet_size: lws 4.1 caps one send() at this + LWS_PRE + 4
	 * (0 = rx_buffer_size, default 4096): a whole small read (headers
	 * room 512 + API_WHOLE_MAX) then goes in one send, no POLLOUT trip. */
	{ "http", api_callback, sizeof(struct api_pss), 0, 0, NULL,
	  API_WHOLE_MAX + 512 },
	/* streamed exec (src/node/ws_exec.c) */
	{ WSEXEC_PROTOCOL, wsexec_callback, sizeof(struct wsexec_pss),
	  WSEXEC_RX_BUFFER, 0, NULL, 0 },
	{ NULL, NULL, 0, 0, 0, NULL, 0 },
};

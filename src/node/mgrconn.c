/* node-api's calls to its sbx-manager (see mgrconn.h). */
#include "node/mgrconn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "node/node.h"

/* mgrconn_open: see mgrconn.h. */
struct wireconn *mgrconn_open(struct node *n, json_t *req,
                              const struct wireconn_cbs *cbs, void *arg,
                              struct tt_err *err)
{
	struct wireconn *c = wireconn_open(n->loop, n->mgr_pool, n->sock_path, req, cbs,
	                                   arg, err);

	if (c != NULL)
		metrics_inc("tether_node_manager_connections_total",
		            wireconn_reused(c) ? "conn=\"reused\"" : "conn=\"new\"");
	return c;
}

/* ---- whole control calls ---------------------------------------------- */

struct mgrconn_callst {
	struct wireconn *c;
	mgrconn_call_fn done;
	void *arg;
};

/* call_finish: reports once, closes the connection, frees the call. */
static void call_finish(struct mgrconn_callst *st, json_t *result,
                        const struct tt_err *err)
{
	st->done(st->arg, result, err);
	wireconn_close(st->c);
	free(st);
}

/* call_on_frame: waits for RESULT or ERROR; data frames are ignored. */
static void call_on_frame(void *arg, const struct wire_frame *f)
{
	struct mgrconn_callst *st = arg;
	struct tt_err err = { 0 };
	json_error_t jerr;
	json_t *obj;

	if (f->type != WIRE_RESULT && f->type != WIRE_ERROR &&
	    f->type != WIRE_DECISION)
		return;
	obj = json_loadb((const char *)f->payload, f->len,
	                 JSON_REJECT_DUPLICATES, &jerr);
	if (obj == NULL || !json_is_object(obj)) {
		json_decref(obj);
		tt_err_set(&err, TT_ERR_MALFORMED, "manager sent invalid JSON");
		call_finish(st, NULL, &err);
		return;
	}
	if (f->type == WIRE_RESULT) {
		call_finish(st, obj, NULL);
		return;
	}
	if (f->type == WIRE_ERROR)
		tt_err_set(&err, TT_ERR_TRANSPORT, "manager: %s: %s",
		           json_string_value(json_object_get(obj, "error")) ?: "error",
		           json_string_value(json_object_get(obj, "message")) ?: "");
	else
		tt_err_set(&err, TT_ERR_DENIED, "manager refused a control call");
	json_decref(obj);
	call_finish(st, NULL, &err);
}

/* call_on_end: the connection ended before a RESULT. */
static void call_on_end(void *arg, const struct tt_err *err)
{
	call_finish(arg, NULL, err);
}

/* mgrconn_call: see mgrconn.h. */
int mgrconn_call(struct node *n, json_t *req, mgrconn_call_fn done, void *arg,
                 struct tt_err *err)
{
	static const struct wireconn_cbs cbs = {
		.on_frame = call_on_frame,
		.on_end = call_on_end,
	};
	struct mgrconn_callst *st = calloc(1, sizeof(*st));

	if (st == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	st->done = done;
	st->arg = arg;
	st->c = mgrconn_open(n, req, &cbs, st, err);
	if (st->c == NULL) {
		free(st);
		return -1;
	}
	return 0;
}

/* label_safe: keeps a metric label value to [a-z0-9_] (values come from
 * peers and must not inject label syntax). */
static void label_safe(char *dst, size_t cap, const char *src)
{
	size_t i = 0;

	for (; src != NULL && *src != '\0' && i + 1 < cap; src++) {
		char c = *src;

		dst[i++] = ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		            c == '_') ? c : '_';
	}
	dst[i] = '\0';
}

/* mgrconn_decision: parses and counts one DECISION frame. */
json_t *mgrconn_decision(const struct wire_frame *f, enum tt_verdict *verdict)
{
	json_error_t jerr;
	json_t *obj = json_loadb((const char *)f->payload, f->len,
	                         JSON_REJECT_DUPLICATES, &jerr);
	const char *d = json_string_value(json_object_get(obj, "decision"));
	char labels[128], reason[48];

	if (d == NULL) {
		json_decref(obj);
		return NULL;
	}
	*verdict = strcmp(d, "allow") == 0 ? TT_ALLOW :
	           strcmp(d, "refresh_route") == 0 ? TT_REFRESH_ROUTE : TT_DENY;
	label_safe(reason, sizeof(reason),
	           json_string_value(json_object_get(obj, "reason")));
	snprintf(labels, sizeof(labels), "decision=\"%s\",reason=\"%s\"",
	         decision_verdict_name(*verdict), reason);
	metrics_inc("tether_node_admission_total", labels);
	return obj;
}

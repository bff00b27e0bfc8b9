/* sbx-manager: worker admission (SPEC §4). A data operation's capability
 * is checked against the durable record; the DECISION goes out (an Allow
 * may wait for the answer), then the operation is relayed to the
 * execution's bridge, verified, under a lease on the identity epoch. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "capcache.h"
#include "cleanup.h"
#include "log.h"
#include "manager/manager_int.h"
#include "metrics.h"
#include "refusal.h"
#include "relay.h"
#include "timefmt.h"
#include "uvutil.h"
#include "wireop.h"

/* installed_of: the §4 record admission compares against. Anything that is
 * not a running, unretired execution answers as retired (RefreshRoute). */
static struct tt_installed installed_of(const struct rec_exec *r)
{
	struct tt_installed in = { 0 };

	if (r == NULL)
		return in;
	in.present = true;
	in.id = r->id;
	in.retired = r->retired || r->state != REC_RUNNING;
	in.epoch = r->epoch;
	return in;
}

/* conn_refresh: an admitted operation whose execution was replaced before
 * anything of it went to the bridge. If its Allow is still held back, the
 * decision becomes RefreshRoute (SPEC §4: never executed, so the opener
 * rebuilds it); once Allow went out, ERROR refresh_route is all there is. */
static void conn_refresh(struct mgr_conn *c, const struct rec_exec *rec)
{
	struct tt_decision d = { .verdict = TT_REFRESH_ROUTE, .reason = TT_R_RETIRED };
	_cleanup_free_ char *body = NULL;

	if (c->decision == NULL) {
		conn_fail(c, WIRE_E_REFRESH_ROUTE, "execution replaced or retired");
		return;
	}
	d.installed_generation = rec != NULL ? rec->id.gen : 0;
	body = decision_body_json(&d, c->sbx);
	free(c->decision);
	c->decision = NULL;
	if (body != NULL)
		relay_write_frame((uv_stream_t *)c->conn, WIRE_DECISION, body,
		                  (uint32_t)strlen(body), NULL);
	metrics_inc("tether_admission_total", "decision=\"refresh_route\",reason=\"retired\"");
	relay_close_after_writes((uv_stream_t *)c->conn);
	c->conn = NULL;
	conn_free(c);
}

/* ops_unlink: the connection's operation holds no lease any more. */
static void ops_unlink(struct mgr_conn *c)
{
	struct mgr_conn **pp;

	for (pp = &c->m->ops; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	c->next = NULL;
}

/* bridge_pool_of: the pool a bridge connection opened for execution
 * serial of sbx goes back to, or NULL when that execution is no longer
 * the running one (retired, replaced, stopping). */
static struct uvutil_pool *bridge_pool_of(struct manager *m, const char *sbx,
                                          uint64_t serial, uint64_t epoch)
{
	const struct rec_exec *rec = records_get(m->db, sbx);
	struct mgr_exec *ex = exec_find(m, sbx);

	if (ex == NULL || ex->stopping || ex->serial != serial || rec == NULL ||
	    rec->epoch != epoch || rec->retired || rec->state != REC_RUNNING)
		return NULL;
	return ex->pool;
}

/* relay_kept: an admitted operation ended. After a clean end the bridge
 * connection goes back to its execution's pool and node-api's connection
 * waits for the next REQUEST; otherwise the relay closed both. */
static void relay_kept(struct relay *r, enum relay_end how, const char *msg,
                       struct relay_kept *kept, void *data)
{
	struct mgr_conn *c = data;

	(void)r;
	c->relay = NULL;
	if (kept == NULL) {
		if (how != RELAY_DONE)
			log_info("operation on %s ended: %s: %s", c->sbx, relay_end_name(how),
			         msg);
		conn_free(c);
		return;
	}
	ops_unlink(c);
	if (kept->far != NULL)
		uvutil_pool_put(bridge_pool_of(c->m, c->sbx, c->exec_serial, c->epoch),
		                kept->far);
	json_decref(c->req);
	c->req = NULL;
	c->sbx[0] = '\0';
	if (uvutil_reqconn_next(&c->rc, kept, &c->conn) < 0) {
		conn_free(c);
		return;
	}
	waiting_add(c);
}

/* bridge_forward: the bridge connection is verified (now or when it was
 * opened): forward the REQUEST without its token and relay. */
static void bridge_forward(struct mgr_conn *c)
{
	struct manager *m = c->m;
	struct tt_err err = { 0 };
	struct wire_out first;

	/* Meant for us: the bridge and guest get the operation only. */
	json_object_del(c->req, "token");
	json_object_del(c->req, "allow_with_answer");
	c->streamed = json_is_true(json_object_get(c->req, "stream"));
	json_object_del(c->req, "stream");
	if (relay_write_json((uv_stream_t *)c->bridge, WIRE_REQUEST, c->req, &err) < 0) {
		conn_fail(c, WIRE_E_TRANSPORT, err.msg);
		return;
	}
	if (c->decision != NULL)
		first = (struct wire_out){ WIRE_DECISION, c->decision,
		                           (uint32_t)strlen(c->decision) };
	c->relay = relay_start_keep((uv_stream_t *)c->conn, (uv_stream_t *)c->bridge,
	                            c->rc.pending, c->rc.pending_len,
	                            c->decision != NULL ? &first : NULL, relay_kept, c, &err);
	if (c->relay == NULL) {
		conn_fail(c, WIRE_E_INTERNAL, err.msg);
		return;
	}
	free(c->decision); /* the relay copied it */
	c->decision = NULL;
	c->conn = NULL; /* the relay owns both streams now */
	c->bridge = NULL;
	if (!c->connecting) {
		c->next = m->ops;
		m->ops = c;
	}
	c->connecting = false;
}

/* bridge_connected: verify the bridge, re-check the lease, forward the
 * REQUEST without its token and start relaying. */
static void bridge_connected(uv_connect_t *req, int status)
{
	struct mgr_conn *c = req->data;
	struct manager *m = c->m;
	const struct rec_exec *rec = records_get(m->db, c->sbx);
	struct mgr_exec *ex = exec_find(m, c->sbx);
	uv_os_fd_t fd;
	char why[160];
	struct tt_err err = { 0 };
	enum refusal reason;

	if (status < 0) {
		snprintf(why, sizeof(why), "cannot reach the bridge: %s", uv_strerror(status));
		conn_fail(c, WIRE_E_TRANSPORT, why);
		return;
	}
	/* The execution may have been replaced or stopped while connecting
	 * (a pause's retirement alone does not count: the operation was
	 * admitted before it, and the pause's drain waits for it). Nothing
	 * went to the bridge: an Allow not yet sent becomes RefreshRoute. */
	if (rec == NULL || ex == NULL || ex->stopping || ex->serial != c->exec_serial ||
	    rec->epoch != c->epoch || rec->state != REC_RUNNING) {
		conn_refresh(c, rec);
		return;
	}
	if (uv_fileno((uv_handle_t *)c->bridge, &fd) < 0) {
		conn_fail(c, WIRE_E_INTERNAL, "bridge connection has no fd");
		return;
	}
	/* Whatever listens at bridge.sock must be the process pinned at
	 * spawn (SPEC §5) before a single byte of the operation goes out. */
	if (verify_peer(fd, &ex->bridge_id, &err) < 0) {
		char msg[300];

		reason = refusal_of(&err);
		snprintf(msg, sizeof(msg), "bridge verification failed: %s", err.msg);
		log_warn("refused bridge of %s (%s): %s", c->sbx, refusal_name(reason), err.msg);
		metrics_inc("tether_bridge_verify_failed_total", NULL);
		refusal_count(reason);
		conn_fail(c, WIRE_E_TRANSPORT, msg);
		return;
	}
	bridge_forward(c);
}

/* decision_may_wait: an Allow for op may go out with the answer (one
 * wake-up of node-api instead of two): the file operations that send no
 * input, whose opener just waits for the answer, and an exec whose opener
 * said so ("allow_with_answer": an HTTP exec without stdin). A streamed
 * exec shows its decision at once, and fs.write (node-api streams the
 * body only once allowed) gets its at once. */
static bool decision_may_wait(enum wire_op op, const json_t *req)
{
	if (op == WIRE_OP_EXEC)
		return json_is_true(json_object_get(req, "allow_with_answer"));
	return !wireop_input(op);
}

/* admit_data_op: see manager_int.h. */
void admit_data_op(struct mgr_conn *c)
{
	struct manager *m = c->m;
	const char *token = json_string_value(json_object_get(c->req, "token"));
	const char *sbx = json_string_value(json_object_get(c->req, "sbx"));
	const char *op = json_string_value(json_object_get(c->req, "op"));
	enum wire_op wop = wireop_parse(op);
	const struct rec_exec *rec;
	struct mgr_exec *ex;
	struct tt_installed inst;
	struct tt_request rq = { 0 };
	struct tt_decision d;
	_cleanup_free_ char *body = NULL;
	char labels[128], path[PATH_MAX];

	if (sbx == NULL || !sbx_id_valid(sbx) || wireop_needs(wop) == 0) {
		conn_fail(c, WIRE_E_BAD_REQUEST, "request needs a valid sbx and a known op");
		return;
	}
	snprintf(c->sbx, sizeof(c->sbx), "%s", sbx);
	rec = records_get(m->db, sbx);
	inst = installed_of(rec);
	rq.receiver = TT_RCV_NODE;
	rq.sbx = sbx;
	rq.op = wireop_needs(wop);
	rq.new_open = true;
	if (token == NULL)
		token = "";
	d = cap_admit(m->cache, records_keys(m->db), token, strlen(token), NULL, 0, &rq,
	              &inst, tt_now(), NULL);
	snprintf(labels, sizeof(labels), "decision=\"%s\",reason=\"%s\"",
	         decision_verdict_name(d.verdict), decision_reason_name(d.reason));
	metrics_inc("tether_admission_total", labels);
	body = decision_body_json(&d, sbx);
	if (body == NULL) {
		conn_fail(c, WIRE_E_INTERNAL, "cannot encode the decision");
		return;
	}
	if (d.verdict == TT_ALLOW && decision_may_wait(wop, c->req)) {
		c->decision = tt_steal_ptr(&body);
	} else {
		relay_write_frame((uv_stream_t *)c->conn, WIRE_DECISION, body,
		                  (uint32_t)strlen(body), NULL);
	}
	if (d.verdict != TT_ALLOW) {
		/* Never the token: only what the decision says. */
		log_info("admission refused: sbx=%s op=%s decision=%s reason=%s", sbx, op,
		         decision_verdict_name(d.verdict), decision_reason_name(d.reason));
		relay_close_after_writes((uv_stream_t *)c->conn);
		c->conn = NULL;
		conn_free(c);
		return;
	}
	c->epoch = rec->epoch;
	ex = exec_find(m, sbx);
	c->exec_serial = ex != NULL ? ex->serial : 0;
	/* in flight from now on: a pause's drain counts it */
	c->connecting = true;
	c->next = m->ops;
	m->ops = c;
	if (ex != NULL && !ex->stopping) {
		/* Admitted just now against the durable record; an idle
		 * connection reaches the bridge pinned for this execution,
		 * verified when it was opened. */
		c->bridge = (uv_pipe_t *)uvutil_pool_get(ex->pool);
		if (c->bridge != NULL) {
			bridge_forward(c);
			return;
		}
	}
	if (ex == NULL || sandbox_dir(m, sbx, path, sizeof(path) - sizeof("/bridge.sock")) < 0) {
		conn_fail(c, WIRE_E_TRANSPORT, "no bridge for this execution");
		return;
	}
	strcat(path, "/bridge.sock");
	c->bridge = malloc(sizeof(*c->bridge));
	if (c->bridge == NULL || uv_pipe_init(m->loop, c->bridge, 0) < 0) {
		free(c->bridge);
		c->bridge = NULL;
		conn_fail(c, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	c->connect.data = c;
	/* Any length of state path (unixaddr.h). */
	uvutil_pipe_connect(&c->connect, c->bridge, path, bridge_connected);
}

/* sbx-manager: node-api's connections. Accepted after a peer check, each
 * reads one REQUEST at a time and hands it to admission (data operations,
 * admit.c) or answers it here (feed.apply via apply.c, status, watch). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <uv.h>

#include "log.h"
#include "manager/manager_int.h"
#include "metrics.h"
#include "relay.h"
#include "uvutil.h"
#include "wireop.h"
#include "wire_json.h"

/* waiting_add: see manager_int.h. */
void waiting_add(struct mgr_conn *c)
{
	c->wnext = c->m->waiting;
	c->m->waiting = c;
	c->waiting = true;
}

/* waiting_del: c is no longer waiting for a REQUEST. */
static void waiting_del(struct mgr_conn *c)
{
	struct mgr_conn **pp;

	if (!c->waiting)
		return;
	for (pp = &c->m->waiting; *pp; pp = &(*pp)->wnext)
		if (*pp == c) {
			*pp = c->wnext;
			break;
		}
	c->wnext = NULL;
	c->waiting = false;
}

/* conn_free: see manager_int.h. */
void conn_free(struct mgr_conn *c)
{
	struct mgr_conn **pp;

	waiting_del(c);
	if (c->m->watcher == c)
		c->m->watcher = NULL;
	for (pp = &c->m->ops; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	if (c->conn)
		relay_close_free((uv_stream_t *)c->conn);
	if (c->bridge)
		relay_close_free((uv_stream_t *)c->bridge);
	json_decref(c->req);
	free(c->decision);
	free(c->rc.pending);
	free(c);
}

/* conn_fail: see manager_int.h. */
void conn_fail(struct mgr_conn *c, enum wire_code code, const char *msg)
{
	log_warn("operation on %s failed: %s: %s", c->sbx[0] ? c->sbx : "-",
	         wirecode_name(code), msg);
	/* node-api reads the DECISION first, always. */
	if (c->decision != NULL)
		relay_write_frame((uv_stream_t *)c->conn, WIRE_DECISION, c->decision,
		                  (uint32_t)strlen(c->decision), NULL);
	relay_error_close((uv_stream_t *)c->conn, code, msg);
	c->conn = NULL;
	conn_free(c);
}

/* handle_status: {"op":"status"} -> the records and the applied revision. */
static json_t *handle_status(struct manager *m)
{
	json_t *list = json_array();

	for (size_t i = 0; i < records_count(m->db); i++) {
		const struct rec_exec *r = records_at(m->db, i);

		json_array_append_new(list, json_pack(
			"{s:s,s:I,s:s,s:s,s:s,s:I,s:b,s:s,s:I,s:i,s:i}", "sandbox", r->id.sbx,
			"generation", (json_int_t)r->id.gen, "worker", r->id.wrk,
			"substrate", r->id.sst, "pod", r->id.pod, "activation",
			(json_int_t)r->id.att, "retired", r->retired, "state",
			rec_state_name(r->state), "epoch", (json_int_t)r->epoch,
			"init_pid", (int)r->init_pid, "bridge_pid", (int)r->bridge_pid));
	}
	return json_pack("{s:I,s:o}", "applied_rev",
	                 (json_int_t)records_applied_rev(m->db), "executions", list);
}

/* handle_control: feed.apply / status; answers RESULT and closes (a
 * feed.apply holding a pause answers when the pause ends). */
static void handle_control(struct mgr_conn *c, enum wire_op op)
{
	struct tt_err err = { 0 };
	json_t *res;

	if (op == WIRE_OP_FEED_APPLY) {
		if (apply_feed(c) < 0)
			conn_fail(c, WIRE_E_BAD_REQUEST, "feed.apply needs an updates array (<= 1000)");
		return;
	}
	res = handle_status(c->m);
	if (relay_write_json((uv_stream_t *)c->conn, WIRE_RESULT, res, &err) < 0)
		log_warn("answering %s: %s", wireop_name(op), err.msg);
	json_decref(res);
	relay_close_after_writes((uv_stream_t *)c->conn);
	c->conn = NULL;
	conn_free(c);
}

/* conn_request: the next REQUEST: admission, or a control request. */
static void conn_request(struct uvutil_reqconn *rc, const struct wire_frame *f)
{
	struct mgr_conn *c = (struct mgr_conn *)rc;
	struct tt_err err = { 0 };
	enum wire_op wop;
	const char *op;

	waiting_del(c);
	c->req = wire_frame_json(f, &err);
	op = c->req ? json_string_value(json_object_get(c->req, "op")) : NULL;
	if (op == NULL) {
		conn_fail(c, WIRE_E_BAD_REQUEST, c->req ? "request without op" : err.msg);
		return;
	}
	wop = wireop_parse(op);
	if (wop == WIRE_OP_WATCH)
		watch_start(c);
	else if (wireop_control(wop))
		handle_control(c, wop);
	else
		admit_data_op(c);
}

/* conn_refuse: the skeleton turns a connection down (no memory). */
static void conn_refuse(struct uvutil_reqconn *rc, enum wire_code code, const char *msg)
{
	conn_fail((struct mgr_conn *)rc, code, msg);
}

/* conn_gone: the peer closed, or broke the frame protocol. */
static void conn_gone(struct uvutil_reqconn *rc, const struct tt_err *err)
{
	if (err != NULL)
		metrics_inc("tether_manager_bad_frames_total", NULL);
	conn_free((struct mgr_conn *)rc);
}

/* peer_allowed: only the node-api that spawned us (pid and uid). */
static bool peer_allowed(struct manager *m, uv_pipe_t *p, struct ucred *cr)
{
	uv_os_fd_t fd;
	socklen_t len = sizeof(*cr);

	if (uv_fileno((uv_handle_t *)p, &fd) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cr, &len) < 0)
		return false;
	return cr->uid == m->peer_uid && cr->pid == m->peer_pid;
}

/* conn_peer: only the node-api that spawned us; anyone else is closed. */
static bool conn_peer(void *data, uv_pipe_t *p)
{
	struct manager *m = data;
	struct ucred cr = { 0 };

	if (peer_allowed(m, p, &cr))
		return true;
	log_warn("peer refused: pid %d uid %u (expected pid %d uid %u)", (int)cr.pid,
	         (unsigned)cr.uid, (int)m->peer_pid, (unsigned)m->peer_uid);
	metrics_inc("tether_manager_peer_refused_total", NULL);
	relay_close_free((uv_stream_t *)p);
	return false;
}

/* conn_new: a connection waiting for its first REQUEST. Not calloc:
 * zeroing the 64 KiB buffer per operation showed in profiles; every other
 * field is cleared. */
static struct uvutil_reqconn *conn_new(void *data, uv_pipe_t *p)
{
	struct mgr_conn *c = malloc(sizeof(*c));

	if (c == NULL)
		return NULL;
	memset(c, 0, offsetof(struct mgr_conn, buf));
	c->m = data;
	c->conn = p;
	p->data = c;
	c->rc.buf = c->buf;
	c->rc.cap = sizeof(c->buf);
	waiting_add(c);
	return &c->rc;
}

/* conn_server_ops: see manager_int.h. */
const struct uvutil_server_ops conn_server_ops = {
	.peer = conn_peer,
	.conn = conn_new,
	.request = conn_request,
	.fail = conn_refuse,
	.gone = conn_gone,
};

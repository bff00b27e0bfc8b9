/* What lets several cp replicas share one PostgreSQL store
 * (docs/ARCHITECTURE.md "Control-plane replicas"): the messages they send
 * each other (received here on the store's LISTEN connection, handled by
 * feed_told), the backstop of those messages in the sweep, and the
 * idempotency of lifecycle calls: a call the edge repeats on another
 * replica, after the first one died with its answer, with the same
 * Idempotency-Key, waits for the operation the first one started instead
 * of starting another. On SQLite (one cp) only the idempotency runs. */
#include <stdio.h>
#include <string.h>

#include "cp/cp.h"
#include "log.h"
#include "metrics.h"

#define IDEM_HEADER "idempotency-key:"
#define IDEM_KEEP_S 3600 /* records older than this are pruned */

/* replica_msg: one message from another replica. */
static void replica_msg(const char *msg, void *arg)
{
	metrics_inc("tether_cp_replica_messages_total", NULL);
	feed_told(arg, msg);
}

/* replica_readable: the LISTEN connection has something. */
static void replica_readable(uv_poll_t *h, int status, int events)
{
	struct cp *cp = h->data;
	struct tt_err err = { 0 };

	(void)events;
	if (status < 0 || cpdb_listen_read(cp->db, replica_msg, cp, &err) < 0) {
		log_warn("replicas: notifications lost (%s); reconnecting",
		         status < 0 ? uv_strerror(status) : err.msg);
		uv_poll_stop(h);
		cp->listen_fd = -1; /* the sweep listens again */
		feed_recheck(cp);
	}
}

/* replica_poll_closed: the poll handle may be set up again. */
static void replica_poll_closed(uv_handle_t *h)
{
	struct cp *cp = h->data;

	cp->listen_open = 0;
}

/* cp_replica_listen: (again) watches the store's LISTEN connection; from
 * the start and the sweep. Nothing to do on a store only one cp uses. */
void cp_replica_listen(struct cp *cp)
{
	int fd;

	if (!cpdb_shared(cp->db) || cp->listen_fd >= 0)
		return;
	if (cp->listen_open) { /* the old handle first */
		if (!uv_is_closing((uv_handle_t *)&cp->listen))
			uv_close((uv_handle_t *)&cp->listen, replica_poll_closed);
		return;
	}
	fd = cpdb_listen_fd(cp->db);
	if (fd < 0)
		return; /* the sweep tries again */
	if (uv_poll_init(cp->loop, &cp->listen, fd) < 0)
		return;
	cp->listen.data = cp;
	cp->listen_open = 1;
	cp->listen_fd = fd;
	uv_poll_start(&cp->listen, UV_READABLE, replica_readable);
	feed_recheck(cp); /* what was said while nobody listened */
}

/* cp_replica_sweep: every sweep with replicas: listen (again), the
 * backstop, and old idempotency records pruned now and then. */
void cp_replica_sweep(struct cp *cp)
{
	struct tt_err err = { 0 };
	int64_t now = tt_now();

	if (cpdb_shared(cp->db)) {
		cp_replica_listen(cp);
		feed_recheck(cp);
	}
	if (now - cp->idem_pruned >= 60) {
		cp->idem_pruned = now;
		if (cpdb_idem_prune(cp->db, now - IDEM_KEEP_S, &err) < 0)
			log_warn("idempotency records: %s", err.msg);
	}
}

/* cp_replica_close: the poll handle, at exit. */
void cp_replica_close(struct cp *cp)
{
	if (cp->listen_open && !uv_is_closing((uv_handle_t *)&cp->listen))
		uv_close((uv_handle_t *)&cp->listen, NULL);
}

/* idem_op: the lifecycle operation of a request, or NULL. */
static const char *idem_op(const char *m, const char *p, char *sbx, size_t cap)
{
	const char *rest;
	size_t n;

	sbx[0] = '\0';
	if (strcmp(p, "/v1/sandboxes") == 0)
		return strcmp(m, "POST") == 0 ? "create" : NULL;
	if (strncmp(p, "/v1/sandboxes/", 14) != 0)
		return NULL;
	rest = strchr(p + 14, '/');
	n = rest ? (size_t)(rest - (p + 14)) : strlen(p + 14);
	if (n >= cap)
		return NULL;
	memcpy(sbx, p + 14, n);
	sbx[n] = '\0';
	if (rest == NULL)
		return strcmp(m, "DELETE") == 0 ? "delete" : NULL;
	if (strcmp(m, "POST") != 0)
		return NULL;
	if (strcmp(rest, "/pause") == 0)
		return "pause";
	if (strcmp(rest, "/resume") == 0)
		return "resume";
	if (strcmp(rest, "/migrate") == 0)
		return "migrate";
	return NULL;
}

/* idem_wait: parks the repeated call r started, as its first run did. */
static int idem_wait(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                     const struct cpdb_idem *r)
{
	struct tt_err err = { 0 };
	struct cp_waitspec w = {
		.worker = r->worker, .rev = r->rev, .sbx = r->sandbox,
		.gen = r->generation, .target = r->target, .forced = r->forced,
		.resumed_from = r->resumed_from,
	};
	struct cp_sandbox sb;
	char q[8];
	int rc;

	if (strcmp(r->op, "create") == 0) {
		w.what = CP_WAIT_CREATE;
	} else if (strcmp(r->op, "delete") == 0) {
		w.what = CP_WAIT_DELETE;
	} else if (strcmp(r->op, "resume") == 0) {
		w.what = CP_WAIT_RESUME;
	} else if (strcmp(r->op, "pause") == 0) {
		w.what = CP_WAIT_PAUSE;
		/* pause?wait=0 answered at once, with the sandbox */
		if (http_query(wsi, "wait", q, sizeof(q)) == 0 && strcmp(q, "0") == 0) {
			if (cpdb_sandbox_get(cp->db, r->sandbox, &sb, &err) != 1)
				return http_reply_error(wsi, 500, "internal", "%s", err.msg);
			return http_reply_json(wsi, 202, cp_sandbox_json(cp, &sb));
		}
	} else {
		w.what = CP_WAIT_MIGRATE;
		/* past its pause: it waits for the resume on the target */
		rc = cpdb_sandbox_get(cp->db, r->sandbox, &sb, &err);
		if (rc < 0)
			return http_reply_error(wsi, 500, "internal", "%s", err.msg);
		if (rc == 1 && sb.generation == r->generation + 1 &&
		    strcmp(sb.worker, r->target) == 0) {
			w.what = CP_WAIT_RESUME;
			w.worker = r->target;
			w.rev = sb.op_rev;
			w.gen = sb.generation;
			w.resumed_from = r->generation;
		}
	}
	rc = feed_wait_ack(cp, s, wsi, &w);
	feed_recheck(cp); /* answered now if it is over */
	return rc;
}

/* cp_idem_begin: a lifecycle call with an Idempotency-Key: one that
 * already started something waits for it (1, *rc); otherwise the store
 * is armed to record what this one starts (0; cp_dispatch disarms).
 * Keys are the caller's own: another caller's never match. */
int cp_idem_begin(struct cp *cp, struct cp_sess *s, struct lws *wsi, int *rc)
{
	char key[CPDB_IDEM_KEY_MAX + 2], sbx[TT_SBX_ID_LEN + 2];
	const char *op = idem_op(s->method, s->path, sbx, sizeof(sbx));
	struct tt_err err = { 0 };
	struct cpdb_idem r;
	int len, found;

	if (op == NULL)
		return 0;
	len = lws_hdr_custom_length(wsi, IDEM_HEADER, (int)strlen(IDEM_HEADER));
	if (len <= 0)
		return 0;
	if (len > CPDB_IDEM_KEY_MAX ||
	    lws_hdr_custom_copy(wsi, key, (int)sizeof(key), IDEM_HEADER,
	                        (int)strlen(IDEM_HEADER)) != len ||
	    strspn(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	                "0123456789._:-") != (size_t)len) {
		*rc = http_reply_error(wsi, 400, "bad_request", "Idempotency-Key: 1..%d"
		                       " characters of [A-Za-z0-9._:-]", CPDB_IDEM_KEY_MAX);
		return 1;
	}
	found = cpdb_idem_get(cp->db, s->caller, key, &r, &err);
	if (found < 0) {
		*rc = http_reply_error(wsi, 500, "internal", "%s", err.msg);
		return 1;
	}
	if (found == 0) {
		cpdb_idem_arm(cp->db, s->caller, key, op);
		return 0;
	}
	if (strcmp(r.op, op) != 0 || (sbx[0] != '\0' && strcmp(r.sandbox, sbx) != 0)) {
		*rc = http_reply_error(wsi, 422, "idempotency_key_reused", "Idempotency-Key"
		                       " %s was used for another call (%s of %s)", key,
		                       r.op, r.sandbox);
		return 1;
	}
	log_info("sandbox %s: %s repeated under Idempotency-Key %s (rev %lld): waiting"
	         " for the one it started", r.sandbox, r.op, key, (long long)r.rev);
	metrics_inc("tether_cp_idempotent_replays_total", NULL);
	*rc = idem_wait(cp, s, wsi, &r);
	return 1;
}

/* tetherd cp: the control plane. HTTP API of docs/API.md on lws + libuv,
 * state in SQLite (db.c), update feed and parked requests (feed.c), and a
 * separate signer process holding the private key (signer.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <sodium.h>

#include "claims.h"
#include "cleanup.h"
#include "cp/cp.h"
#include "cp/events.h"
#include "keyring.h"
#include "log.h"
#include "metrics.h"
#include "tetherd/roles.h"
#include "timefmt.h"

#define CP_KEY_MAX 256     /* Authorization header bound */
#define CP_QUERY_MAX 128

static struct cp cp_global;

/* cp_of: the daemon state from any wsi. */
static struct cp *cp_of(struct lws *wsi)
{
	return lws_context_user(lws_get_context(wsi));
}

/* cp_now_us: monotonic microseconds for latency metrics. */
static uint64_t cp_now_us(void)
{
	return uv_hrtime() / 1000u;
}

/* ---- JSON views ------------------------------------------------------ */

/* cp_time: RFC 3339 string (or null for 0). */
static json_t *cp_time(int64_t t)
{
	char buf[TT_RFC3339_MAX];

	if (t == 0 || rfc3339_format(t, buf) < 0)
		return json_null();
	return json_string(buf);
}

/* cp_snapshot_json: the latest complete snapshot of sbx, or null. */
static json_t *cp_snapshot_json(struct cp *cp, const char *sbx)
{
	struct tt_err err = { 0 };
	struct cp_snapshot sn;

	if (cpdb_snapshot_latest(cp->db, sbx, &sn, &err) != 1)
		return json_null();
	return json_pack("{s:I,s:s,s:I,s:s,s:o}", "generation",
	                 (json_int_t)sn.generation, "key", sn.key, "size",
	                 (json_int_t)sn.size, "checksum", sn.checksum,
	                 "created_at", cp_time(sn.created_at));
}

/* cp_sandbox_json: the sandbox object of docs/API.md. */
json_t *cp_sandbox_json(struct cp *cp, const struct cp_sandbox *s)
{
	struct tt_err err = { 0 };
	struct cp_worker w;
	json_t *o;

	if (cpdb_worker_get(cp->db, s->worker, &w, &err) <= 0)
		w.node_url[0] = '\0';
	o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:I,s:s,s:o,s:o}", "id", s->id,
	              "state", s->state, "generation", (json_int_t)s->generation,
	              "worker", s->worker, "substrate", s->substrate,
	              "pod", s->pod, "activation", (json_int_t)s->activation,
	              "node_url", w.node_url, "created_at",
	              cp_time(s->created_at), "cpu",
	              s->cpu > 0 ? json_integer(s->cpu) : json_null());
	if (o == NULL)
		return NULL;
	if (s->error[0] != '\0')
		json_object_set_new(o, "error", json_string(s->error));
	if (s->note[0] != '\0')
		json_object_set_new(o, "note", json_string(s->note));
	if (s->resume_on[0] != '\0')
		json_object_set_new(o, "resume_on", json_string(s->resume_on));
	json_object_set_new(o, "snapshot", cp_snapshot_json(cp, s->id));
	if (strcmp(s->state, "pausing") == 0)
		json_object_set_new(o, "progress", json_pack("{s:I,s:o}", "bytes",
		        (json_int_t)(s->progress_bytes < 0 ? 0 : s->progress_bytes),
		        "total", s->progress_total < 0 ? json_null() :
		        json_integer(s->progress_total)));
	return o;
}

/* cp_worker_up: liveness rule shared by placement, listing, lifecycle. */
int cp_worker_up(struct cp *cp, const struct cp_worker *w, int64_t now)
{
	return now - w->last_seen <= cp->worker_timeout ||
	       feed_polling(cp, w->id);
}

/* cp_worker_accepts: up and not stopping: what placement and resume
 * targets need (a draining worker still finishes its pauses). */
int cp_worker_accepts(struct cp *cp, const struct cp_worker *w, int64_t now)
{
	return !w->draining && cp_worker_up(cp, w, now);
}

/* cp_transitional: see cp.h. */
int cp_transitional(const struct cp_sandbox *sb)
{
	return strcmp(sb->state, "starting") == 0 ||
	       strcmp(sb->state, "pausing") == 0 ||
	       strcmp(sb->state, "resuming") == 0 ||
	       (strcmp(sb->state, "paused") == 0 && sb->migrate_to[0] != '\0');
}

/* cp_wall_ms: the wall clock in ms (leases are shared by replicas). */
static int64_t cp_wall_ms(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* A capability given to a rebuilt attempt (SPEC §8: exactly one, after a
 * RefreshRoute) holds lifecycle calls on its execution for a moment, so
 * the attempt is admitted and drained by a pause rather than refused by
 * it: the caller would see the second RefreshRoute. The lease is in the
 * store: a lifecycle call on another replica holds too. */

/* cp_leased: a rebuilt attempt was given a capability of sb's execution
 * less than CP_REBUILD_LEASE_MS ago. */
static int cp_leased(struct cp *cp, const struct cp_sandbox *sb)
{
	struct tt_err err = { 0 };
	int rc = cpdb_leased(cp->db, sb->id, sb->generation, sb->activation,
	                     cp_wall_ms(), &err);

	if (rc < 0)
		log_warn("sandbox %s: lease: %s", sb->id, err.msg);
	return rc == 1;
}

/* cp_lease: notes the capability just given to a rebuilt attempt. */
static void cp_lease(struct cp *cp, const struct cp_sandbox *sb)
{
	struct tt_err err = { 0 };

	if (cpdb_lease_set(cp->db, sb->id, sb->generation, sb->activation,
	                   cp_wall_ms() + CP_REBUILD_LEASE_MS, &err) < 0)
		log_warn("sandbox %s: lease: %s", sb->id, err.msg);
}

/* cp_settle_waits: a transition in flight, or (for a capability refused
 * as stale) the same execution still recorded as running: the worker
 * retired or lost it and the cp has not heard yet; a lifecycle call also
 * waits out a rebuilt attempt's lease. */
int cp_settle_waits(struct cp *cp, const struct cp_sandbox *sb,
                    const struct cp_settle *w)
{
	if (cp_transitional(sb))
		return 1;
	if (!w->op && cp_leased(cp, sb))
		return 1;
	/* paused by its worker's stop: back as soon as the worker is (an
	 * operation waits for that; a lifecycle call may move it meanwhile) */
	if (w->op && strcmp(sb->state, "paused") == 0 && sb->resume_on[0] != '\0')
		return 1;
	return w->stale_gen != 0 && strcmp(sb->state, "running") == 0 &&
	       sb->generation == w->stale_gen && sb->activation == w->stale_att;
}

/* cp_wait_transition: parks the request while cp_settle_waits (SPEC §7: a
 * transition is invisible to callers), within the caller's X-Tether-Wait
 * (default 30 s); 1 = parked or answered (*rc), 0 = answer now. */
static int cp_wait_transition(struct cp *cp, struct cp_sess *s,
                              struct lws *wsi, const struct cp_sandbox *sb,
                              const struct cp_settle *w, json_t *body, int *rc)
{
	int secs;

	if (s->settle_over || !cp_settle_waits(cp, sb, w))
		return 0;
	if (s->settle_deadline == 0) {
		secs = http_wait_seconds(wsi);
		if (secs < 0) {
			*rc = http_reply_error(wsi, 400, "bad_request", "X-Tether-Wait "
			                       "must be 0..%d seconds", HTTP_WAIT_MAX_S);
			return 1;
		}
		if (secs == 0)
			return 0;
		s->settle_deadline = uv_now(cp->loop) + (uint64_t)secs * 1000u;
	}
	*rc = feed_wait_settle(cp, s, wsi, sb->id, w, body);
	return 1;
}

/* cp_waited: " after waiting N s" for messages of a request whose wait ran
 * out, else "". */
static const char *cp_waited(const struct cp_sess *s)
{
	return s->settle_over ? " (the transition did not end in time)" : "";
}

/* ---- authentication -------------------------------------------------- */

/* cp_auth_value: the credential after "Authorization: <scheme> ". */
static int cp_auth_value(struct lws *wsi, const char *scheme, char *buf,
                         size_t cap)
{
	size_t sl = strlen(scheme);
	int n = http_header(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, buf, cap);

	if (n <= (int)sl + 1 || strncmp(buf, scheme, sl) != 0 || buf[sl] != ' ')
		return -1;
	memmove(buf, buf + sl + 1, (size_t)n - sl);
	return n - (int)sl - 1;
}

/* cp_auth_bearer: 1 and the key's name in s->caller when the API key is
 * known; the key itself is only ever hashed. */
static int cp_auth_bearer(struct cp *cp, struct lws *wsi, struct cp_sess *s)
{
	char key[CP_KEY_MAX];
	struct tt_err err = { 0 };
	int rc;

	if (cp_auth_value(wsi, "Bearer", key, sizeof(key)) <= 0)
		return 0;
	rc = cpdb_apikey_lookup(cp->db, key, s->caller, sizeof(s->caller), &err);
	sodium_memzero(key, sizeof(key));
	if (rc < 0)
		log_error("api key lookup: %s", err.msg);
	return rc == 1;
}

/* ---- handlers -------------------------------------------------------- */

/* Placement scan state. */
struct cp_pick {
	struct cp *cp;
	int64_t now;
	int64_t best_load;
	char best[TT_NAME_MAX + 1];
};

/* cp_pick_one: keeps the up worker with the fewest live sandboxes. */
static void cp_pick_one(const struct cp_worker *w, void *arg)
{
	struct cp_pick *pk = arg;
	struct tt_err err = { 0 };
	int64_t load;

	if (!cp_worker_accepts(pk->cp, w, pk->now) ||
	    cpdb_worker_load(pk->cp->db, w->id, &load, &err) < 0)
		return;
	if (pk->best[0] == '\0' || load < pk->best_load) {
		pk->best_load = load;
		snprintf(pk->best, sizeof(pk->best), "%s", w->id);
	}
}

/* cp_body_cpu: the create body's "cpu" into *cpu (0: absent or null, the
 * worker's default); -1 when it is anything but an integer of millicores
 * within the feed's bounds (lib/feedsig.h). */
static int cp_body_cpu(json_t *body, int64_t *cpu)
{
	json_t *v = body ? json_object_get(body, "cpu") : NULL;

	*cpu = 0;
	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < FEEDSIG_CPU_MIN ||
	    json_integer_value(v) > FEEDSIG_CPU_MAX)
		return -1;
	*cpu = (int64_t)json_integer_value(v);
	return 0;
}

/* cp_create: placement, sandbox row + install update, then wait for the
 * worker's ack (the reply is written by feed.c). */
static int cp_create(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                     json_t *body)
{
	struct tt_err err = { 0 };
	struct cp_pick pk = { .cp = cp, .now = tt_now() };
	json_t *jw = body ? json_object_get(body, "worker") : NULL;
	json_t *jsst = body ? json_object_get(body, "substrate") : NULL;
	const char *sst = cp->default_substrate;
	char id[TT_SBX_ID_LEN + 1];
	struct cp_sandbox sb;
	struct cp_worker w;
	int64_t rev, cpu;
	int rc;

	/* checked before anything is placed: a refusal creates nothing */
	if (cp_body_cpu(body, &cpu) < 0)
		return http_reply_error(wsi, 400, "bad_request", "cpu must be an integer "
		                        "number of millicores, %d..%d (1000 = one CPU), "
		                        "or null for the worker's default",
		                        FEEDSIG_CPU_MIN, FEEDSIG_CPU_MAX);
	if (jsst != NULL && !json_is_null(jsst)) {
		sst = json_string_value(jsst);
		if (sst == NULL || (strcmp(sst, "ns") != 0 && strcmp(sst, "microvm") != 0))
			return http_reply_error(wsi, 400, "bad_request",
			                        "substrate must be \"ns\" or \"microvm\"");
	}
	if (jw != NULL && !json_is_null(jw)) {
		const char *wid = json_string_value(jw);

		if (wid == NULL || strlen(wid) == 0 || strlen(wid) > TT_NAME_MAX)
			return http_reply_error(wsi, 400, "bad_request",
			                        "worker must be a worker id string");
		rc = cpdb_worker_get(cp->db, wid, &w, &err);
		if (rc < 0)
			return http_reply_error(wsi, 500, "internal", "%s", err.msg);
		if (rc == 0)
			return http_reply_error(wsi, 404, "not_found",
			                        "no worker %s", wid);
		if (!cp_worker_accepts(cp, &w, pk.now))
			return http_reply_error(wsi, 409, "conflict", "worker %s is %s",
			                        wid, w.draining ? "stopping" : "down");
		snprintf(pk.best, sizeof(pk.best), "%s", wid);
	} else if (cpdb_workers_each(cp->db, cp_pick_one, &pk, &err) < 0) {
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	}
	if (pk.best[0] == '\0')
		return http_reply_error(wsi, 503, "unavailable", "no worker is up");
	sbx_id_new(id);
	if (cpdb_sandbox_create_on(cp->db, id, pk.best, sst, cpu, pk.now, &sb, &rev,
	                           &err) < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	log_info("sandbox %s: install gen 1 on %s, substrate %s (rev %lld, cpu %lld%s) for %s",
	         id, pk.best, sst, (long long)rev, (long long)cpu, cpu ? "m" : " = default",
	         s->caller);
	metrics_inc("tether_cp_sandboxes_created_total", NULL);
	cp_events_begin(&sb, "create", 1, pk.best);
	feed_wake(cp, pk.best);
	return feed_wait_ack(cp, s, wsi, &(struct cp_waitspec){
	        .what = CP_WAIT_CREATE, .worker = pk.best, .rev = rev,
	        .sbx = id, .gen = 1 });
}

/* What cp_list_one appends to. */
struct cp_listing {
	struct cp *cp;
	json_t *arr;
};

/* cp_list_one: appends one sandbox to the listing. */
static void cp_list_one(const struct cp_sandbox *sb, void *arg)
{
	struct cp_listing *l = arg;

	json_array_append_new(l->arr, cp_sandbox_json(l->cp, sb));
}

/* cp_list: GET /v1/sandboxes. */
static int cp_list(struct cp *cp, struct lws *wsi)
{
	struct tt_err err = { 0 };
	struct cp_listing l = { cp, json_array() };

	if (l.arr == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	if (cpdb_sandboxes_each(cp->db, cp_list_one, &l, &err) < 0) {
		json_decref(l.arr);
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	}
	return http_reply_json(wsi, 200, json_pack("{s:o}", "sandboxes", l.arr));
}

/* cp_lookup: the live sandbox named in the path, or an error reply. */
static int cp_lookup(struct cp *cp, struct lws *wsi, const char *id,
                     struct cp_sandbox *sb, int *replied)
{
	struct tt_err err = { 0 };
	int rc;

	*replied = 1;
	if (!sbx_id_valid(id))
		return http_reply_error(wsi, 404, "not_found", "no sandbox %.40s",
		                        id);
	rc = cpdb_sandbox_get(cp->db, id, sb, &err);
	if (rc < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	if (rc == 0 || strcmp(sb->state, "deleted") == 0)
		return http_reply_error(wsi, 404, "not_found", "no sandbox %s", id);
	*replied = 0;
	return 0;
}

/* cp_delete: destroy update, then wait for the worker's ack. */
static int cp_delete(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                     const struct cp_sandbox *sb)
{
	struct tt_err err = { 0 };
	int64_t rev;
	int rc;

	/* a destroy sent mid-migrate would reach the old worker only */
	if (cp_wait_transition(cp, s, wsi, sb, &(struct cp_settle){ 0 }, NULL, &rc))
		return rc;
	if (cpdb_sandbox_destroy(cp->db, sb, tt_now(), &rev, &err) < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	log_info("sandbox %s: destroy on %s (rev %lld) for %s", sb->id,
	         sb->worker, (long long)rev, s->caller);
	feed_wake(cp, sb->worker);
	return feed_wait_ack(cp, s, wsi, &(struct cp_waitspec){
	        .what = CP_WAIT_DELETE, .worker = sb->worker, .rev = rev,
	        .sbx = sb->id });
}

/* cp_cap_claims: validates the request body and builds the claims the
 * signer completes; NULL + a reply already sent on bad input. */
static json_t *cp_cap_claims(struct lws *wsi, struct cp_sess *s,
                             const struct cp_sandbox *sb, json_t *body,
                             int *rc)
{
	const char *pur = json_string_value(json_object_get(body, "purpose"));
	json_t *c, *ops, *v;
	size_t i;

	*rc = 0;
	c = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:I,s:s}", "sub", s->caller,
	              "sbx", sb->id, "gen", (json_int_t)sb->generation,
	              "wrk", sb->worker, "sst", sb->substrate, "pod", sb->pod,
	              "att", (json_int_t)sb->activation, "pur",
	              pur ? pur : "");
	if (c == NULL) {
		*rc = http_reply_error(wsi, 500, "internal", "out of memory");
		return NULL;
	}
	if (pur != NULL && strcmp(pur, "control") == 0) {
		ops = json_object_get(body, "ops");
		if (!json_is_array(ops) || json_array_size(ops) == 0 ||
		    json_array_size(ops) > 16)
			goto bad_ops;
		json_array_foreach(ops, i, v) {
			if (!json_is_string(v) ||
			    wireop_cap(wireop_parse(json_string_value(v))) == 0)
				goto bad_ops;
		}
		json_object_set_new(c, "aud", json_string("node"));
		json_object_set(c, "ops", ops);
		return c;
	}
	if (pur != NULL && strcmp(pur, "port") == 0) {
		json_t *port = json_object_get(body, "port");
		const char *proto = json_string_value(json_object_get(body,
		                                                      "proto"));

		if (!json_is_integer(port) || json_integer_value(port) < 1 ||
		    json_integer_value(port) > 65535 || proto == NULL ||
		    (strcmp(proto, "tcp") != 0 && strcmp(proto, "http") != 0)) {
			json_decref(c);
			*rc = http_reply_error(wsi, 400, "bad_request",
			        "port purpose needs port 1..65535 and proto tcp|http");
			return NULL;
		}
		json_object_set_new(c, "aud", json_string("gateway"));
		json_object_set(c, "port", port);
		json_object_set_new(c, "proto", json_string(proto));
		return c;
	}
	json_decref(c);
	*rc = http_reply_error(wsi, 400, "bad_request",
	                       "purpose must be \"control\" or \"port\"");
	return NULL;
bad_ops:
	json_decref(c);
	*rc = http_reply_error(wsi, 400, "bad_request",
	        "ops must be a non-empty list of known operations");
	return NULL;
}

/* cp_capability: POST /v1/sandboxes/{id}/capabilities. */
static int cp_capability(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                         const struct cp_sandbox *sb, json_t *body)
{
	struct tt_err err = { 0 };
	char expires[TT_RFC3339_MAX];
	_cleanup_free_ char *token = NULL;
	struct cp_worker w;
	uint64_t t0 = cp_now_us();
	struct cp_settle sw = { .op = 1 };
	json_t *claims, *st;
	int rc;

	if (body == NULL)
		return http_reply_error(wsi, 400, "bad_request",
		                        "JSON body with purpose expected");
	/* "stale": the execution a receiver just refused (RefreshRoute): a
	 * fresh capability must name another one */
	st = json_object_get(body, "stale");
	if (st != NULL) {
		json_t *g = json_object_get(st, "generation");
		json_t *a = json_object_get(st, "activation");

		if (!json_is_object(st) || !json_is_integer(g) ||
		    json_integer_value(g) < 1 || !json_is_integer(a) ||
		    json_integer_value(a) < 1 || json_integer_value(a) > UINT32_MAX)
			return http_reply_error(wsi, 400, "bad_request", "stale needs "
			                        "generation >= 1 and activation >= 1");
		sw.stale_gen = (uint64_t)json_integer_value(g);
		sw.stale_att = (uint32_t)json_integer_value(a);
	}
	if (cp_wait_transition(cp, s, wsi, sb, &sw, body, &rc))
		return rc;
	if (strcmp(sb->state, "running") != 0)
		return http_reply_error(wsi, 409, "conflict",
		                        "sandbox %s is %s, not running%s", sb->id,
		                        sb->state, cp_waited(s));
	claims = cp_cap_claims(wsi, s, sb, body, &rc);
	if (claims == NULL)
		return rc;
	rc = cp_signer_sign(&cp->signer, claims, &token, expires, &err);
	json_decref(claims);
	if (rc < 0) {
		log_error("signer: %s", err.msg);
		return http_reply_error(wsi, err.code == TT_ERR_DENIED ? 400 : 503,
		                        err.code == TT_ERR_DENIED ? "bad_request"
		                                                  : "unavailable",
		                        "%s", err.msg);
	}
	if (cpdb_worker_get(cp->db, sb->worker, &w, &err) <= 0)
		w.node_url[0] = '\0';
	if (sw.stale_gen != 0)
		cp_lease(cp, sb);
	metrics_inc("tether_cp_capabilities_total", NULL);
	metrics_observe_us("tether_cp_sign_seconds", NULL, cp_now_us() - t0);
	return http_reply_json(wsi, 201, json_pack(
	        "{s:s,s:s,s:s,s:I,s:s,s:s,s:s,s:I,s:s}", "token", token,
	        "expires_at", expires, "sandbox", sb->id, "generation",
	        (json_int_t)sb->generation, "worker", sb->worker, "substrate",
	        sb->substrate, "pod", sb->pod, "activation",
	        (json_int_t)sb->activation, "node_url", w.node_url));
}

/* cp_workers_one: appends one worker to the listing in arg. */
static void cp_workers_one(const struct cp_worker *w, void *arg)
{
	struct cp_listing *l = arg;

	json_array_append_new(l->arr, json_pack("{s:s,s:s,s:s,s:o,s:I}",
	        "id", w->id, "node_url", w->node_url, "state",
	        !cp_worker_up(l->cp, w, tt_now()) ? "down" : w->draining ? "stopping"
	        : "up", "last_seen",
	        cp_time(w->last_seen), "acked_rev", (json_int_t)w->acked_rev));
}

/* cp_workers: GET /v1/workers. */
static int cp_workers(struct cp *cp, struct lws *wsi)
{
	struct tt_err err = { 0 };
	struct cp_listing l = { cp, json_array() };

	if (l.arr == NULL || cpdb_workers_each(cp->db, cp_workers_one, &l,
	                                       &err) < 0) {
		json_decref(l.arr);
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	}
	return http_reply_json(wsi, 200, json_pack("{s:o}", "workers", l.arr));
}

/* cp_keys: GET /v1/keys: the public verification bundle receivers get in
 * the feed's newest "keys" update (docs/API.md), for tether keys. */
static int cp_keys(struct cp *cp, struct lws *wsi)
{
	struct tt_err err = { 0 };
	json_t *last = cpdb_feed_last_body(cp->db, "keys", &err);

	if (last == NULL && err.code != TT_OK)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	if (last == NULL)
		last = json_pack("{s:[]}", "keys");
	return http_reply_json(wsi, 200, last);
}

/* cp_name_ok: worker ids are short [A-Za-z0-9._-] names. */
int cp_name_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n > TT_NAME_MAX)
		return 0;
	return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	                 "0123456789._-") == n;
}

/* cp_query_int: integer query parameter in [lo, hi], def if absent; -1 on
 * a bad value. */
static int cp_query_int(struct lws *wsi, const char *name, int64_t lo,
                        int64_t hi, int64_t def, int64_t *out)
{
	char buf[CP_QUERY_MAX], *end;
	long long v;

	if (http_query(wsi, name, buf, sizeof(buf)) < 0) {
		*out = def;
		return 0;
	}
	errno = 0;
	v = strtoll(buf, &end, 10);
	if (errno != 0 || end == buf || *end != '\0' || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* cp_feed: GET /v1/feed?worker=W&after=R&wait=S (Node). */
static int cp_feed(struct cp *cp, struct cp_sess *s, struct lws *wsi)
{
	struct tt_err err = { 0 };
	char worker[TT_NAME_MAX + 2];
	int64_t after, wait;
	int rc;

	if (http_query(wsi, "worker", worker, sizeof(worker)) < 0 ||
	    !cp_name_ok(worker) ||
	    cp_query_int(wsi, "after", 0, INT64_MAX, 0, &after) < 0 ||
	    cp_query_int(wsi, "wait", 0, CP_FEED_WAIT_MAX, 0, &wait) < 0)
		return http_reply_error(wsi, 400, "bad_request",
		        "feed needs worker=ID, after=REV >= 0, wait=0..%d",
		        CP_FEED_WAIT_MAX);
	rc = cpdb_worker_seen(cp->db, worker, tt_now(), &err);
	if (rc < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	if (rc == 0)
		return http_reply_error(wsi, 404, "not_found",
		                        "worker %s is not registered", worker);
	return feed_poll(cp, s, wsi, worker, after, (int)wait);
}

/* ---- lifecycle: pause, resume, migrate (docs/API.md) ----------------- */

/* cp_refuse: fills why; returns -1. */
static int cp_refuse(struct cp_refusal *why, unsigned status,
                     const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int cp_refuse(struct cp_refusal *why, unsigned status,
                     const char *code, const char *fmt, ...)
{
	va_list ap;

	why->status = status;
	why->code = code;
	va_start(ap, fmt);
	vsnprintf(why->msg, sizeof(why->msg), fmt, ap);
	va_end(ap);
	return -1;
}

/* cp_reply_refusal: the error reply for a refusal. */
static int cp_reply_refusal(struct lws *wsi, const struct cp_refusal *why)
{
	return http_reply_error(wsi, why->status, why->code, "%s", why->msg);
}

/* cp_op_name: what a pending state waits for, for messages. */
static const char *cp_op_name(const struct cp_sandbox *sb)
{
	return strcmp(sb->state, "pausing") == 0 ? "pause" :
	       strcmp(sb->state, "starting") == 0 ? "create" : "resume";
}

/* cp_op_fail: the pending pause/install of sb cannot finish: CAS to failed
 * and retire that generation on its worker (it refuses the generation as
 * soon as it hears), then answer whoever waits. */
void cp_op_fail(struct cp *cp, const struct cp_sandbox *sb, const char *why)
{
	struct tt_err err = { 0 };
	int64_t rrev = 0;
	int rc = cpdb_sandbox_cas(cp->db, sb->id, sb->state, sb->generation,
	                          sb->op_rev, "failed", why, sb->worker,
	                          tt_now(), &rrev, &err);

	if (rc < 0) {
		log_error("sandbox %s: cannot record failure: %s", sb->id, err.msg);
		return;
	}
	if (rc == 0)
		return; /* moved on meanwhile */
	log_warn("sandbox %s: gen %llu %s failed on %s: %s; retire at rev %lld",
	         sb->id, (unsigned long long)sb->generation, cp_op_name(sb),
	         sb->worker, why, (long long)rrev);
	metrics_inc("tether_cp_lifecycle_failed_total", NULL);
	cp_events_check(cp, sb->id);
	feed_wake(cp, sb->worker);
	feed_settled(cp, sb->id);
}

/* cp_op_pending: pausing or resuming (an ack is awaited). */
static int cp_op_pending(const struct cp_sandbox *sb)
{
	return strcmp(sb->state, "pausing") == 0 ||
	       strcmp(sb->state, "resuming") == 0;
}


/* cp_op_expire: a parked caller's ack wait ran out. */
void cp_op_expire(struct cp *cp, const char *sbx, int64_t rev)
{
	struct tt_err err = { 0 };
	struct cp_sandbox sb;

	if (cpdb_sandbox_get(cp->db, sbx, &sb, &err) == 1 &&
	    cp_op_pending(&sb) && sb.op_rev == rev)
		cp_op_fail(cp, &sb, "worker did not acknowledge in time");
}

static void cp_migrate_continue(struct cp *cp, const char *sbx);

/* cp_sandboxes_keep: see cp.h. */
void cp_sandboxes_keep(struct cp_sandboxes *l, const struct cp_sandbox *sb)
{
	struct cp_sandbox *nv;

	if (l->n == l->cap) {
		nv = reallocarray(l->v, l->cap ? l->cap * 2 : 8, sizeof(*nv));
		if (nv == NULL)
			return;
		l->v = nv;
		l->cap = l->cap ? l->cap * 2 : 8;
	}
	l->v[l->n++] = *sb;
}

/* cp_sweep_one: keeps sandboxes with a pending pause/install. */
static void cp_sweep_one(const struct cp_sandbox *sb, void *arg)
{
	/* A create waits for its install's ack like a pause or resume
	 * (before, one never acked stayed starting for good). */
	if (!cp_op_pending(sb) && strcmp(sb->state, "starting") != 0 &&
	    !(strcmp(sb->state, "paused") == 0 &&
	      (sb->migrate_to[0] != '\0' || sb->resume_on[0] != '\0')))
		return;
	cp_sandboxes_keep(arg, sb);
}

/* cp_sweep: every CP_SWEEP_MS, fails pauses/resumes whose worker is down
 * or that waited CP_ACK_WAIT_SECS (also those a restarted cp inherited). */
static void cp_sweep(uv_timer_t *t)
{
	struct cp *cp = t->data;
	struct tt_err err = { 0 };
	struct cp_sandboxes l = { 0 };
	_cleanup_free_ struct cp_sandbox *owned = NULL;
	struct cp_worker w;
	char why[CPDB_ERR_MAX];
	int64_t now = tt_now();

	cp_rotate_sweep(cp); /* key rotation (rotate.c) */
	cp_replica_sweep(cp); /* other replicas (replica.c) */
	if (cpdb_sandboxes_each(cp->db, cp_sweep_one, &l, &err) < 0)
		log_error("sweep: %s", err.msg);
	owned = l.v; /* owner of the collected copies */
	for (size_t i = 0; i < l.n; i++) {
		const struct cp_sandbox *sb = &l.v[i];
		int known;

		if (strcmp(sb->state, "paused") == 0 && sb->migrate_to[0] != '\0') {
			/* a migrate whose resume a cp restart cut off */
			cp_migrate_continue(cp, sb->id);
			continue;
		}
		if (strcmp(sb->state, "paused") == 0) {
			/* paused by its worker's stop: back when the worker is */
			cp_resume_returned(cp, sb);
			continue;
		}
		known = cpdb_worker_get(cp->db, sb->worker, &w, &err) == 1;

		/* a create's install went out when the row was made */
		int64_t since = strcmp(sb->state, "starting") == 0 ? sb->created_at : sb->op_at;

		if (!known || !cp_worker_up(cp, &w, now))
			snprintf(why, sizeof(why), "worker %s went down during the %s",
			         sb->worker, cp_op_name(sb));
		else if (now - since > CP_ACK_WAIT_SECS)
			snprintf(why, sizeof(why), "worker %s did not acknowledge "
			         "within %d s", sb->worker, CP_ACK_WAIT_SECS);
		else
			continue;
		cp_op_fail(cp, sb, why);
	}
}

/* cp_worker_check: the named worker exists (404) and is up (409). */
static int cp_worker_check(struct cp *cp, const char *id, int64_t now,
                           struct cp_refusal *why)
{
	struct tt_err err = { 0 };
	struct cp_worker w;
	int rc = cpdb_worker_get(cp->db, id, &w, &err);

	if (rc < 0)
		return cp_refuse(why, 500, "internal", "%s", err.msg);
	if (rc == 0)
		return cp_refuse(why, 404, "not_found", "no worker %s", id);
	if (!cp_worker_accepts(cp, &w, now))
		return cp_refuse(why, 409, "conflict", "worker %s is %s", id,
		                 w.draining ? "stopping" : "down");
	return 0;
}

/* cp_active: a state in which an execution is (or may be) live. */
static int cp_active(const char *state)
{
	return strcmp(state, "starting") == 0 || strcmp(state, "running") == 0 ||
	       strcmp(state, "pausing") == 0 || strcmp(state, "resuming") == 0;
}

/* cp_resume_begin: checks, then the resume CAS (see cp.h). */
int cp_resume_begin(struct cp *cp, const struct cp_sandbox *sb,
                    const char *worker, int force, struct cp_resumed *out,
                    struct cp_refusal *why)
{
	struct tt_err err = { 0 };
	struct cp_pick pk = { .cp = cp, .now = tt_now() };
	struct cp_worker old;
	struct cp_snapshot snap;
	int64_t retire_rev = 0;
	int old_up, has_snap, forced, rc;

	memset(out, 0, sizeof(*out));
	if (!cp_active(sb->state) && strcmp(sb->state, "paused") != 0 &&
	    strcmp(sb->state, "failed") != 0)
		return cp_refuse(why, 409, "conflict", "sandbox %s is %s", sb->id,
		                 sb->state);
	rc = cpdb_worker_get(cp->db, sb->worker, &old, &err);
	has_snap = rc < 0 ? -1 : cpdb_snapshot_latest(cp->db, sb->id, &snap,
	                                               &err);
	if (rc < 0 || has_snap < 0)
		return cp_refuse(why, 500, "internal", "%s", err.msg);
	old_up = rc == 1 && cp_worker_up(cp, &old, pk.now);
	if (cp_active(sb->state) && old_up)
		return cp_refuse(why, 409, "conflict", "sandbox %s is %s on %s",
		                 sb->id, sb->state, sb->worker);
	/* a live (or possibly live) execution on a down worker: failover only
	 * on request, since the old worker may still serve until it hears */
	forced = strcmp(sb->state, "paused") != 0 && !old_up;
	if (forced && !force)
		return has_snap
		       ? cp_refuse(why, 409, "conflict", "worker %s is down; use "
		                   "--force to resume from the last complete "
		                   "snapshot (generation %llu)", sb->worker,
		                   (unsigned long long)snap.generation)
		       : cp_refuse(why, 409, "conflict", "worker %s is down and "
		                   "sandbox %s has no complete snapshot",
		                   sb->worker, sb->id);
	if (!has_snap)
		return cp_refuse(why, 409, "conflict", "sandbox %s has no complete"
		                 " snapshot to resume from", sb->id);
	if (worker != NULL && worker[0] != '\0') {
		if (cp_worker_check(cp, worker, pk.now, why) < 0)
			return -1;
		snprintf(pk.best, sizeof(pk.best), "%s", worker);
	} else if (cpdb_workers_each(cp->db, cp_pick_one, &pk, &err) < 0) {
		return cp_refuse(why, 500, "internal", "%s", err.msg);
	} else if (pk.best[0] == '\0') {
		return cp_refuse(why, 503, "unavailable", "no worker is up");
	}
	rc = cpdb_sandbox_resume(cp->db, sb->id, &(struct cpdb_resume){
	        .from = sb->state, .gen = sb->generation, .worker = pk.best,
	        .snapshot_key = snap.key,
	        .retire_worker = forced ? sb->worker : NULL },
	        pk.now, &out->generation, &out->rev, &retire_rev, &err);
	if (rc < 0)
		return cp_refuse(why, 500, "internal", "%s", err.msg);
	if (rc == 0)
		return cp_refuse(why, 409, "conflict", "sandbox %s changed "
		                 "concurrently; nothing was done", sb->id);
	snprintf(out->worker, sizeof(out->worker), "%s", pk.best);
	out->forced = forced;
	out->resumed_from = snap.generation;
	if (forced) {
		log_warn("sandbox %s: forced resume: retire gen %llu on %s "
		         "(rev %lld)", sb->id, (unsigned long long)sb->generation,
		         sb->worker, (long long)retire_rev);
		metrics_inc("tether_cp_forced_resumes_total", NULL);
		feed_wake(cp, sb->worker);
	}
	log_info("sandbox %s: install gen %llu on %s from snapshot %s (rev %lld)",
	         sb->id, (unsigned long long)out->generation, pk.best, snap.key,
	         (long long)out->rev);
	metrics_inc("tether_cp_resumes_total", NULL);
	cp_events_begin(sb, "resume", out->generation, pk.best);
	feed_wake(cp, pk.best);
	return 0;
}

/* cp_pause_begin: state and worker checks, then the pause CAS. */
int cp_pause_begin(struct cp *cp, const struct cp_sandbox *sb,
                   const char *migrate_to, const char *resume_on, int64_t *rev,
                   struct cp_refusal *why)
{
	struct tt_err err = { 0 };
	struct cp_worker w;
	int rc;

	if (strcmp(sb->state, "running") != 0)
		return cp_refuse(why, 409, "conflict", "sandbox %s is %s", sb->id,
		                 sb->state);
	rc = cpdb_worker_get(cp->db, sb->worker, &w, &err);
	if (rc < 0)
		return cp_refuse(why, 500, "internal", "%s", err.msg);
	if (rc == 0 || !cp_worker_up(cp, &w, tt_now()))
		return cp_refuse(why, 409, "conflict", "worker %s is down; use "
		                 "resume --force to resume from the last complete "
		                 "snapshot", sb->worker);
	rc = cpdb_sandbox_pause(cp->db, sb, migrate_to, resume_on, tt_now(), rev,
	                        &err);
	if (rc < 0)
		return cp_refuse(why, 500, "internal", "%s", err.msg);
	if (rc == 0)
		return cp_refuse(why, 409, "conflict", "sandbox %s changed "
		                 "concurrently; nothing was done", sb->id);
	log_info("sandbox %s: pause gen %llu on %s (rev %lld)", sb->id,
	         (unsigned long long)sb->generation, sb->worker, (long long)*rev);
	metrics_inc("tether_cp_pauses_total", NULL);
	cp_events_begin(sb, "pause", sb->generation, migrate_to);
	feed_wake(cp, sb->worker);
	return 0;
}

/* cp_pause: POST /v1/sandboxes/{id}/pause[?wait=0]. */
static int cp_pause(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                    const struct cp_sandbox *sb)
{
	struct tt_err err = { 0 };
	struct cp_refusal why = { 0 };
	struct cp_sandbox now;
	int64_t wait, rev;
	int rc;

	if (cp_query_int(wsi, "wait", 0, 1, 1, &wait) < 0)
		return http_reply_error(wsi, 400, "bad_request", "wait must be 0 or 1");
	/* a lifecycle call queues behind a transition in progress */
	if (cp_wait_transition(cp, s, wsi, sb, &(struct cp_settle){ 0 }, NULL, &rc))
		return rc;
	if (cp_pause_begin(cp, sb, NULL, NULL, &rev, &why) < 0)
		return cp_reply_refusal(wsi, &why);
	if (wait == 0) {
		if (cpdb_sandbox_get(cp->db, sb->id, &now, &err) != 1)
			return http_reply_error(wsi, 500, "internal", "%s", err.msg);
		return http_reply_json(wsi, 202, cp_sandbox_json(cp, &now));
	}
	return feed_wait_ack(cp, s, wsi, &(struct cp_waitspec){
	        .what = CP_WAIT_PAUSE, .worker = sb->worker, .rev = rev,
	        .sbx = sb->id, .gen = sb->generation });
}

/* cp_body_worker: optional "worker" (string or null) of a lifecycle body;
 * -1 on a bad type. */
static int cp_body_worker(json_t *body, const char **worker)
{
	json_t *jw = body ? json_object_get(body, "worker") : NULL;

	*worker = NULL;
	if (jw == NULL || json_is_null(jw))
		return 0;
	*worker = json_string_value(jw);
	return cp_name_ok(*worker) ? 0 : -1;
}

/* cp_resume: POST /v1/sandboxes/{id}/resume {"worker"?,"force"?}. */
static int cp_resume(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                     const struct cp_sandbox *sb, json_t *body)
{
	struct cp_refusal why = { 0 };
	json_t *jf = body ? json_object_get(body, "force") : NULL;
	const char *worker;
	struct cp_resumed r;
	int rc;

	if (cp_body_worker(body, &worker) < 0 ||
	    (jf != NULL && !json_is_boolean(jf)))
		return http_reply_error(wsi, 400, "bad_request", "resume takes "
		                        "\"worker\" (a worker id) and \"force\" "
		                        "(boolean), both optional");
	if (cp_wait_transition(cp, s, wsi, sb, &(struct cp_settle){ 0 }, body, &rc))
		return rc;
	if (cp_resume_begin(cp, sb, worker, jf != NULL && json_is_true(jf), &r,
	                    &why) < 0)
		return cp_reply_refusal(wsi, &why);
	feed_settled(cp, sb->id); /* waiters of an overtaken pause */
	return feed_wait_ack(cp, s, wsi, &(struct cp_waitspec){
	        .what = CP_WAIT_RESUME, .worker = r.worker, .rev = r.rev,
	        .sbx = sb->id, .gen = r.generation, .forced = r.forced,
	        .resumed_from = r.resumed_from });
}

/* cp_migrate: POST /v1/sandboxes/{id}/migrate {"worker"}: the target is
 * checked before anything changes, then pause, then resume there. */
static int cp_migrate(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                      const struct cp_sandbox *sb, json_t *body)
{
	struct cp_refusal why = { 0 };
	const char *worker;
	int64_t rev;
	int rc;

	if (cp_body_worker(body, &worker) < 0 || worker == NULL)
		return http_reply_error(wsi, 400, "bad_request",
		                        "migrate needs \"worker\": a worker id");
	if (cp_wait_transition(cp, s, wsi, sb, &(struct cp_settle){ 0 }, body, &rc))
		return rc;
	if (cp_worker_check(cp, worker, tt_now(), &why) < 0)
		return cp_reply_refusal(wsi, &why);
	if (strcmp(worker, sb->worker) == 0)
		return http_reply_error(wsi, 409, "conflict", "sandbox %s is "
		                        "already on %s", sb->id, worker);
	if (cp_pause_begin(cp, sb, worker, NULL, &rev, &why) < 0)
		return cp_reply_refusal(wsi, &why);
	log_info("sandbox %s: migrate %s -> %s", sb->id, sb->worker, worker);
	return feed_wait_ack(cp, s, wsi, &(struct cp_waitspec){
	        .what = CP_WAIT_MIGRATE, .worker = sb->worker, .rev = rev,
	        .sbx = sb->id, .gen = sb->generation, .target = worker });
}

/* cp_progress: POST /v1/feed/progress (Node): snapshot progress of the
 * pause under rev; a report for anything else is refused (409). */
static int cp_progress(struct cp *cp, struct lws *wsi, json_t *body)
{
	struct tt_err err = { 0 };
	const char *worker = json_string_value(json_object_get(body, "worker"));
	const char *sbx = json_string_value(json_object_get(body, "sandbox"));
	json_t *jrev = json_object_get(body, "rev");
	json_t *jb = json_object_get(body, "bytes");
	json_t *jt = json_object_get(body, "total");
	struct cp_sandbox sb;
	int rc;

	if (!cp_name_ok(worker) || sbx == NULL || !sbx_id_valid(sbx) ||
	    !json_is_integer(jrev) || json_integer_value(jrev) <= 0 ||
	    !json_is_integer(jb) || json_integer_value(jb) < 0 ||
	    (jt != NULL && !json_is_null(jt) &&
	     (!json_is_integer(jt) || json_integer_value(jt) < 0)))
		return http_reply_error(wsi, 400, "bad_request", "progress needs "
		                        "worker, rev > 0, sandbox, bytes >= 0 and "
		                        "total >= 0 or null");
	if (cpdb_worker_seen(cp->db, worker, tt_now(), &err) < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	rc = cpdb_sandbox_get(cp->db, sbx, &sb, &err);
	if (rc < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	if (rc == 1 && strcmp(sb.worker, worker) == 0)
		rc = cpdb_sandbox_progress(cp->db, sbx, json_integer_value(jrev),
		                           json_integer_value(jb),
		                           json_is_integer(jt) ?
		                           json_integer_value(jt) : -1, &err);
	else
		rc = 0;
	if (rc < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	if (rc == 0)
		return http_reply_error(wsi, 409, "conflict", "no pause of %s "
		                        "under rev %lld on %s", sbx,
		                        (long long)json_integer_value(jrev), worker);
	return http_reply_json(wsi, 200, json_pack("{s:b}", "ok", 1));
}

/* cp_snapshot_from_ack: the snapshot a pause ack describes, validated
 * against the key the pause asked for; -1 when absent or malformed. */
static int cp_snapshot_from_ack(const struct cp_sandbox *sb, json_t *res,
                                struct cp_snapshot *sn)
{
	json_t *o = res ? json_object_get(res, "snapshot") : NULL;
	const char *key = json_string_value(json_object_get(o, "key"));
	const char *sum = json_string_value(json_object_get(o, "checksum"));
	json_t *jg = json_object_get(o, "generation");
	json_t *jsz = json_object_get(o, "size");
	char want[CPDB_SNAPKEY_MAX];
	size_t hex;

	snprintf(want, sizeof(want), "%s/%llu", sb->id,
	         (unsigned long long)sb->generation);
	if (!json_is_object(o) || key == NULL || strcmp(key, want) != 0 ||
	    !json_is_integer(jg) ||
	    (uint64_t)json_integer_value(jg) != sb->generation ||
	    !json_is_integer(jsz) || json_integer_value(jsz) < 0 ||
	    sum == NULL || strncmp(sum, "blake2b:", 8) != 0 ||
	    strlen(sum) >= CPDB_CHECKSUM_MAX)
		return -1;
	hex = strlen(sum + 8);
	if (hex == 0 || strspn(sum + 8, "0123456789abcdef") != hex)
		return -1;
	memset(sn, 0, sizeof(*sn));
	snprintf(sn->sandbox, sizeof(sn->sandbox), "%s", sb->id);
	sn->generation = sb->generation;
	snprintf(sn->key, sizeof(sn->key), "%s", key);
	sn->size = json_integer_value(jsz);
	snprintf(sn->checksum, sizeof(sn->checksum), "%s", sum);
	sn->created_at = tt_now();
	return 0;
}

/* cp_migrate_continue: a migrate's pause completed (sbx is paused with
 * a target): the resume on the target begins now, from the pause's ack
 * or the sweep, whether or not its caller still waits (a caller that
 * left, or a cp restart in between, no longer strands it paused on the
 * old worker). A resume that cannot begin leaves it paused, error set. */
static void cp_migrate_continue(struct cp *cp, const char *sbx)
{
	struct tt_err err = { 0 };
	struct cp_refusal why = { 0 };
	struct cp_sandbox sb;
	struct cp_resumed r;
	char msg[CPDB_ERR_MAX];

	if (cpdb_sandbox_get(cp->db, sbx, &sb, &err) != 1 ||
	    strcmp(sb.state, "paused") != 0 || sb.migrate_to[0] == '\0')
		return;
	if (cp_resume_begin(cp, &sb, sb.migrate_to, 0, &r, &why) == 0)
		return;
	snprintf(msg, sizeof(msg), "paused, but not resumed on %s: %.160s", sb.migrate_to,
	         why.msg);
	log_warn("sandbox %s: migrate: %s", sb.id, msg);
	if (cpdb_sandbox_migrate_clear(cp->db, sb.id, sb.generation, msg, &err) < 0)
		log_error("sandbox %s: %s", sb.id, err.msg);
	feed_settled(cp, sb.id);
}

/* cp_snapshot_keep: records sn for sb (from state `from`), pruning what
 * retention no longer keeps (the prune update goes to sb's worker, which
 * made sn). 1/0/-1 as cpdb_snapshot_record. */
static int cp_snapshot_keep(struct cp *cp, const struct cp_sandbox *sb, const char *from,
                            int64_t op_rev, const struct cp_snapshot *sn,
                            struct tt_err *err)
{
	struct cpdb_record r = {
		.from = from, .gen = sb->generation, .op_rev = op_rev,
		.keep_older = cp->keep_snapshots, .worker = sb->worker, .now = tt_now(),
	};
	int64_t prune_rev = 0;
	int rc = cpdb_snapshot_record(cp->db, sb->id, &r, sn, &prune_rev, err);

	if (rc == 1)
		feed_wake(cp, sb->worker); /* the prune */
	return rc;
}

/* cp_pause_late: a complete snapshot for a pause that had already failed
 * (timed out, or its worker went down): the worker published it, then its
 * answer was late or lost and came again. While the sandbox is still at
 * that generation (not resumed since from an older snapshot), it is
 * recorded and the sandbox is paused: a resume restores it, not an older
 * one that lacks writes the execution acknowledged. */
static void cp_pause_late(struct cp *cp, const struct cp_sandbox *sb, json_t *res)
{
	struct tt_err err = { 0 };
	struct cp_snapshot sn;
	int rc;

	if (cp_snapshot_from_ack(sb, res, &sn) < 0)
		return;
	rc = cp_snapshot_keep(cp, sb, "failed", -1, &sn, &err);
	if (rc < 0)
		log_error("sandbox %s: cannot record a late snapshot: %s", sb->id, err.msg);
	if (rc != 1)
		return;
	log_warn("sandbox %s: late pause ack from %s: snapshot %s (%lld bytes) recorded;"
	         " failed -> paused", sb->id, sb->worker, sn.key, (long long)sn.size);
	metrics_inc("tether_cp_late_snapshots_total", NULL);
	feed_settled(cp, sb->id);
}

/* cp_pause_reask: an ack covered the pause of sb (rev) without its
 * result (the worker's node-api restarted between applying and
 * acknowledging it): the worker is asked once more, and answers from the
 * store, instead of the pause failing with its snapshot unrecorded. */
static void cp_pause_reask(struct cp *cp, const struct cp_sandbox *sb, int64_t rev)
{
	struct tt_err err = { 0 };
	int64_t again = 0;

	if (cpdb_pause_reask(cp->db, sb, tt_now(), &again, &err) < 0) {
		log_error("sandbox %s: cannot ask for the pause again: %s", sb->id, err.msg);
		return;
	}
	log_warn("sandbox %s: %s acknowledged pause rev %lld without its result; asking"
	         " again (rev %lld)", sb->id, sb->worker, (long long)rev, (long long)again);
	feed_wake(cp, sb->worker);
}

/* cp_pause_acked: the worker's answer to our pending pause. Only a
 * complete snapshot (ok, key as asked, checksum) is recorded, and what
 * retention no longer keeps is pruned; anything else fails the sandbox
 * and retires the generation. */
static void cp_pause_acked(struct cp *cp, const struct cp_sandbox *sb,
                           int ok, const char *emsg, json_t *res)
{
	struct tt_err err = { 0 };
	struct cp_snapshot sn;
	char why[CPDB_ERR_MAX];
	int rc;

	if (!ok) {
		snprintf(why, sizeof(why), "pause failed on %.40s: %.150s", sb->worker,
		         emsg ? emsg : "no reason given");
		cp_pause_failed(cp, sb, why);
		return;
	}
	if (cp_snapshot_from_ack(sb, res, &sn) < 0) {
		snprintf(why, sizeof(why), "pause on %s acknowledged without a "
		         "valid snapshot", sb->worker);
		cp_pause_failed(cp, sb, why);
		return;
	}
	rc = cp_snapshot_keep(cp, sb, "pausing", sb->op_rev, &sn, &err);
	if (rc < 0)
		log_error("sandbox %s: cannot record pause: %s", sb->id, err.msg);
	else if (rc == 1)
		log_info("sandbox %s: paused gen %llu, snapshot %s (%lld bytes)",
		         sb->id, (unsigned long long)sb->generation, sn.key,
		         (long long)sn.size);
	if (rc == 1 && sb->migrate_to[0] != '\0')
		cp_migrate_continue(cp, sb->id);
}

/* cp_install_acked: the worker's answer to a resume's install. */
static void cp_install_acked(struct cp *cp, const struct cp_sandbox *sb,
                             int ok, const char *emsg)
{
	struct tt_err err = { 0 };
	char why[CPDB_ERR_MAX];

	if (!ok) {
		snprintf(why, sizeof(why), "install failed on %s: %s", sb->worker,
		         emsg ? emsg : "no reason given");
		cp_op_fail(cp, sb, why);
		return;
	}
	if (cpdb_sandbox_cas(cp->db, sb->id, "resuming", sb->generation,
	                     sb->op_rev, "running", NULL, NULL, tt_now(), NULL,
	                     &err) < 0)
		log_error("sandbox %s: cannot record resume: %s", sb->id, err.msg);
}

/* cp_ack_result: the result entry for rev in results, or NULL. */
static json_t *cp_ack_result(json_t *results, int64_t rev)
{
	size_t i;
	json_t *r;

	json_array_foreach(results, i, r) {
		if (json_integer_value(json_object_get(r, "rev")) == rev)
			return r;
	}
	return NULL;
}

/* cp_ack_apply: state changes for one acknowledged update: install ok ->
 * running, install failed -> failed, destroy ok -> deleted, pause ok with
 * a snapshot -> paused, pause failed -> failed (+ retire). Lifecycle acks
 * count only for the operation pending now (op_rev). An update the worker
 * acknowledged without a result entry counts as ok. */
static int cp_ack_apply(struct cp *cp, const char *worker, json_t *up,
                        json_t *res, struct tt_err *err)
{
	const char *kind = json_string_value(json_object_get(up, "kind"));
	const char *sbx = json_string_value(json_object_get(up, "sandbox"));
	json_t *okv = res ? json_object_get(res, "ok") : NULL;
	int ok = okv == NULL || json_is_true(okv);
	const char *emsg = res ? json_string_value(json_object_get(res, "error"))
	                       : NULL;
	int64_t rev = json_integer_value(json_object_get(up, "rev"));
	uint64_t gen = (uint64_t)json_integer_value(json_object_get(up,
	                                                            "generation"));
	struct cp_sandbox sb;

	if (kind == NULL || sbx == NULL)
		return 0;
	switch (cpdb_sandbox_get(cp->db, sbx, &sb, err)) {
	case 1:
		break;
	case 0:
		return 0; /* gone since */
	default:
		return -1;
	}
	if (strcmp(sb.worker, worker) != 0)
		return 0;
	if (strcmp(kind, "install") == 0 && res == NULL && gen == sb.generation &&
	    !json_is_true(json_object_get(up, "again")) &&
	    (strcmp(sb.state, "starting") == 0 ||
	     (strcmp(sb.state, "resuming") == 0 && sb.op_rev == rev))) {
		/* covered without its result (node-api restarted between the
		 * apply and the ack): the outcome is not known, ask again */
		int64_t again = 0;

		if (cpdb_install_reask(cp->db, &sb, up, tt_now(), &again, err) < 0)
			return -1;
		log_warn("sandbox %s: %s acknowledged install rev %lld without its result;"
		         " asking again (rev %lld)", sbx, worker, (long long)rev,
		         (long long)again);
		feed_wake(cp, worker);
		return 0;
	}
	if (strcmp(kind, "install") == 0 && strcmp(sb.state, "starting") == 0 &&
	    gen == sb.generation) {
		if (!ok)
			log_warn("sandbox %s: install failed on %s: %s", sbx, worker,
			         emsg ? emsg : "?");
		return cpdb_sandbox_set_state(cp->db, sbx, ok ? "running" : "failed",
		                              ok ? NULL : (emsg ? emsg : "install failed"),
		                              err) < 0 ? -1 : 0;
	} else if (strcmp(kind, "install") == 0 &&
	           strcmp(sb.state, "resuming") == 0 && gen == sb.generation &&
	           sb.op_rev == rev) {
		cp_install_acked(cp, &sb, ok, emsg);
	} else if (strcmp(kind, "pause") == 0 && gen == sb.generation && res == NULL &&
	           !json_is_true(json_object_get(up, "again")) &&
	           ((strcmp(sb.state, "pausing") == 0 && sb.op_rev == rev) ||
	            strcmp(sb.state, "failed") == 0)) {
		cp_pause_reask(cp, &sb, rev);
	} else if (strcmp(kind, "pause") == 0 &&
	           strcmp(sb.state, "pausing") == 0 && gen == sb.generation &&
	           sb.op_rev == rev) {
		cp_pause_acked(cp, &sb, ok, emsg, res);
	} else if (strcmp(kind, "pause") == 0 && strcmp(sb.state, "failed") == 0 &&
	           gen == sb.generation && ok && res != NULL) {
		cp_pause_late(cp, &sb, res);
	} else if (strcmp(kind, "destroy") == 0 &&
	           strcmp(sb.state, "deleting") == 0) {
		return cpdb_sandbox_set_state(cp->db, sbx, ok ? "deleted" : "deleting",
		                              ok ? NULL : (emsg ? emsg : "destroy failed"),
		                              err) < 0 ? -1 : 0;
	}
	return 0;
}

/* cp_ack_plain: whether cp_ack_apply of up is at most one plain state
 * write (install from starting, destroy from deleting, or nothing): such
 * acks are applied in one transaction with the worker's ack stamp. The
 * lifecycle outcomes (resume, pause) have their own transactions and
 * follow-ups, so they keep the one-by-one path. */
static int cp_ack_plain(struct cp *cp, const char *worker, json_t *up,
                        json_t *res)
{
	struct tt_err err = { 0 };
	const char *kind = json_string_value(json_object_get(up, "kind"));
	const char *sbx = json_string_value(json_object_get(up, "sandbox"));
	struct cp_sandbox sb;

	if (kind == NULL || sbx == NULL ||
	    cpdb_sandbox_get(cp->db, sbx, &sb, &err) != 1 ||
	    strcmp(sb.worker, worker) != 0)
		return 1; /* nothing to apply */
	if (strcmp(kind, "install") == 0)
		return res != NULL && strcmp(sb.state, "resuming") != 0;
	return strcmp(kind, "pause") != 0;
}

/* cp_ack_refusals: updates the worker's manager refused (signature, order:
 * lib/feedsig.h) are logged and counted; they were not applied and the
 * worker polls them again. */
static void cp_ack_refusals(const char *worker, json_t *results)
{
	size_t i;
	json_t *r;

	json_array_foreach(results, i, r) {
		if (!json_is_string(json_object_get(r, "refused")))
			continue;
		metrics_inc("tether_cp_feed_refused_total", NULL);
		log_error("worker %s refused feed update rev %" JSON_INTEGER_FORMAT ": %.200s",
		          worker, json_integer_value(json_object_get(r, "rev")),
		          json_string_value(json_object_get(r, "error")) ?: "?");
	}
}

/* cp_ack: POST /v1/feed/ack (Node). */
static int cp_ack(struct cp *cp, struct lws *wsi, json_t *body)
{
	struct tt_err err = { 0 };
	const char *worker = json_string_value(json_object_get(body, "worker"));
	json_t *jrev = json_object_get(body, "rev");
	json_t *results = json_object_get(body, "results");
	struct cp_worker w;
	json_t *ups, *up;
	int64_t rev;
	size_t i;
	int rc, batch;

	if (!cp_name_ok(worker) || !json_is_integer(jrev) ||
	    json_integer_value(jrev) < 0 ||
	    (results != NULL && !json_is_array(results)))
		return http_reply_error(wsi, 400, "bad_request",
		        "ack needs worker, rev >= 0 and a results list");
	rev = json_integer_value(jrev);
	rc = cpdb_worker_get(cp->db, worker, &w, &err);
	if (rc > 0)
		cp_ack_refusals(worker, results);
	if (rc <= 0)
		return rc < 0 ? http_reply_error(wsi, 500, "internal", "%s", err.msg)
		              : http_reply_error(wsi, 404, "not_found",
		                                 "worker %s is not registered",
		                                 worker);
	if (cp_ack_beyond(wsi, &w, rev, &rc))
		return rc;
	/* Apply the outcome of every update newly covered by this ack. */
	ups = rev > w.acked_rev ? cpdb_feed_since(cp->db, worker, w.acked_rev,
	                                          100000, &err) : json_array();
	if (ups == NULL)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	/* The common case (a create's install, a destroy): every state write
	 * and the ack stamp in one commit instead of one each. */
	batch = 1;
	json_array_foreach(ups, i, up) {
		if (json_integer_value(json_object_get(up, "rev")) > rev)
			break;
		if (!cp_ack_plain(cp, worker, up,
		                  cp_ack_result(results, json_integer_value(json_object_get(up, "rev")))))
			batch = 0;
	}
	if (batch && cpdb_batch_begin(cp->db, &err) < 0) {
		json_decref(ups);
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	}
	rc = 0;
	json_array_foreach(ups, i, up) {
		int64_t r = json_integer_value(json_object_get(up, "rev"));

		if (r > rev)
			break;
		/* An outcome that cannot be written: the ack is not taken
		 * (acked_rev stays), so the worker sends it again; applying
		 * is idempotent (each step checks the state it moves from). */
		if ((rc = cp_ack_apply(cp, worker, up, cp_ack_result(results, r), &err)) < 0)
			break;
		cp_events_check(cp, json_string_value(json_object_get(up, "sandbox")));
	}
	json_decref(ups);
	if (rc == 0)
		rc = cpdb_worker_acked_seen(cp->db, worker, rev, tt_now(), &err);
	if (batch)
		rc = cpdb_batch_end(cp->db, rc, &err);
	if (rc < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	feed_acked(cp, worker, rev);
	return http_reply_json(wsi, 200, json_pack("{s:b}", "ok", 1));
}

static int cp_dispatch_api(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                           json_t *body);

/* cp_dispatch: routes a complete request (body may be NULL). */
int cp_dispatch(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                json_t *body)
{
	const char *p = s->path, *m = s->method;
	int rc;

	if (strcmp(p, "/healthz") == 0)
		return http_reply_json(wsi, 200, json_pack("{s:b}", "ok", 1));
	if (strcmp(p, "/metrics") == 0) {
		cp_events_gauges(cp); /* sandboxes and workers by state, now */
		_cleanup_free_ char *txt = metrics_render();

		if (txt == NULL)
			return http_reply_error(wsi, 500, "internal", "out of memory");
		return http_reply(wsi, 200, "text/plain; version=0.0.4", txt,
		                  strlen(txt));
	}
	if (strncmp(p, "/v1/workers/register", 21) == 0 ||
	    strncmp(p, "/v1/feed", 8) == 0) {
		if (!cp_worker_auth(cp, wsi, p, body, &rc))
			return rc;
		if (strcmp(p, "/v1/workers/register") == 0 && !strcmp(m, "POST"))
			return cp_register(cp, wsi, body);
		if (strcmp(p, "/v1/feed") == 0 && !strcmp(m, "GET"))
			return cp_feed(cp, s, wsi);
		if (strcmp(p, "/v1/feed/ack") == 0 && !strcmp(m, "POST"))
			return cp_ack(cp, wsi, body);
		if (strcmp(p, "/v1/feed/lost") == 0 && !strcmp(m, "POST"))
			return body ? cp_lost(cp, wsi, body)
			            : http_reply_error(wsi, 400, "bad_request",
			                               "JSON body expected");
		if (strcmp(p, "/v1/feed/drain") == 0 && !strcmp(m, "POST"))
			return body ? cp_drain(cp, wsi, body)
			            : http_reply_error(wsi, 400, "bad_request",
			                               "JSON body expected");
		if (strcmp(p, "/v1/feed/progress") == 0 && !strcmp(m, "POST"))
			return body ? cp_progress(cp, wsi, body)
			            : http_reply_error(wsi, 400, "bad_request",
			                               "JSON body expected");
		return http_reply_error(wsi, 404, "not_found", "no route %s %s", m,
		                        p);
	}
	if (!cp_auth_bearer(cp, wsi, s)) {
		metrics_inc("tether_cp_auth_refused_total", "kind=\"bearer\"");
		return http_reply_error(wsi, 401, "unauthorized",
		                        "a valid API key is required");
	}
	/* a lifecycle call repeated under its Idempotency-Key (replica.c) */
	if (cp_idem_begin(cp, s, wsi, &rc))
		return rc;
	rc = cp_dispatch_api(cp, s, wsi, body);
	cpdb_idem_disarm(cp->db);
	return rc;
}

/* cp_dispatch_api: the API key's routes (after authentication). */
static int cp_dispatch_api(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                           json_t *body)
{
	const char *p = s->path, *m = s->method;
	char id[TT_SBX_ID_LEN + 2];
	const char *rest;
	struct cp_sandbox sb;
	int replied, rc;
	size_t n;

	if (strcmp(p, "/v1/workers") == 0 && !strcmp(m, "GET"))
		return cp_workers(cp, wsi);
	if (strcmp(p, "/v1/keys") == 0 && !strcmp(m, "GET"))
		return cp_keys(cp, wsi);
	if (strcmp(p, "/v1/events") == 0 && !strcmp(m, "GET"))
		return cp_events_get(wsi);
	if (strcmp(p, "/v1/admin/rotate-keys") == 0 && !strcmp(m, "POST"))
		return cp_rotate_start(cp, s, wsi);
	if (strcmp(p, "/v1/admin/keys") == 0 && !strcmp(m, "GET"))
		return cp_rotate_status(cp, s, wsi);
	if (strcmp(p, "/v1/sandboxes") == 0) {
		if (!strcmp(m, "POST"))
			return cp_create(cp, s, wsi, body);
		if (!strcmp(m, "GET"))
			return cp_list(cp, wsi);
	}
	if (strncmp(p, "/v1/sandboxes/", 14) == 0) {
		rest = strchr(p + 14, '/');
		n = rest ? (size_t)(rest - (p + 14)) : strlen(p + 14);
		if (n >= sizeof(id))
			return http_reply_error(wsi, 404, "not_found", "no sandbox");
		memcpy(id, p + 14, n);
		id[n] = '\0';
		rc = cp_lookup(cp, wsi, id, &sb, &replied);
		if (replied)
			return rc;
		if (rest == NULL && !strcmp(m, "GET"))
			return http_reply_json(wsi, 200, cp_sandbox_json(cp, &sb));
		if (rest == NULL && !strcmp(m, "DELETE"))
			return cp_delete(cp, s, wsi, &sb);
		if (rest != NULL && strcmp(rest, "/capabilities") == 0 &&
		    !strcmp(m, "POST"))
			return cp_capability(cp, s, wsi, &sb, body);
		if (rest != NULL && strcmp(rest, "/pause") == 0 && !strcmp(m, "POST"))
			return cp_pause(cp, s, wsi, &sb);
		if (rest != NULL && strcmp(rest, "/resume") == 0 &&
		    !strcmp(m, "POST"))
			return cp_resume(cp, s, wsi, &sb, body);
		if (rest != NULL && strcmp(rest, "/migrate") == 0 &&
		    !strcmp(m, "POST"))
			return cp_migrate(cp, s, wsi, &sb, body);
	}
	return http_reply_error(wsi, 404, "not_found", "no route %s %s", m, p);
}

/* cp_method: the request method from the token lws filled in. */
static const char *cp_method(struct lws *wsi)
{
	if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI) > 0)
		return "GET";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0)
		return "POST";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI) > 0)
		return "DELETE";
	if (lws_hdr_total_length(wsi, WSI_TOKEN_PUT_URI) > 0)
		return "PUT";
	return "OTHER";
}

/* cp_complete: body done (or none): parse, route, count. */
static int cp_complete(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                       int has_body)
{
	struct tt_err err = { 0 };
	uint64_t t0 = cp_now_us();
	json_t *body = NULL;
	int rc;

	if (s->too_large) {
		http_body_free(&s->body);
		return http_reply_error(wsi, 413, "too_large",
		                        "request body over %u bytes",
		                        HTTP_BODY_MAX_DEFAULT);
	}
	if (s->routed) /* lws may report a 0-byte body after we answered */
		return 0;
	s->routed = 1;
	if (has_body && s->body.len == 0) /* POST without a body */
		has_body = 0;
	if (has_body) {
		body = http_body_json(&s->body, &err);
		http_body_free(&s->body);
		if (body == NULL) {
			metrics_inc("tether_cp_bad_requests_total", NULL);
			return http_reply_error(wsi, 400, "bad_request", "%s", err.msg);
		}
	}
	rc = cp_dispatch(cp, s, wsi, body);
	json_decref(body);
	metrics_inc("tether_cp_requests_total", NULL);
	metrics_observe_us("tether_cp_request_seconds", NULL, cp_now_us() - t0);
	return rc;
}

/* cp_http_cb: lws protocol callback of the control plane API. */
static int cp_http_cb(struct lws *wsi, enum lws_callback_reasons reason,
                      void *user, void *in, size_t len)
{
	struct cp_sess *s = user;
	struct cp *cp;
	struct tt_err err = { 0 };
	long long clen;

	switch (reason) {
	case LWS_CALLBACK_HTTP:
		http_request_started(wsi); /* a long-poll is not cut at 30 s */
		cp = cp_of(wsi);
		http_body_free(&s->body);
		s->body.max = HTTP_BODY_MAX_DEFAULT;
		s->too_large = 0;
		s->routed = 0;
		s->caller[0] = '\0';
		s->settle_deadline = 0;
		s->settle_over = 0;
		snprintf(s->path, sizeof(s->path), "%s", (const char *)in);
		snprintf(s->method, sizeof(s->method), "%s", cp_method(wsi));
		switch (http_body_framing(wsi, &clen)) {
		case HTTP_BODY_UNSIZED:
			return http_reply_error(wsi, 411, "length_required",
			                        "request bodies need a Content-Length");
		case HTTP_BODY_BAD:
			return http_reply_error(wsi, 400, "bad_request",
			                        "a request needs one valid Content-Length");
		default:
			break;
		}
		if (strcmp(s->method, "POST") == 0 || strcmp(s->method, "PUT") == 0) {
			if (clen > (long long)HTTP_BODY_MAX_DEFAULT) {
				s->too_large = 1;
				return cp_complete(cp, s, wsi, 1);
			}
			if (clen > 0)
				return 0; /* body callbacks follow */
		}
		return cp_complete(cp, s, wsi, 0);
	case LWS_CALLBACK_HTTP_BODY:
		/* lws reports a 0-byte POST as one (NULL, 0) body chunk */
		if (!s->too_large && len > 0 &&
		    http_body_append(&s->body, in, len, &err) < 0)
			s->too_large = 1;
		return 0;
	case LWS_CALLBACK_HTTP_BODY_COMPLETION:
		return cp_complete(cp_of(wsi), s, wsi, 1);
	case LWS_CALLBACK_HTTP_WRITEABLE:
		return feed_writable(cp_of(wsi), s, wsi);
	case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
	case LWS_CALLBACK_CLOSED_HTTP:
		/* s is NULL when lws closes before a session existed (headers
		 * past its buffer, from anyone, unauthenticated); both may
		 * come for one session, so the release is idempotent. */
		if (s != NULL) {
			feed_closed(cp_of(wsi), s);
			http_body_free(&s->body);
		}
		return 0;
	default:
		break;
	}
	/* upgrades refused, bounds, HTTP/2 (lib/http.h) */
	return http_callback_default(wsi, reason, user, in, len);
}

static const struct lws_protocols cp_protocols[] = {
	{ "http", cp_http_cb, sizeof(struct cp_sess), 0, 0, NULL, 0 },
	{ NULL, NULL, 0, 0, 0, NULL, 0 }
};

/* ---- bootstrap ------------------------------------------------------- */

/* cp_write_secret: writes a fresh random secret (text) to path, 0600. */
static int cp_write_secret(const char *path, const char *prefix, char *out,
                           size_t cap, struct tt_err *err)
{
	uint8_t rnd[32];
	char hex[65];
	_cleanup_close_ int fd = -1;
	int n;

	randombytes_buf(rnd, sizeof(rnd));
	sodium_bin2hex(hex, sizeof(hex), rnd, sizeof(rnd));
	sodium_memzero(rnd, sizeof(rnd));
	n = snprintf(out, cap, "%s%s", prefix, hex);
	sodium_memzero(hex, sizeof(hex));
	if (n < 0 || (size_t)n >= cap)
		return tt_err_set(err, TT_ERR_INVALID, "secret buffer too small");
	unlink(path); /* a stale file from an older database */
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot create %s", path);
	if (dprintf(fd, "%s\n", out) < 0 || fsync(fd) < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot write %s", path);
	return 0;
}

/* cp_bootstrap: admin key (only while none exists). Workers have
 * credentials of their own (tetherd worker add); a shared node token
 * left by an older cp is removed. */
static int cp_bootstrap(struct cp *cp, const char *dir, struct tt_err *err)
{
	char path[PATH_MAX], key[128];
	int64_t n;

	if (cpdb_apikey_count(cp->db, &n, err) < 0)
		return -1;
	if (n == 0) {
		snprintf(path, sizeof(path), "%s/admin.key", dir);
		if (cp_write_secret(path, "ttk_", key, sizeof(key), err) < 0)
			return -1;
		if (cpdb_apikey_add(cp->db, key, "admin", tt_now(), err) < 0)
			return -1;
		sodium_memzero(key, sizeof(key));
		fprintf(stderr, "admin API key written to %s\n", path);
	}
	snprintf(path, sizeof(path), "%s/node.token", dir);
	if (unlink(path) == 0)
		log_warn("removed %s: the shared node token is gone; provision each"
		         " worker with tetherd worker add", path);
	return 0;
}

/* cp_publish_keys: appends a keys update when the signer's key is not the
 * one in the newest published bundle. */
static int cp_publish_keys(struct cp *cp, struct tt_err *err)
{
	char pub[PASERK_K4_PUBLIC_LEN + 1], kid[PASERK_K4_PID_LEN + 1];
	json_t *last, *keys, *body;
	const char *last_kid;
	int64_t now = tt_now(), rev;
	int rc;

	if (cp_signer_public(&cp->signer, pub, kid, err) < 0)
		return -1;
	last = cpdb_feed_last_body(cp->db, "keys", err);
	if (last == NULL && err->code != TT_OK)
		return -1;
	keys = json_object_get(last, "keys");
	/* The signing key in the bundle and still open: published (beside
	 * keys a rotation retired, which rotate.c drops once expired). */
	for (size_t i = 0; i < json_array_size(keys); i++) {
		json_t *k = json_array_get(keys, i);

		last_kid = json_string_value(json_object_get(k, "kid"));
		if (last_kid && strcmp(last_kid, kid) == 0 &&
		    json_is_null(json_object_get(k, "not_after"))) {
			if (json_array_size(keys) > 1)
				cp->rot.drop_at = now + TT_CAP_LIFETIME + TT_CAP_SKEW + 1;
			json_decref(last);
			log_info("signing key %s already published", kid);
			return 0;
		}
	}
	/* replicas sign with one key: another's open key here means this
	 * one was given other key files (its bundle would shut them out) */
	for (size_t i = 0; cpdb_shared(cp->db) && i < json_array_size(keys); i++) {
		json_t *k = json_array_get(keys, i);

		if (json_is_null(json_object_get(k, "not_after"))) {
			rc = tt_err_set(err, TT_ERR_INVALID, "the database's replicas sign with"
			                " %s, this one with %s (its --state signer.key): every"
			                " replica needs the same signer.key and feed.key",
			                json_string_value(json_object_get(k, "kid")), kid);
			json_decref(last);
			return rc;
		}
	}
	json_decref(last);
	body = json_pack("{s:[{s:s,s:s,s:o,s:n}]}", "keys", "kid", kid,
	                 "public", pub, "not_before", cp_time(now - 5),
	                 "not_after");
	if (body == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	rc = cpdb_feed_append(cp->db, "keys", NULL, body, now, &rev, err);
	json_decref(body);
	if (rc == 0)
		log_info("published signing key %s at rev %lld", kid,
		         (long long)rev);
	return rc;
}

/* cp_on_signal: orderly shutdown on SIGINT/SIGTERM. */
static void cp_on_signal(uv_signal_t *h, int sig)
{
	log_info("signal %d: shutting down", sig);
	uv_stop(h->loop);
}

/* cp_parse_listen: "HOST:PORT". */
static int cp_parse_listen(const char *s, char *host, size_t cap, int *port)
{
	const char *c = strrchr(s, ':');
	char *end;
	long p;

	if (c == NULL || (size_t)(c - s) >= cap || c == s)
		return -1;
	memcpy(host, s, (size_t)(c - s));
	host[c - s] = '\0';
	p = strtol(c + 1, &end, 10);
	if (*end != '\0' || p < 0 || p > 65535)
		return -1;
	*port = (int)p;
	return 0;
}

/* cp_close_walk: closes whatever handles remain at exit. */
static void cp_close_walk(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

#define CP_USAGE "usage: tetherd cp --state DIR [--listen 127.0.0.1:PORT]" \
                 " [--worker-timeout SECONDS] [--keep-snapshots N]" \
                 " [--default-substrate ns|microvm] [--db postgresql://…]\n"

/* cp_replicas_agree: on a store replicas share, this one holds the keys
 * the others do (docs/ARCHITECTURE.md "Control-plane replicas"): the feed
 * key every worker pinned, and the signing key of the newest bundle. */
static int cp_replicas_agree(struct cp *cp, struct tt_err *err)
{
	char have[PASERK_K4_PUBLIC_LEN + 1];

	if (!cpdb_shared(cp->db))
		return 0;
	if (cpdb_meta_claim(cp->db, "feed_pub", cp->signer.feed_pub, have,
	                    sizeof(have), err) < 0)
		return -1;
	if (strcmp(have, cp->signer.feed_pub) != 0)
		return tt_err_set(err, TT_ERR_INVALID, "the database's replicas sign the feed"
		                  " with %s, this one with %s (its --state feed.key): every"
		                  " replica needs the same signer.key and feed.key", have,
		                  cp->signer.feed_pub);
	return 0;
}

/* cp_main: "tetherd cp --state DIR --listen HOST:PORT
 * [--worker-timeout S] [--keep-snapshots N] [--db URL]" (S: seconds
 * without a feed poll before a worker counts as down; default 60. N:
 * complete snapshots kept per sandbox besides the newest; default 1. URL:
 * a PostgreSQL database several replicas share, else DIR/cp.db). */
int cp_main(int argc, char **argv)
{
	struct cp *cp = &cp_global;
	struct tt_err err = { 0 };
	const char *state = NULL, *listen = "127.0.0.1:7700", *dburl = NULL;
	char host[64], path[PATH_MAX];
	uv_signal_t sigint, sigterm;
	uv_loop_t loop;
	int port, rc = 1;

	tt_log_init("cp", TT_LOG_INFO);
	cp->worker_timeout = CP_WORKER_UP_SECS;
	cp->keep_snapshots = CPDB_KEEP_DEFAULT;
	snprintf(cp->default_substrate, sizeof(cp->default_substrate), "ns");
	for (int i = 1; i < argc; i++) {
		char *end;

		if (strcmp(argv[i], "--state") == 0 && i + 1 < argc)
			state = argv[++i];
		else if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc)
			listen = argv[++i];
		else if (strcmp(argv[i], "--db") == 0 && i + 1 < argc)
			dburl = argv[++i];
		else if (strcmp(argv[i], "--worker-timeout") == 0 && i + 1 < argc) {
			errno = 0;
			cp->worker_timeout = strtoll(argv[++i], &end, 10);
			if (errno != 0 || *end != '\0' || end == argv[i] ||
			    cp->worker_timeout < 1 || cp->worker_timeout > 86400) {
				fprintf(stderr, "--worker-timeout: 1..86400 seconds\n");
				return 2;
			}
		} else if (strcmp(argv[i], "--default-substrate") == 0 && i + 1 < argc) {
			const char *v = argv[++i];

			if (strcmp(v, "ns") != 0 && strcmp(v, "microvm") != 0) {
				fprintf(stderr, "--default-substrate: ns or microvm\n");
				return 2;
			}
			snprintf(cp->default_substrate, sizeof(cp->default_substrate), "%s", v);
		} else if (strcmp(argv[i], "--keep-snapshots") == 0 && i + 1 < argc) {
			long long k;

			errno = 0;
			k = strtoll(argv[++i], &end, 10);
			if (errno != 0 || *end != '\0' || end == argv[i] || k < 0 ||
			    k > CPDB_KEEP_MAX) {
				fprintf(stderr, "--keep-snapshots: 0..%d older snapshots\n",
				        CPDB_KEEP_MAX);
				return 2;
			}
			cp->keep_snapshots = (unsigned)k;
		} else {
			fprintf(stderr, CP_USAGE);
			return 2;
		}
	}
	if (state == NULL || cp_parse_listen(listen, host, sizeof(host),
	                                     &port) < 0 ||
	    (dburl != NULL && !cpdb_is_url(dburl))) {
		fprintf(stderr, CP_USAGE);
		return 2;
	}
	if (sodium_init() < 0) {
		log_error("sodium_init failed");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	if (mkdir(state, 0700) < 0 && errno != EEXIST) {
		log_error("cannot create %s: %s", state, strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "%s/cp.db", state);
	cp->listen_fd = -1;
	cp->db = cpdb_open(dburl != NULL ? dburl : path, &err);
	if (cp->db == NULL || cp_bootstrap(cp, state, &err) < 0) {
		log_error("%s", err.msg);
		cpdb_close(cp->db);
		return 1;
	}
	snprintf(path, sizeof(path), "%s/signer.key", state);
	if (cp_signer_spawn(path, &cp->signer, &err) < 0 ||
	    cp_signer_public(&cp->signer, (char[PASERK_K4_PUBLIC_LEN + 1]){ 0 },
	                     (char[PASERK_K4_PID_LEN + 1]){ 0 }, &err) < 0 ||
	    cp_replicas_agree(cp, &err) < 0 || cp_publish_keys(cp, &err) < 0) {
		log_error("signer: %s", err.msg);
		goto out_db;
	}
	uv_loop_init(&loop);
	cp->loop = &loop;
	cp->ctx = http_server_new(&loop, host, port, cp_protocols, cp, &err);
	if (cp->ctx == NULL) {
		log_error("%s", err.msg);
		goto out_db; /* lws may still own handles on loop: leave it */
	}
	uv_signal_init(&loop, &sigint);
	uv_signal_start(&sigint, cp_on_signal, SIGINT);
	uv_signal_init(&loop, &sigterm);
	uv_signal_start(&sigterm, cp_on_signal, SIGTERM);
	uv_timer_init(&loop, &cp->sweep);
	cp->sweep.data = cp;
	uv_timer_start(&cp->sweep, cp_sweep, CP_SWEEP_MS, CP_SWEEP_MS);
	cp_replica_listen(cp);
	log_info("listening on %s:%d, state %s, store %s, worker timeout %lld s, keeping"
	         " %u older snapshot(s)", host, port, state, cpdb_backend(cp->db),
	         (long long)cp->worker_timeout, cp->keep_snapshots);
	uv_run(&loop, UV_RUN_DEFAULT);
	rc = 0;
	feed_shutdown(cp);
	cp_replica_close(cp);
	http_server_free(cp->ctx);
	uv_close((uv_handle_t *)&sigint, NULL);
	uv_close((uv_handle_t *)&sigterm, NULL);
	uv_close((uv_handle_t *)&cp->sweep, NULL);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_walk(&loop, cp_close_walk, NULL);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_loop_close(&loop);
out_db:
	cp_signer_stop(&cp->signer);
	cpdb_close(cp->db);
	return rc;
}

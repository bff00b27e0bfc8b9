/* What brings sandboxes back after restarts and crashes (SPEC §7: a daemon
 * that dies is restarted and picks up its state; a guest agent or bridge
 * that dies is re-activated; nothing acknowledged is lost):
 *
 * - a worker that lost an execution it still holds the layer of (its guest
 *   agent or bridge died, or the worker restarted and found its processes
 *   gone) reports it (POST /v1/feed/lost); the cp relaunches it on that
 *   worker, from that layer: the same generation with the next activation
 *   when the worker re-activates in place, else the next generation. The
 *   note on the sandbox says so (files kept, processes not). A sandbox lost
 *   again and again is failed instead (CP_RELAUNCH_MAX in
 *   CPDB_RELAUNCH_WINDOW s): no crash loop.
 * - a worker that stops in order asks to be drained (POST /v1/feed/drain):
 *   each of its running sandboxes is paused (a complete snapshot), marked
 *   to resume there; the sweep resumes them once that worker is up again.
 *
 * Both are compare-and-swaps on the sandbox's (state, generation): a late
 * or repeated report of an execution already replaced changes nothing. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp/cp.h"
#include "log.h"
#include "metrics.h"

#define CP_RELAUNCH_MAX 5

/* lost_reason: the worker's one-line reason, bounded and printable. */
static void lost_reason(const char *in, char *out, size_t cap)
{
	size_t n = 0;

	for (; in != NULL && *in != '\0' && n + 1 < cap; in++)
		out[n++] = (*in >= 0x20 && *in < 0x7f) ? *in : '?';
	out[n] = '\0';
	if (n == 0)
		snprintf(out, cap, "its processes were lost");
}

/* cp_relaunch: the relaunch CAS (sb's state and generation) -> resuming on
 * the same worker, without a snapshot. 1 begun, 0 moved on meanwhile. */
static int cp_relaunch(struct cp *cp, const struct cp_sandbox *sb,
                       int reactivate, const char *reason, struct tt_err *err)
{
	char note[CPDB_ERR_MAX];
	uint64_t gen = 0;
	int64_t rev = 0;
	int rc;

	if (reactivate)
		snprintf(note, sizeof(note), "re-activated in place as activation %"
		         PRIu32 " of generation %" PRIu64 " on %.40s (%.90s): files "
		         "kept, processes were not", sb->activation + 1,
		         sb->generation, sb->worker, reason);
	else
		snprintf(note, sizeof(note), "relaunched as generation %" PRIu64
		         " on %.40s from its own layer (%.90s): files kept, processes "
		         "were not", sb->generation + 1, sb->worker, reason);
	rc = cpdb_sandbox_resume(cp->db, sb->id, &(struct cpdb_resume){
	        .from = sb->state, .gen = sb->generation, .worker = sb->worker,
	        .snapshot_key = NULL, .reactivate = reactivate, .note = note },
	        tt_now(), &gen, &rev, NULL, err);
	if (rc <= 0)
		return rc;
	log_warn("sandbox %s: %s (rev %lld)", sb->id, note, (long long)rev);
	metrics_inc("tether_cp_relaunches_total", reactivate ? "kind=\"activation\""
	                                                      : "kind=\"generation\"");
	feed_wake(cp, sb->worker);
	feed_settled(cp, sb->id);
	return 1;
}

static bool cp_relaunch_bounded(const struct cp_sandbox *sb);

/* cp_lost: {"worker","sandbox","generation","activation","reason",
 * "reactivate"}; only the execution the cp runs there now counts. */
int cp_lost(struct cp *cp, struct lws *wsi, json_t *body)
{
	struct tt_err err = { 0 };
	const char *worker = json_string_value(json_object_get(body, "worker"));
	const char *sbx = json_string_value(json_object_get(body, "sandbox"));
	json_t *jg = json_object_get(body, "generation");
	json_t *ja = json_object_get(body, "activation");
	json_t *jr = json_object_get(body, "reactivate");
	char reason[160], why[CPDB_ERR_MAX];
	struct cp_sandbox sb;
	int64_t rrev = 0;
	int rc;

	if (!cp_name_ok(worker) || sbx == NULL || !sbx_id_valid(sbx) ||
	    !json_is_integer(jg) || json_integer_value(jg) < 1 ||
	    !json_is_integer(ja) || json_integer_value(ja) < 1 ||
	    json_integer_value(ja) > UINT32_MAX || (jr != NULL && !json_is_boolean(jr)))
		return http_reply_error(wsi, 400, "bad_request", "lost needs worker, "
		                        "sandbox, generation >= 1, activation >= 1 "
		                        "and reactivate (boolean, optional)");
	lost_reason(json_string_value(json_object_get(body, "reason")), reason,
	            sizeof(reason));
	if (cpdb_worker_seen(cp->db, worker, tt_now(), &err) < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	rc = cpdb_sandbox_get(cp->db, sbx, &sb, &err);
	if (rc < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	if (rc == 0 || strcmp(sb.state, "running") != 0 ||
	    strcmp(sb.worker, worker) != 0 ||
	    sb.generation != (uint64_t)json_integer_value(jg) ||
	    sb.activation != (uint32_t)json_integer_value(ja))
		/* replaced, moving, or never this worker's: nothing to do (a
		 * pause or install in flight fails on its own) */
		return http_reply_json(wsi, 200, json_pack("{s:b,s:b}", "ok", 1,
		                                           "relaunched", 0));
	if (cp_relaunch_bounded(&sb)) {
		snprintf(why, sizeof(why), "lost %lld times within %d s (last: %.100s); "
		         "not relaunched again: resume it to try once more",
		         (long long)sb.relaunches + 1, CPDB_RELAUNCH_WINDOW, reason);
		if (cpdb_sandbox_cas(cp->db, sb.id, "running", sb.generation, -1,
		                     "failed", why, sb.worker, tt_now(), &rrev, &err) < 0)
			return http_reply_error(wsi, 500, "internal", "%s", err.msg);
		log_warn("sandbox %s: %s", sb.id, why);
		metrics_inc("tether_cp_lifecycle_failed_total", NULL);
		feed_wake(cp, sb.worker);
		feed_settled(cp, sb.id);
		return http_reply_json(wsi, 200, json_pack("{s:b,s:b}", "ok", 1,
		                                           "relaunched", 0));
	}
	rc = cp_relaunch(cp, &sb, jr != NULL && json_is_true(jr), reason, &err);
	if (rc < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	return http_reply_json(wsi, 200, json_pack("{s:b,s:b}", "ok", 1,
	                                           "relaunched", rc == 1));
}

/* What cp_drain_one collects (it must not write while listing). */
struct cp_drain_scan {
	const char *worker;
	int64_t since;           /* the drain began (0: now) */
	struct cp_sandboxes run; /* running there: to pause */
	int pending;
};

/* cp_drain_one: the worker's running sandboxes, and its pauses pending. */
static void cp_drain_one(const struct cp_sandbox *sb, void *arg)
{
	struct cp_drain_scan *d = arg;

	if (strcmp(sb->worker, d->worker) != 0)
		return;
	if (cp_transitional(sb) && strcmp(sb->state, "paused") != 0)
		d->pending++;
	/* one pause per drain: one that failed was relaunched from its layer
	 * here, and the stop leaves it to the next start (its layer stays) */
	if (strcmp(sb->state, "running") != 0 ||
	    (d->since > 0 && sb->relaunch_at >= d->since))
		return;
	cp_sandboxes_keep(&d->run, sb);
}

/* cp_drain: {"worker"}: pauses what runs there (each to resume there);
 * answers {"pending":N}, the pauses and installs of that worker not done
 * yet: the worker calls again until 0, applying its feed meanwhile. */
int cp_drain(struct cp *cp, struct lws *wsi, json_t *body)
{
	struct tt_err err = { 0 };
	const char *worker = json_string_value(json_object_get(body, "worker"));
	struct cp_drain_scan d = { .worker = worker };
	struct cp_refusal why = { 0 };
	int64_t rev;
	int begun = 0;

	struct cp_worker w;

	if (!cp_name_ok(worker))
		return http_reply_error(wsi, 400, "bad_request", "drain needs worker");
	/* nothing new is placed there from now on, until it registers again */
	if (cpdb_worker_seen(cp->db, worker, tt_now(), &err) < 0 ||
	    cpdb_worker_drain(cp->db, worker, tt_now(), &err) < 0 ||
	    cpdb_worker_get(cp->db, worker, &w, &err) < 0 ||
	    (d.since = w.draining, cpdb_sandboxes_each(cp->db, cp_drain_one, &d, &err)) < 0) {
		free(d.run.v);
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	}
	for (size_t i = 0; i < d.run.n; i++) {
		if (cp_pause_begin(cp, &d.run.v[i], NULL, worker, &rev, &why) < 0) {
			log_warn("sandbox %s: not paused for the stop of %s: %s",
			         d.run.v[i].id, worker, why.msg);
			continue;
		}
		begun++;
	}
	free(d.run.v);
	if (begun > 0)
		log_info("worker %s stops: pausing %d sandbox(es), to resume there",
		         worker, begun);
	return http_reply_json(wsi, 200, json_pack("{s:i}", "pending",
	                                           d.pending + begun));
}

/* cp_resume_returned: resume_on's worker up again -> resumed there; one
 * that cannot be (no snapshot: never) stays paused, the reason kept. */
void cp_resume_returned(struct cp *cp, const struct cp_sandbox *sb)
{
	struct tt_err err = { 0 };
	struct cp_refusal why = { 0 };
	struct cp_worker w;
	struct cp_resumed r;

	if (cpdb_worker_get(cp->db, sb->resume_on, &w, &err) != 1 ||
	    !cp_worker_accepts(cp, &w, tt_now()))
		return; /* not back yet (it registers when it is) */
	if (cp_resume_begin(cp, sb, sb->resume_on, 0, &r, &why) == 0) {
		log_info("sandbox %s: %s is back: resuming it there as generation %"
		         PRIu64, sb->id, sb->resume_on, r.generation);
		feed_settled(cp, sb->id);
		return;
	}
	log_warn("sandbox %s: %s is back but it cannot resume there: %s", sb->id,
	         sb->resume_on, why.msg);
	if (cpdb_sandbox_migrate_clear(cp->db, sb->id, sb->generation, why.msg,
	                               &err) < 0)
		log_error("sandbox %s: %s", sb->id, err.msg);
	feed_settled(cp, sb->id);
}

/* cp_relaunch_bounded: no crash loop: lost or failed again and again
 * within CPDB_RELAUNCH_WINDOW s, it is not relaunched any more. */
static bool cp_relaunch_bounded(const struct cp_sandbox *sb)
{
	return sb->relaunches >= CP_RELAUNCH_MAX &&
	       sb->relaunch_at > tt_now() - CPDB_RELAUNCH_WINDOW;
}

/* cp_pause_failed: relaunched from its layer on the worker that kept it. */
void cp_pause_failed(struct cp *cp, const struct cp_sandbox *sb, const char *why)
{
	struct tt_err err = { 0 };
	int rc = cp_relaunch_bounded(sb) ? 0 : cp_relaunch(cp, sb, 0, why, &err);

	if (rc < 0)
		log_error("sandbox %s: cannot relaunch after a failed pause: %s",
		          sb->id, err.msg);
	if (rc != 1)
		cp_op_fail(cp, sb, why);
}

/* Lifecycle events and the gauges read at scrape time: the cp times each
 * create, pause, resume and migrate from its call to the worker's ack
 * (tether_cp_lifecycle_duration_seconds), keeps the last CP_EVENTS_MAX
 * outcomes in memory for GET /v1/events (the status page's timeline of
 * migrations; docs/API.md), and counts sandboxes and workers by state
 * from its database when /metrics is read. In memory only: a restarted
 * cp starts an empty timeline (the operations in flight then are not
 * timed), the database is not touched. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cp/cp.h"
#include "cp/events.h"
#include "log.h"
#include "metrics.h"

#define CP_EVENTS_MAX 256  /* outcomes kept for GET /v1/events */
#define CP_PENDING_MAX 256 /* operations timed at once */
#define CP_EVENTS_PAGE 200 /* events in one answer */

/* An operation begun and not yet acknowledged. */
struct cp_pending {
	char sbx[TT_SBX_ID_LEN + 1]; /* "" = free slot */
	char op[8];                  /* create | pause | resume | migrate */
	uint64_t gen;                /* the generation it starts or pauses */
	char from[TT_NAME_MAX + 1];  /* the worker it began on */
	char to[TT_NAME_MAX + 1];    /* resume, migrate: the target */
	uint64_t t0_us;              /* monotonic */
};

/* One outcome in the timeline. */
struct cp_event {
	uint64_t seq;
	int64_t at_ms;               /* wall clock */
	char sbx[TT_SBX_ID_LEN + 1];
	char op[8];
	char result[8];              /* ok | failed */
	uint64_t gen;                /* the execution that followed (or failed) */
	char from[TT_NAME_MAX + 1];
	char to[TT_NAME_MAX + 1];
	uint64_t dur_us;             /* 0: not timed */
	char error[160];
};

static struct cp_pending ev_pending[CP_PENDING_MAX];
static struct cp_event ev_ring[CP_EVENTS_MAX];
static uint64_t ev_seq; /* the last seq given */

/* ev_mono_us: monotonic microseconds. */
static uint64_t ev_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ev_wall_ms: wall-clock unix milliseconds. */
static int64_t ev_wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ev_find: the pending op of sbx, or NULL. */
static struct cp_pending *ev_find(const char *sbx, const char *op)
{
	for (size_t i = 0; i < CP_PENDING_MAX; i++)
		if (strcmp(ev_pending[i].sbx, sbx) == 0 &&
		    strcmp(ev_pending[i].op, op) == 0)
			return &ev_pending[i];
	return NULL;
}

/* ev_slot: a slot for (sbx, op): its old one, a free one, else the
 * oldest (a worker that never answers cannot fill the table). */
static struct cp_pending *ev_slot(const char *sbx, const char *op)
{
	struct cp_pending *p = ev_find(sbx, op), *old = &ev_pending[0];

	if (p != NULL)
		return p;
	for (size_t i = 0; i < CP_PENDING_MAX; i++) {
		if (ev_pending[i].sbx[0] == '\0')
			return &ev_pending[i];
		if (ev_pending[i].t0_us < old->t0_us)
			old = &ev_pending[i];
	}
	return old;
}

/* ev_start: op of sbx begins now. */
static void ev_start(const char *sbx, const char *op, uint64_t gen,
                     const char *from, const char *to)
{
	struct cp_pending *p = ev_slot(sbx, op);

	memset(p, 0, sizeof(*p));
	snprintf(p->sbx, sizeof(p->sbx), "%s", sbx);
	snprintf(p->op, sizeof(p->op), "%s", op);
	p->gen = gen;
	snprintf(p->from, sizeof(p->from), "%s", from ? from : "");
	snprintf(p->to, sizeof(p->to), "%s", to ? to : "");
	p->t0_us = ev_mono_us();
}

/* ev_end: p ended (result ok|failed) with the execution gen on worker:
 * observed, recorded in the ring, its slot freed. */
static void ev_end(struct cp_pending *p, const char *result, uint64_t gen,
                   const char *worker, const char *error)
{
	struct cp_event *e = &ev_ring[ev_seq % CP_EVENTS_MAX];
	char labels[64];

	memset(e, 0, sizeof(*e));
	e->seq = ++ev_seq;
	e->at_ms = ev_wall_ms();
	snprintf(e->sbx, sizeof(e->sbx), "%s", p->sbx);
	snprintf(e->op, sizeof(e->op), "%s", p->op);
	snprintf(e->result, sizeof(e->result), "%s", result);
	e->gen = gen;
	snprintf(e->from, sizeof(e->from), "%s", p->from);
	snprintf(e->to, sizeof(e->to), "%s", worker && worker[0] ? worker : p->to);
	e->dur_us = ev_mono_us() - p->t0_us;
	snprintf(e->error, sizeof(e->error), "%s", error ? error : "");
	snprintf(labels, sizeof(labels), "op=\"%s\",result=\"%s\"", p->op, result);
	metrics_observe_us("tether_cp_lifecycle_duration_seconds", labels, e->dur_us);
	metrics_inc("tether_cp_events_total", labels);
	log_info("sandbox %s: %s %s in %.3f s (generation %" PRIu64 " on %s)",
	         e->sbx, e->op, result, (double)e->dur_us / 1e6, gen, e->to);
	memset(p, 0, sizeof(*p));
}

/* cp_events_begin: see cp/events.h. */
void cp_events_begin(const struct cp_sandbox *sb, const char *op,
                     uint64_t gen, const char *target)
{
	if (strcmp(op, "pause") == 0 && target != NULL && target[0] != '\0')
		ev_start(sb->id, "migrate", sb->generation, sb->worker, target);
	if (strcmp(op, "resume") == 0) {
		struct cp_pending *m = ev_find(sb->id, "migrate");

		if (m != NULL) /* the resume of a migrate: its target may
		                * have been set when the pause began */
			snprintf(m->to, sizeof(m->to), "%s", target ? target : "");
	}
	ev_start(sb->id, op, gen, sb->worker, target);
}

/* ev_settle: p (an op of sb's) against sb as it is now: ended, or not
 * yet (1 = ended). */
static int ev_settle(struct cp_pending *p, const struct cp_sandbox *sb)
{
	const char *st = sb->state;
	int failed = strcmp(st, "failed") == 0 || strcmp(st, "deleting") == 0 ||
	             strcmp(st, "deleted") == 0;

	if (strcmp(p->op, "create") == 0 || strcmp(p->op, "resume") == 0) {
		if (sb->generation > p->gen) { /* superseded: not timed */
			memset(p, 0, sizeof(*p));
			return 1;
		}
		if (strcmp(st, "running") == 0)
			ev_end(p, "ok", sb->generation, sb->worker, NULL);
		else if (failed)
			ev_end(p, "failed", sb->generation, sb->worker, sb->error);
		else
			return 0;
		return 1;
	}
	if (strcmp(p->op, "pause") == 0) {
		if (strcmp(st, "paused") == 0 ||
		    (sb->generation > p->gen && strcmp(sb->worker, p->from) != 0))
			ev_end(p, "ok", p->gen, p->from, NULL); /* (a migrate goes on) */
		else if (failed || sb->generation > p->gen ||
		         strcmp(st, "running") == 0 || strcmp(st, "resuming") == 0)
			ev_end(p, "failed", sb->generation, sb->worker,
			       sb->error[0] ? sb->error : "the pause did not complete");
		else
			return 0;
		return 1;
	}
	/* migrate: over with its resume (ok), or when the sandbox ends up
	 * anything but on its way to the target */
	if (strcmp(st, "running") == 0 && sb->generation > p->gen &&
	    strcmp(sb->worker, p->to) == 0)
		ev_end(p, "ok", sb->generation, sb->worker, NULL);
	else if (failed || strcmp(st, "running") == 0 ||
	         (strcmp(st, "paused") == 0 && sb->migrate_to[0] == '\0'))
		ev_end(p, "failed", sb->generation, sb->worker,
		       sb->error[0] ? sb->error : "the migrate did not complete");
	else
		return 0;
	return 1;
}

/* cp_events_check: see cp/events.h. */
void cp_events_check(struct cp *cp, const char *sbx)
{
	static const char *const order[] = { "create", "pause", "resume", "migrate" };
	struct tt_err err = { 0 };
	struct cp_sandbox sb;
	int have = 0, rc;

	if (sbx == NULL)
		return;
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
		have |= ev_find(sbx, order[i]) != NULL;
	if (!have)
		return; /* nothing timed: no read on the ack path */
	rc = cpdb_sandbox_get(cp->db, sbx, &sb, &err);
	if (rc < 0)
		return;
	if (rc == 0) { /* gone */
		memset(&sb, 0, sizeof(sb));
		snprintf(sb.id, sizeof(sb.id), "%s", sbx);
		snprintf(sb.state, sizeof(sb.state), "deleted");
	}
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		struct cp_pending *p = ev_find(sbx, order[i]);

		if (p != NULL)
			ev_settle(p, &sb);
	}
}

/* ev_json: one event as the API's object. */
static json_t *ev_json(const struct cp_event *e)
{
	char at[TT_RFC3339_MAX + 8];
	time_t s = (time_t)(e->at_ms / 1000);
	struct tm tm;
	json_t *o;

	gmtime_r(&s, &tm);
	snprintf(at, sizeof(at), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
	         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
	         tm.tm_min, tm.tm_sec, (int)(e->at_ms % 1000));
	o = json_pack("{s:I,s:s,s:s,s:s,s:s,s:I,s:s,s:s,s:f}",
	              "seq", (json_int_t)e->seq, "at", at, "sandbox", e->sbx,
	              "op", e->op, "result", e->result,
	              "generation", (json_int_t)e->gen, "from", e->from,
	              "to", e->to, "duration_s", (double)e->dur_us / 1e6);
	if (o != NULL && e->error[0])
		json_object_set_new(o, "error", json_string(e->error));
	return o;
}

/* cp_events_get: see cp/events.h. */
int cp_events_get(struct lws *wsi)
{
	char buf[32], *end;
	unsigned long long after = 0;
	uint64_t first = ev_seq > CP_EVENTS_MAX ? ev_seq - CP_EVENTS_MAX + 1 : 1;
	json_t *arr = json_array(), *o;

	if (http_query(wsi, "after", buf, sizeof(buf)) >= 0) {
		after = strtoull(buf, &end, 10);
		if (buf[0] < '0' || buf[0] > '9' || *end != '\0') {
			json_decref(arr);
			return http_reply_error(wsi, 400, "bad_request",
			                        "after must be an event seq (>= 0)");
		}
	}
	if (arr == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	if (after + 1 > first)
		first = after + 1;
	for (uint64_t q = first; q <= ev_seq && json_array_size(arr) < CP_EVENTS_PAGE; q++)
		if ((o = ev_json(&ev_ring[(q - 1) % CP_EVENTS_MAX])) != NULL)
			json_array_append_new(arr, o);
	return http_reply_json(wsi, 200, json_pack("{s:o,s:I}", "events", arr,
	                                           "last", (json_int_t)ev_seq));
}

/* The counts cp_events_gauges sets. */
struct ev_counts {
	struct cp *cp;
	int64_t now;
	int64_t sbx[8];
	int64_t wrk[3];
};

static const char *const ev_states[8] = {
	"starting", "running", "pausing", "paused", "resuming", "failed",
	"deleting", "other"
};

/* ev_count_sbx: one sandbox into its state's count. */
static void ev_count_sbx(const struct cp_sandbox *sb, void *arg)
{
	struct ev_counts *c = arg;
	size_t i;

	for (i = 0; i < 7; i++)
		if (strcmp(sb->state, ev_states[i]) == 0)
			break;
	c->sbx[i]++;
}

/* ev_count_wrk: one worker into up, stopping or down. */
static void ev_count_wrk(const struct cp_worker *w, void *arg)
{
	struct ev_counts *c = arg;

	if (!cp_worker_up(c->cp, w, c->now))
		c->wrk[2]++;
	else
		c->wrk[w->draining ? 1 : 0]++;
}

/* cp_events_gauges: see cp/events.h. */
void cp_events_gauges(struct cp *cp)
{
	static const char *const wst[3] = { "up", "stopping", "down" };
	struct ev_counts c = { .cp = cp, .now = tt_now() };
	struct tt_err err = { 0 };
	char labels[32];

	if (cpdb_sandboxes_each(cp->db, ev_count_sbx, &c, &err) < 0 ||
	    cpdb_workers_each(cp->db, ev_count_wrk, &c, &err) < 0) {
		log_warn("metrics: %s", err.msg);
		return;
	}
	for (size_t i = 0; i < 8; i++) {
		snprintf(labels, sizeof(labels), "state=\"%s\"", ev_states[i]);
		metrics_gauge_set("tether_cp_sandboxes", labels, c.sbx[i]);
	}
	for (size_t i = 0; i < 3; i++) {
		snprintf(labels, sizeof(labels), "state=\"%s\"", wst[i]);
		metrics_gauge_set("tether_cp_workers", labels, c.wrk[i]);
	}
}

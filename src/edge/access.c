/* The edge's side of its access log (the line itself: lib/access.c): the
 * last AX_RING operations on a sandbox stay for the status page, and the
 * admission decisions they carry are counted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "edge/edge_int.h"
#include "http.h"
#include "log.h"
#include "metrics.h"

#define AX_RING 64 /* recent operations kept for the status page */

/* One recent operation, as the status page shows it. */
struct ax_op {
	int64_t at_ms;
	char rid[HTTP_RID_MAX + 1];
	char method[8];
	char path[128];
	char sbx[40];
	long status;
	char decision[24];
	char reason[48];
	char result[24];
	int rebuilt;
	uint64_t generation;
};

static struct ax_op ax_ring[AX_RING];
static uint64_t ax_ring_n;

/* ax_note: a into the ring of recent operations (those on a sandbox). */
static void ax_note(const struct tt_access *a)
{
	struct ax_op *o;
	struct timespec ts;

	if (a->sbx == NULL || a->sbx[0] == '\0')
		return; /* not an operation on a sandbox */
	o = &ax_ring[ax_ring_n++ % AX_RING];
	memset(o, 0, sizeof(*o));
	clock_gettime(CLOCK_REALTIME, &ts);
	o->at_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	snprintf(o->rid, sizeof(o->rid), "%s", a->rid ? a->rid : "");
	snprintf(o->method, sizeof(o->method), "%s", a->method ? a->method : "");
	snprintf(o->path, sizeof(o->path), "%s", a->path ? a->path : "");
	snprintf(o->sbx, sizeof(o->sbx), "%s", a->sbx);
	o->status = a->status;
	snprintf(o->decision, sizeof(o->decision), "%s",
	         a->decision && a->decision[0] ? a->decision :
	         a->generation > 0 ? "allow" : "");
	snprintf(o->reason, sizeof(o->reason), "%s", a->reason ? a->reason : "");
	snprintf(o->result, sizeof(o->result), "%s", a->result ? a->result : "");
	o->rebuilt = a->rebuilt;
	o->generation = a->generation;
}

/* edge_access_recent: see edge_int.h. */
json_t *edge_access_recent(void)
{
	json_t *arr = json_array();
	size_t n = ax_ring_n < AX_RING ? (size_t)ax_ring_n : AX_RING;

	for (size_t k = 0; arr != NULL && k < n; k++) {
		const struct ax_op *o = &ax_ring[(ax_ring_n - 1 - k) % AX_RING];
		json_t *j = json_pack("{s:I,s:s,s:s,s:s,s:s,s:I,s:s,s:s,s:s,s:b,s:I}",
		                      "at_ms", (json_int_t)o->at_ms, "rid", o->rid,
		                      "method", o->method, "path", o->path,
		                      "sandbox", o->sbx, "status", (json_int_t)o->status,
		                      "decision", o->decision, "reason", o->reason,
		                      "result", o->result, "rebuilt", o->rebuilt,
		                      "generation", (json_int_t)o->generation);
		if (j != NULL)
			json_array_append_new(arr, j);
	}
	return arr;
}

/* label_safe: a label value kept to [a-z0-9_] (it comes from a peer). */
static void label_safe(char *dst, size_t cap, const char *src)
{
	size_t i = 0;

	for (; src != NULL && *src != '\0' && i + 1 < cap; src++)
		dst[i++] = ((*src >= 'a' && *src <= 'z') || (*src >= '0' && *src <= '9') ||
		            *src == '_') ? *src : '_';
	dst[i] = '\0';
}

/* edge_count_decision: tether_edge_decisions_total for a's operation: the
 * last refusal a receiver answered, and an allow when an execution served
 * it (its answer named a generation). */
static void edge_count_decision(const struct tt_access *a)
{
	char labels[160], d[24], r[48];

	if (a->sbx == NULL || a->sbx[0] == '\0')
		return;
	if (a->decision != NULL && a->decision[0] != '\0') {
		label_safe(d, sizeof(d), a->decision);
		label_safe(r, sizeof(r), a->reason);
		snprintf(labels, sizeof(labels),
		         "receiver=\"node\",decision=\"%s\",reason=\"%s\"", d, r);
		metrics_inc("tether_edge_decisions_total", labels);
	}
	if (a->generation > 0)
		metrics_inc("tether_edge_decisions_total",
		            "receiver=\"node\",decision=\"allow\",reason=\"\"");
}

/* edge_access_log: see edge_int.h. */
void edge_access_log(const struct tt_access *a)
{
	edge_count_decision(a);
	ax_note(a);
	access_log(a);
}

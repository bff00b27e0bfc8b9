/* Fixed-size metrics registry and Prometheus text rendering (see
 * metrics.h). Series beyond the registry size are dropped and counted in
 * tether_metrics_dropped_total, so a label explosion cannot grow memory. */
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX     256
#define METRICS_NAME    96
#define METRICS_LABELS  160
#define METRICS_BUCKETS 7

/* Upper bounds (µs) of the latency buckets; +Inf is the count. 10 s and
 * 60 s are there for the lifecycle durations (a migrate takes seconds). */
static const uint64_t metrics_bounds_us[METRICS_BUCKETS] = {
	100, 1000, 10000, 100000, 1000000, 10000000, 60000000
};
static const char *const metrics_bounds_txt[METRICS_BUCKETS] = {
	"0.0001", "0.001", "0.01", "0.1", "1", "10", "60"
};

enum metric_kind { METRIC_COUNTER, METRIC_SUMMARY, METRIC_GAUGE };

struct metric {
	enum metric_kind kind;
	char name[METRICS_NAME];
	char labels[METRICS_LABELS];
	uint64_t value;                    /* counter value, or sample count */
	int64_t level;                     /* gauge value */
	uint64_t sum_us;
	uint64_t buckets[METRICS_BUCKETS]; /* non-cumulative */
};

/* The one list of metric names: what each counts and its type. A name not
 * here is still served, with a HELP line that says so (docs/METRICS.md
 * lists the same names; tests/integration/test_cli_conventions.sh checks
 * that every name the code uses is in both). */
static const struct metric_doc {
	const char *name;
	const char *type;
	const char *help;
} metrics_docs[] = {
	{ "tether_admission_total", "counter",
	  "Admission decisions of the sandbox manager, by decision and reason (SPEC 4)." },
	{ "tether_bridge_refusals_total", "counter",
	  "Host bridge refusals, by reason." },
	{ "tether_bridge_verify_failed_total", "counter",
	  "Bridges the manager spawned that failed its process checks." },
	{ "tether_cp_auth_refused_total", "counter",
	  "Control-plane requests refused for their credentials, by kind (bearer, node)." },
	{ "tether_cp_bad_requests_total", "counter",
	  "Control-plane requests refused as malformed." },
	{ "tether_cp_capabilities_total", "counter",
	  "Capabilities the control plane issued." },
	{ "tether_cp_events_total", "counter",
	  "Lifecycle events recorded for GET /v1/events, by event." },
	{ "tether_cp_feed_parked_total", "counter",
	  "Feed long polls parked until an update or their timeout." },
	{ "tether_cp_feed_refused_total", "counter",
	  "Feed updates a worker's manager refused (signature, order), as its ack reported." },
	{ "tether_cp_forced_resumes_total", "counter",
	  "Forced resumes (failover from the last complete snapshot)." },
	{ "tether_cp_idempotent_replays_total", "counter",
	  "Lifecycle calls repeated under their Idempotency-Key that waited for the operation the first one started." },
	{ "tether_cp_late_snapshots_total", "counter",
	  "Pause answers recorded after their pause had failed." },
	{ "tether_cp_lifecycle_duration_seconds", "histogram",
	  "Create, pause, resume and migrate durations, from the call to the worker's ack, by op and result." },
	{ "tether_cp_lifecycle_failed_total", "counter",
	  "Creates, pauses and resumes that failed." },
	{ "tether_cp_pauses_total", "counter",
	  "Pauses the control plane began." },
	{ "tether_cp_relaunches_total", "counter",
	  "Executions relaunched after a worker reported them lost, by kind." },
	{ "tether_cp_replica_messages_total", "counter",
	  "Messages from other control-plane replicas (new updates, acks, settled operations)." },
	{ "tether_cp_request_seconds", "histogram",
	  "Control-plane request latency." },
	{ "tether_cp_requests_total", "counter",
	  "Control-plane requests answered." },
	{ "tether_cp_resumes_total", "counter",
	  "Resumes the control plane began." },
	{ "tether_cp_sandboxes", "gauge",
	  "Sandboxes the control plane records, by state (read from its database at scrape time)." },
	{ "tether_cp_sandboxes_created_total", "counter",
	  "Sandboxes created." },
	{ "tether_cp_sign_seconds", "histogram",
	  "Time to sign one capability in the signer." },
	{ "tether_cp_transition_wait_seconds", "histogram",
	  "Time calls waited for a sandbox transition to end." },
	{ "tether_cp_transition_waits_total", "counter",
	  "Calls that waited for a sandbox transition." },
	{ "tether_cp_workers", "gauge",
	  "Registered workers, by state (up, stopping, down), at scrape time." },
	{ "tether_edge_cap_fetch_total", "counter",
	  "Capability fetches from the control plane at the edge, by why." },
	{ "tether_edge_capcache_total", "counter",
	  "Edge route-cache lookups, by result." },
	{ "tether_edge_connect_retries_total", "counter",
	  "Edge retries of a next hop that refused the connection, by target." },
	{ "tether_edge_cp_failovers_total", "counter",
	  "Control-plane calls that found their replica refusing, timing out or losing the answer (the next call goes to another)." },
	{ "tether_edge_decisions_total", "counter",
	  "Admission decisions the edge saw from receivers, by receiver, decision and reason." },
	{ "tether_edge_exec_streams_total", "counter",
	  "Streamed execs at the edge, by how they ended." },
	{ "tether_edge_not_repeated_total", "counter",
	  "Operations that broke off mid-request and were not repeated." },
	{ "tether_edge_read_retries_total", "counter",
	  "Reads retried once after a transport failure." },
	{ "tether_edge_rebuilt_attempts_total", "counter",
	  "Rebuilt attempts made by the edge, by why (SPEC 8)." },
	{ "tether_edge_refresh_exhausted_total", "counter",
	  "RefreshRoute answers passed on after the one rebuilt attempt." },
	{ "tether_edge_refresh_total", "counter",
	  "RefreshRoute answers the edge repaired with a rebuilt attempt." },
	{ "tether_edge_request_duration_seconds", "histogram",
	  "Edge request latency, by kind (op, lifecycle)." },
	{ "tether_edge_requests_total", "counter",
	  "Edge requests answered, by kind and status." },
	{ "tether_edge_route_repair_duration_seconds", "histogram",
	  "Time from a RefreshRoute to the rebuilt attempt's answer." },
	{ "tether_edge_status_logins_total", "counter",
	  "Status page logins, by result." },
	{ "tether_edge_status_sessions", "gauge",
	  "Status page sessions held by the edge now." },
	{ "tether_edge_streams_open", "gauge",
	  "Exec streams open at the edge now." },
	{ "tether_edge_upstream_failures_total", "counter",
	  "Edge requests whose next hop failed, by upstream." },
	{ "tether_feed_refused_total", "counter",
	  "Feed updates the manager refused before applying them, by reason (unsigned, bad_signature, out_of_order, ...)." },
	{ "tether_http_accept_pauses_total", "counter",
	  "Pauses of accepting connections after accept(2) failed." },
	{ "tether_http_refused_total", "counter",
	  "Connections closed by the HTTP front door's bounds, by reason." },
	{ "tether_manager_bad_frames_total", "counter",
	  "Malformed frames the sandbox manager refused." },
	{ "tether_manager_peer_refused_total", "counter",
	  "Manager socket peers refused by their credentials." },
	{ "tether_metrics_dropped_total", "counter",
	  "Metric samples dropped because the registry was full." },
	{ "tether_node_admission_total", "counter",
	  "Admission decisions seen at node-api, by decision and reason." },
	{ "tether_node_exec_stream_duration_seconds", "histogram",
	  "Streamed exec duration at node-api." },
	{ "tether_node_exec_streams_total", "counter",
	  "Streamed execs at node-api, by how they ended." },
	{ "tether_node_manager_connections_total", "counter",
	  "Connections node-api opened to its sandbox manager." },
	{ "tether_node_request_duration_seconds", "histogram",
	  "Node-api request latency, by route." },
	{ "tether_node_requests_total", "counter",
	  "Node-api requests answered, by route and status." },
	{ "tether_node_streams_open", "gauge",
	  "Exec streams open at node-api now." },
	{ "tether_streams_cancelled_total", "counter",
	  "Streams cancelled because their identity epoch changed (SPEC 6)." },
};

/* metrics_doc: the entry of name, or NULL. */
static const struct metric_doc *metrics_doc(const char *name)
{
	for (size_t i = 0; i < sizeof(metrics_docs) / sizeof(metrics_docs[0]); i++)
		if (strcmp(metrics_docs[i].name, name) == 0)
			return &metrics_docs[i];
	return NULL;
}

static struct metric metrics_tab[METRICS_MAX];
static size_t metrics_used;
static uint64_t metrics_dropped;

/* metrics_find: the series name{labels} of kind, created if room. */
static struct metric *metrics_find(const char *name, const char *labels,
                                   enum metric_kind kind)
{
	const char *l = labels ? labels : "";
	struct metric *m;

	if (strlen(name) >= METRICS_NAME || strlen(l) >= METRICS_LABELS) {
		metrics_dropped++;
		return NULL;
	}
	for (size_t i = 0; i < metrics_used; i++) {
		m = &metrics_tab[i];
		if (m->kind == kind && strcmp(m->name, name) == 0 &&
		    strcmp(m->labels, l) == 0)
			return m;
	}
	if (metrics_used == METRICS_MAX) {
		metrics_dropped++;
		return NULL;
	}
	m = &metrics_tab[metrics_used++];
	memset(m, 0, sizeof(*m));
	m->kind = kind;
	strcpy(m->name, name);
	strcpy(m->labels, l);
	return m;
}

/* metrics_inc: counter += 1. */
void metrics_inc(const char *name, const char *labels)
{
	metrics_add(name, labels, 1);
}

/* metrics_add: counter += n. */
void metrics_add(const char *name, const char *labels, uint64_t n)
{
	struct metric *m = metrics_find(name, labels, METRIC_COUNTER);

	if (m != NULL)
		m->value += n;
}

/* metrics_gauge_set: gauge = v. */
void metrics_gauge_set(const char *name, const char *labels, int64_t v)
{
	struct metric *m = metrics_find(name, labels, METRIC_GAUGE);

	if (m != NULL)
		m->level = v;
}

/* metrics_gauge_add: gauge += delta (delta may be negative). */
void metrics_gauge_add(const char *name, const char *labels, int64_t delta)
{
	struct metric *m = metrics_find(name, labels, METRIC_GAUGE);

	if (m != NULL)
		m->level += delta;
}

/* metrics_observe_us: one latency sample into count, sum and its bucket. */
void metrics_observe_us(const char *name, const char *labels, uint64_t us)
{
	struct metric *m = metrics_find(name, labels, METRIC_SUMMARY);

	if (m == NULL)
		return;
	m->value++;
	m->sum_us += us;
	for (size_t b = 0; b < METRICS_BUCKETS; b++) {
		if (us <= metrics_bounds_us[b]) {
			m->buckets[b]++;
			break;
		}
	}
}

/* metrics_typed: whether a TYPE line for name/kind was already written
 * (series of one name are rendered together, in first-seen order). */
static int metrics_typed(size_t upto, const struct metric *m)
{
	for (size_t i = 0; i < upto; i++)
		if (metrics_tab[i].kind == m->kind &&
		    strcmp(metrics_tab[i].name, m->name) == 0)
			return 1;
	return 0;
}

/* metrics_series: one line "name{labels[,extra]} value". */
static void metrics_series(FILE *f, const char *name, const char *suffix,
                           const char *labels, const char *extra,
                           const char *value)
{
	int have_l = labels[0] != '\0', have_e = extra != NULL;

	fprintf(f, "%s%s", name, suffix);
	if (have_l || have_e)
		fprintf(f, "{%s%s%s}", labels, have_l && have_e ? "," : "",
		        have_e ? extra : "");
	fprintf(f, " %s\n", value);
}

/* metrics_render_one: every series sharing m's name, after its HELP and
 * TYPE lines. */
static void metrics_render_one(FILE *f, size_t first)
{
	const struct metric *m0 = &metrics_tab[first];
	char v[48], le[32];

	const struct metric_doc *d = metrics_doc(m0->name);

	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", m0->name,
	        d ? d->help : "(not in the list of lib/metrics.c)", m0->name,
	        m0->kind == METRIC_COUNTER ? "counter" :
	        m0->kind == METRIC_GAUGE ? "gauge" : "histogram");
	for (size_t i = first; i < metrics_used; i++) {
		const struct metric *m = &metrics_tab[i];
		uint64_t cum = 0;

		if (m->kind != m0->kind || strcmp(m->name, m0->name) != 0)
			continue;
		if (m->kind == METRIC_COUNTER) {
			snprintf(v, sizeof(v), "%" PRIu64, m->value);
			metrics_series(f, m->name, "", m->labels, NULL, v);
			continue;
		}
		if (m->kind == METRIC_GAUGE) {
			snprintf(v, sizeof(v), "%" PRId64, m->level);
			metrics_series(f, m->name, "", m->labels, NULL, v);
			continue;
		}
		for (size_t b = 0; b < METRICS_BUCKETS; b++) {
			cum += m->buckets[b];
			snprintf(le, sizeof(le), "le=\"%s\"", metrics_bounds_txt[b]);
			snprintf(v, sizeof(v), "%" PRIu64, cum);
			metrics_series(f, m->name, "_bucket", m->labels, le, v);
		}
		snprintf(v, sizeof(v), "%" PRIu64, m->value);
		metrics_series(f, m->name, "_bucket", m->labels, "le=\"+Inf\"", v);
		snprintf(v, sizeof(v), "%" PRIu64 ".%06" PRIu64,
		         m->sum_us / 1000000, m->sum_us % 1000000);
		metrics_series(f, m->name, "_sum", m->labels, NULL, v);
		snprintf(v, sizeof(v), "%" PRIu64, m->value);
		metrics_series(f, m->name, "_count", m->labels, NULL, v);
	}
}

/* metrics_render: Prometheus text exposition (latencies in seconds);
 * caller frees. */
char *metrics_render(void)
{
	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);

	if (f == NULL)
		return NULL;
	for (size_t i = 0; i < metrics_used; i++)
		if (!metrics_typed(i, &metrics_tab[i]))
			metrics_render_one(f, i);
	fprintf(f, "# HELP tether_metrics_dropped_total %s\n"
	           "# TYPE tether_metrics_dropped_total counter\n"
	           "tether_metrics_dropped_total %" PRIu64 "\n",
	        metrics_doc("tether_metrics_dropped_total")->help, metrics_dropped);
	if (fclose(f) != 0) {
		free(out);
		return NULL;
	}
	return out;
}

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
#define METRICS_BUCKETS 5

/* Upper bounds (µs) of the latency buckets; +Inf is the count. */
static const uint64_t metrics_bounds_us[METRICS_BUCKETS] = {
	100, 1000, 10000, 100000, 1000000
};
static const char *const metrics_bounds_txt[METRICS_BUCKETS] = {
	"0.0001", "0.001", "0.01", "0.1", "1"
};

enum metric_kind { METRIC_COUNTER, METRIC_SUMMARY };

struct metric {
	enum metric_kind kind;
	char name[METRICS_NAME];
	char labels[METRICS_LABELS];
	uint64_t value;                    /* counter value, or sample count */
	uint64_t sum_us;
	uint64_t buckets[METRICS_BUCKETS]; /* non-cumulative */
};

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

/* metrics_render_one: every series sharing m's name, after its TYPE line. */
static void metrics_render_one(FILE *f, size_t first)
{
	const struct metric *m0 = &metrics_tab[first];
	char v[48], le[32];

	fprintf(f, "# TYPE %s %s\n", m0->name,
	        m0->kind == METRIC_COUNTER ? "counter" : "histogram");
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
	fprintf(f, "# TYPE tether_metrics_dropped_total counter\n"
	           "tether_metrics_dropped_total %" PRIu64 "\n",
	        metrics_dropped);
	if (fclose(f) != 0) {
		free(out);
		return NULL;
	}
	return out;
}

/* Per-process metrics in Prometheus text format, served at /metrics by
 * every daemon. A small fixed registry; each daemon is one event loop, so no
 * locking. Implementation: lib/metrics.c. */
#ifndef TT_METRICS_H
#define TT_METRICS_H

#include <stdint.h>

/* metrics_inc: adds 1 to counter name{labels}; labels is Prometheus label
 * text such as "decision=\"deny\",reason=\"expired\"" or NULL. */
void metrics_inc(const char *name, const char *labels);
void metrics_add(const char *name, const char *labels, uint64_t n);
/* metrics_gauge_set / metrics_gauge_add: a gauge name{labels} set to v,
 * or moved by delta (a level: sandboxes by state, streams open). */
void metrics_gauge_set(const char *name, const char *labels, int64_t v);
void metrics_gauge_add(const char *name, const char *labels, int64_t delta);
/* metrics_observe_us: records one latency sample (count, sum and a few
 * fixed buckets) under name{labels}. */
void metrics_observe_us(const char *name, const char *labels, uint64_t us);
/* metrics_render: the text exposition; caller frees. */
char *metrics_render(void);

#endif

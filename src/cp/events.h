/* Lifecycle durations, the recent-events timeline (GET /v1/events) and
 * the gauges the cp reads from its database at scrape time.
 * Implementation: src/cp/events.c. */
#ifndef TT_CP_EVENTS_H
#define TT_CP_EVENTS_H

#include <stdint.h>

#include <libwebsockets.h>

#include "cp/db.h"

struct cp;

/* cp_events_begin: op ("create", "pause", "resume") of sb begins now:
 * gen is the generation it starts (create, resume) or pauses; target the
 * worker it goes to (resume), or a migrate's target (pause: the migrate
 * is timed too, until its resume is acknowledged). */
void cp_events_begin(const struct cp_sandbox *sb, const char *op,
                     uint64_t gen, const char *target);
/* cp_events_check: the sandbox sbx may have moved (an ack was applied, an
 * operation failed): each of its timed operations that is over is
 * observed and recorded. Reads the database only when one is timed. */
void cp_events_check(struct cp *cp, const char *sbx);
/* cp_events_get: GET /v1/events?after=SEQ (Bearer): the recorded
 * outcomes after SEQ, oldest first (docs/API.md). */
int cp_events_get(struct lws *wsi);
/* cp_events_gauges: tether_cp_sandboxes{state} and tether_cp_workers{state}
 * from the database, before /metrics is rendered. */
void cp_events_gauges(struct cp *cp);

#endif

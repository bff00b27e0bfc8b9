/* A list of equivalent base URLs (several control-plane replicas) and
 * which one to use next: the edge spreads its calls over the replicas,
 * a worker stays on one; a replica that refused a connection, timed out
 * or lost an answer is passed over for URLLIST_DOWN_MS while another is
 * not. The one place a daemon turns a --cp list into the URL of a call.
 * Implementation: lib/urllist.c. */
#ifndef TT_URLLIST_H
#define TT_URLLIST_H

#include <stdint.h>

#include <curl/curl.h>

#include "err.h"

#define URLLIST_MAX 8
#define URLLIST_URL_MAX 256
#define URLLIST_DOWN_MS 2000

struct urllist {
	char url[URLLIST_MAX][URLLIST_URL_MAX]; /* no trailing '/' */
	unsigned n;
	unsigned cur;                       /* the one used last */
	uint64_t down_until[URLLIST_MAX];   /* monotonic ms; 0: up */
};

/* urllist_parse: "URL[,URL...]" (http:// or https://, at most
 * URLLIST_MAX, each shorter than URLLIST_URL_MAX; trailing '/' dropped). */
int urllist_parse(struct urllist *l, const char *csv, struct tt_err *err);
/* urllist_pick: the URL to call: the next one after the last (spread) or
 * the last one again, skipping those marked down unless all are. */
const char *urllist_pick(struct urllist *l, int spread);
/* urllist_failed: the transfer e (its effective URL names the replica)
 * ended in rc: a connection refused or cut, a timeout or a lost answer
 * marks that replica down, and the next pick takes another. 1 when rc
 * was such a failure. */
int urllist_failed(struct urllist *l, CURL *e, CURLcode rc);
/* urllist_lost: rc says the request may have reached the far side but
 * its answer did not come back (so it is repeated only where the far
 * side dedupes it). */
int urllist_lost(CURLcode rc);

#endif

/* Failover between equivalent base URLs (see urllist.h). */
#include "urllist.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* urllist_now: monotonic milliseconds. */
static uint64_t urllist_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* urllist_parse: see urllist.h. */
int urllist_parse(struct urllist *l, const char *csv, struct tt_err *err)
{
	const char *p = csv;

	memset(l, 0, sizeof(*l));
	while (*p != '\0') {
		size_t len = strcspn(p, ",");

		if (l->n == URLLIST_MAX)
			return tt_err_set(err, TT_ERR_INVALID, "at most %d URLs", URLLIST_MAX);
		if (len == 0 || len >= URLLIST_URL_MAX ||
		    (strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0))
			return tt_err_set(err, TT_ERR_INVALID, "%.*s: an http(s) URL of at most"
			                  " %d bytes expected", (int)(len > 80 ? 80 : len), p,
			                  URLLIST_URL_MAX - 1);
		memcpy(l->url[l->n], p, len);
		while (len > 0 && l->url[l->n][len - 1] == '/')
			len--;
		l->url[l->n][len] = '\0';
		if (len <= strlen(p[4] == 's' ? "https://" : "http://"))
			return tt_err_set(err, TT_ERR_INVALID, "%.*s: no host", (int)len, p);
		l->n++;
		p += strcspn(p, ",");
		if (*p == ',')
			p++;
	}
	if (l->n == 0)
		return tt_err_set(err, TT_ERR_INVALID, "no URL given");
	return 0;
}

/* urllist_pick: see urllist.h. */
const char *urllist_pick(struct urllist *l, int spread)
{
	uint64_t now = urllist_now();

	for (unsigned k = 0; k < l->n; k++) {
		unsigned i = (l->cur + (spread ? 1 : 0) + k) % l->n;

		if (l->down_until[i] <= now) {
			l->cur = i;
			return l->url[i];
		}
	}
	/* all down: the next one anyway (its wait may be over first) */
	l->cur = (l->cur + 1) % l->n;
	return l->url[l->cur];
}

/* urllist_lost: see urllist.h. */
int urllist_lost(CURLcode rc)
{
	return rc == CURLE_GOT_NOTHING || rc == CURLE_RECV_ERROR ||
	       rc == CURLE_SEND_ERROR || rc == CURLE_PARTIAL_FILE ||
	       rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_ABORTED_BY_CALLBACK ||
	       rc == CURLE_SEND_FAIL_REWIND;
}

/* urllist_failed: see urllist.h. */
int urllist_failed(struct urllist *l, CURL *e, CURLcode rc)
{
	char *eff = NULL;

	if (rc != CURLE_COULDNT_CONNECT && !urllist_lost(rc))
		return 0;
	curl_easy_getinfo(e, CURLINFO_EFFECTIVE_URL, &eff);
	for (unsigned i = 0; eff != NULL && i < l->n; i++) {
		size_t len = strlen(l->url[i]);

		if (strncmp(eff, l->url[i], len) == 0 &&
		    (eff[len] == '/' || eff[len] == '\0' || eff[len] == '?')) {
			l->down_until[i] = urllist_now() + URLLIST_DOWN_MS;
			break;
		}
	}
	return 1;
}

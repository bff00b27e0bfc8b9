/* libtether lifecycle calls (notes/lifecycle.md, docs/API.md): pause,
 * resume and migrate. Each is one blocking POST to the edge (which proxies
 * them to the control plane) answering the sandbox object. They take the
 * configuration rather than a struct tether because the request helpers of
 * client.c are private to it; the behaviour (bounded answers, the server's
 * one-line message as the error) is the same. */
#include "client/tether.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <sodium.h>

#include "cleanup.h"

#define LC_ANSWER_MAX (1u << 20)
#define LC_TIMEOUT_S 120L /* a waited pause/migrate of a big layer */

/* A bounded in-memory answer. */
struct lc_buf {
	char *p;      /* owned */
	size_t len;
	int overflow;
};

/* lc_write: curl body sink, bounded. */
static size_t lc_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct lc_buf *b = arg;
	size_t n = size * nmemb;
	char *np;

	if (b->len + n > LC_ANSWER_MAX) {
		b->overflow = 1;
		return 0;
	}
	np = realloc(b->p, b->len + n + 1);
	if (np == NULL)
		return 0;
	b->p = np;
	memcpy(b->p + b->len, data, n);
	b->len += n;
	b->p[b->len] = '\0';
	return n;
}

/* lc_errc: HTTP status -> error code (as client.c maps them). */
static enum tt_errc lc_errc(long status)
{
	switch (status) {
	case 400: return TT_ERR_INVALID;
	case 401:
	case 403: return TT_ERR_DENIED;
	case 404: return TT_ERR_NOT_FOUND;
	case 409: return TT_ERR_CONFLICT;
	default: return TT_ERR_TRANSPORT;
	}
}

/* lc_post: POST cfg->url + /v1/sandboxes/ID/<verb>[query] with body;
 * returns the answer object or NULL with err (the server's message). */
static json_t *lc_post(const struct tether_config *cfg, const char *id,
                       const char *verb, const char *query, json_t *body,
                       struct tt_err *err)
{
	_cleanup_free_ char *url = NULL, *payload = NULL;
	struct lc_buf b = { 0 };
	struct curl_slist *hdrs = NULL;
	char auth[TETHER_KEY_MAX + 32], errbuf[CURL_ERROR_SIZE] = "";
	CURL *e;
	CURLcode rc;
	long status = 0;
	json_t *j = NULL;
	char *esc;

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || (e = curl_easy_init()) == NULL) {
		tt_err_set(err, TT_ERR_SYS, "curl init failed");
		return NULL;
	}
	esc = curl_easy_escape(e, id, 0);
	payload = body ? json_dumps(body, JSON_COMPACT) : strdup("{}");
	if (esc == NULL || payload == NULL ||
	    asprintf(&url, "%s/v1/sandboxes/%s/%s%s", cfg->url, esc, verb, query) < 0) {
		url = NULL;
		curl_free(esc);
		curl_easy_cleanup(e);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	curl_free(esc);
	snprintf(auth, sizeof(auth), "Authorization: Bearer %s", cfg->api_key);
	hdrs = curl_slist_append(hdrs, auth);
	sodium_memzero(auth, sizeof(auth));
	hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
	hdrs = curl_slist_append(hdrs, "Expect:");
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, payload);
	curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(payload));
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, lc_write);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, LC_TIMEOUT_S);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	rc = curl_easy_perform(e);
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	for (struct curl_slist *s = hdrs; s; s = s->next)
		sodium_memzero(s->data, strlen(s->data));
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(e);
	if (b.overflow) {
		tt_err_set(err, TT_ERR_TOO_LARGE, "the answer exceeds %u bytes", LC_ANSWER_MAX);
	} else if (rc != CURLE_OK) {
		tt_err_set(err, TT_ERR_TRANSPORT, rc == CURLE_COULDNT_CONNECT ?
		           "cannot reach %s (is 'tether up' running?)" : "%s: %s", cfg->url,
		           errbuf[0] ? errbuf : curl_easy_strerror(rc));
	} else {
		j = b.p ? json_loadb(b.p, b.len, JSON_REJECT_DUPLICATES, NULL) : NULL;
		if (status < 200 || status >= 300) {
			const char *msg = json_string_value(json_object_get(j, "message"));
			const char *code = json_string_value(json_object_get(j, "error"));

			if (msg && msg[0])
				tt_err_set(err, lc_errc(status), "%s", msg);
			else
				tt_err_set(err, lc_errc(status), "%s (HTTP %ld)",
				           code ? code : "the server refused", status);
			json_decref(j);
			j = NULL;
		} else if (!json_is_object(j)) {
			json_decref(j);
			j = NULL;
			tt_err_set(err, TT_ERR_MALFORMED, "%s: the answer is not a JSON object", verb);
		}
	}
	free(b.p);
	return j;
}

/* tether_pause: POST …/pause (wait: until paused; else 202 "pausing"). */
json_t *tether_pause(const struct tether_config *cfg, const char *id, int wait,
                     struct tt_err *err)
{
	return lc_post(cfg, id, "pause", wait ? "" : "?wait=0", NULL, err);
}

/* tether_resume: POST …/resume {"worker"?,"force"}. */
json_t *tether_resume(const struct tether_config *cfg, const char *id,
                      const char *worker, int force, struct tt_err *err)
{
	json_t *body = json_pack("{s:b}", "force", force ? 1 : 0);
	json_t *j;

	if (body != NULL && worker != NULL)
		json_object_set_new(body, "worker", json_string(worker));
	if (body == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	j = lc_post(cfg, id, "resume", "", body, err);
	json_decref(body);
	return j;
}

/* tether_migrate: POST …/migrate {"worker"}. */
json_t *tether_migrate(const struct tether_config *cfg, const char *id,
                       const char *worker, struct tt_err *err)
{
	json_t *body = json_pack("{s:s}", "worker", worker ? worker : "");
	json_t *j;

	if (body == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	j = lc_post(cfg, id, "migrate", "", body, err);
	json_decref(body);
	return j;
}

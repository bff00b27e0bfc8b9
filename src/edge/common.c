/* Helpers shared by the HTTP edge and the streamed exec relay (see
 * edge_int.h): one copy of the route and capability logic both use. */
#include "edge/edge_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "cleanup.h"
#include "metrics.h"
#include "timefmt.h"
#include "urllist.h"

/* edge_route_take: ent's token moves into rt, the old one is wiped. */
void edge_route_take(struct edge_route *rt, struct route_entry *ent)
{
	edge_route_clear(rt);
	rt->token = tt_steal_ptr(&ent->token);
	rt->version = ent->version;
	rt->gen = ent->generation;
	rt->att = ent->activation;
	snprintf(rt->node_url, sizeof(rt->node_url), "%s", ent->node_url);
}

/* edge_route_clear: the token is a secret: wiped before it is freed. */
void edge_route_clear(struct edge_route *rt)
{
	if (rt->token) {
		sodium_memzero(rt->token, strlen(rt->token));
		free(rt->token);
		rt->token = NULL;
	}
}

/* edge_route_lookup: one place counts cache hits, waits and misses. */
int edge_route_lookup(struct routes *r, const unsigned char *kh,
                      const char *sbx, int retried, uint64_t rt_version,
                      struct route_waiter *w, struct route_entry *ent,
                      struct route_ticket *t)
{
	int v;

	if (retried)
		v = routes_repair_begin(r, kh, sbx, rt_version, tt_now(), w, ent, t);
	else
		v = routes_acquire(r, kh, sbx, tt_now(), w, ent, t);
	switch (v) {
	case ROUTE_USE:
		metrics_inc("tether_edge_capcache_total",
		            retried ? "result=\"reuse\"" : "result=\"hit\"");
		break;
	case ROUTE_WAIT:
		metrics_inc("tether_edge_capcache_total", "result=\"wait\"");
		break;
	case ROUTE_FETCH:
		metrics_inc("tether_edge_capcache_total",
		            retried ? "result=\"repair\"" : "result=\"miss\"");
		/* the caller fetches at once: the fetch is counted here */
		metrics_inc("tether_edge_cap_fetch_total",
		            retried ? "why=\"repair\"" : "why=\"miss\"");
		break;
	default:
		break;
	}
	return v;
}

/* edge_cap_parse: every field bounded and checked before it is used. */
int edge_cap_parse(json_t *j, struct route_entry *f)
{
	const char *tok = json_string_value(json_object_get(j, "token"));
	const char *exp = json_string_value(json_object_get(j, "expires_at"));
	const char *node = json_string_value(json_object_get(j, "node_url"));
	const char *wrk = json_string_value(json_object_get(j, "worker"));
	json_t *gen = json_object_get(j, "generation");
	json_t *att = json_object_get(j, "activation");

	memset(f, 0, sizeof(*f));
	if (tok == NULL || exp == NULL || node == NULL || !json_is_integer(gen) ||
	    json_integer_value(gen) < 1 || !json_is_integer(att) ||
	    json_integer_value(att) < 1 || json_integer_value(att) > UINT32_MAX ||
	    strncmp(node, "http://", 7) != 0 ||
	    strlen(node) >= sizeof(f->node_url) ||
	    rfc3339_parse(exp, strlen(exp), &f->expires_at, NULL) < 0)
		return -1;
	f->token = (char *)tok; /* borrowed: routes_commit copies */
	f->generation = (uint64_t)json_integer_value(gen);
	f->activation = (uint32_t)json_integer_value(att);
	snprintf(f->worker, sizeof(f->worker), "%s", wrk ? wrk : "");
	snprintf(f->node_url, sizeof(f->node_url), "%s", node);
	return 0;
}

/* edge_cap_commit: a fetch whose slot moved on still serves its caller. */
int edge_cap_commit(struct routes *r, const unsigned char *kh, const char *sbx,
                    const struct route_ticket *t, const struct route_entry *f,
                    struct route_entry *take)
{
	memset(take, 0, sizeof(*take));
	if (routes_commit(r, kh, sbx, t, f, take) == 0)
		return 0;
	route_entry_clear(take);
	*take = *f;
	take->token = strdup(f->token);
	if (take->token == NULL)
		return -1;
	take->version = 0;
	return 0;
}

/* edge_cap_request: the caller's own API key: the cp authenticates the
 * caller on every fetch. */
void edge_cap_request(CURL *c, const char *cp_url, const char *sbx,
                      const char *auth, int wait_s,
                      const struct edge_route *stale, struct curl_slist **hdrs)
{
	char url[512], line[600], body[256];
	int n;

	snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/capabilities", cp_url, sbx);
	snprintf(line, sizeof(line), "Authorization: %s", auth);
	*hdrs = curl_slist_append(NULL, line);
	sodium_memzero(line, sizeof(line));
	*hdrs = curl_slist_append(*hdrs, "Content-Type: application/json");
	*hdrs = curl_slist_append(*hdrs, "Expect:");
	snprintf(line, sizeof(line), "X-Tether-Wait: %d", wait_s);
	*hdrs = curl_slist_append(*hdrs, line);
	if (stale != NULL)
		n = snprintf(body, sizeof(body), "{\"purpose\":\"control\",\"ops\":"
		             EDGE_CAP_OPS ",\"stale\":{\"generation\":%" PRIu64
		             ",\"activation\":%" PRIu32 "}}", stale->gen, stale->att);
	else
		n = snprintf(body, sizeof(body), "{\"purpose\":\"control\",\"ops\":"
		             EDGE_CAP_OPS "}");
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
	curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)n);
	curl_easy_setopt(c, CURLOPT_COPYPOSTFIELDS, body);
}

/* ---- the control-plane replicas -------------------------------------- */

static struct urllist edge_cps;

/* edge_cp_set: see edge_int.h. */
int edge_cp_set(const char *csv, struct tt_err *err)
{
	return urllist_parse(&edge_cps, csv, err);
}

/* edge_cp_url: see edge_int.h. */
const char *edge_cp_url(void)
{
	return urllist_pick(&edge_cps, 1);
}

/* edge_cp_failed: see edge_int.h. */
int edge_cp_failed(CURL *e, CURLcode rc)
{
	if (!urllist_failed(&edge_cps, e, rc))
		return 0;
	if (edge_cps.n > 1)
		metrics_inc("tether_edge_cp_failovers_total", NULL);
	return 1;
}

/* edge_idem_key: see edge_int.h. */
void edge_idem_key(struct lws *wsi, char out[EDGE_IDEM_MAX + 1])
{
	static const char name[] = "idempotency-key:";
	static const char b32[] = "abcdefghijklmnopqrstuvwxyz234567";
	unsigned char rnd[17];
	int len = lws_hdr_custom_length(wsi, name, (int)sizeof(name) - 1);

	if (len > 0 && len <= EDGE_IDEM_MAX &&
	    lws_hdr_custom_copy(wsi, out, EDGE_IDEM_MAX + 1, name,
	                        (int)sizeof(name) - 1) == len &&
	    strspn(out, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	                "0123456789._:-") == (size_t)len)
		return;
	randombytes_buf(rnd, 16);
	rnd[16] = 0;
	memcpy(out, "idem_", 5);
	for (unsigned i = 0; i < 26; i++) { /* 5 bits each, 128 in all */
		unsigned bit = i * 5, v = rnd[bit / 8] | (unsigned)rnd[bit / 8 + 1] << 8;

		out[5 + i] = b32[(v >> (bit % 8)) & 31];
	}
	out[31] = '\0';
	sodium_memzero(rnd, sizeof(rnd));
}

/* edge_idem_eligible: see edge_int.h. */
bool edge_idem_eligible(const char *method, const char *path)
{
	const char *rest;

	if (strcmp(path, "/v1/sandboxes") == 0)
		return strcmp(method, "POST") == 0;
	if (strncmp(path, "/v1/sandboxes/", 14) != 0)
		return false;
	rest = strchr(path + 14, '/');
	if (rest == NULL)
		return strcmp(method, "DELETE") == 0;
	return strcmp(method, "POST") == 0 &&
	       (strcmp(rest, "/pause") == 0 || strcmp(rest, "/resume") == 0 ||
	        strcmp(rest, "/migrate") == 0 || strcmp(rest, "/capabilities") == 0);
}

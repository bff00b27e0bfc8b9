/* The status page at the edge (docs/API.md "Status page"). A browser logs
 * in once: POST /login with an API key (form field "key"), from a page of
 * this origin (the Origin header must name it); the edge checks the key
 * with the control plane (GET /v1/workers) and answers with a cookie that
 * holds a random session id, never the key: HttpOnly, SameSite=Strict,
 * Path=/, Secure when the connection is TLS. The session table lives here,
 * in memory: SHA-256 of each id (compared in constant time), the key the
 * edge asks the control plane with, and two expiries (idle, absolute).
 * GET /status/data answers only with a live session: workers, sandboxes
 * and recent lifecycle events from the control plane, and the edge's own
 * ring of recent operations with the admission decisions it saw
 * (src/edge/access.c). Nothing
 * changes state on a GET; POST /logout (same Origin check) ends the
 * session. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>
#include <sodium.h>
#include <uv.h>

#include "b64url.h"
#include "cleanup.h"
#include "edge/status.h"
#include "log.h"
#include "metrics.h"

#define ES_SESSIONS 64         /* sessions held at once (oldest evicted) */
#define ES_IDLE_S 1800         /* a session unused this long ends */
#define ES_LIFE_S 43200        /* and any after 12 h */
#define ES_COOKIE "tether_session"
#define ES_ID_BYTES 32
#define ES_KEY_MAX 512
#define ES_BODY_MAX 4096       /* the login form */
#define ES_ANSWER_MAX (8u << 20) /* one control-plane answer */
#define ES_FETCHES 3

/* One session: what the cookie's id stands for. */
struct es_session {
	int live;
	unsigned char hash[crypto_hash_sha256_BYTES]; /* of the cookie's id */
	char key[ES_KEY_MAX];  /* the API key the edge asks the cp with */
	int64_t created, used; /* monotonic seconds */
};

/* One control-plane transfer of a request. */
struct es_fetch {
	struct edge_status_req *r;
	CURL *easy;
	struct curl_slist *hdrs;
	char *buf;
	size_t len;
	int overflow;
};

enum es_kind { ES_LOGIN, ES_LOGOUT, ES_DATA };

struct edge_status_req {
	struct lws *wsi;           /* NULL once the connection is gone */
	enum es_kind kind;
	char rid[HTTP_RID_MAX + 1];
	char method[8];
	char path[32];
	uint64_t t0_us;
	char body[ES_BODY_MAX];
	size_t blen;
	int too_large;
	char key[ES_KEY_MAX];      /* login: the key tried; data: the session's */
	int slot;                  /* data: the session asked for */
	int pending;               /* transfers in flight */
	struct es_fetch f[ES_FETCHES];
	struct http_rxguard *rxg;
	/* the answer, once ready */
	int ready;
	unsigned status;
	const char *ctype;
	char *out;
	size_t out_len;
	char cookie[200];
};

static struct es_session es_tab[ES_SESSIONS];
static uv_loop_t *es_loop;
static struct httpc *es_hc;

/* es_now_us: monotonic microseconds. */
static uint64_t es_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* es_mono_s: monotonic seconds. */
static int64_t es_mono_s(void)
{
	return (int64_t)(es_now_us() / 1000000u);
}

/* es_session_drop: the slot is free again, its key wiped. */
static void es_session_drop(struct es_session *s)
{
	sodium_memzero(s, sizeof(*s));
}

/* es_gauge: tether_edge_status_sessions = sessions live now. */
static void es_gauge(void)
{
	int64_t n = 0;

	for (size_t i = 0; i < ES_SESSIONS; i++)
		n += es_tab[i].live;
	metrics_gauge_set("tether_edge_status_sessions", NULL, n);
}

/* es_expire: sessions past their idle or absolute bound end. */
static void es_expire(void)
{
	int64_t now = es_mono_s();

	for (size_t i = 0; i < ES_SESSIONS; i++)
		if (es_tab[i].live && (now - es_tab[i].used > ES_IDLE_S ||
		                       now - es_tab[i].created > ES_LIFE_S))
			es_session_drop(&es_tab[i]);
}

/* es_session_new: a session for key; its id (base64url) into id. The
 * oldest session makes room when the table is full. Slot, or -1. */
static int es_session_new(const char *key, char *id, size_t cap)
{
	unsigned char raw[ES_ID_BYTES];
	size_t slot = 0;

	es_expire();
	for (size_t i = 0; i < ES_SESSIONS; i++) {
		if (!es_tab[i].live) {
			slot = i;
			break;
		}
		if (es_tab[i].used < es_tab[slot].used)
			slot = i;
	}
	randombytes_buf(raw, sizeof(raw));
	if (b64url_encode(raw, sizeof(raw), id, cap) < 0)
		return -1;
	sodium_memzero(raw, sizeof(raw));
	es_session_drop(&es_tab[slot]);
	crypto_hash_sha256(es_tab[slot].hash, (const unsigned char *)id, strlen(id));
	snprintf(es_tab[slot].key, sizeof(es_tab[slot].key), "%s", key);
	es_tab[slot].created = es_tab[slot].used = es_mono_s();
	es_tab[slot].live = 1;
	es_gauge();
	return (int)slot;
}

/* es_cookie_id: the value of our cookie in the request's Cookie header
 * into id; -1 when there is none. */
static int es_cookie_id(struct lws *wsi, char *id, size_t cap)
{
	char hdr[8192];
	const char *p;
	size_t n;

	if (http_header(wsi, WSI_TOKEN_HTTP_COOKIE, hdr, sizeof(hdr)) <= 0)
		return -1;
	for (p = hdr; *p != '\0'; p += strcspn(p, ";"), p += *p == ';') {
		p += strspn(p, " \t");
		if (strncmp(p, ES_COOKIE "=", sizeof(ES_COOKIE)) != 0)
			continue;
		p += sizeof(ES_COOKIE);
		n = strcspn(p, "; \t");
		if (n == 0 || n >= cap)
			return -1;
		memcpy(id, p, n);
		id[n] = '\0';
		return 0;
	}
	return -1;
}

/* es_session_find: the live session the request's cookie names (its use
 * refreshed), or -1. */
static int es_session_find(struct lws *wsi)
{
	unsigned char h[crypto_hash_sha256_BYTES];
	char id[128];
	int found = -1;

	if (es_cookie_id(wsi, id, sizeof(id)) < 0)
		return -1;
	es_expire();
	crypto_hash_sha256(h, (const unsigned char *)id, strlen(id));
	for (size_t i = 0; i < ES_SESSIONS; i++)
		if (es_tab[i].live && sodium_memcmp(es_tab[i].hash, h, sizeof(h)) == 0)
			found = (int)i;
	if (found >= 0)
		es_tab[found].used = es_mono_s();
	es_gauge();
	return found;
}

/* es_origin_ok: the request's Origin is this very origin (scheme and
 * Host): a login or logout posted by a page of another site is refused
 * (CSRF), and so is one without an Origin. */
static int es_origin_ok(struct lws *wsi)
{
	char origin[512], host[300], want[320];

	if (http_header(wsi, WSI_TOKEN_ORIGIN, origin, sizeof(origin)) <= 0 ||
	    http_header(wsi, WSI_TOKEN_HOST, host, sizeof(host)) <= 0)
		return 0;
	snprintf(want, sizeof(want), "%s://%s", lws_is_ssl(wsi) ? "https" : "http",
	         host);
	return strcmp(origin, want) == 0;
}

/* es_write: the whole answer (headers, body) in one lws_write and the end
 * of the transaction; cookie: a Set-Cookie value, location: a redirect.
 * Returns the lws callback result. */
static int es_write(struct lws *wsi, unsigned status, const char *ctype,
                    const char *body, size_t len, const char *cookie,
                    const char *location)
{
	struct http_hdr h[6] = {
		{ "content-security-policy:", "default-src 'none'; script-src 'self'; "
		  "style-src 'self'; connect-src 'self'; img-src 'self'; "
		  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'" },
		{ "x-content-type-options:", "nosniff" },
		{ "x-frame-options:", "DENY" },
		/* not no-referrer: Chromium then sends "Origin: null" with
		 * the login form's POST, which the Origin check refuses */
		{ "referrer-policy:", "same-origin" },
	};
	size_t n = 4;

	if (cookie != NULL && cookie[0] != '\0')
		h[n++] = (struct http_hdr){ "set-cookie:", cookie };
	if (location != NULL)
		h[n++] = (struct http_hdr){ "location:", location };
	if (http_reply_with(wsi, status, ctype, body, len, h, n) < 0)
		return -1;
	return lws_http_transaction_completed(wsi) ? -1 : 0;
}

/* es_log: the access-log line of one of the page's requests. */
static void es_log(const char *rid, const char *method, const char *path,
                   long status, uint64_t t0_us, size_t in, size_t out)
{
	struct tt_access a = {
		.rid = rid, .method = method, .path = path, .status = status,
		.dur_us = es_now_us() - t0_us, .bytes_in = in, .bytes_out = out,
	};

	edge_access_log(&a);
}

/* es_login_page: the login form with msg (plain text, escaped) shown. */
static int es_login_page(struct lws *wsi, unsigned status, const char *msg,
                         const char *cookie)
{
	const char *mark = strstr(edge_status_login, "<!--MSG-->");
	_cleanup_free_ char *page = NULL;
	size_t cap, n;

	cap = strlen(edge_status_login) + 6 * strlen(msg) + 1;
	if (mark == NULL || (page = malloc(cap)) == NULL)
		return -1;
	n = (size_t)(mark - edge_status_login);
	memcpy(page, edge_status_login, n);
	for (const char *m = msg; *m; m++) {
		const char *e = *m == '<' ? "&lt;" : *m == '>' ? "&gt;" :
		                *m == '&' ? "&amp;" : *m == '"' ? "&quot;" : NULL;
		if (e != NULL) {
			memcpy(page + n, e, strlen(e));
			n += strlen(e);
		} else {
			page[n++] = *m;
		}
	}
	snprintf(page + n, cap - n, "%s", mark + strlen("<!--MSG-->"));
	return es_write(wsi, status, "text/html; charset=utf-8", page, strlen(page),
	                cookie, NULL);
}

/* es_req_free: releases r (no transfer in flight). */
static void es_req_free(struct edge_status_req *r)
{
	http_rxguard_stop(r->rxg);
	for (size_t i = 0; i < ES_FETCHES; i++) {
		free(r->f[i].buf);
		if (r->f[i].hdrs)
			curl_slist_free_all(r->f[i].hdrs);
	}
	free(r->out);
	sodium_memzero(r->key, sizeof(r->key));
	sodium_memzero(r->body, sizeof(r->body));
	free(r);
}

/* es_answer: the answer is ready; written when the connection is
 * writable. body is copied. */
static void es_answer(struct edge_status_req *r, unsigned status,
                      const char *ctype, const char *body)
{
	r->status = status;
	r->ctype = ctype;
	free(r->out);
	r->out = strdup(body ? body : "");
	r->out_len = r->out ? strlen(r->out) : 0;
	r->ready = 1;
	if (r->wsi != NULL)
		lws_callback_on_writable(r->wsi);
}

/* es_fetch_write: a control-plane answer's bytes, bounded. */
static size_t es_fetch_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct es_fetch *f = arg;
	size_t n = size * nmemb;
	char *nb;

	if (f->r->wsi == NULL)
		return 0; /* the browser went away */
	if (f->len + n > ES_ANSWER_MAX) {
		f->overflow = 1;
		return 0;
	}
	nb = realloc(f->buf, f->len + n + 1);
	if (nb == NULL)
		return 0;
	f->buf = nb;
	memcpy(f->buf + f->len, data, n);
	f->len += n;
	f->buf[f->len] = '\0';
	return n;
}

static void es_fetch_done(CURL *easy, CURLcode rc, void *arg);

/* es_fetch_start: GET cp PATH with the key as Bearer into r->f[i]. */
static int es_fetch_start(struct edge_status_req *r, size_t i, const char *path)
{
	struct es_fetch *f = &r->f[i];
	struct tt_err err = { 0 };
	char line[ES_KEY_MAX + 32], url[512];

	f->r = r;
	f->easy = curl_easy_init();
	if (f->easy == NULL)
		return -1;
	snprintf(url, sizeof(url), "%s%s", edge_cp_url(), path);
	snprintf(line, sizeof(line), "Authorization: Bearer %s", r->key);
	f->hdrs = curl_slist_append(NULL, line);
	sodium_memzero(line, sizeof(line));
	snprintf(line, sizeof(line), "X-Request-Id: %s", r->rid);
	f->hdrs = curl_slist_append(f->hdrs, line);
	curl_easy_setopt(f->easy, CURLOPT_URL, url);
	http_easy_direct(f->easy);
	curl_easy_setopt(f->easy, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
	curl_easy_setopt(f->easy, CURLOPT_TIMEOUT_MS, 20000L);
	curl_easy_setopt(f->easy, CURLOPT_HTTPHEADER, f->hdrs);
	curl_easy_setopt(f->easy, CURLOPT_WRITEFUNCTION, es_fetch_write);
	curl_easy_setopt(f->easy, CURLOPT_WRITEDATA, f);
	curl_easy_setopt(f->easy, CURLOPT_HTTPGET, 1L);
	if (httpc_start(es_hc, f->easy, es_fetch_done, f, &err) < 0) {
		curl_easy_cleanup(f->easy);
		f->easy = NULL;
		return -1;
	}
	r->pending++;
	return 0;
}

/* es_fetch_json: f's answer parsed (status 200 and a JSON object), else
 * NULL. */
static json_t *es_fetch_json(const struct es_fetch *f, long status)
{
	if (status != 200 || f->buf == NULL || f->overflow)
		return NULL;
	return json_loadb(f->buf, f->len, JSON_REJECT_DUPLICATES, NULL);
}

/* es_data_answer: the three answers in, the page's JSON composed. */
static void es_data_answer(struct edge_status_req *r, const long st[ES_FETCHES])
{
	json_t *w = es_fetch_json(&r->f[0], st[0]);
	json_t *s = es_fetch_json(&r->f[1], st[1]);
	json_t *ev = es_fetch_json(&r->f[2], st[2]);
	json_t *o;
	char *txt;

	if (st[0] == 401 || st[1] == 401) { /* the key was revoked */
		if (r->slot >= 0)
			es_session_drop(&es_tab[r->slot]);
		es_gauge();
		es_answer(r, 401, "application/json",
		          "{\"error\":\"unauthorized\",\"message\":\"the session's API key is no longer valid\"}");
	} else if (w == NULL || s == NULL) {
		es_answer(r, 502, "application/json",
		          "{\"error\":\"unavailable\",\"message\":\"the control plane did not answer\"}");
	} else {
		o = json_pack("{s:I,s:O,s:O,s:O,s:o}",
		              "now_ms", (json_int_t)(time(NULL) * 1000LL),
		              "workers", json_object_get(w, "workers"),
		              "sandboxes", json_object_get(s, "sandboxes"),
		              "events", ev ? json_object_get(ev, "events") : json_null(),
		              "operations", edge_access_recent());
		txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
		json_decref(o);
		if (txt != NULL)
			es_answer(r, 200, "application/json", txt);
		else
			es_answer(r, 500, "application/json", "{\"error\":\"internal\"}");
		free(txt);
	}
	json_decref(w);
	json_decref(s);
	json_decref(ev);
}

/* es_login_answer: the cp's verdict on the key tried. */
static void es_login_answer(struct edge_status_req *r, long status)
{
	char id[B64URL_ENCODED_LEN(ES_ID_BYTES) + 1];

	if (status != 200) {
		metrics_inc("tether_edge_status_logins_total",
		            status == 401 ? "result=\"refused\"" : "result=\"error\"");
		r->status = status == 401 ? 401 : 502;
		r->ready = 2; /* the login page again, with why */
		if (r->wsi != NULL)
			lws_callback_on_writable(r->wsi);
		return;
	}
	if (es_session_new(r->key, id, sizeof(id)) < 0) {
		es_answer(r, 500, "text/plain", "out of memory");
		return;
	}
	metrics_inc("tether_edge_status_logins_total", "result=\"ok\"");
	snprintf(r->cookie, sizeof(r->cookie), ES_COOKIE "=%s; Path=/; HttpOnly; "
	         "SameSite=Strict; Max-Age=%d%s", id, ES_LIFE_S,
	         r->wsi && lws_is_ssl(r->wsi) ? "; Secure" : "");
	sodium_memzero(id, sizeof(id));
	es_answer(r, 303, "text/plain", "logged in\n");
}

/* es_fetch_done: one transfer ended; the answer once all have. */
static void es_fetch_done(CURL *easy, CURLcode rc, void *arg)
{
	struct es_fetch *f = arg;
	struct edge_status_req *r = f->r;
	long st[ES_FETCHES] = { 0 };

	if (rc != CURLE_OK) /* a failed transfer's status is 0 */
		edge_cp_failed(easy, rc); /* the next page asks another replica */
	r->pending--;
	if (r->pending > 0)
		return;
	for (size_t i = 0; i < ES_FETCHES; i++) {
		if (r->f[i].easy == NULL)
			continue;
		curl_easy_getinfo(r->f[i].easy, CURLINFO_RESPONSE_CODE, &st[i]);
		curl_easy_cleanup(r->f[i].easy);
		r->f[i].easy = NULL;
	}
	if (r->wsi == NULL) {
		es_req_free(r);
		return;
	}
	if (r->kind == ES_LOGIN)
		es_login_answer(r, st[0]);
	else
		es_data_answer(r, st);
}

/* es_form_key: the "key" field of an urlencoded form body into out. */
static int es_form_key(const char *body, size_t len, char *out, size_t cap)
{
	const char *p = body, *end = body + len;
	size_t n = 0;

	while (p < end) {
		const char *amp = memchr(p, '&', (size_t)(end - p));
		const char *fe = amp ? amp : end;

		if (fe - p > 4 && strncmp(p, "key=", 4) == 0) {
			for (p += 4; p < fe; p++) {
				char c = *p;
				unsigned v;

				if (c == '%' && fe - p >= 3 && sscanf(p + 1, "%2x", &v) == 1) {
					c = (char)v;
					p += 2;
				} else if (c == '+') {
					c = ' ';
				}
				if (n + 1 >= cap || (unsigned char)c < 0x21 || c == 0x7f)
					return -1; /* keys are printable, no spaces */
				out[n++] = c;
			}
			out[n] = '\0';
			return 0;
		}
		p = fe + 1;
	}
	return -1;
}

/* es_post_go: a POST's body is in: the login checked with the cp, or
 * the logout done. */
static int es_post_go(struct lws *wsi, struct edge_status_req **sr)
{
	struct edge_status_req *r = *sr;
	int slot, rc;

	if (!es_origin_ok(wsi)) {
		es_log(r->rid, r->method, r->path, 403, r->t0_us, r->blen, 0);
		*sr = NULL;
		es_req_free(r);
		return es_write(wsi, 403, "text/plain", "cross-origin request refused\n",
		                29, NULL, NULL);
	}
	if (r->kind == ES_LOGOUT) {
		slot = es_session_find(wsi);
		if (slot >= 0)
			es_session_drop(&es_tab[slot]);
		es_gauge();
		es_log(r->rid, r->method, r->path, 303, r->t0_us, r->blen, 0);
		*sr = NULL;
		es_req_free(r);
		return es_write(wsi, 303, "text/plain", "logged out\n", 11,
		                ES_COOKIE "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
		                "/");
	}
	if (r->too_large || es_form_key(r->body, r->blen, r->key, sizeof(r->key)) < 0) {
		metrics_inc("tether_edge_status_logins_total", "result=\"malformed\"");
		es_log(r->rid, r->method, r->path, 400, r->t0_us, r->blen, 0);
		*sr = NULL;
		es_req_free(r);
		return es_login_page(wsi, 400, "Give an API key.", NULL);
	}
	sodium_memzero(r->body, sizeof(r->body));
	rc = es_fetch_start(r, 0, "/v1/workers");
	if (rc < 0) {
		*sr = NULL;
		es_req_free(r);
		return es_write(wsi, 500, "text/plain", "internal error\n", 15, NULL, NULL);
	}
	return 0;
}

/* edge_status_setup: see status.h. */
void edge_status_setup(uv_loop_t *loop, struct httpc *hc)
{
	es_loop = loop;
	es_hc = hc;
}

/* es_static: the page's fixed resources; NULL when uri is none of them. */
static const char *es_static(const char *uri, const char **ctype)
{
	if (strcmp(uri, "/status.js") == 0) {
		*ctype = "text/javascript; charset=utf-8";
		return edge_status_js;
	}
	if (strcmp(uri, "/status.css") == 0) {
		*ctype = "text/css; charset=utf-8";
		return edge_status_css;
	}
	return NULL;
}

/* edge_status_http: see status.h. */
int edge_status_http(struct lws *wsi, struct edge_status_req **sr,
                     const char *method, const char *uri)
{
	struct edge_status_req *r;
	const char *ctype = NULL, *body;
	char rid[HTTP_RID_MAX + 1];
	long long clen = -1;
	uint64_t t0 = es_now_us();
	int get = method != NULL && strcmp(method, "GET") == 0;
	int post = method != NULL && strcmp(method, "POST") == 0;
	struct tt_err gerr = { 0 };
	enum http_framing fr;
	int slot = -1;

	if (strcmp(uri, "/") != 0 && strcmp(uri, "/login") != 0 &&
	    strcmp(uri, "/logout") != 0 && strcmp(uri, "/status/data") != 0 &&
	    es_static(uri, &ctype) == NULL)
		return EDGE_STATUS_NOT_MINE;
	http_request_id(wsi, rid);
	if ((body = es_static(uri, &ctype)) != NULL || strcmp(uri, "/") == 0) {
		if (!get)
			return http_reply_error(wsi, 405, "method_not_allowed",
			                        "%s is not allowed on %s", method ? method : "?", uri);
		if (body != NULL)
			return es_write(wsi, 200, ctype, body, strlen(body), NULL, NULL);
		if (es_session_find(wsi) < 0)
			return es_login_page(wsi, 200, "", NULL);
		return es_write(wsi, 200, "text/html; charset=utf-8", edge_status_html,
		                strlen(edge_status_html), NULL, NULL);
	}
	if (strcmp(uri, "/status/data") == 0 ? !get : !post)
		return http_reply_error(wsi, 405, "method_not_allowed",
		                        "%s is not allowed on %s", method ? method : "?", uri);
	fr = http_body_framing(wsi, &clen);
	if (fr == HTTP_BODY_UNSIZED || fr == HTTP_BODY_BAD)
		return http_reply_error(wsi, fr == HTTP_BODY_UNSIZED ? 411 : 400,
		                        fr == HTTP_BODY_UNSIZED ? "length_required" : "bad_request",
		                        "request bodies need one Content-Length");
	if (clen >= ES_BODY_MAX) /* as the edge's own 413: before the body */
		return http_reply_error(wsi, 413, "too_large", "at most %d bytes", ES_BODY_MAX - 1);
	if (get && (slot = es_session_find(wsi)) < 0) {
		es_log(rid, "GET", uri, 401, t0, 0, 0);
		return http_reply_error(wsi, 401, "unauthorized",
		                        "log in first (POST /login)");
	}
	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	r->wsi = wsi;
	r->t0_us = t0;
	r->slot = -1;
	memcpy(r->rid, rid, sizeof(r->rid));
	snprintf(r->method, sizeof(r->method), "%s", method);
	snprintf(r->path, sizeof(r->path), "%s", uri);
	r->kind = get ? ES_DATA : strcmp(uri, "/login") == 0 ? ES_LOGIN : ES_LOGOUT;
	*sr = r;
	if (post && clen > 0)
		return 0; /* the body comes: edge_status_body */
	if (post)
		return es_post_go(wsi, sr);
	r->rxg = http_rxguard_start(es_loop, wsi, &gerr);
	r->slot = slot;
	snprintf(r->key, sizeof(r->key), "%s", es_tab[slot].key);
	if (es_fetch_start(r, 0, "/v1/workers") < 0 ||
	    es_fetch_start(r, 1, "/v1/sandboxes") < 0 ||
	    es_fetch_start(r, 2, "/v1/events?after=0") < 0) {
		if (r->pending == 0) {
			*sr = NULL;
			es_req_free(r);
			return http_reply_error(wsi, 500, "internal", "out of memory");
		}
	}
	return 0;
}

/* edge_status_body: see status.h. */
int edge_status_body(struct lws *wsi, struct edge_status_req **sr,
                     const void *in, size_t len)
{
	struct edge_status_req *r = *sr;

	(void)wsi;
	if (r == NULL || r->too_large)
		return 0;
	if (r->blen + len >= sizeof(r->body)) {
		r->too_large = 1;
		return 0;
	}
	memcpy(r->body + r->blen, in, len);
	r->blen += len;
	return 0;
}

/* edge_status_body_done: see status.h. */
int edge_status_body_done(struct lws *wsi, struct edge_status_req **sr)
{
	if (*sr == NULL || (*sr)->kind == ES_DATA || (*sr)->pending > 0 || (*sr)->ready)
		return 0;
	return es_post_go(wsi, sr);
}

/* edge_status_writable: see status.h. */
int edge_status_writable(struct lws *wsi, struct edge_status_req **sr)
{
	struct edge_status_req *r = *sr;
	int rc, close;

	if (r == NULL || !r->ready)
		return 0;
	*sr = NULL;
	es_log(r->rid, r->method, r->path, r->status, r->t0_us, r->blen, r->out_len);
	close = http_rxguard_stop(r->rxg);
	r->rxg = NULL;
	if (r->ready == 2)
		rc = es_login_page(wsi, r->status, r->status == 401 ? "That API key was refused."
		                   : "The control plane did not answer; try again.", NULL);
	else
		rc = es_write(wsi, r->status, r->ctype, r->out, r->out_len, r->cookie,
		              r->status == 303 ? "/" : NULL);
	es_req_free(r);
	return close ? -1 : rc;
}

/* edge_status_closed: see status.h. */
void edge_status_closed(struct edge_status_req **sr)
{
	struct edge_status_req *r = *sr;

	if (r == NULL)
		return;
	*sr = NULL;
	r->wsi = NULL;
	http_rxguard_stop(r->rxg);
	r->rxg = NULL;
	if (r->pending == 0)
		es_req_free(r);
}

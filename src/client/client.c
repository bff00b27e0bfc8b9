/* libtether: blocking calls to the edge (docs/API.md) over libcurl. One
 * easy handle per client, reset between calls so connections are reused.
 *
 * Recovery (SPEC §8), for the errors the library itself sees: the edge owns
 * route repair (RefreshRoute -> one rebuilt attempt), so a RefreshRoute or
 * Deny that reaches us is final. A transport failure talking to the edge is
 * retried once for idempotent reads (GET, and only if no byte reached the
 * caller's fd); calls that change state (exec, uploads, lifecycle) are never
 * repeated, and the error says whether the call may have run. */
#include "client/tether.h"

#include <stdbool.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <poll.h>

#include <curl/curl.h>
#include <libwebsockets.h>
#include <sodium.h>

#include "cleanup.h"
#include "client/internal.h"
#include "curlonce.h"
#include "wirecode.h"
#include "wsutil.h"

struct tether {
	struct tether_config cfg;
	CURL *easy;                              /* owned */
	char auth[TETHER_KEY_MAX + 32];          /* "Authorization: Bearer …" */
	char wait_hdr[32];                       /* "X-Tether-Wait: S" or "" */
	uint64_t generation;                     /* X-Tether-Generation of the last answer */
	bool direct;                             /* loopback edge: no proxy */
	tether_progress_fn progress;             /* see tether_set_progress */
	void *progress_arg;
};

/* url_is_loopback: the URL names localhost, 127.0.0.0/8 or ::1. A local
 * cluster is never reached through a proxy from the environment: libcurl
 * and libwebsockets would both send the API key to it. */
static bool url_is_loopback(const char *url)
{
	CURLU *u = curl_url();
	char *host = NULL;
	struct in_addr a4;
	bool yes = false;

	if (u != NULL && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
	    curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK)
		yes = strcasecmp(host, "localhost") == 0 || strcmp(host, "[::1]") == 0 ||
		      (inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127);
	curl_free(host);
	curl_url_cleanup(u);
	return yes;
}

/* tether_new: a client for cfg. */
struct tether *tether_new(const struct tether_config *cfg, struct tt_err *err)
{
	static int inited;
	struct tether *t;

	if (!inited) {
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
			tt_err_set(err, TT_ERR_SYS, "curl_global_init failed");
			return NULL;
		}
		inited = 1;
	}
	t = calloc(1, sizeof(*t));
	if (t == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	t->cfg = *cfg;
	t->direct = url_is_loopback(cfg->url);
	snprintf(t->auth, sizeof(t->auth), "Authorization: Bearer %s", cfg->api_key);
	if (cfg->wait[0] != '\0')
		snprintf(t->wait_hdr, sizeof(t->wait_hdr), "X-Tether-Wait: %.8s", cfg->wait);
	t->easy = curl_easy_init();
	if (t->easy == NULL) {
		tether_free(t);
		tt_err_set(err, TT_ERR_NOMEM, "curl_easy_init failed");
		return NULL;
	}
	return t;
}

/* tether_free: releases the handle and wipes the key. */
void tether_free(struct tether *t)
{
	if (t == NULL)
		return;
	if (t->easy)
		curl_easy_cleanup(t->easy);
	sodium_memzero(t, sizeof(*t));
	free(t);
}

/* sink_write: curl write callback; see struct sink. */
static size_t sink_write(char *data, size_t size, size_t nmemb, void *arg)
{
	struct sink *s = arg;
	size_t n = size * nmemb;
	long status = 0;

	curl_easy_getinfo(s->easy, CURLINFO_RESPONSE_CODE, &status);
	if (s->fd >= 0 && status >= 200 && status < 300) {
		size_t off = 0;
		while (off < n) {
			ssize_t w = write(s->fd, data + off, n - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0) {
				s->io_errno = errno;
				return 0;
			}
			off += (size_t)w;
		}
		s->fd_bytes += n;
		return n;
	}
	if (n > s->max - s->len) {
		s->overflow = 1;
		return 0;
	}
	if (s->len + n + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 4096;
		while (cap < s->len + n + 1)
			cap *= 2;
		char *nb = realloc(s->buf, cap);
		if (nb == NULL) {
			s->overflow = 1;
			return 0;
		}
		s->buf = nb;
		s->cap = cap;
	}
	memcpy(s->buf + s->len, data, n);
	s->len += n;
	s->buf[s->len] = '\0';
	return n;
}

/* source_read: curl read callback streaming from a descriptor. */
static size_t source_read(char *buf, size_t size, size_t nitems, void *arg)
{
	struct source *src = arg;
	size_t want = size * nitems;

	if (want > src->left)
		want = (size_t)src->left;
	if (want == 0)
		return 0;
	for (;;) {
		ssize_t n = read(src->fd, buf, want);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			src->io_errno = errno;
			return CURL_READFUNC_ABORT;
		}
		if (n == 0) { /* file shrank under us: do not send a short body */
			src->io_errno = EIO;
			return CURL_READFUNC_ABORT;
		}
		src->left -= (uint64_t)n;
		return (size_t)n;
	}
}

/* header_cb: picks X-Tether-Generation out of the answer headers. */
static size_t header_cb(char *data, size_t size, size_t nitems, void *arg)
{
	struct tether *t = arg;
	size_t n = size * nitems;
	static const char name[] = "x-tether-generation:";
	char num[32];
	size_t k = sizeof(name) - 1, j = 0;

	if (n <= k || strncasecmp(data, name, k) != 0)
		return n;
	while (k < n && (data[k] == ' ' || data[k] == '\t'))
		k++;
	while (k < n && j + 1 < sizeof(num) && data[k] >= '0' && data[k] <= '9')
		num[j++] = data[k++];
	num[j] = '\0';
	if (j > 0 && j < 20)
		t->generation = strtoull(num, NULL, 10);
	return n;
}

/* tether_set_progress: see tether.h. */
void tether_set_progress(struct tether *t, tether_progress_fn fn, void *arg)
{
	t->progress = fn;
	t->progress_arg = arg;
}

/* xfer_progress: curl's progress callback: the body going the way this
 * call streams (up for an upload, down otherwise) to the caller's hook. */
static int xfer_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow,
                         curl_off_t ultotal, curl_off_t ulnow)
{
	struct tether *t = arg;
	int up = ultotal > 0;

	return t->progress(t->progress_arg, (uint64_t)(up ? ulnow : dlnow),
	                   (uint64_t)(up ? ultotal : dltotal));
}

/* tether_last_generation: see tether.h. */
uint64_t tether_last_generation(const struct tether *t)
{
	return t->generation;
}

/* status_errc: maps an HTTP status to an error code. */
static enum tt_errc status_errc(long status)
{
	switch (status) {
	case 400: return TT_ERR_INVALID;
	case 401:
	case 403: return TT_ERR_DENIED;
	case 404: return TT_ERR_NOT_FOUND;
	case 409: return TT_ERR_CONFLICT;
	case 413: return TT_ERR_TOO_LARGE;
	default: return TT_ERR_TRANSPORT;
	}
}

/* answer_error: turns a non-2xx answer into err, using the server's
 * message (or the §4 decision) when the body has one. */
static int answer_error(long status, const char *body, size_t len,
                        struct tt_err *err)
{
	json_t *j = body ? json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL) : NULL;
	const char *msg = j ? json_string_value(json_object_get(j, "message")) : NULL;
	const char *code = j ? json_string_value(json_object_get(j, "error")) : NULL;
	const char *dec = j ? json_string_value(json_object_get(j, "decision")) : NULL;
	const char *reason = j ? json_string_value(json_object_get(j, "reason")) : NULL;
	enum tt_errc ec = status_errc(status);

	if (msg && msg[0])
		tt_err_set(err, ec, "%s", msg);
	else if (dec)
		tt_err_set(err, ec, "%s (%s)", dec, reason ? reason : "no reason");
	else if (code)
		tt_err_set(err, ec, "%s (HTTP %ld)", code, status);
	else
		tt_err_set(err, ec, "the server answered HTTP %ld", status);
	json_decref(j);
	return -1;
}

/* request_headers: the header list of one call (caller frees it with
 * headers_free), or NULL when out of memory. */
static struct curl_slist *request_headers(struct tether *t, const char *ctype)
{
	struct curl_slist *h = NULL, *n;
	const char *lines[] = { t->auth, "Expect:", ctype, /* Expect: no 1 s
	                                                     * 100-continue stall */
	                        t->wait_hdr[0] ? t->wait_hdr : NULL };

	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
		if (lines[i] == NULL)
			continue;
		n = curl_slist_append(h, lines[i]);
		if (n == NULL) {
			curl_slist_free_all(h);
			return NULL;
		}
		h = n;
	}
	return h;
}

/* headers_free: frees a header list, wiping the copy of the API key. */
static void headers_free(struct curl_slist *h)
{
	for (struct curl_slist *s = h; s; s = s->next)
		sodium_memzero(s->data, strlen(s->data));
	curl_slist_free_all(h);
}

/* tether_request_once: one attempt of c. The answer goes to sink; returns
 * the HTTP status (2xx) or -1 with err filled from the answer or the
 * transport; *transport: 1 never connected, 2 broke off before an answer,
 * 0 otherwise. */
static long tether_request_once(struct tether *t, const struct tether_call *c,
                                struct sink *sink, int *transport,
                                struct tt_err *err)
{
	_cleanup_free_ char *url = NULL;
	_cleanup_free_ char *payload = NULL;
	struct curl_slist *hdrs = NULL;
	struct curlonce_body once = { 0 };
	uint64_t src_left = c->src != NULL ? c->src->left : 0;
	char errbuf[CURL_ERROR_SIZE] = "";
	const char *method = c->method, *path = c->path;
	int is_get = strcmp(method, "GET") == 0;
	CURL *e = t->easy;
	CURLcode rc;
	long status = 0;

	*transport = 0;
	if (asprintf(&url, "%s%s", t->cfg.url, path) < 0) {
		url = NULL;
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	}
	if (c->body && (payload = json_dumps(c->body, JSON_COMPACT)) == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	hdrs = request_headers(t, c->body ? "Content-Type: application/json" :
	                          c->src ? "Content-Type: application/octet-stream" :
	                          NULL);
	if (hdrs == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	curl_easy_reset(e);
	t->generation = 0;
	sink->easy = e;
	if (payload) {
		curlonce_post(e, &once, payload, strlen(payload));
	} else if (c->src) {
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_READFUNCTION, source_read);
		curl_easy_setopt(e, CURLOPT_READDATA, c->src);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)c->src->left);
		curlonce_forbid_rewind(e);
	} else if (strcmp(method, "POST") == 0) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
	}
	curl_easy_setopt(e, CURLOPT_URL, url);
	if (t->direct)
		curl_easy_setopt(e, CURLOPT_PROXY, ""); /* "": none, env ignored */
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	if (is_get)
		curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink_write);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, sink);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
	if (c->timeout_s > 0)
		curl_easy_setopt(e, CURLOPT_TIMEOUT, c->timeout_s);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, header_cb);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
	if (t->progress != NULL) {
		curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, xfer_progress);
		curl_easy_setopt(e, CURLOPT_XFERINFODATA, t);
		curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
	}
	/* curl silently resends a request whose reused connection died before
	 * any answer: a body it cannot rewind (lib/curlonce.h) stops that; a
	 * call that changes state without a body gets a new connection */
	if (!is_get && payload == NULL && c->src == NULL)
		curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
	rc = curl_easy_perform(e);
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, NULL);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, NULL);
	headers_free(hdrs);
	if (c->src && c->src->io_errno) {
		errno = c->src->io_errno;
		return tt_err_sys(err, TT_ERR_IO, "cannot read the local file");
	}
	if (sink->io_errno) {
		errno = sink->io_errno;
		return tt_err_sys(err, TT_ERR_IO, "cannot write the local file");
	}
	if (sink->overflow)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "the answer exceeds %zu bytes",
		                  sink->max);
	if (rc != CURLE_OK) {
		if (status >= 300) /* the server refused while we were sending */
			return answer_error(status, sink->buf, sink->len, err);
		/* "never connected" only when no byte of the body went out:
		 * curl's own retry after a reused connection died reports its
		 * connect failure (lib/curlonce.h) */
		*transport = status == 0 ? ((rc == CURLE_COULDNT_CONNECT ||
		                             rc == CURLE_COULDNT_RESOLVE_HOST) &&
		                            !(payload != NULL && curlonce_sent(&once)) &&
		                            !(c->src != NULL && c->src->left != src_left) ? 1 : 2)
		                         : 0;
		if (*transport == 1)
			return tt_err_set(err, TT_ERR_TRANSPORT,
			                  "cannot reach %s (is 'tether up' running?)",
			                  t->cfg.url);
		return tt_err_set(err, TT_ERR_TRANSPORT, "%s %s: %s", method, path,
		                  errbuf[0] ? errbuf : curl_easy_strerror(rc));
	}
	if (status < 200 || status >= 300)
		return answer_error(status, sink->buf, sink->len, err);
	return status;
}

/* tether_request: see internal.h; the recovery rules at the top. */
long tether_request(struct tether *t, const struct tether_call *c,
                    struct sink *sink, struct tt_err *err)
{
	int transport = 0;
	long st = tether_request_once(t, c, sink, &transport, err);

	if (st >= 0 || transport == 0)
		return st;
	if (strcmp(c->method, "GET") == 0 && sink->fd_bytes == 0 &&
	    sink->io_errno == 0) {
		/* an idempotent read that never delivered a byte: once more */
		sink->len = 0;
		sink->overflow = 0;
		return tether_request_once(t, c, sink, &transport, err);
	}
	if (transport == 1) /* never connected: nothing was sent */
		return tt_err_set(err, TT_ERR_TRANSPORT, "cannot reach %s (is 'tether "
		                  "up' running?); the call did not start", t->cfg.url);
	return tt_err_set(err, TT_ERR_TRANSPORT, "%s %s: the connection to %s "
	                  "failed before an answer; the call may or may not have run "
	                  "and was not repeated", c->method, c->path, t->cfg.url);
}

/* tether_json_call: see internal.h. */
json_t *tether_json_call(struct tether *t, const struct tether_call *c,
                         size_t max, struct tt_err *err)
{
	struct sink s = { .fd = -1, .max = max };
	json_t *j = NULL;

	if (tether_request(t, c, &s, err) < 0)
		goto out;
	j = json_loadb(s.buf ? s.buf : "", s.len, JSON_REJECT_DUPLICATES, NULL);
	if (j == NULL || !json_is_object(j)) {
		json_decref(j);
		j = NULL;
		tt_err_set(err, TT_ERR_MALFORMED, "%s %s: the answer is not a JSON "
		           "object", c->method, c->path);
	}
out:
	free(s.buf);
	return j;
}

/* json_call: the common case, a bounded JSON call without a time bound. */
static json_t *json_call(struct tether *t, const char *method, const char *path,
                         json_t *body, size_t max, struct tt_err *err)
{
	struct tether_call c = { .method = method, .path = path, .body = body };

	return tether_json_call(t, &c, max, err);
}

/* tether_id_path: see internal.h. */
char *tether_id_path(struct tether *t, const char *id, const char *suffix,
                     struct tt_err *err)
{
	char *esc = curl_easy_escape(t->easy, id, 0);
	char *p = NULL;

	if (esc == NULL || asprintf(&p, "/v1/sandboxes/%s%s", esc, suffix) < 0) {
		p = NULL;
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	}
	curl_free(esc);
	return p;
}

/* file_path: "/v1/sandboxes/ID/files?path=P" with both escaped. */
static char *file_path(struct tether *t, const char *id, const char *path,
                       struct tt_err *err)
{
	char *esc = curl_easy_escape(t->easy, path, 0);
	char *suffix = NULL;
	char *p = NULL;

	if (esc == NULL || asprintf(&suffix, "/files?path=%s", esc) < 0) {
		curl_free(esc);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	curl_free(esc);
	p = tether_id_path(t, id, suffix, err);
	free(suffix);
	return p;
}

/* tether_create: POST /v1/sandboxes. */
json_t *tether_create(struct tether *t, const char *worker, struct tt_err *err)
{
	return tether_create_with(t, &(struct tether_create_opts){ .worker = worker }, err);
}

/* tether_create_with: POST /v1/sandboxes with o's fields that are set. */
json_t *tether_create_with(struct tether *t, const struct tether_create_opts *o,
                           struct tt_err *err)
{
	json_t *body = json_object();
	json_t *j;

	if (body == NULL ||
	    (o->worker != NULL && json_object_set_new(body, "worker", json_string(o->worker))) ||
	    (o->cpu != 0 && json_object_set_new(body, "cpu", json_integer(o->cpu))) ||
	    (o->substrate != NULL &&
	     json_object_set_new(body, "substrate", json_string(o->substrate)))) {
		json_decref(body);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	j = json_call(t, "POST", "/v1/sandboxes", body, TETHER_JSON_MAX, err);
	json_decref(body);
	return j;
}

/* tether_list: GET /v1/sandboxes. */
json_t *tether_list(struct tether *t, struct tt_err *err)
{
	return json_call(t, "GET", "/v1/sandboxes", NULL, TETHER_JSON_MAX, err);
}

/* tether_info: GET /v1/sandboxes/ID. */
json_t *tether_info(struct tether *t, const char *id, struct tt_err *err)
{
	_cleanup_free_ char *p = tether_id_path(t, id, "", err);

	if (p == NULL)
		return NULL;
	return json_call(t, "GET", p, NULL, TETHER_JSON_MAX, err);
}

/* tether_workers: GET /v1/workers. */
json_t *tether_workers(struct tether *t, struct tt_err *err)
{
	return json_call(t, "GET", "/v1/workers", NULL, TETHER_JSON_MAX, err);
}

/* tether_admin_rotate_keys: POST /v1/admin/rotate-keys (admin key). */
json_t *tether_admin_rotate_keys(struct tether *t, struct tt_err *err)
{
	return json_call(t, "POST", "/v1/admin/rotate-keys", NULL, TETHER_JSON_MAX, err);
}

/* tether_admin_keys: GET /v1/admin/keys (admin key). */
json_t *tether_admin_keys(struct tether *t, struct tt_err *err)
{
	return json_call(t, "GET", "/v1/admin/keys", NULL, TETHER_JSON_MAX, err);
}

/* tether_rm: DELETE /v1/sandboxes/ID. */
int tether_rm(struct tether *t, const char *id, struct tt_err *err)
{
	_cleanup_free_ char *p = tether_id_path(t, id, "", err);
	json_t *j;

	if (p == NULL)
		return -1;
	j = json_call(t, "DELETE", p, NULL, TETHER_JSON_MAX, err);
	if (j == NULL)
		return -1;
	json_decref(j);
	return 0;
}

/* tether_cap_issue: POST /v1/sandboxes/ID/capabilities. */
json_t *tether_cap_issue(struct tether *t, const char *id, json_t *req,
                         struct tt_err *err)
{
	_cleanup_free_ char *p = tether_id_path(t, id, "/capabilities", err);

	if (p == NULL)
		return NULL;
	return json_call(t, "POST", p, req, TETHER_JSON_MAX, err);
}

/* copy_bytes: a JSON string's bytes as an owned NUL-terminated buffer. */
static char *copy_bytes(json_t *s, size_t *len)
{
	const char *v = json_string_value(s);
	size_t n = v ? json_string_length(s) : 0;
	char *out = malloc(n + 1);

	if (out == NULL)
		return NULL;
	if (n)
		memcpy(out, v, n);
	out[n] = '\0';
	*len = n;
	return out;
}

/* cmd_fill: argv as the strings of the JSON array cmd (NULL: out of
 * memory, reported); 0 or -1 with err. */
static int cmd_fill(json_t *cmd, char *const argv[], struct tt_err *err)
{
	if (cmd == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	for (size_t i = 0; argv[i]; i++)
		if (json_array_append_new(cmd, json_string(argv[i])) < 0)
			return tt_err_set(err, TT_ERR_INVALID, "argument %zu is not UTF-8", i);
	return 0;
}

/* tether_exec: POST /v1/sandboxes/ID/exec {"cmd":argv}. */
int tether_exec(struct tether *t, const char *id, char *const argv[],
                struct tether_exec_result *res, struct tt_err *err)
{
	_cleanup_free_ char *p = tether_id_path(t, id, "/exec", err);
	json_t *cmd = json_array();
	json_t *body = NULL;
	json_t *j = NULL;
	json_t *code;
	int rc = -1;

	memset(res, 0, sizeof(*res));
	if (p == NULL || cmd_fill(cmd, argv, err) < 0)
		goto out;
	body = json_pack("{s:O}", "cmd", cmd);
	if (body == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		goto out;
	}
	j = json_call(t, "POST", p, body, TETHER_EXEC_OUT_MAX, err);
	if (j == NULL)
		goto out;
	code = json_object_get(j, "exit_code");
	if (!json_is_integer(code)) {
		tt_err_set(err, TT_ERR_MALFORMED, "exec answer has no exit_code");
		goto out;
	}
	res->exit_code = (int)json_integer_value(code);
	res->generation = (uint64_t)json_integer_value(json_object_get(j, "generation"));
	res->out = copy_bytes(json_object_get(j, "stdout"), &res->out_len);
	res->errout = copy_bytes(json_object_get(j, "stderr"), &res->err_len);
	if (res->out == NULL || res->errout == NULL) {
		tether_exec_result_free(res);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		goto out;
	}
	rc = 0;
out:
	json_decref(cmd);
	json_decref(body);
	json_decref(j);
	return rc;
}

/* tether_exec_result_free: frees the output buffers. */
void tether_exec_result_free(struct tether_exec_result *res)
{
	free(res->out);
	free(res->errout);
	res->out = res->errout = NULL;
	res->out_len = res->err_len = 0;
}

/* tether_file_put: PUT …/files?path=P, body streamed from fd. */
int tether_file_put(struct tether *t, const char *id, const char *path,
                    int fd, uint64_t size, uint64_t *written,
                    struct tt_err *err)
{
	_cleanup_free_ char *p = file_path(t, id, path, err);
	struct source src = { .fd = fd, .left = size };
	struct tether_call c = { .method = "PUT", .path = p, .src = &src };
	struct sink s = { .fd = -1, .max = TETHER_ERROR_MAX };
	json_t *j = NULL;
	int rc = -1;

	if (p == NULL)
		return -1;
	if (tether_request(t, &c, &s, err) < 0)
		goto out;
	/* A 2xx that does not confirm every byte is not a success: the file
	 * in the sandbox may be short or missing. */
	j = json_loadb(s.buf ? s.buf : "", s.len, JSON_REJECT_DUPLICATES, NULL);
	if (!json_is_integer(json_object_get(j, "bytes")) ||
	    (uint64_t)json_integer_value(json_object_get(j, "bytes")) != size) {
		tt_err_set(err, TT_ERR_MALFORMED, "the upload's answer does not confirm %llu bytes",
		           (unsigned long long)size);
		goto out;
	}
	if (written)
		*written = size;
	rc = 0;
out:
	json_decref(j);
	free(s.buf);
	return rc;
}

/* tether_file_get: GET …/files?path=P, body streamed into fd. */
int tether_file_get(struct tether *t, const char *id, const char *path,
                    int fd, uint64_t *got, struct tt_err *err)
{
	_cleanup_free_ char *p = file_path(t, id, path, err);
	struct tether_call c = { .method = "GET", .path = p };
	struct sink s = { .fd = fd, .max = TETHER_ERROR_MAX };
	int rc = -1;

	if (p == NULL)
		return -1;
	if (tether_request(t, &c, &s, err) < 0)
		goto out;
	if (got)
		*got = s.fd_bytes;
	rc = 0;
out:
	free(s.buf);
	return rc;
}

/* ---- streamed exec over WebSocket ---------------------------------------- */

#define XS_PROTOCOL "tether.exec.v1"
#define XS_TEXT_MAX (64u << 10)     /* one server text message */
#define XS_IN_CHUNK (64u << 10)     /* stdin bytes per message */
#define XS_IN_HIGH (1u << 20)       /* stop reading stdin above this */
#define XS_STDIN_POLL_US (10 * LWS_US_PER_MS)

/* State of one streamed exec (on the caller's stack; the lws context user). */
struct xs {
	const struct tether_exec_stream *s;
	const char *auth;          /* "Bearer …" (borrowed, secret) */
	const char *wait;          /* X-Tether-Wait seconds, "" = none (borrowed) */
	char *start;               /* the start message (owned) */
	struct lws_context *ctx;
	struct lws *wsi;
	struct ws_queue q;         /* client messages waiting for lws */
	char text[XS_TEXT_MAX + 1]; /* text message being assembled */
	size_t text_len;
	int in_binary;             /* inside a binary message */
	int bin_tag;               /* its stream (1/2) */
	int allowed, done, stdin_eof, failed;
	int exit_code;
	uint64_t generation;
	unsigned close_code;
	lws_sorted_usec_list_t sul;
	struct tt_err *err;
};

/* xs_queue: queues one message (copied) and asks for a write. */
static int xs_queue(struct xs *x, enum lws_write_protocol kind,
                    const void *data, size_t len)
{
	if (ws_queue_push(&x->q, kind, 0, data, len) < 0)
		return -1;
	if (x->wsi)
		lws_callback_on_writable(x->wsi);
	return 0;
}

/* xs_fail: the first failure wins; the stream ends. */
static void xs_fail(struct xs *x, enum tt_errc code, const char *msg)
{
	if (!x->failed && x->exit_code < 0)
		tt_err_set(x->err, code, "%s", msg);
	x->failed = 1;
	x->done = 1;
}

/* xs_stdin_poll: forwards what stdin has now (never blocks the loop on a
 * pipe or terminal), then polls again while stdin is open. */
static void xs_stdin_poll(lws_sorted_usec_list_t *sul)
{
	struct xs *x = lws_container_of(sul, struct xs, sul);
	unsigned char buf[XS_IN_CHUNK];
	struct pollfd pfd = { .fd = x->s->stdin_fd, .events = POLLIN };
	ssize_t n;

	if (x->done || x->stdin_eof)
		return;
	while (x->q.bytes < XS_IN_HIGH && poll(&pfd, 1, 0) > 0) {
		n = read(x->s->stdin_fd, buf, sizeof(buf));
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			break;
		if (n <= 0) {
			x->stdin_eof = 1;
			if (xs_queue(x, LWS_WRITE_TEXT, "{\"type\":\"eof\"}", 14) < 0)
				xs_fail(x, TT_ERR_NOMEM, "out of memory");
			return;
		}
		if (xs_queue(x, LWS_WRITE_BINARY, buf, (size_t)n) < 0) {
			xs_fail(x, TT_ERR_NOMEM, "out of memory");
			return;
		}
	}
	lws_sul_schedule(x->ctx, 0, &x->sul, xs_stdin_poll, XS_STDIN_POLL_US);
}

/* xs_text: one complete server text message: decision, exit or error. */
static void xs_text(struct xs *x)
{
	json_error_t jerr;
	json_t *j = json_loadb(x->text, x->text_len, JSON_REJECT_DUPLICATES, &jerr);
	const char *type = json_string_value(json_object_get(j, "type"));
	char msg[512];

	if (type == NULL) {
		xs_fail(x, TT_ERR_MALFORMED, "the edge sent an invalid stream message");
	} else if (strcmp(type, "decision") == 0) {
		const char *d = json_string_value(json_object_get(j, "decision"));
		const char *r = json_string_value(json_object_get(j, "reason"));

		if (d != NULL && strcmp(d, "allow") == 0) {
			x->allowed = 1;
			if (x->s->stdin_fd >= 0)
				xs_stdin_poll(&x->sul);
		} else {
			snprintf(msg, sizeof(msg), "%s: %s (the command did not run)",
			         d ? d : "refused", r ? r : "no reason given");
			xs_fail(x, d && strcmp(d, "refresh_route") == 0 ? TT_ERR_CONFLICT
			                                               : TT_ERR_DENIED, msg);
		}
	} else if (strcmp(type, "exit") == 0) {
		json_t *c = json_object_get(j, "exit_code");

		/* an exit status is a byte, and comes only after an Allow: a
		 * server that says otherwise is not believed */
		if (!json_is_integer(c) || json_integer_value(c) < 0 ||
		    json_integer_value(c) > 255) {
			xs_fail(x, TT_ERR_MALFORMED, "exit message without a valid exit_code");
		} else if (!x->allowed) {
			xs_fail(x, TT_ERR_MALFORMED, "the edge sent an exit before the decision");
		} else {
			x->exit_code = (int)json_integer_value(c);
			x->generation = (uint64_t)json_integer_value(json_object_get(j, "generation"));
			x->done = 1;
		}
	} else if (strcmp(type, "error") == 0) {
		const char *e = json_string_value(json_object_get(j, "error"));
		const char *m = json_string_value(json_object_get(j, "message"));

		snprintf(msg, sizeof(msg), "%s: %s", e ? e : "error", m ? m : "stream failed");
		xs_fail(x, wirecode_parse(e) == WIRE_E_TRANSPORT ? TT_ERR_TRANSPORT : TT_ERR_IO, msg);
	}
	json_decref(j);
}

/* xs_receive: a piece of a server message. Binary: first byte of a message
 * says stdout (1) or stderr (2). Text: assembled (bounded), then parsed. */
static int xs_receive(struct lws *wsi, struct xs *x, const unsigned char *in,
                      size_t len)
{
	int final = lws_is_final_fragment(wsi);

	if (lws_frame_is_binary(wsi)) {
		if (!x->in_binary) {
			if (len == 0)
				return 0;
			x->bin_tag = in[0];
			in++;
			len--;
			x->in_binary = 1;
		}
		if (final)
			x->in_binary = 0;
		if (x->bin_tag != 1 && x->bin_tag != 2) {
			xs_fail(x, TT_ERR_MALFORMED, "the edge sent an unknown output stream");
			return -1;
		}
		if (!x->allowed) {
			xs_fail(x, TT_ERR_MALFORMED, "the edge sent output before the decision");
			return -1;
		}
		if (len > 0 && x->s->on_output(x->s->arg, x->bin_tag, in, len) < 0) {
			xs_fail(x, TT_ERR_IO, "cannot write the output");
			return -1;
		}
		return 0;
	}
	if (x->text_len + len > XS_TEXT_MAX) {
		xs_fail(x, TT_ERR_TOO_LARGE, "stream message too large");
		return -1;
	}
	memcpy(x->text + x->text_len, in, len);
	x->text_len += len;
	if (final) {
		xs_text(x);
		x->text_len = 0;
	}
	return 0;
}

/* xs_callback: the lws client callback of one streamed exec. */
static int xs_callback(struct lws *wsi, enum lws_callback_reasons reason,
                       void *user, void *in, size_t len)
{
	struct xs *x = lws_context_user(lws_get_context(wsi));
	int rc;

	(void)user;
	switch (reason) {
	case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
		unsigned char **p = in, *end = *p + len;

		if (lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION,
		                                 (const unsigned char *)x->auth,
		                                 (int)strlen(x->auth), p, end))
			return -1;
		if (x->wait[0] != '\0' &&
		    lws_add_http_header_by_name(wsi, (const unsigned char *)"x-tether-wait:",
		                                (const unsigned char *)x->wait,
		                                (int)strlen(x->wait), p, end))
			return -1;
		return 0;
	}
	case LWS_CALLBACK_CLIENT_ESTABLISHED:
		if (xs_queue(x, LWS_WRITE_TEXT, x->start, strlen(x->start)) < 0) {
			xs_fail(x, TT_ERR_NOMEM, "out of memory");
			return -1;
		}
		return 0;
	case LWS_CALLBACK_CLIENT_RECEIVE:
		return xs_receive(wsi, x, in, len);
	case LWS_CALLBACK_CLIENT_WRITEABLE:
		rc = ws_queue_write(&x->q, wsi);
		if (rc < 0) {
			xs_fail(x, TT_ERR_TRANSPORT, "write to the edge failed");
			return -1;
		}
		if (rc == 1 && x->q.head)
			lws_callback_on_writable(wsi);
		return 0;
	case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
		if (len >= 2)
			x->close_code = ((unsigned)((unsigned char *)in)[0] << 8) |
			                ((unsigned char *)in)[1];
		return 0;
	case LWS_CALLBACK_CLIENT_CONNECTION_ERROR: {
		char msg[300];

		snprintf(msg, sizeof(msg), "cannot open the exec stream: %s",
		         in ? (const char *)in : "connection failed");
		x->wsi = NULL;
		xs_fail(x, TT_ERR_TRANSPORT, msg);
		return 0;
	}
	case LWS_CALLBACK_CLIENT_CLOSED:
		x->wsi = NULL;
		if (!x->done) {
			char msg[200];

			snprintf(msg, sizeof(msg), "the exec stream broke off (close "
			         "code %u); the command may or may not have run and was "
			         "not repeated", x->close_code);
			xs_fail(x, TT_ERR_TRANSPORT, msg);
		}
		x->done = 1;
		return 0;
	default:
		return 0;
	}
}

/* tether_exec_stream: see tether.h. */
int tether_exec_stream(struct tether *t, const char *id, char *const argv[],
                       const struct tether_exec_stream *s, int *exit_code,
                       uint64_t *generation, struct tt_err *err)
{
	static const struct lws_protocols protocols[] = {
		{ XS_PROTOCOL, xs_callback, 0, 65536, 0, NULL, 0 },
		{ NULL, NULL, 0, 0, 0, NULL, 0 },
	};
	struct lws_context_creation_info info;
	struct lws_client_connect_info cc;
	char url[TETHER_URL_MAX], full[TETHER_URL_MAX + 256];
	const char *prot, *host, *upath;
	_cleanup_free_ char *p = tether_id_path(t, id, "/exec/ws", err);
	json_t *cmd = json_array(), *start = NULL;
	struct xs x;
	int port, rc = -1;

	memset(&x, 0, sizeof(x));
	x.s = s;
	x.err = err;
	x.exit_code = -1;
	x.auth = t->auth + strlen("Authorization: ");
	x.wait = t->cfg.wait;
	if (p == NULL || cmd_fill(cmd, argv, err) < 0)
		goto out;
	start = json_pack("{s:O,s:b}", "cmd", cmd, "stdin", s->stdin_fd >= 0);
	x.start = start ? json_dumps(start, JSON_COMPACT) : NULL;
	if (x.start == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		goto out;
	}
	snprintf(url, sizeof(url), "%s", t->cfg.url);
	if (lws_parse_uri(url, &prot, &host, &port, &upath) != 0 ||
	    (strcmp(prot, "http") != 0 && strcmp(prot, "https") != 0)) {
		tt_err_set(err, TT_ERR_INVALID, "bad edge URL %s", t->cfg.url);
		goto out;
	}
	/* lws_parse_uri drops the leading '/' of the path prefix */
	snprintf(full, sizeof(full), "%s%s%s", upath[0] ? "/" : "", upath, p);
	lws_set_log_level(0, NULL); /* errors come back through err */
	memset(&info, 0, sizeof(info));
	info.port = CONTEXT_PORT_NO_LISTEN;
	info.protocols = protocols;
	info.user = &x;
	info.options = strcmp(prot, "https") == 0 ? LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT : 0;
	/* lws reads http_proxy when it has none given: "" (rejected, so
	 * none is set) keeps a loopback edge direct */
	if (t->direct)
		info.http_proxy_address = "";
	x.ctx = lws_create_context(&info);
	if (x.ctx == NULL) {
		tt_err_set(err, TT_ERR_SYS, "cannot create the WebSocket client");
		goto out;
	}
	ws_connect_info(&cc, x.ctx, host, port, full, XS_PROTOCOL);
	cc.ssl_connection = strcmp(prot, "https") == 0 ? LCCSCF_USE_SSL : 0;
	cc.pwsi = &x.wsi;
	if (lws_client_connect_via_info(&cc) == NULL && !x.done) {
		tt_err_set(err, TT_ERR_TRANSPORT, "cannot connect to %s", t->cfg.url);
		lws_context_destroy(x.ctx);
		goto out;
	}
	while (!x.done)
		if (lws_service(x.ctx, 0) < 0)
			break;
	lws_sul_cancel(&x.sul);
	if (x.wsi != NULL)
		lws_set_timeout(x.wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_SYNC);
	lws_context_destroy(x.ctx);
	if (!x.failed && x.exit_code >= 0) {
		*exit_code = x.exit_code;
		if (generation)
			*generation = x.generation;
		t->generation = x.generation;
		rc = 0;
	} else if (!x.failed) {
		tt_err_set(err, TT_ERR_TRANSPORT, "the exec stream ended without an exit status");
	}
out:
	ws_queue_clear(&x.q);
	free(x.start);
	json_decref(start);
	json_decref(cmd);
	return rc;
}

/* lib/http.c against itself: a real lws server and a real libcurl multi
 * client on one libuv loop, in one process, over a real TCP socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "http.h"
#include "metrics.h"

/* LeakSanitizer: lws 4.1.6 keeps an internal realloc'd buffer per context
 * created on a foreign libuv loop after lws_context_destroy; that is the
 * library's, not ours. Only frames inside libwebsockets.so are ignored. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
	return "leak:libwebsockets.so\n";
}

/* Per-connection state of the test server (lws allocates it). */
struct tsess {
	struct http_body body;
	char path[128];
	int too_large;
};

/* The deferred (long-poll style) reply waiting for its timer. */
static struct lws *slow_wsi;
static uv_timer_t slow_timer;

/* slow_fire: asks lws for a writable callback, the only place to reply. */
static void slow_fire(uv_timer_t *t)
{
	(void)t;
	if (slow_wsi != NULL)
		lws_callback_on_writable(slow_wsi);
}

/* tserver_cb: echo JSON, errors, a deferred reply and a size limit. */
static int tserver_cb(struct lws *wsi, enum lws_callback_reasons reason,
                      void *user, void *in, size_t len)
{
	struct tsess *s = user;
	struct tt_err err = { 0 };
	char q[64];

	switch (reason) {
	case LWS_CALLBACK_HTTP:
		snprintf(s->path, sizeof(s->path), "%s", (const char *)in);
		memset(&s->body, 0, sizeof(s->body));
		s->body.max = 1024;
		s->too_large = 0;
		if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0)
			return 0; /* wait for the body */
		if (strcmp(s->path, "/hello") == 0) {
			int n = http_query(wsi, "name", q, sizeof(q));
			return http_reply_json(wsi, 200, json_pack("{s:s%}",
			        "hello", n >= 0 ? q : "", (size_t)(n >= 0 ? n : 0)));
		}
		if (strcmp(s->path, "/close") == 0) {
			/* Answer, then drop the keep-alive connection. */
			http_reply_json(wsi, 200, json_pack("{s:b}", "bye", 1));
			return -1;
		}
		if (strcmp(s->path, "/framing") == 0) {
			long long l;
			enum http_framing fr = http_body_framing(wsi, &l);

			return http_reply_json(wsi, 200, json_pack("{s:i,s:I}",
			        "framing", (int)fr, "len", (json_int_t)l));
		}
		if (strcmp(s->path, "/slow") == 0) {
			slow_wsi = wsi;
			uv_timer_start(&slow_timer, slow_fire, 50, 0);
			return 0;
		}
		return http_reply_error(wsi, 404, "not_found", "no route %s",
		                        s->path);
	case LWS_CALLBACK_HTTP_WRITEABLE:
		if (wsi == slow_wsi) {
			slow_wsi = NULL;
			return http_reply_json(wsi, 200, json_pack("{s:b}",
			                                           "late", 1));
		}
		return 0;
	case LWS_CALLBACK_HTTP_BODY:
		if (!s->too_large &&
		    http_body_append(&s->body, in, len, &err) < 0)
			s->too_large = 1;
		return 0;
	case LWS_CALLBACK_HTTP_BODY_COMPLETION: {
		json_t *obj;

		if (s->too_large) {
			http_body_free(&s->body);
			return http_reply_error(wsi, 413, "too_large",
			                        "body over 1024 bytes");
		}
		obj = http_body_json(&s->body, &err);
		http_body_free(&s->body);
		if (obj == NULL)
			return http_reply_error(wsi, 400, "bad_request", "%s",
			                        err.msg);
		return http_reply_json(wsi, 201, json_pack("{s:o}", "echo", obj));
	}
	case LWS_CALLBACK_CLOSED_HTTP:
		if (wsi == slow_wsi)
			slow_wsi = NULL;
		http_body_free(&s->body);
		return 0;
	default:
		break;
	}
	return http_callback_default(wsi, reason, user, in, len);
}

static const struct lws_protocols tprotos[] = {
	{ "http", tserver_cb, sizeof(struct tsess), 0, 0, NULL, 0 },
	{ NULL, NULL, 0, 0, 0, NULL, 0 }
};

/* One client request and what came back. */
struct treq {
	CURL *easy;
	struct curl_slist *hdrs;
	char *resp;
	size_t resp_len;
	long status;
	CURLcode rc;
	int done;
	int *remaining; /* for the sequential chain, else NULL */
};

struct tfix {
	uv_loop_t loop;
	struct lws_context *ctx;
	struct httpc *hc;
	int port;
};

/* treq_write: collects the response body. */
static size_t treq_write(char *p, size_t sz, size_t n, void *arg)
{
	struct treq *r = arg;
	char *nb = realloc(r->resp, r->resp_len + sz * n + 1);

	if (nb == NULL)
		return 0;
	r->resp = nb;
	memcpy(r->resp + r->resp_len, p, sz * n);
	r->resp_len += sz * n;
	r->resp[r->resp_len] = '\0';
	return sz * n;
}

/* treq_done: httpc done callback; records the outcome. */
static void treq_done(CURL *easy, CURLcode rc, void *arg)
{
	struct treq *r = arg;

	r->rc = rc;
	curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &r->status);
	r->done = 1;
}

/* treq_setup: an easy handle for METHOD path [body]. */
static void treq_setup(struct tfix *f, struct treq *r, const char *path,
                       const char *body, size_t body_len)
{
	static char url[HTTP_URI_MAX * 4 + 64]; /* curl copies it */

	memset(r, 0, sizeof(*r));
	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", f->port, path);
	r->easy = curl_easy_init();
	assert_non_null(r->easy);
	curl_easy_setopt(r->easy, CURLOPT_URL, url);
	curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, treq_write);
	curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, 5000L);
	if (body != NULL) {
		r->hdrs = curl_slist_append(NULL,
		                            "Content-Type: application/json");
		curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->hdrs);
		curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE, (long)body_len);
		curl_easy_setopt(r->easy, CURLOPT_COPYPOSTFIELDS, body);
	}
}

/* treq_clean: releases what treq_setup made. */
static void treq_clean(struct treq *r)
{
	curl_easy_cleanup(r->easy);
	curl_slist_free_all(r->hdrs);
	free(r->resp);
	memset(r, 0, sizeof(*r));
}

/* treq_run: starts r and spins the loop until it is done. */
static void treq_run(struct tfix *f, struct treq *r)
{
	struct tt_err err = { 0 };

	assert_int_equal(httpc_start(f->hc, r->easy, treq_done, r, &err), 0);
	while (!r->done)
		uv_run(&f->loop, UV_RUN_ONCE);
}

/* setup: loop + server on an ephemeral port + client. */
static int setup(void **state)
{
	struct tfix *f = calloc(1, sizeof(*f));
	struct tt_err err = { 0 };

	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	uv_timer_init(&f->loop, &slow_timer);
	f->ctx = http_server_new(&f->loop, "127.0.0.1", 0, tprotos, NULL, &err);
	assert_non_null(f->ctx);
	f->port = lws_get_vhost_listen_port(
	        lws_get_vhost_by_name(f->ctx, "default"));
	assert_true(f->port > 0);
	f->hc = httpc_new(&f->loop, &err);
	assert_non_null(f->hc);
	*state = f;
	return 0;
}

/* teardown: everything closes and the loop ends empty. */
static int teardown(void **state)
{
	struct tfix *f = *state;

	httpc_free(f->hc);
	http_server_free(f->ctx);
	uv_close((uv_handle_t *)&slow_timer, NULL);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	free(f);
	return 0;
}

/* GET with a URL-decoded query parameter, and a similar-named one that
 * must not be confused with it. */
static void test_get_json(void **state)
{
	struct tfix *f = *state;
	struct treq r;

	treq_setup(f, &r, "/hello?names=no&name=w%20x", NULL, 0);
	treq_run(f, &r);
	assert_int_equal(r.rc, CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.resp, "{\"hello\":\"w x\"}");
	treq_clean(&r);

	treq_setup(f, &r, "/nope", NULL, 0);
	treq_run(f, &r);
	assert_int_equal(r.status, 404);
	assert_non_null(strstr(r.resp, "\"error\":\"not_found\""));
	treq_clean(&r);
}

/* POST JSON echoed back; malformed and duplicate-key JSON refused. */
static void test_post_json(void **state)
{
	struct tfix *f = *state;
	struct treq r;
	const char *ok = "{\"a\":[1,2],\"b\":\"c\"}";
	const char *dup = "{\"a\":1,\"a\":2}";

	treq_setup(f, &r, "/echo", ok, strlen(ok));
	treq_run(f, &r);
	assert_int_equal(r.status, 201);
	assert_string_equal(r.resp, "{\"echo\":{\"a\":[1,2],\"b\":\"c\"}}");
	treq_clean(&r);

	treq_setup(f, &r, "/echo", "{\"a\":", 5);
	treq_run(f, &r);
	assert_int_equal(r.status, 400);
	assert_non_null(strstr(r.resp, "bad_request"));
	treq_clean(&r);

	treq_setup(f, &r, "/echo", dup, strlen(dup));
	treq_run(f, &r);
	assert_int_equal(r.status, 400);
	treq_clean(&r);

	treq_setup(f, &r, "/echo", "[1]", 3);
	treq_run(f, &r);
	assert_int_equal(r.status, 400);
	treq_clean(&r);
}

/* A body over the bound is refused with 413, and the server still
 * answers afterwards. */
static void test_oversized(void **state)
{
	struct tfix *f = *state;
	struct treq r;
	char big[4096];

	memset(big, ' ', sizeof(big));
	big[0] = '{';
	big[sizeof(big) - 1] = '}';
	treq_setup(f, &r, "/echo", big, sizeof(big));
	treq_run(f, &r);
	assert_int_equal(r.status, 413);
	assert_non_null(strstr(r.resp, "too_large"));
	treq_clean(&r);

	treq_setup(f, &r, "/echo", "{}", 2);
	treq_run(f, &r);
	assert_int_equal(r.status, 201);
	treq_clean(&r);
}

/* A reply written later from the loop (long-poll pattern). */
static void test_deferred(void **state)
{
	struct tfix *f = *state;
	struct treq r;

	treq_setup(f, &r, "/slow", NULL, 0);
	treq_run(f, &r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.resp, "{\"late\":true}");
	treq_clean(&r);
}

/* 100 sequential requests (same easy handle reused: keep-alive). */
static void test_sequential(void **state)
{
	struct tfix *f = *state;
	struct treq r;

	treq_setup(f, &r, "/hello?name=x", NULL, 0);
	for (int i = 0; i < 100; i++) {
		free(r.resp);
		r.resp = NULL;
		r.resp_len = 0;
		r.done = 0;
		treq_run(f, &r);
		assert_int_equal(r.rc, CURLE_OK);
		assert_int_equal(r.status, 200);
		assert_string_equal(r.resp, "{\"hello\":\"x\"}");
	}
	treq_clean(&r);
}

/* What count_polls looks for: client sockets to port (lws' own server
 * sockets on the same loop are uv_poll_t handles too). */
struct pollcount {
	int port;
	int n;
	int fd; /* the last one seen */
};

/* uv_walk visitor: counts live (not closing) uv_poll_t handles whose
 * socket is connected TO the test server, i.e. httpc's watchers. */
static void count_polls(uv_handle_t *h, void *arg)
{
	struct pollcount *pc = arg;
	struct sockaddr_in sa;
	socklen_t sl = sizeof(sa);
	uv_os_fd_t fd;

	if (h->type != UV_POLL || uv_is_closing(h) || uv_fileno(h, &fd) != 0)
		return;
	if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 &&
	    sa.sin_family == AF_INET && ntohs(sa.sin_port) == pc->port) {
		pc->n++;
		pc->fd = fd;
	}
}

/* live_polls: how many sockets httpc is watching now. */
static int live_polls(struct tfix *f)
{
	struct pollcount pc = { .port = f->port, .fd = -1 };

	uv_walk(&f->loop, count_polls, &pc);
	return pc.n;
}

/* watched_fd: the fd of (the last) httpc watcher, -1 if none. */
static int watched_fd(struct tfix *f)
{
	struct pollcount pc = { .port = f->port, .fd = -1 };

	uv_walk(&f->loop, count_polls, &pc);
	return pc.fd;
}

/* open_fds: entries in /proc/self/fd (the dir fd itself included). */
static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	assert_non_null(d);
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n;
}

/* spin_stop: ends spin_ms's uv_run. */
static void spin_stop(uv_timer_t *t)
{
	uv_stop(t->loop);
}

/* spin_ms: runs the loop for ms (lets a peer's FIN reach idle watchers). */
static void spin_ms(struct tfix *f, uint64_t ms)
{
	uv_timer_t t;

	uv_timer_init(&f->loop, &t);
	uv_timer_start(&t, spin_stop, ms, 0);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	uv_close((uv_handle_t *)&t, NULL);
	uv_run(&f->loop, UV_RUN_NOWAIT);
}

/* get_one: a fresh easy handle per request (as the daemons do), so the
 * connection is reused across easy handles through the multi's cache.
 * Returns curl's new-connection count; fd gets the watched socket. */
static long get_one(struct tfix *f, const char *path, const char *want,
                    curl_socket_t *fd)
{
	struct treq r;
	long conns = -1;

	treq_setup(f, &r, path, NULL, 0);
	treq_run(f, &r);
	assert_int_equal(r.rc, CURLE_OK);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.resp, want);
	curl_easy_getinfo(r.easy, CURLINFO_NUM_CONNECTS, &conns);
	treq_clean(&r);
	if (fd != NULL) /* the connection, idle now, keeps its watcher */
		*fd = watched_fd(f);
	return conns;
}

/* 200 keep-alive requests from separate easy handles ride one connection
 * and one watcher: no new connection, same fd, one live uv_poll_t. */
static void test_keepalive_one_watcher(void **state)
{
	struct tfix *f = *state;
	curl_socket_t fd0 = -1, fd = -1;

	assert_int_equal(get_one(f, "/hello?name=k", "{\"hello\":\"k\"}",
	                         &fd0), 1);
	assert_true(fd0 >= 0);
	assert_int_equal(live_polls(f), 1);
	for (int i = 0; i < 200; i++) {
		assert_int_equal(get_one(f, "/hello?name=k",
		                         "{\"hello\":\"k\"}", &fd), 0);
		assert_int_equal(fd, fd0);
		assert_int_equal(live_polls(f), 1);
	}
}

/* The server closes the keep-alive connection after a reply. The next
 * request opens a new connection and succeeds, whether the FIN reached
 * the idle watcher first (spin) or not (back to back). The new socket
 * gets the closed one's fd number, and must get a fresh watcher: a stale
 * one (or an epoll registration outliving the old fd) would hang it. */
static void test_server_closes(void **state)
{
	struct tfix *f = *state;
	curl_socket_t fd0 = -1, fd1 = -1, fd2 = -1, fd = -1;

	assert_int_equal(get_one(f, "/close", "{\"bye\":true}", &fd0), 1);
	spin_ms(f, 50); /* the FIN wakes the idle watcher: it disarms */
	assert_int_equal(live_polls(f), 1); /* kept until curl closes the fd */
	assert_int_equal(get_one(f, "/hello?name=a", "{\"hello\":\"a\"}",
	                         &fd1), 1);
	assert_int_equal(fd1, fd0); /* the number was reused at once */
	assert_int_equal(live_polls(f), 1);
	assert_int_equal(get_one(f, "/hello?name=b", "{\"hello\":\"b\"}",
	                         &fd2), 0);
	assert_int_equal(fd2, fd1);
	for (int i = 0; i < 20; i++) { /* no pause between close and reuse */
		get_one(f, "/close", "{\"bye\":true}", NULL);
		assert_int_equal(get_one(f, "/hello?name=c",
		                         "{\"hello\":\"c\"}", &fd), 1);
		assert_int_equal(fd, fd0);
		assert_int_equal(live_polls(f), 1);
	}
}

/* 16 transfers at once open parallel connections (one watcher each), all
 * complete; a second round reuses them. */
static void test_concurrent(void **state)
{
	struct tfix *f = *state;
	struct treq r[16];
	struct tt_err err = { 0 };
	char path[32], want[32];

	for (int round = 0; round < 2; round++) {
		int left = 16;

		for (int i = 0; i < 16; i++) {
			snprintf(path, sizeof(path), "/hello?name=%d", i);
			treq_setup(f, &r[i], path, NULL, 0);
			assert_int_equal(httpc_start(f->hc, r[i].easy, treq_done,
			                             &r[i], &err), 0);
		}
		while (left > 0) {
			uv_run(&f->loop, UV_RUN_ONCE);
			left = 0;
			for (int i = 0; i < 16; i++)
				left += !r[i].done;
		}
		for (int i = 0; i < 16; i++) {
			snprintf(want, sizeof(want), "{\"hello\":\"%d\"}", i);
			assert_int_equal(r[i].rc, CURLE_OK);
			assert_int_equal(r[i].status, 200);
			assert_string_equal(r[i].resp, want);
			treq_clean(&r[i]);
		}
		assert_true(live_polls(f) >= 2 && live_polls(f) <= 16);
	}
}

/* httpc_free closes every cached connection and its watcher: no fd and
 * no uv handle outlives it (the loop closes in teardown). */
static void test_free_closes_all(void **state)
{
	struct tfix *f = *state;
	struct tt_err err = { 0 };
	struct treq r[4];
	int before, after;

	httpc_free(f->hc);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	before = open_fds();
	f->hc = httpc_new(&f->loop, &err);
	assert_non_null(f->hc);
	for (int i = 0; i < 4; i++) {
		treq_setup(f, &r[i], "/hello?name=z", NULL, 0);
		assert_int_equal(httpc_start(f->hc, r[i].easy, treq_done,
		                             &r[i], &err), 0);
	}
	for (int i = 0; i < 4; i++) {
		while (!r[i].done)
			uv_run(&f->loop, UV_RUN_ONCE);
		assert_int_equal(r[i].status, 200);
		treq_clean(&r[i]);
	}
	assert_true(open_fds() > before); /* connections are cached */
	assert_true(live_polls(f) >= 1);
	httpc_free(f->hc);
	assert_int_equal(live_polls(f), 0);
	uv_run(&f->loop, UV_RUN_NOWAIT);
	after = open_fds();
	assert_int_equal(after, before);
	f->hc = httpc_new(&f->loop, &err); /* for teardown */
	assert_non_null(f->hc);
}

/* Sockets with high fd numbers (a daemon with many clients) are watched
 * like any other: the fd table grows, it has no fixed bound. */
static void test_high_fd(void **state)
{
	struct tfix *f = *state;
	struct rlimit rl;
	int *held, nheld = 0, fd = -1;
	const int want_fd = 5000;

	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_max < (rlim_t)want_fd + 64)
		skip();
	if (rl.rlim_cur < (rlim_t)want_fd + 64) {
		rl.rlim_cur = (rlim_t)want_fd + 64;
		assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	held = calloc((size_t)want_fd, sizeof(*held));
	assert_non_null(held);
	/* Occupy every low number so curl's socket lands above want_fd. */
	for (;;) {
		int d = dup(0);

		assert_true(d >= 0);
		held[nheld++] = d;
		if (d >= want_fd || nheld == want_fd)
			break;
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(get_one(f, "/hello?name=h",
		                         "{\"hello\":\"h\"}", &fd), i == 0);
	assert_true(fd > want_fd);
	assert_int_equal(live_polls(f), 1);
	for (int i = 0; i < nheld; i++)
		close(held[i]);
	free(held);
}

/* Connection refused surfaces as a curl error, not a hang. */
static void test_refused(void **state)
{
	struct tfix *f = *state;
	struct treq r;
	int port = f->port;

	f->port = 1; /* nothing listens on port 1 here */
	treq_setup(f, &r, "/x", NULL, 0);
	f->port = port;
	treq_run(f, &r);
	assert_int_equal(r.rc, CURLE_COULDNT_CONNECT);
	treq_clean(&r);
}

/* Metrics: counters and latency buckets render as Prometheus text. */
static void test_metrics(void **state)
{
	char *txt;

	(void)state;
	metrics_inc("tt_test_total", "decision=\"deny\"");
	metrics_add("tt_test_total", "decision=\"deny\"", 2);
	metrics_inc("tt_test_total", NULL);
	metrics_observe_us("tt_test_seconds", NULL, 50);
	metrics_observe_us("tt_test_seconds", NULL, 5000);
	metrics_observe_us("tt_test_seconds", NULL, 5000000);
	metrics_gauge_set("tt_test_level", "state=\"up\"", 5);
	metrics_gauge_add("tt_test_level", "state=\"up\"", -7);
	metrics_gauge_add("tt_test_level", "state=\"down\"", 1);
	txt = metrics_render();
	assert_non_null(txt);
	assert_non_null(strstr(txt, "# HELP tt_test_total (not in the list"));
	assert_non_null(strstr(txt, "# TYPE tt_test_total counter\n"));
	assert_non_null(strstr(txt, "# TYPE tt_test_seconds histogram\n"));
	assert_non_null(strstr(txt, "# HELP tether_metrics_dropped_total Metric"));
	assert_non_null(strstr(txt, "tt_test_total{decision=\"deny\"} 3\n"));
	assert_non_null(strstr(txt, "\ntt_test_total 1\n"));
	assert_non_null(strstr(txt,
	        "tt_test_seconds_bucket{le=\"0.0001\"} 1\n"));
	assert_non_null(strstr(txt, "tt_test_seconds_bucket{le=\"0.01\"} 2\n"));
	assert_non_null(strstr(txt, "tt_test_seconds_bucket{le=\"1\"} 2\n"));
	assert_non_null(strstr(txt, "tt_test_seconds_bucket{le=\"10\"} 3\n"));
	assert_non_null(strstr(txt, "# TYPE tt_test_level gauge\n"));
	assert_non_null(strstr(txt, "tt_test_level{state=\"up\"} -2\n"));
	assert_non_null(strstr(txt, "tt_test_level{state=\"down\"} 1\n"));
	assert_non_null(strstr(txt, "tt_test_seconds_bucket{le=\"+Inf\"} 3\n"));
	assert_non_null(strstr(txt, "tt_test_seconds_sum 5.005050\n"));
	assert_non_null(strstr(txt, "tt_test_seconds_count 3\n"));
	free(txt);
	/* The registry is bounded: extra series are dropped and counted. */
	for (int i = 0; i < 300; i++) {
		char l[32];

		snprintf(l, sizeof(l), "i=\"%d\"", i);
		metrics_inc("tt_flood_total", l);
	}
	txt = metrics_render();
	assert_non_null(txt);
	assert_null(strstr(txt, "tt_flood_total{i=\"299\"}"));
	assert_null(strstr(txt, "tether_metrics_dropped_total 0\n"));
	free(txt);
}

/* raw_exchange: sends req on a fresh connection to the test server and
 * collects what comes back (into out, NUL-terminated) until the server
 * closes, a whole answer (head + Content-Length) is in, or timeout_ms;
 * the server's loop runs meanwhile. Returns the bytes received. */
static size_t raw_exchange(struct tfix *f, const char *req, char *out,
                           size_t cap, int timeout_ms)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	size_t got = 0;
	uint64_t end = uv_hrtime() / 1000000u + (uint64_t)timeout_ms;

	assert_true(fd >= 0);
	sa.sin_port = htons((uint16_t)f->port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
	out[0] = '\0';
	while (uv_hrtime() / 1000000u < end && got + 1 < cap) {
		ssize_t r;
		const char *body, *cl;

		uv_run(&f->loop, UV_RUN_NOWAIT);
		r = recv(fd, out + got, cap - 1 - got, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
			break;
		if (r < 0) {
			usleep(1000);
			continue;
		}
		got += (size_t)r;
		out[got] = '\0';
		body = strstr(out, "\r\n\r\n");
		cl = strcasestr(out, "content-length: ");
		if (body != NULL && cl != NULL && cl < body &&
		    strlen(body + 4) >= strtoul(cl + 16, NULL, 10))
			break;
	}
	close(fd);
	return got;
}

/* Upgrades offered to the HTTP protocol (no subprotocol, or "http") are
 * refused before 101; HTTP goes on being served. */
static void test_upgrade_refused(void **state)
{
	struct tfix *f = *state;
	char out[4096];

#define UPGRADE_REQ(extra) \
	"GET /hello HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n" \
	"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" \
	"Sec-WebSocket-Version: 13\r\n" extra "\r\n"

	raw_exchange(f, UPGRADE_REQ(""), out, sizeof(out), 2000);
	assert_null(strstr(out, " 101 "));
	raw_exchange(f, UPGRADE_REQ("Sec-WebSocket-Protocol: http\r\n"), out,
	             sizeof(out), 2000);
	assert_null(strstr(out, " 101 "));
	(void)get_one(f, "/hello?name=u", "{\"hello\":\"u\"}", NULL);
}

/* 414 for a long request target, 431 for a long field or too many bytes
 * of fields, at any length (lws skips past its token limit); requests
 * within the bounds are served. */
static void test_bounds(void **state)
{
	struct tfix *f = *state;
	static char path[HTTP_URI_MAX * 4], hdr[HTTP_FIELD_MAX * 4];
	struct curl_slist *h = NULL;
	struct treq r;

	memcpy(path, "/hello?name=", 12);
	memset(path + 12, 'a', 4000);
	path[4012] = '\0';
	treq_setup(f, &r, path, NULL, 0);
	treq_run(f, &r);
	assert_int_equal(r.status, 200);
	treq_clean(&r);
	memset(path + 12, 'a', sizeof(path) - 13);
	path[sizeof(path) - 1] = '\0';
	treq_setup(f, &r, path, NULL, 0);
	treq_run(f, &r);
	assert_int_equal(r.status, 414);
	assert_non_null(strstr(r.resp, "\"error\":\"too_large\""));
	treq_clean(&r);

	memcpy(hdr, "Cookie: ", 8);
	memset(hdr + 8, 'c', sizeof(hdr) - 9);
	hdr[sizeof(hdr) - 1] = '\0';
	treq_setup(f, &r, "/hello?name=h", NULL, 0);
	h = curl_slist_append(NULL, hdr);
	curl_easy_setopt(r.easy, CURLOPT_HTTPHEADER, h);
	treq_run(f, &r);
	assert_int_equal(r.status, 431);
	treq_clean(&r);
	curl_slist_free_all(h);
	h = NULL;
	/* three fields of 6 KiB: each within, together over */
	hdr[8 + 6144] = '\0';
	h = curl_slist_append(h, hdr);
	memcpy(hdr, "Accept: ", 8);
	h = curl_slist_append(h, hdr);
	memcpy(hdr, "Pragma: ", 8);
	h = curl_slist_append(h, hdr);
	treq_setup(f, &r, "/hello?name=h", NULL, 0);
	curl_easy_setopt(r.easy, CURLOPT_HTTPHEADER, h);
	treq_run(f, &r);
	assert_int_equal(r.status, 431);
	treq_clean(&r);
	curl_slist_free_all(h);
	(void)get_one(f, "/hello?name=v", "{\"hello\":\"v\"}", NULL);
}

/* framing_of: the server's http_body_framing for a GET with extra
 * header lines; len gets its length. */
static int framing_of(struct tfix *f, const char *hdrs, long long *len)
{
	char req[512], out[4096];
	const char *body;
	json_t *j;
	int fr;

	snprintf(req, sizeof(req), "GET /framing HTTP/1.1\r\nHost: x\r\n%s\r\n", hdrs);
	raw_exchange(f, req, out, sizeof(out), 2000);
	body = strstr(out, "\r\n\r\n");
	assert_non_null(body);
	j = json_loads(body + 4, 0, NULL);
	assert_non_null(j);
	fr = (int)json_integer_value(json_object_get(j, "framing"));
	*len = (long long)json_integer_value(json_object_get(j, "len"));
	json_decref(j);
	return fr;
}

/* One Content-Length of digits; two (or a list), junk, or one with
 * Transfer-Encoding is BAD; Transfer-Encoding alone is UNSIZED. */
static void test_framing(void **state)
{
	struct tfix *f = *state;
	long long l;

	assert_int_equal(framing_of(f, "", &l), HTTP_BODY_NONE);
	assert_int_equal(l, -1);
	assert_int_equal(framing_of(f, "Content-Length: 5\r\n", &l), HTTP_BODY_SIZED);
	assert_int_equal(l, 5);
	assert_int_equal(framing_of(f, "Content-Length: 0\r\n", &l), HTTP_BODY_SIZED);
	assert_int_equal(l, 0);
	assert_int_equal(framing_of(f, "Content-Length:  7 \r\n", &l), HTTP_BODY_SIZED);
	assert_int_equal(l, 7);
	assert_int_equal(framing_of(f, "Content-Length: 123456789012345678\r\n", &l),
	                 HTTP_BODY_SIZED);
	assert_int_equal(framing_of(f, "Content-Length: 1234567890123456789\r\n", &l),
	                 HTTP_BODY_BAD);
	assert_int_equal(framing_of(f, "Content-Length: 5\r\nContent-Length: 5\r\n", &l),
	                 HTTP_BODY_BAD);
	assert_int_equal(framing_of(f, "Content-Length: 5, 5\r\n", &l), HTTP_BODY_BAD);
	assert_int_equal(framing_of(f, "Content-Length: +5\r\n", &l), HTTP_BODY_BAD);
	assert_int_equal(framing_of(f, "Content-Length: 5x\r\n", &l), HTTP_BODY_BAD);
	assert_int_equal(framing_of(f, "Transfer-Encoding: chunked\r\n", &l),
	                 HTTP_BODY_UNSIZED);
	assert_int_equal(framing_of(f, "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", &l),
	                 HTTP_BODY_BAD);
}

/* stop_loop: a timer that ends uv_run. */
static void stop_loop(uv_timer_t *t)
{
	uv_stop(t->loop);
}

/* run_ms: runs the server's loop for ms milliseconds. */
static void run_ms(struct tfix *f, uint64_t ms)
{
	uv_timer_t t;

	uv_timer_init(&f->loop, &t);
	uv_timer_start(&t, stop_loop, ms, 0);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	uv_close((uv_handle_t *)&t, NULL);
	uv_run(&f->loop, UV_RUN_NOWAIT);
}

/* cpu_ms: this process's user + system CPU so far. */
static long cpu_ms(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
	       (long)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

/* Every fd in use (EMFILE at accept): lws 4.1.6 spun on its readable
 * listener. Now accepting pauses (no CPU burnt meanwhile) and resumes on
 * its own once fds are free: the waiting client is then answered. */
static void test_accept_pause(void **state)
{
	struct tfix *f = *state;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct rlimit rl, low;
	int client, held[64], nheld = 0;
	const char *req = "GET /hello?name=p HTTP/1.1\r\nHost: x\r\n\r\n";
	char out[1024];
	size_t got = 0;
	long c0, c1;
	char *m;

	client = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(client >= 0);
	sa.sin_port = htons((uint16_t)f->port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
	low = rl;
	low.rlim_cur = (rlim_t)open_fds() + 16;
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	while (nheld < 64) {
		int d = open("/dev/null", O_RDONLY | O_CLOEXEC);

		if (d < 0)
			break;
		held[nheld++] = d;
	}
	assert_true(nheld > 0 && nheld < 64);
	/* the kernel completes the handshake; lws' accept gets EMFILE */
	assert_int_equal(connect(client, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(send(client, req, strlen(req), 0), (ssize_t)strlen(req));
	c0 = cpu_ms();
	run_ms(f, 1500);
	c1 = cpu_ms();
	assert_true(c1 - c0 < 300); /* it spun at 100 % before */
	m = metrics_render();
	assert_non_null(m);
	assert_non_null(strstr(m, "tether_http_accept_pauses_total"));
	free(m);
	assert_int_equal(recv(client, out, sizeof(out), MSG_DONTWAIT), -1);
	for (int i = 0; i < nheld; i++)
		close(held[i]);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
	/* the next resume (at most 1 s away) accepts and answers */
	for (int i = 0; i < 300 && got == 0; i++) {
		ssize_t r;

		run_ms(f, 10);
		r = recv(client, out, sizeof(out) - 1, MSG_DONTWAIT);
		if (r > 0)
			got = (size_t)r;
	}
	assert_true(got > 0);
	out[got] = '\0';
	assert_non_null(strstr(out, " 200 "));
	close(client);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_get_json, setup, teardown),
		cmocka_unit_test_setup_teardown(test_post_json, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oversized, setup, teardown),
		cmocka_unit_test_setup_teardown(test_deferred, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sequential, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_keepalive_one_watcher, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_server_closes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_high_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_free_closes_all, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_upgrade_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bounds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_framing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_accept_pause, setup, teardown),
		cmocka_unit_test(test_metrics),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

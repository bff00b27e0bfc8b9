/* HTTP glue (see http.h): lws server replies on a libuv loop and a libcurl
 * multi client driven by the same loop. */
#include "http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>

#include <sodium.h>

#include "cleanup.h"
#include "log.h"
#include "paseto.h"

/* ---- server ---------------------------------------------------------- */

/* http_lws_log: routes lws' own (error-only) messages into our log. */
static void http_lws_log(int level, const char *line)
{
	size_t n = strlen(line);

	(void)level;
	while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		n--;
	log_error("lws: %.*s", (int)n, line);
}

static size_t server_serv_buf; /* 0: lws' default */

/* http_server_set_serv_buf: see http.h. */
void http_server_set_serv_buf(size_t bytes)
{
	server_serv_buf = bytes;
}

/* http_server_new: an lws context on the caller's libuv loop. */
struct lws_context *http_server_new(uv_loop_t *loop, const char *iface,
                                    int port,
                                    const struct lws_protocols *protocols,
                                    void *user, struct tt_err *err)
{
	struct lws_context_creation_info info;
	void *loops[1] = { loop };
	struct lws_context *ctx;

	lws_set_log_level(LLL_ERR, http_lws_log);
	memset(&info, 0, sizeof(info));
	info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_DISABLE_IPV6 |
	               LWS_SERVER_OPTION_VALIDATE_UTF8;
	info.foreign_loops = loops; /* lws copies the pointer out at creation */
	info.port = port;
	info.iface = iface;
	info.protocols = protocols;
	info.user = user;
	info.vhost_name = "default";
	info.timeout_secs = 30;
	info.keepalive_timeout = 60;
	info.pt_serv_buf_size = (unsigned int)server_serv_buf;
	ctx = lws_create_context(&info);
	if (ctx == NULL) {
		tt_err_set(err, TT_ERR_SYS, "cannot listen on %s:%d",
		           iface ? iface : "*", port);
		return NULL;
	}
	/* lws returns a context even when the listen socket failed to bind
	 * (port in use): no vhost then. The half-built context is left alone:
	 * destroying it unloads lws' uv plugin while its close callbacks are
	 * still queued on the loop (a crash on the next uv_run). Callers exit
	 * on this error. */
	if (lws_get_vhost_by_name(ctx, "default") == NULL) {
		tt_err_set(err, TT_ERR_SYS, "cannot listen on %s:%d (in use?)",
		           iface ? iface : "*", port);
		return NULL;
	}
	return ctx;
}

/* How long a request may be in progress before its guard starts
 * watching: a small answer is out well before, so the common request
 * costs no dup, epoll add/del or close; a client's extra bytes or
 * half-close spin the loop for at most this long. */
#define RXGUARD_DELAY_MS 2

/* One guard: a timer, then a uv_poll on a dup of the client socket. Owner:
 * the caller until http_rxguard_stop; then the last uv close callback
 * frees it. */
struct http_rxguard {
	uv_timer_t timer;
	uv_poll_t poll;
	int fd;             /* the dup (owned); -1 before the timer fired */
	int open_handles;   /* uv handles still to close before the free */
	struct lws *wsi;    /* NULL once the guard acted on end of input */
	bool extra;         /* bytes after the request were dropped */
};

/* rxguard_on_close: one handle is closed; the last releases the dup. */
static void rxguard_on_close(uv_handle_t *h)
{
	struct http_rxguard *g = h->data;

	if (--g->open_handles > 0)
		return;
	if (g->fd >= 0)
		close(g->fd);
	free(g);
}

/* rxguard_on_readable: drops what the client sent after its request (at
 * most 256 KiB per wakeup, so a flood cannot hold the loop); on end of
 * input or an error, stops watching and has lws close the connection. */
static void rxguard_on_readable(uv_poll_t *p, int status, int events)
{
	struct http_rxguard *g = p->data;
	uint8_t scratch[16384];
	ssize_t r = 1;
	int i;

	(void)events;
	for (i = 0; status == 0 && i < 16; i++) {
		r = recv(g->fd, scratch, sizeof(scratch), MSG_DONTWAIT);
		if (r <= 0)
			break;
		g->extra = true;
	}
	if (status == 0 && (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR))))
		return;
	uv_poll_stop(p);
	if (g->wsi != NULL)
		lws_set_timeout(g->wsi, PENDING_TIMEOUT_CLOSE_ACK, LWS_TO_KILL_ASYNC);
	g->wsi = NULL;
}

/* rxguard_on_timer: the request is still in progress: watch the socket.
 * Failing that, only this protection is lost (logged). */
static void rxguard_on_timer(uv_timer_t *t)
{
	struct http_rxguard *g = t->data;
	int fd = g->wsi != NULL ? (int)lws_get_socket_fd(g->wsi) : -1;

	if (fd < 0)
		return;
	/* A dup: libuv allows one watcher per fd, and lws owns the original;
	 * epoll registers the dup separately. */
	g->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (g->fd < 0 || uv_poll_init(t->loop, &g->poll, g->fd) != 0) {
		log_warn("cannot watch a client socket: %s", strerror(errno));
		if (g->fd >= 0)
			close(g->fd);
		g->fd = -1;
		return;
	}
	g->poll.data = g;
	g->open_handles++;
	if (uv_poll_start(&g->poll, UV_READABLE | UV_DISCONNECT,
	                  rxguard_on_readable) != 0)
		log_warn("cannot watch a client socket");
}

/* http_rxguard_start: see http.h. */
struct http_rxguard *http_rxguard_start(uv_loop_t *loop, struct lws *wsi,
                                        struct tt_err *err)
{
	struct http_rxguard *g;

	if (lws_get_socket_fd(wsi) < 0) {
		tt_err_set(err, TT_ERR_IO, "no client socket");
		return NULL;
	}
	g = calloc(1, sizeof(*g));
	if (g == NULL) {
		tt_err_set(err, TT_ERR_SYS, "out of memory");
		return NULL;
	}
	g->fd = -1;
	g->wsi = wsi;
	uv_timer_init(loop, &g->timer); /* cannot fail */
	g->timer.data = g;
	g->open_handles = 1;
	uv_timer_start(&g->timer, rxguard_on_timer, RXGUARD_DELAY_MS, 0);
	return g;
}

/* http_rxguard_stop: see http.h. */
bool http_rxguard_stop(struct http_rxguard *g)
{
	bool extra;

	if (g == NULL)
		return false;
	extra = g->extra;
	g->wsi = NULL;
	uv_timer_stop(&g->timer);
	if (g->fd >= 0) {
		/* Bytes it did not read yet are whole: lws reads them as the
		 * next request. */
		uv_poll_stop(&g->poll);
		uv_close((uv_handle_t *)&g->poll, rxguard_on_close);
	}
	uv_close((uv_handle_t *)&g->timer, rxguard_on_close);
	return extra;
}

static int http_reply_write(struct lws *wsi, unsigned status,
                            const char *content_type, const void *body,
                            size_t len);

/* http_drain_begin: lws closes the connection if the rest of the body
 * stops coming. */
void http_drain_begin(struct lws *wsi)
{
	lws_set_timeout(wsi, PENDING_TIMEOUT_HTTP_CONTENT, HTTP_DRAIN_IDLE_S);
}

/* http_reply_early: http_reply's write, then the drain. */
int http_reply_early(struct lws *wsi, unsigned status, const char *content_type,
                     const void *body, size_t len)
{
	if (http_reply_write(wsi, status, content_type, body, len) < 0)
		return -1;
	http_drain_begin(wsi);
	return 0;
}

/* http_reply: the answer, then the transaction completes. */
int http_reply(struct lws *wsi, unsigned status, const char *content_type,
               const void *body, size_t len)
{
	if (http_reply_write(wsi, status, content_type, body, len) < 0 ||
	    lws_http_transaction_completed(wsi))
		return -1;
	return 0;
}

/* http_reply_write: headers and body assembled in one buffer, one
 * lws_write. */
static int http_reply_write(struct lws *wsi, unsigned status,
                            const char *content_type, const void *body,
                            size_t len)
{
	const size_t head_room = 512;
	_cleanup_free_ unsigned char *buf = malloc(LWS_PRE + head_room + len);
	unsigned char *start, *p, *end;

	if (buf == NULL)
		return -1;
	start = p = buf + LWS_PRE;
	end = start + head_room;
	if (lws_add_http_common_headers(wsi, status | LWSAHH_FLAG_NO_SERVER_NAME,
	                                content_type, (lws_filepos_t)len,
	                                &p, end) ||
	    lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
	                                 (const unsigned char *)"no-store", 8,
	                                 &p, end) ||
	    lws_finalize_http_header(wsi, &p, end))
		return -1;
	if (len > 0)
		memcpy(p, body, len);
	p += len;
	if (lws_write(wsi, start, (size_t)(p - start), LWS_WRITE_HTTP_FINAL) !=
	    (int)(p - start))
		return -1;
	return 0;
}

/* http_reply_json: compact JSON body; steals obj. */
int http_reply_json(struct lws *wsi, unsigned status, json_t *obj)
{
	_cleanup_free_ char *s = NULL;

	if (obj == NULL)
		return http_reply_error(wsi, 500, "internal", "out of memory");
	s = json_dumps(obj, JSON_COMPACT);
	json_decref(obj);
	if (s == NULL)
		return http_reply_error(wsi, 500, "internal", "cannot encode reply");
	return http_reply(wsi, status, "application/json", s, strlen(s));
}

/* http_reply_error: the uniform error body of docs/API.md. */
int http_reply_error(struct lws *wsi, unsigned status, const char *code,
                     const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *obj;
	_cleanup_free_ char *s = NULL;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	obj = json_pack("{s:s,s:s}", "error", code, "message", msg);
	if (obj != NULL) {
		s = json_dumps(obj, JSON_COMPACT);
		json_decref(obj);
	}
	if (s == NULL)
		return http_reply(wsi, status, "application/json",
		                  "{\"error\":\"internal\"}", 20);
	return http_reply(wsi, status, "application/json", s, strlen(s));
}

/* http_expects_continue: RFC 9110 10.1.1; the token is case-insensitive. */
bool http_expects_continue(struct lws *wsi)
{
	char v[32];

	return http_header(wsi, WSI_TOKEN_HTTP_EXPECT, v, sizeof(v)) > 0 &&
	       strcasecmp(v, "100-continue") == 0;
}

/* http_continue: lws builds the status line; nothing else goes with it. */
int http_continue(struct lws *wsi)
{
	unsigned char buf[LWS_PRE + 64], *p = buf + LWS_PRE, *end = buf + sizeof(buf);

	if (lws_add_http_header_status(wsi, 100 | LWSAHH_FLAG_NO_SERVER_NAME, &p, end) ||
	    lws_finalize_write_http_header(wsi, buf + LWS_PRE, &p, end))
		return -1;
	return 0;
}

/* http_header: bounded copy of one request header. */
int http_header(struct lws *wsi, enum lws_token_indexes tok, char *buf,
                size_t cap)
{
	int len = lws_hdr_total_length(wsi, tok);

	if (cap == 0)
		return -1;
	buf[0] = '\0';
	if (len <= 0 || (size_t)len >= cap)
		return -1;
	if (lws_hdr_copy(wsi, buf, (int)cap, tok) < 0)
		return -1;
	return (int)strlen(buf);
}

/* http_query: lws matches by prefix, so "name=" is passed (else "after"
 * would also match "afterwards=..."); the value is moved to buf[0]. */
int http_query(struct lws *wsi, const char *name, char *buf, size_t cap)
{
	char key[64];
	const char *v;
	size_t vlen;
	int n;

	if (cap == 0)
		return -1;
	n = snprintf(key, sizeof(key), "%s=", name);
	if (n < 0 || (size_t)n >= sizeof(key))
		return -1;
	v = lws_get_urlarg_by_name(wsi, key, buf, (int)cap);
	if (v == NULL)
		return -1;
	vlen = strlen(v);
	memmove(buf, v, vlen + 1);
	return (int)vlen;
}

/* http_body_append: grows the buffer; refuses past b->max. */
int http_body_append(struct http_body *b, const void *data, size_t len,
                     struct tt_err *err)
{
	size_t max = b->max ? b->max : HTTP_BODY_MAX_DEFAULT;
	char *nb;

	/* lws reports an empty chunk at the end of some bodies: nothing to copy
	 * (and memcpy from NULL is undefined even for 0 bytes). */
	if (len == 0)
		return 0;
	if (len > max || b->len > max - len)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "request body over %zu bytes", max);
	nb = realloc(b->buf, b->len + len + 1);
	if (nb == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	b->buf = nb;
	memcpy(b->buf + b->len, data, len);
	b->len += len;
	b->buf[b->len] = '\0';
	return 0;
}

/* http_body_json: strict parse of the accumulated body into an object. */
json_t *http_body_json(const struct http_body *b, struct tt_err *err)
{
	json_error_t jerr;
	json_t *obj;

	if (b->buf == NULL || b->len == 0) {
		tt_err_set(err, TT_ERR_MALFORMED, "empty body, JSON object expected");
		return NULL;
	}
	obj = json_loadb(b->buf, b->len, JSON_REJECT_DUPLICATES, &jerr);
	if (obj == NULL) {
		tt_err_set(err, TT_ERR_MALFORMED, "invalid JSON: %s (line %d)",
		           jerr.text, jerr.line);
		return NULL;
	}
	if (!json_is_object(obj)) {
		json_decref(obj);
		tt_err_set(err, TT_ERR_MALFORMED, "JSON object expected");
		return NULL;
	}
	return obj;
}

/* http_body_free: releases the buffer; the struct can be reused. */
void http_body_free(struct http_body *b)
{
	free(b->buf);
	b->buf = NULL;
	b->len = 0;
}

/* http_wait_seconds: a decimal number of seconds, bounded. */
int http_wait_seconds(struct lws *wsi)
{
	static const char name[] = HTTP_WAIT_HEADER ":";
	char v[16];
	int len = lws_hdr_custom_length(wsi, name, (int)sizeof(name) - 1);
	const char *c;
	long n = 0;

	if (len <= 0)
		return len == 0 ? -1 : HTTP_WAIT_DEFAULT_S;
	if ((size_t)len >= sizeof(v) ||
	    lws_hdr_custom_copy(wsi, v, (int)sizeof(v), name, (int)sizeof(name) - 1) < 0)
		return -1;
	c = v + strspn(v, " \t");
	if (*c == '\0')
		return -1;
	for (; *c && *c != ' ' && *c != '\t'; c++) {
		if (*c < '0' || *c > '9' || n > HTTP_WAIT_MAX_S)
			return -1;
		n = n * 10 + (*c - '0');
	}
	if (c[strspn(c, " \t")] != '\0')
		return -1;
	return n <= HTTP_WAIT_MAX_S ? (int)n : -1;
}

/* http_body_unsized: Transfer-Encoding present, Content-Length absent. */
bool http_body_unsized(struct lws *wsi)
{
	char v[64];

	return http_header(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH, v, sizeof(v)) <= 0 &&
	       lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING) > 0;
}

/* ---- client: libcurl multi on libuv ------------------------------------ */

/* One in-flight transfer (owned by the httpc until done runs). */
struct httpc_xfer {
	struct httpc_xfer *next;
	CURL *easy;
	httpc_done_fn done;
	void *arg;
};

/* One socket curl uses. Its uv_poll_t lives from curl's first CURL_POLL_*
 * for the fd until curl closes the fd (httpc_close_socket), not per
 * transfer: libuv 1.44 turns every uv_poll_start/stop into an epoll_ctl, so
 * a kept-alive connection re-armed per request cost ~7 syscalls. Owner: the
 * httpc's fd table while the fd is open, then its uv close callback. */
struct httpc_sock {
	uv_poll_t poll;
	curl_socket_t fd;
	struct httpc *c;
	int armed; /* the events uv polls for now (0: stopped) */
	int want;  /* the events curl wants (0: idle in curl's cache) */
};

struct httpc {
	uv_loop_t *loop;
	CURLM *multi;
	uv_timer_t timer;
	struct httpc_xfer *xfers;
	int closing;
	/* Watched sockets indexed by fd, grown on demand (fds are small and
	 * dense; no fixed bound on the fd number). Owns the array. */
	struct httpc_sock **socks;
	size_t nsocks;
};

/* httpc_check_done: hands finished transfers back to their owners. */
static void httpc_check_done(struct httpc *c)
{
	CURLMsg *msg;
	int pending;

	while ((msg = curl_multi_info_read(c->multi, &pending)) != NULL) {
		struct httpc_xfer **pp, *x = NULL;
		CURL *easy = msg->easy_handle;
		CURLcode rc = msg->data.result;

		if (msg->msg != CURLMSG_DONE)
			continue;
		for (pp = &c->xfers; *pp != NULL; pp = &(*pp)->next) {
			if ((*pp)->easy == easy) {
				x = *pp;
				*pp = x->next;
				break;
			}
		}
		curl_multi_remove_handle(c->multi, easy);
		if (x != NULL) {
			httpc_done_fn done = x->done;
			void *arg = x->arg;

			free(x);
			done(easy, rc, arg);
		}
	}
}

/* httpc_on_poll: socket readiness -> curl. A wake-up on a socket curl is
 * not using (idle keep-alive connection, e.g. the server closed it) only
 * disarms the watcher; curl notices the dead connection before reuse. */
static void httpc_on_poll(uv_poll_t *h, int status, int events)
{
	struct httpc_sock *s = h->data;
	struct httpc *c = s->c;
	int flags = 0, running;

	if (s->want == 0) {
		uv_poll_stop(&s->poll);
		s->armed = 0;
		return;
	}
	if (status < 0)
		flags = CURL_CSELECT_ERR;
	if (events & UV_READABLE)
		flags |= CURL_CSELECT_IN;
	if (events & UV_WRITABLE)
		flags |= CURL_CSELECT_OUT;
	curl_multi_socket_action(c->multi, s->fd, flags, &running);
	httpc_check_done(c);
}

/* httpc_on_timer: curl's timeout fired. */
static void httpc_on_timer(uv_timer_t *t)
{
	struct httpc *c = t->data;
	int running;

	curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
	httpc_check_done(c);
}

/* httpc_timer_cb: CURLMOPT_TIMERFUNCTION; never calls curl from here. */
static int httpc_timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
	struct httpc *c = userp;

	(void)multi;
	if (timeout_ms < 0)
		uv_timer_stop(&c->timer);
	else
		uv_timer_start(&c->timer, httpc_on_timer, (uint64_t)timeout_ms, 0);
	return 0;
}

/* httpc_sock_closed: frees a socket context once uv let go of it. */
static void httpc_sock_closed(uv_handle_t *h)
{
	free(h->data);
}

/* httpc_sock_get: the watcher of fd, or NULL. */
static struct httpc_sock *httpc_sock_get(struct httpc *c, curl_socket_t fd)
{
	if (fd < 0 || (size_t)fd >= c->nsocks)
		return NULL;
	return c->socks[fd];
}

/* httpc_sock_slot: the table slot of fd, growing the table (doubling) to
 * hold it; NULL when out of memory. */
static struct httpc_sock **httpc_sock_slot(struct httpc *c, curl_socket_t fd)
{
	if ((size_t)fd >= c->nsocks) {
		size_t n = c->nsocks ? c->nsocks : 64;
		struct httpc_sock **ns;

		while (n <= (size_t)fd)
			n *= 2;
		ns = realloc(c->socks, n * sizeof(*ns));
		if (ns == NULL)
			return NULL;
		memset(ns + c->nsocks, 0, (n - c->nsocks) * sizeof(*ns));
		c->socks = ns;
		c->nsocks = n;
	}
	return &c->socks[fd];
}

/* httpc_sock_drop: takes fd's watcher out of the table and closes it.
 * uv_close stops the poll at once (EPOLL_CTL_DEL while the fd number is
 * still this socket), so it must run before close(fd): the number may be
 * reused by the very next socket(). */
static void httpc_sock_drop(struct httpc *c, curl_socket_t fd)
{
	struct httpc_sock *s = httpc_sock_get(c, fd);

	if (s == NULL)
		return;
	c->socks[fd] = NULL;
	uv_close((uv_handle_t *)&s->poll, httpc_sock_closed);
}

/* httpc_close_socket: CURLOPT_CLOSESOCKETFUNCTION. curl 7.88 copies it
 * into each connection it creates (conn->fclosesocket) and calls it for
 * every close of that connection's socket, also when another easy handle
 * or the multi's closure handle (curl_multi_cleanup) does the closing;
 * it tells the socket callback CURL_POLL_REMOVE just before. */
static int httpc_close_socket(void *clientp, curl_socket_t fd)
{
	httpc_sock_drop(clientp, fd);
	return close(fd);
}

/* httpc_socket_cb: CURLMOPT_SOCKETFUNCTION. The watcher is kept across
 * transfers and uv_poll_start runs only when the events change; on
 * CURL_POLL_REMOVE (transfer over, connection cached) it stays armed, and
 * the first wake-up while curl does not want it disarms it: an idle
 * readable-armed connection rarely wakes, while stopping it here would
 * cost an EPOLL_CTL_DEL now and an ADD on the next request. */
static int httpc_socket_cb(CURL *easy, curl_socket_t fd, int what,
                           void *userp, void *socketp)
{
	struct httpc *c = userp;
	struct httpc_sock *s, **slot;
	int events = 0;

	(void)easy;
	(void)socketp;
	if (fd < 0)
		return -1;
	s = httpc_sock_get(c, fd);
	if (what == CURL_POLL_REMOVE) {
		if (s != NULL)
			s->want = 0;
		return 0;
	}
	if (s == NULL) {
		slot = httpc_sock_slot(c, fd);
		if (slot == NULL)
			return -1;
		s = calloc(1, sizeof(*s));
		if (s == NULL)
			return -1;
		s->fd = fd;
		s->c = c;
		if (uv_poll_init_socket(c->loop, &s->poll, fd) != 0) {
			free(s);
			return -1;
		}
		s->poll.data = s;
		*slot = s;
	}
	if (what & CURL_POLL_IN)
		events |= UV_READABLE;
	if (what & CURL_POLL_OUT)
		events |= UV_WRITABLE;
	s->want = events;
	if (events != 0 && events != s->armed) {
		if (uv_poll_start(&s->poll, events, httpc_on_poll) != 0)
			return -1;
		s->armed = events;
	}
	return 0;
}

/* httpc_new: a multi handle wired to loop. Owner: the caller (httpc_free). */
struct httpc *httpc_new(uv_loop_t *loop, struct tt_err *err)
{
	static int global_done;
	struct httpc *c;

	if (!global_done) {
		if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
			tt_err_set(err, TT_ERR_SYS, "curl_global_init failed");
			return NULL;
		}
		global_done = 1;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	c->loop = loop;
	c->multi = curl_multi_init();
	if (c->multi == NULL) {
		free(c);
		tt_err_set(err, TT_ERR_NOMEM, "curl_multi_init failed");
		return NULL;
	}
	uv_timer_init(loop, &c->timer);
	c->timer.data = c;
	curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, httpc_socket_cb);
	curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
	curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, httpc_timer_cb);
	curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
	return c;
}

/* httpc_timer_closed: last step of httpc_free. */
static void httpc_timer_closed(uv_handle_t *h)
{
	free(h->data);
}

/* httpc_free: aborts what is in flight (each done runs with
 * CURLE_ABORTED_BY_CALLBACK so owners can release their easy handles),
 * then releases the multi (which closes its cached connections through
 * httpc_close_socket); the struct itself goes when uv closes the timer. */
void httpc_free(struct httpc *c)
{
	if (c == NULL || c->closing)
		return;
	c->closing = 1;
	while (c->xfers != NULL) {
		struct httpc_xfer *x = c->xfers;
		CURL *easy = x->easy;
		httpc_done_fn done = x->done;
		void *arg = x->arg;

		c->xfers = x->next;
		curl_multi_remove_handle(c->multi, easy);
		free(x);
		done(easy, CURLE_ABORTED_BY_CALLBACK, arg);
	}
	curl_multi_cleanup(c->multi);
	c->multi = NULL;
	/* Nothing should be left; a watcher curl did not close is released
	 * anyway (its fd stays curl's business). */
	for (size_t i = 0; i < c->nsocks; i++)
		httpc_sock_drop(c, (curl_socket_t)i);
	free(c->socks);
	c->socks = NULL;
	c->nsocks = 0;
	uv_timer_stop(&c->timer);
	uv_close((uv_handle_t *)&c->timer, httpc_timer_closed);
}

/* http_easy_direct: "" is curl's explicit "no proxy", which also keeps it
 * from reading the proxy variables. */
void http_easy_direct(CURL *easy)
{
	curl_easy_setopt(easy, CURLOPT_PROXY, "");
	curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
}

/* httpc_start: queues easy; curl's timer callback kicks it off. Every
 * connection the easy creates closes its socket through
 * httpc_close_socket, so the watcher goes before the fd does. */
int httpc_start(struct httpc *c, CURL *easy, httpc_done_fn done, void *arg,
                struct tt_err *err)
{
	struct httpc_xfer *x;

	if (c->closing)
		return tt_err_set(err, TT_ERR_INVALID, "http client is closing");
	x = calloc(1, sizeof(*x));
	if (x == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	x->easy = easy;
	x->done = done;
	x->arg = arg;
	curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, httpc_close_socket);
	curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, c);
	if (curl_multi_add_handle(c->multi, easy) != CURLM_OK) {
		free(x);
		return tt_err_set(err, TT_ERR_INVALID, "curl_multi_add_handle failed");
	}
	x->next = c->xfers;
	c->xfers = x;
	return 0;
}

/* http_capability_token: parses "Capability <token>" from Authorization. */
int http_capability_token(struct lws *wsi, char *tok, size_t cap)
{
	char hdr[PASETO_TOKEN_MAX + 32];
	const char *t;
	size_t len;
	int rc = -1;

	if (http_header(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, hdr, sizeof(hdr)) < 0)
		return -1;
	if (strncasecmp(hdr, "Capability ", 11) != 0)
		goto out;
	t = hdr + 11;
	while (*t == ' ')
		t++;
	len = strlen(t);
	while (len > 0 && t[len - 1] == ' ')
		len--;
	if (len == 0 || len >= cap)
		goto out;
	for (size_t i = 0; i < len; i++)
		if (t[i] <= ' ' || t[i] > '~')
			goto out;
	memcpy(tok, t, len);
	tok[len] = '\0';
	rc = 0;
out:
	/* Every exit: no copy of a (possibly valid) token stays on the stack. */
	sodium_memzero(hdr, sizeof(hdr));
	return rc;
}

/* HTTP glue shared by the daemons: replies on libwebsockets (server side,
 * on a libuv loop) and libcurl multi driven by the same libuv loop (client
 * side). Implementation: lib/http.c. Small replies go out in one lws_write
 * (headers + body together). Upgrades are authorized in
 * LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION, never in
 * LWS_CALLBACK_HTTP_CONFIRM_UPGRADE (CVE-2025-11677). */
#ifndef TT_HTTP_H
#define TT_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libwebsockets.h>
#include <uv.h>

#include "err.h"

#define HTTP_BODY_MAX_DEFAULT (1u << 20) /* JSON request bodies */

/* How long a request may wait for a sandbox's transition (pause, resume,
 * migrate, re-activation) to end before it is answered as things are:
 * the caller's "X-Tether-Wait: S" header (seconds), this by default. */
#define HTTP_WAIT_HEADER "x-tether-wait"
/* The id that follows one operation across hops (edge -> cp, node): the
 * caller's X-Request-Id when well formed, else one made at the edge. */
#define HTTP_RID_HEADER "x-request-id"
#define HTTP_RID_MAX 64
#define HTTP_WAIT_DEFAULT_S 30
#define HTTP_WAIT_MAX_S 300
/* Front-door bounds of every daemon's HTTP server (docs/API.md "Limits").
 * A request target (path + query, as lws decodes it) over HTTP_URI_MAX
 * answers 414; a header field lws knows over HTTP_FIELD_MAX, or those
 * fields together over HTTP_HEADERS_MAX, 431 (both then close). lws stores
 * at most one byte more of a URI or known field (the rest is skipped), so
 * these are answered at any length; fields lws does not know (X-…) are
 * stored whole and bounded only by its HTTP_HEADER_BUF header buffer: past
 * it lws 4.1.6 drops the connection (no hook to answer from). */
#define HTTP_URI_MAX 8192
#define HTTP_URI_MAX_S "8192"
#define HTTP_FIELD_MAX 8192
#define HTTP_FIELD_MAX_S "8192"
#define HTTP_HEADERS_MAX 16384
#define HTTP_HEADERS_MAX_S "16384"
#define HTTP_HEADER_BUF 32768
/* Timeouts (lws enforces them): the whole header section within
 * HTTP_HEADER_SECS of the connection (or of the previous request's end);
 * a request body stalled (no byte) for HTTP_BODY_IDLE_SECS; a kept-alive
 * connection idle for HTTP_KEEPALIVE_SECS. TCP keepalive probes a silent
 * peer after HTTP_TCP_KEEPIDLE_SECS, every HTTP_TCP_KEEPINTVL_SECS, and
 * drops it after HTTP_TCP_KEEPCNT unanswered: a client that vanished
 * (no FIN) while its long exec or long-poll runs silently goes within
 * ~90 s; while data to it is unacknowledged (a download), TCP's own
 * retransmission limit ends it (~15 min). No TCP_USER_TIMEOUT: it also
 * aborts a live peer whose window stays shut, i.e. a paused reader. Long
 * operations and slow readers are not cut: nothing bounds a response's
 * duration. */
#define HTTP_HEADER_SECS 10
/* Any accepted connection still plain HTTP without a whole request header
 * this long after it was accepted is closed (a backstop over lws' timers,
 * and the only bound for one upgraded to h2c that never speaks). */
#define HTTP_UNSERVED_SECS 15
#define HTTP_BODY_IDLE_SECS 30
#define HTTP_KEEPALIVE_SECS 60
#define HTTP_TCP_KEEPIDLE_SECS 60
#define HTTP_TCP_KEEPINTVL_SECS 10
#define HTTP_TCP_KEEPCNT 3
/* WebSocket streams keep lws' own idle policy: a PING after 300 s without
 * a PONG, the stream dropped at 310 s. Only a PONG counts, so a shorter
 * one would cut a client that merely stopped reading for a while (its
 * output paused in a pager): a legitimate slow reader. */
/* Accepting: the soft RLIMIT_NOFILE is raised to the hard one (at most
 * HTTP_NOFILE_MAX). lws stops polling its listener while it holds (limit
 * - reserve) / fds-per-connection connections; an accept that fails all
 * the same (EMFILE: fds held elsewhere) pauses accepting for
 * HTTP_ACCEPT_PAUSE_MIN_MS, doubling to HTTP_ACCEPT_PAUSE_MAX_MS while it
 * keeps failing. */
#define HTTP_NOFILE_MAX 65536
#define HTTP_ACCEPT_PAUSE_MIN_MS 50
#define HTTP_ACCEPT_PAUSE_MAX_MS 1000

/* http_server_new: an lws context on loop, listening on iface:port (iface
 * NULL = all; "127.0.0.1" for local), serving protocols[0] for HTTP (and
 * others for WebSocket). user is the context user pointer. protocols[0]'s
 * callback hands the reasons it does not handle to http_callback_default.
 * Owner: the caller; http_server_free releases it. */
struct lws_context *http_server_new(uv_loop_t *loop, const char *iface,
                                    int port,
                                    const struct lws_protocols *protocols,
                                    void *user, struct tt_err *err);
/* http_server_free: stops the server's timers, then lws_context_destroy. */
void http_server_free(struct lws_context *ctx);
/* http_server_set_serv_buf: lws' per-thread service buffer
 * (pt_serv_buf_size) for servers created after this call; 0 = lws' default
 * (4096). It bounds one read from a client. Set once at startup, before any
 * http_server_new (a process-wide setting, not thread-safe). */
void http_server_set_serv_buf(size_t bytes);
/* http_server_set_fds_per_conn: how many fds one client connection may
 * cost the process at most (its socket, and e.g. a backend connection and
 * an rxguard dup: 3 at the edge and node-api; default 1): lws takes at
 * most (limit - reserve) / n connections. Same rules as set_serv_buf. */
void http_server_set_fds_per_conn(unsigned n);

/* http_callback_default: what protocols[0]'s callback of every daemon
 * returns for the reasons it does not handle (instead of
 * lws_callback_http_dummy, which it calls for the rest):
 * - FILTER_PROTOCOL_CONNECTION: refused. An upgrade reaches the HTTP
 *   protocol when it names no subprotocol (or "http"), on any path; the
 *   stream endpoints are protocols of their own that authorize their
 *   upgrades in their own filter (http_ws_exec_path). Never
 *   HTTP_CONFIRM_UPGRADE (CVE-2025-11677): that passes through untouched.
 * - RAW_ADOPT: refused (lws makes a CONNECT request a raw socket on
 *   protocols[0]; the daemons tunnel nothing).
 * - SERVER_NEW_CLIENT_INSTANTIATED, WSI_DESTROY: the HTTP_UNSERVED_SECS
 *   bound is kept per connection.
 * - FILTER_HTTP_CONNECTION (before LWS_CALLBACK_HTTP): a stream of an
 *   HTTP/2 connection (lws answers "Upgrade: h2c" with 101 before any
 *   callback we may use) closes the whole connection; a request over the
 *   bounds above answers 414/431 and closes. */
int http_callback_default(struct lws *wsi, enum lws_callback_reasons reason,
                          void *user, void *in, size_t len);
/* http_request_started: the first call of every LWS_CALLBACK_HTTP. lws
 * 4.1.6 arms a HTTP_BODY_IDLE_SECS timeout at each request's start and
 * clears it only when a request body is complete: a request without a body
 * whose answer took that long (a 30 s feed long-poll, a download through
 * the edge) was cut. Without a body, the answer may take as long as it
 * takes; with one, lws' body timeout stays until the body is in. */
void http_request_started(struct lws *wsi);
/* http_request_bounds: 0, or 414 / 431 for a request over the bounds. */
int http_request_bounds(struct lws *wsi);
/* http_ws_exec_path: the sandbox id (into sbx) of an HTTP/1.1 upgrade of
 * "GET /v1/sandboxes/{id}/exec/ws" with a valid id; -1 for anything else
 * (another path or method, a bad id, WebSocket over HTTP/2). The filter
 * of the tether.exec.v1 protocol (edge, node-api) starts with it. */
int http_ws_exec_path(struct lws *wsi, char *sbx, size_t cap);

/* http_rxguard: lws 4.1.6 neither reads nor stops polling a client socket
 * while a response is in progress (h1 state DOING_TRANSACTION): any byte
 * the client sends after its request (pipelining) or a half-close leaves
 * EPOLLIN level-triggered and spins the loop until the response ends. A
 * guard watches a dup of the socket while a bodiless request is answered:
 * extra bytes are read and dropped (the connection then closes after this
 * response, so a dropped pipelined request is retried by the client, RFC
 * 9112 9.3.2); end of input or an error closes the connection now. It
 * starts watching only once the request has been in progress for 2 ms (a
 * timer until then): a quick answer costs no syscall, and bytes sent
 * meanwhile stay unread for lws' next request.
 * Start it only when lws reads nothing more for this request (no request
 * body). Owner: the caller; http_rxguard_stop releases it. */
struct http_rxguard;
struct http_rxguard *http_rxguard_start(uv_loop_t *loop, struct lws *wsi,
                                        struct tt_err *err);
/* http_rxguard_stop: stops and frees g (NULL is fine); true when the client
 * sent bytes after its request: the caller then closes the connection
 * after the reply instead of keeping it alive. */
bool http_rxguard_stop(struct http_rxguard *g);

/* http_reply: status + Content-Type + Content-Length + body in one
 * lws_write, then completes the transaction. Returns what the lws callback
 * should return. */
int http_reply(struct lws *wsi, unsigned status, const char *content_type,
               const void *body, size_t len);
/* One more response header: "name:" (lowercase, with its colon), value. */
struct http_hdr {
	const char *name;
	const char *value;
};
/* http_reply_with: http_reply's write with extra headers (the status
 * page's security headers, Set-Cookie, Location), without completing the
 * transaction; -1 when it cannot be written. */
int http_reply_with(struct lws *wsi, unsigned status, const char *content_type,
                    const void *body, size_t len, const struct http_hdr *extra,
                    size_t n_extra);
/* Answering before the request's body is in (a refusal, an upload the disk
 * cannot hold): closing at once would make the kernel reset the connection
 * over the unread bytes, and the client could lose the answer before
 * reading it. So the answer goes out, the rest of the body is read and
 * dropped (at most HTTP_DRAIN_MAX bytes, idle at most HTTP_DRAIN_IDLE_S),
 * and the transaction completes at LWS_CALLBACK_HTTP_BODY_COMPLETION: the
 * connection even stays usable. http_reply_early writes the answer as
 * http_reply does, without completing the transaction, and starts the
 * drain's idle bound (http_drain_begin, for answers written otherwise). */
#define HTTP_DRAIN_MAX (64u << 20)
#define HTTP_DRAIN_IDLE_S 10
int http_reply_early(struct lws *wsi, unsigned status, const char *content_type,
                     const void *body, size_t len);
void http_drain_begin(struct lws *wsi);
/* http_reply_json: serializes obj (reference stolen) and replies. */
int http_reply_json(struct lws *wsi, unsigned status, json_t *obj);
/* http_reply_error: {"error":code,"message":…} with status. */
int http_reply_error(struct lws *wsi, unsigned status, const char *code,
                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* http_expects_continue: the request asked "Expect: 100-continue". */
bool http_expects_continue(struct lws *wsi);
/* http_continue: the interim "100 Continue" (lws 4.1 never sends one):
 * the client may now send the body. Its final answer follows as usual.
 * 0, or -1 when it could not be written (close the connection). */
int http_continue(struct lws *wsi);

/* http_request_id: the request's X-Request-Id into out when it is 1..64
 * characters of [A-Za-z0-9._:-] (returns 1), else a new one, "req_" + 26
 * base32 characters of randomness (returns 0). */
int http_request_id(struct lws *wsi, char out[HTTP_RID_MAX + 1]);
/* http_header: copies header tok into buf (NUL-terminated); returns its
 * length, or -1 when absent or longer than cap - 1. */
int http_header(struct lws *wsi, enum lws_token_indexes tok, char *buf,
                size_t cap);
/* http_wait_seconds: the request's X-Tether-Wait in seconds (0..
 * HTTP_WAIT_MAX_S), HTTP_WAIT_DEFAULT_S when absent; -1 when malformed. */
int http_wait_seconds(struct lws *wsi);
/* How a request announces its body; lws 4.1.6 reads exactly the first
 * Content-Length's bytes and ignores Transfer-Encoding. */
enum http_framing {
	HTTP_BODY_NONE,    /* neither header: no body */
	HTTP_BODY_SIZED,   /* one valid Content-Length (*len, may be 0) */
	HTTP_BODY_UNSIZED, /* Transfer-Encoding (chunked) alone: answer 411 */
	HTTP_BODY_BAD,     /* Content-Length repeated (two fields, or a list),
	                    * not a number, or with Transfer-Encoding: 400 */
};
/* http_body_framing: the request's framing; *len = its Content-Length,
 * -1 when none. The daemons take bodies only with their length announced
 * once: 411 rather than read a chunked request as bodiless, 400 rather than
 * guess which of two lengths counts (request smuggling). */
enum http_framing http_body_framing(struct lws *wsi, long long *len);
/* http_body_unsized: http_body_framing(...) == HTTP_BODY_UNSIZED. */
bool http_body_unsized(struct lws *wsi);
/* http_capability_token: the token of "Authorization: Capability <token>"
 * (printable ASCII, at most cap - 1 bytes) into tok; -1 when absent or
 * malformed. The header copy is zeroed on every path; never logged. */
int http_capability_token(struct lws *wsi, char *tok, size_t cap);
/* http_query: URL-decoded value of query parameter name; -1 when absent. */
int http_query(struct lws *wsi, const char *name, char *buf, size_t cap);

/* A bounded request body being accumulated (owner: the session). */
struct http_body {
	char *buf;
	size_t len;
	size_t max;
};
/* http_body_append: appends; TT_ERR_TOO_LARGE once len would exceed max. */
int http_body_append(struct http_body *b, const void *data, size_t len,
                     struct tt_err *err);
/* http_body_json: parses with JSON_REJECT_DUPLICATES; NULL + err if not an
 * object. */
json_t *http_body_json(const struct http_body *b, struct tt_err *err);
void http_body_free(struct http_body *b);

/* Client: libcurl multi on a libuv loop. */
struct httpc;
typedef void (*httpc_done_fn)(CURL *easy, CURLcode rc, void *arg);
struct httpc *httpc_new(uv_loop_t *loop, struct tt_err *err);
void httpc_free(struct httpc *c);
/* http_easy_direct: the options of every transfer between the cluster's
 * own daemons: http(s) only, no signals, and never a proxy named by the
 * environment (libcurl honours http_proxy even for 127.0.0.1, and these
 * transfers carry capabilities, worker credentials and API keys). */
void http_easy_direct(CURL *easy);
/* httpc_start: adds easy to the multi; done runs on the loop when it
 * finishes; the caller then owns (and cleans up) easy again. */
int httpc_start(struct httpc *c, CURL *easy, httpc_done_fn done, void *arg,
                struct tt_err *err);

#endif

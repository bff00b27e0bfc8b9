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
#define HTTP_WAIT_DEFAULT_S 30
#define HTTP_WAIT_MAX_S 300

/* http_server_new: an lws context on loop, listening on iface:port (iface
 * NULL = all; "127.0.0.1" for local), serving protocols[0] for HTTP (and
 * others for WebSocket). user is the context user pointer. */
struct lws_context *http_server_new(uv_loop_t *loop, const char *iface,
                                    int port,
                                    const struct lws_protocols *protocols,
                                    void *user, struct tt_err *err);
/* http_server_set_serv_buf: lws' per-thread service buffer
 * (pt_serv_buf_size) for servers created after this call; 0 = lws' default
 * (4096). It bounds one read from a client. Set once at startup, before any
 * http_server_new (a process-wide setting, not thread-safe). */
void http_server_set_serv_buf(size_t bytes);

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

/* http_header: copies header tok into buf (NUL-terminated); returns its
 * length, or -1 when absent or longer than cap - 1. */
int http_header(struct lws *wsi, enum lws_token_indexes tok, char *buf,
                size_t cap);
/* http_wait_seconds: the request's X-Tether-Wait in seconds (0..
 * HTTP_WAIT_MAX_S), HTTP_WAIT_DEFAULT_S when absent; -1 when malformed. */
int http_wait_seconds(struct lws *wsi);
/* http_body_unsized: a request body sent without Content-Length (chunked):
 * the daemons take bodies only with their length announced, and answer
 * 411 rather than read the request as bodiless. */
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
 * transfers carry capabilities, node tokens and API keys). */
void http_easy_direct(CURL *easy);
/* httpc_start: adds easy to the multi; done runs on the loop when it
 * finishes; the caller then owns (and cleans up) easy again. */
int httpc_start(struct httpc *c, CURL *easy, httpc_done_fn done, void *arg,
                struct tt_err *err);

#endif

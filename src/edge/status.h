/* The edge's status page (docs/API.md "Status page"): `/` for a browser
 * that logged in once with an API key (POST /login), then holds a
 * session cookie; its data endpoint GET /status/data. Implementation:
 * src/edge/status.c (sessions, login, data), src/edge/status_page.c (the
 * page itself). */
#ifndef TT_EDGE_STATUS_H
#define TT_EDGE_STATUS_H

#include <stddef.h>

#include <libwebsockets.h>
#include <uv.h>

#include "edge/edge_int.h"
#include "http.h"

struct edge_status_req;

/* edge_status_setup: the client the data endpoint asks the control plane
 * with, and its URL (borrowed for the process's life). */
void edge_status_setup(uv_loop_t *loop, struct httpc *hc);
/* What edge_status_http answers when the request is not the page's. */
#define EDGE_STATUS_NOT_MINE 1000
/* edge_status_http: a new request for uri: the page's paths (/, /login,
 * /logout, /status/data, /status.js, /status.css) are served here, *sr
 * holding what is in progress; anything else EDGE_STATUS_NOT_MINE.
 * Otherwise the lws callback result. */
int edge_status_http(struct lws *wsi, struct edge_status_req **sr,
                     const char *method, const char *uri);
/* edge_status_body, edge_status_body_done, edge_status_writable,
 * edge_status_closed: the lws HTTP callbacks of a request in *sr. */
int edge_status_body(struct lws *wsi, struct edge_status_req **sr,
                     const void *in, size_t len);
int edge_status_body_done(struct lws *wsi, struct edge_status_req **sr);
int edge_status_writable(struct lws *wsi, struct edge_status_req **sr);
void edge_status_closed(struct edge_status_req **sr);

/* The page's static parts (src/edge/status_page.c). */
extern const char edge_status_html[];  /* the status page */
extern const char edge_status_login[]; /* the login form; %s: a message */
extern const char edge_status_js[];
extern const char edge_status_css[];

#endif

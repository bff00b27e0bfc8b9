/* WebSocket helpers over lws shared by the client library, the edge's
 * exec relay and the node's exec stream: a queue of outgoing messages and
 * the close-with-reason sent from a timer (the lws 4.1.6 workaround).
 * Implementation: lib/wsutil.c. */
#ifndef TT_WSUTIL_H
#define TT_WSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libwebsockets.h>

#define WS_CLOSE_REASON_MAX 123 /* RFC 6455: 125 minus the code */

/* One queued message; LWS_PRE bytes of headroom precede the data. */
struct ws_msg {
	struct ws_msg *next;
	enum lws_write_protocol kind;
	size_t len;
	uint8_t buf[];
};

/* Messages waiting for lws, oldest first (owns them). */
struct ws_queue {
	struct ws_msg *head, *tail;
	size_t bytes;
};

/* A close with code and reason, sent once the owner's queue is drained.
 * wsi points at the owner's connection field (NULL once it is gone). */
struct ws_close {
	lws_sorted_usec_list_t sul;  /* runs the close outside lws service */
	struct lws *const *wsi;
	uint16_t code;
	bool sent;                   /* the close frame is on its way */
	char reason[WS_CLOSE_REASON_MAX + 1];
};

/* ws_queue_push: queues a copy of data as one message, after a first byte
 * tag unless tag is 0. 0, or -1 when out of memory. */
int ws_queue_push(struct ws_queue *q, enum lws_write_protocol kind,
                  uint8_t tag, const void *data, size_t len);
/* ws_queue_write: writes the head message on wsi; 1 written, 0 empty,
 * -1 failed. */
int ws_queue_write(struct ws_queue *q, struct lws *wsi);
/* ws_queue_clear: drops every queued message. */
void ws_queue_clear(struct ws_queue *q);

/* ws_connect_info: *cc zeroed, then filled for a client connection on ctx
 * to host:port path speaking protocol (all borrowed until connected). */
void ws_connect_info(struct lws_client_connect_info *cc,
                     struct lws_context *ctx, const char *host, int port,
                     const char *path, const char *protocol);

/* ws_close_set: the code and reason (may be NULL) of the close to come. */
void ws_close_set(struct ws_close *c, uint16_t code, const char *reason);
/* ws_close_later: schedules the close on wsi's context (once). */
void ws_close_later(struct ws_close *c, struct lws *wsi);
/* ws_close_cancel: the owner goes away: no close may run after it. */
void ws_close_cancel(struct ws_close *c);

#endif

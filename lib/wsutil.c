/* WebSocket message queue and deferred close over lws (see wsutil.h). */
#include "wsutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ws_queue_push: one allocation per message, owned by q until written. */
int ws_queue_push(struct ws_queue *q, enum lws_write_protocol kind,
                  uint8_t tag, const void *data, size_t len)
{
	size_t total = len + (tag ? 1 : 0);
	struct ws_msg *m = malloc(sizeof(*m) + LWS_PRE + total);

	if (m == NULL)
		return -1;
	m->next = NULL;
	m->kind = kind;
	m->len = total;
	if (tag)
		m->buf[LWS_PRE] = tag;
	if (len > 0)
		memcpy(m->buf + LWS_PRE + (tag ? 1 : 0), data, len);
	if (q->tail)
		q->tail->next = m;
	else
		q->head = m;
	q->tail = m;
	q->bytes += total;
	return 0;
}

/* ws_queue_write: one message per writeable callback, as lws wants. */
int ws_queue_write(struct ws_queue *q, struct lws *wsi)
{
	struct ws_msg *m = q->head;

	if (m == NULL)
		return 0;
	if (lws_write(wsi, m->buf + LWS_PRE, m->len, m->kind) < (int)m->len)
		return -1;
	q->head = m->next;
	if (q->head == NULL)
		q->tail = NULL;
	q->bytes -= m->len;
	free(m);
	return 1;
}

/* ws_queue_clear: frees what was never written. */
void ws_queue_clear(struct ws_queue *q)
{
	struct ws_msg *m;

	while ((m = q->head) != NULL) {
		q->head = m->next;
		free(m);
	}
	q->tail = NULL;
	q->bytes = 0;
}

/* ws_connect_info: the host is also the Host and Origin headers. */
void ws_connect_info(struct lws_client_connect_info *cc,
                     struct lws_context *ctx, const char *host, int port,
                     const char *path, const char *protocol)
{
	memset(cc, 0, sizeof(*cc));
	cc->context = ctx;
	cc->address = host;
	cc->port = port;
	cc->path = path;
	cc->host = host;
	cc->origin = host;
	cc->protocol = protocol;
	cc->local_protocol_name = protocol;
}

/* ws_close_set: the reason is cut to what a close frame can carry. */
void ws_close_set(struct ws_close *c, uint16_t code, const char *reason)
{
	c->code = code;
	snprintf(c->reason, sizeof(c->reason), "%s", reason ? reason : "");
}

/* ws_close_now: closes the connection with the prepared code and reason;
 * lws sends the close frame and waits for the peer's. */
static void ws_close_now(lws_sorted_usec_list_t *sul)
{
	struct ws_close *c = lws_container_of(sul, struct ws_close, sul);
	struct lws *wsi = *c->wsi;

	if (wsi == NULL)
		return;
	lws_close_reason(wsi, (enum lws_close_status)c->code,
	                 (unsigned char *)c->reason, strlen(c->reason));
	lws_close_free_wsi(wsi, (enum lws_close_status)c->code, "tether close");
}

/* ws_close_later: not "return -1" from the writeable callback (nor a
 * timeout): the Debian lws 4.1 build (_DEBUG, libuv) then kills the
 * connection before the close frame goes out. Closed from a timer
 * instead, it is sent. */
void ws_close_later(struct ws_close *c, struct lws *wsi)
{
	if (c->sent)
		return;
	c->sent = true;
	lws_sul_schedule(lws_get_context(wsi), 0, &c->sul, ws_close_now, 1);
}

/* ws_close_cancel: a pending timer would otherwise touch freed memory. */
void ws_close_cancel(struct ws_close *c)
{
	lws_sul_cancel(&c->sul);
}

/* node-api: file transfer out. File reads are streamed with Content-Length
 * (the guest announces the size in META before the bytes; a broken stream
 * closes the connection short of that length, so the client sees it);
 * small ones go out in one write. Directory listings arrive as
 * newline-delimited JSON entries and are answered as one bounded JSON
 * body. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "log.h"
#include "node/api_int.h"

/* stream_fail: see api_int.h. */
void stream_fail(struct api_op *op, enum wire_code code, const char *msg)
{
	if (!op->headers_sent) {
		op_reply_error(op, code, msg);
		return;
	}
	log_warn("files_get %s: broken after the headers: %s", op->sbx, msg);
	wireconn_close(op->mc);
	op->mc = NULL;
	op->stream_abort = true;
	op->state = OP_STREAM;
	if (op->wsi != NULL)
		lws_callback_on_writable(op->wsi);
}

/* stream_on_meta: see api_int.h. */
void stream_on_meta(struct api_op *op, const struct wire_frame *f)
{
	json_error_t jerr;
	json_t *m = json_loadb((const char *)f->payload, f->len,
	                       JSON_REJECT_DUPLICATES, &jerr);
	json_t *size = json_object_get(m, "size");

	if (op->have_meta || !json_is_integer(size) ||
	    json_integer_value(size) < 0) {
		json_decref(m);
		stream_fail(op, WIRE_E_TRANSPORT, "the sandbox sent an invalid META");
		return;
	}
	op->content_len = (uint64_t)json_integer_value(size);
	op->have_meta = true;
	op->state = OP_STREAM;
	json_decref(m);
	/* A small read waits for RESULT and then goes out whole (headers and
	 * body in one write, stream_write_whole); it never reaches
	 * API_STREAM_HIGH, so the manager is never paused waiting on it. */
	if (op->content_len > API_WHOLE_MAX)
		lws_callback_on_writable(op->wsi);
}

/* stream_push: see api_int.h. */
void stream_push(struct api_op *op, const uint8_t *data, size_t len)
{
	struct api_chunk *c;

	if (!op->have_meta || len > op->content_len - op->got) {
		stream_fail(op, WIRE_E_TRANSPORT,
		            op->have_meta ? "the sandbox sent more bytes than announced"
		                          : "the sandbox sent bytes before META");
		return;
	}
	c = malloc(sizeof(*c) + len);
	if (c == NULL) {
		stream_fail(op, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	op->got += len;
	c->next = NULL;
	c->len = len;
	memcpy(c->data, data, len);
	if (op->q_tail)
		op->q_tail->next = c;
	else
		op->q_head = c;
	op->q_tail = c;
	op->q_bytes += len;
	op->state = OP_STREAM;
	if (op->q_bytes > API_STREAM_HIGH && !op->mc_paused) {
		op->mc_paused = true;
		wireconn_pause(op->mc);
	}
}

/* list_feed: see api_int.h. */
void list_feed(struct api_op *op, const uint8_t *data, size_t len)
{
	for (size_t i = 0; i < len; i++)
		op->list_lines += data[i] == '\n';
	if (op->list_lines > API_LIST_MAX) {
		op_reply_error(op, WIRE_E_TOO_LARGE,
		               "the directory has more than 10000 entries");
		return;
	}
	if (buf_append(&op->out, data, len, API_LIST_BYTES_MAX) < 0) {
		op_reply_error(op, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	if (op->out.truncated)
		op_reply_error(op, WIRE_E_TOO_LARGE, "the listing is over 4 MiB");
}

/* list_build: see api_int.h. */
json_t *list_build(struct api_op *op, json_t *total)
{
	json_t *arr = json_array();
	size_t off = 0;

	if (arr == NULL || !json_is_integer(total) ||
	    json_integer_value(total) != (json_int_t)op->list_lines ||
	    (op->out.len > 0 && op->out.p[op->out.len - 1] != '\n'))
		goto bad;
	while (off < op->out.len) {
		const uint8_t *nl = memchr(op->out.p + off, '\n', op->out.len - off);
		size_t l = (size_t)(nl - (op->out.p + off));
		json_error_t jerr;
		json_t *e = json_loadb((const char *)op->out.p + off, l,
		                       JSON_REJECT_DUPLICATES, &jerr);

		if (!json_is_object(e) || json_array_append_new(arr, e) < 0) {
			json_decref(e);
			goto bad;
		}
		off += l + 1;
	}
	return arr;
bad:
	json_decref(arr);
	return NULL;
}

/* stream_done: the whole announced length is out: count, free, and finish
 * the HTTP transaction (keep-alive). */
static int stream_done(struct lws *wsi, struct api_pss *pss, struct api_op *op)
{
	bool extra = http_rxguard_stop(op->rxg);

	op->rxg = NULL;
	api_op_count(op, 200);
	pss->op = NULL;
	op_free(op);
	/* bytes after the request were dropped: close, never keep alive */
	return extra || lws_http_transaction_completed(wsi) ? -1 : 0;
}

/* download_headers: a file download's status line and headers, finalized,
 * at *p (advanced); 0 or -1 when they do not fit before end. */
static int download_headers(struct lws *wsi, uint64_t content_len, uint8_t **p,
                            uint8_t *end)
{
	if (lws_add_http_header_status(wsi, 200 | LWSAHH_FLAG_NO_SERVER_NAME, p, end) ||
	    lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE,
	            (const uint8_t *)"application/octet-stream", 24, p, end) ||
	    lws_add_http_header_content_length(wsi, content_len, p, end) ||
	    lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
	            (const uint8_t *)"no-store", 8, p, end) ||
	    lws_finalize_http_header(wsi, p, end))
		return -1;
	return 0;
}

/* stream_write_whole: a small read already complete (RESULT confirmed it):
 * headers and the whole body in one lws_write, as small replies go, instead
 * of a headers write, a writeable round trip and a body write. */
static int stream_write_whole(struct lws *wsi, struct api_pss *pss, struct api_op *op)
{
	const size_t head_room = 512;
	_cleanup_free_ uint8_t *buf = malloc(LWS_PRE + head_room + op->content_len);
	uint8_t *start, *p, *end;

	if (buf == NULL)
		return -1;
	start = p = buf + LWS_PRE;
	end = start + head_room;
	if (download_headers(wsi, op->content_len, &p, end) < 0)
		return -1;
	while (op->q_head != NULL) {
		struct api_chunk *c = op->q_head;

		memcpy(p, c->data, c->len);
		p += c->len;
		op->sent += c->len;
		op->q_head = c->next;
		op->q_bytes -= c->len;
		free(c);
	}
	op->q_tail = NULL;
	op->headers_sent = true;
	if (lws_write(wsi, start, (size_t)(p - start), LWS_WRITE_HTTP_FINAL) < (int)(p - start))
		return -1;
	return stream_done(wsi, pss, op);
}

/* stream_write: see api_int.h. */
int stream_write(struct lws *wsi, struct api_pss *pss, struct api_op *op)
{
	if (op->stream_abort) {
		api_op_count(op, 599); /* broken after 200 */
		pss->op = NULL;
		op_free(op);
		return -1;
	}
	if (!op->have_meta)
		return 0;
	if (!op->headers_sent && op->stream_end && op->sent == 0 &&
	    op->q_bytes == op->content_len && op->content_len <= API_WHOLE_MAX)
		return stream_write_whole(wsi, pss, op);
	if (!op->headers_sent) {
		uint8_t hb[LWS_PRE + 512], *start = hb + LWS_PRE, *p = start,
		        *end = hb + sizeof(hb);

		if (download_headers(wsi, op->content_len, &p, end) < 0 ||
		    lws_write(wsi, start, (size_t)(p - start), LWS_WRITE_HTTP_HEADERS) !=
		            (int)(p - start))
			return -1;
		op->headers_sent = true;
		if (op->q_head != NULL || op->stream_end)
			lws_callback_on_writable(wsi);
		return 0;
	}
	if (op->q_head != NULL) {
		struct api_chunk *c = op->q_head;
		bool last = op->sent + c->len == op->content_len;
		_cleanup_free_ uint8_t *b = NULL;

		if (last && !op->stream_end)
			return 0; /* wait for RESULT; it asks for a write again */
		b = malloc(LWS_PRE + c->len);
		if (b == NULL)
			return -1;
		memcpy(b + LWS_PRE, c->data, c->len);
		if (lws_write(wsi, b + LWS_PRE, c->len,
		              last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)c->len)
			return -1;
		op->sent += c->len;
		op->q_head = c->next;
		if (op->q_head == NULL)
			op->q_tail = NULL;
		op->q_bytes -= c->len;
		free(c);
		if (last)
			return stream_done(wsi, pss, op);
		if (op->mc_paused && op->q_bytes < API_STREAM_LOW && op->mc != NULL) {
			op->mc_paused = false;
			wireconn_resume(op->mc);
		}
		if (op->q_head != NULL)
			lws_callback_on_writable(wsi);
		return 0;
	}
	if (op->stream_end && op->sent == op->content_len)
		return stream_done(wsi, pss, op); /* an empty file */
	return 0;
}

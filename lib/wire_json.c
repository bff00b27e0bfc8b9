/* JSON payloads over wire frames (see wire_json.h). */
#include "wire_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"

/* wire_send_json: serializes obj compactly and sends it as one frame. */
int wire_send_json(int fd, uint8_t type, json_t *obj, struct tt_err *err)
{
	_cleanup_free_ char *text = NULL;
	size_t len;

	if (obj == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "wire: NULL JSON object");
	text = json_dumps(obj, JSON_COMPACT);
	if (text == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "wire: cannot serialize JSON");
	len = strlen(text);
	if (len > WIRE_PAYLOAD_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "wire: JSON payload of %zu bytes over the limit", len);
	return wire_send(fd, type, text, (uint32_t)len, err);
}

/* wire_frame_json: strict parse of a frame payload into a JSON object. */
json_t *wire_frame_json(const struct wire_frame *f, struct tt_err *err)
{
	json_error_t jerr;
	json_t *obj;

	if (f == NULL || (f->len > 0 && f->payload == NULL)) {
		tt_err_set(err, TT_ERR_INVALID, "wire: no frame");
		return NULL;
	}
	if (f->len > WIRE_PAYLOAD_MAX) {
		tt_err_set(err, TT_ERR_TOO_LARGE, "wire: frame over the limit");
		return NULL;
	}
	obj = json_loadb((const char *)f->payload, f->len,
	                 JSON_REJECT_DUPLICATES, &jerr);
	if (obj == NULL) {
		tt_err_set(err, TT_ERR_MALFORMED, "wire: %s payload is not JSON: %s",
		           wire_type_name(f->type), jerr.text);
		return NULL;
	}
	if (!json_is_object(obj)) {
		json_decref(obj);
		tt_err_set(err, TT_ERR_MALFORMED,
		           "wire: %s payload is not a JSON object",
		           wire_type_name(f->type));
		return NULL;
	}
	return obj;
}

/* wire_send_error: sends an ERROR frame with a stable code and a message. */
int wire_send_error(int fd, enum wire_code code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *obj;
	int rc;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	obj = json_pack("{s:s, s:s}", "error", wirecode_name(code), "message", msg);
	if (obj == NULL) {
		/* Invalid UTF-8 in the message: still send the code. */
		obj = json_pack("{s:s, s:s}", "error", wirecode_name(code), "message",
		                "(message not valid UTF-8)");
		if (obj == NULL)
			return -1;
	}
	rc = wire_send_json(fd, WIRE_ERROR, obj, NULL);
	json_decref(obj);
	return rc;
}

/* wire_error_closing: see wire_json.h. */
bool wire_error_closing(const struct wire_frame *f)
{
	json_t *o;
	bool yes;

	if (f->type != WIRE_ERROR)
		return false;
	o = json_loadb((const char *)f->payload, f->len, JSON_REJECT_DUPLICATES, NULL);
	yes = json_is_true(json_object_get(o, "closing"));
	json_decref(o);
	return yes;
}

/* JSON helpers on top of the wire protocol (wire.h): REQUEST, DECISION,
 * RESULT, ERROR and HELLO payloads are JSON objects. Shared by the guest
 * agent, host bridge, sbx-manager and node-api. */
#ifndef TT_WIRE_JSON_H
#define TT_WIRE_JSON_H

#include <stdbool.h>

#include <jansson.h>
#include <stdint.h>

#include "err.h"
#include "wire.h"
#include "wirecode.h"

/* wire_send_json: sends obj (compact) as one frame of type. Does not steal
 * the reference. A serialization over WIRE_PAYLOAD_MAX is TT_ERR_TOO_LARGE. */
int wire_send_json(int fd, uint8_t type, json_t *obj, struct tt_err *err);
/* wire_frame_json: parses a frame payload as a JSON object (duplicate keys
 * and NUL bytes refused). Returns a new reference, or NULL with err. */
json_t *wire_frame_json(const struct wire_frame *f, struct tt_err *err);
/* wire_error_closing: f is an ERROR whose sender closes the connection
 * after it ({"closing":true}): the connection ends there and must not be
 * reused, though the operation ended on an ERROR as a clean one does. */
bool wire_error_closing(const struct wire_frame *f);
/* wire_send_error: sends ERROR {"error":code,"message":…}; 0 or -1 (a peer
 * that is already gone is not worth more than the return value). */
int wire_send_error(int fd, enum wire_code code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#endif

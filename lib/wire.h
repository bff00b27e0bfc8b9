/* The framed, versioned wire protocol on every unix-socket hop
 * (node-api -> sbx-manager -> host bridge -> guest agent).
 *
 * A frame is a 12-byte header then len payload bytes:
 *   u32 magic "TTW\0"-style constant, u8 version, u8 type, u16 zero, u32 len
 * all big-endian. Every receiver checks magic, version, type, the reserved
 * field and len <= WIRE_PAYLOAD_MAX before reading the payload, and refuses
 * the connection on any violation (TT_ERR_MALFORMED / TT_ERR_TOO_LARGE).
 *
 * Operations run in sequence on a connection, one at a time. The opener
 * sends REQUEST (a JSON object,
 * see docs/ARCHITECTURE.md "Wire protocol"), then optional DATA_IN frames and
 * EOF_IN; the answering side may send one META first (what the opener
 * needs before the bytes, e.g. fs.read's {"size":N}, so node-api can send
 * Content-Length), then DATA_OUT / STDERR frames, and ends with exactly one
 * RESULT or ERROR; only then may the next REQUEST follow. DATA_IN /
 * EOF_IN that arrive between operations are input the finished operation
 * did not take: the receiver drops them. DECISION only travels
 * sbx-manager -> node-api.
 * Implementation: lib/wire.c (no libuv, no jansson: the guest links it
 * statically, the JSON helpers are in wire_json.h). */
#ifndef TT_WIRE_H
#define TT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define WIRE_MAGIC 0x54545700u /* "TTW\0" */
#define WIRE_VERSION 1
#define WIRE_HDR_LEN 12
#define WIRE_PAYLOAD_MAX (64u * 1024u)

enum wire_type {
	WIRE_REQUEST = 1,  /* JSON: the operation */
	WIRE_DECISION = 2, /* JSON: admission verdict (manager -> node-api) */
	WIRE_DATA_IN = 3,  /* bytes into the operation (stdin, file content) */
	WIRE_EOF_IN = 4,   /* no more input */
	WIRE_DATA_OUT = 5, /* bytes out (stdout, file content) */
	WIRE_STDERR = 6,   /* bytes out (stderr) */
	WIRE_RESULT = 7,   /* JSON: final result; ends the operation */
	WIRE_ERROR = 8,    /* JSON {"error":code,"message":…}; ends the operation */
	WIRE_HELLO = 9,    /* JSON: handshake (guest identity proof) */
	WIRE_META = 10,    /* JSON: answering side -> opener, before any DATA_OUT */
	WIRE_TYPE_MAX = WIRE_META,
};

struct wire_frame {
	uint8_t type;
	uint32_t len;
	uint8_t *payload; /* points into the caller's buffer; NUL-terminated */
};

/* wire_hdr_encode: writes the header for a frame of type and len. */
void wire_hdr_encode(uint8_t out[WIRE_HDR_LEN], uint8_t type, uint32_t len);
/* wire_hdr_decode: validates a header; fills type and len. */
int wire_hdr_decode(const uint8_t in[WIRE_HDR_LEN], uint8_t *type,
                    uint32_t *len, struct tt_err *err);

/* Blocking helpers for simple peers (guest, tests). EINTR is retried. */
int wire_send(int fd, uint8_t type, const void *payload, uint32_t len,
              struct tt_err *err);
/* One frame to send with wire_send_frames. */
struct wire_out {
	uint8_t type;
	const void *payload;
	uint32_t len;
};
#define WIRE_SEND_FRAMES_MAX 8
/* wire_send_frames: n (<= WIRE_SEND_FRAMES_MAX) frames in one sendmsg, so
 * the peer wakes once for a whole small answer; each frame checked as by
 * wire_send before anything is sent. */
int wire_send_frames(int fd, const struct wire_out *frames, size_t n,
                     struct tt_err *err);
/* wire_recv: reads one whole frame into buf (cap >= WIRE_PAYLOAD_MAX + 1).
 * Returns 1 on a frame, 0 on clean EOF before a header, -1 on error. */
int wire_recv(int fd, struct wire_frame *f, uint8_t *buf, size_t cap,
              struct tt_err *err);

/* Incremental decoder for event loops: feed bytes as they arrive. */
struct wire_reader {
	uint8_t hdr[WIRE_HDR_LEN];
	size_t hdr_have;
	uint8_t type;
	uint32_t len;
	size_t have;
	uint8_t payload[WIRE_PAYLOAD_MAX + 1];
};
void wire_reader_init(struct wire_reader *r);
/* wire_reader_feed: consumes up to len bytes (sets *used). Returns 1 when a
 * frame is complete (out points into r, valid until the next feed), 0 when
 * more bytes are needed, -1 on a protocol violation. */
int wire_reader_feed(struct wire_reader *r, const uint8_t *data, size_t len,
                     size_t *used, struct wire_frame *out, struct tt_err *err);

const char *wire_type_name(uint8_t type);

#endif

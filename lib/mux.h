/* Stream multiplexing over the one host <-> guest channel of a microVM
 * (virtio-serial over a QEMU chardev unix socket: SPEC §9). Both ends of
 * that channel use this codec: the host bridge (src/bridge/vmchan.c, on
 * libuv) and the guest agent as PID 1 of the VM (src/guest/vmchan.c, on
 * poll). I/O-free: framing, the incremental decoder and the per-stream
 * credit arithmetic only, so the decoder is fuzzed (fuzz/fuzz_mux.c).
 *
 * Frame: a 12-byte header, then at most MUX_PAYLOAD_MAX bytes:
 *   "TM" | version 1 | type | stream id (u32 BE) | payload length (u32 BE)
 *
 * A session (one connection of the bridge to the chardev) starts with
 *   host -> guest  SYNC    id 0, MUX_NONCE_LEN random bytes
 *   host -> guest  ASSIGN  id 0, the activation (guest assignment format:
 *                          src/guest/assign.c: 32-byte secret, then sbx,
 *                          generation, activation as NUL-terminated words)
 *   guest -> host  SYNC_OK id 0, the same nonce
 *   guest -> host  ASSIGN_OK id 0, empty (or RST id 0 with a reason)
 * Bytes left in the channel from an earlier session (a dropped bridge, a
 * VM resumed from a snapshot taken mid-frame) are skipped by scanning:
 * the guest for a SYNC header, the bridge for a SYNC_OK carrying its
 * nonce (mux_reader with sync set). Then streams, opened by the host only,
 * ids strictly increasing within a session:
 *   OPEN id        a new stream (the guest serves it as one connection)
 *   DATA id bytes  at most the sender's credit for that stream
 *   CREDIT id n    the receiver consumed n more bytes (u32 BE)
 *   EOF id         the sender will send no more DATA on it
 *   RST id         the stream is gone, both ways (any side, any time)
 * Each side may have at most MUX_WINDOW bytes of a stream unacknowledged:
 * a slow reader of one stream stalls only that stream, never the channel
 * (DATA beyond the credit is a protocol violation: the session ends). */
#ifndef TT_MUX_H
#define TT_MUX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define MUX_HDR_LEN 12
#define MUX_VERSION 1
#define MUX_PAYLOAD_MAX 16384u
#define MUX_NONCE_LEN 16
/* Bytes a sender may have outstanding per stream (each direction). */
#define MUX_WINDOW (256u * 1024u)
/* A receiver returns credit once this much was consumed (or all of it). */
#define MUX_CREDIT_BATCH (32u * 1024u)
/* Streams open at once on one session (each is a handler process in the
 * guest, which refuses more with RST). */
#define MUX_STREAMS_MAX 64u
/* An assignment payload at most (src/guest/guest.h GUEST_ASSIGN_MAX). */
#define MUX_ASSIGN_MAX 256u

enum mux_type {
	MUX_SYNC = 1,
	MUX_SYNC_OK = 2,
	MUX_ASSIGN = 3,
	MUX_ASSIGN_OK = 4,
	MUX_OPEN = 5,
	MUX_DATA = 6,
	MUX_CREDIT = 7,
	MUX_EOF = 8,
	MUX_RST = 9,
	MUX_TYPE_MAX = MUX_RST,
};

struct mux_frame {
	uint8_t type;
	uint32_t id;
	uint32_t len;
	const uint8_t *payload; /* into the reader's buffer, until the next feed */
};

/* mux_hdr_encode: the header of a frame of type for stream id, len bytes. */
void mux_hdr_encode(uint8_t out[MUX_HDR_LEN], uint8_t type, uint32_t id, uint32_t len);

/* mux_frame_check: a decoded header's rules: known type, length within
 * bounds for the type (SYNC/SYNC_OK exactly MUX_NONCE_LEN, CREDIT 4, OPEN,
 * EOF, ASSIGN_OK empty, ASSIGN 1..MUX_ASSIGN_MAX, DATA 1..MUX_PAYLOAD_MAX,
 * RST 0..256), id 0 exactly for the session frames. 0 or -1 with err. */
int mux_frame_check(uint8_t type, uint32_t id, uint32_t len, struct tt_err *err);

/* Incremental decoder. With want (sync mode), every byte before a header
 * of type want, id 0, length MUX_NONCE_LEN (and, with nonce set, that
 * very payload) is skipped; the frame found is returned and the reader
 * leaves sync mode. */
struct mux_reader {
	uint8_t hdr[MUX_HDR_LEN];
	size_t hdr_have;
	uint8_t type;
	uint32_t id, len;
	size_t have;
	bool in_payload;
	uint8_t want;                  /* 0: normal decoding */
	bool want_nonce;
	uint8_t nonce[MUX_NONCE_LEN];
	uint64_t skipped;              /* bytes dropped while syncing */
	uint8_t payload[MUX_PAYLOAD_MAX];
};

/* mux_reader_init: a reader at a frame boundary, not syncing. */
void mux_reader_init(struct mux_reader *r);
/* mux_reader_sync: skip to the next frame of type want (see above);
 * nonce NULL: any payload of the right length. */
void mux_reader_sync(struct mux_reader *r, uint8_t want, const uint8_t *nonce);
/* mux_reader_feed: consumes up to len bytes (*used). 1: a frame is in out
 * (valid until the next feed); 0: more bytes needed; -1: a protocol
 * violation (err says which; the session must end or resync). */
int mux_reader_feed(struct mux_reader *r, const uint8_t *data, size_t len,
                    size_t *used, struct mux_frame *out, struct tt_err *err);

/* Credit of one stream in one direction, as its sender and its receiver
 * see it. */
struct mux_credit {
	uint32_t send;      /* bytes we may still send */
	uint32_t recv_left; /* bytes the peer may still send us */
	uint32_t consumed;  /* bytes consumed since the last CREDIT we sent */
};

/* mux_credit_init: both directions at MUX_WINDOW. */
void mux_credit_init(struct mux_credit *c);
/* mux_credit_on_data: the peer sent n bytes: -1 when beyond its credit. */
int mux_credit_on_data(struct mux_credit *c, uint32_t n);
/* mux_credit_on_grant: a CREDIT of n from the peer: -1 when it would lift
 * our credit past MUX_WINDOW (a peer granting what we never sent). */
int mux_credit_on_grant(struct mux_credit *c, uint32_t n);
/* mux_credit_consumed: n received bytes were consumed; returns how much
 * credit to grant now (0: not yet worth a frame), already accounted. */
uint32_t mux_credit_consumed(struct mux_credit *c, uint32_t n, bool flush);

/* mux_type_name: "DATA", ... or "?". */
const char *mux_type_name(uint8_t type);

#endif

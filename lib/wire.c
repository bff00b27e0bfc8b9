/* The framed wire protocol (see wire.h): header codec, blocking send and
 * receive for simple peers, and an incremental reader for event loops.
 * No jansson here: the JSON helpers live in wire_json.c. */
#include "wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/* put_be32: stores v big-endian at p. */
static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* get_be32: loads a big-endian u32 from p. */
static uint32_t get_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* wire_hdr_encode: writes the 12-byte header for a frame of type and len. */
void wire_hdr_encode(uint8_t out[WIRE_HDR_LEN], uint8_t type, uint32_t len)
{
	put_be32(out, WIRE_MAGIC);
	out[4] = WIRE_VERSION;
	out[5] = type;
	out[6] = 0;
	out[7] = 0;
	put_be32(out + 8, len);
}

/* wire_hdr_decode: checks every header field before anyone reads a payload
 * byte, so a bad or oversized frame is refused on its header alone. */
int wire_hdr_decode(const uint8_t in[WIRE_HDR_LEN], uint8_t *type,
                    uint32_t *len, struct tt_err *err)
{
	uint32_t magic = get_be32(in);
	uint32_t n = get_be32(in + 8);

	if (magic != WIRE_MAGIC)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "wire: bad magic 0x%08x", magic);
	if (in[4] != WIRE_VERSION)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "wire: unsupported version %u", in[4]);
	if (in[5] < WIRE_REQUEST || in[5] > WIRE_TYPE_MAX)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "wire: unknown frame type %u", in[5]);
	if (in[6] != 0 || in[7] != 0)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "wire: reserved header bytes not zero");
	if (n > WIRE_PAYLOAD_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "wire: frame length %u over the %u byte limit",
		                  n, WIRE_PAYLOAD_MAX);
	*type = in[5];
	*len = n;
	return 0;
}

/* write_iov: writes all of iov; sockets use MSG_NOSIGNAL so a vanished peer
 * is an error value, not a SIGPIPE that kills the process. */
static int write_iov(int fd, struct iovec *iov, int cnt, struct tt_err *err)
{
	int use_send = 1;

	while (cnt > 0) {
		ssize_t n;

		if (use_send) {
			struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)cnt };

			n = sendmsg(fd, &mh, MSG_NOSIGNAL);
			if (n < 0 && errno == ENOTSOCK) {
				use_send = 0;
				continue;
			}
		} else {
			n = writev(fd, iov, cnt);
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return tt_err_sys(err, TT_ERR_TRANSPORT, "wire: send");
		}
		while (cnt > 0 && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

/* wire_send: writes one whole frame (header and payload in one call where
 * the kernel allows, so small frames are one segment). */
int wire_send(int fd, uint8_t type, const void *payload, uint32_t len,
              struct tt_err *err)
{
	uint8_t hdr[WIRE_HDR_LEN];
	struct iovec iov[2];

	if (type < WIRE_REQUEST || type > WIRE_TYPE_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "wire: bad frame type %u", type);
	if (len > WIRE_PAYLOAD_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "wire: payload of %u bytes over the limit", len);
	if (len > 0 && payload == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "wire: NULL payload");
	wire_hdr_encode(hdr, type, len);
	iov[0].iov_base = hdr;
	iov[0].iov_len = sizeof(hdr);
	iov[1].iov_base = (void *)payload;
	iov[1].iov_len = len;
	return write_iov(fd, iov, len > 0 ? 2 : 1, err);
}

/* wire_send_frames: headers and payloads of all frames in one iovec. */
int wire_send_frames(int fd, const struct wire_out *frames, size_t n,
                     struct tt_err *err)
{
	uint8_t hdr[WIRE_SEND_FRAMES_MAX][WIRE_HDR_LEN];
	struct iovec iov[2 * WIRE_SEND_FRAMES_MAX];
	int cnt = 0;

	if (n > WIRE_SEND_FRAMES_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "wire: %zu frames in one send", n);
	for (size_t i = 0; i < n; i++) {
		const struct wire_out *f = &frames[i];

		if (f->type < WIRE_REQUEST || f->type > WIRE_TYPE_MAX)
			return tt_err_set(err, TT_ERR_INVALID, "wire: bad frame type %u",
			                  f->type);
		if (f->len > WIRE_PAYLOAD_MAX)
			return tt_err_set(err, TT_ERR_TOO_LARGE,
			                  "wire: payload of %u bytes over the limit", f->len);
		if (f->len > 0 && f->payload == NULL)
			return tt_err_set(err, TT_ERR_INVALID, "wire: NULL payload");
		wire_hdr_encode(hdr[i], f->type, f->len);
		iov[cnt].iov_base = hdr[i];
		iov[cnt++].iov_len = WIRE_HDR_LEN;
		if (f->len > 0) {
			iov[cnt].iov_base = (void *)f->payload;
			iov[cnt++].iov_len = f->len;
		}
	}
	return cnt > 0 ? write_iov(fd, iov, cnt, err) : 0;
}

/* read_full: reads exactly len bytes; returns the count read before EOF
 * (less than len only on EOF), or -1 on error. */
static ssize_t read_full(int fd, uint8_t *buf, size_t len, struct tt_err *err)
{
	size_t have = 0;

	while (have < len) {
		ssize_t n = read(fd, buf + have, len - have);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return tt_err_sys(err, TT_ERR_TRANSPORT, "wire: receive");
		}
		if (n == 0)
			break;
		have += (size_t)n;
	}
	return (ssize_t)have;
}

/* wire_recv: reads one whole frame; the header is validated before a single
 * payload byte is read. */
int wire_recv(int fd, struct wire_frame *f, uint8_t *buf, size_t cap,
              struct tt_err *err)
{
	uint8_t hdr[WIRE_HDR_LEN];
	ssize_t n;
	uint32_t len;
	uint8_t type;

	n = read_full(fd, hdr, sizeof(hdr), err);
	if (n < 0)
		return -1;
	if (n == 0)
		return 0;
	if ((size_t)n < sizeof(hdr))
		return tt_err_set(err, TT_ERR_TRANSPORT,
		                  "wire: connection closed inside a frame header");
	if (wire_hdr_decode(hdr, &type, &len, err) < 0)
		return -1;
	if (buf == NULL || cap < (size_t)len + 1)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "wire: %u byte frame does not fit the buffer", len);
	n = read_full(fd, buf, len, err);
	if (n < 0)
		return -1;
	if ((size_t)n < len)
		return tt_err_set(err, TT_ERR_TRANSPORT,
		                  "wire: connection closed inside a frame payload");
	buf[len] = '\0';
	f->type = type;
	f->len = len;
	f->payload = buf;
	return 1;
}

/* wire_reader_init: resets the reader to expect a frame header. */
void wire_reader_init(struct wire_reader *r)
{
	r->hdr_have = 0;
	r->type = 0;
	r->len = 0;
	r->have = 0;
	r->payload[0] = '\0';
}

/* wire_reader_feed: consumes bytes up to the end of one frame. A completed
 * frame leaves the reader ready for the next header; after -1 the stream is
 * unusable and the caller closes it. */
int wire_reader_feed(struct wire_reader *r, const uint8_t *data, size_t len,
                     size_t *used, struct wire_frame *out, struct tt_err *err)
{
	size_t off = 0;

	*used = 0;
	if (r->hdr_have < WIRE_HDR_LEN) {
		size_t take = WIRE_HDR_LEN - r->hdr_have;

		if (take > len)
			take = len;
		if (take > 0)
			memcpy(r->hdr + r->hdr_have, data, take);
		r->hdr_have += take;
		off += take;
		*used = off;
		if (r->hdr_have < WIRE_HDR_LEN)
			return 0;
		if (wire_hdr_decode(r->hdr, &r->type, &r->len, err) < 0)
			return -1;
		r->have = 0;
	}
	if (r->have < r->len) {
		size_t take = r->len - r->have;

		if (take > len - off)
			take = len - off;
		if (take > 0)
			memcpy(r->payload + r->have, data + off, take);
		r->have += take;
		off += take;
		*used = off;
		if (r->have < r->len)
			return 0;
	}
	r->payload[r->len] = '\0';
	out->type = r->type;
	out->len = r->len;
	out->payload = r->payload;
	/* Ready for the next header; the payload stays until the next feed. */
	r->hdr_have = 0;
	r->have = 0;
	return 1;
}

/* wire_type_name: short name of a frame type for logs and errors. */
const char *wire_type_name(uint8_t type)
{
	switch (type) {
	case WIRE_REQUEST: return "REQUEST";
	case WIRE_DECISION: return "DECISION";
	case WIRE_DATA_IN: return "DATA_IN";
	case WIRE_EOF_IN: return "EOF_IN";
	case WIRE_DATA_OUT: return "DATA_OUT";
	case WIRE_STDERR: return "STDERR";
	case WIRE_RESULT: return "RESULT";
	case WIRE_ERROR: return "ERROR";
	case WIRE_HELLO: return "HELLO";
	case WIRE_META: return "META";
	}
	return "UNKNOWN";
}

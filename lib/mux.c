/* The channel multiplexer's codec (lib/mux.h): framing, the bounded
 * incremental decoder with session resynchronisation, credit arithmetic. */
#include <string.h>

#include "mux.h"

/* put32: big-endian u32. */
static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* get32: big-endian u32. */
static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* mux_hdr_encode: see mux.h. */
void mux_hdr_encode(uint8_t out[MUX_HDR_LEN], uint8_t type, uint32_t id, uint32_t len)
{
	out[0] = 'T';
	out[1] = 'M';
	out[2] = MUX_VERSION;
	out[3] = type;
	put32(out + 4, id);
	put32(out + 8, len);
}

/* mux_frame_check: see mux.h. */
int mux_frame_check(uint8_t type, uint32_t id, uint32_t len, struct tt_err *err)
{
	bool session = type == MUX_SYNC || type == MUX_SYNC_OK || type == MUX_ASSIGN ||
	               type == MUX_ASSIGN_OK;
	bool ok;

	if (type == 0 || type > MUX_TYPE_MAX)
		return tt_err_set(err, TT_ERR_MALFORMED, "mux: unknown frame type %u", type);
	if (session != (id == 0) && type != MUX_RST)
		return tt_err_set(err, TT_ERR_MALFORMED, "mux: %s with stream id %u",
		                  mux_type_name(type), (unsigned)id);
	switch (type) {
	case MUX_SYNC:
	case MUX_SYNC_OK: ok = len == MUX_NONCE_LEN; break;
	case MUX_ASSIGN: ok = len >= 1 && len <= MUX_ASSIGN_MAX; break;
	case MUX_CREDIT: ok = len == 4; break;
	case MUX_DATA: ok = len >= 1 && len <= MUX_PAYLOAD_MAX; break;
	case MUX_RST: ok = len <= 256; break;
	default: ok = len == 0; break; /* OPEN, EOF, ASSIGN_OK */
	}
	if (!ok)
		return tt_err_set(err, TT_ERR_MALFORMED, "mux: %s with %u payload bytes",
		                  mux_type_name(type), (unsigned)len);
	return 0;
}

/* mux_reader_init: see mux.h. */
void mux_reader_init(struct mux_reader *r)
{
	r->hdr_have = 0;
	r->have = 0;
	r->in_payload = false;
	r->want = 0;
	r->want_nonce = false;
	r->skipped = 0;
}

/* mux_reader_sync: see mux.h. */
void mux_reader_sync(struct mux_reader *r, uint8_t want, const uint8_t *nonce)
{
	mux_reader_init(r);
	r->want = want;
	r->want_nonce = nonce != NULL;
	if (nonce != NULL)
		memcpy(r->nonce, nonce, MUX_NONCE_LEN);
}

/* sync_hdr_ok: the header buffered so far (hdr_have bytes) can still be
 * the start of the frame a syncing reader waits for. */
static bool sync_hdr_ok(const struct mux_reader *r)
{
	uint8_t want[MUX_HDR_LEN];

	mux_hdr_encode(want, r->want, 0, MUX_NONCE_LEN);
	return memcmp(r->hdr, want, r->hdr_have) == 0;
}

/* sync_drop_one: while syncing, the buffered bytes do not start the
 * wanted frame: drop the first and look again from the next. */
static void sync_drop_one(struct mux_reader *r)
{
	memmove(r->hdr, r->hdr + 1, r->hdr_have - 1);
	r->hdr_have--;
	r->skipped++;
}

/* mux_reader_feed: see mux.h. */
int mux_reader_feed(struct mux_reader *r, const uint8_t *data, size_t len,
                    size_t *used, struct mux_frame *out, struct tt_err *err)
{
	size_t i = 0;

	*used = 0;
	while (i < len) {
		if (!r->in_payload) {
			r->hdr[r->hdr_have++] = data[i++];
			if (r->want != 0)
				while (r->hdr_have > 0 && !sync_hdr_ok(r))
					sync_drop_one(r);
			if (r->hdr_have < MUX_HDR_LEN)
				continue;
			if (r->hdr[0] != 'T' || r->hdr[1] != 'M') {
				*used = i;
				return tt_err_set(err, TT_ERR_MALFORMED, "mux: bad magic");
			}
			if (r->hdr[2] != MUX_VERSION) {
				*used = i;
				return tt_err_set(err, TT_ERR_MALFORMED, "mux: version %u", r->hdr[2]);
			}
			r->type = r->hdr[3];
			r->id = get32(r->hdr + 4);
			r->len = get32(r->hdr + 8);
			r->hdr_have = 0;
			if (mux_frame_check(r->type, r->id, r->len, err) < 0) {
				*used = i;
				return -1;
			}
			r->have = 0;
			r->in_payload = true;
		}
		if (r->have < r->len) {
			size_t n = len - i < r->len - r->have ? len - i : r->len - r->have;

			memcpy(r->payload + r->have, data + i, n);
			r->have += n;
			i += n;
		}
		if (r->have < r->len)
			break;
		r->in_payload = false;
		if (r->want != 0 && r->want_nonce &&
		    memcmp(r->payload, r->nonce, MUX_NONCE_LEN) != 0) {
			/* a stale session's answer: keep looking */
			r->skipped += MUX_HDR_LEN + r->len;
			continue;
		}
		r->want = 0;
		r->want_nonce = false;
		out->type = r->type;
		out->id = r->id;
		out->len = r->len;
		out->payload = r->payload;
		*used = i;
		return 1;
	}
	*used = i;
	return 0;
}

/* mux_credit_init: see mux.h. */
void mux_credit_init(struct mux_credit *c)
{
	c->send = MUX_WINDOW;
	c->recv_left = MUX_WINDOW;
	c->consumed = 0;
}

/* mux_credit_on_data: see mux.h. */
int mux_credit_on_data(struct mux_credit *c, uint32_t n)
{
	if (n > c->recv_left)
		return -1;
	c->recv_left -= n;
	return 0;
}

/* mux_credit_on_grant: see mux.h. */
int mux_credit_on_grant(struct mux_credit *c, uint32_t n)
{
	if (n > MUX_WINDOW || c->send > MUX_WINDOW - n)
		return -1;
	c->send += n;
	return 0;
}

/* mux_credit_consumed: see mux.h. */
uint32_t mux_credit_consumed(struct mux_credit *c, uint32_t n, bool flush)
{
	uint32_t g;

	c->consumed += n;
	if (c->consumed == 0 || (c->consumed < MUX_CREDIT_BATCH && !flush))
		return 0;
	g = c->consumed;
	c->consumed = 0;
	c->recv_left += g;
	return g;
}

/* mux_type_name: see mux.h. */
const char *mux_type_name(uint8_t type)
{
	static const char *const names[] = { "?", "SYNC", "SYNC_OK", "ASSIGN", "ASSIGN_OK",
	                                     "OPEN", "DATA", "CREDIT", "EOF", "RST" };

	return type <= MUX_TYPE_MAX ? names[type] : "?";
}

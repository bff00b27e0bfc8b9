/* Fuzzes the microVM channel's decoder (lib/mux.h) as both ends run it:
 * the input is a byte stream split at pseudo-random points, fed to a
 * reader in normal mode and to one syncing for a SYNC_OK with a fixed
 * nonce (the bridge's resynchronisation). Every frame returned must pass
 * the header rules; a violation must leave the reader usable after a
 * resync (as the guest does). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mux.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* run: one reader over the whole input. */
static void run(const uint8_t *data, size_t size, bool sync)
{
	static struct mux_reader r;
	static const uint8_t nonce[MUX_NONCE_LEN] = "0123456789abcdef";
	struct tt_err err = { 0 };
	struct mux_frame f;
	size_t at = 0, used, step = 1;

	if (sync)
		mux_reader_sync(&r, MUX_SYNC_OK, nonce);
	else
		mux_reader_init(&r);
	while (at < size) {
		size_t n = size - at < step ? size - at : step;
		int rc = mux_reader_feed(&r, data + at, n, &used, &f, &err);

		if (used > n)
			abort();
		at += used;
		if (rc == 1) {
			if (mux_frame_check(f.type, f.id, f.len, NULL) < 0 || f.len > MUX_PAYLOAD_MAX)
				abort();
			if (sync && f.type == MUX_SYNC_OK && memcmp(f.payload, nonce, MUX_NONCE_LEN))
				abort();
			sync = false;
		} else if (rc < 0) {
			mux_reader_sync(&r, MUX_SYNC, NULL);
		} else if (used == 0 && n > 0) {
			abort(); /* no progress without a frame */
		}
		step = (step * 7 + data[at % size]) % 97 + 1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mux_credit c;

	if (size == 0)
		return 0;
	run(data, size, false);
	run(data, size, true);
	/* the receiver's books: what it holds unconsumed, what it granted */
	mux_credit_init(&c);
	for (size_t i = 0; i + 4 <= size; i += 4) {
		static uint32_t held;
		uint32_t n = (uint32_t)data[i] << 8 | data[i + 1];

		if (i == 0)
			held = 0;
		if (data[i + 2] & 1) {
			if (mux_credit_on_data(&c, n) == 0)
				held += n;
		} else {
			uint32_t k = n % (held + 1);

			held -= k;
			(void)mux_credit_consumed(&c, k, data[i + 3] & 1);
		}
		if ((uint64_t)c.recv_left + held + c.consumed != MUX_WINDOW)
			abort();
		(void)mux_credit_on_grant(&c, n);
		if (c.send > MUX_WINDOW)
			abort();
	}
	return 0;
}

/* Fuzzes the wire decoder: the input is fed to wire_reader_feed in pieces
 * whose sizes come from a PRNG seeded by the input, every complete frame
 * goes through wire_frame_json, and the first 12 bytes through
 * wire_hdr_decode. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"
#include "wire_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* LLVMFuzzerTestOneInput: one input, split at pseudo-random points. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct wire_reader r; /* 64 KiB: not on the stack */
	struct tt_err err = { 0 };
	struct wire_frame f;
	uint32_t seed = 2166136261u;
	size_t off = 0;
	uint8_t type;
	uint32_t len;

	if (size >= WIRE_HDR_LEN)
		(void)wire_hdr_decode(data, &type, &len, &err);
	for (size_t i = 0; i < size && i < 16; i++)
		seed = (seed ^ data[i]) * 16777619u;
	wire_reader_init(&r);
	while (off < size) {
		size_t piece, used = 0;
		int rc;

		seed = seed * 1103515245u + 12345u;
		piece = 1 + (seed >> 8) % 97;
		if ((seed >> 4) % 8 == 0)
			piece = size - off; /* sometimes everything at once */
		if (piece > size - off)
			piece = size - off;
		rc = wire_reader_feed(&r, data + off, piece, &used, &f, &err);
		if (used > piece)
			abort();
		off += used;
		if (rc < 0)
			break;
		if (rc == 1) {
			json_t *obj;

			if (f.len > WIRE_PAYLOAD_MAX || f.payload[f.len] != '\0')
				abort();
			obj = wire_frame_json(&f, &err);
			if (obj != NULL && !json_is_object(obj))
				abort();
			json_decref(obj);
		} else if (used != piece) {
			abort(); /* needing more must mean all was consumed */
		}
	}
	return 0;
}

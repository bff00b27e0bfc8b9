/* Fuzzes the HELLO handshake decoders (lib/hello.h): the input is a
 * stream of wire frames (as a guest or a bridge reads them, split at
 * pseudo-random points); each complete HELLO goes through wire_frame_json
 * and then the guest's challenge decoder (hello_challenge_parse) and the
 * proof decoder the bridge uses for a guest's answer and a manager's
 * adoption proof (hello_proof_parse, src/bridge/adopt.c). What decodes
 * must re-encode to the very string sent (canonical base64url only). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hello.h"
#include "wire.h"
#include "wire_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* same_b64: the member key of o is exactly the encoding of bin. */
static void same_b64(json_t *o, const char *key, const uint8_t bin[32])
{
	char back[HELLO_B64_LEN + 1];
	const char *s = json_string_value(json_object_get(o, key));

	hello_b64_encode(bin, back);
	if (s == NULL || strcmp(s, back) != 0)
		abort();
}

/* hello_one: both decoders on one frame's JSON. */
static void hello_one(json_t *o)
{
	struct hello_challenge hc;
	uint8_t proof[HELLO_PROOF_LEN];

	if (hello_challenge_parse(o, &hc) == 0) {
		if (hc.sbx == NULL)
			abort();
		same_b64(o, "challenge", hc.challenge);
	}
	if (hello_proof_parse(o, proof) == 0) {
		if (json_object_size(o) != 1)
			abort();
		same_b64(o, "proof", proof);
	}
}

/* LLVMFuzzerTestOneInput: one input, split at pseudo-random points. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct wire_reader r; /* 64 KiB: not on the stack */
	struct tt_err err = { 0 };
	struct wire_frame f;
	uint32_t seed = 2166136261u;
	size_t off = 0;

	for (size_t i = 0; i < size && i < 16; i++)
		seed = (seed ^ data[i]) * 16777619u;
	wire_reader_init(&r);
	while (off < size) {
		size_t piece, used = 0;
		int rc;

		seed = seed * 1103515245u + 12345u;
		piece = 1 + (seed >> 8) % 97;
		if ((seed >> 4) % 4 == 0)
			piece = size - off;
		if (piece > size - off)
			piece = size - off;
		rc = wire_reader_feed(&r, data + off, piece, &used, &f, &err);
		off += used;
		if (rc < 0)
			break;
		if (rc == 1) {
			json_t *o = wire_frame_json(&f, &err);

			if (o != NULL)
				hello_one(o);
			json_decref(o);
		}
	}
	return 0;
}

/* libFuzzer target: keyring_from_json, the key bundle a worker takes from
 * the update feed, on arbitrary bytes. Whatever it accepts must hold at most
 * TT_KEYRING_MAX keys, each kid the PASERK id of its key, and must encode
 * (keyring_to_json) and re-parse to the same bundle. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "keyring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* same_ring: key by key equality. */
static int same_ring(const struct tt_keyring *a, const struct tt_keyring *b)
{
	if (a->n != b->n)
		return 0;
	for (size_t i = 0; i < a->n; i++)
		if (strcmp(a->keys[i].kid, b->keys[i].kid) != 0 ||
		    memcmp(a->keys[i].pk, b->keys[i].pk, sizeof(a->keys[i].pk)) != 0 ||
		    a->keys[i].not_before != b->keys[i].not_before ||
		    a->keys[i].not_after != b->keys[i].not_after)
			return 0;
	return 1;
}

/* LLVMFuzzerTestOneInput: one input; aborts on a broken invariant. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tt_keyring kr, back;
	char kid[PASERK_K4_PID_LEN + 1];
	struct tt_err err;
	char *s;

	memset(&kr, 0, sizeof(kr));
	if (keyring_from_json(&kr, (const char *)data, size, &err) < 0)
		return 0;
	if (kr.n > TT_KEYRING_MAX)
		abort();
	for (size_t i = 0; i < kr.n; i++)
		if (paserk_k4_pid(kr.keys[i].pk, kid) < 0 || strcmp(kid, kr.keys[i].kid) != 0)
			abort();
	s = keyring_to_json(&kr, &err);
	if (s == NULL)
		abort();
	memset(&back, 0, sizeof(back));
	if (keyring_from_json(&back, s, strlen(s), &err) < 0 || !same_ring(&kr, &back))
		abort();
	free(s);
	return 0;
}

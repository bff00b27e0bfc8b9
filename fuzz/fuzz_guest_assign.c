/* libFuzzer target: guest_assignment_parse (a spare agent's assignment:
 * the activation secret, then the sandbox id, generation and activation as
 * NUL-terminated words) on arbitrary bytes. It must never overrun; what it
 * accepts must be a valid identity; and the encoding ns_sandbox_assign
 * writes for those values must parse back to the same. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guest/guest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* LLVMFuzzerTestOneInput: one input; aborts on a broken invariant. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct guest_assignment a, b;
	struct tt_err err;
	uint8_t again[GUEST_ASSIGN_MAX + 64];
	int n;

	if (guest_assignment_parse(data, size, &a, &err) < 0)
		return 0;
	if (memchr(a.sbx, '\0', sizeof(a.sbx)) == NULL || a.sbx[0] == '\0' || a.gen == 0 ||
	    memcmp(a.secret, data, sizeof(a.secret)) != 0)
		abort();
	memcpy(again, a.secret, sizeof(a.secret));
	n = snprintf((char *)again + sizeof(a.secret), sizeof(again) - sizeof(a.secret),
	             "%s%c%" PRIu64 "%c%" PRIu32 "%c", a.sbx, '\0', a.gen, '\0', a.att, '\0');
	if (n < 0 || (size_t)n >= sizeof(again) - sizeof(a.secret))
		abort();
	if (guest_assignment_parse(again, sizeof(a.secret) + (size_t)n, &b, &err) < 0 ||
	    strcmp(a.sbx, b.sbx) != 0 || a.gen != b.gen || a.att != b.att ||
	    memcmp(a.secret, b.secret, sizeof(a.secret)) != 0)
		abort();
	return 0;
}

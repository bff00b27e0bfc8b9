/* A spare agent's assignment and the agent's numbers (guest.h). No I/O:
 * fuzzed on its own (fuzz/fuzz_guest_assign.c). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "guest/guest.h"

/* guest_parse_u64: see guest.h. */
int guest_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (s[0] < '0' || s[0] > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0' || v > max)
		return -1;
	*out = v;
	return 0;
}

/* id_ok: a sandbox id as the substrate names things with it. */
static bool id_ok(const char *s, size_t n)
{
	if (n == 0 || n > 64)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
			return false;
	return true;
}

/* guest_assignment_parse: see guest.h; exactly three words after the
 * secret, the last one NUL-terminated, nothing after it. */
int guest_assignment_parse(const uint8_t *buf, size_t len, struct guest_assignment *out,
                           struct tt_err *err)
{
	const char *word[3];
	size_t at = sizeof(out->secret);
	uint64_t v;

	if (len > GUEST_ASSIGN_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "assignment over %d bytes",
		                  GUEST_ASSIGN_MAX);
	if (len <= at || buf[len - 1] != '\0')
		return tt_err_set(err, TT_ERR_MALFORMED, "assignment of %zu bytes is truncated",
		                  len);
	for (int i = 0; i < 3; i++) {
		if (at >= len)
			return tt_err_set(err, TT_ERR_MALFORMED, "assignment has %d of 3 words", i);
		word[i] = (const char *)buf + at;
		at += strlen(word[i]) + 1; /* bounded: buf[len - 1] is a NUL */
	}
	if (at != len || !id_ok(word[0], strlen(word[0])) ||
	    guest_parse_u64(word[1], INT64_MAX, &out->gen) < 0 || out->gen == 0 ||
	    guest_parse_u64(word[2], UINT32_MAX, &v) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "assignment: bad sandbox id, "
		                  "generation or activation");
	out->att = (uint32_t)v;
	memcpy(out->sbx, word[0], strlen(word[0]) + 1);
	memcpy(out->secret, buf, sizeof(out->secret));
	return 0;
}

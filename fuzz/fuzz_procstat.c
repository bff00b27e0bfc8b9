/* Fuzzes the /proc/<pid>/stat start-time parser: the input is the file's
 * text, possibly without NUL and with hostile comm values; the parser must
 * stay inside [data, data + size) (ASan checks: the input is copied to an
 * exact-size heap buffer) and, on success, agree with a slow reference. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "procid.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ref_start_time: a slow reference: split after the last ')' on single
 * spaces, take the 20th field if it is all digits and fits. */
static int ref_start_time(const char *s, size_t n, unsigned long long *out)
{
	size_t i = n, field = 2, start;

	while (i > 0 && s[i - 1] != ')')
		i--;
	if (i == 0)
		return -1;
	while (field < 22) {
		if (i >= n || s[i] != ' ')
			return -1;
		i++;
		field++;
		start = i;
		while (i < n && s[i] != ' ' && s[i] != '\n')
			i++;
		if (field == 22) {
			unsigned long long v = 0;

			if (i == start)
				return -1;
			for (size_t k = start; k < i; k++) {
				if (s[k] < '0' || s[k] > '9')
					return -1;
				if (v > (~0ULL - (unsigned)(s[k] - '0')) / 10)
					return -1;
				v = v * 10 + (unsigned)(s[k] - '0');
			}
			*out = v;
			return 0;
		}
	}
	return -1;
}

/* LLVMFuzzerTestOneInput: one stat text. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tt_err err = { 0 };
	unsigned long long got = 0, want = 0;
	char *buf = malloc(size ? size : 1);
	int rc, ref;

	if (buf == NULL)
		return 0;
	memcpy(buf, data, size);
	rc = proc_stat_parse_start_time(buf, size, &got, &err);
	ref = ref_start_time(buf, size, &want);
	if (rc != ref || (rc == 0 && got != want))
		abort();
	if (rc != 0 && err.code != TT_ERR_MALFORMED)
		abort();
	free(buf);
	return 0;
}

/* libFuzzer target: urllist_parse, the --cp URL[,URL...] list of the edge
 * and node-api, on arbitrary bytes. Whatever it accepts holds 1..URLLIST_MAX
 * URLs, each an http(s) URL shorter than URLLIST_URL_MAX without a trailing
 * '/', and picking (spread or not) always names one of them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "urllist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* LLVMFuzzerTestOneInput: one input; aborts on a broken invariant. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tt_err err = { 0 };
	struct urllist l;
	char *s = malloc(size + 1);

	if (s == NULL)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	if (urllist_parse(&l, s, &err) == 0) {
		if (l.n < 1 || l.n > URLLIST_MAX)
			abort();
		for (unsigned i = 0; i < l.n; i++) {
			size_t n = strlen(l.url[i]);

			if (n >= URLLIST_URL_MAX ||
			    (strncmp(l.url[i], "http://", 7) != 0 &&
			     strncmp(l.url[i], "https://", 8) != 0) ||
			    l.url[i][n - 1] == '/')
				abort();
		}
		for (int k = 0; k < 3; k++) {
			const char *u = urllist_pick(&l, k & 1);

			if (u < l.url[0] || u > l.url[l.n - 1])
				abort();
		}
	}
	free(s);
	return 0;
}

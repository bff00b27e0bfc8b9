/* libFuzzer target: tether_config_parse (the CLI's ~/.config/tether file) on
 * arbitrary bytes. It must never overrun, must leave NUL-terminated fields,
 * and whatever it accepts must parse the same from the file
 * tether_config_write would make of it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tether.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* LLVMFuzzerTestOneInput: one input; aborts on a broken invariant. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tether_config cfg, back;
	struct tt_err err;
	char text[TETHER_URL_MAX + TETHER_KEY_MAX + 32];
	int n;

	memset(&cfg, 0, sizeof(cfg));
	if (tether_config_parse(&cfg, (const char *)data, size, &err) < 0)
		return 0;
	if (memchr(cfg.url, '\0', sizeof(cfg.url)) == NULL ||
	    memchr(cfg.api_key, '\0', sizeof(cfg.api_key)) == NULL)
		abort();
	if (cfg.url[0] == '\0' || cfg.api_key[0] == '\0')
		return 0;
	/* the text tether_config_write writes for these values */
	n = snprintf(text, sizeof(text), "url=%s\napi_key=%s\n", cfg.url, cfg.api_key);
	if (n < 0 || (size_t)n >= sizeof(text))
		abort();
	memset(&back, 0, sizeof(back));
	if (tether_config_parse(&back, text, (size_t)n, &err) < 0 ||
	    strcmp(back.url, cfg.url) != 0 || strcmp(back.api_key, cfg.api_key) != 0)
		abort();
	return 0;
}

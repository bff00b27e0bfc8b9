/* The wire error codes and their strings (see wirecode.h). */
#include "wirecode.h"

#include <string.h>

static const struct {
	const char *name;
	unsigned status;
} wirecodes[WIRE_E_COUNT] = {
	[WIRE_E_INTERNAL] = { "internal", 500 },
	[WIRE_E_BAD_REQUEST] = { "bad_request", 400 },
	[WIRE_E_TRANSPORT] = { "transport", 502 },
	[WIRE_E_REFRESH_ROUTE] = { "refresh_route", 409 },
	[WIRE_E_UNAVAILABLE] = { "unavailable", 503 },
	[WIRE_E_VERIFY_FAILED] = { "verify_failed", 500 },
	[WIRE_E_OTHER_SANDBOX] = { "other_sandbox", 500 },
	[WIRE_E_NOT_FOUND] = { "not_found", 404 },
	[WIRE_E_PATH_INVALID] = { "path_invalid", 400 },
	[WIRE_E_EXISTS] = { "exists", 409 },
	[WIRE_E_NOT_DIR] = { "not_dir", 409 },
	[WIRE_E_IS_DIR] = { "is_dir", 409 },
	[WIRE_E_PERMISSION] = { "permission", 403 },
	[WIRE_E_TOO_LARGE] = { "too_large", 413 },
	[WIRE_E_NO_SPACE] = { "no_space", 507 },
	[WIRE_E_CHANGED] = { "changed", 500 },
	[WIRE_E_PEER_REFUSED] = { "peer_refused", 500 },
	[WIRE_E_HANDSHAKE_REQUIRED] = { "handshake_required", 500 },
	[WIRE_E_WRONG_ACTIVATION] = { "wrong_activation", 500 },
	[WIRE_E_NO_SECRET] = { "no_secret", 500 },
	[WIRE_E_INVALID_CLAIMS] = { "invalid_claims", 500 },
	[WIRE_E_LENGTH_REQUIRED] = { "length_required", 411 },
	[WIRE_E_METHOD_NOT_ALLOWED] = { "method_not_allowed", 405 },
};

/* wirecode_name: see wirecode.h. */
const char *wirecode_name(enum wire_code c)
{
	if ((unsigned)c >= WIRE_E_COUNT)
		c = WIRE_E_INTERNAL;
	return wirecodes[c].name;
}

/* wirecode_parse: see wirecode.h. */
enum wire_code wirecode_parse(const char *s)
{
	for (unsigned i = 0; s != NULL && i < WIRE_E_COUNT; i++)
		if (strcmp(s, wirecodes[i].name) == 0)
			return (enum wire_code)i;
	return WIRE_E_INTERNAL;
}

/* wirecode_status: see wirecode.h. */
unsigned wirecode_status(enum wire_code c)
{
	if ((unsigned)c >= WIRE_E_COUNT)
		c = WIRE_E_INTERNAL;
	return wirecodes[c].status;
}

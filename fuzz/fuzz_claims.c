/* libFuzzer target: claims_parse on arbitrary bytes; on success the claims
 * must encode (claims_to_json) and re-parse to the same claims. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "claims.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* same_claims: field-wise equality (the struct has padding). */
static int same_claims(const struct tt_claims *a, const struct tt_claims *b)
{
	return strcmp(a->iss, b->iss) == 0 && strcmp(a->sub, b->sub) == 0 &&
	       strcmp(a->jti, b->jti) == 0 && a->iat == b->iat &&
	       a->exp == b->exp && a->aud == b->aud &&
	       strcmp(a->id.sbx, b->id.sbx) == 0 && a->id.gen == b->id.gen &&
	       strcmp(a->id.wrk, b->id.wrk) == 0 &&
	       strcmp(a->id.sst, b->id.sst) == 0 &&
	       strcmp(a->id.pod, b->id.pod) == 0 && a->id.att == b->id.att &&
	       a->pur == b->pur && a->ops == b->ops && a->port == b->port &&
	       a->proto == b->proto;
}

/* LLVMFuzzerTestOneInput: one input; aborts on a broken round trip. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tt_claims c, back;
	struct tt_err err;
	char *s;

	if (claims_parse(data, size, &c, &err) < 0)
		return 0;
	s = claims_to_json(&c, &err);
	if (s == NULL)
		abort(); /* everything that parses must encode */
	if (claims_parse((const uint8_t *)s, strlen(s), &back, &err) < 0 ||
	    !same_claims(&c, &back))
		abort();
	free(s);
	return 0;
}

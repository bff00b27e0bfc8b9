/* libFuzzer target: the PASERK decoders (k4.public, k4.secret) on arbitrary
 * strings. Whatever decodes must encode back to exactly the input (one
 * canonical text per key), and a k4.secret's public half must be the one
 * its seed derives. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "paserk.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* LLVMFuzzerTestOneInput: one input, as a NUL-terminated string; aborts on
 * a broken round trip. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t pk[PASETO_PK_BYTES], sk[PASETO_SK_BYTES], seed_pk[PASETO_PK_BYTES];
	uint8_t seed_sk[PASETO_SK_BYTES];
	char out[PASERK_K4_SECRET_LEN + 1];
	struct tt_err err;
	char *s;

	if (size > 4096)
		return 0;
	s = malloc(size + 1);
	if (s == NULL)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	if (paserk_k4_public_decode(s, pk, &err) == 0) {
		if (paserk_k4_public_encode(pk, out) < 0 || strcmp(out, s) != 0)
			abort();
	}
	if (paserk_k4_secret_decode(s, sk, &err) == 0) {
		if (paserk_k4_secret_encode(sk, out) < 0 || strcmp(out, s) != 0)
			abort();
		/* the public half is checked against the seed */
		crypto_sign_seed_keypair(seed_pk, seed_sk, sk);
		if (memcmp(seed_pk, sk + 32, PASETO_PK_BYTES) != 0)
			abort();
		sodium_memzero(seed_sk, sizeof(seed_sk));
		sodium_memzero(sk, sizeof(sk));
	}
	free(s);
	return 0;
}

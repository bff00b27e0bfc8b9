/* libFuzzer target: PASETO v4.public parsing, strict base64url and the
 * receiver's admission path (footer kid, key ring, cache) on arbitrary
 * bytes. Nothing may crash, leak or read out of bounds; a token that
 * verifies under the fixed key must decode to the same bytes through every
 * entry point, and admission must give the same answer on a cache hit. */
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "b64url.h"
#include "capcache.h"
#include "paseto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* fixed_key: the public key of a fixed seed (public: verification only). */
static const uint8_t *fixed_key(void)
{
	static uint8_t pk[PASETO_PK_BYTES];
	static int ready;

	if (!ready) {
		uint8_t seed[32], sk[PASETO_SK_BYTES];

		if (sodium_init() < 0)
			abort();
		memset(seed, 0x42, sizeof(seed));
		crypto_sign_seed_keypair(pk, sk, seed);
		sodium_memzero(sk, sizeof(sk));
		ready = 1;
	}
	return pk;
}

/* admit_twice: cap_admit through a small cache, twice (miss, then hit if
 * it verified): the answers must agree. The ring holds the fixed key. */
static void admit_twice(const char *tok, size_t size)
{
	static struct capcache *cache;
	static struct tt_keyring kr;
	static const struct tt_request req = {
		.receiver = TT_RCV_NODE, .sbx = "sbx_abcdefghijklmnopqrstuvwxyz",
		.op = TT_OP_EXEC, .new_open = true,
	};
	struct tt_decision a, b;
	struct tt_err err;

	if (cache == NULL) {
		cache = capcache_new(8);
		if (cache == NULL || keyring_add(&kr, fixed_key(), 0, 0, &err) < 0)
			abort();
	}
	/* now = 0 so the fixed corpus never expires: only the key window and
	 * the claims' own times matter. */
	a = cap_admit(cache, &kr, tok, size, NULL, 0, &req, NULL, 0, NULL);
	b = cap_admit(cache, &kr, tok, size, NULL, 0, &req, NULL, 0, NULL);
	if (a.verdict != b.verdict || a.reason != b.reason)
		abort();
}

/* LLVMFuzzerTestOneInput: one input through every decoder. The data is
 * copied so the decoders see exactly size bytes and no terminator. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *pk = fixed_key();
	char *tok = malloc(size ? size : 1);
	struct paseto_msg v, f, u;
	struct tt_err err;
	uint8_t out[PASETO_TOKEN_MAX];
	size_t n;
	int rv, rf, ru;

	if (tok == NULL)
		return 0;
	memcpy(tok, data, size);
	rv = paseto_v4_verify(pk, tok, size, (const uint8_t *)"fuzz", 4, &v, &err);
	rf = paseto_v4_footer(tok, size, &f, &err);
	ru = paseto_v4_decode_unverified(tok, size, &u, &err);
	if (rv == 0 && (ru != 0 || rf != 0 || v.payload_len != u.payload_len ||
	                memcmp(v.payload, u.payload, v.payload_len) != 0 ||
	                v.footer_len != f.footer_len ||
	                memcmp(v.footer, f.footer, v.footer_len) != 0))
		abort();
	if (ru == 0 && rf != 0)
		abort();
	paseto_msg_free(&v);
	paseto_msg_free(&f);
	paseto_msg_free(&u);
	admit_twice(tok, size);
	/* strict base64url: whatever decodes must re-encode to the input */
	if (b64url_decode(tok, size, out, sizeof(out), &n, &err) == 0) {
		char *re = malloc(B64URL_ENCODED_LEN(n) + 1);

		if (re == NULL || b64url_encode(out, n, re, B64URL_ENCODED_LEN(n) + 1) !=
		                          (int)size ||
		    memcmp(re, tok, size) != 0)
			abort();
		free(re);
	}
	free(tok);
	return 0;
}

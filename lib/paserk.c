/* PASERK k4.public / k4.pid (see paserk.h). k4.secret and key files are
 * in lib/paserk_secret.c, linked only into the signer (and tests). */
#include "paserk.h"

#include <sodium.h>
#include <string.h>

#include "b64url.h"
#include "paserk_int.h"

#define K4_PUBLIC "k4.public."
#define K4_PID "k4.pid."
#define K4_PID_HASH_BYTES 33 /* BLAKE2b-264 */

/* paserk_encode: prefix || b64url(key) into out (cap bytes). */
int paserk_encode(const char *prefix, const uint8_t *key, size_t len,
                  char *out, size_t cap)
{
	size_t plen = strlen(prefix);

	if (cap < plen + 1)
		return -1;
	memcpy(out, prefix, plen);
	return b64url_encode(key, len, out + plen, cap - plen) < 0 ? -1 : 0;
}

/* paserk_decode: checks the prefix and that s decodes to exactly len
 * bytes. s must be NUL-terminated; it is read only up to max_len + 1. */
int paserk_decode(const char *s, const char *prefix, size_t max_len,
                  uint8_t *key, size_t len, struct tt_err *err)
{
	size_t plen = strlen(prefix), slen, got = 0;

	if (s == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "paserk: missing key");
	slen = strnlen(s, max_len + 1);
	if (slen > max_len)
		return tt_err_set(err, TT_ERR_MALFORMED, "paserk: %.*s key too long",
		                  (int)plen - 1, prefix);
	if (slen < plen || memcmp(s, prefix, plen) != 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "paserk: not a %.*s key",
		                  (int)plen - 1, prefix);
	if (b64url_decode(s + plen, slen - plen, key, len, &got, err) < 0 ||
	    got != len) {
		sodium_memzero(key, len);
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "paserk: %.*s key is not %zu canonical base64url bytes",
		                  (int)plen - 1, prefix, len);
	}
	return 0;
}

/* paserk_k4_public_encode: "k4.public." b64url(pk). */
int paserk_k4_public_encode(const uint8_t pk[PASETO_PK_BYTES],
                            char out[PASERK_K4_PUBLIC_LEN + 1])
{
	return paserk_encode(K4_PUBLIC, pk, PASETO_PK_BYTES, out,
	                     PASERK_K4_PUBLIC_LEN + 1);
}

/* paserk_k4_public_decode: exactly 32 bytes after "k4.public.". */
int paserk_k4_public_decode(const char *s, uint8_t pk[PASETO_PK_BYTES],
                            struct tt_err *err)
{
	return paserk_decode(s, K4_PUBLIC, PASERK_K4_PUBLIC_LEN, pk,
	                     PASETO_PK_BYTES, err);
}

/* paserk_k4_pid: "k4.pid." b64url(BLAKE2b-264("k4.pid." || k4.public)). */
int paserk_k4_pid(const uint8_t pk[PASETO_PK_BYTES],
                  char out[PASERK_K4_PID_LEN + 1])
{
	char pub[PASERK_K4_PUBLIC_LEN + 1];
	uint8_t h[K4_PID_HASH_BYTES];
	crypto_generichash_state st;

	if (paserk_k4_public_encode(pk, pub) < 0)
		return -1;
	if (crypto_generichash_init(&st, NULL, 0, sizeof(h)) != 0 ||
	    crypto_generichash_update(&st, (const uint8_t *)K4_PID,
	                              strlen(K4_PID)) != 0 ||
	    crypto_generichash_update(&st, (const uint8_t *)pub,
	                              PASERK_K4_PUBLIC_LEN) != 0 ||
	    crypto_generichash_final(&st, h, sizeof(h)) != 0)
		return -1;
	return paserk_encode(K4_PID, h, sizeof(h), out, PASERK_K4_PID_LEN + 1);
}


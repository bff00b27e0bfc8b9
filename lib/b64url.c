/* Strict unpadded base64url over libsodium (see b64url.h). */
#include "b64url.h"

#include <sodium.h>

/* b64url_encode: libsodium's URL-safe, unpadded variant. */
int b64url_encode(const uint8_t *in, size_t in_len, char *out, size_t cap)
{
	size_t need = sodium_base64_ENCODED_LEN(in_len,
	                                        sodium_base64_VARIANT_URLSAFE_NO_PADDING);

	if (out == NULL || cap < need || (in == NULL && in_len > 0))
		return -1;
	sodium_bin2base64(out, cap, in_len == 0 ? (const uint8_t *)"" : in, in_len,
	                  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	return (int)(need - 1);
}

/* b64url_decoded_len: 4 chars carry 3 bytes; a tail of 2 or 3 chars carries
 * 1 or 2 bytes; a tail of 1 char carries nothing and is never valid. */
int b64url_decoded_len(size_t in_len, size_t *out_len)
{
	size_t rem = in_len % 4;

	if (rem == 1)
		return -1;
	*out_len = (in_len / 4) * 3 + (rem == 0 ? 0 : rem - 1);
	return 0;
}

/* b64url_alphabet_only: libsodium 1.0.18 decodes every byte >= 0x80 as
 * '_' (found by fuzz_token), which would give one token many encodings;
 * so every byte is checked against the alphabet first. */
static int b64url_alphabet_only(const char *in, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)in[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_'))
			return 0;
	}
	return 1;
}

/* b64url_decode: libsodium rejects non-zero trailing bits itself; it stops
 * quietly at '=' or other bytes, so the whole input must have been
 * consumed (b64_end) as well. */
int b64url_decode(const char *in, size_t in_len, uint8_t *out, size_t cap,
                  size_t *out_len, struct tt_err *err)
{
	const char *end = NULL;
	size_t want, got = 0;

	if (b64url_decoded_len(in_len, &want) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "base64url: impossible length %zu", in_len);
	if (want > cap)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "base64url: %zu bytes exceed the %zu-byte bound",
		                  want, cap);
	if (in_len == 0) {
		*out_len = 0;
		return 0;
	}
	if (!b64url_alphabet_only(in, in_len))
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "base64url: byte outside the base64url alphabet");
	if (sodium_base642bin(out, cap, in, in_len, NULL, &got, &end,
	                      sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
	    end != in + in_len || got != want) {
		sodium_memzero(out, cap);
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "base64url: not canonical unpadded base64url");
	}
	*out_len = got;
	return 0;
}

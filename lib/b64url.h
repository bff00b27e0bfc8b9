/* Strict unpadded base64url (RFC 4648 §5) over libsodium, for PASETO and
 * PASERK. Decoding refuses padding, whitespace, any byte outside the
 * alphabet, a length of 1 mod 4 and non-canonical encodings (non-zero
 * trailing bits), so each byte string has exactly one encoding.
 * Implementation: lib/b64url.c. */
#ifndef TT_B64URL_H
#define TT_B64URL_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* B64URL_ENCODED_LEN: characters needed for n bytes (without the NUL). */
#define B64URL_ENCODED_LEN(n) (((n) / 3) * 4 + ((n) % 3 ? (n) % 3 + 1 : 0))

/* b64url_encode: writes the encoding of in and a NUL into out (cap bytes,
 * at least B64URL_ENCODED_LEN(in_len) + 1); returns the length or -1. */
int b64url_encode(const uint8_t *in, size_t in_len, char *out, size_t cap);

/* b64url_decoded_len: exact decoded size of an in_len-character encoding;
 * -1 if no valid encoding has that length (1 mod 4). */
int b64url_decoded_len(size_t in_len, size_t *out_len);

/* b64url_decode: decodes all of in (in_len bytes, no NUL needed) into out
 * (cap bytes); sets *out_len. Errors: TT_ERR_TOO_LARGE when the result
 * would not fit in cap (checked before decoding), TT_ERR_MALFORMED for
 * anything that is not canonical unpadded base64url. */
int b64url_decode(const char *in, size_t in_len, uint8_t *out, size_t cap,
                  size_t *out_len, struct tt_err *err);

#endif

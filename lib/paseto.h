/* PASETO v4.public (Ed25519 over PAE) on libsodium.
 * Token: "v4.public." b64url(msg || sig64) [ "." b64url(footer) ].
 * Base64url is unpadded and strictly canonical; anything else is malformed.
 * Implementation: lib/paseto.c. */
#ifndef TT_PASETO_H
#define TT_PASETO_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define PASETO_V4_PUBLIC_HEADER "v4.public."
#define PASETO_SIG_BYTES 64
#define PASETO_PK_BYTES 32
#define PASETO_SK_BYTES 64
/* Bounds: a token, and the decoded payload and footer inside it. Anything
 * longer is refused before decoding (TT_ERR_TOO_LARGE). */
#define PASETO_TOKEN_MAX 4096
#define PASETO_PAYLOAD_MAX 2048
#define PASETO_FOOTER_MAX 256

/* A verified (or footer-only) decode. Owns its buffers, which are NUL
 * terminated for convenience (the length excludes the NUL). */
struct paseto_msg {
	uint8_t *payload;
	size_t payload_len;
	uint8_t *footer;
	size_t footer_len;
};

/* paseto_pae: Pre-Authentication Encoding of n pieces into out (cap bytes);
 * sets *out_len. Returns -1 if cap is too small. */
int paseto_pae(const uint8_t *const *pieces, const size_t *lens, size_t n,
               uint8_t *out, size_t cap, size_t *out_len);

/* paseto_v4_sign: signs payload (+ footer, + implicit assertion) with the
 * 64-byte Ed25519 secret key; *token_out is malloc'd (caller frees).
 * In lib/paseto_sign.c: only the signer and tests link it. */
int paseto_v4_sign(const uint8_t sk[PASETO_SK_BYTES],
                   const uint8_t *payload, size_t payload_len,
                   const uint8_t *footer, size_t footer_len,
                   const uint8_t *implicit, size_t implicit_len,
                   char **token_out, struct tt_err *err);

/* paseto_v4_verify: checks header, encoding, bounds and signature; fills out
 * (caller frees with paseto_msg_free). Errors: TT_ERR_MALFORMED,
 * TT_ERR_TOO_LARGE, TT_ERR_SIGNATURE. */
int paseto_v4_verify(const uint8_t pk[PASETO_PK_BYTES],
                     const char *token, size_t token_len,
                     const uint8_t *implicit, size_t implicit_len,
                     struct paseto_msg *out, struct tt_err *err);

/* paseto_v4_footer: decodes only the footer (unverified: use it to pick the
 * key by kid, nothing else). out->payload stays NULL. */
int paseto_v4_footer(const char *token, size_t token_len,
                     struct paseto_msg *out, struct tt_err *err);

/* paseto_v4_decode_unverified: payload and footer WITHOUT checking the
 * signature (for "tether cap inspect" with no key; never for admission). */
int paseto_v4_decode_unverified(const char *token, size_t token_len,
                                struct paseto_msg *out, struct tt_err *err);

/* paseto_msg_free: frees and clears a decoded message. */
void paseto_msg_free(struct paseto_msg *msg);

#endif

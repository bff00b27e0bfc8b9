/* PASETO v4.public signing (see paseto.h). Only the signer
 * (build/tether-signer) and tests link this file: receivers verify, they
 * never mint (SPEC §3). */
#include "paseto.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "b64url.h"
#include "cleanup.h"
#include "paseto_int.h"

/* paseto_v4_sign: sig = Ed25519(sk, PAE(h, m, f, i)). */
int paseto_v4_sign(const uint8_t sk[PASETO_SK_BYTES],
                   const uint8_t *payload, size_t payload_len,
                   const uint8_t *footer, size_t footer_len,
                   const uint8_t *implicit, size_t implicit_len,
                   char **token_out, struct tt_err *err)
{
	uint8_t body[BODY_MAX], pae[PAE_MAX];
	size_t pae_len, body_len = payload_len + PASETO_SIG_BYTES, pos;
	size_t len = HEADER_LEN + B64URL_ENCODED_LEN(body_len) +
	             (footer_len > 0 ? 1 + B64URL_ENCODED_LEN(footer_len) : 0);
	_cleanup_free_ char *tok = NULL;
	int n;

	*token_out = NULL;
	if ((payload == NULL && payload_len > 0) ||
	    (footer == NULL && footer_len > 0) ||
	    (implicit == NULL && implicit_len > 0))
		return tt_err_set(err, TT_ERR_INVALID, "sign: NULL buffer");
	if (payload_len > PASETO_PAYLOAD_MAX || footer_len > PASETO_FOOTER_MAX ||
	    implicit_len > PASETO_IMPLICIT_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "sign: payload, footer or implicit assertion too large");
	if (pae_v4_public(payload, payload_len, footer, footer_len, implicit,
	                  implicit_len, pae, &pae_len) < 0)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "sign: PAE too large");
	if (payload_len > 0)
		memcpy(body, payload, payload_len);
	if (crypto_sign_detached(body + payload_len, NULL, pae, pae_len, sk) != 0)
		return tt_err_set(err, TT_ERR_SIGNATURE, "sign: Ed25519 failed");
	tok = malloc(len + 1);
	if (tok == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "sign: out of memory");
	memcpy(tok, PASETO_V4_PUBLIC_HEADER, HEADER_LEN);
	pos = HEADER_LEN;
	n = b64url_encode(body, body_len, tok + pos, len + 1 - pos);
	if (n < 0)
		return tt_err_set(err, TT_ERR_INVALID, "sign: encoding failed");
	pos += (size_t)n;
	if (footer_len > 0) {
		tok[pos++] = '.';
		n = b64url_encode(footer, footer_len, tok + pos, len + 1 - pos);
		if (n < 0)
			return tt_err_set(err, TT_ERR_INVALID, "sign: encoding failed");
		pos += (size_t)n;
	}
	tok[pos] = '\0';
	*token_out = tt_steal_ptr(&tok);
	return 0;
}

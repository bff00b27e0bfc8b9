/* Minting a capability (see capcache.h). Only the signer
 * (build/tether-signer) and tests link this file. */
#include "capcache.h"

#include <stdio.h>
#include <string.h>

#include "cleanup.h"
#include "paserk.h"

/* cap_mint: signs c with sk; the footer names the kid of sk's public half
 * (a libsodium secret key is seed || public key). */
int cap_mint(const uint8_t sk[PASETO_SK_BYTES], const struct tt_claims *c,
             char **token_out, struct tt_err *err)
{
	char kid[PASERK_K4_PID_LEN + 1];
	char footer[PASERK_K4_PID_LEN + 16];
	_cleanup_free_ char *payload = NULL;
	int n;

	if (sk == NULL || c == NULL || token_out == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "cap_mint: missing argument");
	if (paserk_k4_pid(sk + 32, kid) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "cap_mint: cannot derive kid");
	/* kid is base64url text: nothing in it needs JSON escaping. */
	n = snprintf(footer, sizeof(footer), "{\"kid\":\"%s\"}", kid);
	if (n < 0 || (size_t)n >= sizeof(footer))
		return tt_err_set(err, TT_ERR_INVALID, "cap_mint: kid too long");
	payload = claims_to_json(c, err);
	if (payload == NULL)
		return -1;
	return paseto_v4_sign(sk, (const uint8_t *)payload, strlen(payload),
	                      (const uint8_t *)footer, (size_t)n, NULL, 0,
	                      token_out, err);
}

/* Test helper (built by lib.sh build_mint): mint KEYFILE [AGE_SECONDS]
 * prints a control capability for sbx_abcdefghijklmnopqrstuvwxyz,
 * generation 7 on w1, signed with the k4.secret in KEYFILE and issued
 * AGE_SECONDS ago, through cap_mint (the signer's own code path). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include "capcache.h"
#include "paserk.h"
#include "timefmt.h"
int main(int argc, char **argv)
{
	uint8_t sk[PASETO_SK_BYTES];
	struct tt_err err = { 0 };
	struct tt_claims c;
	char *tok;

	if (argc < 2 || sodium_init() < 0 ||
	    paserk_secret_file_read(argv[1], sk, &err) < 0) {
		fprintf(stderr, "mint: %s\n", err.msg);
		return 1;
	}
	memset(&c, 0, sizeof(c));
	strcpy(c.iss, "tether-cp");
	strcpy(c.sub, "tenant-1");
	strcpy(c.jti, "j1");
	c.iat = tt_now() - (argc > 2 ? atoi(argv[2]) : 0);
	c.exp = c.iat + TT_CAP_LIFETIME;
	c.aud = TT_AUD_NODE;
	strcpy(c.id.sbx, "sbx_abcdefghijklmnopqrstuvwxyz");
	c.id.gen = 7;
	strcpy(c.id.wrk, "w1");
	strcpy(c.id.sst, "ns");
	c.id.att = 1;
	c.pur = TT_PUR_CONTROL;
	c.ops = TT_OP_EXEC | TT_OP_FS_READ;
	if (cap_mint(sk, &c, &tok, &err) < 0) {
		fprintf(stderr, "mint: %s\n", err.msg);
		return 1;
	}
	sodium_memzero(sk, sizeof(sk));
	puts(tok);
	free(tok);
	return 0;
}

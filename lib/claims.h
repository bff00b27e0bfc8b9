/* Capability claims (SPEC §3) and the identity of one execution (SPEC §1).
 * Parsed with jansson using JSON_REJECT_DUPLICATES; every string claim is
 * length-bounded and every field type-checked. Implementation: lib/claims.c. */
#ifndef TT_CLAIMS_H
#define TT_CLAIMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "wireop.h"

#define TT_SBX_ID_LEN 30 /* "sbx_" + 26 lowercase base32 */
#define TT_NAME_MAX 64   /* worker ids, substrate, pod uid, iss, jti */
#define TT_SUB_MAX 128

enum tt_aud { TT_AUD_NODE = 1, TT_AUD_GATEWAY = 2 };
enum tt_purpose { TT_PUR_CONTROL = 1, TT_PUR_PORT = 2 };
enum tt_proto { TT_PROTO_NONE = 0, TT_PROTO_TCP = 1, TT_PROTO_HTTP = 2 };

/* identity: (sandbox, generation, worker, substrate, pod uid, activation). */
struct tt_identity {
	char sbx[TT_SBX_ID_LEN + 1];
	uint64_t gen;                 /* >= 1 */
	char wrk[TT_NAME_MAX + 1];
	char sst[TT_NAME_MAX + 1];    /* "ns", "microvm", ... */
	char pod[TT_NAME_MAX + 1];    /* may be empty */
	uint32_t att;                 /* activation attempt, >= 1 */
};

struct tt_claims {
	char iss[TT_NAME_MAX + 1];
	char sub[TT_SUB_MAX + 1];
	char jti[TT_NAME_MAX + 1];
	int64_t iat;                  /* unix seconds */
	int64_t exp;
	enum tt_aud aud;
	struct tt_identity id;
	enum tt_purpose pur;
	uint32_t ops;                 /* enum tt_op bits (control) */
	uint16_t port;                /* port purpose: 1..65535 */
	enum tt_proto proto;          /* port purpose */
};

/* claims_parse: payload JSON -> claims. All of iss, sub, jti, iat, exp, aud,
 * sbx, gen, wrk, sst, pod, att, pur are required; ops for control; port and
 * proto for port. Errors: TT_ERR_MALFORMED / TT_ERR_TOO_LARGE. */
int claims_parse(const uint8_t *json, size_t len, struct tt_claims *out,
                 struct tt_err *err);
/* claims_to_json: compact JSON, keys in a fixed order; caller frees. */
char *claims_to_json(const struct tt_claims *c, struct tt_err *err);

/* sbx_id_valid: "sbx_" + 26 chars of [a-z2-7]. */
bool sbx_id_valid(const char *s);
/* sbx_id_new: 128 random bits as a sandbox id. */
void sbx_id_new(char out[TT_SBX_ID_LEN + 1]);

/* ops_parse: "exec,fs.read" -> bits (unknown names are an error here: this
 * is for operators and config, not tokens). ops_format: bits -> "a,b". */
int ops_parse(const char *csv, uint32_t *ops, struct tt_err *err);
int ops_format(uint32_t ops, char *out, size_t cap);

#endif

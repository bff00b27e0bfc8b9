/* Capability claims (see claims.h, SPEC §3).
 *
 * Parsing is strict: the root must be an object with no duplicate keys; every
 * known claim is type-checked and length-bounded; a claim this code does not
 * know is malformed (it might be a restriction, such as "nbf", that we would
 * otherwise silently fail to enforce), and so is a claim that does not belong
 * to the purpose (ops on a port capability, port/proto on a control one).
 * Unknown operation names inside "ops" are ignored: they grant nothing. */
#include "claims.h"

#include <jansson.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "keyring.h"
#include "paseto.h"
#include "timefmt.h"

#define OPS_MAX_ENTRIES 32 /* more operation names than this is malformed */

/* Claim names the parser knows; anything else at the root is malformed. */
static const char *const known_claims[] = {
	"iss", "sub", "jti", "iat", "exp", "aud", "sbx", "gen",
	"wrk", "sst", "pod", "att", "pur", "ops", "port", "proto",
};

/* ops_parse: "exec,fs.read" -> bits; an empty string is no operations, an
 * unknown or empty element is an error (operators should hear of typos). */
int ops_parse(const char *csv, uint32_t *ops, struct tt_err *err)
{
	uint32_t bits = 0;
	const char *p = csv;

	if (csv == NULL || ops == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "ops: missing argument");
	while (*p != '\0') {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		char name[TT_NAME_MAX + 1];
		uint32_t bit;

		if (n == 0 || n > TT_NAME_MAX)
			return tt_err_set(err, TT_ERR_INVALID,
			                  "ops: empty or overlong operation name");
		memcpy(name, p, n);
		name[n] = '\0';
		bit = wireop_cap(wireop_parse(name));
		if (bit == 0)
			return tt_err_set(err, TT_ERR_INVALID,
			                  "ops: unknown operation '%s'", name);
		bits |= bit;
		if (comma == NULL)
			break;
		p = comma + 1;
		if (*p == '\0')
			return tt_err_set(err, TT_ERR_INVALID,
			                  "ops: trailing comma");
	}
	*ops = bits;
	return 0;
}

/* ops_format: bits -> "a,b" in table order (unknown bits skipped); 0, or -1
 * if out (cap bytes) is too small. */
int ops_format(uint32_t ops, char *out, size_t cap)
{
	size_t len = 0;

	if (out == NULL || cap == 0)
		return -1;
	out[0] = '\0';
	for (unsigned i = 1; i < WIRE_OP_COUNT; i++) {
		const char *name = wireop_name((enum wire_op)i);
		size_t n;

		if (!(ops & wireop_cap((enum wire_op)i)))
			continue;
		n = strlen(name);
		if (len + (len > 0) + n + 1 > cap) {
			out[0] = '\0';
			return -1;
		}
		if (len > 0)
			out[len++] = ',';
		memcpy(out + len, name, n + 1);
		len += n;
	}
	return 0;
}

/* sbx_id_valid: "sbx_" + 26 chars of [a-z2-7]. */
bool sbx_id_valid(const char *s)
{
	if (s == NULL || strncmp(s, "sbx_", 4) != 0 ||
	    strlen(s) != TT_SBX_ID_LEN)
		return false;
	for (size_t i = 4; i < TT_SBX_ID_LEN; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= '2' && c <= '7')))
			return false;
	}
	return true;
}

/* sbx_id_new: 128 random bits, base32 (RFC 4648 alphabet, lowercase,
 * unpadded: 26 characters, the last one carrying 3 bits). */
void sbx_id_new(char out[TT_SBX_ID_LEN + 1])
{
	static const char alpha[] = "abcdefghijklmnopqrstuvwxyz234567";
	uint8_t raw[16];
	uint32_t acc = 0;
	int bits = 0;
	size_t o = 4;

	randombytes_buf(raw, sizeof(raw));
	memcpy(out, "sbx_", 4);
	for (size_t i = 0; i < sizeof(raw); i++) {
		acc = (acc << 8) | raw[i];
		bits += 8;
		while (bits >= 5) {
			bits -= 5;
			out[o++] = alpha[(acc >> bits) & 31];
		}
	}
	if (bits > 0)
		out[o++] = alpha[(acc << (5 - bits)) & 31];
	out[o] = '\0';
}

/* charset_ok: every byte of s is in the class; empty allowed if allow_empty.
 * cls: 's' substrate [a-z0-9_-], 'w' name [A-Za-z0-9._-], 'p' printable:
 * no C0 or C1 control characters (UTF-8 already validated by jansson; C1
 * U+0080..U+009F is 0xC2 0x80..0x9F), so no claim can carry terminal
 * escapes into a log or "tether cap inspect". */
static bool charset_ok(const char *s, size_t n, char cls, bool allow_empty)
{
	if (n == 0)
		return allow_empty;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		bool ok;

		switch (cls) {
		case 's':
			ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
			     c == '_' || c == '-';
			break;
		case 'w':
			ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			     (c >= '0' && c <= '9') || c == '.' || c == '_' ||
			     c == '-';
			break;
		default:
			ok = c >= 0x20 && c != 0x7f &&
			     !(c == 0xc2 && i + 1 < n &&
			       (unsigned char)s[i + 1] >= 0x80 &&
			       (unsigned char)s[i + 1] <= 0x9f);
			break;
		}
		if (!ok)
			return false;
	}
	return true;
}

/* claim_get: the claim name of JSON type want, or NULL with the error
 * ("missing" or "is not a …") set. */
static json_t *claim_get(json_t *root, const char *name, json_type want,
                         struct tt_err *err)
{
	json_t *v = json_object_get(root, name);

	if (v == NULL) {
		tt_err_set(err, TT_ERR_MALFORMED, "claims: missing '%s'", name);
		return NULL;
	}
	if (json_typeof(v) != want) {
		tt_err_set(err, TT_ERR_MALFORMED, "claims: '%s' is not %s", name,
		           want == JSON_STRING ? "a string" :
		           want == JSON_INTEGER ? "an integer" : "an array");
		return NULL;
	}
	return v;
}

/* str_claim: copies the string claim name into dst (cap bytes incl. NUL)
 * after type, length and character checks. */
static int str_claim(json_t *root, const char *name, char *dst, size_t cap,
                     char cls, bool allow_empty, struct tt_err *err)
{
	json_t *v = claim_get(root, name, JSON_STRING, err);
	const char *s;
	size_t n;

	if (v == NULL)
		return -1;
	s = json_string_value(v);
	n = json_string_length(v);
	if (n >= cap)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: '%s' longer than %zu bytes", name,
		                  cap - 1);
	if (memchr(s, '\0', n) != NULL || !charset_ok(s, n, cls, allow_empty))
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: '%s' is empty or has invalid characters",
		                  name);
	memcpy(dst, s, n);
	dst[n] = '\0';
	return 0;
}

/* int_claim: integer claim name within [min, max]. */
static int int_claim(json_t *root, const char *name, json_int_t min,
                     json_int_t max, json_int_t *out, struct tt_err *err)
{
	json_t *v = claim_get(root, name, JSON_INTEGER, err);

	if (v == NULL)
		return -1;
	*out = json_integer_value(v);
	if (*out < min || *out > max)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: '%s' out of range", name);
	return 0;
}

/* time_claim: RFC 3339 string claim name as unix seconds. */
static int time_claim(json_t *root, const char *name, int64_t *out,
                      struct tt_err *err)
{
	json_t *v = claim_get(root, name, JSON_STRING, err);
	struct tt_err terr;

	if (v == NULL)
		return -1;
	if (rfc3339_parse(json_string_value(v), json_string_length(v), out,
	                  &terr) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "claims: '%s': %s",
		                  name, terr.msg);
	return 0;
}

/* enum_claim: string claim name that must be one of names[0..n); returns
 * the index through *idx. */
static int enum_claim(json_t *root, const char *name,
                      const char *const *names, size_t n, size_t *idx,
                      struct tt_err *err)
{
	json_t *v = claim_get(root, name, JSON_STRING, err);

	if (v == NULL)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(json_string_value(v), names[i]) == 0 &&
		    strlen(names[i]) == json_string_length(v)) {
			*idx = i;
			return 0;
		}
	}
	return tt_err_set(err, TT_ERR_MALFORMED, "claims: bad value for '%s'",
	                  name);
}

/* ops_claim: the "ops" array; non-strings and overlong names are malformed,
 * unknown names grant nothing. */
static int ops_claim(json_t *root, uint32_t *ops, struct tt_err *err)
{
	json_t *v = claim_get(root, "ops", JSON_ARRAY, err);
	json_t *item;
	size_t i;

	*ops = 0;
	if (v == NULL)
		return -1;
	if (json_array_size(v) > OPS_MAX_ENTRIES)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: 'ops' has more than %d entries",
		                  OPS_MAX_ENTRIES);
	json_array_foreach(v, i, item) {
		if (!json_is_string(item))
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "claims: 'ops' entry is not a string");
		if (json_string_length(item) > TT_NAME_MAX)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "claims: 'ops' entry too long");
		if (strlen(json_string_value(item)) == json_string_length(item))
			*ops |= wireop_cap(wireop_parse(json_string_value(item)));
	}
	return 0;
}

/* claims_from_json: every check on a parsed root object. */
static int claims_from_json(json_t *root, struct tt_claims *c,
                            struct tt_err *err)
{
	static const char *const auds[] = { "node", "gateway" };
	static const char *const purs[] = { "control", "port" };
	static const char *const protos[] = { "tcp", "http" };
	const char *key;
	json_t *val;
	json_int_t n;
	size_t idx;

	json_object_foreach(root, key, val) {
		bool known = false;

		for (size_t i = 0; i < sizeof(known_claims) / sizeof(*known_claims); i++)
			if (strcmp(key, known_claims[i]) == 0)
				known = true;
		/* Name the claim only if it is harmless to print in a log. */
		if (!known && strlen(key) <= 32 &&
		    charset_ok(key, strlen(key), 'w', false))
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "claims: unknown claim '%s'", key);
		if (!known)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "claims: unknown claim");
	}

	if (str_claim(root, "iss", c->iss, sizeof(c->iss), 'p', false, err) < 0 ||
	    str_claim(root, "sub", c->sub, sizeof(c->sub), 'p', false, err) < 0 ||
	    str_claim(root, "jti", c->jti, sizeof(c->jti), 'p', false, err) < 0 ||
	    time_claim(root, "iat", &c->iat, err) < 0 ||
	    time_claim(root, "exp", &c->exp, err) < 0)
		return -1;
	if (c->exp <= c->iat)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: 'exp' is not after 'iat'");
	if (c->exp - c->iat > TT_CAP_LIFETIME)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: lifetime over %d s", TT_CAP_LIFETIME);
	if (enum_claim(root, "aud", auds, 2, &idx, err) < 0)
		return -1;
	c->aud = idx == 0 ? TT_AUD_NODE : TT_AUD_GATEWAY;

	/* sbx: copy then validate as a sandbox id. */
	if (str_claim(root, "sbx", c->id.sbx, sizeof(c->id.sbx), 'p', false,
	              err) < 0)
		return -1;
	if (!sbx_id_valid(c->id.sbx))
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: 'sbx' is not a sandbox id");
	if (int_claim(root, "gen", 1, INT64_MAX, &n, err) < 0)
		return -1;
	c->id.gen = (uint64_t)n;
	if (str_claim(root, "wrk", c->id.wrk, sizeof(c->id.wrk), 'w', false,
	              err) < 0 ||
	    str_claim(root, "sst", c->id.sst, sizeof(c->id.sst), 's', false,
	              err) < 0 ||
	    str_claim(root, "pod", c->id.pod, sizeof(c->id.pod), 'w', true,
	              err) < 0)
		return -1;
	if (int_claim(root, "att", 1, UINT32_MAX, &n, err) < 0)
		return -1;
	c->id.att = (uint32_t)n;

	if (enum_claim(root, "pur", purs, 2, &idx, err) < 0)
		return -1;
	c->pur = idx == 0 ? TT_PUR_CONTROL : TT_PUR_PORT;
	if (c->pur == TT_PUR_CONTROL) {
		if (json_object_get(root, "port") || json_object_get(root, "proto"))
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "claims: 'port'/'proto' on a control capability");
		return ops_claim(root, &c->ops, err);
	}
	if (json_object_get(root, "ops"))
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: 'ops' on a port capability");
	if (int_claim(root, "port", 1, 65535, &n, err) < 0)
		return -1;
	c->port = (uint16_t)n;
	if (enum_claim(root, "proto", protos, 2, &idx, err) < 0)
		return -1;
	c->proto = idx == 0 ? TT_PROTO_TCP : TT_PROTO_HTTP;
	return 0;
}

/* claims_parse: payload JSON -> claims (see header). */
int claims_parse(const uint8_t *json, size_t len, struct tt_claims *out,
                 struct tt_err *err)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	memset(out, 0, sizeof(*out));
	if (json == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "claims: no payload");
	if (len > PASETO_PAYLOAD_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "claims: payload over %d bytes",
		                  PASETO_PAYLOAD_MAX);
	/* Duplicates rejected: two "sbx" keys must never mean "the last one". */
	root = json_loadb((const char *)json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "claims: invalid JSON: %s",
		                  jerr.text);
	if (!json_is_object(root)) {
		json_decref(root);
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "claims: payload is not a JSON object");
	}
	rc = claims_from_json(root, out, err);
	json_decref(root);
	if (rc < 0)
		memset(out, 0, sizeof(*out));
	return rc;
}

/* claims_build: the JSON object of c, keys in the fixed order; NULL on
 * ENOMEM or an unformattable time. Owner: caller (json_decref). */
static json_t *claims_build(const struct tt_claims *c)
{
	char iat[TT_RFC3339_MAX], exp[TT_RFC3339_MAX];
	json_t *o, *ops;
	int bad = 0;

	if (rfc3339_format(c->iat, iat) < 0 || rfc3339_format(c->exp, exp) < 0)
		return NULL;
	o = json_object();
	if (o == NULL)
		return NULL;
	bad |= json_object_set_new(o, "iss", json_string(c->iss));
	bad |= json_object_set_new(o, "sub", json_string(c->sub));
	bad |= json_object_set_new(o, "jti", json_string(c->jti));
	bad |= json_object_set_new(o, "iat", json_string(iat));
	bad |= json_object_set_new(o, "exp", json_string(exp));
	bad |= json_object_set_new(o, "aud", json_string(
		c->aud == TT_AUD_GATEWAY ? "gateway" : "node"));
	bad |= json_object_set_new(o, "sbx", json_string(c->id.sbx));
	bad |= json_object_set_new(o, "gen", json_integer((json_int_t)c->id.gen));
	bad |= json_object_set_new(o, "wrk", json_string(c->id.wrk));
	bad |= json_object_set_new(o, "sst", json_string(c->id.sst));
	bad |= json_object_set_new(o, "pod", json_string(c->id.pod));
	bad |= json_object_set_new(o, "att", json_integer(c->id.att));
	bad |= json_object_set_new(o, "pur", json_string(
		c->pur == TT_PUR_PORT ? "port" : "control"));
	if (c->pur == TT_PUR_PORT) {
		bad |= json_object_set_new(o, "port", json_integer(c->port));
		bad |= json_object_set_new(o, "proto", json_string(
			c->proto == TT_PROTO_HTTP ? "http" :
			c->proto == TT_PROTO_TCP ? "tcp" : ""));
	} else {
		ops = json_array();
		for (unsigned i = 1; ops != NULL && i < WIRE_OP_COUNT; i++)
			if (c->ops & wireop_cap((enum wire_op)i))
				bad |= json_array_append_new(
					ops, json_string(wireop_name((enum wire_op)i)));
		bad |= json_object_set_new(o, "ops", ops);
	}
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* claims_to_json: compact JSON in fixed key order. The result is parsed
 * back before it is returned, so nothing is emitted (and signed) that a
 * receiver would refuse as malformed. */
char *claims_to_json(const struct tt_claims *c, struct tt_err *err)
{
	struct tt_claims check;
	json_t *o;
	char *s;

	if (c == NULL) {
		tt_err_set(err, TT_ERR_INVALID, "claims: none given");
		return NULL;
	}
	/* json_string returns NULL on invalid UTF-8, which claims_build sees
	 * as a failed set: report it as invalid claims, not ENOMEM. */
	o = claims_build(c);
	if (o == NULL) {
		tt_err_set(err, TT_ERR_INVALID,
		           "claims: cannot encode (bad time or string)");
		return NULL;
	}
	s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (s == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "claims: out of memory");
		return NULL;
	}
	if (claims_parse((const uint8_t *)s, strlen(s), &check, err) < 0) {
		free(s);
		if (err != NULL)
			err->code = TT_ERR_INVALID;
		return NULL;
	}
	return s;
}

/* Verification key ring (see keyring.h). */
#include "keyring.h"

#include <jansson.h>
#include <sodium.h>
#include <string.h>

#include "timefmt.h"

/* Times outside year 0000..9999 cannot come from RFC 3339 and would let the
 * window arithmetic below overflow; refuse them. */
#define KEY_TIME_MAX 253402300799LL
/* A bundle holds at most TT_KEYRING_MAX keys of ~200 bytes each. */
#define BUNDLE_JSON_MAX 8192
/* How long a key keeps verifying after it stopped signing. */
#define KEY_GRACE (TT_CAP_LIFETIME + TT_CAP_SKEW)

/* key_index: position of kid in kr, or -1. Kids are public: plain compare. */
static int key_index(const struct tt_keyring *kr, const char *kid)
{
	if (kid == NULL)
		return -1;
	for (size_t i = 0; i < kr->n; i++)
		if (strncmp(kr->keys[i].kid, kid, sizeof(kr->keys[i].kid)) == 0)
			return (int)i;
	return -1;
}

/* time_ok: within the range RFC 3339 can express. */
static bool time_ok(int64_t t)
{
	return t >= 0 && t <= KEY_TIME_MAX;
}

/* keyring_add: replaces the window of a key already present (same kid). */
int keyring_add(struct tt_keyring *kr, const uint8_t pk[PASETO_PK_BYTES],
                int64_t not_before, int64_t not_after, struct tt_err *err)
{
	struct tt_key k;
	int i;

	if (!time_ok(not_before) || !time_ok(not_after))
		return tt_err_set(err, TT_ERR_INVALID, "keyring: time out of range");
	if (not_after != 0 && not_after < not_before)
		return tt_err_set(err, TT_ERR_INVALID,
		                  "keyring: not_after before not_before");
	memset(&k, 0, sizeof(k));
	if (paserk_k4_pid(pk, k.kid) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "keyring: cannot compute kid");
	memcpy(k.pk, pk, PASETO_PK_BYTES);
	k.not_before = not_before;
	k.not_after = not_after;
	i = key_index(kr, k.kid);
	if (i < 0) {
		if (kr->n >= TT_KEYRING_MAX)
			return tt_err_set(err, TT_ERR_TOO_LARGE,
			                  "keyring: full (%d keys)", TT_KEYRING_MAX);
		i = (int)kr->n++;
	}
	kr->keys[i] = k;
	return 0;
}

/* keyring_retire: the key stops signing at not_after; verifies until
 * not_after + lifetime + skew. */
int keyring_retire(struct tt_keyring *kr, const char *kid, int64_t not_after,
                   struct tt_err *err)
{
	int i = key_index(kr, kid);

	if (i < 0)
		return tt_err_set(err, TT_ERR_NOT_FOUND, "keyring: no key %s",
		                  kid != NULL ? kid : "(null)");
	if (!time_ok(not_after) || not_after == 0 ||
	    not_after < kr->keys[i].not_before)
		return tt_err_set(err, TT_ERR_INVALID,
		                  "keyring: bad retirement time");
	kr->keys[i].not_after = not_after;
	return 0;
}

/* key_live: whether k may verify a token at time now. */
static bool key_live(const struct tt_key *k, int64_t now)
{
	if (now < k->not_before - TT_CAP_SKEW)
		return false;
	return k->not_after == 0 || now <= k->not_after + KEY_GRACE;
}

/* keyring_find: only keys inside their window verify. */
const struct tt_key *keyring_find(const struct tt_keyring *kr, const char *kid,
                                  int64_t now)
{
	int i = key_index(kr, kid);

	if (i < 0 || !key_live(&kr->keys[i], now))
		return NULL;
	return &kr->keys[i];
}

/* keyring_prune: drops retired keys whose last token has expired; keys not
 * yet valid are kept (published ahead of signing). Order is preserved. */
size_t keyring_prune(struct tt_keyring *kr, int64_t now)
{
	size_t out = 0, dropped = 0;

	for (size_t i = 0; i < kr->n; i++) {
		const struct tt_key *k = &kr->keys[i];

		if (k->not_after != 0 && now > k->not_after + KEY_GRACE) {
			dropped++;
			continue;
		}
		if (out != i)
			kr->keys[out] = *k;
		out++;
	}
	kr->n = out;
	memset(&kr->keys[out], 0, sizeof(kr->keys[0]) * (TT_KEYRING_MAX - out));
	return dropped;
}

/* time_json: an RFC 3339 string, or null for 0 (open). New reference. */
static json_t *time_json(int64_t t)
{
	char buf[TT_RFC3339_MAX];

	if (t == 0)
		return json_null();
	if (rfc3339_format(t, buf) < 0)
		return NULL;
	return json_string(buf);
}

/* keyring_to_json: compact bundle; caller frees the string. */
char *keyring_to_json(const struct tt_keyring *kr, struct tt_err *err)
{
	json_t *root = json_object(), *arr = json_array();
	char *s = NULL;

	if (root == NULL || arr == NULL || json_object_set_new(root, "keys", arr) < 0) {
		json_decref(root);
		if (root == NULL)
			json_decref(arr);
		tt_err_set(err, TT_ERR_NOMEM, "keyring: out of memory");
		return NULL;
	}
	for (size_t i = 0; i < kr->n; i++) {
		const struct tt_key *k = &kr->keys[i];
		char pub[PASERK_K4_PUBLIC_LEN + 1];
		json_t *o;

		if (paserk_k4_public_encode(k->pk, pub) < 0)
			goto fail;
		/* "o", not "o?": a failed time must fail, never read as open. */
		o = json_pack("{s:s, s:s, s:o, s:o}", "kid", k->kid, "public", pub,
		              "not_before", time_json(k->not_before),
		              "not_after", time_json(k->not_after));
		if (o == NULL || json_array_append_new(arr, o) < 0)
			goto fail;
	}
	s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (s == NULL)
		tt_err_set(err, TT_ERR_NOMEM, "keyring: out of memory");
	return s;
fail:
	json_decref(root);
	tt_err_set(err, TT_ERR_NOMEM, "keyring: cannot encode the bundle");
	return NULL;
}

/* time_from_json: RFC 3339 string or null (0). */
static int time_from_json(json_t *v, const char *what, int64_t *out,
                          struct tt_err *err)
{
	const char *s;

	if (v == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "keyring: missing %s", what);
	if (json_is_null(v)) {
		*out = 0;
		return 0;
	}
	if (!json_is_string(v))
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "keyring: %s must be a string or null", what);
	s = json_string_value(v);
	if (rfc3339_parse(s, json_string_length(v), out, err) < 0)
		return -1;
	if (!time_ok(*out))
		return tt_err_set(err, TT_ERR_MALFORMED, "keyring: %s out of range",
		                  what);
	return 0;
}

/* key_from_json: one {"kid","public","not_before","not_after"} entry; the
 * kid must be the one its public key hashes to. */
static int key_from_json(struct tt_keyring *kr, json_t *o, struct tt_err *err)
{
	json_t *kid = json_object_get(o, "kid"), *pub = json_object_get(o, "public");
	uint8_t pk[PASETO_PK_BYTES];
	char want[PASERK_K4_PID_LEN + 1];
	int64_t nb, na;

	if (!json_is_object(o) || json_object_size(o) != 4)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "keyring: a key must have exactly kid, public, "
		                  "not_before, not_after");
	if (!json_is_string(kid) || !json_is_string(pub))
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "keyring: kid and public must be strings");
	if (strlen(json_string_value(pub)) != json_string_length(pub) ||
	    paserk_k4_public_decode(json_string_value(pub), pk, err) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "keyring: public is not a k4.public key");
	if (paserk_k4_pid(pk, want) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "keyring: cannot compute kid");
	if (json_string_length(kid) != PASERK_K4_PID_LEN ||
	    strcmp(json_string_value(kid), want) != 0)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "keyring: kid does not match its public key");
	if (time_from_json(json_object_get(o, "not_before"), "not_before", &nb,
	                   err) < 0 ||
	    time_from_json(json_object_get(o, "not_after"), "not_after", &na,
	                   err) < 0)
		return -1;
	if (key_index(kr, want) >= 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "keyring: duplicate kid %s",
		                  want);
	return keyring_add(kr, pk, nb, na, err);
}

/* keyring_from_json: replaces *kr with the bundle, all or nothing. */
int keyring_from_json(struct tt_keyring *kr, const char *json, size_t len,
                      struct tt_err *err)
{
	struct tt_keyring tmp;
	json_error_t jerr;
	json_t *root, *keys;
	size_t i;
	json_t *k;

	if (json == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "keyring: no bundle");
	if (len > BUNDLE_JSON_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "keyring: bundle exceeds %d bytes", BUNDLE_JSON_MAX);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "keyring: bad JSON: %s",
		                  jerr.text);
	keys = json_object_get(root, "keys");
	if (!json_is_object(root) || !json_is_array(keys)) {
		json_decref(root);
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "keyring: bundle needs a \"keys\" array");
	}
	if (json_array_size(keys) > TT_KEYRING_MAX) {
		json_decref(root);
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "keyring: more than %d keys", TT_KEYRING_MAX);
	}
	memset(&tmp, 0, sizeof(tmp));
	json_array_foreach(keys, i, k) {
		if (key_from_json(&tmp, k, err) < 0) {
			json_decref(root);
			return -1;
		}
	}
	json_decref(root);
	*kr = tmp;
	return 0;
}

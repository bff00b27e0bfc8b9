/* Verified-capability cache and admission (see capcache.h, SPEC §3/§4).
 *
 * Layout: a fixed array of entries (capacity rounded up to a power of two),
 * a bucket array of chain heads indexed by SipHash (crypto_shorthash) of the
 * token under a random per-cache key, so an outsider cannot aim tokens at
 * one chain. An entry matches only if the token bytes AND the implicit
 * assertion bytes are equal: the signature covers both, so a hit for the
 * same token under another implicit assertion would skip a check that could
 * fail. Only tokens that verified are inserted, so garbage never takes
 * memory. When full, expired entries are purged first, else the CLOCK hand
 * evicts an entry not referenced since its last pass. */
#include "capcache.h"

#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "paseto.h"
#include "timefmt.h"

#define NIL UINT32_MAX

struct cc_entry {
	uint8_t *bytes;        /* token || implicit; owned by the entry */
	size_t token_len, implicit_len;
	uint64_t hash;
	uint32_t next;         /* next entry in the bucket chain, or NIL */
	bool used, ref;        /* ref: CLOCK bit, set on insert and hit */
	int64_t valid_until;   /* exp + skew: never served after this */
	char kid[PASERK_K4_PID_LEN + 1];
	struct tt_claims claims;
};

struct capcache {
	struct cc_entry *entries; /* cap of them */
	uint32_t *buckets;        /* cap chain heads */
	uint32_t *free_idx;       /* stack of unused entry indexes */
	size_t cap, nfree, hand;
	uint8_t key[crypto_shorthash_KEYBYTES];
	struct capcache_stats stats;
};

/* capcache_new: a cache of at least capacity entries; NULL on ENOMEM. */
struct capcache *capcache_new(size_t capacity)
{
	struct capcache *c;
	size_t cap = 1;

	if (sodium_init() < 0)
		return NULL;
	if (capacity > (1u << 24))
		capacity = 1u << 24; /* 16M entries is far past any sane use */
	while (cap < capacity)
		cap <<= 1;
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->entries = calloc(cap, sizeof(*c->entries));
	c->buckets = malloc(cap * sizeof(*c->buckets));
	c->free_idx = malloc(cap * sizeof(*c->free_idx));
	if (c->entries == NULL || c->buckets == NULL || c->free_idx == NULL) {
		capcache_free(c);
		return NULL;
	}
	c->cap = cap;
	for (size_t i = 0; i < cap; i++) {
		c->buckets[i] = NIL;
		/* Pushed in reverse so entry 0 is used first. */
		c->free_idx[i] = (uint32_t)(cap - 1 - i);
	}
	c->nfree = cap;
	crypto_shorthash_keygen(c->key);
	return c;
}

/* capcache_free: releases the cache and every cached token copy. */
void capcache_free(struct capcache *cache)
{
	if (cache == NULL)
		return;
	if (cache->entries != NULL)
		for (size_t i = 0; i < cache->cap; i++)
			free(cache->entries[i].bytes);
	free(cache->entries);
	free(cache->buckets);
	free(cache->free_idx);
	sodium_memzero(cache->key, sizeof(cache->key));
	free(cache);
}

/* capcache_stats: a copy of the counters. */
void capcache_stats(const struct capcache *cache, struct capcache_stats *out)
{
	if (cache == NULL) {
		memset(out, 0, sizeof(*out));
		return;
	}
	*out = cache->stats;
}

/* cc_hash: keyed SipHash of the token bytes. */
static uint64_t cc_hash(const struct capcache *c, const char *token,
                        size_t len)
{
	uint8_t h[crypto_shorthash_BYTES];
	uint64_t v;

	crypto_shorthash(h, (const unsigned char *)token, len, c->key);
	memcpy(&v, h, sizeof(v));
	return v;
}

/* cc_find: index of the entry for (token, implicit), or NIL. memcmp is
 * not constant-time, but it only runs once the keyed 64-bit hash matched,
 * which an outsider cannot aim at, so its timing reveals nothing. */
static uint32_t cc_find(const struct capcache *c, uint64_t h,
                        const char *token, size_t len,
                        const uint8_t *implicit, size_t ilen)
{
	for (uint32_t i = c->buckets[h & (c->cap - 1)]; i != NIL;
	     i = c->entries[i].next) {
		const struct cc_entry *e = &c->entries[i];

		if (e->hash == h && e->token_len == len &&
		    e->implicit_len == ilen &&
		    memcmp(e->bytes, token, len) == 0 &&
		    (ilen == 0 || memcmp(e->bytes + len, implicit, ilen) == 0))
			return i;
	}
	return NIL;
}

/* cc_remove: unlinks entry i from its chain, frees its copy, marks it free. */
static void cc_remove(struct capcache *c, uint32_t i)
{
	struct cc_entry *e = &c->entries[i];
	uint32_t *link = &c->buckets[e->hash & (c->cap - 1)];

	while (*link != NIL && *link != i)
		link = &c->entries[*link].next;
	if (*link == i)
		*link = e->next;
	free(e->bytes);
	memset(e, 0, sizeof(*e));
	c->free_idx[c->nfree++] = i;
}

/* cc_make_room: guarantees a free entry: purge every expired one first
 * (one O(cap) pass, amortized over the slots it frees; only reached after a
 * signature verified, which costs far more), else evict by CLOCK. */
static void cc_make_room(struct capcache *c, int64_t now)
{
	if (c->nfree > 0)
		return;
	for (uint32_t i = 0; i < c->cap; i++) {
		if (c->entries[i].used && now > c->entries[i].valid_until) {
			cc_remove(c, i);
			c->stats.expired++;
		}
	}
	if (c->nfree > 0)
		return;
	for (;;) {
		uint32_t i = (uint32_t)c->hand;
		struct cc_entry *e = &c->entries[i];

		c->hand = (c->hand + 1) & (c->cap - 1);
		if (e->ref) {
			e->ref = false; /* second chance */
			continue;
		}
		cc_remove(c, i);
		c->stats.evictions++;
		return;
	}
}

/* cc_insert: caches a verified token; silently skipped on ENOMEM (the
 * cache is an optimization, admission does not depend on it). */
static void cc_insert(struct capcache *c, uint64_t h, const char *token,
                      size_t len, const uint8_t *implicit, size_t ilen,
                      const char *kid, const struct tt_claims *claims,
                      int64_t now)
{
	uint8_t *copy;
	struct cc_entry *e;
	uint32_t i;

	copy = malloc(len + ilen);
	if (copy == NULL)
		return;
	memcpy(copy, token, len);
	if (ilen > 0)
		memcpy(copy + len, implicit, ilen);
	cc_make_room(c, now);
	i = c->free_idx[--c->nfree];
	e = &c->entries[i];
	e->bytes = copy; /* owner: the entry, until cc_remove */
	e->token_len = len;
	e->implicit_len = ilen;
	e->hash = h;
	e->used = true;
	e->ref = true;
	e->valid_until = claims->exp + TT_CAP_SKEW;
	memcpy(e->kid, kid, sizeof(e->kid));
	e->claims = *claims;
	e->next = c->buckets[h & (c->cap - 1)];
	c->buckets[h & (c->cap - 1)] = i;
}

/* cap_token_kid: the "kid" of the footer {"kid":"k4.pid.…"} (strict JSON,
 * duplicates refused; other keys are allowed and ignored). */
int cap_token_kid(const char *token, size_t token_len,
                  char kid[PASERK_K4_PID_LEN + 1], struct tt_err *err)
{
	struct paseto_msg foot = { 0 };
	json_error_t jerr;
	json_t *root, *v;
	int rc = 0;

	if (paseto_v4_footer(token, token_len, &foot, err) < 0)
		return -1;
	if (foot.footer_len == 0) {
		paseto_msg_free(&foot);
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "capability: no footer (no kid)");
	}
	root = json_loadb((const char *)foot.footer, foot.footer_len,
	                  JSON_REJECT_DUPLICATES, &jerr);
	paseto_msg_free(&foot);
	if (root == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "capability: footer is not JSON: %s", jerr.text);
	v = json_object_get(root, "kid");
	if (!json_is_object(root) || !json_is_string(v) ||
	    json_string_length(v) != PASERK_K4_PID_LEN ||
	    strlen(json_string_value(v)) != PASERK_K4_PID_LEN ||
	    strncmp(json_string_value(v), "k4.pid.", 7) != 0)
		rc = tt_err_set(err, TT_ERR_MALFORMED,
		                "capability: footer has no valid kid");
	else
		memcpy(kid, json_string_value(v), PASERK_K4_PID_LEN + 1);
	json_decref(root);
	return rc;
}

/* cap_check: check 1 and claim parsing at time now (for the key window);
 * fills out and kid. */
static int cap_check(const struct tt_keyring *kr, const char *token,
                     size_t token_len, const uint8_t *implicit,
                     size_t implicit_len, int64_t now, struct tt_claims *out,
                     char kid[PASERK_K4_PID_LEN + 1], struct tt_err *err)
{
	struct paseto_msg msg = { 0 };
	const struct tt_key *key;
	int rc;

	if (token == NULL || token_len == 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "capability: empty");
	if (token_len > PASETO_TOKEN_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "capability: over %d bytes", PASETO_TOKEN_MAX);
	if (kr == NULL)
		return tt_err_set(err, TT_ERR_UNKNOWN_KEY, "capability: no keys");
	/* The footer is unverified here: it only picks the key. */
	if (cap_token_kid(token, token_len, kid, err) < 0)
		return -1;
	key = keyring_find(kr, kid, now);
	if (key == NULL)
		return tt_err_set(err, TT_ERR_UNKNOWN_KEY,
		                  "capability: unknown key id");
	if (paseto_v4_verify(key->pk, token, token_len, implicit, implicit_len,
	                     &msg, err) < 0)
		return -1;
	rc = claims_parse(msg.payload, msg.payload_len, out, err);
	paseto_msg_free(&msg);
	return rc;
}

/* cap_admit: full admission of one token (see header). */
struct tt_decision cap_admit(struct capcache *cache,
                             const struct tt_keyring *kr,
                             const char *token, size_t token_len,
                             const uint8_t *implicit, size_t implicit_len,
                             const struct tt_request *req,
                             const struct tt_installed *rec, int64_t now,
                             struct tt_claims *claims_out)
{
	char kid[PASERK_K4_PID_LEN + 1];
	struct tt_claims claims;
	struct tt_err err = { 0 };
	uint64_t h = 0;

	if (implicit == NULL)
		implicit_len = 0;
	if (token == NULL || token_len == 0 || token_len > PASETO_TOKEN_MAX) {
		tt_err_set(&err, TT_ERR_MALFORMED, "capability: bad length");
		return decision_from_error(&err);
	}
	if (cache != NULL) {
		uint32_t i;

		h = cc_hash(cache, token, token_len);
		i = cc_find(cache, h, token, token_len, implicit, implicit_len);
		if (i != NIL) {
			struct cc_entry *e = &cache->entries[i];

			if (now > e->valid_until) {
				/* Never served past expiry: drop it and take the
				 * full path, which denies it as expired. */
				cc_remove(cache, i);
				cache->stats.expired++;
			} else if (kr == NULL || keyring_find(kr, e->kid, now) == NULL) {
				/* A dropped key takes its tokens with it. */
				cc_remove(cache, i);
				cache->stats.hits++;
				return decision_from_error(&(struct tt_err){
					.code = TT_ERR_UNKNOWN_KEY });
			} else {
				cache->stats.hits++;
				e->ref = true;
				if (claims_out != NULL)
					*claims_out = e->claims;
				/* Every check but the signature runs again. */
				return decision_decide(&e->claims, req, rec, now);
			}
		}
		cache->stats.misses++;
	}

	if (cap_check(kr, token, token_len, implicit, implicit_len, now,
	              &claims, kid, &err) < 0)
		return decision_from_error(&err);
	if (claims_out != NULL)
		*claims_out = claims;
	if (cache != NULL && now <= claims.exp + TT_CAP_SKEW)
		cc_insert(cache, h, token, token_len, implicit, implicit_len, kid,
		          &claims, now);
	return decision_decide(&claims, req, rec, now);
}

/* cap_verify: check 1 and claim parsing at the current wall-clock time
 * (the key window is the only time-dependent part of check 1). */
int cap_verify(const struct tt_keyring *kr, const char *token, size_t token_len,
               const uint8_t *implicit, size_t implicit_len,
               struct tt_claims *out, struct tt_err *err)
{
	char kid[PASERK_K4_PID_LEN + 1];

	if (implicit == NULL)
		implicit_len = 0;
	return cap_check(kr, token, token_len, implicit, implicit_len, tt_now(),
	                 out, kid, err);
}

/* Capability key rotation (SPEC §3), through the signed feed:
 *   1. the signer is restarted with a next key (--next-key DIR/signer.next.key,
 *      made if absent) and a key bundle holding both keys is published;
 *   2. once every worker that is up has acknowledged that bundle (the
 *      sweep looks every second; 60 s at most, else the rotation is
 *      abandoned and the next key withdrawn), the next key signs from
 *      then on (the signer is told, its file renamed over signer.key);
 *   3. a bundle marking the old key's not_after = now is published: it
 *      verifies what it signed until that expired (not_after + 135 s,
 *      lib/keyring.h), then a bundle without it is published.
 * POST /v1/admin/rotate-keys starts one (admin key), GET /v1/admin/keys
 * shows where it is. A cp restart in the middle leaves the old key
 * signing and the next one published (harmless; a new rotation reuses it). */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cp/cp.h"
#include "keyring.h"
#include "log.h"

#define ROT_ACK_WAIT_S 60
#define ROT_DROP_S (TT_CAP_LIFETIME + TT_CAP_SKEW + 1)

/* rot_time: RFC 3339 string of t. */
static json_t *rot_time(int64_t t)
{
	char buf[TT_RFC3339_MAX];

	return rfc3339_format(t, buf) < 0 ? json_null() : json_string(buf);
}

/* rot_expired: a bundle entry whose key stopped signing long enough ago
 * that nothing it signed is still valid. */
static int rot_expired(json_t *k, int64_t now)
{
	const char *na = json_string_value(json_object_get(k, "not_after"));
	int64_t t;

	return na != NULL && rfc3339_parse(na, strlen(na), &t, NULL) == 0 &&
	       now > t + TT_CAP_LIFETIME + TT_CAP_SKEW;
}

/* rot_bundle: the last published bundle's keys, less expired ones and
 * less skip (a kid; may be NULL), retiring retire (its not_after = now). */
static json_t *rot_bundle(struct cp *cp, const char *skip, const char *retire,
                          int64_t now, struct tt_err *err)
{
	json_t *last = cpdb_feed_last_body(cp->db, "keys", err), *keys = json_array(), *k;
	size_t i;

	if (last == NULL && err->code != TT_OK) {
		json_decref(keys);
		return NULL;
	}
	json_array_foreach(json_object_get(last, "keys"), i, k) {
		const char *kid = json_string_value(json_object_get(k, "kid"));
		json_t *c;

		if (kid == NULL || rot_expired(k, now) || (skip && strcmp(kid, skip) == 0))
			continue;
		c = json_deep_copy(k);
		if (retire && strcmp(kid, retire) == 0 &&
		    json_is_null(json_object_get(c, "not_after")))
			json_object_set_new(c, "not_after", rot_time(now));
		json_array_append_new(keys, c);
	}
	json_decref(last);
	return keys;
}

/* rot_publish: appends keys (consumed) as a keys update for every worker. */
static int rot_publish(struct cp *cp, json_t *keys, int64_t *rev, struct tt_err *err)
{
	json_t *body = json_pack("{s:o}", "keys", keys);
	int rc;

	if (body == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	rc = cpdb_feed_append(cp->db, "keys", NULL, body, tt_now(), rev, err);
	json_decref(body);
	if (rc == 0)
		feed_wake(cp, NULL);
	return rc;
}

/* rot_respawn: the signer again, with or without the next key. */
static int rot_respawn(struct cp *cp, const char *next_path, struct tt_err *err)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s", cp->signer.key_path);
	snprintf(cp->signer.next_path, sizeof(cp->signer.next_path), "%s", next_path);
	cp_signer_stop(&cp->signer);
	return cp_signer_spawn(path, &cp->signer, err);
}

/* cp_rotate_start: POST /v1/admin/rotate-keys. */
int cp_rotate_start(struct cp *cp, struct cp_sess *s, struct lws *wsi)
{
	struct cp_rotation *r = &cp->rot;
	struct tt_err err = { 0 };
	char next[PATH_MAX], pub[PASERK_K4_PUBLIC_LEN + 1];
	const char *slash = strrchr(cp->signer.key_path, '/');
	int64_t now = tt_now();
	json_t *keys;

	if (strcmp(s->caller, "admin") != 0)
		return http_reply_error(wsi, 403, "forbidden", "rotating keys needs the admin key");
	if (r->active)
		return http_reply_error(wsi, 409, "conflict", "a rotation to %s is in progress",
		                        r->next_kid);
	/* each replica's signer would need the next key, and all of them to
	 * switch together: not built (docs/ARCHITECTURE.md) */
	if (cpdb_shared(cp->db))
		return http_reply_error(wsi, 409, "conflict", "key rotation needs a single "
		                        "control plane on SQLite; with replicas on %s, "
		                        "rotate by giving every replica a new key pair "
		                        "while stopped", cpdb_backend(cp->db));
	if (slash == NULL || snprintf(next, sizeof(next), "%.*s/signer.next.key",
	                              (int)(slash - cp->signer.key_path),
	                              cp->signer.key_path) >= (int)sizeof(next))
		return http_reply_error(wsi, 500, "internal", "signer key path");
	snprintf(r->old_kid, sizeof(r->old_kid), "%s", cp->signer.kid);
	if (rot_respawn(cp, next, &err) < 0 ||
	    cp_signer_next(&cp->signer, pub, r->next_kid, &err) < 0)
		goto fail;
	keys = rot_bundle(cp, r->next_kid, NULL, now, &err);
	if (keys == NULL ||
	    json_array_append_new(keys, json_pack("{s:s,s:s,s:o,s:n}", "kid", r->next_kid,
	                          "public", pub, "not_before", rot_time(now - 5),
	                          "not_after")) < 0 ||
	    rot_publish(cp, keys, &r->rev, &err) < 0)
		goto fail;
	r->active = 1;
	r->deadline = now + ROT_ACK_WAIT_S;
	r->error[0] = '\0';
	log_info("key rotation: %s published at rev %lld beside %s; it signs once every "
	         "worker has it", r->next_kid, (long long)r->rev, r->old_kid);
	return http_reply_json(wsi, 202, json_pack("{s:s,s:s,s:s,s:I}", "phase", "publishing",
	                       "signing", r->old_kid, "next", r->next_kid, "rev",
	                       (json_int_t)r->rev));
fail:
	log_error("key rotation: %s", err.msg);
	if (cp->signer.next_path[0] != '\0')
		rot_respawn(cp, "", &(struct tt_err){ 0 });
	return http_reply_error(wsi, 503, "unavailable", "key rotation: %s", err.msg);
}

/* Whether every worker that is up has acknowledged rev. */
struct rot_acks {
	struct cp *cp;
	int64_t rev, now;
	int missing;
};

/* rot_ack_one: one worker's position. */
static void rot_ack_one(const struct cp_worker *w, void *arg)
{
	struct rot_acks *a = arg;

	if (cp_worker_up(a->cp, w, a->now) && w->acked_rev < a->rev)
		a->missing++;
}

/* rot_promote: everyone has the next key: it signs; the old one retires. */
static void rot_promote(struct cp *cp, int64_t now)
{
	struct cp_rotation *r = &cp->rot;
	struct tt_err err = { 0 };
	json_t *keys;
	int64_t rev;

	if (cp_signer_promote(&cp->signer, r->next_kid, &err) < 0) {
		snprintf(r->error, sizeof(r->error), "promote: %.200s", err.msg);
		log_error("key rotation: %s", r->error);
		return; /* tried again at the next sweep, until the deadline */
	}
	r->active = 0;
	keys = rot_bundle(cp, NULL, r->old_kid, now, &err);
	if (keys == NULL || rot_publish(cp, keys, &rev, &err) < 0) {
		log_error("key rotation: retiring %s: %s", r->old_kid, err.msg);
		return;
	}
	r->drop_at = now + ROT_DROP_S;
	log_info("key rotation: %s signs from now on; %s stopped signing (rev %lld) and "
	         "verifies until what it signed has expired", r->next_kid, r->old_kid,
	         (long long)rev);
}

/* cp_rotate_sweep: advances a rotation; drops keys whose last capability
 * has expired. From the cp's sweep (every second). */
void cp_rotate_sweep(struct cp *cp)
{
	struct cp_rotation *r = &cp->rot;
	struct tt_err err = { 0 };
	int64_t now = tt_now(), rev;

	if (r->active) {
		struct rot_acks a = { .cp = cp, .rev = r->rev, .now = now };

		if (cpdb_workers_each(cp->db, rot_ack_one, &a, &err) == 0 && a.missing == 0) {
			rot_promote(cp, now);
		} else if (now > r->deadline) {
			snprintf(r->error, sizeof(r->error), "%d worker(s) did not acknowledge"
			         " rev %lld within %d s: %.60s withdrawn", a.missing, (long long)r->rev,
			         ROT_ACK_WAIT_S, r->next_kid);
			log_error("key rotation: %s", r->error);
			r->active = 0;
			if (rot_respawn(cp, "", &err) < 0)
				log_error("key rotation: signer: %s", err.msg);
			json_t *keys = rot_bundle(cp, r->next_kid, NULL, now, &err);
			if (keys == NULL || rot_publish(cp, keys, &rev, &err) < 0)
				log_error("key rotation: withdrawing: %s", err.msg);
		}
	}
	if (r->drop_at != 0 && now >= r->drop_at) {
		json_t *keys = rot_bundle(cp, NULL, NULL, now, &err);
		json_t *last = cpdb_feed_last_body(cp->db, "keys", &err);
		size_t had = json_array_size(json_object_get(last, "keys"));

		json_decref(last);
		r->drop_at = 0;
		if (keys != NULL && json_array_size(keys) == had) { /* none expired */
			json_decref(keys);
			return;
		}
		if (keys == NULL || rot_publish(cp, keys, &rev, &err) < 0)
			log_error("key rotation: dropping expired keys: %s", err.msg);
		else
			log_info("key rotation: expired keys dropped (rev %lld)", (long long)rev);
	}
}

/* cp_rotate_status: GET /v1/admin/keys. */
int cp_rotate_status(struct cp *cp, struct cp_sess *s, struct lws *wsi)
{
	struct cp_rotation *r = &cp->rot;
	struct tt_err err = { 0 };
	json_t *keys;

	if (strcmp(s->caller, "admin") != 0)
		return http_reply_error(wsi, 403, "forbidden", "needs the admin key");
	keys = rot_bundle(cp, NULL, NULL, tt_now(), &err);
	if (keys == NULL)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	return http_reply_json(wsi, 200, json_pack("{s:s,s:o,s:o,s:s?}", "signing",
	                       cp->signer.kid, "keys", keys, "rotation", r->active ?
	                       json_pack("{s:s,s:s,s:I}", "phase", "publishing", "next",
	                                 r->next_kid, "rev", (json_int_t)r->rev) : json_null(),
	                       "error", r->error[0] ? r->error : NULL));
}

/* Signed feed updates: verification (see feedsig.h). Holds no signing code:
 * a receiver that links it can check updates, never make one. */
#include "feedsig.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "b64url.h"
#include "cleanup.h"
#include "fsutil.h"
#include "log.h"
#include "metrics.h"
#include "paserk.h"

/* feedsig_message: PAE of the two pieces (domain, body). */
int feedsig_message(const uint8_t *body, size_t len, uint8_t *out, size_t cap,
                    size_t *out_len)
{
	const uint8_t *pieces[2] = { (const uint8_t *)FEEDSIG_DOMAIN, body };
	const size_t lens[2] = { sizeof(FEEDSIG_DOMAIN) - 1, len };

	if (body == NULL || len > FEEDSIG_BODY_MAX)
		return -1;
	return paseto_pae(pieces, lens, 2, out, cap, out_len);
}

/* name_ok: a worker id or kind: [A-Za-z0-9._-], 1..max bytes. */
static int name_ok(const char *s, size_t max)
{
	size_t n = s ? strlen(s) : 0;

	if (n == 0 || n > max)
		return 0;
	for (; *s; s++) {
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '.' || *s == '_' || *s == '-'))
			return 0;
	}
	return 1;
}

/* rev_of: a non-negative JSON integer, or -1. */
static int64_t rev_of(json_t *v)
{
	return json_is_integer(v) && json_integer_value(v) >= 0
	       ? (int64_t)json_integer_value(v) : -1;
}

/* feedsig_cpu: see feedsig.h. */
int64_t feedsig_cpu(json_t *u)
{
	json_t *v = json_object_get(u, "cpu");

	if (v == NULL || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < FEEDSIG_CPU_MIN ||
	    json_integer_value(v) > FEEDSIG_CPU_MAX)
		return -1;
	return (int64_t)json_integer_value(v);
}

/* feedsig_body_parse: strict JSON, then the four fields (and an
 * install's cpu). */
json_t *feedsig_body_parse(const char *body, size_t len,
                           struct feedsig_head *h, struct tt_err *err)
{
	json_error_t jerr;
	json_t *o;
	int64_t rev, prev;
	const char *kind, *to;

	memset(h, 0, sizeof(*h));
	if (body == NULL || len > FEEDSIG_BODY_MAX) {
		tt_err_set(err, TT_ERR_TOO_LARGE, "feed update body over %d bytes",
		           FEEDSIG_BODY_MAX);
		return NULL;
	}
	o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(o)) {
		json_decref(o);
		tt_err_set(err, TT_ERR_MALFORMED, "feed update body is not a JSON object");
		return NULL;
	}
	rev = rev_of(json_object_get(o, "rev"));
	prev = rev_of(json_object_get(o, "prev"));
	kind = json_string_value(json_object_get(o, "kind"));
	to = json_string_value(json_object_get(o, "to"));
	if (rev <= 0 || prev < 0 || prev >= rev || !name_ok(kind, sizeof(h->kind) - 1) ||
	    !name_ok(to, TT_NAME_MAX)) {
		json_decref(o);
		tt_err_set(err, TT_ERR_MALFORMED, "feed update body needs rev > prev >= 0,"
		           " a kind and a worker (to)");
		return NULL;
	}
	if (strcmp(kind, "install") == 0 && feedsig_cpu(o) < 0) {
		json_decref(o);
		tt_err_set(err, TT_ERR_MALFORMED, "install: cpu must be absent, null or an"
		           " integer of millicores, %d..%d", FEEDSIG_CPU_MIN, FEEDSIG_CPU_MAX);
		return NULL;
	}
	h->rev = (uint64_t)rev;
	h->prev = (uint64_t)prev;
	snprintf(h->kind, sizeof(h->kind), "%s", kind);
	snprintf(h->to, sizeof(h->to), "%s", to);
	return o;
}

/* feedsig_init: decodes the pinned key. */
int feedsig_init(struct feedsig_state *st, const char *k4_public,
                 const char *worker, struct tt_err *err)
{
	memset(st, 0, sizeof(*st));
	if (!name_ok(worker, TT_NAME_MAX))
		return tt_err_set(err, TT_ERR_INVALID, "feed: invalid worker id");
	snprintf(st->worker, sizeof(st->worker), "%s", worker);
	if (paserk_k4_public_decode(k4_public, st->pk, err) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "feed key: %s", err->msg);
	return 0;
}

/* seen_find: the digest noted for rev, or NULL. */
static const uint8_t *seen_find(const struct feedsig_state *st, uint64_t rev)
{
	for (size_t i = 0; i < FEEDSIG_SEEN_MAX; i++) {
		if (st->seen[i].rev == rev)
			return st->seen[i].digest;
	}
	return NULL;
}

/* seen_note: remembers rev's digest (replacing an older note of it). */
static void seen_note(struct feedsig_state *st, uint64_t rev,
                      const uint8_t d[FEEDSIG_DIGEST_BYTES])
{
	for (size_t i = 0; i < FEEDSIG_SEEN_MAX; i++) {
		if (st->seen[i].rev == rev) {
			memcpy(st->seen[i].digest, d, FEEDSIG_DIGEST_BYTES);
			return;
		}
	}
	st->seen[st->seen_next].rev = rev;
	memcpy(st->seen[st->seen_next].digest, d, FEEDSIG_DIGEST_BYTES);
	st->seen_next = (st->seen_next + 1) % FEEDSIG_SEEN_MAX;
}

/* refuse: sets the reason and err; returns FEEDSIG_REFUSED. */
static enum feedsig_verdict refuse(const char **reason, const char *code,
                                   struct tt_err *err, enum tt_errc ec,
                                   const char *msg)
{
	*reason = code;
	tt_err_set(err, ec, "feed update refused (%s): %s", code, msg);
	return FEEDSIG_REFUSED;
}

/* envelope_check: exactly rev, kind, body, sig; returns the body and sig. */
static int envelope_check(json_t *env, const char **body, size_t *body_len,
                          const char **sig)
{
	json_t *b = json_object_get(env, "body"), *s = json_object_get(env, "sig");

	if (!json_is_object(env) || json_object_size(env) != 4 ||
	    !json_is_integer(json_object_get(env, "rev")) ||
	    !json_is_string(json_object_get(env, "kind")) ||
	    !json_is_string(b) || !json_is_string(s))
		return -1;
	*body = json_string_value(b);
	*body_len = json_string_length(b);
	*sig = json_string_value(s);
	return 0;
}

/* feedsig_open: signature first (nothing unverified is parsed as an
 * update), then the body's rules, then its place in the order. */
enum feedsig_verdict feedsig_open(struct feedsig_state *st, json_t *env,
                                  uint64_t applied, json_t **update,
                                  const char **reason, struct tt_err *err)
{
	uint8_t msg[FEEDSIG_MSG_MAX], sig[crypto_sign_BYTES], d[FEEDSIG_DIGEST_BYTES];
	const uint8_t *old;
	const char *body, *sig_b64;
	struct feedsig_head h;
	size_t body_len, msg_len, sig_len = 0;
	json_t *o;

	*update = NULL;
	*reason = "";
	if (json_is_object(env) && json_object_get(env, "sig") == NULL &&
	    json_object_get(env, "body") == NULL)
		return refuse(reason, "unsigned", err, TT_ERR_SIGNATURE,
		              "no signature (an update must come signed by the feed key)");
	if (envelope_check(env, &body, &body_len, &sig_b64) < 0)
		return refuse(reason, "malformed", err, TT_ERR_MALFORMED,
		              "envelope must be exactly {rev,kind,body,sig}");
	if (body_len > FEEDSIG_BODY_MAX)
		return refuse(reason, "malformed", err, TT_ERR_TOO_LARGE, "body too large");
	if (strlen(sig_b64) != FEEDSIG_SIG_B64_LEN ||
	    b64url_decode(sig_b64, FEEDSIG_SIG_B64_LEN, sig, sizeof(sig), &sig_len,
	                  NULL) < 0 || sig_len != sizeof(sig))
		return refuse(reason, "malformed", err, TT_ERR_MALFORMED,
		              "sig is not 64 bytes of canonical base64url");
	if (feedsig_message((const uint8_t *)body, body_len, msg, sizeof(msg),
	                    &msg_len) < 0 ||
	    crypto_sign_verify_detached(sig, msg, msg_len, st->pk) != 0)
		return refuse(reason, "bad_signature", err, TT_ERR_SIGNATURE,
		              "signature does not verify against the pinned feed key");
	o = feedsig_body_parse(body, body_len, &h, err);
	if (o == NULL)
		return refuse(reason, "malformed", err, TT_ERR_MALFORMED, err->msg);
	if (strcmp(h.to, st->worker) != 0) {
		json_decref(o);
		return refuse(reason, "wrong_worker", err, TT_ERR_DENIED,
		              "signed for another worker");
	}
	if ((uint64_t)json_integer_value(json_object_get(env, "rev")) != h.rev ||
	    strcmp(json_string_value(json_object_get(env, "kind")), h.kind) != 0) {
		json_decref(o);
		return refuse(reason, "mismatch", err, TT_ERR_MALFORMED,
		              "envelope rev/kind differ from the signed ones");
	}
	crypto_generichash(d, sizeof(d), (const uint8_t *)body, body_len, NULL, 0);
	if (h.rev <= applied) {
		old = seen_find(st, h.rev);
		if (old != NULL && sodium_memcmp(old, d, sizeof(d)) != 0) {
			json_decref(o);
			return refuse(reason, "replay_mismatch", err, TT_ERR_CONFLICT,
			              "other content than the update applied under this revision");
		}
		*update = o;
		return FEEDSIG_REPLAY;
	}
	if (h.prev != applied) {
		char m[96];

		json_decref(o);
		snprintf(m, sizeof(m), "revision %llu follows %llu, but %llu was applied last",
		         (unsigned long long)h.rev, (unsigned long long)h.prev,
		         (unsigned long long)applied);
		return refuse(reason, "out_of_order", err, TT_ERR_CONFLICT, m);
	}
	seen_note(st, h.rev, d);
	*update = o;
	return FEEDSIG_APPLY;
}

/* pin_read: the pinned key file's first line into out. */
static int pin_read(int fd, char out[PASERK_K4_PUBLIC_LEN + 1])
{
	char buf[PASERK_K4_PUBLIC_LEN + 3];
	ssize_t n = fsutil_read_to_eof(fd, buf, sizeof(buf) - 1);

	if (n < PASERK_K4_PUBLIC_LEN)
		return -1;
	buf[n] = '\0';
	if (n > PASERK_K4_PUBLIC_LEN && buf[PASERK_K4_PUBLIC_LEN] != '\n')
		return -1;
	memcpy(out, buf, PASERK_K4_PUBLIC_LEN);
	out[PASERK_K4_PUBLIC_LEN] = '\0';
	return 0;
}

/* feedsig_pin: write once (O_EXCL), compare ever after. */
int feedsig_pin(const char *path, const char *k4_public, struct tt_err *err)
{
	uint8_t pk[PASETO_PK_BYTES];
	char have[PASERK_K4_PUBLIC_LEN + 1];
	_cleanup_close_ int fd = -1;

	if (paserk_k4_public_decode(k4_public, pk, err) < 0)
		return -1;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		char line[PASERK_K4_PUBLIC_LEN + 2];

		snprintf(line, sizeof(line), "%s\n", k4_public);
		if (fsutil_write_all(fd, line, PASERK_K4_PUBLIC_LEN + 1) < 0 || fsync(fd) < 0) {
			unlink(path);
			return tt_err_sys(err, TT_ERR_IO, "writing %s", path);
		}
		return 0;
	}
	if (errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "creating %s", path);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "opening %s", path);
	if (pin_read(fd, have) < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "%s does not hold one k4.public key",
		                  path);
	if (strcmp(have, k4_public) != 0)
		return tt_err_set(err, TT_ERR_CONFLICT, "this worker was provisioned with"
		                  " another feed key (%s holds %.24s…, given %.24s…); remove"
		                  " the file to provision it anew", path, have, k4_public);
	return 0;
}

/* feedsig_refused: logs and counts a refusal; its result entry. */
json_t *feedsig_refused(json_t *env, const char *reason, const struct tt_err *err)
{
	json_t *r = json_object_get(env, "rev");
	char labels[64];

	snprintf(labels, sizeof(labels), "reason=\"%s\"", reason);
	metrics_inc("tether_feed_refused_total", labels);
	log_warn("%s", err->msg);
	return json_pack("{s:I,s:b,s:s,s:s}", "rev", json_is_integer(r) ?
	                 json_integer_value(r) : (json_int_t)0, "ok", 0, "refused",
	                 reason, "error", err->msg);
}

/* The cp's side of the signer (src/signer/, build/tether-signer): spawn
 * it on a socketpair (fd 3), ask it to sign, replace it when it died or
 * got stuck. The signer alone holds the private keys. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "cp/cp.h"
#include "log.h"
#include "wire.h"
#include "wire_json.h"

#define SIGNER_FD 3

/* cp_signer_bin: tether-signer, next to this executable (a lean binary
 * of its own, like tether-bridge). */
static int cp_signer_bin(char *buf, size_t cap, struct tt_err *err)
{
	return fsutil_sibling_bin("tether-signer", buf, cap, err);
}

/* cp_signer_paths: the feed key and its public file sit next to the
 * capability key: DIR/signer.key -> DIR/feed.key, DIR/feed.pub. */
static int cp_signer_paths(const char *key_path, char *feed_key, char *feed_pub,
                           size_t cap, struct tt_err *err)
{
	const char *slash = strrchr(key_path, '/');
	int dlen = slash ? (int)(slash - key_path) : 1;
	const char *dir = slash ? key_path : ".";

	if (snprintf(feed_key, cap, "%.*s/feed.key", dlen, dir) >= (int)cap ||
	    snprintf(feed_pub, cap, "%.*s/feed.pub", dlen, dir) >= (int)cap)
		return tt_err_set(err, TT_ERR_INVALID, "signer key path too long");
	return 0;
}

/* cp_signer_spawn: socketpair + fork/exec of tether-signer. */
int cp_signer_spawn(const char *key_path, struct cp_signer *s,
                    struct tt_err *err)
{
	char exe[PATH_MAX], feed_key[PATH_MAX], feed_pub[PATH_MAX];
	int sv[2];
	/* A signature takes tens of microseconds; a signer silent this long
	 * is stuck, and the cp's loop waits for it meanwhile. */
	struct timeval tv = { .tv_sec = CP_SIGNER_TIMEOUT_S };
	pid_t pid;

	s->fd = -1;
	s->pid = -1;
	if (key_path != s->key_path &&
	    snprintf(s->key_path, sizeof(s->key_path), "%s", key_path) >= (int)sizeof(s->key_path))
		return tt_err_set(err, TT_ERR_INVALID, "signer key path too long");
	if (cp_signer_bin(exe, sizeof(exe), err) < 0 ||
	    cp_signer_paths(key_path, feed_key, feed_pub, sizeof(feed_key), err) < 0)
		return -1;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "socketpair");
	pid = fork();
	if (pid < 0) {
		close(sv[0]);
		close(sv[1]);
		return tt_err_sys(err, TT_ERR_SYS, "fork");
	}
	if (pid == 0) {
		/* child: fd 3 = our end (dup2 clears CLOEXEC), then exec */
		if (dup2(sv[1], SIGNER_FD) < 0)
			_exit(127);
		if (s->next_path[0] != '\0') /* a rotation in progress */
			execl(exe, "tether-signer", "--key", key_path, "--next-key",
			      s->next_path, "--feed-key", feed_key, "--feed-pub", feed_pub,
			      (char *)NULL);
		else
			execl(exe, "tether-signer", "--key", key_path, "--feed-key", feed_key,
			      "--feed-pub", feed_pub, (char *)NULL);
		_exit(127);
	}
	close(sv[1]);
	setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	s->fd = sv[0];
	s->pid = pid;
	return 0;
}

static json_t *cp_signer_call1(struct cp_signer *s, json_t *req, struct tt_err *err);

/* signer_restart: the signer died or stopped answering (its stream was
 * dropped): the old process is killed (a stuck one) and reaped, a new one
 * started on the same key file, and kept only if it holds the key the
 * workers were given. */
static int signer_restart(struct cp_signer *s, struct tt_err *err)
{
	char pub[PASERK_K4_PUBLIC_LEN + 1], kid[PASERK_K4_PID_LEN + 1];

	if (s->pid > 0) {
		kill(s->pid, SIGKILL);
		waitpid(s->pid, NULL, 0);
		s->pid = -1;
	}
	if (s->key_path[0] == '\0')
		return tt_err_set(err, TT_ERR_TRANSPORT, "signer is not running");
	log_warn("%s", "the signer died or stopped answering: starting it again");
	if (cp_signer_spawn(s->key_path, s, err) < 0)
		return -1;
	if (cp_signer_public(s, pub, kid, err) < 0 || strcmp(kid, s->kid) != 0) {
		if (err->code == TT_OK)
			tt_err_set(err, TT_ERR_VERIFY, "the restarted signer holds another key (%s)",
			           kid);
		cp_signer_stop(s);
		return -1;
	}
	return 0;
}

/* cp_signer_call1: one request, one RESULT (new reference) or NULL + err. */
static json_t *cp_signer_call1(struct cp_signer *s, json_t *req,
                               struct tt_err *err)
{
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	struct wire_frame f;
	json_t *res;
	int rc;

	if (s->fd < 0) {
		tt_err_set(err, TT_ERR_TRANSPORT, "signer is not running");
		return NULL;
	}
	rc = wire_send_json(s->fd, WIRE_REQUEST, req, err) < 0 ? -1 :
	     wire_recv(s->fd, &f, buf, sizeof(buf), err);
	if (rc <= 0) {
		if (rc == 0)
			tt_err_set(err, TT_ERR_TRANSPORT, "signer went away");
		/* gone, stuck, or the stream out of step: not used again */
		close(s->fd);
		s->fd = -1;
		return NULL;
	}
	res = wire_frame_json(&f, err);
	if (res == NULL)
		return NULL;
	if (f.type != WIRE_RESULT) {
		const char *m = json_string_value(json_object_get(res, "message"));

		tt_err_set(err, TT_ERR_DENIED, "signer refused: %s",
		           m ? m : "unknown error");
		json_decref(res);
		return NULL;
	}
	return res;
}

/* cp_signer_call: cp_signer_call1 that takes req (NULL: its json_pack ran
 * out of memory). */
static json_t *cp_signer_call(struct cp_signer *s, json_t *req,
                              struct tt_err *err)
{
	json_t *res;

	if (req == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	/* A dropped stream (signer dead, or stuck past the timeout): one
	 * more try on a new signer. A refusal is an answer: not retried. */
	if (s->fd < 0 && s->kid[0] != '\0' && signer_restart(s, err) < 0) {
		json_decref(req);
		return NULL;
	}
	res = cp_signer_call1(s, req, err);
	if (res == NULL && s->fd < 0 && s->kid[0] != '\0') {
		tt_err_clear(err);
		if (signer_restart(s, err) == 0)
			res = cp_signer_call1(s, req, err);
	}
	json_decref(req);
	return res;
}

/* cp_signer_sign: asks for a capability over claims. */
int cp_signer_sign(struct cp_signer *s, json_t *claims, char **token,
                   char expires_at[TT_RFC3339_MAX], struct tt_err *err)
{
	json_t *res = cp_signer_call(s, json_pack("{s:s,s:O}", "op", "sign",
	                                          "claims", claims), err);
	const char *t, *e;

	if (res == NULL)
		return -1;
	t = json_string_value(json_object_get(res, "token"));
	e = json_string_value(json_object_get(res, "expires_at"));
	if (t == NULL || e == NULL || strlen(e) >= TT_RFC3339_MAX) {
		json_decref(res);
		return tt_err_set(err, TT_ERR_MALFORMED, "bad signer reply");
	}
	*token = strdup(t);
	snprintf(expires_at, TT_RFC3339_MAX, "%s", e);
	json_decref(res);
	return *token ? 0 : tt_err_set(err, TT_ERR_NOMEM, "out of memory");
}

/* cp_signer_public: the signer's verification key. */
int cp_signer_public(struct cp_signer *s, char pub[PASERK_K4_PUBLIC_LEN + 1],
                     char kid[PASERK_K4_PID_LEN + 1], struct tt_err *err)
{
	json_t *res = cp_signer_call(s, json_pack("{s:s}", "op", "public"), err);
	const char *p, *k, *f;
	int rc = 0;

	if (res == NULL)
		return -1;
	p = json_string_value(json_object_get(res, "public"));
	k = json_string_value(json_object_get(res, "kid"));
	f = json_string_value(json_object_get(res, "feed_public"));
	if (p == NULL || k == NULL || f == NULL || strlen(p) != PASERK_K4_PUBLIC_LEN ||
	    strlen(k) != PASERK_K4_PID_LEN || strlen(f) != PASERK_K4_PUBLIC_LEN)
		rc = tt_err_set(err, TT_ERR_MALFORMED, "bad signer reply");
	else if (s->feed_pub[0] != '\0' && strcmp(s->feed_pub, f) != 0)
		rc = tt_err_set(err, TT_ERR_VERIFY, "the signer holds another feed key");
	else {
		memcpy(pub, p, PASERK_K4_PUBLIC_LEN + 1);
		memcpy(kid, k, PASERK_K4_PID_LEN + 1);
		if (s->kid[0] == '\0') /* the key the workers are given */
			memcpy(s->kid, k, PASERK_K4_PID_LEN + 1);
		if (s->feed_pub[0] == '\0') /* the workers' pinned feed key */
			memcpy(s->feed_pub, f, PASERK_K4_PUBLIC_LEN + 1);
	}
	json_decref(res);
	return rc;
}

/* cp_signer_feed_sign: the feed key's signature over one update body. */
int cp_signer_feed_sign(struct cp_signer *s, const char *body,
                        char sig[FEEDSIG_SIG_B64_LEN + 1], struct tt_err *err)
{
	json_t *res = cp_signer_call(s, json_pack("{s:s,s:s}", "op", "feed.sign",
	                                          "body", body), err);
	const char *v;
	int rc = 0;

	if (res == NULL)
		return -1;
	v = json_string_value(json_object_get(res, "sig"));
	if (v == NULL || strlen(v) != FEEDSIG_SIG_B64_LEN)
		rc = tt_err_set(err, TT_ERR_MALFORMED, "bad signer reply");
	else
		memcpy(sig, v, FEEDSIG_SIG_B64_LEN + 1);
	json_decref(res);
	return rc;
}

/* cp_signer_next: the next key of a rotation (the signer runs with
 * --next-key); 0, or -1 when it has none. */
int cp_signer_next(struct cp_signer *s, char pub[PASERK_K4_PUBLIC_LEN + 1],
                   char kid[PASERK_K4_PID_LEN + 1], struct tt_err *err)
{
	json_t *res = cp_signer_call(s, json_pack("{s:s}", "op", "public"), err);
	const char *p, *k;
	int rc = 0;

	if (res == NULL)
		return -1;
	p = json_string_value(json_object_get(res, "next_public"));
	k = json_string_value(json_object_get(res, "next_kid"));
	if (p == NULL || k == NULL || strlen(p) != PASERK_K4_PUBLIC_LEN ||
	    strlen(k) != PASERK_K4_PID_LEN)
		rc = tt_err_set(err, TT_ERR_NOT_FOUND, "the signer holds no next key");
	else {
		memcpy(pub, p, PASERK_K4_PUBLIC_LEN + 1);
		memcpy(kid, k, PASERK_K4_PID_LEN + 1);
	}
	json_decref(res);
	return rc;
}

/* cp_signer_promote: the next key signs from now on: in the signer, then
 * on disk (the next key file renamed over the key file, so a restarted
 * signer loads it), then here (the kid a restarted signer must hold). */
int cp_signer_promote(struct cp_signer *s, const char *kid, struct tt_err *err)
{
	json_t *res = cp_signer_call(s, json_pack("{s:s,s:s}", "op", "promote", "kid",
	                                          kid), err);

	if (res == NULL)
		return -1;
	json_decref(res);
	if (rename(s->next_path, s->key_path) < 0)
		return tt_err_sys(err, TT_ERR_IO, "renaming %s", s->next_path);
	s->next_path[0] = '\0';
	snprintf(s->kid, sizeof(s->kid), "%s", kid);
	return 0;
}

/* cp_signer_stop: closing our end is the signer's signal to exit. */
void cp_signer_stop(struct cp_signer *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	if (s->pid > 0)
		waitpid(s->pid, NULL, 0);
	s->pid = -1;
}

/* The capability signer: the only process that holds the Ed25519 private
 * key. It serves wire.h frames on fd 3 (a socketpair to the cp): "sign"
 * completes and validates a claim set and mints it; "public" returns the
 * verification key. Also the cp-side client (cp_signer_*). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <seccomp.h>
#include <sodium.h>

#include "capcache.h"
#include "claims.h"
#include "cleanup.h"
#include "cp/cp.h"
#include "keyring.h"
#include "log.h"
#include "paserk.h"
#include "tetherd/roles.h"
#include "timefmt.h"
#include "wire.h"
#include "wire_json.h"

#define SIGNER_FD 3
#define SIGNER_ISS "tether-cp"
#define SIGNER_DRAIN_MAX (16u << 20) /* oversized frames are skipped up to this */

/* Key material and its public forms (sk lives in sodium_malloc memory). */
struct signer_key {
	uint8_t *sk; /* 64 bytes, guarded + mlocked */
	char pub[PASERK_K4_PUBLIC_LEN + 1];
	char kid[PASERK_K4_PID_LEN + 1];
};

/* signer_load: reads key_path, or creates it when absent, so the secret is
 * never held by the cp process itself. */
static int signer_load(const char *path, struct signer_key *k,
                       struct tt_err *err)
{
	uint8_t pk[crypto_sign_PUBLICKEYBYTES];

	/* sodium_malloc memory is mlock'ed and surrounded by guard pages. */
	k->sk = sodium_malloc(PASETO_SK_BYTES);
	if (k->sk == NULL)
		return tt_err_set(err, TT_ERR_NOMEM, "sodium_malloc failed");
	if (access(path, F_OK) != 0 && errno == ENOENT) {
		crypto_sign_keypair(pk, k->sk);
		if (paserk_secret_file_write(path, k->sk, 0, err) < 0)
			return -1;
		log_info("created signing key %s", path);
	} else if (paserk_secret_file_read(path, k->sk, err) < 0) {
		return -1;
	}
	memcpy(pk, k->sk + 32, sizeof(pk)); /* k4.secret = seed || pk */
	if (paserk_k4_public_encode(pk, k->pub) < 0 ||
	    paserk_k4_pid(pk, k->kid) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "cannot encode public key");
	return 0;
}

/* signer_sandbox: seccomp allowlist once the key is loaded: the signer
 * only reads and writes fd 3 (write/sendmsg), allocates, reads the clock and gets random
 * bytes. Anything else kills it (a compromised signer cannot open files,
 * sockets or processes). */
static int signer_sandbox(struct tt_err *err)
{
	static const int allow[] = {
		SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(sendmsg),
		SCMP_SYS(exit_group),
		SCMP_SYS(exit), SCMP_SYS(clock_gettime), SCMP_SYS(gettimeofday),
		SCMP_SYS(getrandom), SCMP_SYS(brk), SCMP_SYS(mmap),
		SCMP_SYS(munmap), SCMP_SYS(mprotect), SCMP_SYS(madvise),
		SCMP_SYS(mremap), SCMP_SYS(getpid), SCMP_SYS(rt_sigreturn),
		SCMP_SYS(close), SCMP_SYS(mlock), SCMP_SYS(munlock),
		SCMP_SYS(fstat), SCMP_SYS(newfstatat),
	};
	scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
	int rc = 0;

	if (ctx == NULL)
		return tt_err_set(err, TT_ERR_SYS, "seccomp_init failed");
	for (size_t i = 0; i < sizeof(allow) / sizeof(allow[0]) && rc == 0; i++)
		rc = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, allow[i], 0);
	if (rc == 0)
		rc = seccomp_load(ctx);
	seccomp_release(ctx);
	if (rc != 0)
		return tt_err_set(err, TT_ERR_SYS, "seccomp: %s", strerror(-rc));
	return 0;
}

/* signer_read_full: reads exactly len bytes; 0 on EOF at start, -1 on
 * error or EOF mid-way, 1 when done. */
static int signer_read_full(int fd, void *buf, size_t len)
{
	size_t have = 0;

	while (have < len) {
		ssize_t n = read(fd, (uint8_t *)buf + have, len - have);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return (n == 0 && have == 0) ? 0 : -1;
		have += (size_t)n;
	}
	return 1;
}

/* signer_sign: fills iss/iat/exp/jti, validates the full claim set with the
 * same parser receivers use, then mints. Returns the RESULT object. */
static json_t *signer_sign(const struct signer_key *k, json_t *req,
                           struct tt_err *err)
{
	static const char *const reserved[] = { "iss", "iat", "exp", "jti" };
	json_t *in = json_object_get(req, "claims"), *c;
	char iat[TT_RFC3339_MAX], exp[TT_RFC3339_MAX], jti[33];
	uint8_t rnd[16];
	_cleanup_free_ char *payload = NULL;
	_cleanup_free_ char *token = NULL;
	struct tt_claims claims;
	int64_t now = tt_now();

	if (!json_is_object(in)) {
		tt_err_set(err, TT_ERR_MALFORMED, "claims object expected");
		return NULL;
	}
	for (size_t i = 0; i < 4; i++) {
		if (json_object_get(in, reserved[i])) {
			tt_err_set(err, TT_ERR_INVALID, "claim %s is set by the signer",
			           reserved[i]);
			return NULL;
		}
	}
	randombytes_buf(rnd, sizeof(rnd));
	sodium_bin2hex(jti, sizeof(jti), rnd, sizeof(rnd));
	if (rfc3339_format(now, iat) < 0 ||
	    rfc3339_format(now + TT_CAP_LIFETIME, exp) < 0) {
		tt_err_set(err, TT_ERR_INVALID, "clock out of range");
		return NULL;
	}
	c = json_deep_copy(in);
	if (c == NULL || json_object_set_new(c, "iss", json_string(SIGNER_ISS)) ||
	    json_object_set_new(c, "iat", json_string(iat)) ||
	    json_object_set_new(c, "exp", json_string(exp)) ||
	    json_object_set_new(c, "jti", json_string(jti))) {
		json_decref(c);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	payload = json_dumps(c, JSON_COMPACT);
	json_decref(c);
	if (payload == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	if (claims_parse((const uint8_t *)payload, strlen(payload), &claims,
	                 err) < 0)
		return NULL;
	if (cap_mint(k->sk, &claims, &token, err) < 0)
		return NULL;
	return json_pack("{s:s,s:s}", "token", token, "expires_at", exp);
}

/* signer_serve_one: handles one request frame; the reply is RESULT or
 * ERROR. Never fails the process for a bad request. */
static void signer_serve_one(const struct signer_key *k, int fd,
                             const struct wire_frame *f)
{
	struct tt_err err = { 0 };
	json_t *req, *res = NULL;
	const char *op;

	if (f->type != WIRE_REQUEST) {
		wire_send_error(fd, WIRE_E_BAD_REQUEST, "REQUEST frame expected");
		return;
	}
	req = wire_frame_json(f, &err);
	if (req == NULL) {
		wire_send_error(fd, WIRE_E_BAD_REQUEST, "%s", err.msg);
		return;
	}
	op = json_string_value(json_object_get(req, "op"));
	if (op != NULL && strcmp(op, "sign") == 0)
		res = signer_sign(k, req, &err);
	else if (op != NULL && strcmp(op, "public") == 0)
		res = json_pack("{s:s,s:s}", "public", k->pub, "kid", k->kid);
	else
		tt_err_set(&err, TT_ERR_INVALID, "unknown op");
	json_decref(req);
	if (res == NULL) {
		log_warn("refused request: %s", err.msg);
		wire_send_error(fd, err.code == TT_ERR_INVALID ? WIRE_E_BAD_REQUEST
		                                               : WIRE_E_INVALID_CLAIMS,
		                "%s", err.msg[0] ? err.msg : "out of memory");
		return;
	}
	if (wire_send_json(fd, WIRE_RESULT, res, &err) < 0)
		log_warn("cannot answer: %s", err.msg);
	json_decref(res);
}

/* signer_loop: frames until EOF. Oversized frames are drained and refused;
 * a header that is not ours means the stream is lost, so it ends. */
static int signer_loop(const struct signer_key *k, int fd)
{
	static uint8_t payload[WIRE_PAYLOAD_MAX + 1];
	uint8_t hdr[WIRE_HDR_LEN];
	struct tt_err err = { 0 };
	struct wire_frame f;
	uint8_t type;
	uint32_t len;
	int rc;

	for (;;) {
		rc = signer_read_full(fd, hdr, sizeof(hdr));
		if (rc == 0)
			return 0;
		if (rc < 0)
			return -1;
		if (wire_hdr_decode(hdr, &type, &len, &err) < 0) {
			uint32_t raw = (uint32_t)hdr[8] << 24 | (uint32_t)hdr[9] << 16 |
			               (uint32_t)hdr[10] << 8 | hdr[11];

			if (err.code != TT_ERR_TOO_LARGE || raw > SIGNER_DRAIN_MAX) {
				wire_send_error(fd, WIRE_E_BAD_REQUEST, "%s", err.msg);
				return -1;
			}
			while (raw > 0) { /* skip the oversized payload */
				uint32_t n = raw > WIRE_PAYLOAD_MAX ? WIRE_PAYLOAD_MAX : raw;

				if (signer_read_full(fd, payload, n) != 1)
					return -1;
				raw -= n;
			}
			wire_send_error(fd, WIRE_E_TOO_LARGE, "request over %u bytes",
			                WIRE_PAYLOAD_MAX);
			continue;
		}
		if (len > 0 && signer_read_full(fd, payload, len) != 1)
			return -1;
		payload[len] = '\0';
		f.type = type;
		f.len = len;
		f.payload = payload;
		signer_serve_one(k, fd, &f);
	}
}

/* signer_main: "tetherd signer --key PATH" (spawned by the cp, fd 3). */
int signer_main(int argc, char **argv)
{
	struct signer_key k = { 0 };
	struct tt_err err = { 0 };
	const char *key_path = NULL;
	int rc;

	tt_log_init("signer", TT_LOG_INFO);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
			key_path = argv[++i];
		else {
			log_error("usage: tetherd signer --key PATH (fd 3: cp)");
			return 2;
		}
	}
	if (key_path == NULL || fcntl(SIGNER_FD, F_GETFD) < 0) {
		log_error("usage: tetherd signer --key PATH (fd 3: cp)");
		return 2;
	}
	if (sodium_init() < 0) {
		log_error("sodium_init failed");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	if (signer_load(key_path, &k, &err) < 0) {
		log_error("%s", err.msg);
		sodium_free(k.sk);
		return 1;
	}
	/* jansson would open /dev/urandom for its hash seed on first use,
	 * which the filter forbids: seed it now from libsodium. */
	json_object_seed((size_t)randombytes_random() | 1u);
	tzset(); /* log lines need /etc/localtime: load it before the filter */
	if (getenv("TETHER_SIGNER_NO_SECCOMP") == NULL &&
	    signer_sandbox(&err) < 0) {
		log_error("%s", err.msg);
		sodium_free(k.sk);
		return 1;
	}
	log_info("ready, kid %s", k.kid);
	rc = signer_loop(&k, SIGNER_FD);
	sodium_free(k.sk); /* zeroes before unmapping */
	return rc < 0 ? 1 : 0;
}

/* ---- cp side --------------------------------------------------------- */

/* cp_signer_self: path of our own binary (the signer is a sibling role). */
static int cp_signer_self(char *buf, size_t cap, struct tt_err *err)
{
	ssize_t n = readlink("/proc/self/exe", buf, cap - 1);

	if (n < 0 || (size_t)n >= cap - 1)
		return tt_err_sys(err, TT_ERR_SYS, "readlink /proc/self/exe");
	buf[n] = '\0';
	return 0;
}

/* cp_signer_spawn: socketpair + fork/exec of the signer role. */
int cp_signer_spawn(const char *key_path, struct cp_signer *s,
                    struct tt_err *err)
{
	char exe[4096];
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
	if (cp_signer_self(exe, sizeof(exe), err) < 0)
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
		execl(exe, "tetherd", "signer", "--key", key_path, (char *)NULL);
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
	const char *p, *k;
	int rc = 0;

	if (res == NULL)
		return -1;
	p = json_string_value(json_object_get(res, "public"));
	k = json_string_value(json_object_get(res, "kid"));
	if (p == NULL || k == NULL || strlen(p) != PASERK_K4_PUBLIC_LEN ||
	    strlen(k) != PASERK_K4_PID_LEN)
		rc = tt_err_set(err, TT_ERR_MALFORMED, "bad signer reply");
	else {
		memcpy(pub, p, PASERK_K4_PUBLIC_LEN + 1);
		memcpy(kid, k, PASERK_K4_PID_LEN + 1);
		if (s->kid[0] == '\0') /* the key the workers are given */
			memcpy(s->kid, k, PASERK_K4_PID_LEN + 1);
	}
	json_decref(res);
	return rc;
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

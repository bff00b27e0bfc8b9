/* tether-signer: the only process that holds the control plane's private
 * keys (signer.h). Spawned by the cp with a socketpair on fd 3, it serves
 * wire.h frames: "sign" (a capability), "feed.sign" (a feed update),
 * "public" (the verification keys), "promote" (a rotation's next key
 * signs from now on). A lean binary of its own (libsodium,
 * jansson, libseccomp and lib/'s wire code), under a seccomp allowlist
 * from the moment its keys are loaded, always. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <seccomp.h>
#include <sodium.h>

#include "fsutil.h"
#include "log.h"
#include "signer/signer.h"
#include "wire.h"
#include "wire_json.h"

#define SIGNER_FD 3
#define SIGNER_DRAIN_MAX (16u << 20) /* oversized frames are skipped up to this */
#define SIGNER_USAGE "usage: tether-signer --key PATH [--next-key PATH] --feed-key PATH" \
	" --feed-pub PATH (fd 3: the cp)\n       tether-signer keygen FILE [--force]"

/* The keys this process serves with. */
struct signer {
	struct signer_key cap;  /* capabilities (SPEC §3): the one signing */
	struct signer_key next; /* a rotation's next capability key (--next-key):
	                         * published first, signing once promoted */
	struct signer_key feed; /* feed updates (SPEC §7); its public half is
	                         * each worker's pinned root key */
};

/* signer_sandbox: seccomp allowlist once the keys are loaded: the signer
 * only reads and writes fd 3 (write/sendmsg), allocates, reads the clock
 * and gets random bytes. Anything else kills it (a compromised signer
 * cannot open files, sockets or processes). */
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

/* signer_promote: {"op":"promote","kid":K}: the next key (K) signs from
 * now on; the old one is zeroed and freed (receivers keep its public half
 * until what it signed has expired). */
static json_t *signer_promote(struct signer *s, json_t *req, struct tt_err *err)
{
	const char *kid = json_string_value(json_object_get(req, "kid"));

	if (s->next.sk == NULL || kid == NULL || strcmp(kid, s->next.kid) != 0) {
		tt_err_set(err, TT_ERR_INVALID, "no next key %.60s to promote", kid ? kid : "");
		return NULL;
	}
	signer_key_free(&s->cap);
	s->cap = s->next;
	memset(&s->next, 0, sizeof(s->next));
	log_info("signing with %s from now on", s->cap.kid);
	return json_pack("{s:s}", "kid", s->cap.kid);
}

/* signer_serve_one: handles one request frame; the reply is RESULT or
 * ERROR. Never fails the process for a bad request. */
static void signer_serve_one(struct signer *s, int fd,
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
		res = signer_sign_claims(&s->cap, req, &err);
	else if (op != NULL && strcmp(op, "feed.sign") == 0)
		res = signer_feed_sign(&s->feed, req, &err);
	else if (op != NULL && strcmp(op, "public") == 0)
		res = json_pack("{s:s,s:s,s:s,s:s?,s:s?}", "public", s->cap.pub, "kid",
		                s->cap.kid, "feed_public", s->feed.pub, "next_public",
		                s->next.sk ? s->next.pub : NULL, "next_kid",
		                s->next.sk ? s->next.kid : NULL);
	else if (op != NULL && strcmp(op, "promote") == 0)
		res = signer_promote(s, req, &err);
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
static int signer_loop(struct signer *s, int fd)
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
		signer_serve_one(s, fd, &f);
	}
}

/* signer_pub_write: the feed key's public half as a file (mode 0644,
 * written whole then renamed): what provisioning gives each worker. */
static int signer_pub_write(const char *path, const char *pub, struct tt_err *err)
{
	char tmp[4096], line[PASERK_K4_PUBLIC_LEN + 2];
	int fd;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return tt_err_set(err, TT_ERR_INVALID, "--feed-pub path too long");
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "creating %s", tmp);
	snprintf(line, sizeof(line), "%s\n", pub);
	if (fchmod(fd, 0644) < 0 || fsutil_write_all(fd, line, strlen(line)) < 0 ||
	    fsync(fd) < 0) {
		close(fd);
		unlink(tmp);
		return tt_err_sys(err, TT_ERR_IO, "writing %s", tmp);
	}
	close(fd);
	if (rename(tmp, path) < 0) {
		unlink(tmp);
		return tt_err_sys(err, TT_ERR_IO, "renaming %s", tmp);
	}
	return 0;
}

/* signer_serve: loads both keys, publishes the feed key's public half,
 * enters the filter and serves fd 3 until EOF. */
static int signer_serve(const char *key, const char *next_key, const char *feed_key,
                        const char *feed_pub)
{
	struct signer s = { 0 };
	struct tt_err err = { 0 };
	int rc = 1;

	if (sodium_init() < 0) {
		log_error("sodium_init failed");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	if (signer_key_load(key, &s.cap, &err) < 0 ||
	    (next_key != NULL && signer_key_load(next_key, &s.next, &err) < 0) ||
	    signer_key_load(feed_key, &s.feed, &err) < 0 ||
	    signer_pub_write(feed_pub, s.feed.pub, &err) < 0) {
		log_error("%s", err.msg);
		goto out;
	}
	if (strcmp(s.cap.kid, s.feed.kid) == 0 ||
	    (s.next.sk != NULL && (strcmp(s.next.kid, s.feed.kid) == 0 ||
	                           strcmp(s.next.kid, s.cap.kid) == 0))) {
		log_error("the feed key, the capability key and the next one must differ");
		goto out;
	}
	/* jansson would open /dev/urandom for its hash seed on first use,
	 * which the filter forbids: seed it now from libsodium. */
	json_object_seed((size_t)randombytes_random() | 1u);
	tzset(); /* log lines need /etc/localtime: load it before the filter */
	if (signer_sandbox(&err) < 0) {
		log_error("%s", err.msg);
		goto out;
	}
	log_info("ready, kid %s, feed key %s", s.cap.kid, s.feed.kid);
	rc = signer_loop(&s, SIGNER_FD) < 0 ? 1 : 0;
out:
	signer_key_free(&s.cap);
	signer_key_free(&s.next);
	signer_key_free(&s.feed);
	return rc;
}

int main(int argc, char **argv)
{
	const char *key = NULL, *next_key = NULL, *feed_key = NULL, *feed_pub = NULL;

	tt_log_init("signer", TT_LOG_INFO);
	if (argc >= 2 && strcmp(argv[1], "keygen") == 0)
		return keygen_main(argc - 1, argv + 1);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
			key = argv[++i];
		else if (strcmp(argv[i], "--next-key") == 0 && i + 1 < argc)
			next_key = argv[++i];
		else if (strcmp(argv[i], "--feed-key") == 0 && i + 1 < argc)
			feed_key = argv[++i];
		else if (strcmp(argv[i], "--feed-pub") == 0 && i + 1 < argc)
			feed_pub = argv[++i];
		else {
			fprintf(stderr, "%s\n", SIGNER_USAGE);
			return 2;
		}
	}
	if (key == NULL || feed_key == NULL || feed_pub == NULL ||
	    fcntl(SIGNER_FD, F_GETFD) < 0) {
		fprintf(stderr, "%s\n", SIGNER_USAGE);
		return 2;
	}
	return signer_serve(key, next_key, feed_key, feed_pub);
}

/* Per-worker credentials (SPEC §7: each worker has its own credential;
 * none can register, poll or acknowledge for another).
 *
 * A worker is provisioned on the cp's host with `tetherd worker add`
 * (docs/DEPLOY.md): a fresh random credential is written once to a 0600
 * file for the worker's host, and only its SHA-256 is stored in cp.db,
 * with the worker id and the one node_url the worker may register. Every
 * worker-authenticated endpoint (register, feed, ack, progress, lost,
 * drain) then takes `Authorization: Worker <credential>` and serves only
 * the worker the credential was provisioned for: the worker id the
 * request names must be the credential's. The cp also binds the worker's
 * feed position to it: an ack beyond the highest rev a feed answer gave
 * that worker is refused, nothing recorded. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "cleanup.h"
#include "cp/cp.h"
#include "log.h"
#include "metrics.h"
#include "tetherd/roles.h"

#define CRED_PREFIX "ttw_"
#define CRED_RANDOM 32                     /* bytes of randomness */
#define CRED_HDR_MAX 256                   /* Authorization header bound */

/* cred_refuse: one refusal answer, counted by reason. */
static int cred_refuse(struct lws *wsi, unsigned status, const char *code,
                       const char *reason, const char *msg)
{
	char label[64];

	snprintf(label, sizeof(label), "kind=\"worker\",reason=\"%s\"", reason);
	metrics_inc("tether_cp_auth_refused_total", label);
	return http_reply_error(wsi, status, code, "%s", msg);
}

/* cred_claimed: the worker id the request names: "id" of a register
 * body, the feed's ?worker=, else "worker" of the body ("" if none). */
static void cred_claimed(struct lws *wsi, const char *path, json_t *body,
                         char *out, size_t cap)
{
	const char *v = NULL;

	out[0] = '\0';
	if (strcmp(path, "/v1/feed") == 0) {
		if (http_query(wsi, "worker", out, cap) < 0)
			out[0] = '\0';
		return;
	}
	if (json_is_object(body))
		v = json_string_value(json_object_get(body,
		        strcmp(path, "/v1/workers/register") == 0 ? "id" : "worker"));
	if (v != NULL && strlen(v) < cap)
		snprintf(out, cap, "%s", v);
}

/* cp_worker_auth: see cp.h. */
bool cp_worker_auth(struct cp *cp, struct lws *wsi, const char *path,
                    json_t *body, int *rc)
{
	static const char scheme[] = "Worker ";
	char hdr[CRED_HDR_MAX], hash[CPDB_HASH_HEX + 1], claimed[TT_NAME_MAX + 2];
	char msg[256];
	struct tt_err err = { 0 };
	struct cp_cred cred;
	int n, found;

	n = http_header(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, hdr, sizeof(hdr));
	if (n <= (int)strlen(scheme) || strncmp(hdr, scheme, strlen(scheme)) != 0) {
		sodium_memzero(hdr, sizeof(hdr));
		*rc = cred_refuse(wsi, 401, "unauthorized", "missing",
		                  "a worker credential is required (Authorization: Worker …)");
		return false;
	}
	cpdb_key_hash(hdr + strlen(scheme), hash);
	sodium_memzero(hdr, sizeof(hdr));
	found = cpdb_cred_by_hash(cp->db, hash, &cred, &err);
	if (found < 0) {
		*rc = http_reply_error(wsi, 500, "internal", "%s", err.msg);
		return false;
	}
	if (found == 0) {
		*rc = cred_refuse(wsi, 401, "unauthorized", "unknown",
		                  "unknown worker credential");
		return false;
	}
	cred_claimed(wsi, path, body, claimed, sizeof(claimed));
	if (!cp_name_ok(claimed)) {
		*rc = http_reply_error(wsi, 400, "bad_request",
		                       "the request must name its worker (a worker id)");
		return false;
	}
	if (strcmp(claimed, cred.id) != 0) {
		log_warn("worker credential of %s refused for %s (%s)", cred.id, claimed,
		         path);
		snprintf(msg, sizeof(msg), "this credential is worker %.64s's; it cannot act"
		         " for worker %.64s", cred.id, claimed);
		*rc = cred_refuse(wsi, 403, "forbidden", "other_worker", msg);
		return false;
	}
	return true;
}

/* cp_register: see cp.h. The URL must be the provisioned one; an absent
 * one means the provisioned one. */
int cp_register(struct cp *cp, struct lws *wsi, json_t *body)
{
	struct tt_err err = { 0 };
	const char *id = json_string_value(json_object_get(body, "id"));
	json_t *ju = json_object_get(body, "node_url");
	const char *url = json_string_value(ju);
	struct cp_cred cred;
	char msg[CPDB_URL_MAX * 2 + 96];
	int64_t rev;
	int rc;

	if (!cp_name_ok(id) || (ju != NULL && (url == NULL || strlen(url) >= CPDB_URL_MAX)))
		return http_reply_error(wsi, 400, "bad_request",
		        "register needs id (name) and node_url (http URL)");
	rc = cpdb_cred_get(cp->db, id, &cred, &err);
	if (rc <= 0) /* revoked since the request was authenticated */
		return rc < 0 ? http_reply_error(wsi, 500, "internal", "%s", err.msg)
		              : cred_refuse(wsi, 401, "unauthorized", "unknown",
		                            "unknown worker credential");
	if (url != NULL && strcmp(url, cred.node_url) != 0) {
		log_warn("worker %s refused: registers at %s, provisioned at %s", id,
		         url, cred.node_url);
		snprintf(msg, sizeof(msg), "worker %s is provisioned at %s, not %s"
		         " (tetherd worker add changes it)", id, cred.node_url, url);
		return cred_refuse(wsi, 403, "forbidden", "node_url", msg);
	}
	if (cpdb_worker_register(cp->db, id, cred.node_url, tt_now(), &err) < 0 ||
	    cpdb_feed_latest(cp->db, &rev, &err) < 0)
		return http_reply_error(wsi, 500, "internal", "%s", err.msg);
	log_info("worker %s registered at %s", id, cred.node_url);
	return http_reply_json(wsi, 200, json_pack("{s:b,s:I}", "ok", 1,
	                                           "feed_rev", (json_int_t)rev));
}

/* cp_ack_beyond: see cp.h. */
bool cp_ack_beyond(struct lws *wsi, const struct cp_worker *w, int64_t rev,
                   int *rc)
{
	int64_t bound = w->sent_rev > w->acked_rev ? w->sent_rev : w->acked_rev;
	char msg[200];

	if (rev <= bound)
		return false;
	log_warn("worker %s acked rev %lld, beyond rev %lld, the last its feed sent it;"
	         " refused", w->id, (long long)rev, (long long)bound);
	snprintf(msg, sizeof(msg), "ack of rev %lld is beyond rev %lld, the last the"
	         " feed sent worker %s; nothing recorded", (long long)rev,
	         (long long)bound, w->id);
	*rc = cred_refuse(wsi, 409, "conflict", "ack_beyond", msg);
	return true;
}

/* cp_worker_sent: see cp.h. */
int cp_worker_sent(struct cp *cp, const char *worker, int64_t rev,
                   struct tt_err *err)
{
	int64_t latest;

	/* Never past what exists: a node ahead of a restored cp is echoed
	 * its own rev back, which it was not sent. */
	if (cpdb_feed_latest(cp->db, &latest, err) < 0)
		return -1;
	return cpdb_worker_sent(cp->db, worker, rev < latest ? rev : latest, err) < 0
	       ? -1 : 0;
}

/* ---- tetherd worker: provisioning on the cp's host -------------------- */

static const char worker_usage[] =
	"usage: tetherd worker add --state CPDIR --id W --node-url URL [--out FILE]\n"
	"                          [--db postgresql://…]\n"
	"       tetherd worker revoke --state CPDIR --id W [--db postgresql://…]\n"
	"  add: a fresh credential for worker W ([a-z0-9_-], as tetherd node takes;\n"
	"  replacing its old one, which is refused from then on), allowed to\n"
	"  register only at URL; written once to FILE (mode 0600; default stdout).\n"
	"  Only its SHA-256 is kept, in CPDIR/cp.db (or the replicas' --db).\n";

/* cred_write: the credential to path (0600, whole or not at all). */
static int cred_write(const char *path, const char *cred, struct tt_err *err)
{
	char tmp[PATH_MAX];
	_cleanup_close_ int fd = -1;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return tt_err_set(err, TT_ERR_INVALID, "%s: path too long", path);
	unlink(tmp);
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot create %s", tmp);
	if (dprintf(fd, "%s\n", cred) < 0 || fsync(fd) < 0) {
		tt_err_sys(err, TT_ERR_IO, "cannot write %s", tmp);
		unlink(tmp);
		return -1;
	}
	if (rename(tmp, path) < 0) {
		tt_err_sys(err, TT_ERR_IO, "cannot rename %s to %s", tmp, path);
		unlink(tmp);
		return -1;
	}
	return 0;
}

/* cred_add: provisions id at url; the credential goes to out (or stdout). */
static int cred_add(struct cpdb *db, const char *id, const char *url,
                    const char *out, struct tt_err *err)
{
	unsigned char rnd[CRED_RANDOM];
	char cred[sizeof(CRED_PREFIX) + 64], hash[CPDB_HASH_HEX + 1];
	int rc;

	randombytes_buf(rnd, sizeof(rnd));
	memcpy(cred, CRED_PREFIX, strlen(CRED_PREFIX));
	sodium_bin2base64(cred + strlen(CRED_PREFIX), sizeof(cred) - strlen(CRED_PREFIX),
	                  rnd, sizeof(rnd), sodium_base64_VARIANT_URLSAFE_NO_PADDING);
	sodium_memzero(rnd, sizeof(rnd));
	cpdb_key_hash(cred, hash);
	/* The file first: a credential stored but never delivered would only
	 * lock the worker out. */
	if (out != NULL)
		rc = cred_write(out, cred, err);
	else
		rc = printf("%s\n", cred) < 0 || fflush(stdout) != 0
		     ? tt_err_sys(err, TT_ERR_IO, "cannot write the credential") : 0;
	sodium_memzero(cred, sizeof(cred));
	if (rc < 0)
		return -1;
	return cpdb_cred_set(db, id, hash, url, tt_now(), err);
}

/* worker_main: see roles.h. */
int worker_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "state", required_argument, NULL, 's' },
		{ "id", required_argument, NULL, 'i' },
		{ "node-url", required_argument, NULL, 'u' },
		{ "out", required_argument, NULL, 'o' },
		{ "db", required_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 },
	};
	const char *state = NULL, *id = NULL, *url = NULL, *out = NULL, *verb;
	const char *dburl = NULL;
	char path[PATH_MAX];
	struct tt_err err = { 0 };
	struct cpdb *db;
	int c, rc = -1;

	if (argc < 2 || argv[1][0] == '-') {
		fputs(worker_usage, stderr);
		return 2;
	}
	verb = argv[1];
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's': state = optarg; break;
		case 'i': id = optarg; break;
		case 'u': url = optarg; break;
		case 'o': out = optarg; break;
		case 'd': dburl = optarg; break;
		default: fputs(worker_usage, stderr); return 2;
		}
	}
	if (optind != argc || state == NULL || (dburl != NULL && !cpdb_is_url(dburl)) ||
	    !cp_name_ok(id) || id[strspn(id, "abcdefghijklmnopqrstuvwxyz0123456789_-")] ||
	    (strcmp(verb, "add") == 0 && (url == NULL || strlen(url) >= CPDB_URL_MAX ||
	     (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0))) ||
	    (strcmp(verb, "add") != 0 && strcmp(verb, "revoke") != 0)) {
		fputs(worker_usage, stderr);
		return 2;
	}
	if (sodium_init() < 0) {
		fprintf(stderr, "tetherd worker: libsodium init failed\n");
		return 1;
	}
	umask(077); /* cp.db, should this be its first open, and the file */
	if (snprintf(path, sizeof(path), "%s/cp.db", state) >= (int)sizeof(path)) {
		fprintf(stderr, "tetherd worker: --state is too long\n");
		return 1;
	}
	db = cpdb_open(dburl != NULL ? dburl : path, &err);
	if (db == NULL) {
		fprintf(stderr, "tetherd worker: %s\n", err.msg);
		return 1;
	}
	if (strcmp(verb, "add") == 0) {
		rc = cred_add(db, id, url, out, &err);
		if (rc == 0)
			fprintf(stderr, "worker %s provisioned at %s%s%s\n", id, url,
			        out ? "; credential in " : "", out ? out : "");
	} else {
		rc = cpdb_cred_revoke(db, id, &err);
		if (rc == 0)
			tt_err_set(&err, TT_ERR_NOT_FOUND, "worker %s has no credential", id);
		rc = rc > 0 ? 0 : -1;
		if (rc == 0)
			fprintf(stderr, "worker %s revoked\n", id);
	}
	cpdb_close(db);
	if (rc < 0) {
		fprintf(stderr, "tetherd worker %s: %s\n", verb, err.msg);
		return 1;
	}
	return 0;
}

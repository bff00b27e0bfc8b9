/* tether cap inspect TOKEN|- [--key k4.public…] [--implicit STR]: decodes
 * a capability and, given the key, verifies it. Other "tether cap" forms ask
 * the edge for a capability (cli_cap_issue, in another file). */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "capcache.h"
#include "claims.h"
#include "cli/verbs.h"
#include "keyring.h"
#include "paserk.h"
#include "paseto.h"
#include "timefmt.h"

#pragma weak cli_cap_issue

/* inspect_fail: the one-line error of this verb; exit status 1. */
static int inspect_fail(enum tt_errc code, const char *msg)
{
	fprintf(stderr, "tether: cap inspect: %s: %s\n", tt_errc_name(code), msg);
	return 1;
}

/* inspect_usage: bad arguments. */
static int inspect_usage(void)
{
	fprintf(stderr, "tether: usage: tether cap inspect TOKEN|- [--key k4.public...] "
	                "[--implicit STR]\n");
	return 1;
}

/* print_payload: the payload re-indented as JSON on stdout. */
static int print_payload(const struct paseto_msg *m)
{
	json_error_t jerr;
	json_t *root = json_loadb((const char *)m->payload, m->payload_len,
	                          JSON_REJECT_DUPLICATES, &jerr);
	int rc;

	if (root == NULL) {
		char msg[200];

		snprintf(msg, sizeof(msg), "payload is not JSON: %s", jerr.text);
		return inspect_fail(TT_ERR_MALFORMED, msg);
	}
	/* ENSURE_ASCII: an unverified payload is anyone's text; escaped, it
	 * cannot drive the terminal. */
	rc = json_dumpf(root, stdout,
	                JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
	json_decref(root);
	if (rc < 0 || fputc('\n', stdout) == EOF || fflush(stdout) != 0)
		return inspect_fail(TT_ERR_IO, "cannot write to stdout");
	return 0;
}

/* validity_note: how the token's lifetime looks from this clock, by the
 * receivers' rule (accepted until exp + skew, iat at most skew ahead).
 * Returns 1 when receivers would refuse it now, else 0. */
static int validity_note(const struct tt_claims *c, char *out, size_t cap)
{
	int64_t now = tt_now();

	if (now > c->exp + TT_CAP_SKEW)
		snprintf(out, cap, "EXPIRED %lld s ago, receivers refuse it",
		         (long long)(now - c->exp));
	else if (c->iat > now + TT_CAP_SKEW)
		snprintf(out, cap, "NOT YET VALID: issued %lld s in the future",
		         (long long)(c->iat - now));
	else if (now > c->exp)
		snprintf(out, cap, "expired %lld s ago, within the %d s skew",
		         (long long)(now - c->exp), TT_CAP_SKEW);
	else
		snprintf(out, cap, "expires in %lld s", (long long)(c->exp - now));
	return now > c->exp + TT_CAP_SKEW || c->iat > now + TT_CAP_SKEW;
}

/* inspect_verified: kid check, cap_verify (signature + claims, the same
 * check 1 receivers run), print. Exit 1 when a check fails (nothing on
 * stdout: --key asked for verified claims, and a payload that fails is
 * anyone's text) or when the token is expired (its claims printed). */
static int inspect_verified(const char *token, size_t len, const char *key,
                            const char *implicit)
{
	uint8_t pk[PASETO_PK_BYTES];
	char kid[PASERK_K4_PID_LEN + 1], tkid[PASERK_K4_PID_LEN + 1];
	struct tt_keyring kr = { .n = 0 };
	struct tt_claims claims;
	struct paseto_msg m;
	struct tt_err err = { 0 };
	size_t ilen = implicit != NULL ? strlen(implicit) : 0;
	char line[PASERK_K4_PID_LEN * 2 + 64], note[96];
	int rc, bad;

	if (paserk_k4_public_decode(key, pk, &err) < 0 ||
	    paserk_k4_pid(pk, kid) < 0)
		return inspect_fail(TT_ERR_INVALID, "--key is not a k4.public key");
	if (cap_token_kid(token, len, tkid, &err) < 0)
		return inspect_fail(err.code, err.msg);
	if (strcmp(tkid, kid) != 0) {
		snprintf(line, sizeof(line), "token is for kid %s, --key is %s",
		         tkid, kid);
		return inspect_fail(TT_ERR_UNKNOWN_KEY, line);
	}
	if (keyring_add(&kr, pk, 0, 0, &err) < 0 ||
	    cap_verify(&kr, token, len, (const uint8_t *)implicit, ilen, &claims,
	               &err) < 0)
		return inspect_fail(err.code, err.msg);
	/* The same bytes just verified: decoding them again needs no key. */
	if (paseto_v4_decode_unverified(token, len, &m, &err) < 0)
		return inspect_fail(err.code, err.msg);
	rc = print_payload(&m);
	paseto_msg_free(&m);
	bad = validity_note(&claims, note, sizeof(note));
	if (rc == 0)
		fprintf(stderr, "signature: valid (kid %s); %s\n", kid, note);
	return rc != 0 || bad;
}

/* inspect_unverified: decode only, and say loudly that nothing was
 * checked; exit 1 all the same when the claims are malformed or the
 * token is expired (no key makes it valid). */
static int inspect_unverified(const char *token, size_t len)
{
	struct tt_claims claims;
	struct paseto_msg m;
	struct tt_err err = { 0 };
	char note[96];
	int rc, bad;

	if (paseto_v4_decode_unverified(token, len, &m, &err) < 0)
		return inspect_fail(err.code, err.msg);
	rc = print_payload(&m);
	if (rc == 0 && claims_parse(m.payload, m.payload_len, &claims, &err) < 0) {
		paseto_msg_free(&m);
		fprintf(stderr, "signature: NOT VERIFIED (no --key given)\n");
		return inspect_fail(err.code, err.msg);
	}
	paseto_msg_free(&m);
	if (rc != 0)
		return rc;
	bad = validity_note(&claims, note, sizeof(note));
	fprintf(stderr, "signature: NOT VERIFIED (no --key given); %s\n", note);
	return bad;
}

/* token_from_stdin: TOKEN "-" reads it from stdin (a bearer token in argv
 * is visible to every local user in /proc/PID/cmdline). Bounded: one byte
 * over PASETO_TOKEN_MAX plus a line end is enough to refuse it. */
static int token_from_stdin(char *buf, size_t cap, size_t *len)
{
	size_t n = fread(buf, 1, cap - 1, stdin);

	if (ferror(stdin))
		return inspect_fail(TT_ERR_IO, "cannot read the token from stdin");
	if (n > 0 && buf[n - 1] == '\n')
		n--;
	if (n > 0 && buf[n - 1] == '\r')
		n--;
	buf[n] = '\0';
	*len = n;
	return 0;
}

/* cap_inspect: argv[0] is "inspect". */
static int cap_inspect(int argc, char **argv)
{
	const char *token = NULL, *key = NULL, *implicit = NULL;
	char buf[PASETO_TOKEN_MAX + 4];
	size_t len;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
			key = argv[++i];
		else if (strcmp(argv[i], "--implicit") == 0 && i + 1 < argc)
			implicit = argv[++i];
		else if ((argv[i][0] == '-' && strcmp(argv[i], "-") != 0) ||
		         token != NULL)
			return inspect_usage();
		else
			token = argv[i];
	}
	if (token == NULL)
		return inspect_usage();
	if (implicit != NULL && key == NULL)
		return inspect_fail(TT_ERR_INVALID, "--implicit needs --key");
	if (sodium_init() < 0)
		return inspect_fail(TT_ERR_SYS, "libsodium failed to initialise");
	len = strlen(token);
	if (strcmp(token, "-") == 0) {
		if (token_from_stdin(buf, sizeof(buf), &len) != 0)
			return 1;
		token = buf;
	}
	if (key != NULL)
		return inspect_verified(token, len, key, implicit);
	return inspect_unverified(token, len);
}

/* cli_cap: "cap inspect …" here; every other form issues a capability. */
int cli_cap(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "inspect") == 0)
		return cap_inspect(argc - 1, argv + 1);
	if (cli_cap_issue == NULL) {
		fprintf(stderr, "tether: 'cap' (issue) is not part of this build\n");
		return 1;
	}
	return cli_cap_issue(argc, argv);
}

/* tether cap inspect TOKEN [--key k4.public…] [--implicit STR]: decodes a
 * capability and, given the key, verifies it. Other "tether cap" forms ask
 * the edge for a capability (cli_cap_issue, in another file). */
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "capcache.h"
#include "cli/verbs.h"
#include "keyring.h"
#include "paserk.h"
#include "paseto.h"

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
	fprintf(stderr, "usage: tether cap inspect TOKEN [--key k4.public...] "
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
	rc = json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (rc < 0 || fputc('\n', stdout) == EOF || fflush(stdout) != 0)
		return inspect_fail(TT_ERR_IO, "cannot write to stdout");
	return 0;
}

/* footer_kid: the "kid" string of the token's (unverified) footer into out;
 * the footer only selects the key, the signature covers it. */
static int footer_kid(const char *token, size_t len,
                      char out[PASERK_K4_PID_LEN + 1], struct tt_err *err)
{
	struct paseto_msg m;
	json_error_t jerr;
	json_t *root, *kid;
	int rc = -1;

	if (paseto_v4_footer(token, len, &m, err) < 0)
		return -1;
	root = json_loadb((const char *)m.footer, m.footer_len,
	                  JSON_REJECT_DUPLICATES, &jerr);
	kid = json_object_get(root, "kid");
	if (m.footer_len == 0 || root == NULL)
		tt_err_set(err, TT_ERR_UNKNOWN_KEY, "token footer has no kid");
	else if (!json_is_string(kid) ||
	         json_string_length(kid) != PASERK_K4_PID_LEN ||
	         strlen(json_string_value(kid)) != PASERK_K4_PID_LEN)
		tt_err_set(err, TT_ERR_UNKNOWN_KEY, "token footer has no valid kid");
	else {
		memcpy(out, json_string_value(kid), PASERK_K4_PID_LEN + 1);
		rc = 0;
	}
	json_decref(root);
	paseto_msg_free(&m);
	return rc;
}

/* inspect_verified: kid check, cap_verify (signature + claims), print. */
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
	char line[PASERK_K4_PID_LEN * 2 + 64];
	int rc;

	if (paserk_k4_public_decode(key, pk, &err) < 0 ||
	    paserk_k4_pid(pk, kid) < 0)
		return inspect_fail(TT_ERR_INVALID, "--key is not a k4.public key");
	if (footer_kid(token, len, tkid, &err) < 0)
		return inspect_fail(err.code, err.msg);
	if (strcmp(tkid, kid) != 0) {
		snprintf(line, sizeof(line), "token kid %s is not the key's kid %s",
		         tkid, kid);
		return inspect_fail(TT_ERR_UNKNOWN_KEY, line);
	}
	if (keyring_add(&kr, pk, 0, 0, &err) < 0 ||
	    cap_verify(&kr, token, len, (const uint8_t *)implicit, ilen, &claims,
	               &err) < 0)
		return inspect_fail(err.code, err.msg);
	/* cap_verify accepted it; decode again (verified) for the raw payload */
	if (paseto_v4_verify(pk, token, len, (const uint8_t *)implicit, ilen, &m,
	                     &err) < 0)
		return inspect_fail(err.code, err.msg);
	rc = print_payload(&m);
	paseto_msg_free(&m);
	if (rc == 0)
		fprintf(stderr, "signature: valid (kid %s)\n", kid);
	return rc;
}

/* inspect_unverified: decode only, and say loudly that nothing was checked. */
static int inspect_unverified(const char *token, size_t len)
{
	struct paseto_msg m;
	struct tt_err err = { 0 };
	int rc;

	if (paseto_v4_decode_unverified(token, len, &m, &err) < 0)
		return inspect_fail(err.code, err.msg);
	rc = print_payload(&m);
	paseto_msg_free(&m);
	if (rc == 0)
		fprintf(stderr, "signature: NOT VERIFIED (no --key given)\n");
	return rc;
}

/* cap_inspect: argv[0] is "inspect". */
static int cap_inspect(int argc, char **argv)
{
	const char *token = NULL, *key = NULL, *implicit = NULL;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
			key = argv[++i];
		else if (strcmp(argv[i], "--implicit") == 0 && i + 1 < argc)
			implicit = argv[++i];
		else if (argv[i][0] == '-' || token != NULL)
			return inspect_usage();
		else
			token = argv[i];
	}
	if (token == NULL)
		return inspect_usage();
	if (sodium_init() < 0)
		return inspect_fail(TT_ERR_SYS, "libsodium failed to initialise");
	if (key != NULL)
		return inspect_verified(token, strlen(token), key, implicit);
	if (implicit != NULL)
		return inspect_fail(TT_ERR_INVALID, "--implicit needs --key");
	return inspect_unverified(token, strlen(token));
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

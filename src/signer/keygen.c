/* tether-signer keygen FILE [--force]: creates the signer's Ed25519 key as a
 * k4.secret file (mode 0600) and prints its public key and kid. */
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "paserk.h"
#include "signer/signer.h"

/* keygen_usage: one line on stderr; exit status 1. */
static int keygen_usage(void)
{
	fprintf(stderr, "usage: tether-signer keygen FILE [--force]\n");
	return 1;
}

/* keygen_help: asked-for help goes to stdout, and is not an error. */
static int keygen_help(void)
{
	printf("usage: tether-signer keygen FILE [--force]\n"
	       "Creates the signer's Ed25519 key as a k4.secret file (mode 0600,\n"
	       "never replacing FILE unless --force) and prints its k4.public key\n"
	       "and kid (k4.pid) for the receivers' key bundle.\n");
	return fflush(stdout) == 0 ? 0 : 1;
}

/* keygen_write: generate, write, read back (the file is what the signer
 * will load, so check it the way the signer will), print. */
static int keygen_write(const char *path, int force)
{
	uint8_t pk[PASETO_PK_BYTES], sk[PASETO_SK_BYTES], back[PASETO_SK_BYTES];
	char pub[PASERK_K4_PUBLIC_LEN + 1], kid[PASERK_K4_PID_LEN + 1];
	struct tt_err err = { 0 };
	int rc = 1;

	if (crypto_sign_keypair(pk, sk) != 0) {
		fprintf(stderr, "tether-signer: keygen: key generation failed\n");
		goto out;
	}
	if (paserk_secret_file_write(path, sk, force, &err) < 0 ||
	    paserk_secret_file_read(path, back, &err) < 0) {
		fprintf(stderr, "tether-signer: keygen: %s%s\n", err.msg,
		        err.code == TT_ERR_CONFLICT ? " (--force replaces it)" : "");
		goto out;
	}
	if (sodium_memcmp(back, sk, sizeof(sk)) != 0) {
		fprintf(stderr, "tether-signer: keygen: %s does not read back\n", path);
		goto out;
	}
	if (paserk_k4_public_encode(pk, pub) < 0 || paserk_k4_pid(pk, kid) < 0) {
		fprintf(stderr, "tether-signer: keygen: cannot encode the public key\n");
		goto out;
	}
	printf("public: %s\nkid: %s\n", pub, kid);
	rc = fflush(stdout) == 0 ? 0 : 1;
out:
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(back, sizeof(back));
	return rc;
}

/* keygen_main: argv[0] is "keygen". */
int keygen_main(int argc, char **argv)
{
	const char *path = NULL;
	int force = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--force") == 0)
			force = 1;
		else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
			return keygen_help();
		else if (argv[i][0] == '-' || path != NULL)
			return keygen_usage();
		else
			path = argv[i];
	}
	if (path == NULL)
		return keygen_usage();
	if (sodium_init() < 0) {
		fprintf(stderr, "tether-signer: keygen: libsodium failed to initialise\n");
		return 1;
	}
	return keygen_write(path, force);
}

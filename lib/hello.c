/* The guest handshake and adoption proofs, and the HELLO decoders (see
 * hello.h). */
#include "hello.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* hello_mac: see hello.h. */
void hello_mac(const uint8_t key[HELLO_SECRET_LEN], const char *label,
                             const char *sbx, uint64_t gen, uint32_t att,
                             const uint8_t *challenge, uint8_t out[HELLO_PROOF_LEN])
{
	crypto_auth_hmacsha256_state st;
	char num[24];
	static const uint8_t zero = 0;

	crypto_auth_hmacsha256_init(&st, key, HELLO_SECRET_LEN);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, strlen(label));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)sbx, strlen(sbx));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	snprintf(num, sizeof(num), "%" PRIu64, gen);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)num, strlen(num));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	snprintf(num, sizeof(num), "%" PRIu32, att);
	crypto_auth_hmacsha256_update(&st, (const uint8_t *)num, strlen(num));
	crypto_auth_hmacsha256_update(&st, &zero, 1);
	if (challenge != NULL)
		crypto_auth_hmacsha256_update(&st, challenge, HELLO_CHALLENGE_LEN);
	crypto_auth_hmacsha256_final(&st, out);
	/* The state holds key-derived pads. */
	sodium_memzero(&st, sizeof(st));
}

/* hello_proof: see hello.h. */
void hello_proof(const uint8_t secret[HELLO_SECRET_LEN], const char *sbx,
                               uint64_t gen, uint32_t att,
                               const uint8_t challenge[HELLO_CHALLENGE_LEN],
                               uint8_t out[HELLO_PROOF_LEN])
{
	hello_mac(secret, HELLO_LABEL, sbx, gen, att, challenge, out);
}

/* hello_adopt_key: see hello.h. */
void hello_adopt_key(const uint8_t secret[HELLO_SECRET_LEN], const char *sbx,
                                   uint64_t gen, uint32_t att, uint8_t out[HELLO_PROOF_LEN])
{
	hello_mac(secret, HELLO_ADOPT_KEY_LABEL, sbx, gen, att, NULL, out);
}

/* hello_b64_encode: see hello.h. */
void hello_b64_encode(const uint8_t in[32], char out[HELLO_B64_LEN + 1])
{
	sodium_bin2base64(out, HELLO_B64_LEN + 1, in, 32,
	                  sodium_base64_VARIANT_URLSAFE_NO_PADDING);
}

/* hello_b64_decode: see hello.h. */
int hello_b64_decode(const char *in, uint8_t out[32])
{
	size_t n = 0;
	const char *end = NULL;
	char back[HELLO_B64_LEN + 1];

	if (in == NULL || strlen(in) != HELLO_B64_LEN ||
	    sodium_base642bin(out, 32, in, HELLO_B64_LEN, NULL, &n, &end,
	                      sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
	    n != 32 || end != in + HELLO_B64_LEN)
		return -1;
	/* Canonical only: one encoding per value (no stray trailing bits). */
	hello_b64_encode(out, back);
	return strcmp(back, in) == 0 ? 0 : -1;
}

/* hello_read_secret: see hello.h. */
int hello_read_secret(int fd, uint8_t out[HELLO_SECRET_LEN], int timeout_ms)
{
	size_t got = 0;
	uint8_t extra;
	int rc = -1;

	for (;;) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t n;

		int pr = poll(&pf, 1, timeout_ms);

		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0) {
			if (pr == 0)
				errno = ETIMEDOUT;
			break;
		}
		n = got < HELLO_SECRET_LEN ? read(fd, out + got, HELLO_SECRET_LEN - got)
		                           : read(fd, &extra, 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			break;
		if (n == 0) {
			if (got == HELLO_SECRET_LEN)
				rc = 0;
			else
				errno = EPROTO;
			break;
		}
		if (got == HELLO_SECRET_LEN) {
			errno = EPROTO; /* more than a secret: refuse */
			break;
		}
		got += (size_t)n;
	}
	close(fd);
	if (rc < 0)
		sodium_memzero(out, HELLO_SECRET_LEN);
	return rc;
}

/* hello_u64_member: a non-negative integer member of o; 0 or -1. */
static int hello_u64_member(json_t *o, const char *key, uint64_t *out)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* hello_challenge_parse: see hello.h. */
int hello_challenge_parse(json_t *o, struct hello_challenge *out)
{
	uint64_t v = 0, gen = 0, att = 0;

	out->sbx = json_string_value(json_object_get(o, "sbx"));
	if (!json_is_object(o) || hello_u64_member(o, "v", &v) < 0 ||
	    v != HELLO_VERSION || out->sbx == NULL ||
	    hello_u64_member(o, "generation", &gen) < 0 ||
	    hello_u64_member(o, "activation", &att) < 0 || att > UINT32_MAX ||
	    hello_b64_decode(json_string_value(json_object_get(o, "challenge")),
	                     out->challenge) < 0)
		return -1;
	out->gen = gen;
	out->att = (uint32_t)att;
	return 0;
}

/* hello_proof_parse: see hello.h. */
int hello_proof_parse(json_t *o, uint8_t out[HELLO_PROOF_LEN])
{
	if (!json_is_object(o) || json_object_size(o) != 1)
		return -1;
	return hello_b64_decode(json_string_value(json_object_get(o, "proof")), out);
}

/* hello_challenge_json: see hello.h. */
json_t *hello_challenge_json(const char *sbx, uint64_t gen, uint32_t att,
                             const uint8_t challenge[HELLO_CHALLENGE_LEN])
{
	char chal[HELLO_B64_LEN + 1];

	hello_b64_encode(challenge, chal);
	return json_pack("{s:i,s:s,s:s,s:I,s:I}", "v", HELLO_VERSION, "challenge", chal,
	                 "sbx", sbx, "generation", (json_int_t)gen, "activation",
	                 (json_int_t)att);
}

/* hello_proof_json: see hello.h. */
json_t *hello_proof_json(const uint8_t proof[HELLO_PROOF_LEN])
{
	char b64[HELLO_B64_LEN + 1];

	hello_b64_encode(proof, b64);
	return json_pack("{s:s}", "proof", b64);
}

/* hello_adopt_challenge_json: see hello.h. */
json_t *hello_adopt_challenge_json(const uint8_t challenge[HELLO_CHALLENGE_LEN])
{
	char chal[HELLO_B64_LEN + 1];

	hello_b64_encode(challenge, chal);
	return json_pack("{s:i,s:s}", "v", HELLO_VERSION, "adopt_challenge", chal);
}

/* hello_adopt_challenge_parse: see hello.h. */
int hello_adopt_challenge_parse(json_t *o, uint8_t out[HELLO_CHALLENGE_LEN])
{
	if (!json_is_object(o))
		return -1;
	return hello_b64_decode(json_string_value(json_object_get(o, "adopt_challenge")), out);
}

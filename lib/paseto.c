/* PASETO v4.public on libsodium (see paseto.h): verification. Signing is
 * in lib/paseto_sign.c, linked only into the signer (and tests). Every
 * length is checked against the fixed bounds before anything is decoded
 * or allocated. */
#include "paseto.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "b64url.h"
#include "paseto_int.h"


/* The token split at its dots; pointers into the caller's string. */
struct paseto_parts {
	const char *body;
	size_t body_len;
	const char *footer; /* NULL when the token has no footer */
	size_t footer_len;
};

/* le64: PASETO's LE64, a 64-bit little-endian count with the MSB cleared. */
static void le64(uint8_t out[8], uint64_t n)
{
	for (int i = 0; i < 8; i++) {
		if (i == 7)
			n &= 127;
		out[i] = (uint8_t)(n & 255);
		n >>= 8;
	}
}

/* paseto_pae: LE64(n) then LE64(len) || piece for each piece. */
int paseto_pae(const uint8_t *const *pieces, const size_t *lens, size_t n,
               uint8_t *out, size_t cap, size_t *out_len)
{
	size_t need = 8, pos = 0;

	for (size_t i = 0; i < n; i++) {
		if (lens[i] > SIZE_MAX - need - 8)
			return -1;
		need += 8 + lens[i];
	}
	if (need > cap)
		return -1;
	le64(out, n);
	pos = 8;
	for (size_t i = 0; i < n; i++) {
		le64(out + pos, lens[i]);
		pos += 8;
		if (lens[i] > 0)
			memcpy(out + pos, pieces[i], lens[i]);
		pos += lens[i];
	}
	*out_len = pos;
	return 0;
}

/* pae_v4_public: PAE(header, m, f, i) into a PAE_MAX buffer. */
int pae_v4_public(const uint8_t *m, size_t m_len, const uint8_t *f,
                  size_t f_len, const uint8_t *i, size_t i_len,
                  uint8_t out[PAE_MAX], size_t *out_len)
{
	const uint8_t *pieces[4] = { (const uint8_t *)PASETO_V4_PUBLIC_HEADER, m,
	                             f, i };
	const size_t lens[4] = { HEADER_LEN, m_len, f_len, i_len };

	return paseto_pae(pieces, lens, 4, out, PAE_MAX, out_len);
}

/* paseto_split: checks the header and the shape "body[.footer]" and the
 * encoded sizes, without decoding anything. An empty footer after a dot is
 * a second encoding of "no footer", so it is refused. */
static int paseto_split(const char *token, size_t token_len,
                        struct paseto_parts *p, struct tt_err *err)
{
	const char *rest, *dot;
	size_t rest_len;

	if (token == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "token: missing");
	if (token_len > PASETO_TOKEN_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "token: %zu bytes exceed the %d-byte bound",
		                  token_len, PASETO_TOKEN_MAX);
	if (token_len < HEADER_LEN ||
	    memcmp(token, PASETO_V4_PUBLIC_HEADER, HEADER_LEN) != 0)
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "token: not a v4.public token");
	rest = token + HEADER_LEN;
	rest_len = token_len - HEADER_LEN;
	dot = memchr(rest, '.', rest_len);
	p->body = rest;
	p->body_len = dot != NULL ? (size_t)(dot - rest) : rest_len;
	p->footer = NULL;
	p->footer_len = 0;
	if (dot != NULL) {
		p->footer = dot + 1;
		p->footer_len = rest_len - p->body_len - 1;
		if (p->footer_len == 0)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "token: empty footer after '.'");
		if (memchr(p->footer, '.', p->footer_len) != NULL)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "token: too many '.' sections");
	}
	if (p->body_len > B64URL_ENCODED_LEN(BODY_MAX))
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "token: payload exceeds %d bytes", PASETO_PAYLOAD_MAX);
	if (p->footer_len > B64URL_ENCODED_LEN(PASETO_FOOTER_MAX))
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "token: footer exceeds %d bytes", PASETO_FOOTER_MAX);
	if (p->body_len < B64URL_ENCODED_LEN(PASETO_SIG_BYTES))
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "token: too short to hold a signature");
	return 0;
}

/* dup_nul: a malloc'd NUL-terminated copy of len bytes (owned by caller). */
static uint8_t *dup_nul(const uint8_t *src, size_t len)
{
	uint8_t *p = malloc(len + 1);

	if (p == NULL)
		return NULL;
	if (len > 0)
		memcpy(p, src, len);
	p[len] = '\0';
	return p;
}

/* decode_section: b64url_decode of one section of the token, the error
 * naming the section ("token: footer: base64url: …"). */
static int decode_section(const char *what, const char *in, size_t in_len,
                          uint8_t *out, size_t cap, size_t *out_len,
                          struct tt_err *err)
{
	struct tt_err e = { 0 };

	if (b64url_decode(in, in_len, out, cap, out_len, &e) < 0)
		return tt_err_set(err, e.code, "token: %s: %s", what, e.msg);
	return 0;
}

/* decode_footer: the footer bytes of a split token into f (FOOTER_MAX). */
static int decode_footer(const struct paseto_parts *p,
                         uint8_t f[PASETO_FOOTER_MAX], size_t *f_len,
                         struct tt_err *err)
{
	*f_len = 0;
	if (p->footer == NULL)
		return 0;
	return decode_section("footer", p->footer, p->footer_len, f,
	                      PASETO_FOOTER_MAX, f_len, err);
}

/* fill_msg: copies payload (may be NULL) and footer into out. */
static int fill_msg(struct paseto_msg *out, const uint8_t *m, size_t m_len,
                    const uint8_t *f, size_t f_len, struct tt_err *err)
{
	memset(out, 0, sizeof(*out));
	if (m != NULL) {
		out->payload = dup_nul(m, m_len);
		out->payload_len = m_len;
	}
	out->footer = dup_nul(f, f_len);
	out->footer_len = f_len;
	if ((m != NULL && out->payload == NULL) || out->footer == NULL) {
		paseto_msg_free(out);
		return tt_err_set(err, TT_ERR_NOMEM, "token: out of memory");
	}
	return 0;
}

/* paseto_decode: split and decode body and footer; when pk is not NULL,
 * also verify the signature over PAE(h, m, f, i). out is cleared first so
 * that paseto_msg_free is safe after a failure too. */
static int paseto_decode(const uint8_t *pk, const char *token,
                         size_t token_len, const uint8_t *implicit,
                         size_t implicit_len, struct paseto_msg *out,
                         struct tt_err *err)
{
	struct paseto_parts p;
	uint8_t body[BODY_MAX], f[PASETO_FOOTER_MAX], pae[PAE_MAX];
	size_t body_len, f_len, m_len, pae_len;

	memset(out, 0, sizeof(*out));
	if (implicit == NULL && implicit_len > 0)
		return tt_err_set(err, TT_ERR_INVALID, "token: NULL implicit assertion");
	if (implicit_len > PASETO_IMPLICIT_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE,
		                  "token: implicit assertion exceeds %d bytes",
		                  PASETO_IMPLICIT_MAX);
	if (paseto_split(token, token_len, &p, err) < 0)
		return -1;
	if (decode_section("body", p.body, p.body_len, body, sizeof(body),
	                   &body_len, err) < 0)
		return -1;
	/* paseto_split bounded the encoded length; a canonical encoding of at
	 * least 86 chars decodes to at least 64 bytes. */
	if (body_len < PASETO_SIG_BYTES)
		return tt_err_set(err, TT_ERR_MALFORMED, "token: no signature");
	m_len = body_len - PASETO_SIG_BYTES;
	if (decode_footer(&p, f, &f_len, err) < 0)
		return -1;
	if (pk != NULL) {
		if (pae_v4_public(body, m_len, f, f_len, implicit, implicit_len, pae,
		                  &pae_len) < 0)
			return tt_err_set(err, TT_ERR_TOO_LARGE, "token: PAE too large");
		if (crypto_sign_verify_detached(body + m_len, pae, pae_len, pk) != 0)
			return tt_err_set(err, TT_ERR_SIGNATURE,
			                  "token: signature does not verify");
	}
	return fill_msg(out, body, m_len, f, f_len, err);
}

/* paseto_v4_verify: full check; out is filled only on success. */
int paseto_v4_verify(const uint8_t pk[PASETO_PK_BYTES],
                     const char *token, size_t token_len,
                     const uint8_t *implicit, size_t implicit_len,
                     struct paseto_msg *out, struct tt_err *err)
{
	if (pk == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "verify: no public key");
	return paseto_decode(pk, token, token_len, implicit, implicit_len, out,
	                     err);
}

/* paseto_v4_footer: shape and bounds of the whole token, footer decoded. */
int paseto_v4_footer(const char *token, size_t token_len,
                     struct paseto_msg *out, struct tt_err *err)
{
	struct paseto_parts p;
	uint8_t f[PASETO_FOOTER_MAX];
	size_t f_len;

	memset(out, 0, sizeof(*out));
	if (paseto_split(token, token_len, &p, err) < 0 ||
	    decode_footer(&p, f, &f_len, err) < 0)
		return -1;
	return fill_msg(out, NULL, 0, f, f_len, err);
}

/* paseto_v4_decode_unverified: like verify, minus the signature check. */
int paseto_v4_decode_unverified(const char *token, size_t token_len,
                                struct paseto_msg *out, struct tt_err *err)
{
	return paseto_decode(NULL, token, token_len, NULL, 0, out, err);
}

/* paseto_msg_free: frees both buffers and clears the struct. */
void paseto_msg_free(struct paseto_msg *msg)
{
	if (msg == NULL)
		return;
	free(msg->payload);
	free(msg->footer);
	memset(msg, 0, sizeof(*msg));
}

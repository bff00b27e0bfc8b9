/* Internals shared by lib/paseto.c (verify) and lib/paseto_sign.c. */
#ifndef TT_PASETO_INT_H
#define TT_PASETO_INT_H

#include <stddef.h>
#include <stdint.h>

#include "paseto.h"

#define HEADER_LEN (sizeof(PASETO_V4_PUBLIC_HEADER) - 1)
/* The implicit assertion is not in the token; bound it so that the PAE
 * buffer has a fixed size. */
#define PASETO_IMPLICIT_MAX 1024
/* PAE of (header, payload, footer, implicit): count + 4 lengths + data. */
#define PAE_MAX (8 + 4 * 8 + HEADER_LEN + PASETO_PAYLOAD_MAX + \
                 PASETO_FOOTER_MAX + PASETO_IMPLICIT_MAX)
#define BODY_MAX (PASETO_PAYLOAD_MAX + PASETO_SIG_BYTES)

/* pae_v4_public: PAE(header, m, f, i) into a PAE_MAX buffer. */
int pae_v4_public(const uint8_t *m, size_t m_len, const uint8_t *f,
                  size_t f_len, const uint8_t *i, size_t i_len,
                  uint8_t out[PAE_MAX], size_t *out_len);

#endif

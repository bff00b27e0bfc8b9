/* Internals shared by lib/paserk.c and lib/paserk_secret.c. */
#ifndef TT_PASERK_INT_H
#define TT_PASERK_INT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* paserk_encode: prefix || b64url(key) into out (cap bytes). */
int paserk_encode(const char *prefix, const uint8_t *key, size_t len,
                  char *out, size_t cap);
/* paserk_decode: checks the prefix and that s decodes to exactly len
 * bytes; s is read only up to max_len + 1. */
int paserk_decode(const char *s, const char *prefix, size_t max_len,
                  uint8_t *key, size_t len, struct tt_err *err);

#endif

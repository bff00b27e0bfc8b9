/* PASERK for v4 keys: k4.public, k4.secret and k4.pid (the key id, "kid").
 * Implementation: lib/paserk.c. Secret material is zeroed by the callers'
 * and these functions' temporaries (sodium_memzero). */
#ifndef TT_PASERK_H
#define TT_PASERK_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "paseto.h"

/* Lengths of the encoded strings, without the NUL. */
#define PASERK_K4_PUBLIC_LEN (10 + 43)  /* "k4.public." + b64url(32) */
#define PASERK_K4_SECRET_LEN (10 + 86)  /* "k4.secret." + b64url(64) */
#define PASERK_K4_PID_LEN    (7 + 44)   /* "k4.pid." + b64url(33) */

int paserk_k4_public_encode(const uint8_t pk[PASETO_PK_BYTES],
                            char out[PASERK_K4_PUBLIC_LEN + 1]);
int paserk_k4_public_decode(const char *s, uint8_t pk[PASETO_PK_BYTES],
                            struct tt_err *err);
int paserk_k4_secret_encode(const uint8_t sk[PASETO_SK_BYTES],
                            char out[PASERK_K4_SECRET_LEN + 1]);
/* paserk_k4_secret_decode: also checks that the public half matches the
 * seed (a k4.secret is seed || pk). */
int paserk_k4_secret_decode(const char *s, uint8_t sk[PASETO_SK_BYTES],
                            struct tt_err *err);
/* paserk_k4_pid: the kid of a public key. */
int paserk_k4_pid(const uint8_t pk[PASETO_PK_BYTES],
                  char out[PASERK_K4_PID_LEN + 1]);

/* paserk_secret_file_write: creates path with mode 0600 (O_EXCL unless
 * overwrite) holding the k4.secret string and a newline. */
int paserk_secret_file_write(const char *path,
                             const uint8_t sk[PASETO_SK_BYTES], int overwrite,
                             struct tt_err *err);
/* paserk_secret_file_read: refuses a file readable by group or others. */
int paserk_secret_file_read(const char *path, uint8_t sk[PASETO_SK_BYTES],
                            struct tt_err *err);

#endif

/* PASERK k4.public / k4.secret / k4.pid (see paserk.h). */
#include "paserk.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "b64url.h"
#include "cleanup.h"

#define K4_PUBLIC "k4.public."
#define K4_SECRET "k4.secret."
#define K4_PID "k4.pid."
#define K4_PID_HASH_BYTES 33 /* BLAKE2b-264 */
/* A key file holds the k4.secret string and optional newline; anything
 * longer than this is not a key file. */
#define KEY_FILE_MAX 128

/* paserk_encode: prefix || b64url(key) into out (cap bytes). */
static int paserk_encode(const char *prefix, const uint8_t *key, size_t len,
                         char *out, size_t cap)
{
	size_t plen = strlen(prefix);

	if (cap < plen + 1)
		return -1;
	memcpy(out, prefix, plen);
	return b64url_encode(key, len, out + plen, cap - plen) < 0 ? -1 : 0;
}

/* paserk_decode: checks the prefix and that s decodes to exactly len
 * bytes. s must be NUL-terminated; it is read only up to max_len + 1. */
static int paserk_decode(const char *s, const char *prefix, size_t max_len,
                         uint8_t *key, size_t len, struct tt_err *err)
{
	size_t plen = strlen(prefix), slen, got = 0;

	if (s == NULL)
		return tt_err_set(err, TT_ERR_MALFORMED, "paserk: missing key");
	slen = strnlen(s, max_len + 1);
	if (slen > max_len)
		return tt_err_set(err, TT_ERR_MALFORMED, "paserk: %.*s key too long",
		                  (int)plen - 1, prefix);
	if (slen < plen || memcmp(s, prefix, plen) != 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "paserk: not a %.*s key",
		                  (int)plen - 1, prefix);
	if (b64url_decode(s + plen, slen - plen, key, len, &got, err) < 0 ||
	    got != len) {
		sodium_memzero(key, len);
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "paserk: %.*s key is not %zu canonical base64url bytes",
		                  (int)plen - 1, prefix, len);
	}
	return 0;
}

/* paserk_k4_public_encode: "k4.public." b64url(pk). */
int paserk_k4_public_encode(const uint8_t pk[PASETO_PK_BYTES],
                            char out[PASERK_K4_PUBLIC_LEN + 1])
{
	return paserk_encode(K4_PUBLIC, pk, PASETO_PK_BYTES, out,
	                     PASERK_K4_PUBLIC_LEN + 1);
}

/* paserk_k4_public_decode: exactly 32 bytes after "k4.public.". */
int paserk_k4_public_decode(const char *s, uint8_t pk[PASETO_PK_BYTES],
                            struct tt_err *err)
{
	return paserk_decode(s, K4_PUBLIC, PASERK_K4_PUBLIC_LEN, pk,
	                     PASETO_PK_BYTES, err);
}

/* paserk_k4_secret_encode: "k4.secret." b64url(seed || pk). */
int paserk_k4_secret_encode(const uint8_t sk[PASETO_SK_BYTES],
                            char out[PASERK_K4_SECRET_LEN + 1])
{
	return paserk_encode(K4_SECRET, sk, PASETO_SK_BYTES, out,
	                     PASERK_K4_SECRET_LEN + 1);
}

/* paserk_k4_secret_decode: the public half must be the one derived from
 * the seed, or the key would sign with one key and claim another kid. */
int paserk_k4_secret_decode(const char *s, uint8_t sk[PASETO_SK_BYTES],
                            struct tt_err *err)
{
	uint8_t pk[PASETO_PK_BYTES], sk2[PASETO_SK_BYTES];
	int ok;

	if (paserk_decode(s, K4_SECRET, PASERK_K4_SECRET_LEN, sk,
	                  PASETO_SK_BYTES, err) < 0)
		return -1;
	crypto_sign_seed_keypair(pk, sk2, sk);
	ok = sodium_memcmp(sk2, sk, PASETO_SK_BYTES) == 0;
	sodium_memzero(sk2, sizeof(sk2));
	if (!ok) {
		sodium_memzero(sk, PASETO_SK_BYTES);
		return tt_err_set(err, TT_ERR_MALFORMED,
		                  "paserk: k4.secret public half does not match its seed");
	}
	return 0;
}

/* paserk_k4_pid: "k4.pid." b64url(BLAKE2b-264("k4.pid." || k4.public)). */
int paserk_k4_pid(const uint8_t pk[PASETO_PK_BYTES],
                  char out[PASERK_K4_PID_LEN + 1])
{
	char pub[PASERK_K4_PUBLIC_LEN + 1];
	uint8_t h[K4_PID_HASH_BYTES];
	crypto_generichash_state st;

	if (paserk_k4_public_encode(pk, pub) < 0)
		return -1;
	if (crypto_generichash_init(&st, NULL, 0, sizeof(h)) != 0 ||
	    crypto_generichash_update(&st, (const uint8_t *)K4_PID,
	                              strlen(K4_PID)) != 0 ||
	    crypto_generichash_update(&st, (const uint8_t *)pub,
	                              PASERK_K4_PUBLIC_LEN) != 0 ||
	    crypto_generichash_final(&st, h, sizeof(h)) != 0)
		return -1;
	return paserk_encode(K4_PID, h, sizeof(h), out, PASERK_K4_PID_LEN + 1);
}

/* fsync_dir: makes a new directory entry durable. */
static int fsync_dir(const char *path, struct tt_err *err)
{
	char buf[PATH_MAX];
	_cleanup_close_ int dfd = -1;

	if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
		return tt_err_set(err, TT_ERR_INVALID, "key file: path too long");
	dfd = open(dirname(buf), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || fsync(dfd) < 0)
		return tt_err_sys(err, TT_ERR_IO, "key file: fsync of directory");
	return 0;
}

/* write_all: the whole buffer or an error. */
static int write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* paserk_secret_file_write: written to a 0600 temporary beside path, synced,
 * then linked into place (fails if path exists) or renamed over it
 * (overwrite), so the key file is never seen half-written. */
int paserk_secret_file_write(const char *path,
                             const uint8_t sk[PASETO_SK_BYTES], int overwrite,
                             struct tt_err *err)
{
	char tmp[PATH_MAX], line[PASERK_K4_SECRET_LEN + 2];
	_cleanup_close_ int fd = -1;
	int rc = -1;

	if (path == NULL || *path == '\0')
		return tt_err_set(err, TT_ERR_INVALID, "key file: no path");
	if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int)sizeof(tmp))
		return tt_err_set(err, TT_ERR_INVALID, "key file: path too long");
	/* mkostemp creates the file with mode 0600 and O_EXCL: the secret is
	 * never readable by anyone else, even for a moment. */
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "key file: cannot create %s",
		                  path);
	if (paserk_k4_secret_encode(sk, line) < 0) {
		tt_err_set(err, TT_ERR_INVALID, "key file: encoding failed");
		goto out;
	}
	line[PASERK_K4_SECRET_LEN] = '\n';
	if (write_all(fd, line, PASERK_K4_SECRET_LEN + 1) < 0 || fsync(fd) < 0) {
		tt_err_sys(err, TT_ERR_IO, "key file: cannot write %s", path);
		goto out;
	}
	if (overwrite ? rename(tmp, path) : link(tmp, path)) {
		if (errno == EEXIST)
			tt_err_set(err, TT_ERR_CONFLICT,
			           "key file: %s already exists", path);
		else
			tt_err_sys(err, TT_ERR_IO, "key file: cannot create %s",
			           path);
		goto out;
	}
	if (overwrite)
		tmp[0] = '\0'; /* renamed away: nothing left to unlink */
	rc = fsync_dir(path, err);
out:
	sodium_memzero(line, sizeof(line));
	if (tmp[0] != '\0')
		unlink(tmp);
	return rc;
}

/* paserk_secret_file_read: like ssh, refuse a key others could have read
 * (it must be rotated, not used) and anything but a regular file. */
int paserk_secret_file_read(const char *path, uint8_t sk[PASETO_SK_BYTES],
                            struct tt_err *err)
{
	char buf[KEY_FILE_MAX + 1];
	_cleanup_close_ int fd = -1;
	struct stat st;
	size_t len = 0;
	int rc = -1;

	if (path == NULL)
		return tt_err_set(err, TT_ERR_INVALID, "key file: no path");
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "key file: open %s", path);
	if (fstat(fd, &st) < 0)
		return tt_err_sys(err, TT_ERR_IO, "key file: stat %s", path);
	if (!S_ISREG(st.st_mode))
		return tt_err_set(err, TT_ERR_INVALID,
		                  "key file: %s is not a regular file", path);
	/* Like ssh: a key someone else owns could be swapped under us. */
	if (st.st_uid != geteuid())
		return tt_err_set(err, TT_ERR_DENIED,
		                  "key file: %s is owned by uid %u, not by us (%u)",
		                  path, (unsigned)st.st_uid, (unsigned)geteuid());
	if ((st.st_mode & 077) != 0)
		return tt_err_set(err, TT_ERR_DENIED,
		                  "key file: %s is accessible by group or others "
		                  "(mode %03o, want 600)", path,
		                  (unsigned)(st.st_mode & 0777));
	while (len < sizeof(buf)) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			tt_err_sys(err, TT_ERR_IO, "key file: read %s", path);
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	if (len > KEY_FILE_MAX) {
		tt_err_set(err, TT_ERR_MALFORMED, "key file: %s is too large", path);
		goto out;
	}
	if (len > 0 && buf[len - 1] == '\n')
		len--;
	buf[len] = '\0';
	if (strlen(buf) != len) {
		tt_err_set(err, TT_ERR_MALFORMED, "key file: %s holds a NUL", path);
		goto out;
	}
	rc = paserk_k4_secret_decode(buf, sk, err);
out:
	sodium_memzero(buf, sizeof(buf));
	return rc;
}

/* PASERK k4.secret and the signer's key files (see paserk.h). Only the
 * signer (build/tether-signer) and tests link this file: nothing that runs
 * on a worker holds code that handles a secret key. */
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

#include "cleanup.h"
#include "paserk_int.h"

#define K4_SECRET "k4.secret."
/* A key file holds the k4.secret string and optional newline; anything
 * longer than this is not a key file. */
#define KEY_FILE_MAX 128

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

/* libtether configuration: environment first, then ~/.config/tether/config
 * ("url=…" and "api_key=…" lines). */
#include "client/tether.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "cleanup.h"

#define CONFIG_FILE_MAX (64u * 1024)

/* config_set: copies a value into a fixed field; trailing slashes are
 * dropped from URLs so paths can be appended. Blanks and control bytes
 * are refused: neither a URL nor a key has them, and a CR would end up
 * inside the Authorization header. */
static int config_set(char *field, size_t cap, const char *val, size_t len,
                      int is_url, const char *name, struct tt_err *err)
{
	if (is_url)
		while (len > 0 && val[len - 1] == '/')
			len--;
	if (len == 0)
		return tt_err_set(err, TT_ERR_INVALID, "config: empty %s", name);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)val[i] <= ' ' || val[i] == 0x7f)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "config: %s contains a blank or control character",
			                  name);
	if (len >= cap)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "config: %s too long", name);
	memcpy(field, val, len);
	field[len] = '\0';
	return 0;
}

/* tether_config_parse: key=value lines into cfg. */
int tether_config_parse(struct tether_config *cfg, const char *text,
                        size_t len, struct tt_err *err)
{
	size_t pos = 0;
	unsigned lineno = 0;

	while (pos < len) {
		const char *line = text + pos;
		const char *nl = memchr(line, '\n', len - pos);
		size_t llen = nl ? (size_t)(nl - line) : len - pos;

		pos += llen + (nl ? 1 : 0);
		lineno++;
		/* trim surrounding blanks and a CR from CRLF files */
		while (llen > 0 && (line[0] == ' ' || line[0] == '\t')) {
			line++;
			llen--;
		}
		while (llen > 0 && (line[llen - 1] == ' ' || line[llen - 1] == '\t' ||
		                    line[llen - 1] == '\r'))
			llen--;
		if (llen == 0 || line[0] == '#')
			continue;
		if (memchr(line, '\0', llen) != NULL)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "config line %u: NUL byte", lineno);
		const char *eq = memchr(line, '=', llen);
		if (eq == NULL)
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "config line %u: expected key=value", lineno);
		size_t klen = (size_t)(eq - line);
		const char *val = eq + 1;
		size_t vlen = llen - klen - 1;
		while (klen > 0 && (line[klen - 1] == ' ' || line[klen - 1] == '\t'))
			klen--;
		while (vlen > 0 && (val[0] == ' ' || val[0] == '\t')) {
			val++;
			vlen--;
		}
		if (klen == 3 && memcmp(line, "url", 3) == 0) {
			if (config_set(cfg->url, sizeof(cfg->url), val, vlen, 1, "url",
			               err) < 0)
				return -1;
		} else if (klen == 7 && memcmp(line, "api_key", 7) == 0) {
			if (config_set(cfg->api_key, sizeof(cfg->api_key), val, vlen, 0,
			               "api_key", err) < 0)
				return -1;
		} else {
			return tt_err_set(err, TT_ERR_MALFORMED,
			                  "config line %u: unknown key '%.*s'", lineno,
			                  (int)(klen > 40 ? 40 : klen), line);
		}
	}
	return 0;
}

/* tether_config_path: the per-user config file. */
int tether_config_path(char *buf, size_t cap, struct tt_err *err)
{
	const char *home = getenv("HOME");

	if (home == NULL || home[0] == '\0')
		return tt_err_set(err, TT_ERR_INVALID, "HOME is not set");
	if ((size_t)snprintf(buf, cap, "%s/.config/tether/config", home) >= cap)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "HOME too long");
	return 0;
}

/* config_read_file: reads a bounded file; *missing set when absent. */
static char *config_read_file(const char *path, size_t *len, int *missing,
                              struct tt_err *err)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	_cleanup_free_ char *buf = NULL;
	size_t got = 0;

	*missing = 0;
	if (fd < 0) {
		if (errno == ENOENT) {
			*missing = 1;
			tt_err_set(err, TT_ERR_NOT_FOUND, "%s does not exist", path);
		} else {
			tt_err_sys(err, TT_ERR_IO, "cannot open %s", path);
		}
		return NULL;
	}
	buf = malloc(CONFIG_FILE_MAX + 1);
	if (buf == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	for (;;) {
		ssize_t n = read(fd, buf + got, CONFIG_FILE_MAX + 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			tt_err_sys(err, TT_ERR_IO, "cannot read %s", path);
			return NULL;
		}
		if (n == 0)
			break;
		got += (size_t)n;
		if (got > CONFIG_FILE_MAX) {
			tt_err_set(err, TT_ERR_TOO_LARGE, "%s is too large", path);
			return NULL;
		}
	}
	*len = got;
	return tt_steal_ptr(&buf);
}

/* tether_config_load: environment over file. */
int tether_config_load(struct tether_config *cfg, struct tt_err *err)
{
	const char *env_url = getenv("TETHER_URL");
	const char *env_key = getenv("TETHER_API_KEY");
	const char *env_wait = getenv("TETHER_WAIT");
	char path[1024];

	memset(cfg, 0, sizeof(*cfg));
	if (env_wait != NULL && env_wait[0] != '\0') {
		size_t n = strspn(env_wait, "0123456789");

		if (n == 0 || n > 3 || env_wait[n] != '\0' || atoi(env_wait) > 300)
			return tt_err_set(err, TT_ERR_INVALID, "TETHER_WAIT must be 0..300 "
			                  "seconds, not \"%.16s\"", env_wait);
		snprintf(cfg->wait, sizeof(cfg->wait), "%d", atoi(env_wait));
	}
	if (!(env_url && env_url[0] && env_key && env_key[0])) {
		_cleanup_free_ char *text = NULL;
		size_t len = 0;
		int missing = 0;
		struct tt_err ferr;

		if (tether_config_path(path, sizeof(path), err) < 0)
			return -1;
		text = config_read_file(path, &len, &missing, &ferr);
		if (text == NULL && !missing) {
			*err = ferr;
			return -1;
		}
		if (text != NULL) {
			int rc = tether_config_parse(cfg, text, len, err);
			sodium_memzero(text, len); /* the file holds the API key */
			if (rc < 0) {
				size_t ml = strlen(err->msg);
				snprintf(err->msg + ml, sizeof(err->msg) - ml, " (%s)", path);
				return -1;
			}
		}
	}
	if (env_url && env_url[0] &&
	    config_set(cfg->url, sizeof(cfg->url), env_url, strlen(env_url), 1,
	               "TETHER_URL", err) < 0)
		return -1;
	if (env_key && env_key[0] &&
	    config_set(cfg->api_key, sizeof(cfg->api_key), env_key,
	               strlen(env_key), 0, "TETHER_API_KEY", err) < 0)
		return -1;
	if (cfg->url[0] == '\0' || cfg->api_key[0] == '\0')
		return tt_err_set(err, TT_ERR_INVALID,
		                  "no cluster configured: set TETHER_URL and "
		                  "TETHER_API_KEY, or start one with 'tether up'");
	return 0;
}

/* config_mkdirs: creates every missing parent directory of path (0700). */
static int config_mkdirs(const char *path, struct tt_err *err)
{
	char buf[1024];

	if (strlen(path) >= sizeof(buf))
		return tt_err_set(err, TT_ERR_TOO_LARGE, "path too long");
	strcpy(buf, path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return tt_err_sys(err, TT_ERR_IO, "cannot create %s", buf);
		*p = '/';
	}
	return 0;
}

/* tether_config_write: atomic 0600 write of the two settings. */
int tether_config_write(const char *path, const char *url,
                        const char *api_key, struct tt_err *err)
{
	char tmp[1100];
	_cleanup_close_ int fd = -1;
	_cleanup_free_ char *text = NULL;
	int len;

	if (config_mkdirs(path, err) < 0)
		return -1;
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmpXXXXXX", path) >= sizeof(tmp))
		return tt_err_set(err, TT_ERR_TOO_LARGE, "path too long");
	fd = mkostemp(tmp, O_CLOEXEC); /* created 0600 */
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_IO, "cannot create %s", tmp);
	len = asprintf(&text, "url=%s\napi_key=%s\n", url, api_key);
	if (len < 0) {
		text = NULL;
		unlink(tmp);
		return tt_err_set(err, TT_ERR_NOMEM, "out of memory");
	}
	ssize_t n = write(fd, text, (size_t)len);
	sodium_memzero(text, (size_t)len);
	if (n != len || fsync(fd) < 0) {
		tt_err_sys(err, TT_ERR_IO, "cannot write %s", tmp);
		unlink(tmp);
		return -1;
	}
	if (rename(tmp, path) < 0) {
		tt_err_sys(err, TT_ERR_IO, "cannot rename to %s", path);
		unlink(tmp);
		return -1;
	}
	return 0;
}

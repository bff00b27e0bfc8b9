/* libtether configuration: parsing, environment over file, and the 0600
 * file that tether up writes. Real files in a temp HOME. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "client/tether.h"

static char home[64];

/* parse: runs the parser on a C string into a zeroed config. */
static int parse(struct tether_config *cfg, const char *text, struct tt_err *err)
{
	memset(cfg, 0, sizeof(*cfg));
	return tether_config_parse(cfg, text, strlen(text), err);
}

/* The normal file, with comments, blanks, CRLF and spaces around '='. */
static void test_parse_ok(void **state)
{
	struct tether_config cfg;
	struct tt_err err = { 0 };

	(void)state;
	assert_int_equal(parse(&cfg, "# tether\n\nurl = http://127.0.0.1:7701/\r\n"
	                             "  api_key=tk_abc\n", &err), 0);
	assert_string_equal(cfg.url, "http://127.0.0.1:7701"); /* slash dropped */
	assert_string_equal(cfg.api_key, "tk_abc");
	/* no final newline */
	assert_int_equal(parse(&cfg, "api_key=k2", &err), 0);
	assert_string_equal(cfg.api_key, "k2");
	assert_string_equal(cfg.url, "");
}

/* Malformed files are refused with a line number, never half-read. */
static void test_parse_bad(void **state)
{
	struct tether_config cfg;
	struct tt_err err = { 0 };
	char big[600];

	(void)state;
	assert_int_equal(parse(&cfg, "url=http://x\nnonsense\n", &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	assert_non_null(strstr(err.msg, "line 2"));
	assert_int_equal(parse(&cfg, "colour=blue\n", &err), -1);
	assert_non_null(strstr(err.msg, "unknown key"));
	assert_int_equal(parse(&cfg, "url=\n", &err), -1);
	assert_int_equal(tether_config_parse(&cfg, "url=a\0b\n", 8, &err), -1);
	memset(big, 'a', sizeof(big));
	memcpy(big, "url=", 4);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(parse(&cfg, big, &err), -1);
	assert_int_equal(err.code, TT_ERR_TOO_LARGE);
}

/* tether_config_write: 0600, parents created, and read back by load. */
static void test_write_and_load(void **state)
{
	struct tether_config cfg;
	struct tt_err err = { 0 };
	char path[256];
	struct stat st;

	(void)state;
	unsetenv("TETHER_URL");
	unsetenv("TETHER_API_KEY");
	assert_int_equal(tether_config_path(path, sizeof(path), &err), 0);
	/* nothing configured yet: a clear error naming the fix */
	assert_int_equal(tether_config_load(&cfg, &err), -1);
	assert_non_null(strstr(err.msg, "tether up"));

	assert_int_equal(tether_config_write(path, "http://127.0.0.1:9", "sekrit",
	                                     &err), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(tether_config_load(&cfg, &err), 0);
	assert_string_equal(cfg.url, "http://127.0.0.1:9");
	assert_string_equal(cfg.api_key, "sekrit");

	/* the environment wins over the file, field by field */
	setenv("TETHER_URL", "http://10.0.0.1:1/", 1);
	assert_int_equal(tether_config_load(&cfg, &err), 0);
	assert_string_equal(cfg.url, "http://10.0.0.1:1");
	assert_string_equal(cfg.api_key, "sekrit");
	setenv("TETHER_API_KEY", "envkey", 1);
	assert_int_equal(tether_config_load(&cfg, &err), 0);
	assert_string_equal(cfg.api_key, "envkey");
	unsetenv("TETHER_URL");
	unsetenv("TETHER_API_KEY");

	/* a broken file is reported with its path */
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("url=http://x\napi-key=oops\n", f);
	fclose(f);
	assert_int_equal(tether_config_load(&cfg, &err), -1);
	assert_non_null(strstr(err.msg, path));
}

/* A client to a closed port fails with a transport error, not a crash. */
static void test_unreachable(void **state)
{
	struct tether_config cfg = { .url = "http://127.0.0.1:1", .api_key = "k" };
	struct tt_err err = { 0 };
	struct tether *t = tether_new(&cfg, &err);
	json_t *j;

	(void)state;
	assert_non_null(t);
	j = tether_list(t, &err);
	assert_null(j);
	assert_int_equal(err.code, TT_ERR_TRANSPORT);
	assert_non_null(strstr(err.msg, "cannot reach"));
	tether_free(t);
}

/* setup: a private HOME. */
static int setup(void **state)
{
	(void)state;
	snprintf(home, sizeof(home), "/tmp/tether-client-XXXXXX");
	if (mkdtemp(home) == NULL)
		return -1;
	setenv("HOME", home, 1);
	return 0;
}

/* teardown: removes the temp HOME. */
static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", home);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_ok),
		cmocka_unit_test(test_parse_bad),
		cmocka_unit_test(test_write_and_load),
		cmocka_unit_test(test_unreachable),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}

/* lib/log.c: lines are rate-limited per call site and what is held back is
 * summarized. stderr goes to a temporary file that each test reads back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "log.h"

static int saved_stderr = -1;
static char path[] = "/tmp/tt-test-log.XXXXXX";

/* sleep_ms: nanosleep for ms milliseconds. */
static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* setup: stderr to a fresh file; a new window for every site. */
static int setup(void **state)
{
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	saved_stderr = dup(STDERR_FILENO);
	assert_true(dup2(fd, STDERR_FILENO) >= 0);
	close(fd);
	tt_log_init("test", TT_LOG_DEBUG);
	sleep_ms(TT_LOG_WINDOW_MS + 100); /* the last test's windows end */
	tt_log_flush();
	assert_int_equal(ftruncate(STDERR_FILENO, 0), 0);
	assert_true(lseek(STDERR_FILENO, 0, SEEK_SET) == 0);
	return 0;
}

/* teardown: stderr back. */
static int teardown(void **state)
{
	(void)state;
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	unlink(path);
	strcpy(path, "/tmp/tt-test-log.XXXXXX");
	return 0;
}

/* count: lines of the log so far containing needle. */
static int count(const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[2048];
	int n = 0;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL)
		if (strstr(line, needle) != NULL)
			n++;
	fclose(f);
	return n;
}

/* The same message a thousand times within a window: one line, then one
 * summary once the window is over. */
static void test_repeats_summarized(void **state)
{
	(void)state;
	for (int i = 0; i < 1000; i++)
		log_warn("refused token from %s", "10.0.0.1");
	assert_int_equal(count("refused token from 10.0.0.1"), 1);
	tt_log_flush(); /* window not over: nothing yet */
	assert_int_equal(count("repeated"), 0);
	sleep_ms(TT_LOG_WINDOW_MS + 100);
	tt_log_flush();
	assert_int_equal(count("refused token from 10.0.0.1 [… repeated 999 times in"), 1);
	/* the next window starts clean */
	log_warn("refused token from %s", "10.0.0.1");
	assert_int_equal(count("refused token from 10.0.0.1"), 3);
}

/* Varying messages from one site: TT_LOG_SITE_BURST per window, the rest
 * counted and summarized with the last one. */
static void test_varied_burst(void **state)
{
	(void)state;
	for (int i = 0; i < 100; i++)
		log_info("admission refused: sbx=%d", i);
	assert_int_equal(count("admission refused"), TT_LOG_SITE_BURST);
	sleep_ms(TT_LOG_WINDOW_MS + 100);
	log_info("something else %d", 1); /* any log call writes due summaries */
	assert_int_equal(count("admission refused: sbx=99 [… and 90 lines like it in"), 1);
	assert_int_equal(count("something else 1"), 1);
}

/* One site's flood does not hold back another site's lines; a single held
 * line is written as itself. */
static void test_sites_independent(void **state)
{
	(void)state;
	for (int i = 0; i < 50; i++)
		log_error("flood %d", 7);
	log_info("other site %s", "a");
	log_info("other site %s", "b");
	assert_int_equal(count("other site a"), 1);
	assert_int_equal(count("other site b"), 1);
	log_debug("once more %d", 1);
	log_debug("once more %d", 1); /* held: a repeat */
	sleep_ms(TT_LOG_WINDOW_MS + 100);
	tt_log_flush();
	assert_int_equal(count("once more 1"), 2); /* the held one, as itself */
	assert_int_equal(count("once more 1 ["), 0);
	assert_int_equal(count("flood 7 [… repeated 49 times"), 1);
}

/* Lines below the level are neither written nor counted. */
static void test_level(void **state)
{
	(void)state;
	tt_log_init("test", TT_LOG_WARN);
	for (int i = 0; i < 20; i++)
		log_info("quiet %d", i);
	log_warn("loud %d", 1);
	sleep_ms(TT_LOG_WINDOW_MS + 100);
	tt_log_flush();
	assert_int_equal(count("quiet"), 0);
	assert_int_equal(count("loud 1"), 1);
	assert_int_equal(count("test["), 1);
}

/* Log lines carry an RFC 3339 time with a date; access records are JSON
 * lines with ts and role first, bounded per second, and the next line
 * after a drop says how many were dropped. */
static void test_access_lines(void **state)
{
	static const char rec[] = "{\"rid\":\"r1\",\"status\":200}";
	FILE *f;
	char line[2048];
	int n = 0;

	(void)state;
	log_info("dated %d", 1);
	for (int i = 0; i < TT_LOG_ACCESS_BURST + 5; i++)
		tt_log_access(rec, sizeof(rec) - 1);
	assert_int_equal(count("\"rid\":\"r1\""), TT_LOG_ACCESS_BURST);
	sleep_ms(TT_LOG_WINDOW_MS + 100);
	tt_log_access("{}", 2);
	assert_int_equal(count("\"dropped_before\":5}"), 1);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		if (n++ == 0) { /* "2026-12-02T00:50:56.123Z test[pid] info: dated 1" */
			assert_int_equal(strlen(line) > 25, 1);
			assert_true(line[4] == '-' && line[7] == '-' && line[10] == 'T' &&
			            line[13] == ':' && line[19] == '.' && line[23] == 'Z');
			assert_non_null(strstr(line, " test["));
		} else {
			assert_int_equal(strncmp(line, "{\"ts\":\"", 7), 0);
			assert_true(line[11] == '-' && line[30] == 'Z');
			assert_non_null(strstr(line, "Z\",\"role\":\"test\","));
		}
	}
	fclose(f);
	assert_int_equal(n, TT_LOG_ACCESS_BURST + 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_repeats_summarized, setup, teardown),
		cmocka_unit_test_setup_teardown(test_varied_burst, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sites_independent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_level, setup, teardown),
		cmocka_unit_test_setup_teardown(test_access_lines, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

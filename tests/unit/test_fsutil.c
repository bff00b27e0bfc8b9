/* lib/fsutil: fsutil_read_to_eof on real pipes (what a spare bridge and a
 * spare agent read their assignment with): nothing, short, exactly the
 * bound, one byte over it, and a writer that sends in pieces. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fsutil.h"

/* filled_pipe: a pipe holding len bytes of 'x' and then EOF; the read end. */
static int filled_pipe(size_t len)
{
	char bytes[256];
	int p[2];

	assert_true(len <= sizeof(bytes));
	memset(bytes, 'x', sizeof(bytes));
	assert_int_equal(pipe(p), 0);
	assert_int_equal(write(p[1], bytes, len), (ssize_t)len);
	close(p[1]);
	return p[0];
}

/* test_bounds: EOF at once, short, exactly cap, cap + 1 (EFBIG). */
static void test_bounds(void **state)
{
	char buf[64];
	int fd;

	(void)state;
	fd = filled_pipe(0);
	assert_int_equal(fsutil_read_to_eof(fd, buf, sizeof(buf)), 0);
	close(fd);
	fd = filled_pipe(10);
	assert_int_equal(fsutil_read_to_eof(fd, buf, sizeof(buf)), 10);
	close(fd);
	fd = filled_pipe(sizeof(buf));
	assert_int_equal(fsutil_read_to_eof(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	close(fd);
	fd = filled_pipe(sizeof(buf) + 1);
	errno = 0;
	assert_int_equal(fsutil_read_to_eof(fd, buf, sizeof(buf)), -1);
	assert_int_equal(errno, EFBIG);
	close(fd);
}

/* test_pieces: a writer that sends 3 pieces apart: all of them, in order. */
static void test_pieces(void **state)
{
	char buf[64] = { 0 };
	int p[2];
	pid_t w;

	(void)state;
	assert_int_equal(pipe(p), 0);
	w = fork();
	assert_true(w >= 0);
	if (w == 0) {
		close(p[0]);
		for (const char *s = "ab"; *s; s++) {
			(void)!write(p[1], s, 1);
			usleep(20000);
		}
		(void)!write(p[1], "c", 1);
		_exit(0);
	}
	close(p[1]);
	assert_int_equal(fsutil_read_to_eof(p[0], buf, sizeof(buf)), 3);
	assert_string_equal(buf, "abc");
	close(p[0]);
	waitpid(w, NULL, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bounds),
		cmocka_unit_test(test_pieces),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

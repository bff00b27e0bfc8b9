/* lib/curlonce: a state-changing request on a reused keep-alive connection
 * that dies before the answer is never sent twice by libcurl. A real TCP
 * server (a child process) answers the first request, then reads the whole
 * second one and closes without a byte of answer, as a node-api killed
 * mid-operation would; it reports every request it read. The control case
 * shows plain CURLOPT_POSTFIELDS being resent, so the test can fail. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "curlonce.h"

#define BODY "{\"cmd\":[\"sh\",\"-c\",\"echo x >> /tmp/once\"]}"

/* read_request: one whole request (headers + Content-Length body) from
 * fd; 1, or 0 at EOF before one. */
static int read_request(int fd)
{
	char buf[8192];
	size_t have = 0;
	char *end;
	long clen = 0;

	for (;;) {
		ssize_t n;

		buf[have] = '\0';
		end = strstr(buf, "\r\n\r\n");
		if (end != NULL) {
			char *cl = strcasestr(buf, "Content-Length:");

			if (cl != NULL && cl < end)
				clen = strtol(cl + 15, NULL, 10);
			if ((size_t)(end + 4 - buf) + (size_t)clen <= have)
				return 1;
		}
		if (have + 1 >= sizeof(buf))
			return 0;
		n = read(fd, buf + have, sizeof(buf) - 1 - have);
		if (n <= 0)
			return 0;
		have += (size_t)n;
	}
}

/* serve: the first request on a connection is answered (keep-alive), the
 * second is read whole and the connection closed unanswered; every request
 * read is reported as one byte on report. die: the server then exits
 * (and stops listening) before closing, like a killed node-api. */
static void serve(int lfd, int report, int die)
{
	const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

	for (;;) {
		int c = accept(lfd, NULL, NULL);
		int n = 0;

		if (c < 0)
			_exit(0);
		while (read_request(c)) {
			(void)!write(report, "r", 1);
			if (n++ == 0) {
				(void)!write(c, ok, sizeof(ok) - 1);
				continue;
			}
			if (die) {
				close(lfd);
				_exit(0);
			}
			break; /* "killed" mid-operation */
		}
		close(c);
	}
}

/* discard: the answers' bodies are not looked at. */
static size_t discard(char *p, size_t size, size_t n, void *arg)
{
	(void)p;
	(void)arg;
	return size * n;
}

/* run: two POSTs on one curl handle (the second on the reused
 * connection); once: the second body through curlonce; die: see serve.
 * Returns the requests the server read; *rc2: the second transfer's
 * result; *sent: curlonce_sent of the second body. */
static int run(int once, int die, CURLcode *rc2, int *sent)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof(sa);
	struct curlonce_body b;
	int lfd = socket(AF_INET, SOCK_STREAM, 0), rep[2], count = 0;
	char url[64], c;
	pid_t pid;
	CURL *e;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 8), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &len), 0);
	assert_int_equal(pipe(rep), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(rep[0]);
		serve(lfd, rep[1], die);
	}
	close(lfd);
	close(rep[1]);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/exec", ntohs(sa.sin_port));
	e = curl_easy_init();
	assert_non_null(e);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
	curlonce_post(e, &b, BODY, strlen(BODY));
	assert_int_equal(curl_easy_perform(e), CURLE_OK);
	if (once) {
		curlonce_post(e, &b, BODY, strlen(BODY));
	} else {
		curl_easy_reset(e);
		curl_easy_setopt(e, CURLOPT_URL, url);
		curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, BODY);
	}
	*rc2 = curl_easy_perform(e);
	*sent = curlonce_sent(&b);
	curl_easy_cleanup(e);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	while (read(rep[0], &c, 1) == 1)
		count++;
	close(rep[0]);
	return count;
}

/* test_control_resent: plain POSTFIELDS on the reused connection is sent
 * again by libcurl on a new one: the hazard this module exists for. */
static void test_control_resent(void **state)
{
	CURLcode rc2;
	int sent;

	(void)state;
	/* first + the killed second + curl's silent resend of it */
	assert_int_equal(run(0, 0, &rc2, &sent), 3);
}

/* test_once_not_resent: through curlonce, the same second request reaches
 * the server once, and the caller gets an error instead of a resend. The
 * first request shows the honest path works on the same handle. */
static void test_once_not_resent(void **state)
{
	CURLcode rc2;
	int sent;

	(void)state;
	assert_int_equal(run(1, 0, &rc2, &sent), 2);
	assert_int_not_equal(rc2, CURLE_OK);
	assert_true(sent);
}

/* test_once_dead_server: the server dies with the second request: curl's
 * own retry then fails to connect and says so (COULDNT_CONNECT), although
 * the request went out: curlonce_sent tells the truth. */
static void test_once_dead_server(void **state)
{
	CURLcode rc2;
	int sent;

	(void)state;
	assert_int_equal(run(1, 1, &rc2, &sent), 2);
	assert_int_equal(rc2, CURLE_COULDNT_CONNECT);
	assert_true(sent);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_control_resent),
		cmocka_unit_test(test_once_not_resent),
		cmocka_unit_test(test_once_dead_server),
	};

	signal(SIGPIPE, SIG_IGN);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	return cmocka_run_group_tests(tests, NULL, NULL);
}

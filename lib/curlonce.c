/* Request bodies libcurl can send at most once (see curlonce.h). */
#include "curlonce.h"

/* curlonce_prereq: CURLOPT_PREREQFUNCTION, called right before each
 * attempt's request is sent: only the first may go. */
static int curlonce_prereq(void *arg, char *primary_ip, char *local_ip,
                           int primary_port, int local_port)
{
	struct curlonce_body *b = arg;

	(void)primary_ip;
	(void)local_ip;
	(void)primary_port;
	(void)local_port;
	return b->attempts++ == 0 ? CURL_PREREQFUNC_OK : CURL_PREREQFUNC_ABORT;
}

/* curlonce_seek: a rewind is exactly what must not happen. */
static int curlonce_seek(void *arg, curl_off_t offset, int origin)
{
	(void)arg;
	(void)offset;
	(void)origin;
	return CURL_SEEKFUNC_CANTSEEK;
}

/* curlonce_post: a POST whose body curl sends from memory, at most once. */
void curlonce_post(CURL *e, struct curlonce_body *b, const char *buf, size_t len)
{
	b->buf = buf != NULL ? buf : "";
	b->len = buf != NULL ? len : 0;
	b->attempts = 0;
	curl_easy_setopt(e, CURLOPT_POST, 1L);
	curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b->len);
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, b->buf);
	curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, curlonce_prereq);
	curl_easy_setopt(e, CURLOPT_PREREQDATA, b);
}

/* curlonce_forbid_rewind: the seek callback refuses every rewind. */
void curlonce_forbid_rewind(CURL *e)
{
	curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, curlonce_seek);
	curl_easy_setopt(e, CURLOPT_SEEKDATA, NULL);
}

/* curlonce_sent: curl was about to send the request at least once. */
int curlonce_sent(const struct curlonce_body *b)
{
	return b->attempts > 0;
}

/* Request bodies libcurl can send at most once (see curlonce.h). */
#include "curlonce.h"

#include <string.h>

/* curlonce_read: CURLOPT_READFUNCTION over the memory body. */
static size_t curlonce_read(char *dst, size_t size, size_t nitems, void *arg)
{
	struct curlonce_body *b = arg;
	size_t want = size * nitems;

	if (want > b->len - b->off)
		want = b->len - b->off;
	memcpy(dst, b->buf + b->off, want);
	b->off += want;
	return want;
}

/* curlonce_seek: a rewind is exactly what must not happen. */
static int curlonce_seek(void *arg, curl_off_t offset, int origin)
{
	(void)arg;
	(void)offset;
	(void)origin;
	return CURL_SEEKFUNC_CANTSEEK;
}

/* curlonce_post: a POST whose body is read once from memory. */
void curlonce_post(CURL *e, struct curlonce_body *b, const char *buf, size_t len)
{
	b->buf = buf != NULL ? buf : "";
	b->len = buf != NULL ? len : 0;
	b->off = 0;
	curl_easy_setopt(e, CURLOPT_POST, 1L);
	curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)b->len);
	curl_easy_setopt(e, CURLOPT_READFUNCTION, curlonce_read);
	curl_easy_setopt(e, CURLOPT_READDATA, b);
	curlonce_forbid_rewind(e);
}

/* curlonce_forbid_rewind: the seek callback refuses every rewind. */
void curlonce_forbid_rewind(CURL *e)
{
	curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, curlonce_seek);
	curl_easy_setopt(e, CURLOPT_SEEKDATA, NULL);
}

/* curlonce_sent: the read callback handed out at least one byte. */
int curlonce_sent(const struct curlonce_body *b)
{
	return b->off > 0;
}

/* Request bodies libcurl can send at most once.
 *
 * libcurl silently resends a request whose reused keep-alive connection
 * died before any answer byte, rewinding the body first (lib/transfer.c,
 * Curl_retry_request). For a request that changes state (exec, a write, a
 * create) the first copy may already have run on the far side, so a resend
 * would run it twice. A whole body given to curlonce_post goes out with
 * the headers in one send (CURLOPT_POSTFIELDS: one segment, one wake-up of
 * the far side, where a read callback made two) and a pre-request callback
 * that aborts every attempt after the first: such a retry then fails with
 * CURLE_ABORTED_BY_CALLBACK instead, and the request can travel on a
 * reused connection. A body read through a callback gets a seek callback
 * that refuses to rewind (curlonce_forbid_rewind): the retry fails with
 * CURLE_SEND_FAIL_REWIND. (A request without a body has nothing to rewind:
 * give it CURLOPT_FRESH_CONNECT instead.) Implementation: lib/curlonce.c. */
#ifndef TT_CURLONCE_H
#define TT_CURLONCE_H

#include <curl/curl.h>
#include <stddef.h>

/* A body in memory; buf is the caller's and must outlive the transfer
 * (curl sends it from there). */
struct curlonce_body {
	const char *buf;
	size_t len;
	unsigned attempts; /* requests curl was about to send */
};

/* curlonce_post: e sends b (len bytes from buf) as a POST body (set
 * CURLOPT_CUSTOMREQUEST afterwards for another method), never rewound. */
void curlonce_post(CURL *e, struct curlonce_body *b, const char *buf, size_t len);
/* curlonce_sent: the request went out to a connection. Ask this, not
 * the CURLcode, whether the request may have reached the far side: after
 * an internal retry (see above) curl reports the retry's own failure,
 * e.g. CURLE_COULDNT_CONNECT for a request the first connection carried. */
int curlonce_sent(const struct curlonce_body *b);
/* curlonce_forbid_rewind: for a body e already reads through its own
 * CURLOPT_READFUNCTION: no rewind either. */
void curlonce_forbid_rewind(CURL *e);

#endif

/* libuv plumbing shared by the sbx-manager and the host bridge (see
 * uvutil.h). */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "relay.h"
#include "uvutil.h"

/* uvutil_listen: bound under umask 077 so the socket is never reachable
 * by others, not even between bind and chmod. */
int uvutil_listen(uv_loop_t *loop, uv_pipe_t *server, const char *path, int backlog,
                  uv_connection_cb cb, void *data, struct tt_err *err)
{
	mode_t old;
	int rc;

	unlink(path);
	uv_pipe_init(loop, server, 0);
	server->data = data;
	old = umask(077);
	rc = uv_pipe_bind(server, path);
	umask(old);
	if (rc == 0)
		rc = chmod(path, 0600) < 0 ? -errno : 0;
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)server, backlog, cb);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_IO, "listen on %s: %s", path, uv_strerror(rc));
	return 0;
}

/* uvutil_accept: a failed accept frees what it allocated. */
uv_pipe_t *uvutil_accept(uv_stream_t *server, uv_loop_t *loop)
{
	uv_pipe_t *p = malloc(sizeof(*p));

	if (p == NULL || uv_pipe_init(loop, p, 0) < 0) {
		free(p);
		return NULL;
	}
	if (uv_accept(server, (uv_stream_t *)p) < 0) {
		relay_close_free((uv_stream_t *)p);
		return NULL;
	}
	return p;
}

/* uvutil_signals_start: both handles get data, so cb finds its owner. */
void uvutil_signals_start(uv_loop_t *loop, uv_signal_t *term, uv_signal_t *intr,
                          uv_signal_cb cb, void *data)
{
	uv_signal_init(loop, term);
	uv_signal_init(loop, intr);
	term->data = data;
	intr->data = data;
	uv_signal_start(term, cb, SIGTERM);
	uv_signal_start(intr, cb, SIGINT);
}

/* uvutil_first_request: the reader is bounded (wire.h), so a peer can
 * neither grow a frame past WIRE_PAYLOAD_MAX nor skip the REQUEST. */
enum uvutil_req uvutil_first_request(uv_stream_t *s, struct wire_reader *rd,
                                     const uint8_t *buf, ssize_t nread,
                                     struct wire_frame *f, uint8_t **pending,
                                     size_t *pending_len, struct tt_err *err)
{
	size_t used = 0;
	int rc;

	if (nread == 0)
		return UVUTIL_REQ_MORE;
	if (nread < 0) { /* closed before a whole REQUEST */
		uv_read_stop(s);
		return UVUTIL_REQ_CLOSED;
	}
	rc = wire_reader_feed(rd, buf, (size_t)nread, &used, f, err);
	if (rc == 0)
		return UVUTIL_REQ_MORE;
	uv_read_stop(s);
	if (rc < 0)
		return UVUTIL_REQ_BAD;
	if (f->type != WIRE_REQUEST) {
		tt_err_set(err, TT_ERR_MALFORMED, "first frame is not a REQUEST");
		return UVUTIL_REQ_BAD;
	}
	if ((size_t)nread > used) {
		*pending_len = (size_t)nread - used;
		*pending = malloc(*pending_len);
		if (*pending == NULL) {
			*pending_len = 0;
			return UVUTIL_REQ_NOMEM;
		}
		memcpy(*pending, buf + used, *pending_len);
	}
	return UVUTIL_REQ_READY;
}

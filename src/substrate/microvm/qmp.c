/* QMP client: see qmp.h. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "substrate/microvm/qmp.h"
#include "unixaddr.h"

/* qmp_parse_line: see qmp.h. */
json_t *qmp_parse_line(const char *line, size_t len, struct tt_err *err)
{
	json_error_t je;
	json_t *o;

	if (len == 0 || len >= QMP_LINE_MAX) {
		tt_err_set(err, TT_ERR_MALFORMED, "qmp: line of %zu bytes", len);
		return NULL;
	}
	o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
	if (o == NULL || !json_is_object(o)) {
		json_decref(o);
		tt_err_set(err, TT_ERR_MALFORMED, "qmp: not a JSON object: %.80s", je.text);
		return NULL;
	}
	return o;
}

/* qmp_read: the next line from QEMU as an object (blocking, bounded). */
static json_t *qmp_read(struct qmp *q, struct tt_err *err)
{
	for (;;) {
		char *nl = memchr(q->buf, '\n', q->len);
		ssize_t n;

		if (nl != NULL) {
			size_t llen = (size_t)(nl - q->buf);
			json_t *o;

			while (llen > 0 && q->buf[llen - 1] == '\r')
				llen--;
			o = llen ? qmp_parse_line(q->buf, llen, err) : NULL;
			memmove(q->buf, nl + 1, q->len - (size_t)(nl + 1 - q->buf));
			q->len -= (size_t)(nl + 1 - q->buf);
			if (llen == 0)
				continue;
			return o;
		}
		if (q->len == sizeof(q->buf)) {
			tt_err_set(err, TT_ERR_TOO_LARGE, "qmp: line over %d bytes", QMP_LINE_MAX);
			return NULL;
		}
		n = recv(q->fd, q->buf + q->len, sizeof(q->buf) - q->len, 0);
		if (n <= 0) {
			if (n < 0 && errno == EINTR)
				continue;
			tt_err_set(err, TT_ERR_IO, "qmp: %s", n == 0 ? "QEMU closed the connection"
			           : strerror(errno));
			return NULL;
		}
		q->len += (size_t)n;
	}
}

/* qmp_send: one command line, with fd attached when >= 0. */
static int qmp_send(struct qmp *q, const char *cmd, int fd, struct tt_err *err)
{
	char nl = '\n';
	struct iovec iov[2] = { { (void *)cmd, strlen(cmd) }, { &nl, 1 } };
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
	ssize_t n;

	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	do
		n = sendmsg(q->fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)(strlen(cmd) + 1))
		return tt_err_sys(err, TT_ERR_IO, "qmp: send");
	return 0;
}

/* qmp_cmd: see qmp.h. */
int qmp_cmd(struct qmp *q, const char *cmd, int fd, json_t **ret, struct tt_err *err)
{
	if (ret)
		*ret = NULL;
	if (qmp_send(q, cmd, fd, err) < 0)
		return -1;
	for (;;) {
		json_t *o = qmp_read(q, err), *r, *e;

		if (o == NULL)
			return -1;
		r = json_object_get(o, "return");
		e = json_object_get(o, "error");
		if (r != NULL) {
			if (ret)
				*ret = json_incref(r);
			json_decref(o);
			return 0;
		}
		if (e != NULL) {
			const char *d = json_string_value(json_object_get(e, "desc"));

			tt_err_set(err, TT_ERR_IO, "qmp: %.200s", d ? d : "error");
			json_decref(o);
			return -1;
		}
		json_decref(o); /* an event */
	}
}

/* qmp_open: see qmp.h. */
int qmp_open(struct qmp *q, const char *path, int timeout_ms, struct tt_err *err)
{
	json_t *g;

	q->len = 0;
	q->fd = unixaddr_connect(path, timeout_ms, err);
	if (q->fd < 0)
		return -1;
	g = qmp_read(q, err);
	if (g == NULL || json_object_get(g, "QMP") == NULL) {
		json_decref(g);
		qmp_close(q);
		return g ? tt_err_set(err, TT_ERR_MALFORMED, "qmp: no greeting") : -1;
	}
	json_decref(g);
	if (qmp_cmd(q, "{\"execute\":\"qmp_capabilities\"}", -1, NULL, err) < 0) {
		qmp_close(q);
		return -1;
	}
	return 0;
}

/* qmp_close: see qmp.h. */
void qmp_close(struct qmp *q)
{
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
}

/* A small, blocking QMP client (QEMU's machine protocol: one JSON object
 * per line) for the sbx-manager's control of its VMs: the greeting and
 * capabilities handshake, commands with their answers (events skipped),
 * and getfd (an fd passed with SCM_RIGHTS). Every read is bounded in size
 * and time. The line decoder is fuzzed (fuzz/fuzz_qmp.c). */
#ifndef TT_MICROVM_QMP_H
#define TT_MICROVM_QMP_H

#include <jansson.h>
#include <stddef.h>

#include "err.h"

#define QMP_LINE_MAX 65536

struct qmp {
	int fd;
	size_t len;
	char buf[QMP_LINE_MAX];
};

/* qmp_parse_line: one QMP line (without its newline) as a JSON object
 * (duplicate keys refused); NULL + err for anything else. */
json_t *qmp_parse_line(const char *line, size_t len, struct tt_err *err);
/* qmp_open: connects to path, reads the greeting, negotiates
 * capabilities; every later exchange is bounded by timeout_ms. */
int qmp_open(struct qmp *q, const char *path, int timeout_ms, struct tt_err *err);
/* qmp_cmd: sends cmd (a JSON object text) and waits for its answer: 0
 * with *ret (the "return" member, a new reference; ret may be NULL), -1
 * with err (QEMU's "error" description, or the transport's). With fd >= 0
 * the fd travels with the command (SCM_RIGHTS; for getfd). */
int qmp_cmd(struct qmp *q, const char *cmd, int fd, json_t **ret, struct tt_err *err);
/* qmp_close: closes the connection. */
void qmp_close(struct qmp *q);

#endif

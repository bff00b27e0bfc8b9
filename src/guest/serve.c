/* One connection, operations in sequence (notes: seq.md): after the
 * handshake, read a REQUEST, dispatch on "op", repeat until EOF, a protocol
 * violation or the idle bound. Every op ends with RESULT or ERROR, or the
 * connection closes: the opener must never wait for a terminal frame while
 * this handler waits for the next REQUEST. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>

#include "cleanup.h"
#include "guest/guest.h"
#include "hello.h"
#include "wireop.h"
#include "log.h"
#include "wire_json.h"

/* A peer must send its first REQUEST within this time; later phases
 * (stdin, file content) are paced by the peer. */
#define GUEST_REQUEST_TIMEOUT_S 30
/* The bridge sends its HELLO right after connecting. */
#define GUEST_HELLO_TIMEOUT_S 5

/* guest_errno_code: the wire error code for an errno from a file operation. */
enum wire_code guest_errno_code(int e)
{
	switch (e) {
	case ENOENT: return WIRE_E_NOT_FOUND;
	case ENOTDIR: return WIRE_E_NOT_DIR;
	case EISDIR: return WIRE_E_IS_DIR;
	case EEXIST:
	case ENOTEMPTY: return WIRE_E_EXISTS;
	case EACCES:
	case EPERM:
	case EROFS: return WIRE_E_PERMISSION;
	case ELOOP:
	case EXDEV:
	case ENAMETOOLONG:
	case EINVAL: return WIRE_E_PATH_INVALID;
	case EFBIG: return WIRE_E_TOO_LARGE;
	case ENOSPC: /* the sandbox's own disk or inode cap (its layer) */
	case EDQUOT: return WIRE_E_NO_SPACE;
	default: return WIRE_E_INTERNAL;
	}
}

/* guest_send_errno: sends ERROR for errno e ("what: strerror"). */
int guest_send_errno(int conn, int e, const char *what)
{
	return wire_send_error(conn, guest_errno_code(e), "%s: %s", what, strerror(e));
}

/* guest_result: adds the generation and sends RESULT; steals obj. When
 * the RESULT cannot be built or serialized (nothing written yet), an
 * ERROR ends the operation instead. */
int guest_result(const struct guest_ctx *g, int conn, json_t *obj)
{
	struct tt_err err = { 0 };
	int rc;

	if (obj == NULL)
		return wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
	json_object_set_new(obj, "generation", json_integer((json_int_t)g->gen));
	rc = wire_send_json(conn, WIRE_RESULT, obj, &err);
	if (rc < 0 && err.code == TT_ERR_TOO_LARGE)
		rc = wire_send_error(conn, WIRE_E_TOO_LARGE, "result does not fit one frame");
	else if (rc < 0 && err.code == TT_ERR_NOMEM)
		rc = wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
	json_decref(obj);
	return rc;
}

/* guest_req_path: extracts and validates "path"; on NULL, *rc is the
 * result of sending the ERROR. */
const char *guest_req_path(int conn, json_t *req, int *rc)
{
	json_t *p = json_object_get(req, "path");
	struct tt_err err = { 0 };

	if (!json_is_string(p)) {
		*rc = wire_send_error(conn, WIRE_E_BAD_REQUEST, "\"path\" (string) is required");
		return NULL;
	}
	if (path_check(json_string_value(p), json_string_length(p), &err) < 0) {
		*rc = wire_send_error(conn, WIRE_E_PATH_INVALID, "%s", err.msg);
		return NULL;
	}
	*rc = 0;
	return json_string_value(p);
}

/* set_rcvtimeo: bounds (or, with 0, unbounds) blocking reads on conn. */
static void set_rcvtimeo(int conn, int seconds)
{
	struct timeval tv = { .tv_sec = seconds };

	(void)setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

/* The data operations the agent runs (lib/wireop.h), by operation. */
static int (*const guest_ops[WIRE_OP_COUNT])(const struct guest_ctx *, int, json_t *) = {
	[WIRE_OP_EXEC] = exec_run,
	[WIRE_OP_FS_READ] = fs_read,
	[WIRE_OP_FS_WRITE] = fs_write,
	[WIRE_OP_FS_STAT] = fs_stat,
	[WIRE_OP_FS_LIST] = fs_list,
	[WIRE_OP_FS_MKDIR] = fs_mkdir,
	[WIRE_OP_FS_REMOVE] = fs_remove,
};

/* guest_handshake: the first frame must be the bridge's HELLO naming this
 * very activation; answers it with the proof (hello.h). Anything else gets
 * an ERROR and -1: no operation byte is read before this succeeds. */
static int guest_handshake(const struct guest_ctx *g, int conn, uint8_t *buf)
{
	uint8_t proof[HELLO_PROOF_LEN];
	struct hello_challenge hc;
	struct tt_err err = { 0 };
	struct wire_frame f;
	json_t *hello, *ans;
	int rc;

	/* In a sandbox (the agent is its PID 1), the only legitimate peer is the
	 * host bridge, which lives outside our pid namespace and so shows as pid 0. A peer
	 * with a pid here is a sandbox process: answering it would make the
	 * agent an oracle for proofs of the activation secret. */
	if (g->is_init) {
		struct ucred cr;
		socklen_t crlen = sizeof(cr);

		if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0 ||
		    cr.pid != 0) {
			log_warn("refused a connection from inside the sandbox");
			wire_send_error(conn, WIRE_E_PEER_REFUSED,
			                "the agent answers only the host bridge");
			return -1;
		}
	}
	set_rcvtimeo(conn, GUEST_HELLO_TIMEOUT_S);
	rc = wire_recv(conn, &f, buf, WIRE_PAYLOAD_MAX + 1, &err);
	set_rcvtimeo(conn, 0);
	if (rc == 0)
		return -1;
	if (rc < 0) {
		log_warn("refused a connection: %s", err.msg);
		wire_send_error(conn, err.code == TT_ERR_TOO_LARGE ? WIRE_E_TOO_LARGE : WIRE_E_BAD_REQUEST,
		                "%s", err.msg);
		return -1;
	}
	if (f.type != WIRE_HELLO) {
		log_warn("refused a connection: %s before the handshake", wire_type_name(f.type));
		wire_send_error(conn, WIRE_E_HANDSHAKE_REQUIRED,
		                "expected HELLO before any operation, got %s",
		                wire_type_name(f.type));
		return -1;
	}
	hello = wire_frame_json(&f, &err);
	if (hello == NULL) {
		wire_send_error(conn, WIRE_E_BAD_REQUEST, "%s", err.msg);
		return -1;
	}
	if (hello_challenge_parse(hello, &hc) < 0) {
		json_decref(hello);
		wire_send_error(conn, WIRE_E_BAD_REQUEST, "malformed HELLO");
		return -1;
	}
	if (strcmp(hc.sbx, g->sbx) != 0 || hc.gen != g->gen || hc.att != g->att) {
		json_decref(hello);
		log_warn("refused a handshake for another activation");
		wire_send_error(conn, WIRE_E_WRONG_ACTIVATION,
		                "this agent serves another execution or activation");
		return -1;
	}
	json_decref(hello);
	if (g->secret == NULL) {
		wire_send_error(conn, WIRE_E_NO_SECRET, "agent started without an activation secret");
		return -1;
	}
	hello_proof(g->secret, g->sbx, g->gen, g->att, hc.challenge, proof);
	/* This handler needs the secret no more. */
	sodium_memzero(g->secret, HELLO_SECRET_LEN);
	ans = hello_proof_json(proof);
	rc = ans ? wire_send_json(conn, WIRE_HELLO, ans, &err) : -1;
	json_decref(ans);
	return rc;
}

/* serve_next: waits for the next REQUEST (first: the one after the
 * handshake; else between operations, where stray DATA_IN / EOF_IN the
 * last operation did not consume are discarded). Returns 1 with *req (a
 * new reference), 0 to end quietly (EOF, idle bound), -1 to close after
 * an ERROR where the peer still listens. */
static int serve_next(const struct guest_ctx *g, int conn, uint8_t *buf, bool first,
                      json_t **req)
{
	struct tt_err err = { 0 };
	struct wire_frame f;
	int rc, e;

	set_rcvtimeo(conn, first ? GUEST_REQUEST_TIMEOUT_S : (int)g->idle_timeout_s);
	do {
		rc = wire_recv(conn, &f, buf, WIRE_PAYLOAD_MAX + 1, &err);
	} while (rc == 1 && !first &&
	         (f.type == WIRE_DATA_IN || f.type == WIRE_EOF_IN));
	e = errno;
	set_rcvtimeo(conn, 0);
	if (rc == 0)
		return 0;
	if (rc < 0) {
		if (!first && err.code == TT_ERR_TRANSPORT &&
		    (e == EAGAIN || e == EWOULDBLOCK))
			return 0; /* idle too long: the opener forgot us */
		log_warn("closing a connection: %s", err.msg);
		wire_send_error(conn, err.code == TT_ERR_TOO_LARGE ? WIRE_E_TOO_LARGE
		                                                   : WIRE_E_BAD_REQUEST,
		                "%s", err.msg);
		return -1;
	}
	if (f.type != WIRE_REQUEST) {
		wire_send_error(conn, WIRE_E_BAD_REQUEST, "expected REQUEST, got %s",
		                wire_type_name(f.type));
		return -1;
	}
	*req = wire_frame_json(&f, &err);
	if (*req == NULL) {
		wire_send_error(conn, WIRE_E_BAD_REQUEST, "%s", err.msg);
		return -1;
	}
	return 1;
}

/* serve_op: runs the operation req names. 0 when it ended with RESULT or
 * ERROR sent (the connection may carry the next one), -1 when the
 * connection must close. */
static int serve_op(const struct guest_ctx *g, int conn, json_t *req)
{
	json_t *op = json_object_get(req, "op");
	enum wire_op wop;

	/* A well-formed frame with an unusable request is the request's
	 * failure, not the connection's: ERROR, and the next one may follow. */
	if (!json_is_string(op))
		return wire_send_error(conn, WIRE_E_BAD_REQUEST, "\"op\" (string) is required");
	wop = wireop_parse(json_string_value(op));
	if (guest_ops[wop] != NULL)
		return guest_ops[wop](g, conn, req);
	return wire_send_error(conn, WIRE_E_BAD_REQUEST, "unknown op");
}

/* guest_serve: the handshake once, then operations in sequence until EOF,
 * a protocol violation (ERROR where the peer still listens, then close),
 * a failed send, or the idle bound. */
void guest_serve(const struct guest_ctx *g, int conn)
{
	_cleanup_free_ uint8_t *buf = malloc(WIRE_PAYLOAD_MAX + 1);

	if (buf == NULL) {
		wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
		return;
	}
	if (guest_handshake(g, conn, buf) < 0)
		return;
	for (bool first = true;; first = false) {
		json_t *req = NULL;
		int rc = serve_next(g, conn, buf, first, &req);

		if (rc <= 0)
			return;
		rc = serve_op(g, conn, req);
		json_decref(req);
		if (rc < 0)
			return;
		/* Collect any child an operation left exited (exec reaps its
		 * own; this keeps a long-lived handler free of zombies). */
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	}
}

/* tether-guest: the in-sandbox agent. One process per connection runs the
 * handshake once, then serves operations in sequence on that connection
 * (guest_serve, contract in notes/seq.md); exec and file operations are in
 * exec.c / fs.c, path resolution confined to the root in path.c.
 *
 * Every operation function returns 0 when the operation ended with a
 * RESULT or ERROR that was sent in full (the connection may carry the next
 * operation), or -1 when the connection must close now (peer gone, a send
 * failed, a protocol violation, nothing could be answered). It never
 * returns 0 without a terminal frame sent: the opener would then wait for
 * one while the handler waits for the next REQUEST. */
#ifndef TT_GUEST_H
#define TT_GUEST_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "wire.h"
#include "wirecode.h"

#define GUEST_PATH_MAX 4096
#define GUEST_LIST_MAX 10000
#define GUEST_IDLE_TIMEOUT_DEFAULT_S 600
/* A spare agent's assignment (main.c, assign.c): the 32-byte secret, then
 * the sandbox id, generation and activation as NUL-terminated words. */
#define GUEST_ASSIGN_MAX 256

struct guest_assignment {
	char sbx[65];        /* 1-64 chars of [A-Za-z0-9_-] */
	uint64_t gen;        /* >= 1 */
	uint32_t att;
	uint8_t secret[32];
};

/* guest_assignment_parse: buf[0..len) as an assignment into out; 0, or -1
 * (err says why; out unspecified). Fuzzed: fuzz/fuzz_guest_assign.c. */
int guest_assignment_parse(const uint8_t *buf, size_t len, struct guest_assignment *out,
                           struct tt_err *err);
/* guest_parse_u64: strict decimal at most max; 0 or -1. */
int guest_parse_u64(const char *s, uint64_t max, uint64_t *out);

/* Per-process settings, fixed at start-up. */
struct guest_ctx {
	int root_fd;      /* O_PATH dirfd of the root every path resolves in */
	uint64_t gen;     /* generation reported in every RESULT */
	uint32_t att;
	const char *sbx;
	/* The per-activation secret (HELLO_SECRET_LEN bytes, memory only), or
	 * NULL when the agent was started without one: then every connection
	 * is refused, since no handshake can succeed. Each handler zeroes its
	 * copy once it has answered the challenge. */
	uint8_t *secret;
	/* The agent runs as PID 1 of its own pid namespace (a sandbox): the host
	 * bridge, outside that namespace, is then the only peer with pid 0. */
	bool is_init;
	/* Seconds a connection may stay idle between operations before its
	 * handler closes it (--idle-timeout; the host pools idle connections
	 * for 30 s at most, so this only bounds handlers an opener forgot). */
	unsigned idle_timeout_s;
};

/* guest_serve: runs the handshake (hello.h), then serves REQUESTs from
 * conn in sequence until EOF, a protocol violation or the idle bound;
 * never exits (the caller closes conn). */
void guest_serve(const struct guest_ctx *g, int conn);

/* guest_result: sends RESULT obj with "generation" added; steals obj.
 * 0 when RESULT (or, if it cannot be built, an ERROR) was sent, else -1. */
int guest_result(const struct guest_ctx *g, int conn, json_t *obj);
/* guest_errno_code: maps an errno to a wire error code (WIRE_E_NOT_FOUND, ...). */
enum wire_code guest_errno_code(int e);
/* guest_req_path: the request's validated "path"; on a missing or invalid
 * path sends ERROR and returns NULL with *rc the send's result (0/-1).
 * Points into req. */
const char *guest_req_path(int conn, json_t *req, int *rc);
/* guest_send_errno: sends ERROR for errno e with "what: strerror"; 0/-1. */
int guest_send_errno(int conn, int e, const char *what);

/* path_check: validates a request path (absolute, <= 4096 bytes, no NUL,
 * no ".." component). 0, or -1 with a message in err. */
int path_check(const char *path, size_t len, struct tt_err *err);
/* path_open: opens path inside the root with RESOLVE_IN_ROOT and no magic
 * links; flags as for openat. Returns an fd or -1 with errno set. */
int path_open(const struct guest_ctx *g, const char *path, int flags,
              mode_t mode);
/* path_open_parent: opens the directory holding path's last component
 * (O_RDONLY|O_DIRECTORY) and copies that component into base, which is
 * never "", "." or "..". -1 with errno (EINVAL for "/"). */
int path_open_parent(const struct guest_ctx *g, const char *path,
                     char base[NAME_MAX + 1]);

/* exec_run: the exec operation; 0 or -1 as above. */
int exec_run(const struct guest_ctx *g, int conn, json_t *req);
/* guest_drop_ptrace: see exec.c; a connection handler calls it first. */
void guest_drop_ptrace(void);
/* fs_* : the file operations; 0 or -1 as above. */
int fs_read(const struct guest_ctx *g, int conn, json_t *req);
int fs_write(const struct guest_ctx *g, int conn, json_t *req);
int fs_stat(const struct guest_ctx *g, int conn, json_t *req);
int fs_list(const struct guest_ctx *g, int conn, json_t *req);
int fs_mkdir(const struct guest_ctx *g, int conn, json_t *req);
int fs_remove(const struct guest_ctx *g, int conn, json_t *req);

#endif

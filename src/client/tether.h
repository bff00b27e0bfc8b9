/* libtether: the C client library for the tether edge API (docs/API.md).
 * Blocking libcurl calls; every JSON answer is size-bounded; errors come
 * back as struct tt_err carrying the server's one-line message. The CLI is
 * built on it. Implementation: src/client/client.c (the request layer),
 * src/client/lifecycle.c, src/client/config.c. */
#ifndef TT_TETHER_H
#define TT_TETHER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "err.h"

#define TETHER_URL_MAX 512
#define TETHER_KEY_MAX 256
#define TETHER_EXEC_OUT_MAX (64u << 20) /* bound on one exec answer */

struct tether_config {
	char url[TETHER_URL_MAX];     /* edge base URL, no trailing slash */
	char api_key[TETHER_KEY_MAX]; /* Bearer API key */
	/* how long a call may wait for its sandbox's transition (or a
	 * restarting daemon) before it is answered, seconds as sent in
	 * X-Tether-Wait (TETHER_WAIT); "" = the edge's default (30) */
	char wait[8];
};

/* tether_config_parse: reads "url=…" and "api_key=…" lines (blank lines and
 * '#' comments allowed) from text into cfg, leaving fields it does not find
 * untouched. Rejects unknown keys, over-long values and lines. */
int tether_config_parse(struct tether_config *cfg, const char *text,
                        size_t len, struct tt_err *err);
/* tether_config_path: "$HOME/.config/tether/config" into buf. */
int tether_config_path(char *buf, size_t cap, struct tt_err *err);
/* tether_config_load: TETHER_URL / TETHER_API_KEY from the environment,
 * else the config file; both must end up set. TETHER_WAIT (0..300 s),
 * when set, goes with every call as X-Tether-Wait. */
int tether_config_load(struct tether_config *cfg, struct tt_err *err);
/* tether_config_write: writes url + api_key to path (mode 0600, parent
 * directories created 0700), atomically via a temp file and rename. */
int tether_config_write(const char *path, const char *url,
                        const char *api_key, struct tt_err *err);

/* A client handle (owner: the caller; free with tether_free). */
struct tether;
struct tether *tether_new(const struct tether_config *cfg, struct tt_err *err);
void tether_free(struct tether *t);

/* What a create asks (docs/API.md, POST /v1/sandboxes); zero = default. */
struct tether_create_opts {
	const char *worker; /* NULL: where the control plane places it */
	uint32_t cpu;       /* CPU cap in millicores (1000 = one CPU; the cp
	                     * takes 100..64000); 0: none sent, the worker's
	                     * default applies */
	const char *substrate; /* "ns", "microvm"; NULL: the cp's default */
};

/* Lifecycle calls return the answer's JSON object (caller decrefs). */
json_t *tether_create(struct tether *t, const char *worker, struct tt_err *err);
/* tether_create_with: tether_create with the options in o. */
json_t *tether_create_with(struct tether *t, const struct tether_create_opts *o,
                           struct tt_err *err);
json_t *tether_list(struct tether *t, struct tt_err *err);
json_t *tether_info(struct tether *t, const char *id, struct tt_err *err);
json_t *tether_workers(struct tether *t, struct tt_err *err);
/* tether_admin_rotate_keys: starts a capability key rotation (SPEC §3;
 * the admin key): {"phase","signing","next","rev"}. tether_admin_keys:
 * {"signing","keys":[…],"rotation":{…}|null,"error"?}. */
json_t *tether_admin_rotate_keys(struct tether *t, struct tt_err *err);
json_t *tether_admin_keys(struct tether *t, struct tt_err *err);
int tether_rm(struct tether *t, const char *id, struct tt_err *err);
/* Lifecycle transitions (src/client/lifecycle.c): each answers the
 * sandbox object (caller decrefs) and, changing state, is never repeated.
 * tether_pause with wait = 0 answers at once ("pausing"); poll tether_info
 * for "progress" and the final state. */
json_t *tether_pause(struct tether *t, const char *id, int wait,
                     struct tt_err *err);
json_t *tether_resume(struct tether *t, const char *id, const char *worker,
                      int force, struct tt_err *err);
json_t *tether_migrate(struct tether *t, const char *id, const char *worker,
                       struct tt_err *err);
/* tether_keys: the cluster's public verification keys, {"keys":[{"kid",
 * "public" (k4.public…), "not_before", "not_after"}]} (caller decrefs). */
json_t *tether_keys(struct tether *t, struct tt_err *err);
/* tether_cap_issue: POST …/capabilities with req (borrowed). */
json_t *tether_cap_issue(struct tether *t, const char *id, json_t *req,
                         struct tt_err *err);

struct tether_exec_result {
	int exit_code;
	uint64_t generation;
	char *out;      /* stdout bytes (owned; free with tether_exec_result_free) */
	size_t out_len;
	char *errout;   /* stderr bytes (owned) */
	size_t err_len;
};
/* tether_exec: runs argv (NULL-terminated) in the sandbox. */
int tether_exec(struct tether *t, const char *id, char *const argv[],
                struct tether_exec_result *res, struct tt_err *err);
void tether_exec_result_free(struct tether_exec_result *res);

/* Streamed exec (GET /v1/sandboxes/ID/exec/ws, "tether.exec.v1"): output
 * is handed to on_output as it arrives (fd 1 stdout, 2 stderr; return -1 to
 * abort the stream). stdin_fd >= 0 is read until EOF and forwarded as the
 * command's stdin (-1: the command's stdin is empty). Implementation in
 * src/client/client.c, on a libwebsockets client with its own event loop. */
typedef int (*tether_output_fn)(void *arg, int fd, const void *data,
                                size_t len);
struct tether_exec_stream {
	tether_output_fn on_output;
	void *arg;
	int stdin_fd;
};
/* tether_exec_stream: runs argv; *exit_code is the command's status and
 * *generation (may be NULL) the execution that ran it. -1 with err when the
 * stream was refused (RefreshRoute/Deny after the edge's one rebuilt
 * attempt), failed or broke off (the command may have run; never repeated). */
int tether_exec_stream(struct tether *t, const char *id, char *const argv[],
                       const struct tether_exec_stream *s, int *exit_code,
                       uint64_t *generation, struct tt_err *err);

/* tether_file_put: streams fd (from its current offset, size bytes) to path
 * in the sandbox; *written = bytes the sandbox stored (may be NULL). */
int tether_file_put(struct tether *t, const char *id, const char *path,
                    int fd, uint64_t size, uint64_t *written,
                    struct tt_err *err);
/* tether_file_get: streams path from the sandbox into fd; *got = bytes. On
 * error, fd may hold a partial body: write to a temp file and rename. */
int tether_file_get(struct tether *t, const char *id, const char *path,
                    int fd, uint64_t *got, struct tt_err *err);
/* tether_set_progress: fn (NULL: none) is called during every later call
 * of t, often (libcurl's progress pace, ~1/s when idle, more while bytes
 * move), with the bytes of the streamed body so far and its size (0 while
 * unknown): the upload's for a PUT, the answer's otherwise. fn may make
 * calls on another handle; a non-zero return aborts the call. */
typedef int (*tether_progress_fn)(void *arg, uint64_t done, uint64_t total);
void tether_set_progress(struct tether *t, tether_progress_fn fn, void *arg);
/* tether_last_generation: the execution generation that served the last
 * operation answer (the edge's X-Tether-Generation header), 0 if none.
 * Recovery rules of every call: see src/client/client.c. */
uint64_t tether_last_generation(const struct tether *t);

#endif

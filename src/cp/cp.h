/* Control plane internals shared by src/cp/{cp,feed,signer}.c. */
#ifndef TT_CP_H
#define TT_CP_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>
#include <libwebsockets.h>
#include <uv.h>

#include "cp/db.h"
#include "err.h"
#include "feedsig.h"
#include "http.h"
#include "paserk.h"
#include "timefmt.h"

#define CP_WORKER_UP_SECS 60  /* default --worker-timeout (s) */
#define CP_ACK_WAIT_SECS 30   /* create/delete/pause/resume ack bound */
#define CP_SIGNER_TIMEOUT_S 1 /* a signer silent this long is replaced */
#define CP_SWEEP_MS 1000      /* lifecycle timeout / worker-down check */
#define CP_FEED_WAIT_MAX 30   /* long-poll bound */
#define CP_FEED_BATCH 256     /* updates per feed answer */
#define CP_SETTLE_POLL_MS 200 /* a transition waiter re-checks this often */
#define CP_REBUILD_LEASE_MS 500 /* a rebuilt attempt's execution stays put */

/* Client side of the signer process (src/cp/signer.c; the signer itself
 * is build/tether-signer, src/signer/). Requests are
 * synchronous on the socketpair: a signature costs tens of microseconds,
 * and a receive timeout bounds a stuck signer. A signer that died or
 * stopped answering is replaced at the next request, provided the new
 * one holds the same key (kid), the one the workers know. */
struct cp_signer {
	int fd;
	pid_t pid;
	char key_path[PATH_MAX];
	char kid[PASERK_K4_PID_LEN + 1];   /* "" until the first public */
	char feed_pub[PASERK_K4_PUBLIC_LEN + 1]; /* likewise: the feed key */
	/* A capability key rotation in progress (src/cp/rotate.c): the next
	 * key's file, given to the signer as --next-key; "" otherwise. */
	char next_path[PATH_MAX];
};

/* cp_signer_spawn: starts "tether-signer --key key_path --feed-key
 * DIR/feed.key --feed-pub DIR/feed.pub" (DIR: key_path's) with the
 * socketpair end as fd 3; the signer creates the keys if absent and
 * writes the feed key's public half to DIR/feed.pub (provisioning gives
 * it to each worker). */
int cp_signer_spawn(const char *key_path, struct cp_signer *s,
                    struct tt_err *err);
/* cp_signer_sign: claims (borrowed) without iss/iat/exp/jti; on success
 * *token is malloc'd (caller frees) and *expires_at set. */
int cp_signer_sign(struct cp_signer *s, json_t *claims, char **token,
                   char expires_at[TT_RFC3339_MAX], struct tt_err *err);
/* cp_signer_public: the verification key and its kid. */
int cp_signer_public(struct cp_signer *s, char pub[PASERK_K4_PUBLIC_LEN + 1],
                     char kid[PASERK_K4_PID_LEN + 1], struct tt_err *err);
/* cp_signer_feed_sign: the feed key's signature over one update body
 * (feedsig.h); the signer checks the body first. */
int cp_signer_feed_sign(struct cp_signer *s, const char *body,
                        char sig[FEEDSIG_SIG_B64_LEN + 1], struct tt_err *err);
/* cp_signer_next: the next key of a rotation (the signer runs with
 * --next-key: s->next_path); -1 when it holds none. */
int cp_signer_next(struct cp_signer *s, char pub[PASERK_K4_PUBLIC_LEN + 1],
                   char kid[PASERK_K4_PID_LEN + 1], struct tt_err *err);
/* cp_signer_promote: the next key (kid) signs from now on, and is the key
 * file a restarted signer loads. */
int cp_signer_promote(struct cp_signer *s, const char *kid, struct tt_err *err);
/* cp_signer_stop: EOF to the signer (it zeroes its key and exits), reap. */
void cp_signer_stop(struct cp_signer *s);

struct cp_park;

/* A capability key rotation (src/cp/rotate.c). */
struct cp_rotation {
	int active;                         /* next key published, not signing */
	int64_t rev;                        /* the bundle that must be acked */
	int64_t deadline;                   /* abandoned after (unix s) */
	int64_t drop_at;                    /* expired keys leave the bundle then */
	char old_kid[PASERK_K4_PID_LEN + 1];
	char next_kid[PASERK_K4_PID_LEN + 1];
	char error[CPDB_ERR_MAX];           /* why the last one did not finish */
};

/* The control plane daemon (one per process, on one loop). */
struct cp {
	uv_loop_t *loop;
	struct lws_context *ctx;
	struct cpdb *db;
	struct cp_signer signer;
	struct cp_park *parked; /* list of parked requests (feed.c) */
	int64_t worker_timeout; /* seconds without a poll before "down" */
	/* the substrate of a create that names none (--default-substrate) */
	char default_substrate[16];
	unsigned keep_snapshots; /* older complete snapshots kept per sandbox
	                          * besides the newest (--keep-snapshots) */
	uv_timer_t sweep;       /* fails pauses/resumes that cannot finish */
	struct cp_rotation rot;
	/* replicas (replica.c): the store's LISTEN connection, watched */
	uv_poll_t listen;
	int listen_fd;          /* -1 while not watched */
	int listen_open;        /* the handle is initialized */
	int64_t idem_pruned;    /* when old idempotency records last went */
};

/* Per-HTTP-connection state (lws allocates and zeroes it). */
struct cp_sess {
	struct http_body body;
	char path[256];
	char method[8];
	char caller[TT_SUB_MAX + 1]; /* API key name, once authenticated */
	int too_large;
	int routed;                  /* answered or parked: ignore late events */
	struct cp_park *park;        /* owned by cp->parked while set */
	/* A request that met its sandbox in a transition waits for it to end
	 * (feed_wait_settle) until this uv_now() time, then runs again; 0
	 * until it first waits. settle_over: the wait ran out, answer as
	 * things are. */
	uint64_t settle_deadline;
	int settle_over;
};

/* Copies of sandboxes collected while listing (a listing must not write);
 * the caller frees v. cp_sandboxes_keep appends one (dropped when out of
 * memory: the next sweep or call sees it again). */
struct cp_sandboxes {
	struct cp_sandbox *v;
	size_t n, cap;
};
void cp_sandboxes_keep(struct cp_sandboxes *l, const struct cp_sandbox *sb);

/* cp_sandbox_json: the API's sandbox object (node_url from the worker). */
json_t *cp_sandbox_json(struct cp *cp, const struct cp_sandbox *s);

/* cp_dispatch: runs a complete request (body borrowed, may be NULL); also
 * the re-run of a request that waited for a transition (feed.c). */
int cp_dispatch(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                json_t *body);
/* cp_transitional: sb is between two states a caller can use: a create,
 * pause or resume in flight, or a migrate between its pause and resume. */
int cp_transitional(const struct cp_sandbox *sb);
/* What a request that waits for a transition waits for: the sandbox to
 * leave every transitional state and, when stale_gen is set (a capability
 * refused as stale), to run another execution than (stale_gen, stale_att). */
struct cp_settle {
	uint64_t stale_gen;
	uint32_t stale_att;
	int op;        /* a capability for an operation (not a lifecycle call):
	                * it also waits for a sandbox paused by its worker's
	                * stop to come back (resume_on) */
};
/* cp_settle_waits: whether a request waiting as w on sb must go on. */
int cp_settle_waits(struct cp *cp, const struct cp_sandbox *sb,
                    const struct cp_settle *w);

/* cp_worker_up: polled within cp->worker_timeout, or parked in a poll. */
int cp_worker_up(struct cp *cp, const struct cp_worker *w, int64_t now);
/* cp_worker_accepts: up and not draining (placement, resume targets). */
int cp_worker_accepts(struct cp *cp, const struct cp_worker *w, int64_t now);

/* Why a lifecycle request was refused (HTTP status, error code, message). */
struct cp_refusal {
	unsigned status;
	const char *code;
	char msg[CPDB_ERR_MAX];
};
/* A resume that was started (install appended, ack pending). */
struct cp_resumed {
	uint64_t generation;
	int64_t rev;                  /* the install update's rev */
	char worker[TT_NAME_MAX + 1];
	int forced;                   /* a retire went to the old worker */
	uint64_t resumed_from;        /* generation of the snapshot used */
};
/* cp_resume_begin: validates and starts resuming sb on worker (NULL or ""
 * = placement); force allows failover from a down worker. 0 and *out, or
 * -1 and *why (nothing changed). */
int cp_resume_begin(struct cp *cp, const struct cp_sandbox *sb,
                    const char *worker, int force, struct cp_resumed *out,
                    struct cp_refusal *why);
/* cp_pause_begin: state and worker checks, then the pause CAS (migrate_to:
 * a migrate's target; resume_on: the worker to resume it on when it is up
 * again, for a worker's orderly stop). 0 and *rev, or -1 and *why. */
int cp_pause_begin(struct cp *cp, const struct cp_sandbox *sb,
                   const char *migrate_to, const char *resume_on, int64_t *rev,
                   struct cp_refusal *why);
/* cp_op_fail: the pending pause/install of sb cannot finish: failed, its
 * generation retired on its worker, waiters answered. */
void cp_op_fail(struct cp *cp, const struct cp_sandbox *sb, const char *why);

/* recover.c: what brings sandboxes back after restarts and crashes. */
/* cp_lost: POST /v1/feed/lost (Node): a worker lost an execution whose
 * layer it still holds; the cp relaunches it there. */
int cp_lost(struct cp *cp, struct lws *wsi, json_t *body);
/* cp_drain: POST /v1/feed/drain (Node): a worker stops in order; each of
 * its running sandboxes is paused (to resume there once it is back). */
int cp_drain(struct cp *cp, struct lws *wsi, json_t *body);
/* cp_pause_failed: the worker answered a pause with a failure: it keeps
 * the layer, so the sandbox is relaunched there from it (nothing it
 * acknowledged is lost) instead of failing; failed only if it cannot be. */
void cp_pause_failed(struct cp *cp, const struct cp_sandbox *sb, const char *why);
/* cp_resume_returned: a sandbox paused by its worker's stop, whose worker
 * is up again: resumed there (sweep). */
void cp_resume_returned(struct cp *cp, const struct cp_sandbox *sb);
/* replica.c: several replicas on one store (see there). */
/* cp_replica_listen: watches the store's messages from other replicas. */
void cp_replica_listen(struct cp *cp);
/* cp_replica_sweep: listening again, the messages' backstop, pruning. */
void cp_replica_sweep(struct cp *cp);
void cp_replica_close(struct cp *cp);
/* cp_idem_begin: a lifecycle call repeated under its Idempotency-Key
 * waits for what it started (1, *rc answered or parked); else the store
 * records what it starts (0). */
int cp_idem_begin(struct cp *cp, struct cp_sess *s, struct lws *wsi, int *rc);

/* cp_name_ok: worker ids are short [A-Za-z0-9._-] names. */
int cp_name_ok(const char *s);

/* rotate.c: capability key rotation through the signed feed (SPEC §3).
 * cp_rotate_start: POST /v1/admin/rotate-keys (admin): publishes the next
 * key; it signs once every worker that is up acknowledged it.
 * cp_rotate_status: GET /v1/admin/keys (admin): the bundle, who signs.
 * cp_rotate_sweep: advances a rotation, drops expired keys (sweep). */
int cp_rotate_start(struct cp *cp, struct cp_sess *s, struct lws *wsi);
int cp_rotate_status(struct cp *cp, struct cp_sess *s, struct lws *wsi);
void cp_rotate_sweep(struct cp *cp);

/* cp_op_expire: the pause/install under rev of sbx was not acknowledged in
 * time: the sandbox fails (with a retire for its worker). */
void cp_op_expire(struct cp *cp, const char *sbx, int64_t rev);

/* workers.c: per-worker credentials (SPEC §7). */
/* cp_worker_auth: the request carries `Authorization: Worker <credential>`
 * of a provisioned worker, and names that very worker (register's "id",
 * the feed's ?worker=, else the body's "worker"): true. Otherwise false
 * and *rc is the refusal already answered (401 unknown, 403 another
 * worker's, 400 names none). */
bool cp_worker_auth(struct cp *cp, struct lws *wsi, const char *path,
                    json_t *body, int *rc);
/* cp_register: POST /v1/workers/register (Worker): node_url must be the
 * one provisioned for that worker (else 403). */
int cp_register(struct cp *cp, struct lws *wsi, json_t *body);
/* cp_ack_beyond: an ack of rev beyond both the highest rev a feed answer
 * gave w and its acked_rev: true, and *rc is the 409 answered. */
bool cp_ack_beyond(struct lws *wsi, const struct cp_worker *w, int64_t rev,
                   int *rc);
/* cp_worker_sent: a feed answer gives worker the revs up to rev (capped
 * at the newest rev that exists); recorded before it goes out. */
int cp_worker_sent(struct cp *cp, const char *worker, int64_t rev,
                   struct tt_err *err);

/* What a parked request waits for. */
enum cp_wait {
	CP_WAIT_CREATE,  /* install ack -> 201 running */
	CP_WAIT_DELETE,  /* destroy ack -> 200 deleted */
	CP_WAIT_PAUSE,   /* pause ack -> 200 paused */
	CP_WAIT_RESUME,  /* install ack -> 200 running, generation N+1 */
	CP_WAIT_MIGRATE, /* pause ack, then resume on target, then install ack */
};
struct cp_waitspec {
	enum cp_wait what;
	const char *worker;      /* whose ack */
	int64_t rev;             /* the update awaited */
	const char *sbx;
	uint64_t gen;            /* pause/migrate: paused gen; resume: new gen */
	const char *target;      /* migrate: where to resume */
	int forced;              /* resume: reply carries forced/resumed_from */
	uint64_t resumed_from;
};

/* feed.c: long-poll and acknowledgement waiters. Each park_* parks the
 * request (the lws callback then returns 0 without replying); the reply is
 * written from LWS_CALLBACK_HTTP_WRITEABLE via feed_writable. */
int feed_poll(struct cp *cp, struct cp_sess *s, struct lws *wsi,
              const char *worker, int64_t after, int wait_secs);
int feed_wait_ack(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                  const struct cp_waitspec *w);
/* feed_wait_settle: parks a request that met sbx in a transition (w: what
 * it waits for) until cp_settle_waits says no more or s->settle_deadline
 * passes; then cp_dispatch runs it again (body kept, borrowed here). */
int feed_wait_settle(struct cp *cp, struct cp_sess *s, struct lws *wsi,
                     const char *sbx, const struct cp_settle *w, json_t *body);
/* feed_polling: 1 when worker has a long-poll parked right now. */
int feed_polling(struct cp *cp, const char *worker);
/* feed_settled: answers the lifecycle waiters of sbx whose operation is no
 * longer pending (failed by the sweep, or overtaken by a forced resume). */
void feed_settled(struct cp *cp, const char *sbx);
/* feed_wake: new updates for worker (NULL = all workers); these three
 * also tell the other replicas. */
void feed_wake(struct cp *cp, const char *worker);
/* feed_acked: worker acknowledged everything up to rev. */
void feed_acked(struct cp *cp, const char *worker, int64_t rev);
int feed_writable(struct cp *cp, struct cp_sess *s, struct lws *wsi);
/* feed_closed: the connection went away; drop its parked request. */
void feed_closed(struct cp *cp, struct cp_sess *s);
/* feed_told: a message from another replica (feed_wake, feed_acked and
 * feed_settled tell them); feed_recheck: what lost messages would have
 * said, from the store (the sweep, when replicas share it). */
void feed_told(struct cp *cp, const char *msg);
void feed_recheck(struct cp *cp);
/* feed_shutdown: releases every parked request (daemon exit). */
void feed_shutdown(struct cp *cp);

#endif

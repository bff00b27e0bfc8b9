/* node-api: the worker's HTTP front door (src/node/api.c and the pieces
 * of api_int.h) and the worker side of the control-plane update feed
 * (src/node/feed.c). Shared state of one node-api process; everything
 * runs on one libuv loop. */
#ifndef TT_NODE_NODE_H
#define TT_NODE_NODE_H

#include "urllist.h"
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <curl/curl.h>
#include <jansson.h>
#include <uv.h>

#include "err.h"
#include "paserk.h"
#include "http.h"

#define NODE_TOKEN_MAX 512

struct node_feed; /* feed.c */
struct node_events; /* events.c */
struct node;
typedef void (*node_drained_fn)(struct node *n);

struct uvutil_pool;

struct node {
	uv_loop_t *loop;
	const char *id;            /* worker id ("w1") */
	const char *cp_url;        /* --cp: the control plane's base URL, or
	                            * its replicas' (URL,URL…) */
	struct urllist cps;        /* those URLs: the feed stays on one, and
	                            * moves on when it fails (lib/urllist.h) */
	const char *state_dir;
	const char *guest_bin;     /* may be NULL */
	const char *snap_dir;      /* --snapshots, passed to the manager; may be NULL */
	const char *disk_mb;       /* --disk-mb, --disk-inodes: each sandbox's */
	const char *disk_inodes;   /* layer cap, passed to the manager (which
	                            * checks them); NULL = its defaults */
	const char *uid_base;      /* --uid-base, --cpu-millis: likewise */
	const char *cpu_millis;
	char listen_host[64];
	int port;
	char node_url[128];        /* what we register: http://host:port */
	/* this worker's own credential (--credential-file, provisioned by
	 * `tetherd worker add`): secret, zeroed on exit */
	char node_token[NODE_TOKEN_MAX + 1];
	/* The feed's root key (k4.public), read from --feed-key-file at start
	 * and handed to the manager, which pins it and verifies every update
	 * with it: node-api relays updates, it cannot make one. */
	char feed_key[PASERK_K4_PUBLIC_LEN + 1];
	char sock_path[PATH_MAX];  /* manager.sock */
	struct uvutil_pool *mgr_pool; /* idle connections to the manager (mgrconn.h) */
	struct lws_context *lws;
	struct httpc *httpc;
	uv_process_t manager;
	bool manager_running;
	/* Privilege separation (node.c): started as root, node-api spawns the
	 * manager, then runs as run_uid/run_gid (--uid, or --user, default
	 * "nobody"): one uid per worker keeps each node-api out of the
	 * others' managers (their sockets are 0600, owned by their uid). */
	const char *user;          /* --user NAME; NULL = default */
	const char *uid;           /* --uid UID[:GID]; NULL = --user */
	bool drop;                 /* root at start: drop to run_uid */
	uid_t run_uid;             /* our uid after the drop (the manager's peer) */
	gid_t run_gid;
	char run_dir[64];          /* root-made dir of manager.sock; "" = state dir */
	uv_pipe_t lifeline;        /* manager's stdin; closing it stops the manager */
	bool lifeline_open;
	uint64_t applied_rev;      /* last rev the manager durably applied */
	struct node_feed *feed;
	struct node_events *events;
	bool progress_inflight;    /* a POST /v1/feed/progress is running */
	uint64_t progress_last_ms; /* uv_now of the last one (<= 5/s) */
	int exit_code;
};

/* node_feed_start: registers with the cp and runs the long-poll loop (register
 * -> poll -> feed.apply -> ack) from n->applied_rev on. */
int node_feed_start(struct node *n, struct tt_err *err);
/* node_feed_stop: cancels timers and transfers (the httpc aborts them). */
void node_feed_stop(struct node *n);

/* node_cp_post: POST cp_url + path (JSON body, borrowed) with the
 * worker's credential, bounded by timeout_ms; done(arg, status, answer) runs once on
 * the loop (status 0: no answer; answer NULL unless JSON; may be NULL).
 * -1 when it could not start (done never runs). src/node/events.c. */
typedef void (*node_cp_done_fn)(void *arg, long status, json_t *answer);
int node_cp_post(struct node *n, const char *path, json_t *body, long timeout_ms,
                 node_cp_done_fn done, void *arg);

/* node_events_start: watches the manager for lost executions and reports
 * each to the cp (src/node/events.c). */
int node_events_start(struct node *n, struct tt_err *err);
/* node_events_stop: closes the watch; transfers in flight end quietly. */
void node_events_stop(struct node *n);
/* node_drain: the orderly stop's first step: the cp pauses every sandbox
 * of this worker (to resume here once it is back) while the feed goes on;
 * drained runs once none is pending, within_ms passed, the cp stayed
 * silent, or node_drain was called again (stop now). */
void node_drain(struct node *n, uint64_t within_ms, node_drained_fn drained);

#endif

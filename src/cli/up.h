/* tether up, in three files: up.c (options, layout, start, the welcome),
 * up_supervise.c (children: spawn, reap, restart with backoff) and
 * up_stop.c (the orderly stop: workers, then the edge, then the cp). */
#ifndef TT_CLI_UP_H
#define TT_CLI_UP_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define UP_MAX_WORKERS 16
#define UP_MAX_REPLICAS 8 /* control planes: ports BASE and BASE+2..BASE+9 */
#define UP_MAX_CHILDREN (UP_MAX_WORKERS + 1 + UP_MAX_REPLICAS)
#define UP_MAX_ARGS 32
#define UP_OLD_GROUPS 8 /* a worker's earlier process groups still alive */

enum up_role { UP_CP, UP_WORKER, UP_EDGE };
/* starting: a death stops the cluster; running: a death is restarted;
 * stopping: nothing is restarted but the cp while the workers need it */
enum up_phase { UP_STARTING, UP_RUNNING, UP_STOPPING };

struct child {
	char name[16];             /* "cp", "w1", "edge" */
	char log[PATH_MAX + 32];
	char lock[PATH_MAX + 32];  /* a worker's manager.lock; "" for others */
	char *argv[UP_MAX_ARGS];   /* owned copy: a restart runs the same */
	enum up_role role;
	int port;
	pid_t pid;                 /* 0 once reaped */
	pid_t pgid;                /* its process group (its first pid) */
	/* A worker's earlier groups that still had members when it died
	 * (bridges and sandboxes its next manager adopts): the stop waits
	 * for them and a forced stop kills them. */
	pid_t old_groups[UP_OLD_GROUPS];
	int status;                /* of the last death */
	uint64_t started_ms, died_ms;
	uint64_t restart_at;       /* monotonic ms; 0: no restart pending */
	unsigned attempt;          /* restarts since it last stayed up 30 s */
	bool back_pending;         /* restarted: say so once it answers */
	unsigned said;             /* UP_SAID_* lines printed for this restart */
};

struct up {
	char state[PATH_MAX];
	char bindir[PATH_MAX];
	char cp_url[128], edge_url[128];
	char cp_urls[UP_MAX_REPLICAS * 32]; /* every replica's, comma-separated */
	char db[512];        /* --db: the replicas' PostgreSQL; "" = SQLite */
	int replicas;        /* --cp-replicas */
	int base;
	int workers;
	char disk_mb[16];    /* --disk-mb for every worker; "" = its default */
	char substrate[16];  /* --substrate: the cp's default; "" = ns */
	struct child kids[UP_MAX_CHILDREN];
	int nkids;
	enum up_phase phase;
	bool cp_needed;      /* stopping: the workers still need the cp */
	int stop_signal;     /* the first SIGINT/SIGTERM */
	int signals;         /* how many stop signals arrived */
	char admin_key[256]; /* wiped once used */
};

/* up_now_ms: CLOCK_MONOTONIC in milliseconds. */
uint64_t up_now_ms(void);
/* up_spawn: registers a child (argv copied) and starts it, its output
 * appended to S/logs/NAME.log. 0, or 1 after printing why. */
int up_spawn(struct up *u, enum up_role role, const char *name, int port,
             char *const argv[]);
/* up_wait: sleeps up to ms, waking for signals; reaps children (a death
 * while running schedules a restart, reported). 1 if a stop signal
 * arrived (u->signals counts them), -1 if a child died while starting
 * (reported), 0 otherwise. */
int up_wait(struct up *u, long ms);
/* up_supervise: the running cluster: restarts what dies until a stop
 * signal arrives (returns 1). */
int up_supervise(struct up *u);
/* up_tick: due restarts and "is back" lines (in the stopping phase, only
 * the cp's, while u->cp_needed). */
void up_tick(struct up *u);
/* up_group_alive: whether process group pg still has a member. */
bool up_group_alive(pid_t pg);
/* up_worker_gone: a worker's node-api reaped, its sbx-manager gone (its
 * lock free) and none of its process groups left. */
bool up_worker_gone(const struct child *k);
/* up_lock_free: nobody holds the worker's manager.lock (its sbx-manager,
 * possibly from an earlier node-api, has exited). */
bool up_lock_free(const struct child *k);
/* up_kill_groups: sig to the child's group and its earlier ones. */
void up_kill_groups(struct child *k, int sig);
/* up_children_free: frees the argv copies. */
void up_children_free(struct up *u);
/* port_in_use: whether 127.0.0.1:port cannot be bound now. */
int port_in_use(int port);
/* up_probe: GET url (Bearer key if given, timeout ms); the status, or 0
 * if no answer. *body (freed by the caller) gets the answer. */
long up_probe(const char *url, const char *key, long timeout_ms, char **body);
/* up_read_admin_key: the cp's admin API key (S/cp/admin.key) into
 * u->admin_key. 0, or -1. */
int up_read_admin_key(struct up *u);
/* up_stop: the orderly stop (workers, then the edge, then the cp); a
 * second stop signal skips waiting for the workers. */
void up_stop(struct up *u);

#endif

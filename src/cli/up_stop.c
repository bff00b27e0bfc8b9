/* tether up's orderly stop: the workers first (SIGTERM to each node-api,
 * which may pause its sandboxes before it exits, and needs the cp for
 * that), waited for up to 120 s with their progress shown; then the edge;
 * the cp last. A second Ctrl-C stops waiting: SIGTERM again to the
 * node-apis (they then stop without pausing), SIGKILL to the workers'
 * groups 5 s later. A third one kills the edge and the cp at once.
 *
 * The SIGTERM goes to node-api alone, not to its group: the group also
 * holds its root sbx-manager, the bridges and the sandboxes' inits, and a
 * manager that gets SIGTERM stops every sandbox at once, before node-api
 * could pause one. node-api stops its manager itself (closing the
 * lifeline) once it is done. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "cleanup.h"
#include "cli/cli.h"
#include "cli/up.h"

#define UP_WORKERS_STOP_MS 120000u /* pausing every sandbox takes time */
#define UP_FORCE_GRACE_MS 5000u    /* second Ctrl-C: SIGTERM, then SIGKILL */
#define UP_LEFTOVER_MS 5000u       /* members outliving a stopped worker */
#define UP_DAEMON_STOP_MS 10000u   /* edge, cp */
#define UP_QUIET_MS 1000u          /* no "waiting" line for a quick stop */

struct progress {
	bool tty;
	bool line_open;        /* a tty line is shown, without its newline */
	json_t *ids;           /* sandboxes to account for at the end */
	char text[200];        /* what was shown last */
	char key[96];          /* its gist (non-tty: a line when it changes) */
	uint64_t t0, printed_ms;
};

/* sandboxes_get: the cp's sandbox list (a new reference), or NULL. */
static json_t *sandboxes_get(struct up *u)
{
	char url[200];
	_cleanup_free_ char *body = NULL;
	json_t *j, *list;

	if (u->admin_key[0] == '\0')
		return NULL;
	snprintf(url, sizeof(url), "%s/v1/sandboxes", u->cp_url);
	if (up_probe(url, u->admin_key, 1000, &body) != 200 || body == NULL)
		return NULL;
	j = json_loads(body, JSON_REJECT_DUPLICATES, NULL);
	list = json_incref(json_object_get(j, "sandboxes"));
	json_decref(j);
	if (!json_is_array(list)) {
		json_decref(list);
		return NULL;
	}
	return list;
}

/* progress_seed: the sandboxes alive when the stop begins (running,
 * starting, pausing, resuming): those the workers may pause. */
static void progress_seed(struct up *u, struct progress *p)
{
	json_t *list = sandboxes_get(u), *s;
	size_t i;

	json_array_foreach(list, i, s) {
		const char *id = cli_str(s, "id", NULL), *st = cli_str(s, "state", "");
		if (id != NULL && (strcmp(st, "running") == 0 || strcmp(st, "starting") == 0 ||
		                   strcmp(st, "pausing") == 0 || strcmp(st, "resuming") == 0))
			json_object_set_new(p->ids, id, json_true());
	}
	json_decref(list);
}

/* progress_show: text on stderr: rewritten in place on a tty, else a line
 * when its gist changes (or every 10 s while the bytes move). */
static void progress_show(struct progress *p, const char *text, const char *key)
{
	uint64_t now = up_now_ms();

	if (strcmp(text, p->text) == 0)
		return;
	if (p->tty) {
		fprintf(stderr, "\r\033[K%s", text);
		p->line_open = true;
	} else if (strcmp(key, p->key) != 0 || now - p->printed_ms >= 10000) {
		fprintf(stderr, "%s\n", text);
		p->printed_ms = now;
	} else {
		return;
	}
	snprintf(p->text, sizeof(p->text), "%s", text);
	snprintf(p->key, sizeof(p->key), "%s", key);
}

/* progress_clear: ends a tty progress line, so the next line starts clean. */
static void progress_clear(struct progress *p)
{
	if (p->line_open)
		fprintf(stderr, "\r\033[K");
	p->line_open = false;
	p->text[0] = '\0';
}

/* progress_poll: what the workers are doing now: the sandboxes pausing
 * with their bytes (from the cp), else which workers are still up. */
static void progress_poll(struct up *u, struct progress *p)
{
	json_t *list = sandboxes_get(u), *s;
	uint64_t bytes = 0, total = 0;
	bool unknown = false;
	int pausing = 0;
	size_t i;
	char text[200], key[96], b[32], t[32];

	json_array_foreach(list, i, s) {
		json_t *pr = json_object_get(s, "progress");
		const char *id = cli_str(s, "id", NULL);

		if (strcmp(cli_str(s, "state", ""), "pausing") != 0 || id == NULL)
			continue;
		pausing++;
		json_object_set_new(p->ids, id, json_true());
		bytes += (uint64_t)cli_int(pr, "bytes");
		if (json_is_integer(json_object_get(pr, "total")))
			total += (uint64_t)cli_int(pr, "total");
		else
			unknown = true;
	}
	json_decref(list);
	if (pausing > 0) {
		cli_size(bytes, b, sizeof(b));
		if (unknown)
			snprintf(text, sizeof(text), "stopping: pausing %d sandbox%s (%s so far)",
			         pausing, pausing == 1 ? "" : "es", b);
		else
			snprintf(text, sizeof(text), "stopping: pausing %d sandbox%s (%s of %s)",
			         pausing, pausing == 1 ? "" : "es", b, cli_size(total, t, sizeof(t)));
		snprintf(key, sizeof(key), "pausing %d", pausing);
	} else {
		size_t n = (size_t)snprintf(text, sizeof(text), "stopping: waiting for");
		int left = 0;

		for (int k = 0; k < u->nkids && n < sizeof(text); k++)
			if (u->kids[k].role == UP_WORKER && !up_worker_gone(&u->kids[k]))
				n += (size_t)snprintf(text + n, sizeof(text) - n, "%s %s",
				                      left++ ? "," : "", u->kids[k].name);
		if (left == 0 || up_now_ms() - p->t0 < UP_QUIET_MS)
			return;
		snprintf(key, sizeof(key), "%.90s", text);
	}
	progress_show(p, text, key);
}

/* progress_end: what became of the sandboxes the workers were running. */
static void progress_end(struct up *u, struct progress *p)
{
	json_t *list = sandboxes_get(u), *s;
	int paused = 0, failed = 0, pausing = 0;
	size_t i;

	progress_clear(p);
	json_array_foreach(list, i, s) {
		const char *st = cli_str(s, "state", "");

		if (json_object_get(p->ids, cli_str(s, "id", "")) == NULL)
			continue;
		paused += strcmp(st, "paused") == 0;
		failed += strcmp(st, "failed") == 0;
		pausing += strcmp(st, "pausing") == 0;
	}
	json_decref(list);
	if (paused > 0)
		fprintf(stderr, "stopped: %d sandbox%s paused; %s when the cluster "
		        "starts again\n", paused, paused == 1 ? "" : "es",
		        paused == 1 ? "it resumes" : "they resume");
	if (failed > 0)
		fprintf(stderr, "stopped: %d sandbox%s could not be paused (state failed; "
		        "tether info ID says why)\n", failed, failed == 1 ? "" : "es");
	if (pausing > 0)
		fprintf(stderr, "stopped: %d sandbox%s left pausing: the stop cut "
		        "%s pause short\n", pausing, pausing == 1 ? "" : "es",
		        pausing == 1 ? "its" : "their");
}

/* workers_signal: sig to every node-api still running (not its group). */
static void workers_signal(struct up *u, int sig)
{
	for (int i = 0; i < u->nkids; i++)
		if (u->kids[i].role == UP_WORKER && u->kids[i].pid > 0)
			kill(u->kids[i].pid, sig);
}

/* workers_all_gone: every worker's processes are gone. */
static bool workers_all_gone(struct up *u)
{
	for (int i = 0; i < u->nkids; i++)
		if (u->kids[i].role == UP_WORKER && !up_worker_gone(&u->kids[i]))
			return false;
	return true;
}

/* leftovers: a worker whose node-api and sbx-manager are gone but whose
 * groups still hold processes (bridges, sandboxes no manager stopped)
 * gets them killed after UP_LEFTOVER_MS, said once. */
static void leftovers(struct up *u, uint64_t since[], uint64_t now)
{
	for (int i = 0; i < u->nkids; i++) {
		struct child *k = &u->kids[i];

		if (k->role != UP_WORKER || k->pid > 0 || up_worker_gone(k) ||
		    !up_lock_free(k)) {
			since[i] = 0;
			continue;
		}
		if (since[i] == 0)
			since[i] = now;
		else if (now - since[i] >= UP_LEFTOVER_MS && since[i] != UINT64_MAX) {
			fprintf(stderr, "tether: %s: processes outlived its sbx-manager; "
			        "killing them\n", k->name);
			up_kill_groups(k, SIGKILL);
			since[i] = UINT64_MAX;
		}
	}
}

/* stop_workers: SIGTERM to each node-api; waits (progress shown) until
 * every worker is gone, 120 s at most; a second stop signal stops the
 * wait. The cp is restarted meanwhile if it dies: the workers need it. */
static void stop_workers(struct up *u)
{
	struct progress p = { .tty = isatty(2) != 0 };
	uint64_t since[UP_MAX_CHILDREN] = { 0 };
	uint64_t deadline, kill_at = 0, now;
	bool forced = false, killed = false;

	p.t0 = up_now_ms();
	deadline = p.t0 + UP_WORKERS_STOP_MS;
	/* read again: it was wiped after the start */
	if (up_read_admin_key(u) < 0)
		u->admin_key[0] = '\0';
	p.ids = json_object();
	progress_seed(u, &p);
	workers_signal(u, SIGTERM);
	while (!workers_all_gone(u)) {
		now = up_now_ms();
		if (!forced && u->signals >= 2) {
			progress_clear(&p);
			fprintf(stderr, "tether: not waiting for the workers to pause; "
			        "stopping them now\n");
			workers_signal(u, SIGTERM);
			forced = true;
			kill_at = now + UP_FORCE_GRACE_MS;
		} else if (!forced && now >= deadline) {
			progress_clear(&p);
			fprintf(stderr, "tether: the workers did not stop in %u s; killing "
			        "them\n", UP_WORKERS_STOP_MS / 1000);
			forced = true;
			kill_at = now;
		}
		if (forced && !killed && now >= kill_at) {
			for (int i = 0; i < u->nkids; i++)
				if (u->kids[i].role == UP_WORKER)
					up_kill_groups(&u->kids[i], SIGKILL);
			killed = true;
		} else if (killed && now >= kill_at + UP_FORCE_GRACE_MS) {
			progress_clear(&p);
			fprintf(stderr, "tether: some worker processes do not go away; "
			        "going on without them\n");
			break;
		}
		leftovers(u, since, now);
		progress_poll(u, &p);
		up_wait(u, 250);
		up_tick(u); /* a cp that died meanwhile comes back */
	}
	progress_end(u, &p);
	json_decref(p.ids);
	sodium_memzero(u->admin_key, sizeof(u->admin_key));
}

/* stop_daemon: SIGTERM to the group of each child of role, 10 s for it
 * to go, then SIGKILL (at once after a third stop signal). */
static void stop_daemon(struct up *u, enum up_role role)
{
	for (int i = 0; i < u->nkids; i++) {
		struct child *k = &u->kids[i];
		uint64_t deadline = up_now_ms() + UP_DAEMON_STOP_MS;
		bool killed = false;

		if (k->role != role)
			continue;
		k->restart_at = 0;
		if (up_group_alive(k->pgid))
			kill(-k->pgid, SIGTERM);
		while (k->pid > 0 || up_group_alive(k->pgid)) {
			uint64_t now = up_now_ms();

			if (!killed && (now >= deadline || u->signals >= 3)) {
				if (now >= deadline)
					fprintf(stderr, "tether: %s did not stop in %u s; killing "
					        "it\n", k->name, UP_DAEMON_STOP_MS / 1000);
				kill(-k->pgid, SIGKILL);
				killed = true;
				deadline = now + UP_FORCE_GRACE_MS;
			} else if (killed && now >= deadline) {
				fprintf(stderr, "tether: %s does not go away\n", k->name);
				break;
			}
			up_wait(u, 100);
		}
	}
}

/* up_stop: see up.h. */
void up_stop(struct up *u)
{
	u->phase = UP_STOPPING;
	u->cp_needed = true;
	stop_workers(u);
	u->cp_needed = false;
	stop_daemon(u, UP_EDGE);
	stop_daemon(u, UP_CP);
}

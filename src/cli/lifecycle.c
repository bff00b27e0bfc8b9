/* CLI verbs pause, resume and migrate (SPEC §7, §11; docs/CLI.md).
 * pause asks with wait=0 and polls the sandbox, showing snapshot progress
 * on stderr once it takes more than half a second (-q: none). resume and
 * migrate wait in one call, meanwhile polling the sandbox on a second
 * handle for a progress line on a terminal. Each prints one line on
 * success (--json: the sandbox object). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/verbs.h"
#include "client/tether.h"

#define LC_POLL_MS 100
#define LC_PROGRESS_AFTER_MS 500
#define LC_PAUSE_MAX_MS (10 * 60 * 1000) /* the cp fails a pause long before */

/* lc_mib: bytes as MiB for progress lines. */
static double lc_mib(json_int_t b)
{
	return (double)b / (1024.0 * 1024.0);
}

/* lc_print: the sandbox after a transition (one line, or JSON). */
static void lc_print(json_t *s, const char *what, int json)
{
	json_t *snap = json_object_get(s, "snapshot");
	char size[32];

	if (json) {
		cli_print_json(s);
		return;
	}
	printf("%s %s: %s, generation %" JSON_INTEGER_FORMAT " on %s", what,
	       cli_str(s, "id", "?"), cli_str(s, "state", "?"),
	       cli_int(s, "generation"), cli_str(s, "worker", "-"));
	if (json_is_object(snap))
		printf(", snapshot of generation %" JSON_INTEGER_FORMAT " (%s)",
		       cli_int(snap, "generation"),
		       cli_size((uint64_t)cli_int(snap, "size"), size, sizeof(size)));
	putchar('\n');
	if (json_is_true(json_object_get(s, "forced")))
		printf("forced: resumed from the last complete snapshot (generation %"
		       JSON_INTEGER_FORMAT "); the old worker's execution is retired\n",
		       cli_int(s, "resumed_from"));
}

static int lc_quiet; /* -q: no progress */

/* lc_args: ID plus --worker W / --force / --json / -q. -1 on a usage
 * error. */
static int lc_args(int argc, char **argv, const char **id, const char **worker,
                   int *force, int *json)
{
	*id = NULL;
	*json = 0;
	if (worker)
		*worker = NULL;
	if (force)
		*force = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--worker") == 0 && i + 1 < argc && worker)
			*worker = argv[++i];
		else if (strcmp(argv[i], "--force") == 0 && force)
			*force = 1;
		else if (strcmp(argv[i], "--json") == 0)
			*json = 1;
		else if (strcmp(argv[i], "-q") == 0)
			lc_quiet = 1;
		else if (*id == NULL && argv[i][0] != '-')
			*id = argv[i];
		else
			return -1;
	}
	return *id ? 0 : -1;
}

/* lc_open: a client, and *id resolved (a unique prefix) into full. NULL
 * after printing why. */
static struct tether *lc_open(const char **id, char full[CLI_ID_MAX])
{
	struct tether *t = cli_open();

	if (t != NULL && cli_resolve(t, *id, full, CLI_ID_MAX) < 0) {
		tether_free(t);
		return NULL;
	}
	*id = full;
	return t;
}

/* lc_progress_line: "snapshot 12.0 MiB / 40.0 MiB" on stderr (rewritten in
 * place on a terminal). */
static void lc_progress_line(json_t *s, int tty)
{
	json_t *p = json_object_get(s, "progress");
	json_t *total = json_object_get(p, "total");

	if (!json_is_object(p))
		return;
	if (json_is_integer(total) && json_integer_value(total) > 0)
		fprintf(stderr, "%ssnapshot %.1f MiB / %.1f MiB%s", tty ? "\r" : "",
		        lc_mib(cli_int(p, "bytes")), lc_mib(json_integer_value(total)),
		        tty ? "   " : "\n");
	else
		fprintf(stderr, "%ssnapshot %.1f MiB%s", tty ? "\r" : "",
		        lc_mib(cli_int(p, "bytes")), tty ? "   " : "\n");
	fflush(stderr);
}

/* lc_pause_wait: polls a pausing sandbox until it leaves "pausing"; takes
 * over *s (the latest answer replaces it). 0, or 1 after printing why. */
static int lc_pause_wait(struct tether *t, const char *id, json_t **s)
{
	struct tt_err err = { 0 };
	int tty = isatty(2), shown = 0;
	int64_t t0 = cli_now_ms(), last_line = 0;

	while (strcmp(cli_str(*s, "state", ""), "pausing") == 0) {
		int64_t now = cli_now_ms();

		if (now - t0 > LC_PAUSE_MAX_MS)
			return cli_fail("pause %s: still pausing after %d s", id,
			                LC_PAUSE_MAX_MS / 1000);
		/* Progress only for long snapshots; a pipe gets a line a second. */
		if (!lc_quiet && now - t0 > LC_PROGRESS_AFTER_MS &&
		    (tty || now - last_line >= 1000)) {
			lc_progress_line(*s, tty);
			shown |= json_is_object(json_object_get(*s, "progress"));
			last_line = now;
		}
		usleep(LC_POLL_MS * 1000);
		json_decref(*s);
		*s = tether_info(t, id, &err);
		if (*s == NULL)
			return cli_fail("pause %s: %s", id, err.msg);
	}
	if (shown && tty)
		fputc('\n', stderr);
	return 0;
}

/* A resume or migrate in progress, watched on a second handle. */
struct lc_watch {
	struct tether *t2;
	const char *id;
	struct cli_meter m;
	int64_t last_poll;
};

/* lc_tick: libtether's progress hook during the waited call: polls the
 * sandbox (at most every 300 ms) and shows its snapshot progress while it
 * pauses, else its state. */
static int lc_tick(void *arg, uint64_t done, uint64_t total)
{
	struct lc_watch *w = arg;
	struct tt_err err = { 0 };
	int64_t now = cli_now_ms();
	json_t *s, *p;
	char note[64];

	(void)done;
	(void)total;
	if (!w->m.on || now - w->last_poll < 300 || now - w->m.t0_ms < 300)
		return 0;
	w->last_poll = now;
	if ((s = tether_info(w->t2, w->id, &err)) == NULL)
		return 0; /* the call itself will say what went wrong */
	p = json_object_get(s, "progress");
	if (strcmp(cli_str(s, "state", ""), "pausing") == 0 && json_is_object(p)) {
		cli_meter_show(&w->m, (uint64_t)cli_int(p, "bytes"),
		               (uint64_t)cli_int(p, "total"), "snapshot");
	} else {
		snprintf(note, sizeof(note), "%s on %s", cli_str(s, "state", "?"),
		         cli_str(s, "worker", "?"));
		cli_meter_show(&w->m, 0, 0, note);
	}
	json_decref(s);
	return 0;
}

/* lc_watch_start: the watch of a waited call on t (off when quiet or not
 * on a terminal). */
static void lc_watch_start(struct lc_watch *w, struct tether *t,
                           const char *id, const char *what)
{
	w->id = id;
	w->last_poll = 0;
	cli_meter_start(&w->m, what, lc_quiet);
	w->t2 = w->m.on ? cli_open() : NULL;
	w->m.on = w->t2 != NULL;
	if (w->m.on)
		tether_set_progress(t, lc_tick, w);
}

/* lc_watch_end: clears the line and frees the second handle. */
static void lc_watch_end(struct lc_watch *w)
{
	cli_meter_end(&w->m);
	tether_free(w->t2);
	w->t2 = NULL;
}

/* cli_pause: pause ID [--json]. */
int cli_pause(int argc, char **argv)
{
	struct tt_err err = { 0 };
	char full[CLI_ID_MAX];
	const char *id;
	struct tether *t;
	json_t *s;
	int json, rc;

	if (lc_args(argc, argv, &id, NULL, NULL, &json) < 0)
		return cli_fail("usage: tether pause ID [-q] [--json]");
	if ((t = lc_open(&id, full)) == NULL)
		return 1;
	s = tether_pause(t, id, 0, &err);
	rc = s ? lc_pause_wait(t, id, &s) : cli_fail("pause %s: %s", id, err.msg);
	if (rc == 0 && strcmp(cli_str(s, "state", ""), "paused") != 0)
		rc = cli_fail("pause %s: the sandbox is %s%s%s", id,
		              cli_str(s, "state", "?"),
		              json_object_get(s, "error") ? ": " : "",
		              cli_str(s, "error", ""));
	else if (rc == 0)
		lc_print(s, "paused", json);
	json_decref(s);
	tether_free(t);
	return rc;
}

/* cli_resume: resume ID [--worker W] [--force] [--json]. */
int cli_resume(int argc, char **argv)
{
	struct tt_err err = { 0 };
	char full[CLI_ID_MAX];
	const char *id, *worker;
	int force, json;
	struct lc_watch w;
	struct tether *t;
	json_t *s;

	if (lc_args(argc, argv, &id, &worker, &force, &json) < 0)
		return cli_fail("usage: tether resume ID [--worker W] [--force] [-q] [--json]");
	if ((t = lc_open(&id, full)) == NULL)
		return 1;
	lc_watch_start(&w, t, id, "resume");
	s = tether_resume(t, id, worker, force, &err);
	lc_watch_end(&w);
	tether_free(t);
	if (s == NULL)
		return cli_fail("resume %s: %s", id, err.msg);
	lc_print(s, "resumed", json);
	json_decref(s);
	return 0;
}

/* cli_migrate: migrate ID --worker W [--json]. */
int cli_migrate(int argc, char **argv)
{
	struct tt_err err = { 0 };
	char full[CLI_ID_MAX];
	const char *id, *worker;
	struct lc_watch w;
	struct tether *t;
	int json;
	json_t *s;

	if (lc_args(argc, argv, &id, &worker, NULL, &json) < 0 || worker == NULL)
		return cli_fail("usage: tether migrate ID --worker W [-q] [--json]");
	if ((t = lc_open(&id, full)) == NULL)
		return 1;
	lc_watch_start(&w, t, id, "migrate");
	s = tether_migrate(t, id, worker, &err);
	lc_watch_end(&w);
	tether_free(t);
	if (s == NULL)
		return cli_fail("migrate %s: %s", id, err.msg);
	lc_print(s, "migrated", json);
	json_decref(s);
	return 0;
}

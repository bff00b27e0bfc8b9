/* CLI verbs pause, resume and migrate (SPEC §7, §11; notes/lifecycle.md).
 * pause asks with wait=0 and polls the sandbox, showing snapshot progress
 * on stderr once it takes more than half a second. Each prints one line on
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

/* lc_now_ms: monotonic milliseconds. */
static int64_t lc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

/* lc_args: ID plus --worker W / --force / --json. -1 on a usage error. */
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
	int64_t t0 = lc_now_ms(), last_line = 0;

	while (strcmp(cli_str(*s, "state", ""), "pausing") == 0) {
		int64_t now = lc_now_ms();

		if (now - t0 > LC_PAUSE_MAX_MS)
			return cli_fail("pause %s: still pausing after %d s", id,
			                LC_PAUSE_MAX_MS / 1000);
		/* Progress only for long snapshots; a pipe gets a line a second. */
		if (now - t0 > LC_PROGRESS_AFTER_MS && (tty || now - last_line >= 1000)) {
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
		return cli_fail("usage: tether pause ID [--json]");
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
	struct tether *t;
	json_t *s;

	if (lc_args(argc, argv, &id, &worker, &force, &json) < 0)
		return cli_fail("usage: tether resume ID [--worker W] [--force] [--json]");
	if ((t = lc_open(&id, full)) == NULL)
		return 1;
	s = tether_resume(t, id, worker, force, &err);
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
	struct tether *t;
	int json;
	json_t *s;

	if (lc_args(argc, argv, &id, &worker, NULL, &json) < 0 || worker == NULL)
		return cli_fail("usage: tether migrate ID --worker W [--json]");
	if ((t = lc_open(&id, full)) == NULL)
		return 1;
	s = tether_migrate(t, id, worker, &err);
	tether_free(t);
	if (s == NULL)
		return cli_fail("migrate %s: %s", id, err.msg);
	lc_print(s, "migrated", json);
	json_decref(s);
	return 0;
}

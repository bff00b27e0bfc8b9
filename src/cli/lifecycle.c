/* CLI verbs pause, resume and migrate (SPEC §7, §11; notes/lifecycle.md).
 * pause asks with wait=0 and polls the sandbox, showing snapshot progress
 * on stderr once it takes more than half a second. Each prints one line on
 * success (--json: the sandbox object). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/verbs.h"
#include "client/tether.h"

#define LC_POLL_MS 100
#define LC_PROGRESS_AFTER_MS 500
#define LC_PAUSE_MAX_MS (10 * 60 * 1000) /* the cp fails a pause long before */

/* lc_fail: one line on stderr; returns 1. */
static int lc_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int lc_fail(const char *fmt, ...)
{
	va_list ap;

	fputs("tether: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

/* lc_now_ms: monotonic milliseconds. */
static int64_t lc_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* lc_str: a string member or def. */
static const char *lc_str(json_t *o, const char *k, const char *def)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s ? s : def;
}

/* lc_int: an integer member (0 when absent). */
static json_int_t lc_int(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
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

	if (json) {
		char *txt = json_dumps(s, JSON_INDENT(2) | JSON_SORT_KEYS);

		if (txt)
			puts(txt);
		free(txt);
		return;
	}
	printf("%s %s: %s, generation %" JSON_INTEGER_FORMAT " on %s", what,
	       lc_str(s, "id", "?"), lc_str(s, "state", "?"), lc_int(s, "generation"),
	       lc_str(s, "worker", "-"));
	if (json_is_object(snap))
		printf(", snapshot of generation %" JSON_INTEGER_FORMAT " (%.1f MiB)",
		       lc_int(snap, "generation"), lc_mib(lc_int(snap, "size")));
	putchar('\n');
	if (json_is_true(json_object_get(s, "forced")))
		printf("forced: resumed from the last complete snapshot (generation %"
		       JSON_INTEGER_FORMAT "); the old worker's execution is retired\n",
		       lc_int(s, "resumed_from"));
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

/* lc_config: the client configuration, or prints why not. */
static int lc_config(struct tether_config *cfg)
{
	struct tt_err err = { 0 };

	if (tether_config_load(cfg, &err) < 0)
		return lc_fail("%s", err.msg), -1;
	return 0;
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
		        lc_mib(lc_int(p, "bytes")), lc_mib(json_integer_value(total)),
		        tty ? "   " : "\n");
	else
		fprintf(stderr, "%ssnapshot %.1f MiB%s", tty ? "\r" : "",
		        lc_mib(lc_int(p, "bytes")), tty ? "   " : "\n");
	fflush(stderr);
}

/* cli_pause: pause ID [--json]. */
int cli_pause(int argc, char **argv)
{
	struct tether_config cfg;
	struct tt_err err = { 0 };
	const char *id;
	int json, tty = isatty(2), shown = 0;
	int64_t t0 = lc_now_ms(), last_line = 0;
	struct tether *t;
	json_t *s;

	if (lc_args(argc, argv, &id, NULL, NULL, &json) < 0)
		return lc_fail("usage: tether pause ID [--json]");
	if (lc_config(&cfg) < 0)
		return 1;
	s = tether_pause(&cfg, id, 0, &err);
	if (s == NULL)
		return lc_fail("pause %s: %s", id, err.msg);
	t = tether_new(&cfg, &err);
	if (t == NULL) {
		json_decref(s);
		return lc_fail("%s", err.msg);
	}
	while (strcmp(lc_str(s, "state", ""), "pausing") == 0) {
		int64_t now = lc_now_ms();

		if (now - t0 > LC_PAUSE_MAX_MS) {
			json_decref(s);
			tether_free(t);
			return lc_fail("pause %s: still pausing after %d s", id,
			               LC_PAUSE_MAX_MS / 1000);
		}
		/* Progress only for long snapshots; a pipe gets a line a second. */
		if (now - t0 > LC_PROGRESS_AFTER_MS && (tty || now - last_line >= 1000)) {
			lc_progress_line(s, tty);
			shown = json_is_object(json_object_get(s, "progress"));
			last_line = now;
		}
		usleep(LC_POLL_MS * 1000);
		json_decref(s);
		s = tether_info(t, id, &err);
		if (s == NULL) {
			tether_free(t);
			return lc_fail("pause %s: %s", id, err.msg);
		}
	}
	tether_free(t);
	if (shown && tty)
		fputc('\n', stderr);
	if (strcmp(lc_str(s, "state", ""), "paused") != 0) {
		int rc = lc_fail("pause %s: the sandbox is %s%s%s", id, lc_str(s, "state", "?"),
		                 json_object_get(s, "error") ? ": " : "",
		                 lc_str(s, "error", ""));

		json_decref(s);
		return rc;
	}
	lc_print(s, "paused", json);
	json_decref(s);
	return 0;
}

/* cli_resume: resume ID [--worker W] [--force] [--json]. */
int cli_resume(int argc, char **argv)
{
	struct tether_config cfg;
	struct tt_err err = { 0 };
	const char *id, *worker;
	int force, json;
	json_t *s;

	if (lc_args(argc, argv, &id, &worker, &force, &json) < 0)
		return lc_fail("usage: tether resume ID [--worker W] [--force] [--json]");
	if (lc_config(&cfg) < 0)
		return 1;
	s = tether_resume(&cfg, id, worker, force, &err);
	if (s == NULL)
		return lc_fail("resume %s: %s", id, err.msg);
	lc_print(s, "resumed", json);
	json_decref(s);
	return 0;
}

/* cli_migrate: migrate ID --worker W [--json]. */
int cli_migrate(int argc, char **argv)
{
	struct tether_config cfg;
	struct tt_err err = { 0 };
	const char *id, *worker;
	int json;
	json_t *s;

	if (lc_args(argc, argv, &id, &worker, NULL, &json) < 0 || worker == NULL)
		return lc_fail("usage: tether migrate ID --worker W [--json]");
	if (lc_config(&cfg) < 0)
		return 1;
	s = tether_migrate(&cfg, id, worker, &err);
	if (s == NULL)
		return lc_fail("migrate %s: %s", id, err.msg);
	lc_print(s, "migrated", json);
	json_decref(s);
	return 0;
}

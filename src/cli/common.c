/* Helpers the CLI verbs share; see cli.h. */
#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "claims.h"

/* cli_fail: see cli.h. The message may carry a server's text: any line
 * break in it is flattened so the error stays one line. */
int cli_fail(const char *fmt, ...)
{
	char line[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	for (char *p = line; *p; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	fprintf(stderr, "tether: %s\n", line);
	return 1;
}

/* cli_open: see cli.h. */
struct tether *cli_open(void)
{
	struct tether_config cfg;
	struct tt_err err = { 0 };
	struct tether *t;

	if (tether_config_load(&cfg, &err) < 0) {
		cli_fail("%s", err.msg);
		return NULL;
	}
	t = tether_new(&cfg, &err);
	if (t == NULL)
		cli_fail("%s", err.msg);
	return t;
}

/* cli_str: see cli.h. */
const char *cli_str(json_t *obj, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(obj, key));

	return s ? s : dflt;
}

/* cli_int: see cli.h. */
json_int_t cli_int(json_t *obj, const char *key)
{
	return json_integer_value(json_object_get(obj, key));
}

/* cli_print_json: see cli.h. */
void cli_print_json(json_t *j)
{
	json_dumpf(j, stdout, JSON_INDENT(2) | JSON_SORT_KEYS);
	fputc('\n', stdout);
}

/* cli_size: see cli.h. */
const char *cli_size(uint64_t bytes, char *buf, size_t cap)
{
	if (bytes < 1024)
		snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
	else if (bytes < 1024 * 1024)
		snprintf(buf, cap, "%.1f KiB", (double)bytes / 1024.0);
	else if (bytes < 1024ull * 1024 * 1024)
		snprintf(buf, cap, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
	else
		snprintf(buf, cap, "%.1f GiB", (double)bytes / (1024.0 * 1024.0 * 1024.0));
	return buf;
}

/* resolve_match: whether the sandbox id matches what the user typed: a
 * prefix of the id, or of the id without its "sbx_". */
static int resolve_match(const char *id, const char *arg, size_t alen)
{
	return strncmp(id, arg, alen) == 0 ||
	       (strncmp(id, "sbx_", 4) == 0 && strncmp(id + 4, arg, alen) == 0);
}

/* cli_resolve: see cli.h. A whole id is taken as it is (the edge says
 * whether it exists); anything shorter is looked up in the list. */
int cli_resolve(struct tether *t, const char *arg, char *out, size_t cap)
{
	struct tt_err err = { 0 };
	size_t alen = strlen(arg), i, hits = 0;
	const char *first = NULL, *second = NULL;
	json_t *ans, *s;

	if (sbx_id_valid(arg)) {
		snprintf(out, cap, "%s", arg);
		return 0;
	}
	if (alen == 0 || alen >= cap || strspn(arg, "abcdefghijklmnopqrstuvwxyz"
	                                           "0123456789_") != alen)
		return cli_fail("'%s' is not a sandbox id or the start of one", arg), -1;
	if ((ans = tether_list(t, &err)) == NULL)
		return cli_fail("cannot resolve '%s': %s", arg, err.msg), -1;
	json_array_foreach(json_object_get(ans, "sandboxes"), i, s) {
		const char *id = cli_str(s, "id", "");

		if (!resolve_match(id, arg, alen))
			continue;
		if (hits == 0)
			first = id;
		else if (hits == 1)
			second = id;
		hits++;
	}
	if (hits == 1)
		snprintf(out, cap, "%s", first);
	else if (hits == 0)
		cli_fail("no sandbox matches '%s'", arg);
	else
		cli_fail("'%s' is ambiguous: it matches %s, %s%s", arg, first, second,
		         hits > 2 ? " and more" : "");
	json_decref(ans);
	return hits == 1 ? 0 : -1;
}

/* cli_write_all: see cli.h. */
int cli_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

#define METER_AFTER_MS 300 /* nothing for what is over at once */
#define METER_EVERY_MS 200

/* cli_now_ms: see cli.h. */
int64_t cli_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* cli_meter_start: see cli.h. */
void cli_meter_start(struct cli_meter *m, const char *what, int quiet)
{
	m->what = what;
	m->on = !quiet && isatty(STDERR_FILENO);
	m->shown = 0;
	m->t0_ms = m->last_ms = cli_now_ms();
}

/* cli_meter_show: see cli.h. */
void cli_meter_show(struct cli_meter *m, uint64_t done, uint64_t total,
                    const char *note)
{
	int64_t now = cli_now_ms(), el = now - m->t0_ms;
	char d[32], tot[32], rate[32], eta[32] = "";
	double bps;

	if (!m->on || el < METER_AFTER_MS || (m->shown && now - m->last_ms < METER_EVERY_MS))
		return;
	m->last_ms = now;
	if (done == 0 && total == 0 && note != NULL) { /* nothing counted */
		fprintf(stderr, "\r\033[K%s: %s, %.0f s", m->what, note,
		        (double)el / 1000.0);
		fflush(stderr);
		m->shown = 1;
		return;
	}
	bps = (double)done * 1000.0 / (double)el;
	cli_size(done, d, sizeof(d));
	cli_size((uint64_t)bps, rate, sizeof(rate));
	if (total > 0 && done <= total && bps > 0)
		snprintf(eta, sizeof(eta), ", ETA %.0f s", (double)(total - done) / bps);
	if (total > 0)
		fprintf(stderr, "\r\033[K%s %s / %s, %s/s%s%s%s", m->what, d,
		        cli_size(total, tot, sizeof(tot)), rate, eta,
		        note ? ", " : "", note ? note : "");
	else
		fprintf(stderr, "\r\033[K%s %s, %s/s%s%s", m->what, d, rate,
		        note ? ", " : "", note ? note : "");
	fflush(stderr);
	m->shown = 1;
}

/* cli_meter_end: see cli.h. */
void cli_meter_end(struct cli_meter *m)
{
	if (m->shown)
		fprintf(stderr, "\r\033[K");
	fflush(stderr);
	m->shown = 0;
}

/* tether logs [--state DIR] [-f|--follow] [-n N] [ROLE...]: the log files
 * of a `tether up` cluster (STATE/logs/ROLE.log, one per daemon: cp, edge,
 * and each worker's node-api with its manager, w1, w2, …; read only).
 * With one ROLE its lines are printed as they are; with several, or none
 * (all of them), merged by their time (RFC 3339 at the start of a line, or
 * the "ts" of an access-log record) and each prefixed with its role. -n N:
 * only the last N lines (with --follow, default 10). --follow then prints
 * lines as they are written, as `tail -F` does: a file that is replaced or
 * truncated is read again from its start, one that appears later (a
 * worker added, a role that was not up yet) is picked up. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/verbs.h"

#define LOGS_FILES 64          /* roles followed at once */
#define LOGS_LINE_MAX 65536    /* a longer line is cut into pieces */
#define LOGS_TAIL_MAX 1000000  /* -n bound */
#define LOGS_POLL_MS 200
#define LOGS_TS_MAX 32

/* One log file being read. */
struct lf {
	char name[64];         /* its role: the file name without ".log" */
	char path[PATH_MAX];
	int fd;                /* -1: not open (yet) */
	dev_t dev;
	ino_t ino;
	char *buf;             /* LOGS_LINE_MAX bytes read, not yet printed */
	size_t len;
	char *line;            /* the line taken (points into buf), or NULL */
	size_t line_len;
	char ts[LOGS_TS_MAX];  /* its time (or the last one the file had) */
};

/* What is printed, and how. */
struct logs {
	struct lf f[LOGS_FILES];
	size_t n;
	int all;               /* no ROLE given: every file in the dir */
	int prefix;            /* more than one role: "ROLE " before each line */
	size_t width;          /* of the longest role name */
	char dir[PATH_MAX];
	/* -n: the last lines of the merged dump */
	long tail;
	char **ring;
	size_t ring_n;
};

/* lf_open: (re)opens f from its start; 0, or -1 when it is not there. */
static int lf_open(struct lf *f)
{
	struct stat st;
	int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return -1;
	}
	if (f->fd >= 0)
		close(f->fd);
	f->fd = fd;
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	f->len = 0;
	f->line = NULL;
	return 0;
}

/* lf_ts: the time line (n bytes) carries into ts, if it carries one:
 * "2026-12-02T00:50:56.123Z edge[…] …" or an access record's "ts". */
static void lf_ts(const char *line, size_t n, char ts[LOGS_TS_MAX])
{
	const char *p = NULL;
	size_t k;

	if (n >= 20 && line[4] == '-' && line[7] == '-' && line[10] == 'T')
		p = line;
	else if (n > 0 && line[0] == '{' && (p = memmem(line, n, "\"ts\":\"", 6)) != NULL)
		p += 6;
	if (p == NULL)
		return; /* a line without a time keeps the one before it */
	for (k = 0; k + 1 < LOGS_TS_MAX && p + k < line + n && p[k] != ' ' &&
	            p[k] != '"'; k++)
		ts[k] = p[k];
	ts[k] = '\0';
}

/* lf_take: the next complete line of f into f->line (a full buffer
 * counts as a line). 1 = one taken, 0 = none yet. */
static int lf_take(struct lf *f)
{
	char *nl;
	ssize_t r;

	if (f->line != NULL)
		return 1;
	for (;;) {
		nl = f->len ? memchr(f->buf, '\n', f->len) : NULL;
		if (nl != NULL || f->len == LOGS_LINE_MAX) {
			f->line = f->buf;
			f->line_len = nl ? (size_t)(nl - f->buf) + 1 : f->len;
			lf_ts(f->line, f->line_len, f->ts);
			return 1;
		}
		if (f->fd < 0)
			return 0;
		r = read(f->fd, f->buf + f->len, LOGS_LINE_MAX - f->len);
		if (r <= 0)
			return 0; /* EOF for now (a partial line waits) */
		f->len += (size_t)r;
	}
}

/* lf_drop: the taken line is done with. */
static void lf_drop(struct lf *f)
{
	memmove(f->buf, f->buf + f->line_len, f->len - f->line_len);
	f->len -= f->line_len;
	f->line = NULL;
}

/* logs_emit: one line, with its role in front when there are several;
 * into the -n ring while dumping (ring != NULL). */
static void logs_emit(struct logs *l, const struct lf *f, int dump)
{
	char *s = NULL;
	int nl = f->line_len > 0 && f->line[f->line_len - 1] == '\n';
	int len;

	if (l->prefix)
		len = asprintf(&s, "%-*s %.*s%s", (int)l->width, f->name,
		               (int)f->line_len, f->line, nl ? "" : "\n");
	else
		len = asprintf(&s, "%.*s%s", (int)f->line_len, f->line, nl ? "" : "\n");
	if (len < 0)
		return;
	if (dump && l->tail == 0)
		return free(s);
	if (dump && l->ring != NULL) {
		size_t at = l->ring_n++ % (size_t)l->tail;

		free(l->ring[at]);
		l->ring[at] = s;
		return;
	}
	fwrite(s, 1, (size_t)len, stdout);
	free(s);
}

/* logs_merge: every complete line the files hold now, oldest first (by
 * time, then by file order). */
static void logs_merge(struct logs *l, int dump)
{
	for (;;) {
		struct lf *best = NULL;

		for (size_t i = 0; i < l->n; i++)
			if (lf_take(&l->f[i]) &&
			    (best == NULL || strcmp(l->f[i].ts, best->ts) < 0))
				best = &l->f[i];
		if (best == NULL)
			return;
		logs_emit(l, best, dump);
		lf_drop(best);
	}
}

/* logs_add: role name (file dir/name.log) to the files read; 0, or -1
 * when there is no room. */
static int logs_add(struct logs *l, const char *name)
{
	struct lf *f;

	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->f[i].name, name) == 0)
			return 0;
	if (l->n == LOGS_FILES || strlen(name) >= sizeof(f->name))
		return -1;
	f = &l->f[l->n];
	memset(f, 0, sizeof(*f));
	f->fd = -1;
	if ((f->buf = malloc(LOGS_LINE_MAX)) == NULL)
		return -1;
	snprintf(f->name, sizeof(f->name), "%s", name);
	if ((size_t)snprintf(f->path, sizeof(f->path), "%s/%s.log", l->dir, name) >=
	    sizeof(f->path)) {
		free(f->buf);
		return -1;
	}
	lf_open(f);
	l->n++;
	if (strlen(name) > l->width)
		l->width = strlen(name);
	return 0;
}

/* logs_scan: with no ROLE, every *.log of the dir is read (sorted by
 * name, so the order of equal times is stable). */
static void logs_scan(struct logs *l)
{
	struct dirent **ents = NULL;
	int n = scandir(l->dir, &ents, NULL, alphasort);

	for (int i = 0; i < n; i++) {
		size_t len = strlen(ents[i]->d_name);

		if (len > 4 && strcmp(ents[i]->d_name + len - 4, ".log") == 0) {
			ents[i]->d_name[len - 4] = '\0';
			logs_add(l, ents[i]->d_name);
		}
		free(ents[i]);
	}
	free(ents);
}

/* logs_reopen: tail -F: a file replaced (another inode) or truncated is
 * read again from its start; one that appeared is opened. */
static void logs_reopen(struct logs *l)
{
	for (size_t i = 0; i < l->n; i++) {
		struct lf *f = &l->f[i];
		struct stat st;
		off_t pos;

		if (stat(f->path, &st) < 0)
			continue; /* gone for now: keep reading what we hold */
		pos = f->fd >= 0 ? lseek(f->fd, 0, SEEK_CUR) : -1;
		if (f->fd < 0) {
			lf_open(f);
			continue;
		}
		if (st.st_ino == f->ino && st.st_dev == f->dev &&
		    (pos < 0 || st.st_size >= pos))
			continue;
		while (lf_take(f)) { /* the old file's last lines first */
			logs_emit(l, f, 0);
			lf_drop(f);
		}
		lf_open(f);
	}
}

/* logs_follow: prints what is added, until killed. */
static int logs_follow(struct logs *l)
{
	struct timespec nap = { 0, LOGS_POLL_MS * 1000000L };

	for (;;) {
		fflush(stdout);
		if (ferror(stdout))
			return 1;
		nanosleep(&nap, NULL);
		if (l->all)
			logs_scan(l);
		logs_reopen(l);
		logs_merge(l, 0);
	}
}

/* logs_usage: the one usage line. */
static int logs_usage(void)
{
	return cli_fail("usage: tether logs [--state DIR] [-f|--follow] [-n N] [ROLE...]");
}

/* cli_logs: tether logs (see the top of this file). */
int cli_logs(int argc, char **argv)
{
	struct logs l = { .tail = -1 };
	const char *home = getenv("HOME"), *state = getenv("TETHER_STATE");
	char def[PATH_MAX];
	int follow = 0, roles = 0, rc = 0;

	if (home == NULL || home[0] == '\0')
		home = "/root";
	snprintf(def, sizeof(def), "%s/.local/state/tether", home);
	if (state == NULL || state[0] == '\0')
		state = def;
	for (int i = 1; i < argc; i++) {
		char *end;

		if (strcmp(argv[i], "--state") == 0 && i + 1 < argc) {
			state = argv[++i];
		} else if (strcmp(argv[i], "-f") == 0 || strcmp(argv[i], "--follow") == 0) {
			follow = 1;
		} else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
			l.tail = strtol(argv[++i], &end, 10);
			if (*end != '\0' || end == argv[i] || l.tail < 0 || l.tail > LOGS_TAIL_MAX)
				return logs_usage();
		} else if (argv[i][0] == '-') {
			return logs_usage();
		}
	}
	if ((size_t)snprintf(l.dir, sizeof(l.dir), "%s/logs", state) >= sizeof(l.dir))
		return cli_fail("logs: the state dir is too long");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--state") == 0 || strcmp(argv[i], "-n") == 0) {
			i++;
			continue;
		}
		if (argv[i][0] == '-')
			continue;
		if (strchr(argv[i], '/') != NULL || strcmp(argv[i], "..") == 0 ||
		    strcmp(argv[i], ".") == 0)
			return cli_fail("logs: '%s' is not a role (cp, edge, w1, …)", argv[i]);
		if (logs_add(&l, argv[i]) < 0)
			return cli_fail("logs: too many roles");
		if (!follow && l.f[l.n - 1].fd < 0)
			rc = cli_fail("logs: no log of '%s' in %s", argv[i], l.dir);
		roles++;
	}
	if (rc != 0)
		goto out;
	if (roles == 0) {
		struct stat st;

		if (stat(l.dir, &st) < 0 && !follow) {
			rc = cli_fail("logs: no logs in %s (tether up --state DIR writes them; "
			              "give --state DIR)", l.dir);
			goto out;
		}
		l.all = 1;
		logs_scan(&l);
	}
	l.prefix = l.all || roles > 1;
	if (l.tail < 0 && follow)
		l.tail = 10;
	if (l.tail > 0 && (l.ring = calloc((size_t)l.tail, sizeof(char *))) == NULL) {
		rc = cli_fail("out of memory");
		goto out;
	}
	logs_merge(&l, 1);
	if (l.ring != NULL) {
		size_t have = l.ring_n < (size_t)l.tail ? l.ring_n : (size_t)l.tail;

		for (size_t k = l.ring_n - have; k < l.ring_n; k++)
			fputs(l.ring[k % (size_t)l.tail], stdout);
	}
	if (follow)
		rc = logs_follow(&l);
	else if (fflush(stdout) != 0)
		rc = 1;
out:
	for (size_t i = 0; i < l.n; i++) {
		if (l.f[i].fd >= 0)
			close(l.f[i].fd);
		free(l.f[i].buf);
	}
	if (l.ring != NULL)
		for (long k = 0; k < l.tail; k++)
			free(l.ring[k]);
	free(l.ring);
	return rc;
}

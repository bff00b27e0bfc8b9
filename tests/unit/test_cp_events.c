/* The control plane's lifecycle timing (src/cp/events.c) on a real
 * database file: an operation is observed when the sandbox's state says
 * it ended — ok or failed —, not before; a migrate ends with its resume
 * on the target, and fails when it stays paused with its target dropped;
 * the gauges count sandboxes and workers by state at scrape time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cp/cp.h"
#include "cp/events.h"
#include "metrics.h"

struct fix {
	char dir[64];
	struct cp cp;
};

/* setup: a cp with a fresh database file and worker w1 registered. */
static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	struct tt_err err = { 0 };
	char path[128];

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/tt-cpev.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(path, sizeof(path), "%s/cp.db", f->dir);
	f->cp.db = cpdb_open(path, &err);
	assert_non_null(f->cp.db);
	f->cp.worker_timeout = 60;
	assert_int_equal(cpdb_worker_register(f->cp.db, "w1", "http://127.0.0.1:1",
	                                      tt_now(), &err), 0);
	*state = f;
	return 0;
}

/* teardown: close and remove the files. */
static int teardown(void **state)
{
	struct fix *f = *state;
	char cmd[160];

	cpdb_close(f->cp.db);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
	assert_int_equal(system(cmd), 0);
	free(f);
	return 0;
}

/* sample: the value of one series in the rendered metrics (-1: absent). */
static long sample(const char *series)
{
	char *txt = metrics_render(), *p;
	long v = -1;
	size_t n = strlen(series);

	assert_non_null(txt);
	for (p = txt; (p = strstr(p, series)) != NULL; p += n)
		if ((p == txt || p[-1] == '\n') && p[n] == ' ')
			v = strtol(p + n + 1, NULL, 10);
	free(txt);
	return v;
}

#define COUNT(op, res) \
	"tether_cp_lifecycle_duration_seconds_count{op=\"" op "\",result=\"" res "\"}"

/* sbx_new: a sandbox starting on w1. */
static void sbx_new(struct fix *f, const char *id, struct cp_sandbox *sb)
{
	struct tt_err err = { 0 };
	int64_t rev;

	assert_int_equal(cpdb_sandbox_create(f->cp.db, id, "w1", 0, tt_now(), sb, &rev,
	                                     &err), 0);
}

/* A create is timed until the install's ack moved the sandbox: running
 * is ok, failed is failed; still starting, nothing is observed. */
static void test_create_outcomes(void **state)
{
	struct fix *f = *state;
	struct tt_err err = { 0 };
	struct cp_sandbox a, b;
	long ok0 = sample(COUNT("create", "ok")), bad0 = sample(COUNT("create", "failed"));

	sbx_new(f, "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa", &a);
	sbx_new(f, "sbx_bbbbbbbbbbbbbbbbbbbbbbbbbb", &b);
	cp_events_begin(&a, "create", 1, "w1");
	cp_events_begin(&b, "create", 1, "w1");
	cp_events_check(&f->cp, a.id);
	assert_int_equal(sample(COUNT("create", "ok")), ok0); /* still starting */
	assert_int_equal(cpdb_sandbox_set_state(f->cp.db, a.id, "running", NULL, &err), 0);
	assert_int_equal(cpdb_sandbox_set_state(f->cp.db, b.id, "failed", "boom", &err), 0);
	cp_events_check(&f->cp, a.id);
	cp_events_check(&f->cp, b.id);
	assert_int_equal(sample(COUNT("create", "ok")), (ok0 < 0 ? 0 : ok0) + 1);
	assert_int_equal(sample(COUNT("create", "failed")), (bad0 < 0 ? 0 : bad0) + 1);
	/* once observed, a later check observes nothing more */
	cp_events_check(&f->cp, a.id);
	assert_int_equal(sample(COUNT("create", "ok")), (ok0 < 0 ? 0 : ok0) + 1);
}

/* A migrate whose resume could not begin: the pause is ok, the migrate
 * failed once the sandbox is paused with its target dropped. */
static void test_migrate_stranded(void **state)
{
	struct fix *f = *state;
	struct tt_err err = { 0 };
	struct cp_snapshot sn = { .generation = 1, .size = 1 };
	struct cp_sandbox a;
	int64_t rev;
	long p0 = sample(COUNT("pause", "ok")), m0 = sample(COUNT("migrate", "failed"));

	sbx_new(f, "sbx_cccccccccccccccccccccccccc", &a);
	assert_int_equal(cpdb_sandbox_set_state(f->cp.db, a.id, "running", NULL, &err), 0);
	assert_int_equal(cpdb_sandbox_get(f->cp.db, a.id, &a, &err), 1);
	assert_int_equal(cpdb_sandbox_pause(f->cp.db, &a, "w2", NULL, tt_now(), &rev, &err), 1);
	cp_events_begin(&a, "pause", 1, "w2");
	snprintf(sn.sandbox, sizeof(sn.sandbox), "%s", a.id);
	snprintf(sn.key, sizeof(sn.key), "%s/1", a.id);
	snprintf(sn.checksum, sizeof(sn.checksum), "blake2b:01");
	assert_int_equal(cpdb_sandbox_paused(f->cp.db, a.id, 1, rev, &sn, &err), 1);
	cp_events_check(&f->cp, a.id);
	assert_int_equal(sample(COUNT("pause", "ok")), (p0 < 0 ? 0 : p0) + 1);
	assert_int_equal(sample(COUNT("migrate", "failed")), m0); /* its resume may come */
	assert_true(cpdb_sandbox_migrate_clear(f->cp.db, a.id, 1, "no room", &err) >= 0);
	cp_events_check(&f->cp, a.id);
	assert_int_equal(sample(COUNT("migrate", "failed")), (m0 < 0 ? 0 : m0) + 1);
}

/* The gauges: every state has a series, read from the database now. */
static void test_gauges(void **state)
{
	struct fix *f = *state;
	struct tt_err err = { 0 };
	struct cp_sandbox a;

	sbx_new(f, "sbx_dddddddddddddddddddddddddd", &a);
	cp_events_gauges(&f->cp);
	assert_int_equal(sample("tether_cp_sandboxes{state=\"starting\"}"), 1);
	assert_int_equal(sample("tether_cp_sandboxes{state=\"paused\"}"), 0);
	assert_int_equal(sample("tether_cp_workers{state=\"up\"}"), 1);
	assert_int_equal(cpdb_sandbox_set_state(f->cp.db, a.id, "running", NULL, &err), 0);
	cp_events_gauges(&f->cp);
	assert_int_equal(sample("tether_cp_sandboxes{state=\"starting\"}"), 0);
	assert_int_equal(sample("tether_cp_sandboxes{state=\"running\"}"), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_outcomes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_migrate_stranded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gauges, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

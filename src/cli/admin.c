/* tether admin: operator verbs that need the admin API key.
 *   admin rotate-keys [--json]: rotates the capability signing key (SPEC
 *     §3, docs/API.md "Key rotation"): the next key is published to every
 *     worker, and signs once they all acknowledged it; waits until then.
 *   admin keys: the key bundle and who signs (JSON). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/verbs.h"
#include "client/tether.h"

#define ADMIN_WAIT_MS 75000 /* the cp gives up after 60 s */

/* admin_sleep_ms: nanosleep. */
static void admin_sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* admin_rotate: POST, then GET until the next key signs (or the cp says
 * why it did not). */
static int admin_rotate(int json)
{
	struct tt_err err = { 0 };
	struct tether *t = cli_open();
	json_t *ans, *st = NULL;
	char next[128], old[128];

	if (t == NULL)
		return 1;
	ans = tether_admin_rotate_keys(t, &err);
	if (ans == NULL) {
		tether_free(t);
		return cli_fail("admin rotate-keys: %s", err.msg);
	}
	snprintf(next, sizeof(next), "%s", cli_str(ans, "next", ""));
	snprintf(old, sizeof(old), "%s", cli_str(ans, "signing", ""));
	json_decref(ans);
	for (long waited = 0; waited < ADMIN_WAIT_MS; waited += 200) {
		json_decref(st);
		st = tether_admin_keys(t, &err);
		if (st == NULL)
			break;
		if (strcmp(cli_str(st, "signing", ""), next) == 0)
			break;
		if (json_is_null(json_object_get(st, "rotation")) &&
		    json_is_string(json_object_get(st, "error"))) {
			tether_free(t);
			cli_fail("admin rotate-keys: %s", cli_str(st, "error", "?"));
			json_decref(st);
			return 1;
		}
		admin_sleep_ms(200);
	}
	tether_free(t);
	if (st == NULL || strcmp(cli_str(st, "signing", ""), next) != 0) {
		json_decref(st);
		return cli_fail("admin rotate-keys: %s is published but not signing yet (%s)",
		                next, err.msg[0] ? err.msg : "waited too long");
	}
	if (json)
		cli_print_json(st);
	else
		printf("signing with %s\n%s stopped signing; it verifies until what it signed "
		       "has expired (135 s)\n", next, old);
	json_decref(st);
	return 0;
}

/* cli_admin: admin rotate-keys [--json] | admin keys. */
int cli_admin(int argc, char **argv)
{
	struct tt_err err = { 0 };
	struct tether *t;
	json_t *st;

	if (argc >= 2 && strcmp(argv[1], "rotate-keys") == 0 &&
	    (argc == 2 || (argc == 3 && strcmp(argv[2], "--json") == 0)))
		return admin_rotate(argc == 3);
	if (argc != 2 || strcmp(argv[1], "keys") != 0)
		return cli_fail("usage: tether admin rotate-keys [--json] | tether admin keys");
	if ((t = cli_open()) == NULL)
		return 1;
	st = tether_admin_keys(t, &err);
	tether_free(t);
	if (st == NULL)
		return cli_fail("admin keys: %s", err.msg);
	cli_print_json(st);
	json_decref(st);
	return 0;
}

/* tether: the command-line client. Dispatches to one function per verb;
 * verbs are linked weakly so that the CLI builds while verbs are written. */
#include <stdio.h>
#include <string.h>

#include "cli/verbs.h"

#pragma weak cli_cap
#pragma weak cli_up
#pragma weak cli_create
#pragma weak cli_ls
#pragma weak cli_info
#pragma weak cli_workers
#pragma weak cli_exec
#pragma weak cli_cp
#pragma weak cli_rm
#pragma weak cli_pause
#pragma weak cli_resume
#pragma weak cli_migrate
#pragma weak cli_shell
#pragma weak cli_watch
#pragma weak cli_expose

struct verb {
	const char *name;
	int (*fn)(int, char **);
	const char *usage;
};

static const struct verb verbs[] = {
	{ "up", cli_up, "up [--workers N] [--state DIR]" },
	{ "create", cli_create, "create [--worker W]" },
	{ "ls", cli_ls, "ls [--json]" },
	{ "info", cli_info, "info ID [--json]" },
	{ "workers", cli_workers, "workers [--json]" },
	{ "exec", cli_exec, "exec ID -- CMD [ARG...]" },
	{ "cp", cli_cp, "cp SRC DST            (local <-> ID:/path)" },
	{ "rm", cli_rm, "rm ID" },
	{ "pause", cli_pause, "pause ID" },
	{ "resume", cli_resume, "resume ID [--worker W]" },
	{ "migrate", cli_migrate, "migrate ID --worker W" },
	{ "shell", cli_shell, "shell ID" },
	{ "watch", cli_watch, "watch ID PATH" },
	{ "expose", cli_expose, "expose ID PORT [--proto http|tcp]" },
	{ "cap", cli_cap, "cap ID [--purpose control|port] [--ops a,b] [--port P --proto tcp]\n"
	                  "  tether cap inspect TOKEN [--key PUBKEY] [--implicit STR]" },
};

/* usage: prints the verbs this build has. */
static int usage(FILE *out)
{
	fprintf(out, "usage:\n");
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
		if (verbs[i].fn != NULL)
			fprintf(out, "  tether %s\n", verbs[i].usage);
	fprintf(out, "\nTETHER_URL and TETHER_API_KEY come from the environment "
	             "or ~/.config/tether.\n");
	return out == stderr ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
	    strcmp(argv[1], "help") == 0)
		return usage(stdout);
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
		if (strcmp(argv[1], verbs[i].name) != 0)
			continue;
		if (verbs[i].fn == NULL) {
			fprintf(stderr, "tether: '%s' is not part of this build\n", argv[1]);
			return 1;
		}
		return verbs[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "tether: unknown command '%s' (try tether help)\n", argv[1]);
	return 1;
}

/* tether: the command-line client. Dispatches to one function per verb;
 * verbs are linked weakly so that the CLI builds while verbs are written. */
#include <stdio.h>
#include <string.h>

#include "cli/verbs.h"
#include "version.h"

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
#pragma weak cli_keys
#pragma weak cli_logs

struct verb {
	const char *name;
	int (*fn)(int, char **);
	const char *usage;
};

static const struct verb verbs[] = {
	{ "up", cli_up, "up [--workers N] [--state DIR] [--port BASE] [--disk-mb N] [--cp-replicas R --db postgresql://…]\tstart a local cluster in the foreground (N: each sandbox's disk cap, MiB)" },
	{ "create", cli_create, "create [--worker W] [--cpu MILLICORES]\tstart a sandbox; prints its id" },
	{ "ls", cli_ls, "ls [--state S] [-q|--json]\tlist sandboxes: state, generation, worker (-q: ids only)" },
	{ "info", cli_info, "info ID [--json]\tone sandbox in detail, with its latest snapshot" },
	{ "workers", cli_workers, "workers [--json]\tregistered workers and their addresses" },
	{ "exec", cli_exec, "exec [-i|--stdin] ID -- CMD [ARG...]\trun a command, streaming its output; exits with its status (125: tether failed)" },
	{ "cp", cli_cp, "cp [-r] [-q] SRC DST\tcopy files (-r: trees) between here (or - for stdin/stdout) and ID:/path" },
	{ "rm", cli_rm, "rm ID...\tdelete sandboxes and their data; prints each id removed" },
	{ "pause", cli_pause, "pause ID [-q] [--json]\tsnapshot a sandbox and stop it" },
	{ "resume", cli_resume, "resume ID [--worker W] [--force] [-q]\tstart a paused sandbox from its snapshot" },
	{ "migrate", cli_migrate, "migrate ID --worker W [-q]\tmove a sandbox to another worker (pause + resume)" },
	{ "shell", cli_shell, "shell ID\tinteractive shell in a sandbox" },
	{ "watch", cli_watch, "watch ID PATH\tfile events under PATH" },
	{ "expose", cli_expose, "expose ID PORT [--proto http|tcp]\tthe gateway address for a sandbox port" },
	{ "keys", cli_keys, "keys [--json]\tthe cluster's public keys (k4.public), for cap inspect --key" },
	{ "logs", cli_logs, "logs [--state DIR] [-f|--follow] [-n N] [ROLE...]\tthe cluster's log files (tether up), merged by time or one role's; -f follows" },
	{ "admin", cli_admin, "admin rotate-keys [--json] | admin keys\trotate the capability signing key (admin key); show the key bundle" },
	{ "cap", cli_cap, "cap ID [--purpose control|port] [--ops a,b] [--port P --proto tcp|http]\t"
	                  "issue a capability token (JSON)\n"
	                  "cap inspect TOKEN|- [--key PUBKEY] [--implicit STR]\t"
	                  "decode (and with --key verify) a capability" },
};

#define USAGE_COL 44 /* where descriptions start */

/* usage_line: one "synopsis<TAB>description" line of a usage string,
 * aligned; a long synopsis puts its description on the next line. */
static void usage_line(FILE *out, const char *line, size_t len)
{
	const char *tab = memchr(line, '\t', len);
	int syn = (int)(tab ? (size_t)(tab - line) : len);

	if (tab == NULL) {
		fprintf(out, "  tether %.*s\n", syn, line);
		return;
	}
	if (syn + 9 > USAGE_COL)
		fprintf(out, "  tether %.*s\n%*s", syn, line, USAGE_COL, "");
	else
		fprintf(out, "  tether %-*.*s", USAGE_COL - 9, syn, line);
	fprintf(out, "%.*s\n", (int)(len - (size_t)syn - 1), tab + 1);
}

/* verb_usage: every line of one verb's usage string. */
static void verb_usage(FILE *out, const struct verb *v)
{
	const char *p = v->usage;

	while (*p) {
		size_t len = strcspn(p, "\n");
		usage_line(out, p, len);
		p += len + (p[len] == '\n');
	}
}

/* usage: prints the verbs this build has. */
static int usage(FILE *out)
{
	fprintf(out, "usage: tether VERB [ARGS]   (tether VERB --help: that verb; tether --version)\n\n");
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
		if (verbs[i].fn != NULL)
			verb_usage(out, &verbs[i]);
	fprintf(out, "\nID: a sandbox id or a unique start of one (sbx_ may be left out).\n"
	             "exec exits with the command's status, 125 when tether failed;\n"
	             "other verbs 0, or 1 with one line on stderr. docs/CLI.md has it all.\n");
	fprintf(out, "\nThe cluster's URL and API key come from TETHER_URL and "
	             "TETHER_API_KEY,\nor from ~/.config/tether/config, which "
	             "'tether up' writes.\n");
	return out == stderr ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (strcmp(argv[1], "--version") == 0) {
		printf("tether %s\n", TETHER_VERSION);
		return 0;
	}
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
		if (argc == 3 && (strcmp(argv[2], "--help") == 0 ||
		                  strcmp(argv[2], "-h") == 0)) {
			verb_usage(stdout, &verbs[i]);
			return 0;
		}
		return verbs[i].fn(argc - 1, argv + 1);
	}
	fprintf(stderr, "tether: unknown command '%s' (try tether help)\n", argv[1]);
	return 1;
}

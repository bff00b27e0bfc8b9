/* CLI verbs that talk to the edge through libtether: create, ls, info,
 * workers, keys, rm, exec and cap (issue); cp is in cp.c. Each prints one
 * "tether: …" line on failure and returns 1 (exec: 125). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cleanup.h"
#include "cli/cli.h"
#include "cli/verbs.h"
#include "client/tether.h"

/* has_flag: whether argv holds flag (simple verbs take few options). */
static int has_flag(int argc, char **argv, const char *flag)
{
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], flag) == 0)
			return 1;
	return 0;
}

/* cpu_arg: --cpu's value, millicores: digits only, > 0 (the control
 * plane checks its bounds and says them); 0 when it is not that. */
static uint32_t cpu_arg(const char *s)
{
	char *end = NULL;
	unsigned long long v;

	if (s[0] < '0' || s[0] > '9')
		return 0;
	errno = 0;
	v = strtoull(s, &end, 10);
	return errno != 0 || *end != '\0' || v > UINT32_MAX ? 0 : (uint32_t)v;
}

/* cpu_refuse: the usage error for a --cpu value that is not millicores
 * (a number of CPUs, docker's --cpus, gets its translation). */
static int cpu_refuse(const char *s)
{
	char *end = NULL;
	double cpus = strtod(s, &end);

	if (end != s && *end == '\0' && strchr(s, '.') != NULL && cpus > 0 && cpus < 1000)
		return cli_fail("create: --cpu takes millicores: %s CPU is --cpu %.0f", s,
		                cpus * 1000);
	return cli_fail("create: --cpu takes a whole number of millicores (1000 = one "
	                "CPU, 250 = a quarter), not '%s'", s);
}

/* cli_create: create [--worker W] [--cpu N] [--substrate S]; prints the new sandbox id. */
int cli_create(int argc, char **argv)
{
	static const char usage[] = "usage: tether create [--worker W] [--cpu MILLICORES]"
	                            " [--substrate ns|microvm]";
	struct tether_create_opts o = { 0 };
	struct tt_err err = { 0 };
	struct tether *t;
	json_t *sbx;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--worker") == 0 && i + 1 < argc) {
			o.worker = argv[++i];
		} else if (strcmp(argv[i], "--cpu") == 0 && i + 1 < argc) {
			if ((o.cpu = cpu_arg(argv[++i])) == 0)
				return cpu_refuse(argv[i]);
		} else if (strcmp(argv[i], "--substrate") == 0 && i + 1 < argc) {
			o.substrate = argv[++i];
		} else {
			return cli_fail("%s", usage);
		}
	}
	if ((t = cli_open()) == NULL)
		return 1;
	sbx = tether_create_with(t, &o, &err);
	tether_free(t);
	if (sbx == NULL)
		return cli_fail("create: %s", err.msg);
	printf("%s\n", cli_str(sbx, "id", "?"));
	json_decref(sbx);
	return 0;
}

/* ls_keep: drops from list the sandboxes not in state (NULL: all). */
static void ls_keep(json_t *list, const char *state)
{
	for (size_t i = json_array_size(list); state != NULL && i-- > 0;)
		if (strcmp(cli_str(json_array_get(list, i), "state", ""), state) != 0)
			json_array_remove(list, i);
}

/* ls_table: an aligned table of sandboxes. */
static void ls_table(json_t *list)
{
	int wid = 2, wst = 5, wgen = 3;
	size_t i;
	json_t *s;

	json_array_foreach(list, i, s) {
		char gen[24];
		int l;
		l = (int)strlen(cli_str(s, "id", "?"));
		wid = l > wid ? l : wid;
		l = (int)strlen(cli_str(s, "state", "?"));
		wst = l > wst ? l : wst;
		l = snprintf(gen, sizeof(gen), "%" JSON_INTEGER_FORMAT,
		             cli_int(s, "generation"));
		wgen = l > wgen ? l : wgen;
	}
	printf("%-*s  %-*s  %*s  %s\n", wid, "ID", wst, "STATE", wgen, "GEN", "WORKER");
	json_array_foreach(list, i, s)
		printf("%-*s  %-*s  %*" JSON_INTEGER_FORMAT "  %s\n", wid,
		       cli_str(s, "id", "?"), wst, cli_str(s, "state", "?"), wgen,
		       cli_int(s, "generation"),
		       cli_str(s, "worker", "-"));
}

/* cli_ls: ls [--state S] [-q|--json]; a table, the ids only (-q), or the
 * list's JSON, of every sandbox or those in state S. */
int cli_ls(int argc, char **argv)
{
	static const char usage[] = "usage: tether ls [--state S] [-q|--json]";
	static const char *const states[] = { "starting", "running", "pausing",
	                                      "paused", "resuming", "failed",
	                                      "deleting" };
	struct tt_err err = { 0 };
	const char *state = NULL;
	struct tether *t;
	json_t *ans, *list, *s;
	int json = 0, quiet = 0, known = 0;
	size_t i;

	for (int a = 1; a < argc; a++) {
		if (strcmp(argv[a], "--json") == 0)
			json = 1;
		else if (strcmp(argv[a], "-q") == 0 || strcmp(argv[a], "--quiet") == 0)
			quiet = 1;
		else if (strcmp(argv[a], "--state") == 0 && a + 1 < argc)
			state = argv[++a];
		else
			return cli_fail("%s", usage);
	}
	if (json && quiet)
		return cli_fail("%s", usage);
	for (i = 0; state != NULL && i < sizeof(states) / sizeof(states[0]); i++)
		known |= strcmp(state, states[i]) == 0;
	if (state != NULL && !known)
		return cli_fail("ls: unknown state '%s' (starting, running, pausing, "
		                "paused, resuming, failed or deleting)", state);
	if ((t = cli_open()) == NULL)
		return 1;
	ans = tether_list(t, &err);
	tether_free(t);
	if (ans == NULL)
		return cli_fail("ls: %s", err.msg);
	list = json_object_get(ans, "sandboxes");
	ls_keep(list, state);
	if (json)
		cli_print_json(ans);
	else if (quiet)
		json_array_foreach(list, i, s)
			printf("%s\n", cli_str(s, "id", "?"));
	else
		ls_table(list);
	json_decref(ans);
	return 0;
}

/* info_print: the plain "key: value" view of a sandbox; its snapshot
 * (the latest complete one) when it has one, progress while pausing. */
static void info_print(json_t *s)
{
	json_t *snap = json_object_get(s, "snapshot");
	json_t *prog = json_object_get(s, "progress");
	char size[32], total[32];

	printf("id:          %s\n", cli_str(s, "id", "?"));
	printf("state:       %s\n", cli_str(s, "state", "?"));
	if (json_object_get(s, "error"))
		printf("error:       %s\n", cli_str(s, "error", ""));
	if (json_object_get(s, "note")) /* e.g. relaunched after a crash */
		printf("note:        %s\n", cli_str(s, "note", ""));
	if (json_object_get(s, "resume_on"))
		printf("resumes on:  %s (paused when it stopped; back when it is)\n",
		       cli_str(s, "resume_on", ""));
	printf("generation:  %" JSON_INTEGER_FORMAT "\n", cli_int(s, "generation"));
	printf("worker:      %s\n", cli_str(s, "worker", "-"));
	printf("substrate:   %s\n", cli_str(s, "substrate", "-"));
	printf("activation:  %" JSON_INTEGER_FORMAT "\n", cli_int(s, "activation"));
	if (json_is_integer(json_object_get(s, "cpu")))
		printf("cpu:         %" JSON_INTEGER_FORMAT " millicores (%.2f CPU)\n",
		       cli_int(s, "cpu"), (double)cli_int(s, "cpu") / 1000);
	else
		printf("cpu:         the worker's default\n");
	printf("created_at:  %s\n", cli_str(s, "created_at", "-"));
	if (json_is_object(snap))
		printf("snapshot:    generation %" JSON_INTEGER_FORMAT ", %s, taken %s\n",
		       cli_int(snap, "generation"),
		       cli_size((uint64_t)cli_int(snap, "size"), size, sizeof(size)),
		       cli_str(snap, "created_at", "-"));
	else
		printf("snapshot:    none\n");
	if (json_is_object(prog)) {
		cli_size((uint64_t)cli_int(prog, "bytes"), size, sizeof(size));
		if (json_is_integer(json_object_get(prog, "total")))
			printf("progress:    %s of %s\n", size,
			       cli_size((uint64_t)cli_int(prog, "total"), total,
			                sizeof(total)));
		else
			printf("progress:    %s\n", size);
	}
}

/* cli_info: info ID [--json]. */
int cli_info(int argc, char **argv)
{
	struct tt_err err = { 0 };
	const char *id = NULL;
	char full[CLI_ID_MAX];
	struct tether *t;
	json_t *s;
	int json = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = 1;
		else if (id == NULL && argv[i][0] != '-')
			id = argv[i];
		else
			return cli_fail("usage: tether info ID [--json]");
	}
	if (id == NULL)
		return cli_fail("usage: tether info ID [--json]");
	if ((t = cli_open()) == NULL)
		return 1;
	if (cli_resolve(t, id, full, sizeof(full)) < 0) {
		tether_free(t);
		return 1;
	}
	s = tether_info(t, full, &err);
	tether_free(t);
	if (s == NULL)
		return cli_fail("info %s: %s", full, err.msg);
	if (json)
		cli_print_json(s);
	else
		info_print(s);
	json_decref(s);
	return 0;
}

/* cli_workers: workers [--json]. */
int cli_workers(int argc, char **argv)
{
	struct tt_err err = { 0 };
	struct tether *t;
	json_t *ans, *w;
	int json = has_flag(argc, argv, "--json");
	size_t i;

	if (argc > 2 || (argc == 2 && !json))
		return cli_fail("usage: tether workers [--json]");
	if ((t = cli_open()) == NULL)
		return 1;
	ans = tether_workers(t, &err);
	tether_free(t);
	if (ans == NULL)
		return cli_fail("workers: %s", err.msg);
	if (json) {
		cli_print_json(ans);
	} else {
		printf("%-8s  %-5s  %-26s  %s\n", "ID", "STATE", "NODE_URL", "LAST_SEEN");
		json_array_foreach(json_object_get(ans, "workers"), i, w)
			printf("%-8s  %-5s  %-26s  %s\n", cli_str(w, "id", "?"),
			       cli_str(w, "state", "?"), cli_str(w, "node_url", "-"),
			       cli_str(w, "last_seen", "-"));
	}
	json_decref(ans);
	return 0;
}

/* cli_keys: keys [--json]; the cluster's public keys (PASERK k4.public),
 * one a line in the bundle's order, as cap inspect --key takes them. */
int cli_keys(int argc, char **argv)
{
	struct tt_err err = { 0 };
	struct tether *t;
	json_t *ans, *k;
	int json = has_flag(argc, argv, "--json");
	size_t i;

	if (argc > 2 || (argc == 2 && !json))
		return cli_fail("usage: tether keys [--json]");
	if ((t = cli_open()) == NULL)
		return 1;
	ans = tether_keys(t, &err);
	tether_free(t);
	if (ans == NULL)
		return cli_fail("keys: %s", err.msg);
	if (json)
		cli_print_json(ans);
	else
		json_array_foreach(json_object_get(ans, "keys"), i, k)
			printf("%s\n", cli_str(k, "public", "?"));
	json_decref(ans);
	return 0;
}

/* cli_rm: rm ID...; prints each id removed and goes on past one that
 * fails (exit 1 if any did). */
int cli_rm(int argc, char **argv)
{
	struct tether *t;
	int rc = 0;

	if (argc < 2)
		return cli_fail("usage: tether rm ID...");
	for (int i = 1; i < argc; i++)
		if (argv[i][0] == '-')
			return cli_fail("usage: tether rm ID...");
	if ((t = cli_open()) == NULL)
		return 1;
	for (int i = 1; i < argc; i++) {
		struct tt_err err = { 0 };
		char id[CLI_ID_MAX];

		if (cli_resolve(t, argv[i], id, sizeof(id)) < 0) {
			rc = 1;
		} else if (tether_rm(t, id, &err) < 0) {
			rc = cli_fail("rm %s: %s", id, err.msg);
		} else {
			printf("%s\n", id);
			fflush(stdout);
		}
	}
	tether_free(t);
	return rc;
}

/* exec_output: streamed output goes straight to our stdout / stderr. */
static int exec_output(void *arg, int fd, const void *data, size_t len)
{
	(void)arg;
	cli_write_all(fd == 2 ? STDERR_FILENO : STDOUT_FILENO, data, len);
	return 0;
}

/* exec_fail: cli_fail's one line, with the exit status that tells
 * tether's own failure from the command's (125, as docker does). */
#define EXEC_FAILED 125
#define exec_fail(...) (cli_fail(__VA_ARGS__), EXEC_FAILED)

/* exec_stdin_unread: whether our stdin holds input the command will not
 * see (no --stdin): a file with bytes left, or a pipe with bytes waiting
 * (an idle or empty pipe, /dev/null, a terminal: nothing to warn about). */
static int exec_stdin_unread(void)
{
	struct stat st;
	off_t at;
	int avail = 0;

	if (isatty(STDIN_FILENO) || fstat(STDIN_FILENO, &st) < 0)
		return 0;
	if (S_ISREG(st.st_mode))
		return (at = lseek(STDIN_FILENO, 0, SEEK_CUR)) >= 0 && at < st.st_size;
	return (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) &&
	       ioctl(STDIN_FILENO, FIONREAD, &avail) == 0 && avail > 0;
}

/* cli_exec: exec [-i|--stdin] ID [--] CMD [ARG...]; streams output as it
 * comes (docs/API.md "Streamed exec") and exits with the command's status,
 * or 125 when tether itself failed (docs/CLI.md). --stdin forwards our
 * stdin when it is not a terminal; without it, input waiting on stdin is
 * not read (a script's loop keeps its input) and one line says so. */
int cli_exec(int argc, char **argv)
{
	static const char usage[] = "usage: tether exec [-i|--stdin] ID -- CMD [ARG...]";
	struct tether_exec_stream s = { .on_output = exec_output, .stdin_fd = -1 };
	struct tt_err err = { 0 };
	struct tether *t;
	const char *id = NULL;
	char full[CLI_ID_MAX];
	int first = -1, code = 0, want_stdin = 0;

	for (int i = 1; i < argc && first < 0; i++) {
		if (strcmp(argv[i], "--stdin") == 0 || strcmp(argv[i], "-i") == 0)
			want_stdin = 1;
		else if (strcmp(argv[i], "--") == 0)
			first = i + 1;
		else if (argv[i][0] == '-')
			return exec_fail("%s", usage);
		else if (id == NULL)
			id = argv[i];
		else
			first = i; /* "exec ID CMD…" without "--" */
	}
	if (id == NULL || first < 0 || first >= argc)
		return exec_fail("%s", usage);
	if (want_stdin && !isatty(STDIN_FILENO))
		s.stdin_fd = STDIN_FILENO;
	else if (!want_stdin && exec_stdin_unread())
		fprintf(stderr, "tether: exec: stdin is not forwarded without "
		                "--stdin (ignored)\n");
	if ((t = cli_open()) == NULL)
		return EXEC_FAILED;
	if (cli_resolve(t, id, full, sizeof(full)) < 0) {
		tether_free(t);
		return EXEC_FAILED;
	}
	if (tether_exec_stream(t, full, argv + first, &s, &code, NULL, &err) < 0) {
		tether_free(t);
		return exec_fail("exec %s: %s", full, err.msg);
	}
	tether_free(t);
	if (code < 0 || code > 255)
		return 255;
	return code;
}

/* ops_array: "a,b" -> ["a","b"]. */
static json_t *ops_array(const char *list)
{
	json_t *arr = json_array();
	const char *p = list;

	while (arr && *p) {
		size_t n = strcspn(p, ",");
		if (n > 0)
			json_array_append_new(arr, json_stringn(p, n));
		p += n;
		if (*p == ',')
			p++;
	}
	return arr;
}

/* cli_cap_issue: cap ID [--purpose control|port] [--ops a,b] [--port P
 * --proto tcp|http]; prints the capability JSON (token, expires_at, route). */
int cli_cap_issue(int argc, char **argv)
{
	const char *purpose = "control", *ops = "exec,fs.read,fs.write";
	const char *proto = "tcp", *id = NULL;
	char full[CLI_ID_MAX];
	long port = -1;
	struct tt_err err = { 0 };
	struct tether *t;
	json_t *req, *ans;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--purpose") == 0 && v) {
			purpose = v;
			i++;
		} else if (strcmp(a, "--ops") == 0 && v) {
			ops = v;
			i++;
		} else if (strcmp(a, "--port") == 0 && v) {
			char *end;
			port = strtol(v, &end, 10);
			if (*end || port < 1 || port > 65535)
				return cli_fail("cap: bad port '%s'", v);
			i++;
		} else if (strcmp(a, "--proto") == 0 && v) {
			proto = v;
			i++;
		} else if (id == NULL && a[0] != '-') {
			id = a;
		} else {
			return cli_fail("usage: tether cap ID [--purpose control|port] "
			            "[--ops a,b] [--port P --proto tcp|http]");
		}
	}
	if (id == NULL)
		return cli_fail("usage: tether cap ID [--purpose control|port] "
		            "[--ops a,b] [--port P --proto tcp|http]");
	if (strcmp(purpose, "control") == 0) {
		req = json_pack("{s:s,s:o}", "purpose", "control", "ops", ops_array(ops));
	} else if (strcmp(purpose, "port") == 0) {
		if (port < 0)
			return cli_fail("cap: --purpose port needs --port P");
		if (strcmp(proto, "tcp") != 0 && strcmp(proto, "http") != 0)
			return cli_fail("cap: --proto must be tcp or http");
		req = json_pack("{s:s,s:I,s:s}", "purpose", "port", "port",
		                (json_int_t)port, "proto", proto);
	} else {
		return cli_fail("cap: --purpose must be control or port");
	}
	if (req == NULL)
		return cli_fail("cap: out of memory");
	if ((t = cli_open()) == NULL) {
		json_decref(req);
		return 1;
	}
	if (cli_resolve(t, id, full, sizeof(full)) < 0) {
		tether_free(t);
		json_decref(req);
		return 1;
	}
	ans = tether_cap_issue(t, full, req, &err);
	tether_free(t);
	json_decref(req);
	if (ans == NULL)
		return cli_fail("cap %s: %s", full, err.msg);
	cli_print_json(ans);
	json_decref(ans);
	return 0;
}

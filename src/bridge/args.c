/* tether-bridge's options and a spare's assignment: see args.h. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "bridge/args.h"
#include "fsutil.h"

/* bridge_args_init: see args.h. */
void bridge_args_init(struct bridge_args *a)
{
	memset(a, 0, sizeof(*a));
	a->secret_fd = -1;
	a->assign_fd = -1;
	a->ready_fd = -1;
}

/* parse_num: a decimal number in [min, max] or -1. */
static int parse_num(const char *s, unsigned long long min, unsigned long long max,
                     unsigned long long *out)
{
	char *end;

	errno = 0;
	*out = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || *out < min || *out > max)
		return -1;
	return 0;
}

/* copy_arg: optarg into a fixed buffer; -1 if it does not fit (never a
 * silently truncated sandbox id or path). */
static int copy_arg(char *dst, size_t cap, const char *src)
{
	if (strlen(src) >= cap)
		return -1;
	memcpy(dst, src, strlen(src) + 1);
	return 0;
}

/* Options by role: the execution's own (on the command line, or in a
 * spare's assignment), and the process's (command line only). */
enum {
	OPT_SBX = 1 << 0, OPT_GEN = 1 << 1, OPT_ATT = 1 << 2, OPT_LISTEN = 1 << 3,
	OPT_GUEST = 1 << 4, OPT_INIT_PID = 1 << 5, OPT_INIT_START = 1 << 6,
	OPT_MANAGER = 1 << 7, OPT_SECRET_FD = 1 << 8, OPT_READY_FD = 1 << 9,
	OPT_ASSIGN_FD = 1 << 10, OPT_RUN_AS = 1 << 11, OPT_TRANSPORT = 1 << 12,
};
#define OPTS_EXECUTION (OPT_SBX | OPT_GEN | OPT_ATT | OPT_LISTEN | OPT_GUEST | \
                        OPT_INIT_PID | OPT_INIT_START)

/* bridge_args_parse: see args.h. */
int bridge_args_parse(struct bridge_args *a, int argc, char **argv, bool assigned)
{
	static const struct option opts[] = {
		{ "sbx", required_argument, NULL, OPT_SBX },
		{ "gen", required_argument, NULL, OPT_GEN },
		{ "att", required_argument, NULL, OPT_ATT },
		{ "listen", required_argument, NULL, OPT_LISTEN },
		{ "guest-socket", required_argument, NULL, OPT_GUEST },
		{ "init-pid", required_argument, NULL, OPT_INIT_PID },
		{ "init-start", required_argument, NULL, OPT_INIT_START },
		{ "manager-pid", required_argument, NULL, OPT_MANAGER },
		{ "secret-fd", required_argument, NULL, OPT_SECRET_FD },
		{ "ready-fd", required_argument, NULL, OPT_READY_FD },
		{ "assign-fd", required_argument, NULL, OPT_ASSIGN_FD },
		{ "run-as", required_argument, NULL, OPT_RUN_AS },
		{ "transport", required_argument, NULL, OPT_TRANSPORT },
		{ NULL, 0, NULL, 0 },
	};
	unsigned long long v = 0;
	int o, bad = 0, seen = 0;

	optind = 0; /* glibc: a full reset (this may run more than once) */
	opterr = !assigned; /* the assignment's errors are logged as one */
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o > 0 && (seen & o))
			bad = 1; /* each option once */
		seen |= o > 0 ? o : 0;
		switch (o) {
		case OPT_SBX: bad |= copy_arg(a->sbx, sizeof(a->sbx), optarg); break;
		case OPT_GEN: bad |= parse_num(optarg, 1, UINT64_MAX, &v); a->gen = v; break;
		case OPT_ATT: bad |= parse_num(optarg, 0, UINT32_MAX, &v); a->att = (uint32_t)v; break;
		case OPT_LISTEN: bad |= copy_arg(a->listen_path, sizeof(a->listen_path), optarg); break;
		case OPT_GUEST: bad |= copy_arg(a->guest_socket, sizeof(a->guest_socket), optarg); break;
		case OPT_INIT_PID: bad |= parse_num(optarg, 1, INT_MAX, &v); a->init_pid = (pid_t)v; break;
		case OPT_INIT_START: bad |= parse_num(optarg, 1, ULLONG_MAX, &v); a->init_start = v; break;
		case OPT_MANAGER: bad |= parse_num(optarg, 1, INT_MAX, &v); a->manager_pid = (pid_t)v; break;
		case OPT_SECRET_FD: bad |= parse_num(optarg, 3, INT_MAX, &v); a->secret_fd = (int)v; break;
		case OPT_READY_FD: bad |= parse_num(optarg, 3, INT_MAX, &v); a->ready_fd = (int)v; break;
		case OPT_ASSIGN_FD: bad |= parse_num(optarg, 3, INT_MAX, &v); a->assign_fd = (int)v; break;
		case OPT_RUN_AS: bad |= parse_num(optarg, 1, UINT32_MAX - 1, &v); a->run_as = (uid_t)v; break;
		case OPT_TRANSPORT:
			a->vmchan = strcmp(optarg, "vmchan") == 0;
			bad |= !a->vmchan && strcmp(optarg, "unix") != 0;
			break;
		default: bad = 1; break;
		}
	}
	seen &= ~OPT_TRANSPORT; /* optional, for a spare's assignment too */
	if (assigned)
		bad |= seen != OPTS_EXECUTION;
	else if (seen & OPT_ASSIGN_FD)
		bad |= (seen & (OPTS_EXECUTION | OPT_SECRET_FD)) || !(seen & OPT_MANAGER);
	else
		bad |= (seen & (OPTS_EXECUTION | OPT_MANAGER | OPT_SECRET_FD)) !=
		       (OPTS_EXECUTION | OPT_MANAGER | OPT_SECRET_FD);
	if (bad || optind != argc || (a->ready_fd >= 0 &&
	    (a->ready_fd == a->secret_fd || a->ready_fd == a->assign_fd)) ||
	    ((seen & OPT_SBX) && !sbx_id_valid(a->sbx))) {
		if (!assigned)
			fprintf(stderr, "usage: tether-bridge --sbx ID --gen N --att N --listen PATH"
			                " --guest-socket PATH --init-pid PID --init-start T"
			                " --manager-pid PID --secret-fd FD [--ready-fd FD]"
			                " [--run-as ID] [--transport unix|vmchan]\n"
			                "       tether-bridge --manager-pid PID --assign-fd FD"
			                " [--ready-fd FD] [--run-as ID]   (the rest, after the activation"
			                " secret, on FD)\n");
		return -1;
	}
	return 0;
}

/* bridge_assignment_parse: see args.h; the words are parsed in place in
 * a private copy (getopt wants char **). */
int bridge_assignment_parse(const uint8_t *buf, size_t len, struct bridge_args *a,
                            uint8_t secret[HELLO_SECRET_LEN], struct tt_err *err)
{
	static char copy[BRIDGE_ASSIGN_MAX];
	char *words[BRIDGE_ASSIGN_WORDS + 2];
	int n = 0, rc = -1;

	if (len > BRIDGE_ASSIGN_MAX)
		return tt_err_set(err, TT_ERR_TOO_LARGE, "assignment over %d bytes",
		                  BRIDGE_ASSIGN_MAX);
	if (len <= HELLO_SECRET_LEN || buf[len - 1] != '\0')
		return tt_err_set(err, TT_ERR_MALFORMED, "assignment of %zu bytes is truncated",
		                  len);
	memcpy(copy, buf, len);
	words[n++] = "tether-bridge";
	for (size_t at = HELLO_SECRET_LEN; at < len; at += strlen(copy + at) + 1) {
		if (n == BRIDGE_ASSIGN_WORDS + 1) {
			tt_err_set(err, TT_ERR_MALFORMED, "assignment over %d words",
			           BRIDGE_ASSIGN_WORDS);
			goto out;
		}
		words[n++] = copy + at;
	}
	words[n] = NULL;
	if (bridge_args_parse(a, n, words, true) < 0) {
		tt_err_set(err, TT_ERR_MALFORMED, "assignment: bad, missing or extra options");
		goto out;
	}
	memcpy(secret, copy, HELLO_SECRET_LEN);
	rc = 0;
out:
	sodium_memzero(copy, sizeof(copy));
	return rc;
}

/* bridge_assignment_read: see args.h. */
int bridge_assignment_read(int fd, struct bridge_args *a,
                           uint8_t secret[HELLO_SECRET_LEN], struct tt_err *err)
{
	static uint8_t buf[BRIDGE_ASSIGN_MAX];
	ssize_t got = fsutil_read_to_eof(fd, buf, sizeof(buf));
	int rc;

	if (got < 0)
		rc = errno == EFBIG ? tt_err_set(err, TT_ERR_TOO_LARGE, "assignment over %d bytes",
		                                 BRIDGE_ASSIGN_MAX)
		                    : tt_err_sys(err, TT_ERR_IO, "reading the assignment");
	else
		rc = got == 0 ? 1 : bridge_assignment_parse(buf, (size_t)got, a, secret, err);
	sodium_memzero(buf, sizeof(buf));
	close(fd);
	return rc;
}

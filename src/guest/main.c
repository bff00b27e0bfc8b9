/* tether-guest: the agent inside a sandbox. It usually runs as PID 1 of the
 * sandbox's pid namespace, so besides serving connections it reaps every
 * process that ends up parented to it.
 *
 * usage: tether-guest --listen PATH --sbx ID --gen N --att N
 *                     [--root DIR] [--ready-fd FD] [--secret-fd FD]
 *                     [--idle-timeout S]
 *        tether-guest --listen PATH --assign-fd FD [--root DIR]
 *                     [--ready-fd FD] [--idle-timeout S]
 *
 * --assign-fd: started ahead of its execution (a spare sandbox, see
 * src/substrate/ns/ns.c), the agent waits for its assignment on FD: the 32-byte
 * activation secret, then the sandbox id, generation and activation as
 * NUL-terminated words, then EOF (at most GUEST_ASSIGN_MAX bytes); only
 * then does it listen. EOF before any byte: the manager dropped the spare
 * (or died), and the agent exits, and with it the sandbox.
 * --secret-fd: a pipe holding exactly the 32-byte activation secret (then
 * EOF), read once at start and closed; the secret stays in memory only and
 * answers the bridge's handshake challenges (hello.h). Without it the agent
 * runs but refuses every connection. --idle-timeout: seconds a connection
 * may wait between operations (default 600; tests shorten it). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "fsutil.h"
#include "guest/guest.h"
#include "guest/vm.h"
#include "hello.h"
#include "log.h"
#include "wire_json.h"

struct guest_opts {
	const char *listen;
	const char *sbx;
	const char *root;
	uint64_t gen;
	uint32_t att;
	int ready_fd;
	int secret_fd;
	int assign_fd;
	int have_gen, have_att;
	unsigned idle_timeout_s;
};

/* usage: prints the command line summary. */
static int usage(FILE *out)
{
	fprintf(out, "usage: tether-guest --listen PATH --sbx ID --gen N --att N "
	             "[--root DIR] [--ready-fd FD] [--secret-fd FD] [--idle-timeout S]\n");
	return out == stderr ? 1 : 0;
}

/* opts_parse: fills o from argv; -1 after printing a one-line error. */
static int opts_parse(int argc, char **argv, struct guest_opts *o)
{
	static const struct option longopts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "sbx", required_argument, NULL, 's' },
		{ "gen", required_argument, NULL, 'g' },
		{ "att", required_argument, NULL, 'a' },
		{ "root", required_argument, NULL, 'r' },
		{ "ready-fd", required_argument, NULL, 'f' },
		{ "secret-fd", required_argument, NULL, 'S' },
		{ "assign-fd", required_argument, NULL, 'A' },
		{ "idle-timeout", required_argument, NULL, 'i' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	uint64_t v;
	int c;

	*o = (struct guest_opts){ .root = "/", .ready_fd = -1, .secret_fd = -1, .assign_fd = -1,
	                          .idle_timeout_s = GUEST_IDLE_TIMEOUT_DEFAULT_S };
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'l': o->listen = optarg; break;
		case 's': o->sbx = optarg; break;
		case 'r': o->root = optarg; break;
		case 'g':
			if (guest_parse_u64(optarg, INT64_MAX, &o->gen) < 0)
				goto bad;
			o->have_gen = 1;
			break;
		case 'a':
			if (guest_parse_u64(optarg, UINT32_MAX, &v) < 0)
				goto bad;
			o->att = (uint32_t)v;
			o->have_att = 1;
			break;
		case 'f':
			if (guest_parse_u64(optarg, INT32_MAX, &v) < 0)
				goto bad;
			o->ready_fd = (int)v;
			break;
		case 'S':
			if (guest_parse_u64(optarg, INT32_MAX, &v) < 0)
				goto bad;
			o->secret_fd = (int)v;
			break;
		case 'A':
			if (guest_parse_u64(optarg, INT32_MAX, &v) < 0)
				goto bad;
			o->assign_fd = (int)v;
			break;
		case 'i':
			if (guest_parse_u64(optarg, 86400, &v) < 0 || v == 0)
				goto bad;
			o->idle_timeout_s = (unsigned)v;
			break;
		case 'h': exit(usage(stdout));
		default: return usage(stderr), -1;
		}
	}
	if (o->assign_fd >= 0) {
		if (optind != argc || o->listen == NULL || o->sbx != NULL || o->have_gen ||
		    o->have_att || o->secret_fd >= 0) {
			fprintf(stderr, "tether-guest: --assign-fd takes --listen and no "
			                "--sbx, --gen, --att or --secret-fd\n");
			return -1;
		}
		return 0;
	}
	if (optind != argc || o->listen == NULL || o->sbx == NULL ||
	    !o->have_gen || !o->have_att) {
		fprintf(stderr, "tether-guest: --listen, --sbx, --gen and --att are required\n");
		return -1;
	}
	return 0;
bad:
	fprintf(stderr, "tether-guest: bad number for --%s: %s\n",
	        c == 'g' ? "gen" : c == 'a' ? "att" : c == 'S' ? "secret-fd" :
	        c == 'A' ? "assign-fd" :
	        c == 'i' ? "idle-timeout" : "ready-fd",
	        optarg);
	return -1;
}

/* assignment_read: the spare's assignment (see the top) from fd into
 * secret and o (o->sbx points to a static copy). 1: EOF before any byte;
 * 0: assigned; -1: unreadable or malformed (err says why). Closes fd. */
static int assignment_read(struct guest_opts *o, uint8_t secret[HELLO_SECRET_LEN],
                           struct tt_err *err)
{
	static uint8_t buf[GUEST_ASSIGN_MAX];
	static struct guest_assignment a;
	ssize_t n = fsutil_read_to_eof(o->assign_fd, buf, sizeof(buf));
	int rc;

	if (n < 0)
		rc = errno == EFBIG ? tt_err_set(err, TT_ERR_TOO_LARGE, "assignment over %d "
		                                 "bytes", GUEST_ASSIGN_MAX)
		                    : tt_err_sys(err, TT_ERR_IO, "reading the assignment");
	else if (n == 0)
		rc = 1;
	else
		rc = guest_assignment_parse(buf, (size_t)n, &a, err);
	if (rc == 0) {
		o->sbx = a.sbx;
		o->gen = a.gen;
		o->att = a.att;
		o->have_gen = o->have_att = 1;
		memcpy(secret, a.secret, HELLO_SECRET_LEN);
	}
	sodium_memzero(buf, sizeof(buf));
	sodium_memzero(a.secret, sizeof(a.secret));
	close(o->assign_fd);
	o->assign_fd = -1;
	return rc;
}

/* listen_unix: binds a fresh 0600 unix socket at path, replacing a stale
 * socket left by an earlier run (but never another kind of file). */
static int listen_unix(const char *path, struct tt_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	_cleanup_close_ int fd = -1;
	struct stat st;
	mode_t old;
	int rc;

	if (strlen(path) >= sizeof(sa.sun_path))
		return tt_err_set(err, TT_ERR_INVALID, "socket path too long: %s", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return tt_err_set(err, TT_ERR_CONFLICT,
			                  "%s exists and is not a socket", path);
		if (unlink(path) < 0)
			return tt_err_sys(err, TT_ERR_SYS, "unlink %s", path);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "socket");
	/* The socket file is 0666: the host bridge connects as a uid of its
	 * own (no CAP_DAC_OVERRIDE; src/bridge/drop.c). Only the sandbox's
	 * own processes can reach it besides (its directory is the sandbox's
	 * run dir, under the manager's root-only tree on the host), and we
	 * answer only peers outside our pid namespace (serve.c). */
	old = umask(0);
	rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0)
		return tt_err_sys(err, TT_ERR_SYS, "bind %s", path);
	if (chmod(path, 0666) < 0 || listen(fd, 128) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "listen %s", path);
	return tt_steal_fd(&fd);
}

/* reap_all: collects every exited child, ours or reparented to us. */
static void reap_all(void)
{
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

/* handler_spawn: forks the process that serves one connection. */
static void handler_spawn(const struct guest_ctx *g, int conn, int lfd, int sfd)
{
	sigset_t all;
	pid_t pid = fork();

	if (pid < 0) {
		wire_send_error(conn, WIRE_E_INTERNAL, "fork: %s", strerror(errno));
		return;
	}
	if (pid > 0)
		return;
	close(lfd);
	close(sfd);
	/* A handler must not outlive the agent that spawned it. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGCHLD, SIG_DFL);
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	guest_drop_ptrace(); /* inherited by every command it starts */
	guest_serve(g, conn);
	close(conn);
	_exit(0);
}

/* noop_handler: a handler (not SIG_DFL) makes the kernel deliver SIGTERM
 * to us even as PID 1 of a pid namespace; the work is done via signalfd. */
static void noop_handler(int sig)
{
	(void)sig;
}

int main(int argc, char **argv)
{
	/* The activation secret: this process's memory only (never argv,
	 * env or a file). */
	static uint8_t secret[HELLO_SECRET_LEN];
	struct guest_opts o;
	struct guest_ctx g;
	struct tt_err err = { 0 };
	struct sigaction sa = { .sa_handler = noop_handler };
	sigset_t mask;
	int lfd, sfd;

	/* The init of a microVM (vm.h): its own start-up, then the channel. */
	if (guest_vm_wanted(argc, argv))
		return guest_vm_main();
	tt_log_init("guest", TT_LOG_INFO);
	if (opts_parse(argc, argv, &o) < 0)
		return 1;
	/* Not dumpable: other sandbox processes of the same uid may not open
	 * our /proc/<pid>/mem (or environ, fds) to read the secret; handlers
	 * inherit this through fork. */
	prctl(PR_SET_DUMPABLE, 0);
	g = (struct guest_ctx){ .gen = o.gen, .att = o.att, .sbx = o.sbx,
	                        .is_init = getpid() == 1,
	                        .idle_timeout_s = o.idle_timeout_s };
	if (o.assign_fd >= 0) {
		/* A spare: everything but the identity is ready; wait, named
		 * so in ps/top. */
		int rc;

		prctl(PR_SET_NAME, "guest-spare");
		rc = sodium_init() < 0 ? -1 : assignment_read(&o, secret, &err);
		prctl(PR_SET_NAME, "tether-guest");

		if (rc != 0) {
			if (rc < 0)
				fprintf(stderr, "tether-guest: %s\n", err.msg[0] ? err.msg :
				        "libsodium failed to initialize");
			return rc < 0;
		}
		g.gen = o.gen;
		g.att = o.att;
		g.sbx = o.sbx;
		g.secret = secret;
	} else if (o.secret_fd >= 0) {
		if (sodium_init() < 0 || hello_read_secret(o.secret_fd, secret, 5000) < 0) {
			fprintf(stderr, "tether-guest: reading the activation secret: %s\n",
			        strerror(errno));
			return 1;
		}
		g.secret = secret;
	} else {
		log_warn("no activation secret: every connection will be refused");
	}
	g.root_fd = open(o.root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (g.root_fd < 0) {
		fprintf(stderr, "tether-guest: root %s: %s\n", o.root, strerror(errno));
		return 1;
	}
	/* When not PID 1 (tests), become the reaper of our orphans anyway, so
	 * background processes of exec'd commands are reaped the same way. */
	if (getpid() != 1)
		prctl(PR_SET_CHILD_SUBREAPER, 1);
	signal(SIGPIPE, SIG_IGN);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGCHLD, &sa, NULL);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGCHLD);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		fprintf(stderr, "tether-guest: signalfd: %s\n", strerror(errno));
		return 1;
	}
	lfd = listen_unix(o.listen, &err);
	if (lfd < 0) {
		fprintf(stderr, "tether-guest: %s\n", err.msg);
		return 1;
	}
	log_info("serving %s gen %llu att %u on %s", o.sbx,
	         (unsigned long long)o.gen, o.att, o.listen);
	if (o.ready_fd >= 0) {
		(void)!write(o.ready_fd, "ready\n", 6);
		close(o.ready_fd);
	}
	for (;;) {
		struct pollfd pf[2] = { { .fd = lfd, .events = POLLIN },
		                        { .fd = sfd, .events = POLLIN } };
		struct signalfd_siginfo si;

		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_error("poll: %s", strerror(errno));
			return 1;
		}
		while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
			if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
				log_info("signal %u: exiting", si.ssi_signo);
				sodium_memzero(secret, sizeof(secret));
				unlink(o.listen);
				return 0;
			}
		}
		reap_all();
		if (pf[0].revents & POLLIN) {
			int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

			if (conn < 0) {
				/* Out of fds or memory: back off instead of spinning. */
				if (errno != EINTR && errno != EAGAIN &&
				    errno != ECONNABORTED)
					poll(NULL, 0, 50);
				continue;
			}
			handler_spawn(&g, conn, lfd, sfd);
			close(conn);
		}
	}
}

/* The exec operation: run a command with a clean environment in its own
 * session, stream stdout/stderr as frames (and stdin from DATA_IN), and end
 * with RESULT as soon as the direct child exits — background processes it
 * left behind keep running. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "guest/guest.h"
#include "log.h"
#include "wire_json.h"

#define EXEC_ARGV_MAX 256
#define EXEC_ENV_MAX 1024
/* How much output is still forwarded after the child exited: what is
 * buffered then, not what background processes keep producing. */
#define EXEC_DRAIN_MAX (1024 * 1024)

static const char *const exec_base_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/home",
	"LANG=C.UTF-8",
};

/* The running command and the state of its three pipes. */
struct exec_state {
	int conn;
	pid_t pid;
	int pidfd;
	int out_fd, err_fd;  /* read ends; -1 once at EOF */
	int in_fd;           /* write end of stdin; -1 when closed */
	int want_stdin;
	int eof_in;          /* EOF_IN received */
	uint8_t *pending;    /* stdin bytes not yet written (one frame) */
	size_t pending_len, pending_off;
	uint8_t *buf;        /* WIRE_PAYLOAD_MAX + 1 scratch */
};

/* exec_argv: builds argv from "cmd" (1..256 strings); pointers into req. */
static int exec_argv(json_t *cmd, char **argv)
{
	size_t n = json_array_size(cmd);

	if (!json_is_array(cmd) || n < 1 || n > EXEC_ARGV_MAX)
		return -1;
	for (size_t i = 0; i < n; i++) {
		json_t *a = json_array_get(cmd, i);

		if (!json_is_string(a))
			return -1;
		argv[i] = (char *)json_string_value(a);
	}
	if (argv[0][0] == '\0')
		return -1;
	argv[n] = NULL;
	return 0;
}

/* exec_envp: the clean base environment overlaid with "env"; the strings
 * are allocated (owned by the caller, freed via exec_envp_free). */
static int exec_envp(json_t *env, char **envp, const char **why)
{
	size_t n = 0;
	const char *key;
	json_t *val;

	if (env != NULL && !json_is_object(env)) {
		*why = "\"env\" must be an object of strings";
		return -1;
	}
	if (env != NULL && json_object_size(env) > EXEC_ENV_MAX) {
		*why = "too many environment variables";
		return -1;
	}
	for (size_t i = 0; i < sizeof(exec_base_env) / sizeof(exec_base_env[0]); i++) {
		const char *b = exec_base_env[i];
		char name[16];
		size_t kl = strcspn(b, "=");

		memcpy(name, b, kl);
		name[kl] = '\0';
		if (env != NULL && json_object_get(env, name) != NULL)
			continue; /* the caller's value wins */
		envp[n++] = strdup(b);
	}
	if (env != NULL) {
		json_object_foreach(env, key, val) {
			char *s;

			if (key[0] == '\0' || strchr(key, '=') != NULL ||
			    !json_is_string(val)) {
				*why = "\"env\" keys must be names without '=' and values strings";
				return -1;
			}
			if (asprintf(&s, "%s=%s", key, json_string_value(val)) < 0)
				s = NULL;
			envp[n++] = s;
		}
	}
	envp[n] = NULL;
	for (size_t i = 0; i < n; i++) {
		if (envp[i] == NULL) {
			*why = "out of memory";
			return -1;
		}
	}
	return 0;
}

/* exec_envp_free: frees the strings exec_envp allocated. */
static void exec_envp_free(char **envp, size_t cap)
{
	for (size_t i = 0; i < cap && envp[i] != NULL; i++)
		free(envp[i]);
}

/* exec_cwd: opens the working directory inside the root: "cwd", else
 * /workspace when it exists, else the root. -1 with errno. */
static int exec_cwd(const struct guest_ctx *g, const char *cwd)
{
	int fd;

	if (cwd != NULL)
		return path_open(g, cwd, O_PATH | O_DIRECTORY, 0);
	fd = path_open(g, "/workspace", O_PATH | O_DIRECTORY, 0);
	if (fd >= 0)
		return fd;
	return path_open(g, "/", O_PATH | O_DIRECTORY, 0);
}

/* guest_drop_ptrace: this process and everything it starts lose
 * CAP_SYS_PTRACE for good (bounding, ambient, inheritable, permitted).
 * Inside the sandbox's user namespace, root would otherwise pass the
 * ptrace access check on the agent despite PR_SET_DUMPABLE 0 and read the
 * activation secret from /proc/1/mem. Every connection handler does it
 * before serving, so the commands it starts inherit the loss; the fork
 * path below does it again. Best effort outside a sandbox (without
 * CAP_SETPCAP there is no such capability to lose). */
void guest_drop_ptrace(void)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct data[2];
	uint32_t bit = 1u << (CAP_SYS_PTRACE % 32);
	int w = CAP_SYS_PTRACE / 32;

	(void)prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0);
	(void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, CAP_SYS_PTRACE, 0, 0);
	if (syscall(SYS_capget, &hdr, data) < 0)
		return;
	data[w].effective &= ~bit;
	data[w].permitted &= ~bit;
	data[w].inheritable &= ~bit;
	(void)syscall(SYS_capset, &hdr, data);
}

/* exec_child: runs in the forked child; never returns. */
static void exec_child(char **argv, char **envp, int in, int out, int errfd,
                       int cwd_fd)
{
	extern char **environ;
	sigset_t none;
	int e;

	/* Undo what the agent set up for itself: ignored SIGPIPE and blocked
	 * signals would otherwise be inherited through exec. */
	for (int s = 1; s < NSIG; s++)
		signal(s, SIG_DFL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	setsid();
	guest_drop_ptrace();
	if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(errfd, 2) < 0)
		_exit(127);
	if (fchdir(cwd_fd) < 0) {
		dprintf(2, "tether-guest: chdir: %s\n", strerror(errno));
		_exit(127);
	}
	/* execvp searches the PATH of the current environment: switch to the
	 * clean one first. */
	environ = envp;
	execvp(argv[0], argv);
	e = errno;
	dprintf(2, "tether-guest: %s: %s\n", argv[0], strerror(e));
	/* as sh does: 127 when no such command, 126 when it cannot run */
	_exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

/* exec_resolve: execvp's search of argv0 along the PATH of envp: the
 * first executable regular file, into out. 0, or -1 when none is, or when
 * the search meets a relative or empty PATH element before a match: those
 * name directories under the command's cwd, which execvp searches after
 * the chdir; the fork path then does exactly what execvp does. */
static int exec_resolve(const char *argv0, char **envp, char *out, size_t cap)
{
	const char *path = NULL;
	struct stat st;

	if (strchr(argv0, '/') != NULL)
		return snprintf(out, cap, "%s", argv0) < (int)cap ? 0 : -1;
	for (size_t i = 0; envp[i] != NULL && path == NULL; i++)
		if (strncmp(envp[i], "PATH=", 5) == 0)
			path = envp[i] + 5;
	while (path != NULL && *path != '\0') {
		const char *colon = strchr(path, ':');
		size_t dlen = colon != NULL ? (size_t)(colon - path) : strlen(path);

		if (dlen == 0 || path[0] != '/')
			return -1;
		if (snprintf(out, cap, "%.*s/%s", (int)dlen, path, argv0) >= (int)cap)
			return -1;
		if (access(out, X_OK) == 0) {
			if (stat(out, &st) == 0 && S_ISREG(st.st_mode))
				return 0;
			/* a directory: execve says EACCES, execvp goes on */
		} else if (errno != EACCES && errno != ENOENT && errno != ENOTDIR &&
		           errno != ESTALE && errno != ENODEV && errno != ETIMEDOUT) {
			return -1; /* where execvp stops (e.g. ELOOP) */
		}
		path = colon != NULL ? colon + 1 : NULL;
	}
	return -1;
}

/* exec_spawn: starts the command with posix_spawn, i.e. vfork semantics:
 * the handler's page tables are not copied and it takes no copy-on-write
 * faults before the child has exec'd (~100 µs per command here). The
 * child gets what exec_child sets up, ptrace aside (the handler already
 * dropped it, see guest_drop_ptrace). Whatever posix_spawn cannot do or
 * refuses (no such command, a script without #!, ...) goes the fork
 * path, so errors and execvp's quirks stay exactly as they were. */
static pid_t exec_spawn(char **argv, char **envp, int in, int out, int errfd,
                        int cwd_fd)
{
	char path[PATH_MAX];
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t all, none;
	pid_t pid = -1;
	int rc = -1;

	if (exec_resolve(argv[0], envp, path, sizeof(path)) == 0 &&
	    posix_spawn_file_actions_init(&fa) == 0) {
		if (posix_spawnattr_init(&at) == 0) {
			sigfillset(&all);
			sigemptyset(&none);
			if (posix_spawn_file_actions_adddup2(&fa, in, 0) == 0 &&
			    posix_spawn_file_actions_adddup2(&fa, out, 1) == 0 &&
			    posix_spawn_file_actions_adddup2(&fa, errfd, 2) == 0 &&
			    posix_spawn_file_actions_addfchdir_np(&fa, cwd_fd) == 0 &&
			    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF |
			                                  POSIX_SPAWN_SETSIGMASK |
			                                  POSIX_SPAWN_SETSID) == 0 &&
			    posix_spawnattr_setsigdefault(&at, &all) == 0 &&
			    posix_spawnattr_setsigmask(&at, &none) == 0)
				rc = posix_spawn(&pid, path, &fa, &at, argv, envp);
			posix_spawnattr_destroy(&at);
		}
		posix_spawn_file_actions_destroy(&fa);
	}
	if (rc == 0)
		return pid;
	pid = fork();
	if (pid == 0)
		exec_child(argv, envp, in, out, errfd, cwd_fd);
	return pid;
}

/* pump_out: forwards one read of fd as a frame of type; closes fd at EOF.
 * Returns bytes read, 0 at EOF or nothing ready, -1 when the peer is gone. */
static ssize_t pump_out(struct exec_state *st, int *fd, uint8_t type)
{
	ssize_t n = read(*fd, st->buf, WIRE_PAYLOAD_MAX);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n <= 0) {
		close(*fd);
		*fd = -1;
		return 0;
	}
	if (wire_send(st->conn, type, st->buf, (uint32_t)n, NULL) < 0)
		return -1;
	return n;
}

/* pump_stdin: writes pending stdin bytes; closes stdin after EOF_IN. */
static void pump_stdin(struct exec_state *st)
{
	while (st->in_fd >= 0 && st->pending_off < st->pending_len) {
		ssize_t n = write(st->in_fd, st->pending + st->pending_off,
		                  st->pending_len - st->pending_off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n < 0) { /* EPIPE: the command closed its stdin */
			close(st->in_fd);
			st->in_fd = -1;
			break;
		}
		st->pending_off += (size_t)n;
	}
	st->pending_len = st->pending_off = 0;
	if (st->eof_in && st->in_fd >= 0) {
		close(st->in_fd);
		st->in_fd = -1;
	}
}

/* read_conn: takes one frame from the peer. -1 ends the operation (peer
 * gone or protocol violation, already answered). */
static int read_conn(struct exec_state *st)
{
	struct tt_err err = { 0 };
	struct wire_frame f;
	int rc = wire_recv(st->conn, &f, st->buf, WIRE_PAYLOAD_MAX + 1, &err);

	if (rc == 0)
		return -1;
	if (rc < 0) {
		wire_send_error(st->conn, WIRE_E_BAD_REQUEST, "%s", err.msg);
		return -1;
	}
	if (!st->want_stdin || st->eof_in ||
	    (f.type != WIRE_DATA_IN && f.type != WIRE_EOF_IN)) {
		wire_send_error(st->conn, WIRE_E_BAD_REQUEST, "unexpected %s frame",
		                wire_type_name(f.type));
		return -1;
	}
	if (f.type == WIRE_EOF_IN) {
		st->eof_in = 1;
	} else if (st->in_fd >= 0) {
		memcpy(st->pending, f.payload, f.len);
		st->pending_len = f.len;
		st->pending_off = 0;
	}
	pump_stdin(st);
	return 0;
}

/* drain_to_sink: after RESULT, hands still-open output pipes to a small
 * process that discards what background processes write, so they do not
 * die of SIGPIPE once the operation is over. It is started through an
 * intermediate child that exits at once, so it is reparented to the agent
 * (init, or the subreaper in tests) and reaped there: a handler serving
 * many operations does not collect one sink per background command. */
static void drain_to_sink(struct exec_state *st)
{
	int out_fd = st->out_fd, err_fd = st->err_fd;
	pid_t mid;

	if (out_fd < 0 && err_fd < 0)
		return;
	mid = fork();
	if (mid < 0)
		return; /* the pipes just close: late writers get SIGPIPE */
	if (mid > 0) {
		while (waitpid(mid, NULL, 0) < 0 && errno == EINTR)
			;
		return;
	}
	if (fork() != 0)
		_exit(0);
	/* The sink must not keep the connection open (the peer sees EOF
	 * when the handler ends it): drop our copy. */
	close(st->conn);
	close(st->pidfd);
	if (st->in_fd >= 0)
		close(st->in_fd);
	for (;;) {
		struct pollfd pf[2] = { { .fd = out_fd, .events = POLLIN },
		                        { .fd = err_fd, .events = POLLIN } };
		char sink[4096];

		if (pf[0].fd < 0 && pf[1].fd < 0)
			_exit(0);
		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			_exit(0);
		for (int i = 0; i < 2; i++) {
			if (pf[i].fd >= 0 && pf[i].revents != 0 &&
			    read(pf[i].fd, sink, sizeof(sink)) <= 0) {
				if (i == 0)
					out_fd = -1;
				else
					err_fd = -1;
			}
		}
	}
}

/* exec_finish: the child exited: forward what is buffered right now (no
 * waiting for EOF), then send RESULT. 0 once RESULT (or ERROR) is sent,
 * -1 when the peer is gone. */
static int exec_finish(const struct guest_ctx *g, struct exec_state *st,
                       int status)
{
	size_t drained = 0;
	json_t *res;
	int rc;

	while (drained < EXEC_DRAIN_MAX && (st->out_fd >= 0 || st->err_fd >= 0)) {
		ssize_t a = 0, b = 0;

		if (st->out_fd >= 0 && (a = pump_out(st, &st->out_fd, WIRE_DATA_OUT)) < 0)
			return -1;
		if (st->err_fd >= 0 && (b = pump_out(st, &st->err_fd, WIRE_STDERR)) < 0)
			return -1;
		if (a == 0 && b == 0)
			break;
		drained += (size_t)(a + b);
	}
	if (WIFSIGNALED(status))
		res = json_pack("{s:i, s:i}", "exit_code", 128 + WTERMSIG(status),
		                "signal", WTERMSIG(status));
	else
		res = json_pack("{s:i}", "exit_code", WEXITSTATUS(status));
	rc = guest_result(g, st->conn, res);
	drain_to_sink(st);
	return rc;
}

/* exec_loop: multiplexes child exit, output pipes, stdin and the peer.
 * 0 once the operation ended with RESULT/ERROR sent, -1 when the
 * connection must close (peer gone, protocol violation, poll failure). */
static int exec_loop(const struct guest_ctx *g, struct exec_state *st)
{
	for (;;) {
		struct pollfd pf[5];
		int n = 0, i_pid, i_out = -1, i_err = -1, i_conn = -1, i_in = -1;

		i_pid = n;
		pf[n++] = (struct pollfd){ .fd = st->pidfd, .events = POLLIN };
		if (st->out_fd >= 0) {
			i_out = n;
			pf[n++] = (struct pollfd){ .fd = st->out_fd, .events = POLLIN };
		}
		if (st->err_fd >= 0) {
			i_err = n;
			pf[n++] = (struct pollfd){ .fd = st->err_fd, .events = POLLIN };
		}
		if (st->pending_len > 0 && st->in_fd >= 0) {
			i_in = n;
			pf[n++] = (struct pollfd){ .fd = st->in_fd, .events = POLLOUT };
		} else {
			/* Read the peer only when earlier stdin is written: the
			 * pipe is the backpressure. */
			i_conn = n;
			pf[n++] = (struct pollfd){ .fd = st->conn, .events = POLLIN };
		}
		if (poll(pf, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (i_out >= 0 && pf[i_out].revents &&
		    pump_out(st, &st->out_fd, WIRE_DATA_OUT) < 0)
			break;
		if (i_err >= 0 && pf[i_err].revents &&
		    pump_out(st, &st->err_fd, WIRE_STDERR) < 0)
			break;
		if (i_in >= 0 && pf[i_in].revents)
			pump_stdin(st);
		if (i_conn >= 0 && pf[i_conn].revents && read_conn(st) < 0)
			break;
		if (pf[i_pid].revents) {
			int status;

			pid_t w = waitpid(st->pid, &status, 0);

			if (w == st->pid)
				return exec_finish(g, st, status);
			if (w < 0 && errno != EINTR)
				break; /* cannot happen for our own child: do not spin */
		}
	}
	/* The peer went away or broke the protocol: the operation is over, so
	 * its command is stopped (background processes it started are not). */
	kill(st->pid, SIGKILL);
	waitpid(st->pid, NULL, 0);
	return -1;
}

/* exec_run: validates the request, starts the command and streams it.
 * Every early failure answers ERROR (0, or -1 if that send failed). */
int exec_run(const struct guest_ctx *g, int conn, json_t *req)
{
	char *argv[EXEC_ARGV_MAX + 1];
	char *envp[EXEC_ENV_MAX + 4] = { NULL };
	_cleanup_close_ int cwd_fd = -1, in_r = -1, in_w = -1;
	_cleanup_close_ int out_r = -1, out_w = -1, err_r = -1, err_w = -1;
	_cleanup_close_ int pidfd = -1;
	_cleanup_free_ uint8_t *buf = NULL, *pending = NULL;
	json_t *cwd = json_object_get(req, "cwd");
	json_t *jstdin = json_object_get(req, "stdin");
	const char *why = NULL;
	struct exec_state st;
	int p[2], cwd_errno, rc;
	pid_t pid;

	if (exec_argv(json_object_get(req, "cmd"), argv) < 0)
		return wire_send_error(conn, WIRE_E_BAD_REQUEST,
		                       "\"cmd\" must be an array of 1..%d strings",
		                       EXEC_ARGV_MAX);
	if (jstdin != NULL && !json_is_boolean(jstdin))
		return wire_send_error(conn, WIRE_E_BAD_REQUEST, "\"stdin\" must be a boolean");
	if (cwd != NULL) {
		struct tt_err err = { 0 };

		if (!json_is_string(cwd) ||
		    path_check(json_string_value(cwd), json_string_length(cwd), &err) < 0)
			return wire_send_error(conn, WIRE_E_PATH_INVALID, "cwd: %s",
			                       json_is_string(cwd) ? err.msg : "not a string");
	}
	if (exec_envp(json_object_get(req, "env"), envp, &why) < 0) {
		rc = wire_send_error(conn, WIRE_E_BAD_REQUEST, "%s", why);
		exec_envp_free(envp, EXEC_ENV_MAX + 4);
		return rc;
	}
	cwd_fd = exec_cwd(g, cwd != NULL ? json_string_value(cwd) : NULL);
	cwd_errno = errno;
	buf = malloc(WIRE_PAYLOAD_MAX + 1);
	pending = malloc(WIRE_PAYLOAD_MAX + 1);
	if (cwd_fd < 0 || buf == NULL || pending == NULL) {
		if (cwd_fd < 0)
			rc = guest_send_errno(conn, cwd_errno, "cwd");
		else
			rc = wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
		exec_envp_free(envp, EXEC_ENV_MAX + 4);
		return rc;
	}
	if (pipe2(p, O_CLOEXEC) < 0)
		goto sys;
	out_r = p[0], out_w = p[1];
	if (pipe2(p, O_CLOEXEC) < 0)
		goto sys;
	err_r = p[0], err_w = p[1];
	/* stdin: a pipe fed from DATA_IN, else one that is at EOF at once
	 * (works where the sandbox has no /dev/null). */
	if (pipe2(p, O_CLOEXEC) < 0)
		goto sys;
	in_r = p[0], in_w = p[1];
	if (!json_is_true(jstdin)) {
		close(in_w);
		in_w = -1;
	}
	pid = exec_spawn(argv, envp, in_r, out_w, err_w, cwd_fd);
	if (pid < 0)
		goto sys;
	exec_envp_free(envp, EXEC_ENV_MAX + 4);
	close(in_r), in_r = -1;
	close(out_w), out_w = -1;
	close(err_w), err_w = -1;
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0) {
		rc = wire_send_error(conn, WIRE_E_INTERNAL, "pidfd_open: %s", strerror(errno));
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return rc;
	}
	fcntl(out_r, F_SETFL, O_NONBLOCK);
	fcntl(err_r, F_SETFL, O_NONBLOCK);
	if (in_w >= 0)
		fcntl(in_w, F_SETFL, O_NONBLOCK);
	st = (struct exec_state){
		.conn = conn, .pid = pid, .pidfd = pidfd,
		.out_fd = tt_steal_fd(&out_r), .err_fd = tt_steal_fd(&err_r),
		.in_fd = tt_steal_fd(&in_w), .want_stdin = json_is_true(jstdin),
		.pending = pending, .buf = buf,
	};
	rc = exec_loop(g, &st);
	/* The state owns the pipe ends now; the sink process has its copies. */
	if (st.out_fd >= 0)
		close(st.out_fd);
	if (st.err_fd >= 0)
		close(st.err_fd);
	if (st.in_fd >= 0)
		close(st.in_fd);
	return rc;
sys:
	rc = guest_send_errno(conn, errno, "exec setup");
	exec_envp_free(envp, EXEC_ENV_MAX + 4);
	return rc;
}

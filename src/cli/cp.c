/* tether cp [-r] [-q] SRC DST: copies between here and a sandbox (one side
 * ID:/path, ID a unique prefix). Files go through the files API (streamed,
 * docs/API.md); "-" is stdin or stdout; -r copies a directory tree as a tar
 * archive streamed over a streamed exec, tar running in the sandbox on one
 * side and here on the other. Progress on a terminal (docs/CLI.md). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cleanup.h"
#include "cli/cli.h"
#include "cli/verbs.h"
#include "client/tether.h"

/* What one copy needs: the client, the meter, -r and -q. */
struct cpx {
	struct tether *t;
	struct cli_meter meter;
	int recursive;
	int quiet;
	uint64_t bytes;  /* archive bytes received (-r download) */
	int out_fd;      /* where they go */
	int out_errno;
};

/* remote_split: "ID:/path" -> id + path; 0 when spec is local. ID is a
 * sandbox id or a prefix of one ([a-z0-9_]); a local name with a colon in
 * it is written ./name. */
static int remote_split(const char *spec, char *id, size_t cap,
                        const char **path)
{
	const char *colon = strchr(spec, ':');
	size_t len = colon ? (size_t)(colon - spec) : 0;

	if (len == 0 || len >= cap ||
	    strspn(spec, "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
		return 0;
	memcpy(id, spec, len);
	id[len] = '\0';
	*path = colon + 1;
	return 1;
}

/* base_name: the last path component (no allocation). */
static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/* cp_progress: libtether's progress hook: the meter. */
static int cp_progress(void *arg, uint64_t done, uint64_t total)
{
	struct cpx *c = arg;

	cli_meter_show(&c->meter, done, total, NULL);
	return 0;
}

/* stdin_spool: stdin as a descriptor of known size: itself when it is a
 * regular file, else copied into an unlinked temporary file in $TMPDIR
 * (an upload needs its length before the first byte, docs/API.md). -1
 * after printing why. */
static int stdin_spool(uint64_t *size)
{
	const char *tmpdir = getenv("TMPDIR");
	char buf[65536];
	struct stat st;
	off_t at;
	int fd;

	if (fstat(STDIN_FILENO, &st) == 0 && S_ISREG(st.st_mode) &&
	    (at = lseek(STDIN_FILENO, 0, SEEK_CUR)) >= 0 && at <= st.st_size) {
		*size = (uint64_t)(st.st_size - at);
		return dup(STDIN_FILENO);
	}
	if (tmpdir == NULL || tmpdir[0] == '\0')
		tmpdir = P_tmpdir;
	fd = open(tmpdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return cli_fail("cp: cannot make a temporary file in %s: %s",
		                tmpdir, strerror(errno)), -1;
	*size = 0;
	for (;;) {
		ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || (n > 0 && cli_write_all(fd, buf, (size_t)n) < 0)) {
			cli_fail("cp: cannot read stdin: %s", strerror(errno));
			close(fd);
			return -1;
		}
		if (n == 0)
			break;
		*size += (uint64_t)n;
	}
	if (lseek(fd, 0, SEEK_SET) < 0) {
		close(fd);
		return cli_fail("cp: %s", strerror(errno)), -1;
	}
	return fd;
}

/* cp_upload: local file (or "-", stdin) -> sandbox path, streamed. */
static int cp_upload(struct cpx *c, const char *src, const char *id,
                     const char *rpath)
{
	_cleanup_close_ int fd = -1;
	_cleanup_free_ char *dst = NULL;
	struct tt_err err = { 0 };
	struct stat st;
	uint64_t size, written = 0;
	int std = strcmp(src, "-") == 0;

	if (std) {
		if ((fd = stdin_spool(&size)) < 0)
			return 1;
	} else {
		if ((fd = open(src, O_RDONLY | O_CLOEXEC)) < 0)
			return cli_fail("cp: cannot open %s: %s", src, strerror(errno));
		if (fstat(fd, &st) < 0)
			return cli_fail("cp: cannot stat %s: %s", src, strerror(errno));
		if (S_ISDIR(st.st_mode))
			return cli_fail("cp: %s is a directory (use -r)", src);
		if (!S_ISREG(st.st_mode))
			return cli_fail("cp: %s is not a regular file", src);
		size = (uint64_t)st.st_size;
	}
	if (rpath[0] == '\0' || rpath[strlen(rpath) - 1] == '/') {
		if (std)
			return cli_fail("cp: copying stdin needs a file name, not %s",
			                rpath[0] ? rpath : "a directory");
		if (asprintf(&dst, "%s%s", rpath[0] ? rpath : "/", base_name(src)) < 0)
			return cli_fail("cp: out of memory");
	} else if ((dst = strdup(rpath)) == NULL) {
		return cli_fail("cp: out of memory");
	}
	if (tether_file_put(c->t, id, dst, fd, size, &written, &err) < 0) {
		cli_meter_end(&c->meter);
		return cli_fail("cp %s -> %s:%s: %s", std ? "stdin" : src, id, dst,
		                err.msg);
	}
	cli_meter_end(&c->meter);
	return 0;
}

/* cp_download: sandbox path -> local file via a temp file in the target
 * directory renamed into place only once complete; or to stdout ("-"),
 * where a failure may leave part of the file written. */
static int cp_download(struct cpx *c, const char *id, const char *rpath,
                       const char *dst)
{
	_cleanup_free_ char *target = NULL;
	_cleanup_free_ char *dircopy = NULL;
	_cleanup_free_ char *tmp = NULL;
	_cleanup_close_ int fd = -1;
	struct tt_err err = { 0 };
	struct stat st;
	mode_t mask;

	if (strcmp(dst, "-") == 0) {
		int rc = tether_file_get(c->t, id, rpath, STDOUT_FILENO, NULL, &err);

		cli_meter_end(&c->meter);
		if (rc < 0)
			return cli_fail("cp %s:%s -> stdout: %s", id, rpath, err.msg);
		return 0;
	}
	if (stat(dst, &st) == 0 && S_ISDIR(st.st_mode)) {
		if (asprintf(&target, "%s/%s", dst, base_name(rpath)) < 0)
			return cli_fail("cp: out of memory");
	} else if ((target = strdup(dst)) == NULL) {
		return cli_fail("cp: out of memory");
	}
	if (base_name(target)[0] == '\0')
		return cli_fail("cp: %s names no file", dst);
	if ((dircopy = strdup(target)) == NULL ||
	    asprintf(&tmp, "%s/.%s.tether-XXXXXX", dirname(dircopy),
	             base_name(target)) < 0)
		return cli_fail("cp: out of memory");
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return cli_fail("cp: cannot create a file next to %s: %s", target,
		            strerror(errno));
	if (tether_file_get(c->t, id, rpath, fd, NULL, &err) < 0) {
		cli_meter_end(&c->meter);
		unlink(tmp);
		return cli_fail("cp %s:%s -> %s: %s", id, rpath, target, err.msg);
	}
	cli_meter_end(&c->meter);
	mask = umask(0);
	umask(mask);
	if (fchmod(fd, 0666 & ~mask) < 0 || fsync(fd) < 0 ||
	    rename(tmp, target) < 0) {
		int e = errno;
		unlink(tmp);
		return cli_fail("cp: cannot store %s: %s", target, strerror(e));
	}
	return 0;
}

/* tar_spawn: starts the local tar with argv, its stdin (dir 0) or stdout
 * (dir 1) on one end of a new pipe; *other = our end. pid, or -1 after
 * printing why. */
static pid_t tar_spawn(char *const argv[], int dir, int *other)
{
	posix_spawn_file_actions_t fa;
	extern char **environ;
	int p[2], rc;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return cli_fail("cp: pipe: %s", strerror(errno)), -1;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, dir == 0 ? p[0] : p[1], dir);
	rc = posix_spawnp(&pid, "tar", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(dir == 0 ? p[0] : p[1]);
	if (rc != 0) {
		close(dir == 0 ? p[1] : p[0]);
		return cli_fail("cp: cannot run tar here: %s", strerror(rc)), -1;
	}
	*other = dir == 0 ? p[1] : p[0];
	return pid;
}

/* tar_wait: 0 when the local tar exited 0, else 1 after printing why. */
static int tar_wait(pid_t pid)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return cli_fail("cp: waitpid: %s", strerror(errno));
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (WIFEXITED(st))
		return cli_fail("cp: tar here exited with status %d", WEXITSTATUS(st));
	return cli_fail("cp: tar here was killed by signal %d", WTERMSIG(st));
}

/* tree_output: the sandbox's tar output: the archive (fd 1) to the local
 * tar, its messages (fd 2) to our stderr. */
static int tree_output(void *arg, int fd, const void *data, size_t len)
{
	struct cpx *c = arg;

	if (fd == 2)
		return cli_write_all(STDERR_FILENO, data, len), 0;
	if (cli_write_all(c->out_fd, data, len) < 0) {
		c->out_errno = errno;
		return -1;
	}
	c->bytes += len;
	cli_meter_show(&c->meter, c->bytes, 0, NULL);
	return 0;
}

/* tree_exec: the sandbox side of a tree copy, sh -c script with args;
 * 0, or 1 after printing why. */
static int tree_exec(struct cpx *c, const char *id, const char *script,
                     const char *a1, const char *a2, int stdin_fd,
                     const char *what)
{
	char *argv[] = { "sh", "-c", (char *)script, "sh", (char *)a1,
	                 (char *)a2, NULL };
	struct tether_exec_stream s = { .on_output = tree_output, .arg = c,
	                                .stdin_fd = stdin_fd };
	struct tt_err err = { 0 };
	int code = 0;

	if (tether_exec_stream(c->t, id, argv, &s, &code, NULL, &err) < 0) {
		cli_meter_end(&c->meter);
		if (c->out_errno)
			return cli_fail("%s: tar here stopped reading: %s", what,
			                strerror(c->out_errno));
		return cli_fail("%s: %s", what, err.msg);
	}
	cli_meter_end(&c->meter);
	if (code == 127)
		return cli_fail("%s: the sandbox has no tar", what);
	if (code != 0)
		return cli_fail("%s: tar in the sandbox exited with status %d", what,
		                code);
	return 0;
}

/* trimmed_base: the last component of a path without trailing slashes,
 * into buf ("" for "/", ".", ".."). */
static const char *trimmed_base(const char *p, char *buf, size_t cap)
{
	size_t n = strlen(p);
	const char *b;

	while (n > 1 && p[n - 1] == '/')
		n--;
	snprintf(buf, cap, "%.*s", (int)n, p);
	b = base_name(buf);
	if (strcmp(b, ".") == 0 || strcmp(b, "..") == 0 || b[0] == '\0')
		return "";
	return b;
}

/* Into DST/BASE when DST is a directory (as cp -r does), else DST itself;
 * made if missing. */
static const char tree_put_sh[] =
	"d=$1; if [ -n \"$2\" ] && [ -d \"$d\" ]; then d=$d/$2; fi; "
	"mkdir -p -- \"$d\" && exec tar -x --no-same-owner -f - -C \"$d\"";
static const char tree_get_sh[] =
	"cd -- \"$1\" && exec tar -c -f - .";

/* cp_tree_up: local directory src -> sandbox rpath. */
static int cp_tree_up(struct cpx *c, const char *src, const char *id,
                      const char *rpath)
{
	char *argv[] = { "tar", "-c", "-f", "-", "-C", (char *)src, ".", NULL };
	char bbuf[4096], what[512];
	struct stat st;
	int rd = -1, rc, trc;
	pid_t pid;

	if (stat(src, &st) < 0)
		return cli_fail("cp: cannot stat %s: %s", src, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return cp_upload(c, src, id, rpath);
	snprintf(what, sizeof(what), "cp -r %s -> %s:%s", src, id, rpath);
	if ((pid = tar_spawn(argv, 1, &rd)) < 0)
		return 1;
	rc = tree_exec(c, id, tree_put_sh, rpath[0] ? rpath : "/",
	               trimmed_base(src, bbuf, sizeof(bbuf)), rd, what);
	close(rd);
	trc = tar_wait(pid);
	return rc || trc;
}

/* cp_tree_down: sandbox directory rpath -> local dst (made if missing;
 * dst/BASE when dst is a directory). */
static int cp_tree_down(struct cpx *c, const char *id, const char *rpath,
                        const char *dst)
{
	_cleanup_free_ char *target = NULL;
	char *argv[] = { "tar", "-x", "--no-same-owner", "-f", "-", "-C", NULL,
	                 NULL };
	char bbuf[4096], what[512];
	const char *base = trimmed_base(rpath, bbuf, sizeof(bbuf));
	struct stat st;
	int rc, trc;
	pid_t pid;

	if (strcmp(dst, "-") == 0)
		return cli_fail("cp: -r cannot write a directory to stdout");
	if (stat(dst, &st) == 0 && S_ISDIR(st.st_mode) && base[0] != '\0') {
		if (asprintf(&target, "%s/%s", dst, base) < 0)
			return cli_fail("cp: out of memory");
	} else if ((target = strdup(dst)) == NULL) {
		return cli_fail("cp: out of memory");
	}
	if (mkdir(target, 0777) < 0 && errno != EEXIST)
		return cli_fail("cp: cannot make %s: %s", target, strerror(errno));
	argv[6] = target;
	snprintf(what, sizeof(what), "cp -r %s:%s -> %s", id, rpath, dst);
	if ((pid = tar_spawn(argv, 0, &c->out_fd)) < 0)
		return 1;
	rc = tree_exec(c, id, tree_get_sh, rpath[0] ? rpath : "/", "", -1, what);
	close(c->out_fd);
	trc = tar_wait(pid);
	return rc || trc;
}

/* cli_cp: cp [-r] [-q] SRC DST, one side local (or -), the other
 * ID:/path. */
int cli_cp(int argc, char **argv)
{
	static const char usage[] = "usage: tether cp [-r] [-q] SRC DST   (one of "
	                            "them ID:/path, the other a path or -)";
	char sid[CLI_ID_MAX], did[CLI_ID_MAX], full[CLI_ID_MAX];
	const char *spath = NULL, *dpath = NULL, *args[2];
	struct cpx c = { .out_fd = -1 };
	int srem, drem, rc, nargs = 0, opts = 1;

	for (int i = 1; i < argc; i++) {
		if (opts && strcmp(argv[i], "--") == 0)
			opts = 0;
		else if (opts && (strcmp(argv[i], "-r") == 0 || strcmp(argv[i], "-R") == 0))
			c.recursive = 1;
		else if (opts && strcmp(argv[i], "-q") == 0)
			c.quiet = 1;
		else if (opts && argv[i][0] == '-' && argv[i][1] != '\0')
			return cli_fail("%s", usage);
		else if (nargs < 2)
			args[nargs++] = argv[i];
		else
			return cli_fail("%s", usage);
	}
	if (nargs != 2)
		return cli_fail("%s", usage);
	srem = remote_split(args[0], sid, sizeof(sid), &spath);
	drem = remote_split(args[1], did, sizeof(did), &dpath);
	if (srem == drem)
		return cli_fail("cp: exactly one of SRC and DST must be ID:/path");
	if ((c.t = cli_open()) == NULL)
		return 1;
	if (cli_resolve(c.t, srem ? sid : did, full, sizeof(full)) < 0) {
		tether_free(c.t);
		return 1;
	}
	/* a local tar that exits early must not kill us through the pipe */
	signal(SIGPIPE, SIG_IGN);
	cli_meter_start(&c.meter, drem ? "upload" : "download", c.quiet);
	tether_set_progress(c.t, cp_progress, &c);
	if (drem)
		rc = c.recursive ? cp_tree_up(&c, args[0], full, dpath)
		                 : cp_upload(&c, args[0], full, dpath);
	else
		rc = c.recursive ? cp_tree_down(&c, full, spath, args[1])
		                 : cp_download(&c, full, spath, args[1]);
	tether_free(c.t);
	return rc;
}

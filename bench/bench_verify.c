/* Cost of bridge verification evidence (SPEC §5): median µs of
 * (a) proc_identity_read, (b) verify_peer on a connected unix socket,
 * (c) verify_listener (sock_diag dump + /proc fd scan), (c') the same from
 * inside another network namespace, (d) a bare unix connect + accept for
 * comparison. Needs root for (c'). */
#include <fcntl.h>
#include <sched.h>

#include "bench_util.h"
#include "procid.h"
#include "sockdiag.h"

#define ITERS 2000

/* listen_at: a listening unix socket at path, or -1. */
static int listen_at(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(fd, 64) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* spawn_holder: a child that listens at path (in a new netns if newnet)
 * and waits to be killed; its pid, or -1. */
static pid_t spawn_holder(const char *path, int newnet)
{
	int rd[2];
	char c;
	pid_t p;

	if (pipe(rd) < 0)
		return -1;
	p = fork();
	if (p == 0) {
		/* Privileged (c' only): a sandbox-like network namespace. */
		if (newnet && unshare(CLONE_NEWNET) < 0)
			_exit(1);
		if (listen_at(path) < 0)
			_exit(1);
		if (write(rd[1], "r", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(rd[1]);
	if (p < 0 || read(rd[0], &c, 1) != 1) {
		close(rd[0]);
		return -1;
	}
	close(rd[0]);
	return p;
}

/* stop: kills and reaps pid. */
static void stop(pid_t pid)
{
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
}

/* main: runs the measurements and prints one line each. */
int main(void)
{
	char dir[] = "/tmp/tt-bench-verify.XXXXXX", path[64], npath[64], ns[64];
	double *v = calloc(ITERS, sizeof(double)), a, b, c, cn = -1, d;
	struct proc_identity exp, lexp, nexp;
	struct tt_err err = { 0 };
	pid_t holder, nholder = -1;
	int l, cfd, sfd, nsfd;

	if (v == NULL || mkdtemp(dir) == NULL)
		return 1;
	snprintf(path, sizeof(path), "%s/l", dir);
	snprintf(npath, sizeof(npath), "%s/n", dir);
	holder = spawn_holder(path, 0);
	if (holder < 0 || proc_identity_read(holder, &lexp, &err) < 0) {
		fprintf(stderr, "bench_verify: listener: %s\n", err.msg);
		return 1;
	}

	/* (a) */
	for (int i = 0; i < ITERS; i++) {
		double t0 = bench_now_us();

		if (proc_identity_read(holder, &exp, &err) < 0)
			return fprintf(stderr, "bench_verify: %s\n", err.msg), 1;
		v[i] = bench_now_us() - t0;
	}
	a = bench_median(v, ITERS);

	/* (b): we connect to the holder's listener: the peer is the holder. */
	cfd = bench_unix_connect(path);
	if (cfd < 0)
		return 1;
	for (int i = 0; i < ITERS; i++) {
		double t0 = bench_now_us();

		if (verify_peer(cfd, &lexp, &err) < 0)
			return fprintf(stderr, "bench_verify: %s\n", err.msg), 1;
		v[i] = bench_now_us() - t0;
	}
	b = bench_median(v, ITERS);
	close(cfd);

	/* (c) */
	for (int i = 0; i < ITERS; i++) {
		double t0 = bench_now_us();

		if (verify_listener(path, -1, &lexp, &err) < 0)
			return fprintf(stderr, "bench_verify: %s\n", err.msg), 1;
		v[i] = bench_now_us() - t0;
	}
	c = bench_median(v, ITERS);

	/* (c') */
	if (geteuid() == 0 && (nholder = spawn_holder(npath, 1)) > 0 &&
	    proc_identity_read(nholder, &nexp, &err) == 0) {
		snprintf(ns, sizeof(ns), "/proc/%d/ns/net", (int)nholder);
		nsfd = open(ns, O_RDONLY | O_CLOEXEC);
		for (int i = 0; nsfd >= 0 && i < ITERS; i++) {
			double t0 = bench_now_us();

			if (verify_listener(npath, nsfd, &nexp, &err) < 0)
				return fprintf(stderr, "bench_verify: %s\n", err.msg), 1;
			v[i] = bench_now_us() - t0;
		}
		if (nsfd >= 0) {
			cn = bench_median(v, ITERS);
			close(nsfd);
		}
	}

	/* (d) */
	snprintf(path, sizeof(path), "%s/d", dir);
	if ((l = listen_at(path)) < 0)
		return 1;
	for (int i = 0; i < ITERS; i++) {
		double t0 = bench_now_us();

		cfd = bench_unix_connect(path);
		sfd = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0 || sfd < 0)
			return 1;
		v[i] = bench_now_us() - t0;
		close(cfd);
		close(sfd);
	}
	d = bench_median(v, ITERS);
	close(l);
	unlink(path);

	printf("proc_identity_read: %.1f us\n", a);
	printf("verify_peer (SO_PEERCRED + SO_PEERPIDFD + /proc + recheck): %.1f us\n", b);
	printf("verify_listener (sock_diag + /proc fd scan + pin): %.1f us\n", c);
	if (cn >= 0)
		printf("verify_listener in another netns (thread + setns): %.1f us\n", cn);
	printf("bare unix connect+accept: %.1f us\n", d);
	printf("added cost per new verified connection: %.1f us "
	       "(verify_peer %.1f + verify_listener %.1f; manager->bridge needs "
	       "only verify_peer)\n", b + (cn >= 0 ? cn : c), b, cn >= 0 ? cn : c);
	stop(holder);
	stop(nholder);
	snprintf(path, sizeof(path), "%s/l", dir);
	unlink(path);
	unlink(npath);
	rmdir(dir);
	free(v);
	return 0;
}

/* Cost of bridge verification evidence (SPEC §5): median µs of
 * (a) proc_identity_read, (b) verify_peer on a connected unix socket,
 * (c) verify_listener (sock_diag dump + /proc fd scan), (c') the same from
 * inside another network namespace (as the bridge does for a sandbox),
 * (d) a bare unix connect + accept for comparison, (e) the guest handshake
 * round trip against the real tether-guest. The added cost per new bridge
 * connection is (b) + (c') + (e): what the bridge does beyond a bare
 * connection (no env knob disables verification in the real bridge, so it
 * is measured by components). For context, on the real binaries: spawn of
 * tether-bridge until its readiness line, and one operation through
 * tether-bridge -> tether-guest with full verification. Needs root for
 * (c'). */
#include <fcntl.h>
#include <limits.h>
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

/* A valid sandbox id for the real bridge (BENCH_SBX is not one). */
#define VERIFY_SBX "sbx_verifyverifyverifyverifyve"

/* guest_start: the real guest for VERIFY_SBX on sock with bench_secret;
 * its pid once ready, or -1. */
static pid_t guest_start(const char *bin, const char *root, const char *sock)
{
	char rfd[16], sfd[16], line[8];
	int rp[2], sp[2];
	struct pollfd pf;
	pid_t pid;

	if (pipe(rp) < 0 || pipe(sp) < 0 ||
	    write(sp[1], bench_secret, sizeof(bench_secret)) != (ssize_t)sizeof(bench_secret))
		return -1;
	close(sp[1]);
	snprintf(rfd, sizeof(rfd), "%d", rp[1]);
	snprintf(sfd, sizeof(sfd), "%d", sp[0]);
	pid = fork();
	if (pid == 0) {
		execl(bin, bin, "--listen", sock, "--sbx", VERIFY_SBX, "--gen", "1", "--att", "1",
		      "--root", root, "--ready-fd", rfd, "--secret-fd", sfd, (char *)NULL);
		_exit(127);
	}
	close(rp[1]);
	close(sp[0]);
	pf = (struct pollfd){ .fd = rp[0], .events = POLLIN };
	if (pid < 0 || poll(&pf, 1, 5000) != 1 || read(rp[0], line, 6) != 6) {
		close(rp[0]);
		stop(pid);
		return -1;
	}
	close(rp[0]);
	return pid;
}

/* handshake_rtt: median µs of the guest handshake (challenge out, proof
 * in and checked) on fresh connections to the real guest at sock; the
 * guest's per-connection fork is let finish first, so only the round trip
 * and the HMACs count. -1 on failure. */
static double handshake_rtt(const char *sock, double *v, int iters)
{
	uint8_t *buf = malloc(WIRE_PAYLOAD_MAX + 1);
	double med = -1;

	if (buf == NULL)
		return -1;
	for (int i = 0; i < iters; i++) {
		int fd = bench_unix_connect(sock);
		double t0;

		if (fd < 0)
			goto out;
		usleep(1000);
		t0 = bench_now_us();
		if (bench_hello(fd, buf) < 0) {
			close(fd);
			goto out;
		}
		v[i] = bench_now_us() - t0;
		close(fd);
	}
	med = bench_median(v, (size_t)iters);
out:
	free(buf);
	return med;
}

/* bridge_spawn: the real tether-bridge in front of the guest (pid init,
 * socket gsock), this process as its manager; its pid once it wrote its
 * readiness line (*us: spawn-to-ready time), or -1. */
static pid_t bridge_spawn(const char *bin, const char *bsock, const char *gsock, pid_t init,
                          double *us)
{
	char ipid[16], istart[32], mpid[16], line[8];
	unsigned long long start = 0;
	int sp[2], rp[2];
	double t0 = bench_now_us();
	struct pollfd pf;
	pid_t pid;

	if (procid_start_time(init, &start, NULL) < 0 || pipe(sp) < 0 || pipe(rp) < 0)
		return -1;
	if (write(sp[1], bench_secret, sizeof(bench_secret)) != (ssize_t)sizeof(bench_secret))
		return -1;
	close(sp[1]);
	snprintf(ipid, sizeof(ipid), "%d", (int)init);
	snprintf(istart, sizeof(istart), "%llu", start);
	snprintf(mpid, sizeof(mpid), "%d", (int)getpid());
	pid = fork();
	if (pid == 0) {
		int null = getenv("BENCH_BRIDGE_LOG") ? 2 : open("/dev/null", O_WRONLY);

		if (null < 0 || dup2(null, 2) < 0 || dup2(sp[0], 3) < 0 || dup2(rp[1], 4) < 0)
			_exit(126);
		execl(bin, "tether-bridge", "--sbx", VERIFY_SBX, "--gen", "1", "--att", "1",
		      "--listen", bsock, "--guest-socket", gsock, "--init-pid", ipid,
		      "--init-start", istart, "--manager-pid", mpid, "--secret-fd", "3",
		      "--ready-fd", "4", (char *)NULL);
		_exit(127);
	}
	close(sp[0]);
	close(rp[1]);
	pf = (struct pollfd){ .fd = rp[0], .events = POLLIN };
	if (pid < 0 || poll(&pf, 1, 5000) != 1 || read(rp[0], line, 6) != 6) {
		close(rp[0]);
		stop(pid);
		return -1;
	}
	*us = bench_now_us() - t0;
	close(rp[0]);
	return pid;
}

/* bridge_op: one operation through the bridge at sock (as the manager
 * forwards it: no token, no handshake on this hop); 0 on RESULT. */
static int bridge_op(const char *sock, const char *req, uint8_t *buf)
{
	struct wire_frame f;
	int fd = bench_unix_connect(sock), rc = -1;

	if (fd < 0)
		return -1;
	if (wire_send(fd, WIRE_REQUEST, req, (uint32_t)strlen(req), NULL) == 0)
		while (wire_recv(fd, &f, buf, WIRE_PAYLOAD_MAX + 1, NULL) == 1) {
			if (f.type == WIRE_RESULT || f.type == WIRE_ERROR) {
				rc = f.type == WIRE_RESULT ? 0 : -1;
				break;
			}
		}
	close(fd);
	return rc;
}

/* direct_median: median µs of the operation req on fresh connections
 * straight to the guest at sock, with the handshake round trip for
 * VERIFY_SBX (proof not checked) but none of the process evidence. */
static double direct_median(const char *sock, const char *req, uint8_t *buf, double *v,
                            int iters)
{
	for (int i = 0; i < iters; i++) {
		uint8_t chal[HELLO_CHALLENGE_LEN];
		char b64[HELLO_B64_LEN + 1], msg[256];
		struct wire_frame f;
		double t0 = bench_now_us();
		int fd = bench_unix_connect(sock), n, ok = 0;

		if (fd < 0)
			return -1;
		randombytes_buf(chal, sizeof(chal));
		hello_b64_encode(chal, b64);
		n = snprintf(msg, sizeof(msg), "{\"v\":1,\"challenge\":\"%s\",\"sbx\":\"%s\","
		             "\"generation\":1,\"activation\":1}", b64, VERIFY_SBX);
		if (wire_send(fd, WIRE_HELLO, msg, (uint32_t)n, NULL) == 0 &&
		    wire_recv(fd, &f, buf, WIRE_PAYLOAD_MAX + 1, NULL) == 1 && f.type == WIRE_HELLO &&
		    wire_send(fd, WIRE_REQUEST, req, (uint32_t)strlen(req), NULL) == 0)
			while (wire_recv(fd, &f, buf, WIRE_PAYLOAD_MAX + 1, NULL) == 1)
				if (f.type == WIRE_RESULT || f.type == WIRE_ERROR) {
					ok = f.type == WIRE_RESULT;
					break;
				}
		close(fd);
		if (!ok)
			return -1;
		v[i] = bench_now_us() - t0;
	}
	return bench_median(v, (size_t)iters);
}

/* real_bridge: spawn-to-ready of tether-bridge (median of 30) and the
 * median µs of an fs.stat through tether-bridge -> tether-guest with full
 * verification, next to the same fs.stat straight to the guest. */
static int real_bridge(const char *dir, double *v, double *spawn, double *via, double *direct)
{
	const char *bin = getenv("TETHER_BRIDGE_BIN") ? getenv("TETHER_BRIDGE_BIN")
	                                              : "build/tether-bridge";
	const char *gbin = getenv("TETHER_GUEST_BIN") ? getenv("TETHER_GUEST_BIN")
	                                              : "build/tether-guest";
	char gsock[PATH_MAX], bsock[PATH_MAX], req[128];
	uint8_t *buf = malloc(WIRE_PAYLOAD_MAX + 1);
	pid_t g, b = -1;
	int n = 0, rc = -1;

	snprintf(gsock, sizeof(gsock), "%s/g.sock", dir);
	snprintf(bsock, sizeof(bsock), "%s/b.sock", dir);
	snprintf(req, sizeof(req), "{\"sbx\":\"%s\",\"op\":\"fs.stat\",\"path\":\"/\"}",
	         VERIFY_SBX);
	g = guest_start(gbin, dir, gsock);
	if (g < 0 || buf == NULL)
		goto out;
	for (int i = 0; i < 30; i++) {
		b = bridge_spawn(bin, bsock, gsock, g, &v[i]);
		if (b < 0)
			goto out;
		if (i < 29) {
			stop(b);
			b = -1;
		}
	}
	*spawn = bench_median(v, 30);
	for (int i = 0; i < 5; i++)
		if (bridge_op(bsock, req, buf) < 0)
			goto out;
	for (n = 0; n < 500; n++) {
		double t0 = bench_now_us();

		if (bridge_op(bsock, req, buf) < 0)
			goto out;
		v[n] = bench_now_us() - t0;
	}
	*via = bench_median(v, (size_t)n);
	/* Straight to the guest: the handshake round trip, but no listener
	 * or peer evidence and no bridge hop. */
	*direct = direct_median(gsock, req, buf, v, 500);
	rc = *direct < 0 ? -1 : 0;
out:
	stop(b);
	bench_guest_stop(g);
	unlink(gsock);
	unlink(bsock);
	free(buf);
	return rc;
}

/* main: runs the measurements and prints one line each. */
int main(void)
{
	char dir[] = "/tmp/tt-bench-verify.XXXXXX", path[64], npath[64], ns[64];
	double *v = calloc(ITERS, sizeof(double)), a, b, c, cn = -1, d, e = -1;
	double spawn = -1, via = -1, direct = -1;
	char gsock[64];
	pid_t guest;
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

	/* (e): the real guest, fresh connection each time. */
	snprintf(gsock, sizeof(gsock), "%s/hs.sock", dir);
	guest = bench_guest_start(getenv("TETHER_GUEST_BIN") ? getenv("TETHER_GUEST_BIN")
	                                                     : "build/tether-guest",
	                          dir, gsock);
	if (guest > 0)
		e = handshake_rtt(gsock, v, 300);
	bench_guest_stop(guest);
	unlink(gsock);
	if (real_bridge(dir, v, &spawn, &via, &direct) < 0)
		fprintf(stderr, "bench_verify: real tether-bridge run failed (built?)\n");

	printf("proc_identity_read: %.1f us\n", a);
	printf("verify_peer (SO_PEERCRED + SO_PEERPIDFD + /proc + recheck): %.1f us\n", b);
	printf("verify_listener (sock_diag + /proc fd scan + pin): %.1f us\n", c);
	if (cn >= 0)
		printf("verify_listener in another netns (thread + setns): %.1f us\n", cn);
	printf("bare unix connect+accept: %.1f us\n", d);
	printf("guest handshake round trip (challenge, HMAC proof, check): %.1f us\n", e);
	printf("added cost per new bridge connection: %.1f us (verify_listener%s %.1f"
	       " + verify_peer %.1f + handshake %.1f; bare connect+accept %.1f; the "
	       "manager->bridge hop adds verify_peer only)\n",
	       (cn >= 0 ? cn : c) + b + e, cn >= 0 ? " in the sandbox netns" : "",
	       cn >= 0 ? cn : c, b, e, d);
	if (via >= 0)
		printf("real binaries: tether-bridge spawn to ready %.0f us; fs.stat through "
		       "tether-bridge -> tether-guest %.1f us vs straight to the guest "
		       "%.1f us\n", spawn, via, direct);
	stop(holder);
	stop(nholder);
	snprintf(path, sizeof(path), "%s/l", dir);
	unlink(path);
	unlink(npath);
	rmdir(dir);
	free(v);
	return 0;
}

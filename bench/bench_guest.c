/* Baselines for the full-path benchmark, measured in one run: a raw unix
 * socket round trip, exec `true` and a 4 KiB fs.read straight to a guest
 * agent started here on a temp root, each both with a new connection (and
 * handshake) per operation and warm: operations in sequence on one
 * handshaken connection. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

int main(void)
{
	const char *bin = getenv("TETHER_GUEST_BIN");
	char root[] = "/tmp/tt-bench-guest.XXXXXX";
	char sock[300], file[300], cmd[400], data[4096];
	double raw, ex, rd, exw, rdw;
	FILE *f;
	pid_t pid;

	if (bin == NULL)
		bin = "build/tether-guest";
	if (mkdtemp(root) == NULL)
		return perror("mkdtemp"), 1;
	snprintf(sock, sizeof(sock), "%s/guest.sock", root);
	snprintf(file, sizeof(file), "%s/f4k", root);
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (char)('a' + i % 26);
	f = fopen(file, "w");
	if (f == NULL || fwrite(data, 1, sizeof(data), f) != sizeof(data))
		return perror(file), 1;
	fclose(f);
	raw = bench_raw_rtt(20000, 0);
	pid = bench_guest_start(bin, root, sock);
	if (pid < 0) {
		fprintf(stderr, "bench_guest: cannot start %s\n", bin);
		return 1;
	}
	ex = bench_guest_exec(sock, 300);
	rd = bench_guest_fs_read(sock, "/f4k", 5000);
	exw = bench_guest_exec_warm(sock, 300);
	rdw = bench_guest_fs_read_warm(sock, "/f4k", 5000);
	bench_guest_stop(pid);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_guest: cleanup of %s failed\n", root);
	printf("raw_rtt median %.1f us\n", raw);
	printf("guest_exec_true median %.1f us\n", ex);
	printf("guest_fs_read_4k median %.1f us\n", rd);
	printf("guest_exec_true_warm median %.1f us\n", exw);
	printf("guest_fs_read_4k_warm median %.1f us\n", rdw);
	return raw < 0 || ex < 0 || rd < 0 || exw < 0 || rdw < 0;
}

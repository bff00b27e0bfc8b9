/* Snapshot costs (SPEC §7): a 10 MiB sandbox layer (a few files in
 * home/tmp/workspace) packed straight into the dir snapshot store and
 * published (fsyncs included), then fetched and unpacked into a fresh
 * directory; median and mean ms over the runs, and MiB/s at the median.
 * Runs in a scratch directory under $TMPDIR (default /tmp), same disk as a
 * real store would be.
 * usage: bench_snapshot [runs]  (default 20) */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "bench_util.h"
#include "snapstore.h"

#define LAYER_MIB 10

/* write_rand: a file of n random bytes under dfd. */
static int write_rand(int dfd, const char *path, size_t n)
{
	uint8_t *buf = malloc(n ? n : 1);
	int fd = openat(dfd, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int rc = -1;

	if (buf != NULL && fd >= 0) {
		randombytes_buf(buf, n);
		rc = bench_io_full(fd, buf, n, 1);
	}
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

/* build_layer: 10 MiB over a few files, plus small ones and a symlink. */
static int build_layer(int dfd)
{
	static const char *dirs[] = { "layer", "layer/home", "layer/tmp",
	                              "layer/workspace", "layer/workspace/src" };

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		if (mkdirat(dfd, dirs[i], 0755) < 0)
			return -1;
	if (write_rand(dfd, "layer/workspace/data.bin", 6u << 20) < 0 ||
	    write_rand(dfd, "layer/home/cache.bin", 3u << 20) < 0 ||
	    write_rand(dfd, "layer/tmp/scratch.bin", (1u << 20) - 64 * 1024) < 0)
		return -1;
	for (int i = 0; i < 16; i++) {
		char p[64];

		snprintf(p, sizeof(p), "layer/workspace/src/file%02d.c", i);
		if (write_rand(dfd, p, 4096) < 0)
			return -1;
	}
	return symlinkat("/etc/passwd", dfd, "layer/home/link");
}

/* report: one line of figures for n samples in µs over bytes. */
static void report(const char *what, double *us, int n, uint64_t bytes)
{
	double sum = 0, med;

	for (int i = 0; i < n; i++)
		sum += us[i];
	med = bench_median(us, (size_t)n);
	printf("%-22s median %8.2f ms  mean %8.2f ms  %8.1f MiB/s (%d runs)\n",
	       what, med / 1000, sum / n / 1000,
	       ((double)bytes / (1 << 20)) / (med / 1e6), n);
}

int main(int argc, char **argv)
{
	int runs = argc > 1 ? atoi(argv[1]) : 20;
	const char *tmpdir = getenv("TMPDIR");
	char base[256], root[300];
	struct snapstore *s = NULL;
	struct snapshot_stats st = { 0 };
	struct tt_err err = { 0 };
	double *put_us, *get_us;
	int dfd, lfd, tmp, rc = 1;

	if (runs < 1)
		runs = 20;
	put_us = calloc((size_t)runs, sizeof(double));
	get_us = calloc((size_t)runs, sizeof(double));
	snprintf(base, sizeof(base), "%s/tt-bench-snap-XXXXXX", tmpdir ? tmpdir : "/tmp");
	if (put_us == NULL || get_us == NULL || sodium_init() < 0 || mkdtemp(base) == NULL)
		return 1;
	snprintf(root, sizeof(root), "%s/store", base);
	dfd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || build_layer(dfd) < 0 || snapstore_dir_open(root, &s, &err) < 0) {
		fprintf(stderr, "bench_snapshot: setup failed: %s\n", err.msg);
		goto out;
	}
	lfd = openat(dfd, "layer", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	for (int i = 0; i < runs; i++) {
		uint64_t gen = (uint64_t)i + 1;
		double t0 = bench_now_us();

		if (snapstore_put_tree(s, "sbx_bench", gen, lfd, NULL, &st, &err) < 0)
			goto fail;
		put_us[i] = bench_now_us() - t0;
		t0 = bench_now_us();
		if (snapstore_get_tree(s, "sbx_bench", gen, dfd, "restored", NULL, NULL,
		                       &err) < 0)
			goto fail;
		get_us[i] = bench_now_us() - t0;
		if (snapshot_rm_tree(dfd, "restored", &err) < 0 ||
		    snapstore_remove(s, "sbx_bench", gen, &err) < 0)
			goto fail;
	}
	close(lfd);
	printf("layer: %llu entries, %.2f MiB of file data, archive %.2f MiB\n",
	       (unsigned long long)st.entries, (double)st.data_bytes / (1 << 20),
	       (double)st.stream_bytes / (1 << 20));
	report("pack+put (published)", put_us, runs, st.data_bytes);
	report("get+unpack", get_us, runs, st.data_bytes);
	rc = 0;
	goto out;
fail:
	fprintf(stderr, "bench_snapshot: %s\n", err.msg);
	close(lfd);
out:
	snapstore_close(s);
	if (dfd >= 0)
		close(dfd);
	tmp = open(tmpdir ? tmpdir : "/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (tmp >= 0) {
		(void)snapshot_rm_tree(tmp, strrchr(base, '/') + 1, NULL);
		close(tmp);
	}
	free(put_us);
	free(get_us);
	return rc;
}

/* Fuzzes the snapshot unpacker: each input is unpacked twice into a private
 * scratch directory, once as is and once with a correct checksum appended
 * (so inputs also reach the publish path). Nothing may ever appear outside
 * the target: after each run the scratch directory must hold exactly what
 * the run published (removed again) and the sentinel directory beside it
 * must stay empty. */
#include <dirent.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct src {
	const uint8_t *a, *b; /* b (may be NULL) follows a */
	size_t alen, blen, pos, step;
};

/* src_read: serves a then b, in pieces of a varying size. */
static ssize_t src_read(void *ctx, void *buf, size_t len, struct tt_err *err)
{
	struct src *s = ctx;
	size_t total = s->alen + s->blen, n;

	(void)err;
	if (s->pos >= total)
		return 0;
	n = total - s->pos;
	if (n > len)
		n = len;
	s->step = s->step * 1103515245u + 12345u;
	if (n > 1 + (s->step >> 8) % 4096)
		n = 1 + (s->step >> 8) % 4096;
	for (size_t i = 0; i < n; i++, s->pos++)
		((uint8_t *)buf)[i] = s->pos < s->alen ? s->a[s->pos]
		                                       : s->b[s->pos - s->alen];
	return (ssize_t)n;
}

/* entries_in: names in dfd/sub other than "." and "..". */
static int entries_in(int dfd, const char *sub)
{
	int fd = openat(dfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct dirent *de;
	DIR *d;
	int n = 0;

	if (fd < 0)
		abort();
	d = fdopendir(fd);
	if (d == NULL)
		abort();
	while ((de = readdir(d)) != NULL)
		n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* one_run: unpacks and checks the scratch directory afterwards. */
static void one_run(int base, struct src *s)
{
	static const struct snapshot_limits lim = {
		.max_entries = 256, .max_entry_size = 1 << 20, .max_total = 4 << 20,
	};
	struct snapshot_unpack_opts o = { .limits = &lim };
	struct tt_err err = { 0 };
	int rc = snapshot_unpack(base, "out", src_read, s, &o, NULL, &err);

	if (rc == 0) {
		if (snapshot_rm_tree(base, "out", &err) < 0)
			abort();
	} else if (err.code == TT_OK) {
		abort(); /* a failure always says why */
	}
	/* Only the sentinel remains, and nothing got into it. */
	if (entries_in(base, ".") != 1 || entries_in(base, "outside") != 0)
		abort();
}

static char base_path[] = "/tmp/tt-fuzz-snap-XXXXXX";

/* cleanup_base: removes the scratch directory when the fuzzer exits. */
static void cleanup_base(void)
{
	int tmp = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (tmp >= 0) {
		(void)snapshot_rm_tree(tmp, base_path + strlen("/tmp/"), NULL);
		close(tmp);
	}
}

/* LLVMFuzzerTestOneInput: one input, raw and with a valid checksum. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int base = -1;
	uint8_t sum[SNAPSHOT_HASH_LEN];
	struct src s = { .a = data, .alen = size, .step = size };

	if (base < 0) {
		if (sodium_init() < 0 || mkdtemp(base_path) == NULL)
			abort();
		atexit(cleanup_base);
		base = open(base_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (base < 0 || mkdirat(base, "outside", 0700) < 0)
			abort();
	}
	one_run(base, &s);
	crypto_generichash(sum, sizeof(sum), data, size, NULL, 0);
	s = (struct src){ .a = data, .alen = size, .b = sum, .blen = sizeof(sum),
	                  .step = size + 1 };
	one_run(base, &s);
	return 0;
}

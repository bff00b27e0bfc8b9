/* PASERK k4.public / k4.secret / k4.pid against the official vectors
 * (including the expected failures), key files on a real filesystem, and
 * "tether-signer keygen" run in a child process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <sodium.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "b64url.h"
#include "paserk.h"
#include "signer/signer.h"
#include "testutil.h"

/* encode_raw: prefix || b64url(raw) for feeding wrong-sized keys to the
 * decoders (the encoders take fixed-size arrays, so cannot be misfed). */
static void encode_raw(const char *prefix, const uint8_t *raw, size_t len,
                       char *out, size_t cap)
{
	size_t plen = strlen(prefix);

	memcpy(out, prefix, plen);
	assert_true(b64url_encode(raw, len, out + plen, cap - plen) >= 0);
}

/* test_public_vectors: k4.public round trips; the failure does not decode. */
static void test_public_vectors(void **state)
{
	json_t *root, *tests = tu_vectors_load("k4.public.json", &root), *t;
	size_t i;
	int ok = 0, failed = 0;

	(void)state;
	json_array_foreach(tests, i, t) {
		uint8_t key[128], pk[32];
		size_t n = tu_hex(t, "key", key, sizeof(key));
		char enc[PASERK_K4_PUBLIC_LEN + 1], raw[256];
		struct tt_err err = { 0 };

		if (json_is_true(json_object_get(t, "expect-fail"))) {
			/* wrong size under either prefix, and the wrong version */
			encode_raw("k4.public.", key, n, raw, sizeof(raw));
			assert_int_equal(paserk_k4_public_decode(raw, pk, &err), -1);
			encode_raw("k3.public.", key, n, raw, sizeof(raw));
			assert_int_equal(paserk_k4_public_decode(raw, pk, &err), -1);
			assert_int_equal(err.code, TT_ERR_MALFORMED);
			failed++;
			continue;
		}
		assert_int_equal(n, 32);
		const char *want = json_string_value(json_object_get(t, "paserk"));
		assert_int_equal(paserk_k4_public_encode(key, enc), 0);
		assert_string_equal(enc, want);
		assert_int_equal(paserk_k4_public_decode(want, pk, &err), 0);
		assert_memory_equal(pk, key, 32);
		/* the same key under another version or type is refused */
		encode_raw("k3.public.", key, 32, raw, sizeof(raw));
		assert_int_equal(paserk_k4_public_decode(raw, pk, &err), -1);
		encode_raw("k4.secret.", key, 32, raw, sizeof(raw));
		assert_int_equal(paserk_k4_public_decode(raw, pk, &err), -1);
		ok++;
	}
	assert_int_equal(ok, 3);
	assert_int_equal(failed, 1);
	json_decref(root);
}

/* test_secret_vectors: k4.secret round trips; failures do not decode. */
static void test_secret_vectors(void **state)
{
	json_t *root, *tests = tu_vectors_load("k4.secret.json", &root), *t;
	size_t i;
	int ok = 0, failed = 0;

	(void)state;
	json_array_foreach(tests, i, t) {
		uint8_t key[128], sk[64], seed[32], pk[32], sk2[64];
		size_t n = tu_hex(t, "key", key, sizeof(key));
		char enc[PASERK_K4_SECRET_LEN + 1], raw[256];
		struct tt_err err = { 0 };

		if (json_is_true(json_object_get(t, "expect-fail"))) {
			encode_raw("k4.secret.", key, n, raw, sizeof(raw));
			assert_int_equal(paserk_k4_secret_decode(raw, sk, &err), -1);
			assert_int_equal(err.code, TT_ERR_MALFORMED);
			encode_raw("k3.secret.", key, n, raw, sizeof(raw));
			assert_int_equal(paserk_k4_secret_decode(raw, sk, &err), -1);
			failed++;
			continue;
		}
		assert_int_equal(n, 64);
		assert_int_equal(tu_hex(t, "secret-key-seed", seed, sizeof(seed)), 32);
		assert_int_equal(tu_hex(t, "public-key", pk, sizeof(pk)), 32);
		crypto_sign_seed_keypair(pk, sk2, seed);
		assert_memory_equal(sk2, key, 64);
		const char *want = json_string_value(json_object_get(t, "paserk"));
		assert_int_equal(paserk_k4_secret_encode(key, enc), 0);
		assert_string_equal(enc, want);
		assert_int_equal(paserk_k4_secret_decode(want, sk, &err), 0);
		assert_memory_equal(sk, key, 64);
		/* a public half that is not the seed's is refused */
		key[63] ^= 1;
		encode_raw("k4.secret.", key, 64, raw, sizeof(raw));
		assert_int_equal(paserk_k4_secret_decode(raw, sk, &err), -1);
		assert_int_equal(err.code, TT_ERR_MALFORMED);
		/* as is a public key presented as a secret one */
		encode_raw("k4.public.", key, 64, raw, sizeof(raw));
		assert_int_equal(paserk_k4_secret_decode(raw, sk, &err), -1);
		sodium_memzero(sk, sizeof(sk));
		sodium_memzero(sk2, sizeof(sk2));
		ok++;
	}
	assert_int_equal(ok, 3);
	assert_int_equal(failed, 2);
	json_decref(root);
}

/* test_pid_vectors: kids of the vector keys; wrong-sized and wrong-version
 * keys never become a k4.public, so never get a kid. */
static void test_pid_vectors(void **state)
{
	json_t *root, *tests = tu_vectors_load("k4.pid.json", &root), *t;
	size_t i;
	int ok = 0, failed = 0;

	(void)state;
	json_array_foreach(tests, i, t) {
		uint8_t key[128], pk[32];
		size_t n = tu_hex(t, "key", key, sizeof(key));
		char pid[PASERK_K4_PID_LEN + 1], raw[256];
		struct tt_err err = { 0 };

		if (json_is_true(json_object_get(t, "expect-fail"))) {
			assert_int_not_equal(n, 32);
			encode_raw("k4.public.", key, n, raw, sizeof(raw));
			assert_int_equal(paserk_k4_public_decode(raw, pk, &err), -1);
			failed++;
			continue;
		}
		assert_int_equal(n, 32);
		assert_int_equal(paserk_k4_pid(key, pid), 0);
		assert_string_equal(pid, json_string_value(json_object_get(t, "paserk")));
		assert_int_equal(strlen(pid), PASERK_K4_PID_LEN);
		ok++;
	}
	assert_int_equal(ok, 3);
	assert_int_equal(failed, 2);
	json_decref(root);
}

/* test_decode_hostile: padding, length, truncation, NUL-free bounds. */
static void test_decode_hostile(void **state)
{
	uint8_t pk[32], sk[64], seed[32] = { 1 };
	char enc[PASERK_K4_PUBLIC_LEN + 8], buf[300];
	struct tt_err err = { 0 };

	(void)state;
	crypto_sign_seed_keypair(pk, sk, seed);
	assert_int_equal(paserk_k4_public_encode(pk, enc), 0);
	assert_int_equal(paserk_k4_public_decode(enc, pk, &err), 0);
	snprintf(buf, sizeof(buf), "%s=", enc);
	assert_int_equal(paserk_k4_public_decode(buf, pk, &err), -1);
	snprintf(buf, sizeof(buf), "%.*s", PASERK_K4_PUBLIC_LEN - 1, enc);
	assert_int_equal(paserk_k4_public_decode(buf, pk, &err), -1);
	snprintf(buf, sizeof(buf), " %s", enc);
	assert_int_equal(paserk_k4_public_decode(buf, pk, &err), -1);
	assert_int_equal(paserk_k4_public_decode("", pk, &err), -1);
	assert_int_equal(paserk_k4_public_decode(NULL, pk, &err), -1);
	memset(buf, 'A', sizeof(buf) - 1);
	buf[sizeof(buf) - 1] = '\0';
	memcpy(buf, "k4.public.", 10);
	assert_int_equal(paserk_k4_public_decode(buf, pk, &err), -1);
	sodium_memzero(sk, sizeof(sk));
}

/* scratch: a fresh private directory for key files. */
static void scratch(char dir[64])
{
	snprintf(dir, 64, "/tmp/tether-paserk-XXXXXX");
	assert_non_null(mkdtemp(dir));
}

/* count_entries: files in dir (to see that no temporary is left). */
static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* test_key_files: 0600 even under umask 0, no clobbering without
 * overwrite, readable-by-others and symlinked files refused. */
static void test_key_files(void **state)
{
	char dir[64], path[128], link_path[128];
	uint8_t pk[32], sk[64], sk2[64], back[64];
	struct tt_err err = { 0 };
	struct stat st;
	mode_t old = umask(0);

	(void)state;
	scratch(dir);
	snprintf(path, sizeof(path), "%s/signer.key", dir);
	crypto_sign_keypair(pk, sk);
	crypto_sign_keypair(pk, sk2);
	assert_int_equal(paserk_secret_file_write(path, sk, 0, &err), 0);
	umask(old);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(st.st_size, PASERK_K4_SECRET_LEN + 1);
	assert_int_equal(paserk_secret_file_read(path, back, &err), 0);
	assert_memory_equal(back, sk, 64);
	/* no overwrite: refused, file unchanged, no temporary left behind */
	assert_int_equal(paserk_secret_file_write(path, sk2, 0, &err), -1);
	assert_int_equal(err.code, TT_ERR_CONFLICT);
	assert_non_null(strstr(err.msg, "already exists"));
	assert_int_equal(paserk_secret_file_read(path, back, &err), 0);
	assert_memory_equal(back, sk, 64);
	assert_int_equal(count_entries(dir), 1);
	/* overwrite replaces it */
	assert_int_equal(paserk_secret_file_write(path, sk2, 1, &err), 0);
	assert_int_equal(paserk_secret_file_read(path, back, &err), 0);
	assert_memory_equal(back, sk2, 64);
	assert_int_equal(count_entries(dir), 1);
	/* group- or world-accessible: refused; honest mode: accepted */
	const mode_t bad[] = { 0640, 0604, 0660, 0644, 0610 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(chmod(path, bad[i]), 0);
		assert_int_equal(paserk_secret_file_read(path, back, &err), -1);
		assert_int_equal(err.code, TT_ERR_DENIED);
	}
	assert_int_equal(chmod(path, 0400), 0);
	assert_int_equal(paserk_secret_file_read(path, back, &err), 0);
	assert_int_equal(chmod(path, 0600), 0);
	/* 0600 but owned by someone else (needs root to set up): refused */
	if (chown(path, 65534, 65534) == 0) {
		assert_int_equal(paserk_secret_file_read(path, back, &err), -1);
		assert_int_equal(err.code, TT_ERR_DENIED);
		assert_int_equal(chown(path, geteuid(), getegid()), 0);
		assert_int_equal(paserk_secret_file_read(path, back, &err), 0);
	}
	/* a symlink to the key is not followed */
	snprintf(link_path, sizeof(link_path), "%s/link.key", dir);
	assert_int_equal(symlink(path, link_path), 0);
	assert_int_equal(paserk_secret_file_read(link_path, back, &err), -1);
	/* a directory and a missing file are errors, not crashes */
	assert_int_equal(paserk_secret_file_read(dir, back, &err), -1);
	assert_int_equal(paserk_secret_file_read("/nonexistent/k", back, &err), -1);
	assert_int_equal(err.code, TT_ERR_IO);
	unlink(link_path);
	unlink(path);
	rmdir(dir);
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(sk2, sizeof(sk2));
	sodium_memzero(back, sizeof(back));
}

/* write_file: creates path with mode 0600 holding s. */
static void write_file(const char *path, const char *s, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, s, len), (ssize_t)len);
	close(fd);
}

/* test_key_file_contents: tampered, truncated, oversized, NUL-bearing. */
static void test_key_file_contents(void **state)
{
	char dir[64], path[128], line[PASERK_K4_SECRET_LEN + 2], big[512];
	uint8_t pk[32], sk[64], back[64];
	struct tt_err err = { 0 };

	(void)state;
	scratch(dir);
	snprintf(path, sizeof(path), "%s/k", dir);
	crypto_sign_keypair(pk, sk);
	assert_int_equal(paserk_k4_secret_encode(sk, line), 0);
	/* honest, without the trailing newline */
	write_file(path, line, PASERK_K4_SECRET_LEN);
	assert_int_equal(paserk_secret_file_read(path, back, &err), 0);
	/* two newlines, CRLF, truncated, NUL inside */
	snprintf(big, sizeof(big), "%s\n\n", line);
	write_file(path, big, strlen(big));
	assert_int_equal(paserk_secret_file_read(path, back, &err), -1);
	snprintf(big, sizeof(big), "%s\r\n", line);
	write_file(path, big, strlen(big));
	assert_int_equal(paserk_secret_file_read(path, back, &err), -1);
	write_file(path, line, PASERK_K4_SECRET_LEN - 1);
	assert_int_equal(paserk_secret_file_read(path, back, &err), -1);
	memcpy(big, line, PASERK_K4_SECRET_LEN);
	big[40] = '\0';
	write_file(path, big, PASERK_K4_SECRET_LEN);
	assert_int_equal(paserk_secret_file_read(path, back, &err), -1);
	memset(big, 'A', sizeof(big));
	write_file(path, big, sizeof(big));
	assert_int_equal(paserk_secret_file_read(path, back, &err), -1);
	assert_int_equal(err.code, TT_ERR_MALFORMED);
	unlink(path);
	rmdir(dir);
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(back, sizeof(back));
	sodium_memzero(line, sizeof(line));
}

/* run_keygen: keygen_main in a child process with stdout captured. */
static int run_keygen(char **argv, int argc, char *out, size_t cap)
{
	int fds[2], status;
	pid_t pid;
	size_t len = 0;
	ssize_t n;

	assert_int_equal(pipe(fds), 0);
	fflush(stdout); /* or the child would flush our buffered TAP lines */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		_exit(keygen_main(argc, argv));
	}
	close(fds[1]);
	while (len + 1 < cap && (n = read(fds[0], out + len, cap - 1 - len)) > 0)
		len += (size_t)n;
	out[len] = '\0';
	close(fds[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	return WEXITSTATUS(status);
}

/* test_keygen: the command writes a 0600 key whose public half and kid it
 * prints; refuses to clobber without --force. */
static void test_keygen(void **state)
{
	char dir[64], path[128], out[512], out2[512], pub[PASERK_K4_PUBLIC_LEN + 1];
	char pid[PASERK_K4_PID_LEN + 1], want[512];
	uint8_t sk[64];
	struct tt_err err = { 0 };
	struct stat st;

	(void)state;
	scratch(dir);
	snprintf(path, sizeof(path), "%s/signer.key", dir);
	char *argv1[] = { "keygen", path, NULL };
	assert_int_equal(run_keygen(argv1, 2, out, sizeof(out)), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(paserk_secret_file_read(path, sk, &err), 0);
	assert_int_equal(paserk_k4_public_encode(sk + 32, pub), 0);
	assert_int_equal(paserk_k4_pid(sk + 32, pid), 0);
	snprintf(want, sizeof(want), "public: %s\nkid: %s\n", pub, pid);
	assert_string_equal(out, want);
	/* no secret on stdout */
	char sec[PASERK_K4_SECRET_LEN + 1];
	assert_int_equal(paserk_k4_secret_encode(sk, sec), 0);
	assert_null(strstr(out, sec + 10));
	/* exists: refused and unchanged; --force: a new key */
	assert_int_equal(run_keygen(argv1, 2, out2, sizeof(out2)), 1);
	assert_string_equal(out2, "");
	char *argv2[] = { "keygen", path, "--force", NULL };
	assert_int_equal(run_keygen(argv2, 3, out2, sizeof(out2)), 0);
	assert_string_not_equal(out2, out);
	/* usage errors */
	char *argvh[] = { "keygen", "--help", NULL };
	assert_int_equal(run_keygen(argvh, 2, out2, sizeof(out2)), 0);
	assert_non_null(strstr(out2, "usage: tether-signer keygen FILE"));
	char *argv3[] = { "keygen", NULL };
	assert_int_equal(run_keygen(argv3, 1, out2, sizeof(out2)), 1);
	char *argv4[] = { "keygen", path, "--bogus", NULL };
	assert_int_equal(run_keygen(argv4, 3, out2, sizeof(out2)), 1);
	unlink(path);
	rmdir(dir);
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(sec, sizeof(sec));
}

/* main: runs the tests as one group (TAP via CMOCKA_MESSAGE_OUTPUT). */
int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_public_vectors),
		cmocka_unit_test(test_secret_vectors),
		cmocka_unit_test(test_pid_vectors),
		cmocka_unit_test(test_decode_hostile),
		cmocka_unit_test(test_key_files),
		cmocka_unit_test(test_key_file_contents),
		cmocka_unit_test(test_keygen),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* File operations, every path resolved inside the root (path.c). Writes
 * are atomic and durable: temp file, fsync, rename, fsync directory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "fsutil.h"
#include "guest/guest.h"
#include "wire_json.h"

#define FS_REMOVE_DEPTH_MAX 256

/* fs_type_name: the "type" field for a mode. */
static const char *fs_type_name(mode_t m)
{
	if (S_ISREG(m))
		return "file";
	if (S_ISDIR(m))
		return "dir";
	if (S_ISLNK(m))
		return "symlink";
	return "other";
}

/* fs_read_some: reads up to want bytes of a file announced as size bytes,
 * done of them read so far. Returns the count (> 0), or -2 - rc after
 * answering an ERROR (read failed; the file shrank under us), rc being the
 * send's result (0 sent, -1 the connection must close). */
static ssize_t fs_read_some(int conn, const char *path, int fd, uint8_t *buf,
                            size_t want, uint64_t done, uint64_t size)
{
	for (;;) {
		ssize_t n = read(fd, buf, want);

		if (n > 0)
			return n;
		if (n < 0 && errno == EINTR)
			continue;
		return -2 - (n < 0 ? guest_send_errno(conn, errno, path)
		                   : wire_send_error(conn, WIRE_E_CHANGED,
		                                     "%s shrank while being read (%llu of %llu bytes)",
		                                     path, (unsigned long long)done,
		                                     (unsigned long long)size));
	}
}

/* fs_read_small: a file that fits one frame is read whole, then META,
 * DATA_OUT and RESULT go out in one send: every hop up to node-api then
 * wakes once for the whole answer instead of once per frame. */
static int fs_read_small(const struct guest_ctx *g, int conn, const char *path, int fd,
                         uint8_t *buf, uint64_t size)
{
	char meta[64], result[96];
	struct wire_out out[3];
	size_t done = 0;
	int mlen, rlen;

	while (done < size) {
		ssize_t n = fs_read_some(conn, path, fd, buf + done, (size_t)size - done,
		                         done, size);

		if (n < 0)
			return (int)(-2 - n);
		done += (size_t)n;
	}
	/* The same JSON guest_result and the streaming path send. */
	mlen = snprintf(meta, sizeof(meta), "{\"size\":%llu}", (unsigned long long)size);
	rlen = snprintf(result, sizeof(result), "{\"size\":%llu,\"generation\":%llu}",
	                (unsigned long long)size, (unsigned long long)g->gen);
	out[0] = (struct wire_out){ WIRE_META, meta, (uint32_t)mlen };
	out[1] = (struct wire_out){ WIRE_DATA_OUT, buf, (uint32_t)size };
	out[2] = (struct wire_out){ WIRE_RESULT, result, (uint32_t)rlen };
	/* An empty file has no DATA_OUT, as on the streaming path. */
	if (size == 0)
		out[1] = out[2];
	return wire_send_frames(conn, out, size == 0 ? 2 : 3, NULL) < 0 ? -1 : 0;
}

/* fs_read: announces the size (META {"size":N}, so node-api can send
 * Content-Length), then streams exactly N bytes as DATA_OUT and ends with
 * RESULT size. A file that shrinks under the read is an ERROR (never a
 * silently short file); one that grows is cut at N bytes. */
int fs_read(const struct guest_ctx *g, int conn, json_t *req)
{
	int rc;
	const char *path = guest_req_path(conn, req, &rc);
	_cleanup_free_ uint8_t *buf = NULL;
	_cleanup_close_ int fd = -1;
	uint64_t size, done = 0;
	struct stat st;
	json_t *meta;

	if (path == NULL)
		return rc;
	/* O_NONBLOCK: opening a FIFO must not hang the handler. */
	fd = path_open(g, path, O_RDONLY | O_NONBLOCK, 0);
	if (fd < 0 || fstat(fd, &st) < 0)
		return guest_send_errno(conn, errno, path);
	if (S_ISDIR(st.st_mode))
		return guest_send_errno(conn, EISDIR, path);
	if (!S_ISREG(st.st_mode))
		return wire_send_error(conn, WIRE_E_BAD_REQUEST, "%s: not a regular file", path);
	buf = malloc(WIRE_PAYLOAD_MAX);
	if (buf == NULL)
		return wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
	size = (uint64_t)st.st_size;
	if (size <= WIRE_PAYLOAD_MAX)
		return fs_read_small(g, conn, path, fd, buf, size);
	meta = json_pack("{s:I}", "size", (json_int_t)size);
	rc = meta ? wire_send_json(conn, WIRE_META, meta, NULL) : -1;
	json_decref(meta);
	if (rc < 0)
		return -1; /* the opener is gone (or no memory): close */
	while (done < size) {
		size_t want = size - done < WIRE_PAYLOAD_MAX ?
		              (size_t)(size - done) : WIRE_PAYLOAD_MAX;
		ssize_t n = fs_read_some(conn, path, fd, buf, want, done, size);

		if (n < 0)
			return (int)(-2 - n);
		if (wire_send(conn, WIRE_DATA_OUT, buf, (uint32_t)n, NULL) < 0)
			return -1;
		done += (uint64_t)n;
	}
	return guest_result(g, conn, json_pack("{s:I}", "size", (json_int_t)size));
}

/* fs_write_body: receives DATA_IN until EOF_IN into fd. Returns 1 on
 * EOF_IN; 0 after an ERROR was sent for a failure of this operation alone
 * (the rest of its input is then discarded as stray between operations);
 * -1 when the connection must close (peer gone, protocol violation). */
static int fs_write_body(int conn, int fd, uint64_t *bytes)
{
	_cleanup_free_ uint8_t *buf = malloc(WIRE_PAYLOAD_MAX + 1);
	struct tt_err err = { 0 };
	struct wire_frame f;

	if (buf == NULL)
		return wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
	for (;;) {
		int rc = wire_recv(conn, &f, buf, WIRE_PAYLOAD_MAX + 1, &err);

		if (rc == 0)
			return -1;
		if (rc < 0) {
			if (err.code != TT_ERR_TRANSPORT)
				wire_send_error(conn, WIRE_E_BAD_REQUEST, "%s", err.msg);
			return -1;
		}
		if (f.type == WIRE_EOF_IN)
			return 1;
		if (f.type != WIRE_DATA_IN) {
			wire_send_error(conn, WIRE_E_BAD_REQUEST, "unexpected %s frame",
			                wire_type_name(f.type));
			return -1;
		}
		if (fsutil_write_all(fd, f.payload, f.len) < 0)
			return guest_send_errno(conn, errno, "write");
		*bytes += f.len;
	}
}

/* fs_write: atomic replace of path with the streamed content. */
int fs_write(const struct guest_ctx *g, int conn, json_t *req)
{
	int rc;
	const char *path = guest_req_path(conn, req, &rc);
	json_t *jmode = json_object_get(req, "mode");
	_cleanup_close_ int dfd = -1, fd = -1;
	char base[NAME_MAX + 1], tmp[64];
	uint8_t rnd[8];
	mode_t mode = 0644;
	uint64_t bytes = 0;
	struct stat st;

	if (path == NULL)
		return rc;
	if (jmode != NULL) {
		if (!json_is_integer(jmode) || json_integer_value(jmode) < 0 ||
		    json_integer_value(jmode) > 07777)
			return wire_send_error(conn, WIRE_E_BAD_REQUEST,
			                       "\"mode\" must be an integer 0..07777");
		mode = (mode_t)json_integer_value(jmode);
	}
	dfd = path_open_parent(g, path, base);
	if (dfd < 0)
		return guest_send_errno(conn, errno, path);
	if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
		return guest_send_errno(conn, EISDIR, path);
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return guest_send_errno(conn, errno, "getrandom");
	snprintf(tmp, sizeof(tmp), ".tether-%02x%02x%02x%02x%02x%02x%02x%02x.tmp",
	         rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	/* A single fresh name in the already-confined directory: O_EXCL and
	 * O_NOFOLLOW mean it can only be a new file of ours. */
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
	            0600);
	if (fd < 0)
		return guest_send_errno(conn, errno, path);
	rc = fs_write_body(conn, fd, &bytes);
	if (rc == 1 && (fchmod(fd, mode) < 0 || fsync(fd) < 0 ||
	                renameat(dfd, tmp, dfd, base) < 0)) {
		/* All input was taken (EOF_IN): the ERROR ends the operation. */
		rc = guest_send_errno(conn, errno, path);
		unlinkat(dfd, tmp, 0);
		return rc;
	}
	if (rc != 1) {
		/* Aborted or failed: the target is untouched, the temp goes. */
		unlinkat(dfd, tmp, 0);
		return rc;
	}
	/* The rename is durable only once the directory is on disk. */
	if (fsync(dfd) < 0)
		return guest_send_errno(conn, errno, "fsync directory");
	return guest_result(g, conn, json_pack("{s:I}", "bytes", (json_int_t)bytes));
}

/* fs_stat: lstat of path. */
int fs_stat(const struct guest_ctx *g, int conn, json_t *req)
{
	int rc;
	const char *path = guest_req_path(conn, req, &rc);
	_cleanup_close_ int fd = -1;
	struct stat st;

	if (path == NULL)
		return rc;
	fd = path_open(g, path, O_PATH | O_NOFOLLOW, 0);
	if (fd < 0 || fstatat(fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		return guest_send_errno(conn, errno, path);
	return guest_result(g, conn, json_pack("{s:s, s:s, s:I, s:i, s:I}",
	             "path", path, "type", fs_type_name(st.st_mode),
	             "size", (json_int_t)st.st_size, "mode", (int)(st.st_mode & 07777),
	             "mtime", (json_int_t)st.st_mtim.tv_sec));
}

/* name_cmp: qsort order for directory entries. */
static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* list_flush: sends the NDJSON lines held in buf as one DATA_OUT. */
static int list_flush(int conn, uint8_t *buf, size_t *len)
{
	int rc = 0;

	if (*len > 0)
		rc = wire_send(conn, WIRE_DATA_OUT, buf, (uint32_t)*len, NULL);
	*len = 0;
	return rc;
}

/* list_send: streams the entries of d named in names as newline-delimited
 * compact JSON objects in DATA_OUT frames (whole lines per frame), then
 * RESULT {"entries_total":N}. Entries removed meanwhile, or whose name is
 * not UTF-8 (JSON cannot carry it), are left out. */
static int list_send(const struct guest_ctx *g, int conn, DIR *d,
                      char *const *names, size_t n)
{
	_cleanup_free_ uint8_t *buf = malloc(WIRE_PAYLOAD_MAX);
	size_t len = 0, total = 0;

	if (buf == NULL)
		return wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		_cleanup_free_ char *line = NULL;
		struct stat st;
		json_t *e;
		size_t l;

		if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* removed meanwhile */
		e = json_pack("{s:s, s:s, s:I, s:i, s:I}",
		    "name", names[i], "type", fs_type_name(st.st_mode),
		    "size", (json_int_t)st.st_size, "mode", (int)(st.st_mode & 07777),
		    "mtime", (json_int_t)st.st_mtim.tv_sec);
		line = e ? json_dumps(e, JSON_COMPACT) : NULL;
		json_decref(e);
		if (line == NULL)
			continue; /* not UTF-8 */
		l = strlen(line); /* compact JSON: no newline inside */
		if (l + 1 > WIRE_PAYLOAD_MAX)
			continue; /* cannot happen: a name is at most 255 bytes */
		if (len + l + 1 > WIRE_PAYLOAD_MAX && list_flush(conn, buf, &len) < 0)
			return -1;
		memcpy(buf + len, line, l);
		buf[len + l] = '\n';
		len += l + 1;
		total++;
	}
	if (list_flush(conn, buf, &len) < 0)
		return -1;
	return guest_result(g, conn, json_pack("{s:I}", "entries_total", (json_int_t)total));
}

/* fs_list: the entries of a directory, sorted by name, at most
 * GUEST_LIST_MAX (refused with too_large before any entry is sent). */
int fs_list(const struct guest_ctx *g, int conn, json_t *req)
{
	int rc;
	const char *path = guest_req_path(conn, req, &rc);
	char **names = NULL; /* owned here, with every string in it */
	size_t n = 0;
	DIR *d;
	struct dirent *de;
	int fd;

	if (path == NULL)
		return rc;
	fd = path_open(g, path, O_RDONLY | O_DIRECTORY, 0);
	if (fd < 0)
		return guest_send_errno(conn, errno, path);
	d = fdopendir(fd);
	if (d == NULL) {
		rc = guest_send_errno(conn, errno, path);
		close(fd);
		return rc;
	}
	names = calloc(GUEST_LIST_MAX, sizeof(*names));
	if (names == NULL)
		goto nomem;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (n == GUEST_LIST_MAX) {
			rc = wire_send_error(conn, WIRE_E_TOO_LARGE, "%s has more than %d entries",
			                     path, GUEST_LIST_MAX);
			goto out;
		}
		names[n] = strdup(de->d_name);
		if (names[n] == NULL)
			goto nomem;
		n++;
	}
	qsort(names, n, sizeof(*names), name_cmp);
	rc = list_send(g, conn, d, names, n);
	goto out;
nomem:
	rc = wire_send_error(conn, WIRE_E_INTERNAL, "out of memory");
out:
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return rc;
}

/* mkdir_one: creates one directory; with exist_ok an existing directory
 * (resolved inside the root) is success. 0 or -1 with errno. */
static int mkdir_one(const struct guest_ctx *g, const char *path, int exist_ok)
{
	char base[NAME_MAX + 1];
	_cleanup_close_ int dfd = path_open_parent(g, path, base);
	_cleanup_close_ int fd = -1;

	if (dfd < 0) {
		if (errno == EINVAL && exist_ok) /* "/" always exists */
			return 0;
		if (errno == EINVAL)
			errno = EEXIST;
		return -1;
	}
	if (mkdirat(dfd, base, 0755) == 0)
		return 0;
	if (errno != EEXIST || !exist_ok)
		return -1;
	fd = path_open(g, path, O_PATH | O_DIRECTORY, 0);
	return fd < 0 ? -1 : 0;
}

/* fs_mkdir: one directory, or with "parents" every missing one (mkdir -p). */
int fs_mkdir(const struct guest_ctx *g, int conn, json_t *req)
{
	int rc;
	const char *path = guest_req_path(conn, req, &rc);
	int parents = json_is_true(json_object_get(req, "parents"));

	if (path == NULL)
		return rc;
	if (parents) {
		char prefix[GUEST_PATH_MAX + 1];
		size_t len = strlen(path);

		for (size_t i = 1; i <= len; i++) {
			if (i < len && path[i] != '/')
				continue;
			if (path[i - 1] == '/')
				continue; /* empty component */
			memcpy(prefix, path, i);
			prefix[i] = '\0';
			if (mkdir_one(g, prefix, 1) < 0)
				return guest_send_errno(conn, errno, prefix);
		}
	} else if (mkdir_one(g, path, 0) < 0) {
		return guest_send_errno(conn, errno, path);
	}
	return guest_result(g, conn, json_pack("{s:b}", "ok", 1));
}

/* remove_tree: removes directory name under dfd and everything in it,
 * never following symlinks (each step is one name under an open fd). */
static int remove_tree(int dfd, const char *name, int depth)
{
	struct dirent *de;
	int fd, again = 1;
	DIR *d;

	if (depth > FS_REMOVE_DEPTH_MAX) {
		errno = ELOOP;
		return -1;
	}
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return -1;
	}
	/* Rescan until empty: removing while iterating may skip entries. */
	while (again) {
		again = 0;
		rewinddir(d);
		while ((de = readdir(d)) != NULL) {
			struct stat st;
			int rc;

			if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
				continue;
			if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
				continue;
			if (S_ISDIR(st.st_mode))
				rc = remove_tree(dirfd(d), de->d_name, depth + 1);
			else
				rc = unlinkat(dirfd(d), de->d_name, 0);
			if (rc < 0 && errno != ENOENT) {
				int e = errno;

				closedir(d);
				errno = e;
				return -1;
			}
			again = 1;
		}
	}
	closedir(d);
	return unlinkat(dfd, name, AT_REMOVEDIR);
}

/* fs_remove: a file, symlink or empty directory; with "recursive" a tree. */
int fs_remove(const struct guest_ctx *g, int conn, json_t *req)
{
	int rc;
	const char *path = guest_req_path(conn, req, &rc);
	int recursive = json_is_true(json_object_get(req, "recursive"));
	_cleanup_close_ int dfd = -1;
	char base[NAME_MAX + 1];
	struct stat st;

	if (path == NULL)
		return rc;
	dfd = path_open_parent(g, path, base);
	if (dfd < 0) {
		if (errno == EINVAL)
			return wire_send_error(conn, WIRE_E_PATH_INVALID, "cannot remove %s", path);
		return guest_send_errno(conn, errno, path);
	}
	if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return guest_send_errno(conn, errno, path);
	if (!S_ISDIR(st.st_mode))
		rc = unlinkat(dfd, base, 0);
	else if (recursive)
		rc = remove_tree(dfd, base, 0);
	else
		rc = unlinkat(dfd, base, AT_REMOVEDIR);
	if (rc < 0)
		return guest_send_errno(conn, errno, path);
	return guest_result(g, conn, json_pack("{s:b}", "ok", 1));
}

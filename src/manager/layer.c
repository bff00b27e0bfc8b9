/* sbx-manager: each sandbox's layer and snapshots on this worker: restoring
 * a layer from the snapshot store when an execution resumes, removing a
 * published layer, a destroyed sandbox's tree and its snapshots. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cleanup.h"
#include "log.h"
#include "manager/manager_int.h"
#include "snapstore.h"

/* sandbox_tree_remove: see manager_int.h. */
int sandbox_tree_remove(const char *path)
{
	struct tt_err err = { 0 };

	if (access(path, F_OK) < 0)
		return 0;
	if (ns_layer_remove(path, &err) < 0) {
		log_warn("removing %s: %s", path, err.msg);
		errno = EBUSY;
		return -1;
	}
	if (ns_tree_remove(path, &err) < 0) {
		log_warn("removing %s: %s", path, err.msg);
		return -1;
	}
	return 0;
}

/* layer_unmount_of: see manager_int.h. */
void layer_unmount_of(struct manager *m, const char *sbx)
{
	struct tt_err err = { 0 };
	char dir[PATH_MAX];

	if (sandbox_dir(m, sbx, dir, sizeof(dir)) == 0 && ns_layer_umount(dir, &err) < 0)
		log_warn("unmounting the layer of %s: %s", sbx, err.msg);
}

/* snapshots_gc: see manager_int.h. */
void snapshots_gc(struct manager *m)
{
	struct snapstore *s = NULL;
	struct tt_err err = { 0 };
	unsigned removed = 0;

	if (!m->snap_dir[0])
		return;
	if (snapstore_dir_open(m->snap_dir, &s, &err) < 0 ||
	    snapstore_gc(s, 3600, &removed, &err) < 0)
		log_warn("snapshot store gc: %s", err.msg);
	else if (removed > 0)
		log_info("snapshot store gc: removed %u stale piece(s)", removed);
	snapstore_close(s);
}

/* snapshots_remove: see manager_int.h. */
void snapshots_remove(struct manager *m, const char *sbx)
{
	struct snapstore *s = NULL;
	struct tt_err err = { 0 };
	uint64_t *gens = NULL;
	size_t n = 0;

	if (!m->snap_dir[0])
		return;
	if (snapstore_dir_open(m->snap_dir, &s, &err) < 0 ||
	    snapstore_list(s, sbx, &gens, &n, &err) < 0) {
		if (err.code != TT_ERR_NOT_FOUND)
			log_warn("snapshots of %s: %s", sbx, err.msg);
		snapstore_close(s);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		tt_err_clear(&err);
		if (snapstore_remove(s, sbx, gens[i], &err) < 0)
			log_warn("removing snapshot %s/%" PRIu64 ": %s", sbx, gens[i], err.msg);
	}
	if (n > 0)
		log_info("removed %zu snapshot(s) of destroyed %s", n, sbx);
	free(gens);
	snapstore_close(s);
}

/* layer_move_up: moves every entry of ldfd/name up into ldfd (same
 * filesystem: renames), then removes the empty name. */
static int layer_move_up(int ldfd, const char *name, struct tt_err *err)
{
	int rfd = openat(ldfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct dirent *de;
	DIR *d;

	if (rfd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open the restored layer");
	d = fdopendir(rfd);
	if (d == NULL) {
		close(rfd);
		return tt_err_sys(err, TT_ERR_IO, "read the restored layer");
	}
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (renameat2(rfd, de->d_name, ldfd, de->d_name, RENAME_NOREPLACE) < 0) {
			tt_err_sys(err, TT_ERR_IO, "moving %.64s into the layer", de->d_name);
			closedir(d);
			return -1;
		}
	}
	closedir(d);
	if (unlinkat(ldfd, name, AT_REMOVEDIR) < 0)
		return tt_err_sys(err, TT_ERR_IO, "rmdir the restore dir");
	return 0;
}

/* layer_restore_into: unpacks snapshot ksbx/kgen into the (fresh, mounted)
 * layer of dir. */
static int layer_restore_into(struct manager *m, const struct rec_exec *rec,
                              const char *dir, const char *ksbx, uint64_t kgen,
                              struct snapshot_stats *st, struct tt_err *err)
{
	static const char *const subs[] = { "home", "tmp", "workspace" };
	struct snapshot_unpack_opts o = { 0 };
	struct snapstore *s = NULL;
	_cleanup_close_ int ldfd = -1;
	char layer[PATH_MAX];
	int rc;

	if (ns_layer_ensure(dir, m->tmpl_usable ? m->layer_tmpl : NULL, m->layer_bytes,
	                    m->layer_inodes, err) < 0)
		return -1;
	snprintf(layer, sizeof(layer), "%.4000s/layer", dir);
	ldfd = open(layer, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (ldfd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open %s", layer);
	/* The fresh filesystem's empty home/tmp/workspace go: the archive's
	 * tree is all the layer holds. */
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
		if (snapshot_rm_tree(ldfd, subs[i], err) < 0)
			return -1;
	if (snapstore_dir_open(m->snap_dir, &s, err) < 0)
		return -1;
	o.chown = true;
	o.id_base = uid_base_of(m, rec);
	o.gid_base = uid_base_of(m, rec);
	/* Unpacked INSIDE the capped filesystem (then moved up by renames):
	 * a snapshot larger than the cap fails with ENOSPC there, never
	 * touching the worker's filesystem; a failed unpack leaves nothing. */
	rc = snapstore_get_tree(s, ksbx, kgen, ldfd, "restore", &o, st, err);
	snapstore_close(s);
	if (rc < 0) {
		char why[sizeof(err->msg)];
		int no_space = err->sys_errno == ENOSPC || err->sys_errno == EDQUOT;

		memcpy(why, err->msg, sizeof(why)); /* the message is rewritten in place */
		if (no_space)
			return tt_err_set(err, TT_ERR_TOO_LARGE, "install: snapshot %s/%" PRIu64
			                  " does not fit this worker's sandbox disk quota "
			                  "(%" PRIu64 " MiB): %s", ksbx, kgen,
			                  m->layer_bytes >> 20, why);
		return tt_err_set(err, err->code, "install: snapshot %s/%" PRIu64 ": %s",
		                  ksbx, kgen, why);
	}
	return layer_move_up(ldfd, "restore", err);
}

/* vm_restore_into: a microVM's snapshot (its disk dir: the layer and the
 * memory state) unpacked into <dir>/vm/disk, owned by rec's uid. */
static int vm_restore_into(struct manager *m, const struct rec_exec *rec, const char *dir,
                           const char *ksbx, uint64_t kgen, struct snapshot_stats *st,
                           struct tt_err *err)
{
	struct snapshot_unpack_opts o = { 0 };
	struct snapstore *s = NULL;
	_cleanup_close_ int dfd = -1;
	char p[PATH_MAX];
	int rc;

	snprintf(p, sizeof(p), "%.4000s/" MICROVM_DIR, dir);
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", p);
	snprintf(p, sizeof(p), "%.4000s/" MICROVM_DISK_DIR, dir);
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", p);
	dfd = open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return tt_err_sys(err, TT_ERR_IO, "open %s", p);
	if (snapstore_dir_open(m->snap_dir, &s, err) < 0)
		return -1;
	o.chown = true;
	o.id_base = uid_base_of(m, rec);
	o.gid_base = uid_base_of(m, rec);
	rc = snapstore_get_tree(s, ksbx, kgen, dfd, "restore", &o, st, err);
	snapstore_close(s);
	return rc < 0 ? -1 : layer_move_up(dfd, "restore", err);
}

/* layer_restore: see manager_int.h. */
int layer_restore(struct manager *m, const struct rec_exec *rec,
                  const char *key, struct tt_err *err)
{
	char ksbx[SNAPSTORE_SBX_MAX + 1], dir[PATH_MAX];
	struct snapshot_stats st = { 0 };
	uint64_t kgen;
	int64_t t0 = mgr_now_ms();

	if (snapstore_key_parse(key, ksbx, &kgen, err) < 0)
		return -1;
	if (strcmp(ksbx, rec->id.sbx) != 0 || kgen >= rec->id.gen)
		return tt_err_set(err, TT_ERR_INVALID, "install: snapshot %s is not an "
		                  "older generation of %s", key, rec->id.sbx);
	if (!m->snap_dir[0])
		return tt_err_set(err, TT_ERR_INVALID, "install: this worker has no "
		                  "snapshot store (--snapshots)");
	if (sandbox_dir(m, rec->id.sbx, dir, sizeof(dir)) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "state path too long");
	/* Nothing runs there (the caller retired and stopped it). */
	if (sandbox_tree_remove(dir) < 0)
		return tt_err_sys(err, TT_ERR_IO, "removing the old layer of %s", rec->id.sbx);
	if (strcmp(rec->id.sst, "microvm") != 0)
		spare_claim(m, dir, NULL); /* its filesystem, not its sandbox */
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_IO, "mkdir %s", dir);
	if (strcmp(rec->id.sst, "microvm") == 0 ? vm_restore_into(m, rec, dir, ksbx, kgen, &st, err) < 0
	    : layer_restore_into(m, rec, dir, ksbx, kgen, &st, err) < 0) {
		layer_unmount_of(m, rec->id.sbx);
		return -1;
	}
	log_info("restored %s from snapshot %s: %" PRIu64 " entries, %" PRIu64
	         " bytes in %" PRId64 " ms", rec->id.sbx, key, st.entries,
	         st.data_bytes, mgr_now_ms() - t0);
	return 0;
}

/* layer_discard: see manager_int.h. */
void layer_discard(struct manager *m, const char *sbx)
{
	char dir[PATH_MAX];

	if (sandbox_dir(m, sbx, dir, sizeof(dir)) < 0)
		return;
	if (sandbox_tree_remove(dir) < 0)
		log_warn("removing the directory of paused %s: %s", sbx, strerror(errno));
}

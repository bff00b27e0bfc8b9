/* cgroup limits for ns sandboxes. Prefers the v1 memory/pids/cpu
 * controllers (what our workers mount); falls back to a v2 hierarchy that
 * has the memory and pids controllers. Every limit is verified written:
 * a sandbox without its limits is refused (fail closed). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cleanup.h"
#include "substrate/ns/ns_int.h"

#define CG_ROOT "/sys/fs/cgroup"
#define CG_PERIOD_US 100000u

/* cg_write: writes one value to a cgroup control file (whole, one write,
 * as the kernel parses each write separately). */
static int cg_write(const char *dir, const char *file, const char *val,
                    struct tt_err *err)
{
	char path[PATH_MAX];
	if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path)
		return tt_err_set(err, TT_ERR_INVALID, "cgroup path too long");
	_cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return tt_err_sys(err, TT_ERR_SYS, "cgroup: open %s", path);
	size_t n = strlen(val);
	ssize_t w = write(fd, val, n);
	if (w < 0 || (size_t)w != n)
		return tt_err_sys(err, TT_ERR_SYS, "cgroup: write '%s' to %s", val, path);
	return 0;
}

/* cg_has: true when a path exists. */
static int cg_has(const char *path)
{
	return access(path, F_OK) == 0;
}

/* cg_has_file: true when dir/file exists. */
static int cg_has_file(const char *dir, const char *file)
{
	char path[PATH_MAX];
	if (snprintf(path, sizeof path, "%s/%s", dir, file) >= (int)sizeof path)
		return 0;
	return cg_has(path);
}

/* cg_v2_root: finds a v2 hierarchy offering memory and pids, or NULL. */
static const char *cg_v2_root(void)
{
	static const char *const roots[] = { CG_ROOT, CG_ROOT "/unified" };
	for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
		char path[PATH_MAX], buf[512];
		snprintf(path, sizeof path, "%s/cgroup.controllers", roots[i]);
		_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, buf, sizeof buf - 1);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		/* Whole-word match: "memory" and "pids" among the controllers. */
		int mem = 0, pids = 0;
		for (char *save = NULL, *w = strtok_r(buf, " \n", &save); w;
		     w = strtok_r(NULL, " \n", &save)) {
			mem |= strcmp(w, "memory") == 0;
			pids |= strcmp(w, "pids") == 0;
		}
		if (mem && pids)
			return roots[i];
	}
	return NULL;
}

/* cg_mkdir: creates a cgroup dir; a leftover empty one from a crashed
 * manager is replaced, a busy one is a conflict. */
static int cg_mkdir(const char *path, struct tt_err *err)
{
	if (mkdir(path, 0755) == 0)
		return 0;
	if (errno != EEXIST)
		return tt_err_sys(err, TT_ERR_SYS, "cgroup: mkdir %s", path);
	if (rmdir(path) < 0)
		return tt_err_sys(err, TT_ERR_CONFLICT,
		                  "cgroup %s exists and cannot be replaced", path);
	if (mkdir(path, 0755) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "cgroup: mkdir %s", path);
	return 0;
}

/* cg_parent: makes <root>/tether (shared parent of all sandboxes). */
static int cg_parent(const char *root, struct tt_err *err)
{
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/tether", root);
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		return tt_err_sys(err, TT_ERR_SYS, "cgroup: mkdir %s", path);
	return 0;
}

/* cg_path: formats <root>/tether/<name> into out. */
static int cg_path(char out[PATH_MAX], const char *root, const char *name,
                   struct tt_err *err)
{
	if (snprintf(out, PATH_MAX, "%s/tether/%s", root, name) >= PATH_MAX)
		return tt_err_set(err, TT_ERR_INVALID, "cgroup name too long");
	return 0;
}

/* cg_create_v1: one dir per controller, limits written in each. */
static int cg_create_v1(const char *name, uint64_t memory_max, uint32_t pids_max,
                        uint32_t cpu_millis, struct ns_sandbox *sb,
                        struct tt_err *err)
{
	char val[64];
	if (cg_parent(CG_ROOT "/memory", err) < 0 || cg_parent(CG_ROOT "/pids", err) < 0)
		return -1;
	if (cg_path(sb->cgroup_memory, CG_ROOT "/memory", name, err) < 0 ||
	    cg_path(sb->cgroup_pids, CG_ROOT "/pids", name, err) < 0)
		return -1;
	char mem[PATH_MAX];
	memcpy(mem, sb->cgroup_memory, PATH_MAX);
	sb->cgroup_memory[0] = '\0'; /* recorded only once it exists */
	if (cg_mkdir(mem, err) < 0)
		return -1;
	memcpy(sb->cgroup_memory, mem, PATH_MAX);
	snprintf(val, sizeof val, "%" PRIu64, memory_max);
	if (cg_write(mem, "memory.limit_in_bytes", val, err) < 0)
		return -1;
	/* Without swap accounting the memsw file is absent: nothing to cap. */
	if (cg_has_file(mem, "memory.memsw.limit_in_bytes") && cg_write(mem, "memory.memsw.limit_in_bytes", val, err) < 0)
		return -1;

	char pids[PATH_MAX];
	memcpy(pids, sb->cgroup_pids, PATH_MAX);
	sb->cgroup_pids[0] = '\0';
	if (cg_mkdir(pids, err) < 0)
		return -1;
	memcpy(sb->cgroup_pids, pids, PATH_MAX);
	snprintf(val, sizeof val, "%" PRIu32, pids_max);
	if (cg_write(pids, "pids.max", val, err) < 0)
		return -1;

	if (cpu_millis == 0)
		return 0;
	if (!cg_has(CG_ROOT "/cpu/cgroup.procs"))
		return tt_err_set(err, TT_ERR_SYS, "cgroup: cpu limit asked but no cpu controller");
	if (cg_parent(CG_ROOT "/cpu", err) < 0)
		return -1;
	char cpu[PATH_MAX];
	if (cg_path(cpu, CG_ROOT "/cpu", name, err) < 0 || cg_mkdir(cpu, err) < 0)
		return -1;
	memcpy(sb->cgroup_cpu, cpu, PATH_MAX);
	snprintf(val, sizeof val, "%u", CG_PERIOD_US);
	if (cg_write(cpu, "cpu.cfs_period_us", val, err) < 0)
		return -1;
	snprintf(val, sizeof val, "%" PRIu64, (uint64_t)cpu_millis * CG_PERIOD_US / 1000);
	return cg_write(cpu, "cpu.cfs_quota_us", val, err);
}

/* cg_create_v2: one dir with all controllers enabled from the root down. */
static int cg_create_v2(const char *root, const char *name, uint64_t memory_max,
                        uint32_t pids_max, uint32_t cpu_millis,
                        struct ns_sandbox *sb, struct tt_err *err)
{
	char val[64], parent[PATH_MAX];
	const char *ctl = cpu_millis ? "+memory +pids +cpu" : "+memory +pids";
	if (cg_write(root, "cgroup.subtree_control", ctl, err) < 0 || cg_parent(root, err) < 0)
		return -1;
	snprintf(parent, sizeof parent, "%s/tether", root);
	if (cg_write(parent, "cgroup.subtree_control", ctl, err) < 0)
		return -1;
	char dir[PATH_MAX];
	if (cg_path(dir, root, name, err) < 0 || cg_mkdir(dir, err) < 0)
		return -1;
	memcpy(sb->cgroup_memory, dir, PATH_MAX);
	memcpy(sb->cgroup_pids, dir, PATH_MAX);
	snprintf(val, sizeof val, "%" PRIu64, memory_max);
	if (cg_write(dir, "memory.max", val, err) < 0)
		return -1;
	if (cg_has_file(dir, "memory.swap.max") && cg_write(dir, "memory.swap.max", "0", err) < 0)
		return -1;
	snprintf(val, sizeof val, "%" PRIu32, pids_max);
	if (cg_write(dir, "pids.max", val, err) < 0)
		return -1;
	if (cpu_millis == 0)
		return 0;
	snprintf(val, sizeof val, "%" PRIu64 " %u",
	         (uint64_t)cpu_millis * CG_PERIOD_US / 1000, CG_PERIOD_US);
	return cg_write(dir, "cpu.max", val, err);
}

/* ns_cgroup_set_cpu: see ns.h. */
int ns_cgroup_set_cpu(const struct ns_sandbox *sb, uint32_t cpu_millis, struct tt_err *err)
{
	char val[64];
	uint64_t quota = (uint64_t)cpu_millis * CG_PERIOD_US / 1000;

	if (cpu_millis == 0)
		return tt_err_set(err, TT_ERR_INVALID, "cgroup: a cpu cap of 0 lifts nothing");
	/* Privileged: the cpu cap of our own sandbox's cgroup. */
	if (sb->cgroup_cpu[0] != '\0') { /* v1 */
		snprintf(val, sizeof val, "%" PRIu64, quota);
		return cg_write(sb->cgroup_cpu, "cpu.cfs_quota_us", val, err);
	}
	if (sb->cgroup_memory[0] != '\0' && strcmp(sb->cgroup_memory, sb->cgroup_pids) == 0 &&
	    cg_has_file(sb->cgroup_memory, "cpu.max")) { /* v2, cpu enabled */
		snprintf(val, sizeof val, "%" PRIu64 " %u", quota, CG_PERIOD_US);
		return cg_write(sb->cgroup_memory, "cpu.max", val, err);
	}
	return tt_err_set(err, TT_ERR_INVALID, "cgroup: the sandbox has no cpu cgroup to cap");
}

int ns_cgroup_create(const char *name, uint64_t memory_max, uint32_t pids_max,
                     uint32_t cpu_millis, struct ns_sandbox *sb,
                     struct tt_err *err)
{
	sb->cgroup_memory[0] = sb->cgroup_pids[0] = sb->cgroup_cpu[0] = '\0';
	int rc;
	/* Privileged: creating cgroups and writing limits needs host root. */
	if (cg_has(CG_ROOT "/memory/cgroup.procs") && cg_has(CG_ROOT "/pids/cgroup.procs")) {
		rc = cg_create_v1(name, memory_max, pids_max, cpu_millis, sb, err);
	} else {
		const char *root = cg_v2_root();
		if (!root)
			return tt_err_set(err, TT_ERR_SYS,
			                  "cgroup: no memory+pids controllers (v1 or v2) to apply limits");
		rc = cg_create_v2(root, name, memory_max, pids_max, cpu_millis, sb, err);
	}
	if (rc < 0) {
		struct tt_err ignored;
		ns_cgroup_remove(sb, &ignored);
		return -1;
	}
	return 0;
}

int ns_cgroup_attach(const struct ns_sandbox *sb, pid_t pid, struct tt_err *err)
{
	char val[32];
	snprintf(val, sizeof val, "%d", (int)pid);
	const char *dirs[] = { sb->cgroup_memory, sb->cgroup_pids, sb->cgroup_cpu };
	for (size_t i = 0; i < 3; i++) {
		if (i == 1 && strcmp(dirs[1], dirs[0]) == 0)
			continue; /* v2: one dir holds every controller */
		if (dirs[i][0] && cg_write(dirs[i], "cgroup.procs", val, err) < 0)
			return -1;
	}
	return 0;
}

/* ns_cgroup_self_fds: the v1 "tasks" files a new init moves itself with. */
int ns_cgroup_self_fds(const struct ns_sandbox *sb, int fds[3], struct tt_err *err)
{
	const char *dirs[] = { sb->cgroup_memory, sb->cgroup_pids, sb->cgroup_cpu };
	int n = 0;

	fds[0] = fds[1] = fds[2] = -1;
	if (strcmp(sb->cgroup_memory, sb->cgroup_pids) == 0)
		return 0; /* v2: one dir; the parent attaches by pid */
	for (size_t i = 0; i < 3; i++) {
		char path[PATH_MAX];

		if (!dirs[i][0])
			continue;
		if (snprintf(path, sizeof path, "%s/tasks", dirs[i]) >= (int)sizeof path) {
			tt_err_set(err, TT_ERR_INVALID, "cgroup path too long");
			goto fail;
		}
		/* Privileged: cgroup control file of the sandbox's own cgroup. */
		fds[n] = open(path, O_WRONLY | O_CLOEXEC);
		if (fds[n] < 0) {
			tt_err_sys(err, TT_ERR_SYS, "cgroup: open %s", path);
			goto fail;
		}
		n++;
	}
	return n;
fail:
	for (int i = 0; i < n; i++) {
		close(fds[i]);
		fds[i] = -1;
	}
	return -1;
}

/* cg_rmdir: removes one cgroup, retrying while its last tasks finish
 * exiting (they leave the cgroup slightly after being reaped). */
static int cg_rmdir(char path[PATH_MAX], struct tt_err *err)
{
	if (!path[0])
		return 0;
	for (int i = 0; i < 200; i++) {
		if (rmdir(path) == 0 || errno == ENOENT) {
			path[0] = '\0';
			return 0;
		}
		if (errno != EBUSY)
			break;
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	return tt_err_sys(err, TT_ERR_SYS, "cgroup: rmdir %s", path);
}

int ns_cgroup_remove(struct ns_sandbox *sb, struct tt_err *err)
{
	int rc = 0;
	if (strcmp(sb->cgroup_pids, sb->cgroup_memory) == 0)
		sb->cgroup_pids[0] = '\0'; /* v2: same dir, remove once */
	rc |= cg_rmdir(sb->cgroup_memory, err);
	rc |= cg_rmdir(sb->cgroup_pids, err);
	rc |= cg_rmdir(sb->cgroup_cpu, err);
	return rc ? -1 : 0;
}

/* cg_rename_one: dir -> its sibling named name; dir updated. "" stays. */
static int cg_rename_one(char dir[PATH_MAX], const char *name, struct tt_err *err)
{
	char to[PATH_MAX];
	const char *slash = strrchr(dir, '/');

	if (dir[0] == '\0')
		return 0;
	if (slash == NULL ||
	    snprintf(to, sizeof(to), "%.*s/%s", (int)(slash - dir), dir, name) >= (int)sizeof(to))
		return tt_err_set(err, TT_ERR_INVALID, "cgroup path too long for %s", name);
	/* Privileged: renaming our own sandbox's cgroup (v1 allows it within a
	 * hierarchy; its tasks and limits stay). */
	if (rename(dir, to) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "rename cgroup %s to %s", dir, name);
	memcpy(dir, to, strlen(to) + 1);
	return 0;
}

/* ns_cgroup_rename: every cgroup of sb takes the name name. */
int ns_cgroup_rename(struct ns_sandbox *sb, const char *name, struct tt_err *err)
{
	bool same = strcmp(sb->cgroup_pids, sb->cgroup_memory) == 0; /* v2 */

	if (cg_rename_one(sb->cgroup_memory, name, err) < 0)
		return -1;
	if (same)
		memcpy(sb->cgroup_pids, sb->cgroup_memory, strlen(sb->cgroup_memory) + 1);
	else if (cg_rename_one(sb->cgroup_pids, name, err) < 0)
		return -1;
	return cg_rename_one(sb->cgroup_cpu, name, err);
}

/* cg_holds: whether pid's /proc/<pid>/cgroup places it in the cgroup
 * rel ("/tether/<name>") of hierarchy ctl ("pids" for v1, "" for v2). */
static bool cg_holds(pid_t pid, const char *ctl, const char *rel)
{
	char path[64], want[PATH_MAX + 16], line[PATH_MAX + 64];
	_cleanup_fclose_ FILE *f = NULL;
	bool yes = false;

	snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
	/* "<id>:pids:/tether/<name>" (v1) or "0::/tether/<name>" (v2): the
	 * line from its first ':' on */
	snprintf(want, sizeof want, ":%s:%s\n", ctl, rel);
	f = fopen(path, "re");
	while (f != NULL && !yes && fgets(line, sizeof line, f) != NULL) {
		const char *colon = strchr(line, ':');

		yes = colon != NULL && strcmp(colon, want) == 0 && (ctl[0] || line[0] == '0');
	}
	return yes;
}

/* ns_cgroup_kill: see ns.h. */
int ns_cgroup_kill(const struct ns_sandbox *sb, struct tt_err *err)
{
	const char *dir = sb->cgroup_pids[0] ? sb->cgroup_pids : sb->cgroup_memory;
	const char *v2 = cg_v2_root(), *ctl, *rel;
	char procs[PATH_MAX + 16];

	if (!dir[0])
		return 0;
	if (strncmp(dir, CG_ROOT "/pids/", strlen(CG_ROOT "/pids/")) == 0) {
		ctl = "pids";
		rel = dir + strlen(CG_ROOT "/pids");
	} else if (v2 != NULL && strncmp(dir, v2, strlen(v2)) == 0 && dir[strlen(v2)] == '/') {
		ctl = "";
		rel = dir + strlen(v2);
	} else {
		return tt_err_set(err, TT_ERR_INVALID, "cgroup %s: unknown hierarchy", dir);
	}
	snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
	/* Rounds until it is empty: a task may fork while we read (bounded
	 * by its pids limit), and SIGKILL'd ones leave it a little later. */
	for (int round = 0; round < 200; round++) {
		_cleanup_fclose_ FILE *f = fopen(procs, "re");
		int pid, seen = 0;

		if (f == NULL)
			return errno == ENOENT ? 0 : tt_err_sys(err, TT_ERR_SYS, "cgroup: %s", procs);
		while (fscanf(f, "%d", &pid) == 1) {
			int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);

			seen++;
			if (pidfd < 0)
				continue; /* gone already */
			/* Privileged: SIGKILL to a process of this sandbox only.
			 * The pidfd holds the process the pid named when it was
			 * opened; still in the cgroup then, it is not a recycled
			 * pid of someone else's. */
			if (cg_holds(pid, ctl, rel))
				(void)syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
			close(pidfd);
		}
		if (seen == 0)
			return 0;
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	}
	return tt_err_set(err, TT_ERR_SYS, "cgroup %s: tasks still there after 2 s", dir);
}

/* ns_cgroup_sweep: removes the empty cgroups named prefix* under every
 * tether parent (leftovers of a manager that died with a spare); a busy
 * one (another manager's live spare) stays. */
void ns_cgroup_sweep(const char *prefix)
{
	static const char *const roots[] = { CG_ROOT "/memory/tether", CG_ROOT "/pids/tether",
	                                     CG_ROOT "/cpu/tether", CG_ROOT "/tether",
	                                     CG_ROOT "/unified/tether" };
	size_t plen = strlen(prefix);

	for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
		DIR *d = opendir(roots[i]);
		struct dirent *de;

		if (d == NULL)
			continue;
		while ((de = readdir(d)) != NULL) {
			char path[PATH_MAX];

			if (strncmp(de->d_name, prefix, plen) != 0 ||
			    snprintf(path, sizeof path, "%s/%s", roots[i], de->d_name) >=
			    (int)sizeof path)
				continue;
			/* Privileged: an empty cgroup of ours. */
			(void)rmdir(path);
		}
		closedir(d);
	}
}

/* ns_cgroup_find: see ns.h. */
void ns_cgroup_find(const char *sbx_id, uint64_t gen, struct ns_sandbox *sb)
{
	char name[128];
	const char *v2 = NULL;

	snprintf(name, sizeof name, "%s-g%" PRIu64, sbx_id, gen);
	sb->cgroup_memory[0] = sb->cgroup_pids[0] = sb->cgroup_cpu[0] = '\0';
	if (cg_has(CG_ROOT "/memory/cgroup.procs") && cg_has(CG_ROOT "/pids/cgroup.procs")) {
		if (cg_path(sb->cgroup_memory, CG_ROOT "/memory", name, NULL) < 0 ||
		    !cg_has(sb->cgroup_memory))
			sb->cgroup_memory[0] = '\0';
		if (cg_path(sb->cgroup_pids, CG_ROOT "/pids", name, NULL) < 0 ||
		    !cg_has(sb->cgroup_pids))
			sb->cgroup_pids[0] = '\0';
		if (cg_path(sb->cgroup_cpu, CG_ROOT "/cpu", name, NULL) < 0 ||
		    !cg_has(sb->cgroup_cpu))
			sb->cgroup_cpu[0] = '\0';
	} else if ((v2 = cg_v2_root()) != NULL) {
		if (cg_path(sb->cgroup_memory, v2, name, NULL) < 0 || !cg_has(sb->cgroup_memory))
			sb->cgroup_memory[0] = '\0';
		memcpy(sb->cgroup_pids, sb->cgroup_memory, PATH_MAX);
	}
}

/* sbx-manager: executions. Starting one (the sandbox, its bridge, taken
 * from the spares when they are ready), watching its processes, stopping
 * it, and the runtime state each has while it runs here. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"
#include "manager/manager_int.h"
#include "metrics.h"
#include "relay.h"
#include "uvutil.h"

#define MGR_UID_COUNT TT_UID_PER_SANDBOX
#define MGR_BRIDGE_READY_MS 5000
#define MGR_POOL_IDLE_MAX 4
#define MGR_POOL_IDLE_MS 30000

/* exec_find: see manager_int.h. */
struct mgr_exec *exec_find(struct manager *m, const char *sbx)
{
	for (struct mgr_exec *ex = m->execs; ex; ex = ex->next)
		if (strcmp(ex->sbx, sbx) == 0)
			return ex;
	return NULL;
}

/* sandbox_dir: see manager_int.h. */
int sandbox_dir(const struct manager *m, const char *sbx, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s/sandboxes/%s", m->state_dir, sbx);

	return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* uid_base_of: see manager_int.h. */
uid_t uid_base_of(const struct manager *m, const struct rec_exec *rec)
{
	return m->uid_base + MGR_UID_COUNT * rec->slot;
}

/* exec_poll_close_cb: frees the runtime once both watchers closed. */
static void exec_poll_close_cb(uv_handle_t *h)
{
	struct mgr_exec *ex = h->data;

	if (--ex->polls_open == 0)
		free(ex);
}

/* exec_free: see manager_int.h. */
void exec_free(struct mgr_exec *ex)
{
	ex->polls_open = (int)ex->init_poll_on + (int)ex->bridge_poll_on;
	if (ex->polls_open == 0) {
		free(ex);
		return;
	}
	if (ex->init_poll_on)
		uv_close((uv_handle_t *)&ex->init_poll, exec_poll_close_cb);
	if (ex->bridge_poll_on)
		uv_close((uv_handle_t *)&ex->bridge_poll, exec_poll_close_cb);
	ex->init_poll_on = ex->bridge_poll_on = false;
}

/* cancel_leases: see manager_int.h. */
void cancel_leases(struct manager *m, const char *sbx)
{
	struct mgr_conn *c = m->ops, *next;

	for (; c; c = next) {
		next = c->next;
		if (strcmp(c->sbx, sbx) == 0 && c->relay != NULL) {
			metrics_inc("tether_streams_cancelled_total", "reason=\"epoch\"");
			relay_abort(c->relay, WIRE_E_REFRESH_ROUTE, "execution retired or replaced");
		}
	}
}

/* cancel_input_streams: see manager_int.h. */
void cancel_input_streams(struct manager *m, const char *sbx)
{
	struct mgr_conn *c = m->ops, *next;

	for (; c; c = next) {
		next = c->next;
		if (strcmp(c->sbx, sbx) != 0 || c->relay == NULL ||
		    !json_is_true(json_object_get(c->req, "stdin")))
			continue;
		metrics_inc("tether_streams_cancelled_total", "reason=\"epoch\"");
		relay_abort(c->relay, WIRE_E_REFRESH_ROUTE, "execution retired for a pause");
	}
}

/* bridge_kill: SIGTERM, a short grace, then SIGKILL; reaps our child. */
static void bridge_kill(struct mgr_exec *ex)
{
	int64_t deadline = mgr_now_ms() + 1000;

	if (ex->bridge_pidfd < 0)
		return;
	pidfd_signal(ex->bridge_pidfd, SIGTERM);
	while (ex->own_children && mgr_now_ms() < deadline) {
		if (waitpid(ex->bridge_pid, NULL, WNOHANG) != 0)
			return;
		usleep(5000);
	}
	pidfd_signal(ex->bridge_pidfd, SIGKILL);
	if (ex->own_children)
		waitpid(ex->bridge_pid, NULL, 0);
}

/* exec_stop: see manager_int.h. */
void exec_stop(struct manager *m, struct mgr_exec *ex)
{
	struct mgr_exec **pp;
	struct tt_err err = { 0 };

	if (ex->stopping)
		return;
	ex->stopping = true;
	cancel_leases(m, ex->sbx);
	uvutil_pool_free(ex->pool);
	ex->pool = NULL;
	for (pp = &m->execs; *pp; pp = &(*pp)->next)
		if (*pp == ex) {
			*pp = ex->next;
			break;
		}
	if (ex->bridge_poll_on)
		uv_poll_stop(&ex->bridge_poll);
	if (ex->init_poll_on)
		uv_poll_stop(&ex->init_poll);
	bridge_kill(ex);
	if (substrate_stop(&ex->sub, &err) < 0)
		log_warn("stopping sandbox %s: %s", ex->sbx, err.msg);
	/* The sandbox is dead (its mount namespace with it): release its
	 * layer's mount and loop device; its files stay in the image,
	 * unless the caller deletes the layer anyway. */
	if (ex->discard_layer) {
		char dir[PATH_MAX];

		if (sandbox_dir(m, ex->sbx, dir, sizeof(dir)) == 0 &&
		    ns_layer_remove(dir, &err) < 0)
			log_warn("removing the layer of %s: %s", ex->sbx, err.msg);
	} else {
		layer_unmount_of(m, ex->sbx);
	}
	if (ex->bridge_pidfd >= 0)
		close(ex->bridge_pidfd);
	ex->bridge_pidfd = -1;
	exec_free(ex);
}

/* exec_mark_state: see manager_int.h. */
void exec_mark_state(struct manager *m, const char *sbx, enum rec_state st)
{
	const struct rec_exec *cur = records_get(m->db, sbx);
	struct rec_exec e;
	struct tt_err err = { 0 };

	if (cur == NULL || cur->state == st)
		return;
	e = *cur;
	e.state = st;
	if (records_put(m->db, &e, 0, &err) < 0)
		log_error("persisting state of %s: %s", sbx, err.msg);
}

/* exec_died_cb: the sandbox init or the bridge exited on its own: the
 * execution is lost (admission answers RefreshRoute from now on). */
static void exec_died_cb(uv_poll_t *p, int status, int events)
{
	struct mgr_exec *ex = p->data;
	struct manager *m = ex->m;
	bool init_died = p == &ex->init_poll;
	const struct rec_exec *r;
	char sbx[TT_SBX_ID_LEN + 1];

	(void)status;
	(void)events;
	log_warn("execution %s lost: its %s exited", ex->sbx,
	         init_died ? "sandbox init" : "bridge");
	snprintf(sbx, sizeof(sbx), "%s", ex->sbx);
	exec_mark_state(m, sbx, REC_LOST);
	exec_stop(m, ex); /* ex is gone from here */
	/* its layer stays: the cp re-activates it in place (SPEC §7) */
	r = records_get(m->db, sbx);
	if (r != NULL && !r->retired && r->state == REC_LOST)
		lost_note(m, r, init_died ? "its guest agent (the sandbox init) "
		          "exited" : "its host bridge exited", true);
}

/* exec_watch: see manager_int.h. */
int exec_watch(struct manager *m, struct mgr_exec *ex, struct tt_err *err)
{
	ex->init_poll.data = ex;
	ex->bridge_poll.data = ex;
	struct substrate_owner own;

	substrate_owner(&ex->sub, &own);
	if (uv_poll_init(m->loop, &ex->init_poll, own.pidfd) < 0)
		return tt_err_set(err, TT_ERR_SYS, "cannot watch the sandbox init");
	ex->init_poll_on = true; /* closed by exec_free, even on failure */
	if (uv_poll_init(m->loop, &ex->bridge_poll, ex->bridge_pidfd) < 0)
		return tt_err_set(err, TT_ERR_SYS, "cannot watch the bridge");
	ex->bridge_poll_on = true;
	uv_poll_start(&ex->init_poll, UV_READABLE, exec_died_cb);
	uv_poll_start(&ex->bridge_poll, UV_READABLE, exec_died_cb);
	ex->next = m->execs;
	m->execs = ex;
	return 0;
}

/* bridge_pin: records the identity of the bridge that just said ready (our
 * child: its pid cannot be reused before we reap it) and checks that it
 * runs the binary we exec'd. */
static int bridge_pin(struct mgr_exec *ex, const char *bin, struct tt_err *err)
{
	struct stat st;

	if (procid_pin(ex->bridge_pid, &ex->bridge_id, NULL, err) < 0)
		return -1;
	if (stat(bin, &st) < 0)
		return tt_err_sys(err, TT_ERR_SYS, "stat %s", bin);
	if (st.st_dev != ex->bridge_id.exe_dev || st.st_ino != ex->bridge_id.exe_ino)
		return tt_err_set(err, TT_ERR_VERIFY, "bridge pid %d does not run %s",
		                  (int)ex->bridge_pid, bin);
	ex->bridge_start = ex->bridge_id.start_time;
	return 0;
}

/* bridge_take: a bridge for one execution: the spare started ahead (its
 * spawn and library loading off the create path) or, without one, a new
 * one; assigned its execution (the activation secret included), not yet
 * waited for. ex gets its pid and pidfd; *bp keeps the readiness pipe for
 * bridge_finish. Nothing is left running on failure. */
static int bridge_take(struct manager *m, struct mgr_exec *ex, const char *dir,
                       const struct rec_exec *rec, const uint8_t secret[NS_SECRET_LEN],
                       struct bridge_proc *bp, struct tt_err *err)
{
	struct substrate_owner own;
	struct bridge_assignment a;
	char sock[PATH_MAX];
	struct tt_err e2 = { 0 };

	/* The bridge pins the process that owns the guest transport, as the
	 * substrate reports it (SPEC §9), and checks its listener. */
	substrate_owner(&ex->sub, &own);
	a = (struct bridge_assignment){
		.sbx = rec->id.sbx, .gen = rec->id.gen, .att = rec->id.att,
		.guest_socket = own.socket, .init_pid = own.pid,
		.init_start = own.start_time, .secret = secret, .transport = own.transport,
	};
	/* The bridge binds it at any length (unixaddr.h). */
	if ((size_t)snprintf(sock, sizeof(sock), "%s/bridge.sock", dir) >= sizeof(sock))
		return tt_err_set(err, TT_ERR_INVALID, "bridge socket path too long");
	unlink(sock);
	a.listen_path = sock;
	*bp = m->spare_bridge;
	m->spare_bridge = (struct bridge_proc){ .pid = 0, .pidfd = -1, .assign_fd = -1,
	                                        .ready_fd = -1 };
	if (bp->pid > 0) {
		spare_kick(m);
		/* Not one that died waiting (killed from outside), nor one
		 * running a tether-bridge replaced since (an upgrade):
		 * bridge_pin would refuse it. */
		if (!bridgectl_alive(bp))
			log_warn("spare bridge pid %d exited while waiting; starting a new one",
			         (int)bp->pid);
		else if (!bridgectl_runs(bp, m->bridge_bin))
			log_info("spare bridge pid %d runs a replaced %s: starting a new one",
			         (int)bp->pid, m->bridge_bin);
		else if (bridgectl_assign(bp, &a, &e2) == 0)
			goto assigned;
		else
			log_warn("spare bridge: %s; starting a new one", e2.msg);
		bridgectl_discard(bp);
	}
	if (bridgectl_spawn(m->bridge_bin, bp, err) < 0)
		return -1;
	if (bridgectl_assign(bp, &a, err) < 0) {
		bridgectl_discard(bp);
		return -1;
	}
assigned:
	ex->bridge_pid = bp->pid;
	ex->bridge_pidfd = bp->pidfd;
	bp->pidfd = -1; /* ex's now */
	return 0;
}

/* bridge_abort: kills a bridge that did not (or will not) finish starting. */
static void bridge_abort(struct mgr_exec *ex)
{
	bridge_kill(ex);
	if (ex->bridge_pidfd >= 0)
		close(ex->bridge_pidfd);
	ex->bridge_pidfd = -1;
}

/* bridge_finish: the assigned bridge's "ready" (it listens), then its
 * identity pinned (SPEC §5). Consumes bp's readiness pipe; on failure the
 * bridge is gone. */
static int bridge_finish(struct manager *m, struct mgr_exec *ex, struct bridge_proc *bp,
                         struct tt_err *err)
{
	bp->pidfd = ex->bridge_pidfd; /* for the wait only: ex keeps it */
	if (bridgectl_wait_ready(bp, MGR_BRIDGE_READY_MS, err) < 0 ||
	    bridge_pin(ex, m->bridge_bin, err) < 0) {
		bridge_abort(ex);
		return -1;
	}
	return 0;
}

/* exec_cfg: see manager_int.h. */
void exec_cfg(struct manager *m, struct ns_config *cfg, const char *dir,
              uint32_t slot)
{
	cfg->sandbox_dir = dir;
	cfg->guest_bin = m->guest_bin;
	/* Each slot gets its own host uid range, never overlapping another
	 * sandbox's (and never host root). */
	cfg->uid_base = m->uid_base + MGR_UID_COUNT * slot;
	cfg->uid_count = MGR_UID_COUNT;
	cfg->cpu_millis = m->cpu_millis;
	/* The layer's cap: the spare's filesystem, or one made now (copied
	 * from the template once there is one). */
	cfg->layer_bytes = m->layer_bytes;
	cfg->layer_inodes = m->layer_inodes;
	cfg->layer_template = m->tmpl_usable ? m->layer_tmpl : NULL;
	if (m->spare_netns >= 0) {
		cfg->use_netns = true;
		cfg->netns_fd = m->spare_netns;
	}
	if (m->clean_mntns >= 0) {
		cfg->use_mntns = true;
		cfg->mntns_fd = m->clean_mntns;
	}
}

/* exec_cpu: see manager_int.h. */
uint32_t exec_cpu(const struct manager *m, const struct rec_exec *rec)
{
	return rec->cpu_millis != 0 ? rec->cpu_millis : m->cpu_millis;
}

/* exec_runtime_init: see manager_int.h. */
void exec_runtime_init(struct manager *m, struct mgr_exec *ex)
{
	ex->m = m;
	ex->serial = ++m->exec_serial;
	ex->pool = uvutil_pool_new(m->loop, MGR_POOL_IDLE_MAX, MGR_POOL_IDLE_MS);
}

/* exec_start_vm: a microVM execution (src/substrate/microvm/): QEMU
 * launched (or resumed from the snapshot restored into its disk dir),
 * then its bridge, pinned to QEMU as the owner of the guest transport.
 * The guest boots meanwhile: the bridge's first stream waits for it. */
static struct mgr_exec *exec_start_vm(struct manager *m, const struct rec_exec *rec,
                                      struct tt_err *err)
{
	struct mgr_exec *ex = calloc(1, sizeof(*ex));
	struct microvm_config cfg = { 0 };
	struct bridge_proc bp;
	struct tt_err e2 = { 0 };
	uint8_t secret[NS_SECRET_LEN];
	char dir[PATH_MAX];
	int64_t t;

	if (ex == NULL) {
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	if (vm_ready(m, err) < 0 || sandbox_dir(m, rec->id.sbx, dir, sizeof(dir)) < 0 ||
	    (mkdir(dir, 0700) < 0 && errno != EEXIST)) {
		if (err->msg[0] == '\0')
			tt_err_sys(err, TT_ERR_IO, "sandbox dir of %s", rec->id.sbx);
		free(ex);
		return NULL;
	}
	exec_runtime_init(m, ex);
	ex->own_children = true;
	ex->bridge_pidfd = -1;
	snprintf(ex->sbx, sizeof(ex->sbx), "%s", rec->id.sbx);
	substrate_exec_init(&ex->sub, SUBSTRATE_MICROVM);
	randombytes_buf(secret, sizeof(secret));
	hello_adopt_key(secret, rec->id.sbx, rec->id.gen, rec->id.att, ex->adopt_key);
	cfg = (struct microvm_config){ .sbx_id = rec->id.sbx, .gen = rec->id.gen,
	                               .att = rec->id.att, .dir = dir, .assets = m->vm_assets,
	                               .uid = uid_base_of(m, rec), .cpu_millis = exec_cpu(m, rec),
	                               .kvm = m->vm_kvm };
	t = mgr_now_us();
	if (microvm_launch(&cfg, &ex->sub.vm, err) < 0)
		goto fail;
	ex->launch_us = mgr_now_us() - t;
	t = mgr_now_us();
	if (bridge_take(m, ex, dir, rec, secret, &bp, err) < 0) {
		microvm_stop(&ex->sub.vm, &e2);
		goto fail;
	}
	ex->spawn_us = mgr_now_us() - t;
	t = mgr_now_us();
	if (bridge_finish(m, ex, &bp, err) < 0) {
		microvm_stop(&ex->sub.vm, &e2);
		goto fail;
	}
	ex->ready_us = mgr_now_us() - t;
	log_info("microVM of %s generation %" PRIu64 ": QEMU pid %d (%s)%s", rec->id.sbx,
	         rec->id.gen, (int)ex->sub.vm.pid, m->vm_kvm ? "KVM" : "TCG",
	         ex->sub.vm.resumed ? ", resumed from its snapshot with its processes" : "");
	sodium_memzero(secret, sizeof(secret));
	return ex;
fail:
	sodium_memzero(secret, sizeof(secret));
	uvutil_pool_free(ex->pool);
	free(ex);
	return NULL;
}

/* exec_start: see manager_int.h. */
struct mgr_exec *exec_start(struct manager *m, const struct rec_exec *rec,
                            struct tt_err *err)
{
	struct mgr_exec *ex = calloc(1, sizeof(*ex));
	char dir[PATH_MAX];
	struct ns_config cfg = { 0 };
	struct bridge_proc bp;
	struct tt_err e2 = { 0 };
	bool use_spare;
	int64_t t;
	int rc;
	/* The activation secret (SPEC §5): fresh per activation, handed to
	 * the guest and the bridge, then zeroed here. It is never stored:
	 * after a manager restart the adopted bridge and guest still hold it,
	 * and any re-activation draws a new one. */
	uint8_t secret[NS_SECRET_LEN];
	uint32_t cpu = exec_cpu(m, rec);

	if (strcmp(rec->id.sst, "microvm") == 0) {
		free(ex);
		return exec_start_vm(m, rec, err);
	}
	/* A spare launch in flight: its result first, so that the checks
	 * below see whether a spare holds rec's slot. */
	spare_sb_take(m);
	if (ex == NULL) {
		/* The record keeps its slot: a spare in it would share it. */
		if (m->spare_sb_on && m->spare_sb_slot == rec->slot)
			spare_sb_stop(m);
		tt_err_set(err, TT_ERR_NOMEM, "out of memory");
		return NULL;
	}
	exec_runtime_init(m, ex);
	ex->own_children = true;
	ex->bridge_pidfd = -1;
	snprintf(ex->sbx, sizeof(ex->sbx), "%s", rec->id.sbx);
	substrate_exec_init(&ex->sub, SUBSTRATE_NS);
	if (sandbox_dir(m, rec->id.sbx, dir, sizeof(dir)) < 0) {
		tt_err_set(err, TT_ERR_INVALID, "state path too long");
		goto fail;
	}
	randombytes_buf(secret, sizeof(secret));
	hello_adopt_key(secret, rec->id.sbx, rec->id.gen, rec->id.att, ex->adopt_key);
	t = mgr_now_us();
	/* The spare sandbox, when it holds this slot (apply_install gave it
	 * to a fresh create): only its identity and secret are handed over,
	 * and its CPU cap rewritten when the install asks another one (it
	 * has none to rewrite under --cpu-millis 0: not used then). */
	use_spare = m->spare_sb_on && m->spare_sb_slot == rec->slot &&
	            (cpu == m->cpu_millis || m->cpu_millis != 0) &&
	            spare_claim(m, dir, &ex->sub.ns);
	if (!use_spare) {
		/* Never two sandboxes in one uid range: a spare we could
		 * not take (our directory was there already) goes. */
		if (m->spare_sb_on && m->spare_sb_slot == rec->slot)
			spare_sb_stop(m);
		spare_claim(m, dir, NULL);
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		tt_err_sys(err, TT_ERR_IO, "mkdir %s", dir);
		if (use_spare)
			ns_sandbox_stop(&ex->sub.ns, &e2);
		goto fail;
	}
	if (use_spare) {
		/* Its tree moved here with it (the agent's socket too). */
		snprintf(ex->sub.ns.guest_socket, sizeof(ex->sub.ns.guest_socket), "%.4000s/run/guest.sock",
		         dir);
		rc = cpu != m->cpu_millis ? ns_cgroup_set_cpu(&ex->sub.ns, cpu, err) : 0;
		if (rc == 0)
			rc = ns_sandbox_assign(&ex->sub.ns, rec->id.sbx, rec->id.gen, rec->id.att,
			                       secret, err);
		if (rc < 0)
			ns_sandbox_stop(&ex->sub.ns, &e2);
	} else {
		cfg.sbx_id = rec->id.sbx;
		cfg.gen = rec->id.gen;
		cfg.att = rec->id.att;
		cfg.secret = secret;
		exec_cfg(m, &cfg, dir, rec->slot);
		cfg.cpu_millis = cpu;
		/* The guest and its bridge come up side by side: the bridge
		 * needs only the init's final identity (after exec), not its
		 * listener. */
		rc = ns_sandbox_launch(&cfg, &ex->sub.ns, err);
		if (cfg.use_netns) {
			/* Used up either way: the sandbox holds it now, or it
			 * is dropped with the failed start. */
			close(m->spare_netns);
			m->spare_netns = -1;
			spare_kick(m);
		}
	}
	ex->launch_us = mgr_now_us() - t;
	if (rc < 0)
		goto fail;
	t = mgr_now_us();
	rc = bridge_take(m, ex, dir, rec, secret, &bp, err);
	ex->spawn_us = mgr_now_us() - t;
	if (rc < 0) {
		ns_sandbox_stop(&ex->sub.ns, &e2);
		goto fail;
	}
	t = mgr_now_us();
	if (ns_sandbox_wait_ready(&ex->sub.ns, err) < 0) {
		close(bp.ready_fd);
		bridge_abort(ex);
		goto fail;
	}
	if (bridge_finish(m, ex, &bp, err) < 0) {
		ns_sandbox_stop(&ex->sub.ns, &e2);
		goto fail;
	}
	ex->ready_us = mgr_now_us() - t;
	sodium_memzero(secret, sizeof(secret));
	return ex;
fail:
	sodium_memzero(secret, sizeof(secret));
	/* Nothing runs on the layer: unmount it (its files stay for a
	 * retry or a destroy). */
	layer_unmount_of(m, rec->id.sbx);
	uvutil_pool_free(ex->pool);
	free(ex);
	return NULL;
}

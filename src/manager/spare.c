/* sbx-manager: spares made ahead of the next create, off its path: a
 * sandbox tree with its layer filesystem, a network namespace, a bridge
 * and a launched sandbox waiting for its identity. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "log.h"
#include "manager/manager_int.h"

#define MGR_SPARE_BACKOFF_MIN_MS 250   /* first wait after a failed spare */
#define MGR_SPARE_BACKOFF_MAX_MS 10000

static void spare_failed(struct manager *m);
static void spare_sb_launch(struct manager *m);

/* spare_work: the spare tree and its layer filesystem (worker thread:
 * touches only the spare's directory and the spare_* results). */
static void spare_work(uv_work_t *w)
{
	struct manager *m = w->data;

	tt_err_clear(&m->spare_err);
	m->spare_rc = -1;
	if (!m->tmpl_ready) {
		struct tt_err e = { 0 };

		m->tmpl_ready = ns_layer_template(m->layer_tmpl, m->layer_bytes,
		                                  m->layer_inodes, &e) == 0;
		if (!m->tmpl_ready)
			log_warn("no layer template (spares run mkfs): %s", e.msg);
	}
	if (sandbox_tree_remove(m->spare_dir) < 0)
		tt_err_sys(&m->spare_err, TT_ERR_IO, "removing the old %s", m->spare_dir);
	else if (ns_sandbox_dirs_spare(m->spare_dir, &m->spare_err) == 0 &&
	         (m->tmpl_ready ? ns_layer_make_from(m->spare_dir, m->layer_tmpl, &m->spare_err)
	                        : ns_layer_make(m->spare_dir, m->layer_bytes, m->layer_inodes,
	                                        &m->spare_err)) == 0)
		m->spare_rc = 0;
}

/* spare_after_work: back on the loop: the spare is ready, or removed
 * (failed, or the manager is stopping and nobody will claim it). */
static void spare_after_work(uv_work_t *w, int status)
{
	struct manager *m = w->data;

	m->spare_busy = false;
	m->tmpl_usable = m->tmpl_ready; /* the work is done: no race */
	if (status == 0 && m->spare_rc == 0 && !m->stopping) {
		m->spare_ready = true;
		spare_kick(m); /* its sandbox next */
		return;
	}
	if (!m->stopping)
		log_warn("spare sandbox directory: %s", status < 0 ? uv_strerror(status)
		                                                   : m->spare_err.msg);
	if (sandbox_tree_remove(m->spare_dir) < 0)
		log_warn("removing %s: %s", m->spare_dir, strerror(errno));
	spare_failed(m);
	spare_kick(m);
}

/* spare_refill_cb: makes whatever spare is missing (loop idle time). */
static void spare_refill_cb(uv_timer_t *t)
{
	struct manager *m = t->data;
	struct tt_err err = { 0 };
	bool stuck = false;

	if (m->stopping)
		return;
	if (!m->spare_ready && !m->spare_busy) {
		m->spare_work.data = m;
		if (uv_queue_work(m->loop, &m->spare_work, spare_work, spare_after_work) == 0)
			m->spare_busy = true;
	}
	if (m->spare_bridge.pid == 0 && m->bridge_bin[0] &&
	    bridgectl_spawn(m->bridge_bin, &m->spare_bridge, &err) < 0) {
		log_warn("spare bridge: %s", err.msg); /* creates spawn their own */
		spare_failed(m);
	}
	if (m->spare_netns < 0 && !m->spare_sb_on) {
		m->spare_netns = ns_netns_make(&stuck, &err);
		if (stuck) {
			log_error("%s", err.msg);
			manager_shutdown(m);
			return;
		} else if (m->spare_netns < 0) {
			log_warn("spare network namespace: %s", err.msg);
			spare_failed(m);
			spare_kick(m);
			return;
		}
	}
	spare_sb_launch(m);
}

/* spare_kick: see manager_int.h. */
void spare_kick(struct manager *m)
{
	int64_t wait = m->spare_retry_at - mgr_now_ms();

	if (m->spare_on && !m->stopping)
		uv_timer_start(&m->spare_timer, spare_refill_cb, wait > 0 ? (uint64_t)wait : 0, 0);
}

/* spare_failed: a spare did not come up: the next refills back off. */
static void spare_failed(struct manager *m)
{
	m->spare_backoff_ms = m->spare_backoff_ms == 0 ? MGR_SPARE_BACKOFF_MIN_MS :
	                      m->spare_backoff_ms * 2 > MGR_SPARE_BACKOFF_MAX_MS ?
	                      MGR_SPARE_BACKOFF_MAX_MS : m->spare_backoff_ms * 2;
	m->spare_retry_at = mgr_now_ms() + m->spare_backoff_ms;
}

/* spare_succeeded: a spare came up: refills run at once again. */
static void spare_succeeded(struct manager *m)
{
	m->spare_backoff_ms = 0;
	m->spare_retry_at = 0;
}

/* spare_sb_stop: see manager_int.h. */
void spare_sb_stop(struct manager *m)
{
	struct tt_err err = { 0 };

	if (!m->spare_sb_on)
		return;
	if (ns_sandbox_stop(&m->spare_sb, &err) < 0)
		log_warn("stopping the spare sandbox: %s", err.msg);
	ns_sandbox_init(&m->spare_sb);
	m->spare_sb_on = false;
}

/* spare_sb_work_cb: the launch (worker thread: touches only spare_sb_new,
 * spare_sb_rc/err and the spare tree, whose claims wait for it). */
static void spare_sb_work_cb(uv_work_t *w)
{
	struct manager *m = w->data;
	struct tt_err err = { 0 };
	int rc = ns_sandbox_launch(&m->spare_sb_cfg, &m->spare_sb_new, &err);

	uv_mutex_lock(&m->spare_sb_mu);
	m->spare_sb_rc = rc;
	m->spare_sb_err = err;
	m->spare_sb_done = true;
	uv_cond_signal(&m->spare_sb_cv);
	uv_mutex_unlock(&m->spare_sb_mu);
}

/* spare_sb_take: see manager_int.h. */
void spare_sb_take(struct manager *m)
{
	if (!m->spare_sb_busy || m->spare_sb_taken)
		return;
	/* Not started yet (every pool thread busy, e.g. with snapshots):
	 * cancelled rather than waited for with the loop blocked; the
	 * create makes its own. spare_sb_after_cb still runs (ECANCELED). */
	if (uv_cancel((uv_req_t *)&m->spare_sb_work) == 0) {
		m->spare_sb_taken = true;
		close(m->spare_netns); /* the launch would have used it */
		m->spare_netns = -1;
		log_info("%s", "spare sandbox launch had not started: cancelled");
		return;
	}
	uv_mutex_lock(&m->spare_sb_mu);
	while (!m->spare_sb_done)
		uv_cond_wait(&m->spare_sb_cv, &m->spare_sb_mu);
	uv_mutex_unlock(&m->spare_sb_mu);
	m->spare_sb_taken = true;
	close(m->spare_netns); /* used up either way */
	m->spare_netns = -1;
	if (m->spare_sb_rc < 0) {
		log_warn("spare sandbox: %s (creates launch their own)", m->spare_sb_err.msg);
		spare_failed(m);
		spare_kick(m);
		return;
	}
	spare_succeeded(m);
	spare_kick(m);
	m->spare_sb = m->spare_sb_new;
	m->spare_sb_on = true;
	if (m->stopping)
		spare_sb_stop(m);
}

/* spare_sb_after_cb: the launch is done (or was cancelled at stop). */
static void spare_sb_after_cb(uv_work_t *w, int status)
{
	struct manager *m = w->data;

	if (status == UV_ECANCELED) { /* never ran: nothing was launched */
		m->spare_sb_rc = -1;
		tt_err_set(&m->spare_sb_err, TT_ERR_SYS, "launch cancelled");
		m->spare_sb_done = true;
	}
	spare_sb_take(m); /* a no-op after a cancel: spare_sb_take did it */
	m->spare_sb_busy = false;
	spare_kick(m);
}

/* spare_sb_launch: a sandbox into the ready spare tree, waiting for its
 * execution (~3 ms, between creates instead of on one, on a worker
 * thread). It takes the spare netns and reserves the lowest free slot. */
static void spare_sb_launch(struct manager *m)
{
	if (m->spare_sb_on || m->spare_sb_busy || !m->spare_ready || m->spare_busy ||
	    m->stopping || m->spare_netns < 0)
		return;
	m->spare_sb_slot = records_free_slot(m->db);
	snprintf(m->spare_sb_id, sizeof(m->spare_sb_id), "spare%d", (int)getpid());
	memset(&m->spare_sb_cfg, 0, sizeof(m->spare_sb_cfg));
	m->spare_sb_cfg.sbx_id = m->spare_sb_id;
	m->spare_sb_cfg.gen = ++m->spare_sb_serial;
	m->spare_sb_cfg.att = 1;
	m->spare_sb_cfg.assign_later = true;
	exec_cfg(m, &m->spare_sb_cfg, m->spare_dir, m->spare_sb_slot);
	ns_sandbox_init(&m->spare_sb_new);
	m->spare_sb_done = m->spare_sb_taken = false;
	m->spare_sb_work.data = m;
	if (uv_queue_work(m->loop, &m->spare_sb_work, spare_sb_work_cb, spare_sb_after_cb) == 0)
		m->spare_sb_busy = true;
}

/* spare_claim: see manager_int.h. */
bool spare_claim(struct manager *m, const char *dir, struct ns_sandbox *sb)
{
	struct pollfd pf;

	/* A launch into the tree still running: its result first (the
	 * wait is what is left of ~3 ms, once in a while). */
	spare_sb_take(m);
	pf = (struct pollfd){ .fd = m->spare_sb.pidfd, .events = POLLIN };
	if (!m->spare_ready || m->spare_busy || m->stopping) {
		if (!m->stopping && access(dir, F_OK) < 0)
			log_info("no spare ready for %s: its layer is made on the create path",
			         dir);
		return false;
	}
	if (access(dir, F_OK) == 0)
		return false; /* dir is there already: the spare stays */
	if (m->spare_sb_on && (sb == NULL || poll(&pf, 1, 0) != 0 ||
	                       !procid_runs_file(m->spare_sb.init_pid, m->guest_bin))) {
		/* Dead, or an agent from before an upgrade of tether-guest
		 * (a create must get the current one, as bridges do). */
		if (sb != NULL)
			log_warn("the spare sandbox (init pid %d) %s", (int)m->spare_sb.init_pid,
			         poll(&pf, 1, 0) != 0 ? "exited while waiting"
			                              : "runs a replaced tether-guest: not used");
		spare_sb_stop(m);
	}
	if (renameat2(AT_FDCWD, m->spare_dir, AT_FDCWD, dir, RENAME_NOREPLACE) < 0) {
		if (errno == EEXIST)
			return false;
		log_warn("renaming %s to %s: %s", m->spare_dir, dir, strerror(errno));
		spare_sb_stop(m);
		sandbox_tree_remove(m->spare_dir);
	}
	m->spare_ready = false;
	spare_kick(m);
	if (!m->spare_sb_on)
		return false;
	*sb = m->spare_sb;
	ns_sandbox_init(&m->spare_sb);
	m->spare_sb_on = false;
	return true;
}

/* spare_init: see manager_int.h. */
void spare_init(struct manager *m)
{
	snprintf(m->spare_dir, sizeof(m->spare_dir), "%s/sandboxes/.spare", m->state_dir);
	snprintf(m->layer_tmpl, sizeof(m->layer_tmpl), "%s/sandboxes/.layer-template.img",
	         m->state_dir);
	sandbox_tree_remove(m->spare_dir);
	/* Cgroups of spare sandboxes whose manager died (they ended with
	 * it: their agent read EOF); ours are named after our pid. */
	ns_cgroup_sweep("spare");
	/* Once, before any launch can use them (glibc's cannot fail). */
	if (uv_mutex_init(&m->spare_sb_mu) != 0 || uv_cond_init(&m->spare_sb_cv) != 0) {
		log_warn("%s", "no spare sandboxes: cannot make their mutex");
		return;
	}
	uv_timer_init(m->loop, &m->spare_timer);
	m->spare_timer.data = m;
	m->spare_on = true;
	spare_kick(m);
}

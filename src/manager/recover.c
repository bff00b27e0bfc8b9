/* sbx-manager: lost executions and recovery. A watcher (node-api) hears
 * of every execution lost; after a restart, executions whose processes
 * still run are adopted, the others recorded lost. */
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "cleanup.h"
#include "log.h"
#include "manager/manager_int.h"
#include "relay.h"
#include "unixaddr.h"
#include "uvutil.h"
#include "wire_json.h"

/* lost_send: one {"lost":{…}} event to the watcher; one that cannot take
 * it is dropped (node-api watches again, and hears of it then). */
static void lost_send(struct manager *m, const char *sbx, uint64_t gen,
                      uint32_t att, const char *reason, bool reactivate)
{
	struct tt_err err = { 0 };
	json_t *o;

	if (m->watcher == NULL)
		return;
	o = json_pack("{s:{s:s,s:I,s:I,s:s,s:b}}", "lost", "sandbox", sbx,
	              "generation", (json_int_t)gen, "activation", (json_int_t)att,
	              "reason", reason, "reactivate", reactivate);
	if (o == NULL ||
	    relay_write_json((uv_stream_t *)m->watcher->conn, WIRE_DATA_OUT, o, &err) < 0) {
		log_warn("telling node-api of a lost execution: %s",
		         o ? err.msg : "out of memory");
		conn_free(m->watcher);
	}
	json_decref(o);
}

/* lost_find: what we noted of sbx's loss, or NULL. */
static struct mgr_lost *lost_find(struct manager *m, const char *sbx)
{
	for (struct mgr_lost *l = m->lost; l != NULL; l = l->next)
		if (strcmp(l->sbx, sbx) == 0)
			return l;
	return NULL;
}

/* lost_forget: see manager_int.h. */
void lost_forget(struct manager *m, const char *sbx)
{
	for (struct mgr_lost **pp = &m->lost; *pp != NULL; pp = &(*pp)->next) {
		if (strcmp((*pp)->sbx, sbx) == 0) {
			struct mgr_lost *l = *pp;

			*pp = l->next;
			free(l);
			return;
		}
	}
}

/* lost_note: see manager_int.h. */
void lost_note(struct manager *m, const struct rec_exec *r,
               const char *reason, bool reactivate)
{
	struct mgr_lost *l = lost_find(m, r->id.sbx);

	if (l == NULL && (l = calloc(1, sizeof(*l))) != NULL) {
		l->next = m->lost;
		m->lost = l;
	}
	if (l != NULL) {
		snprintf(l->sbx, sizeof(l->sbx), "%s", r->id.sbx);
		l->gen = r->id.gen;
		snprintf(l->reason, sizeof(l->reason), "%s", reason);
		l->reactivate = reactivate;
	}
	lost_send(m, r->id.sbx, r->id.gen, r->id.att, reason, reactivate);
}

/* watch_alloc_cb: a watcher's reads land in its connection's buffer. */
static void watch_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct mgr_conn *c = h->data;

	(void)suggested;
	*buf = uv_buf_init((char *)c->buf, sizeof(c->buf));
}

/* watch_read_cb: a watcher sends nothing more: EOF (or any byte) ends it. */
static void watch_read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	(void)buf;
	if (nread != 0)
		conn_free(s->data);
}

/* watch_start: see manager_int.h. */
void watch_start(struct mgr_conn *c)
{
	struct manager *m = c->m;

	if (m->watcher != NULL && m->watcher != c)
		conn_free(m->watcher);
	m->watcher = c;
	uv_read_stop((uv_stream_t *)c->conn);
	if (uv_read_start((uv_stream_t *)c->conn, watch_alloc_cb, watch_read_cb) < 0) {
		conn_free(c);
		return;
	}
	for (size_t i = 0; i < records_count(m->db) && m->watcher == c; i++) {
		const struct rec_exec *r = records_at(m->db, i);
		const struct mgr_lost *l = lost_find(m, r->id.sbx);

		if (r->state != REC_LOST || r->retired)
			continue;
		if (l != NULL && l->gen == r->id.gen)
			lost_send(m, r->id.sbx, r->id.gen, r->id.att, l->reason,
			          l->reactivate);
		else
			lost_send(m, r->id.sbx, r->id.gen, r->id.att, "the worker "
			          "restarted and its processes were gone", false);
	}
}

/* proc_matches: pid is alive and started at start (pid reuse guard). */
static bool proc_matches(pid_t pid, unsigned long long start)
{
	unsigned long long now = 0;

	return pid > 0 && proc_start_time(pid, &now, NULL) == 0 && now == start;
}

/* kill_verified: SIGKILL to pid only if it is still the recorded process
 * (pidfd opened first, start time checked after: no reuse race). */
static void kill_verified(pid_t pid, unsigned long long start)
{
	int fd;

	if (pid <= 0 || (fd = pidfd_open_raw(pid)) < 0)
		return;
	if (proc_matches(pid, start))
		pidfd_signal(fd, SIGKILL);
	close(fd);
}

/* cgroups_release: kills whatever still runs in the cgroups of r's
 * execution, found dead or not adopted after a restart, then removes
 * them. The record may not name its init: a manager killed between
 * starting a sandbox and recording its pids left STARTING with pid 0. */
static void cgroups_release(const struct rec_exec *r)
{
	struct ns_sandbox gone;
	struct tt_err err = { 0 };

	ns_sandbox_init(&gone);
	ns_cgroup_find(r->id.sbx, r->id.gen, &gone);
	if (ns_cgroup_kill(&gone, &err) < 0)
		log_warn("killing what runs in %s generation %" PRIu64 ": %s", r->id.sbx,
		         r->id.gen, err.msg);
	if (ns_sandbox_stop(&gone, &err) < 0)
		log_warn("cgroups of %s generation %" PRIu64 ": %s", r->id.sbx, r->id.gen,
		         err.msg);
}

/* bridge_adopt: takes over the bridge of an execution our predecessor
 * started (lib/hello.h, "Adoption"): it must be the recorded bridge
 * (verify_peer against the identity pinned in recover_adopt), challenge
 * us, and accept the proof made with the recorded adoption key. Blocking, each
 * read and write bounded (the bridge is local): runs once per execution,
 * at start, before we serve. */
static int bridge_adopt(struct manager *m, struct mgr_exec *ex, const struct rec_exec *r,
                        struct tt_err *err)
{
	static uint8_t buf[WIRE_PAYLOAD_MAX + 1];
	uint8_t chal[HELLO_CHALLENGE_LEN], proof[HELLO_PROOF_LEN];
	char path[PATH_MAX];
	_cleanup_close_ int fd = -1;
	struct wire_frame f;
	json_t *o;
	int rc;

	if (!r->has_adopt_key)
		return tt_err_set(err, TT_ERR_VERIFY, "recorded without an adoption key");
	if (sandbox_dir(m, r->id.sbx, path, sizeof(path) - sizeof("/bridge.sock")) < 0)
		return tt_err_set(err, TT_ERR_INVALID, "bridge socket path too long");
	strcat(path, "/bridge.sock");
	/* Any length of state path (unixaddr.h). */
	fd = unixaddr_connect(path, HELLO_TIMEOUT_MS, err);
	if (fd < 0)
		return -1;
	if (verify_peer(fd, &ex->bridge_id, err) < 0)
		return -1;
	if (wire_recv(fd, &f, buf, sizeof(buf), err) != 1)
		return tt_err_set(err, TT_ERR_TRANSPORT, "its bridge sent no adoption challenge");
	o = f.type == WIRE_HELLO ? wire_frame_json(&f, NULL) : NULL;
	rc = o != NULL && hello_adopt_challenge_parse(o, chal) == 0 ? 0 : -1;
	json_decref(o);
	if (rc < 0)
		return tt_err_set(err, TT_ERR_MALFORMED, "its bridge sent no adoption challenge");
	hello_mac(r->adopt_key, HELLO_ADOPT_LABEL, r->id.sbx, r->id.gen, r->id.att, chal, proof);
	o = hello_proof_json(proof);
	sodium_memzero(proof, sizeof(proof));
	rc = o != NULL ? wire_send_json(fd, WIRE_HELLO, o, err) : -1;
	json_decref(o);
	if (rc < 0)
		return -1;
	if (wire_recv(fd, &f, buf, sizeof(buf), err) != 1)
		return tt_err_set(err, TT_ERR_TRANSPORT, "its bridge closed without an answer");
	o = wire_frame_json(&f, NULL);
	rc = f.type == WIRE_HELLO && json_is_true(json_object_get(o, "adopted")) ? 0 : -1;
	if (rc < 0)
		tt_err_set(err, TT_ERR_VERIFY, "its bridge refused: %.160s",
		           o && json_string_value(json_object_get(o, "message")) ?
		           json_string_value(json_object_get(o, "message")) : "?");
	json_decref(o);
	return rc;
}

/* recover_adopt: see manager_int.h. */
void recover_adopt(struct manager *m)
{
	for (size_t i = 0; i < records_count(m->db); i++) {
		const struct rec_exec *r = records_at(m->db, i);
		bool init_ok = proc_matches(r->init_pid, r->init_start);
		bool bridge_ok = proc_matches(r->bridge_pid, r->bridge_start);
		struct mgr_exec *ex;
		struct tt_err err = { 0 };
		char dir[1200];
		bool pinned;

		if (r->state != REC_RUNNING || r->retired || !init_ok || !bridge_ok) {
			kill_verified(r->bridge_pid, r->bridge_start);
			kill_verified(r->init_pid, r->init_start);
			/* A pause cut short by our death left it frozen. */
			ns_freezer_release(r->id.sbx, r->id.gen);
			cgroups_release(r);
			/* Our mounts outlive us (we share the host's mount
			 * namespace): a layer nothing runs on is unmounted. */
			layer_unmount_of(m, r->id.sbx);
			if (r->state == REC_RUNNING || r->state == REC_STARTING) {
				log_warn("execution %s generation %" PRIu64 " lost across restart",
				         r->id.sbx, r->id.gen);
				exec_mark_state(m, r->id.sbx, r->retired ? REC_STOPPED : REC_LOST);
			}
			continue;
		}
		ex = calloc(1, sizeof(*ex));
		if (ex == NULL)
			continue;
		exec_runtime_init(m, ex);
		snprintf(ex->sbx, sizeof(ex->sbx), "%s", r->id.sbx);
		sandbox_dir(m, r->id.sbx, dir, sizeof(dir));
		if (strcmp(r->id.sst, "microvm") == 0) {
			/* QEMU, not our child any more: killed, never reaped */
			substrate_exec_init(&ex->sub, SUBSTRATE_MICROVM);
			ex->sub.vm.pid = r->init_pid;
			ex->sub.vm.start_time = r->init_start;
			ex->sub.vm.pidfd = pidfd_open_raw(r->init_pid);
			snprintf(ex->sub.vm.chan, sizeof(ex->sub.vm.chan), "%s/" MICROVM_CHAN, dir);
			snprintf(ex->sub.vm.qmp, sizeof(ex->sub.vm.qmp), "%s/" MICROVM_DIR "/qmp.sock",
			         dir);
		} else {
			substrate_exec_init(&ex->sub, SUBSTRATE_NS);
			ex->sub.ns.init_pid = r->init_pid;
			ex->sub.ns.init_start_time = r->init_start;
			/* Its cgroups, so that stopping it later removes them. */
			ns_cgroup_find(r->id.sbx, r->id.gen, &ex->sub.ns);
			ex->sub.ns.pidfd = pidfd_open_raw(r->init_pid);
			snprintf(ex->sub.ns.guest_socket, sizeof(ex->sub.ns.guest_socket),
			         "%s/run/guest.sock", dir);
		}
		ex->bridge_pid = r->bridge_pid;
		ex->bridge_start = r->bridge_start;
		ex->bridge_pidfd = -1;
		/* The bridge as it runs now, pinned (pidfd + recheck): the
		 * identity its connections are verified against, provided its
		 * start time is the recorded one. */
		pinned = procid_pin(r->bridge_pid, &ex->bridge_id, &ex->bridge_pidfd, &err) == 0 &&
		         ex->bridge_id.start_time == r->bridge_start;
		struct substrate_owner own;

		substrate_owner(&ex->sub, &own);
		if (own.pidfd < 0 || !pinned ||
		    !proc_matches(r->init_pid, r->init_start) ||
		    bridge_adopt(m, ex, r, &err) < 0 || exec_watch(m, ex, &err) < 0) {
			int init_fd = own.pidfd, bridge_fd = ex->bridge_pidfd;

			log_warn("execution %s generation %" PRIu64 " not adopted%s%s: stopping it",
			         r->id.sbx, r->id.gen, err.msg[0] ? ": " : "", err.msg);
			uvutil_pool_free(ex->pool);
			exec_free(ex); /* its polls leave epoll while their fds are open */
			if (init_fd >= 0)
				close(init_fd);
			if (bridge_fd >= 0)
				close(bridge_fd);
			/* Alive but out of our reach: not left running. */
			kill_verified(r->bridge_pid, r->bridge_start);
			kill_verified(r->init_pid, r->init_start);
			ns_freezer_release(r->id.sbx, r->id.gen);
			cgroups_release(r);
			exec_mark_state(m, r->id.sbx, REC_LOST);
			layer_unmount_of(m, r->id.sbx);
			continue;
		}
		if (ex->sub.kind == SUBSTRATE_NS && !ns_layer_mounted(dir))
			log_warn("adopted %s without its layer mounted on the host: a pause "
			         "will be refused", r->id.sbx);
		log_info("adopted %s generation %" PRIu64 " (init pid %d)", r->id.sbx,
		         r->id.gen, (int)r->init_pid);
	}
}

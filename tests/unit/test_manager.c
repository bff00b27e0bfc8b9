/* sbx-manager end to end, with real processes: this test is the node-api
 * peer (its own pid and uid are passed to the manager), the manager is
 * build/tetherd spawned as a child, sandboxes are real ns sandboxes running
 * build/tether-guest behind real bridges. Tokens come from a freshly
 * generated key pair via cap_mint. Needs root (namespaces, cgroups). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "capcache.h"
#include "feedsig.h"
#include "signer/signer.h"
#include "claims.h"
#include "keyring.h"
#include "paserk.h"
#include "paseto.h"
#include "testutil.h"
#include "timefmt.h"
#include "wire.h"
#include "wire_json.h"

#define SBX "sbx_abcdefghijklmnopqrstuvwxyz"
/* Fresh sandboxes (never installed before): the spare test's. */
#define SBX2 "sbx_bcdefghijklmnopqrstuvwxyza"
#define SBX3 "sbx_cdefghijklmnopqrstuvwxyzab"
#define SBX4 "sbx_defghijklmnopqrstuvwxyzabc"

/* The sandbox the helpers below (mint, exec_req, install, status lookups)
 * name: SBX but in test_spare_bridge. */
static const char *the_sbx = SBX;

static char state_dir[64], sock_path[96];
/* The manager's --guest-bin: a copy, so a test can replace it (as an
 * upgrade does) without touching the build. */
static char guest_dir[64], guest_copy[96];
static pid_t mgr_pid;
static uint8_t sk[PASETO_SK_BYTES], pk[PASETO_PK_BYTES];
static uint8_t forged_sk[PASETO_SK_BYTES];
static char kid[PASERK_K4_PID_LEN + 1];
static uint8_t rbuf[WIRE_PAYLOAD_MAX + 1];

/* One operation's answer, as node-api would see it. */
struct answer {
	json_t *decision;  /* DECISION frame, if any */
	json_t *result;    /* RESULT */
	json_t *error;     /* ERROR */
	char out[4096];    /* DATA_OUT concatenated */
	size_t out_len;
	int frames;        /* frames after the decision */
	bool closed;       /* connection ended (EOF or reset) */
};

/* answer_free: drops the JSON members. */
static void answer_free(struct answer *a)
{
	json_decref(a->decision);
	json_decref(a->result);
	json_decref(a->error);
	memset(a, 0, sizeof(*a));
}

/* connect_mgr: a blocking connection to the manager socket. */
static int connect_mgr(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* read_answer: frames until the operation ends (RESULT or ERROR: the
 * connection then stays open for the next one) or the manager closes. */
static void read_answer(int fd, struct answer *a)
{
	struct timeval tv = { .tv_sec = 20 };
	struct wire_frame f;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	for (;;) {
		int rc = wire_recv(fd, &f, rbuf, sizeof(rbuf), NULL);

		if (rc <= 0) {
			a->closed = true;
			return;
		}
		switch (f.type) {
		case WIRE_DECISION:
			a->decision = wire_frame_json(&f, NULL);
			continue;
		case WIRE_DATA_OUT:
			if (a->out_len + f.len < sizeof(a->out)) {
				memcpy(a->out + a->out_len, f.payload, f.len);
				a->out_len += f.len;
				a->out[a->out_len] = '\0';
			}
			break;
		case WIRE_RESULT:
			a->result = wire_frame_json(&f, NULL);
			a->frames++;
			return;
		case WIRE_ERROR:
			a->error = wire_frame_json(&f, NULL);
			a->frames++;
			return;
		default:
			break;
		}
		a->frames++;
	}
}

/* call: one REQUEST (req is stolen), the whole answer. */
/* The feed key the manager under test is provisioned with. Every update
 * a test sends goes out signed, as the cp serves it (lib/feedsig.h):
 * "to" w1 and "prev" the highest revision sealed before it, which is
 * what the cp's chain gives (a replay gets the prev it had the first
 * time). The refusals themselves are tested in test_feedsig and
 * tests/integration/test_feed_sign.sh. */
static uint8_t feed_sk[PASETO_SK_BYTES];
static char feed_pub[PASERK_K4_PUBLIC_LEN + 1];
static uint64_t sealed[1024];
static size_t n_sealed;

/* seal: the signed envelope of update u (u is consumed). */
static json_t *seal(json_t *u)
{
	uint64_t rev = (uint64_t)json_integer_value(json_object_get(u, "rev")), prev = 0;
	char sig[FEEDSIG_SIG_B64_LEN + 1];
	struct tt_err err = { 0 };
	bool known = false;
	char *body;
	json_t *env;

	for (size_t i = 0; i < n_sealed; i++) {
		if (sealed[i] < rev && sealed[i] > prev)
			prev = sealed[i];
		known |= sealed[i] == rev;
	}
	if (!known && n_sealed < sizeof(sealed) / sizeof(sealed[0]))
		sealed[n_sealed++] = rev;
	json_object_set_new(u, "to", json_string("w1"));
	json_object_set_new(u, "prev", json_integer((json_int_t)prev));
	body = json_dumps(u, JSON_COMPACT | JSON_SORT_KEYS);
	assert_non_null(body);
	assert_int_equal(signer_feed_sig(feed_sk, body, strlen(body), sig, &err), 0);
	env = json_pack("{s:O,s:O,s:s,s:s}", "rev", json_object_get(u, "rev"), "kind",
	                json_object_get(u, "kind"), "body", body, "sig", sig);
	free(body);
	json_decref(u);
	return env;
}

/* call: one request, its answer; a feed.apply's updates are sealed. */
static void call(json_t *req, struct answer *a)
{
	int fd = connect_mgr();
	json_t *ups = json_object_get(req, "updates");

	for (size_t i = 0; json_is_array(ups) && i < json_array_size(ups); i++)
		json_array_set_new(ups, i, seal(json_incref(json_array_get(ups, i))));

	memset(a, 0, sizeof(*a));
	assert_true(fd >= 0);
	assert_int_equal(wire_send_json(fd, WIRE_REQUEST, req, NULL), 0);
	json_decref(req);
	read_answer(fd, a);
	close(fd);
}

/* mint: a control capability for SBX at gen on wrk with ops. */
static char *mint(const uint8_t *key, uint64_t gen, const char *wrk, uint32_t ops)
{
	struct tt_claims c = { 0 };
	struct tt_err err = { 0 };
	char *tok = NULL;

	snprintf(c.iss, sizeof(c.iss), "test");
	snprintf(c.sub, sizeof(c.sub), "tester");
	snprintf(c.jti, sizeof(c.jti), "j%u", randombytes_random());
	c.iat = tt_now();
	c.exp = c.iat + TT_CAP_LIFETIME;
	c.aud = TT_AUD_NODE;
	snprintf(c.id.sbx, sizeof(c.id.sbx), "%s", the_sbx);
	c.id.gen = gen;
	snprintf(c.id.wrk, sizeof(c.id.wrk), "%s", wrk);
	snprintf(c.id.sst, sizeof(c.id.sst), "ns");
	c.id.att = 1;
	c.pur = TT_PUR_CONTROL;
	c.ops = ops;
	if (key == sk) {
		assert_int_equal(cap_mint(sk, &c, &tok, &err), 0);
	} else {
		/* Forgery: signed by another key, but naming the real kid. */
		char footer[128];
		char *payload = claims_to_json(&c, &err);

		snprintf(footer, sizeof(footer), "{\"kid\":\"%s\"}", kid);
		assert_non_null(payload);
		assert_int_equal(paseto_v4_sign(key, (uint8_t *)payload, strlen(payload),
		                                (uint8_t *)footer, strlen(footer), NULL, 0,
		                                &tok, &err), 0);
		free(payload);
	}
	return tok;
}

/* exec_req: {"token","sbx","op":"exec","cmd":["sh","-c",script]}. */
static json_t *exec_req(const char *token, const char *script)
{
	return json_pack("{s:s,s:s,s:s,s:[s,s,s]}", "token", token, "sbx", the_sbx, "op",
	                 "exec", "cmd", "sh", "-c", script);
}

/* feed: one feed.apply with a single update; returns the result ok flag. */
static bool feed(json_t *update)
{
	struct answer a;
	json_t *res;
	bool ok;

	call(json_pack("{s:s,s:[o]}", "op", "feed.apply", "updates", update), &a);
	assert_non_null(a.result);
	res = json_array_get(json_object_get(a.result, "results"), 0);
	ok = json_is_true(json_object_get(res, "ok"));
	if (!ok)
		print_message("# update failed: %s\n",
		              json_string_value(json_object_get(res, "error")));
	answer_free(&a);
	return ok;
}

/* install: an install update for SBX. */
static json_t *install(uint64_t rev, uint64_t gen, const char *wrk)
{
	return json_pack("{s:I,s:s,s:s,s:s,s:I,s:s,s:s,s:i}", "rev", (json_int_t)rev,
	                 "kind", "install", "worker", wrk, "sandbox", the_sbx, "generation",
	                 (json_int_t)gen, "substrate", "ns", "pod", "", "activation", 1);
}

/* expect_decision: the DECISION frame's decision and reason. */
static void expect_decision(const struct answer *a, const char *decision,
                            const char *reason)
{
	assert_non_null(a->decision);
	assert_string_equal(json_string_value(json_object_get(a->decision, "decision")),
	                    decision);
	assert_string_equal(json_string_value(json_object_get(a->decision, "reason")),
	                    reason);
}

/* start_manager: spawns build/tetherd manager with us as its peer. */
static void start_manager(void)
{
	char ppid[16];
	int fd = -1;

	snprintf(ppid, sizeof(ppid), "%d", (int)getpid());
	mgr_pid = fork();
	assert_true(mgr_pid >= 0);
	if (mgr_pid == 0) {
		const char *bin = getenv("TETHERD_BIN") ? getenv("TETHERD_BIN") : "build/tetherd";
		const char *guest = guest_copy;
		char guest_abs[PATH_MAX];

		char snaps[128];

		char log_path[128];
		int log_fd;

		if (realpath(guest, guest_abs) == NULL)
			_exit(126);
		/* The manager's log goes to a file the tests read its refusal
		 * reasons from (appended across restarts). */
		snprintf(log_path, sizeof(log_path), "%s/manager.log", state_dir);
		log_fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		if (log_fd < 0 || dup2(log_fd, STDERR_FILENO) < 0)
			_exit(125);
		snprintf(snaps, sizeof(snaps), "%s/snapshots", state_dir);
		execl(bin, "tetherd", "manager", "--state", state_dir, "--socket", sock_path,
		      "--worker-id", "w1", "--peer-pid", ppid, "--peer-uid", "0",
		      "--guest-bin", guest_abs, "--snapshots", snaps, "--feed-key", feed_pub,
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500 && fd < 0; i++) {
		fd = connect_mgr();
		if (fd < 0)
			usleep(10000);
	}
	assert_true(fd >= 0);
	close(fd); /* the manager drops a connection that sends nothing */
}

/* stop_manager: SIGTERM and reap. */
static void stop_manager(void)
{
	int st;

	kill(mgr_pid, SIGTERM);
	assert_int_equal(waitpid(mgr_pid, &st, 0), mgr_pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* guest_install: (re)places guest_copy with a copy of the built agent:
 * a new file (new inode), renamed over the old one, as an upgrade does. */
static int guest_install(void)
{
	const char *src = getenv("TETHER_GUEST_BIN") ? getenv("TETHER_GUEST_BIN")
	                                            : "build/tether-guest";
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "install -m 0755 %s %s.new && mv -f %s.new %s", src,
	         guest_copy, guest_copy, guest_copy);
	return system(cmd) == 0 ? 0 : -1;
}

/* group_setup: state dir, keys, manager. */
static int group_setup(void **state)
{
	uint8_t other_pk[PASETO_PK_BYTES];

	(void)state;
	if (geteuid() != 0 || sodium_init() < 0)
		return -1;
	snprintf(state_dir, sizeof(state_dir), "/tmp/tt-mgr.XXXXXX");
	if (mkdtemp(state_dir) == NULL)
		return -1;
	snprintf(sock_path, sizeof(sock_path), "%s/manager.sock", state_dir);
	snprintf(guest_dir, sizeof(guest_dir), "/tmp/tt-mgr-guest.XXXXXX");
	if (mkdtemp(guest_dir) == NULL || chmod(guest_dir, 0755) < 0)
		return -1;
	snprintf(guest_copy, sizeof(guest_copy), "%s/tether-guest", guest_dir);
	if (guest_install() < 0)
		return -1;
	crypto_sign_keypair(pk, sk);
	crypto_sign_keypair(other_pk, forged_sk);
	paserk_k4_pid(pk, kid);
	crypto_sign_keypair(other_pk, feed_sk);
	paserk_k4_public_encode(other_pk, feed_pub);
	return 0;
}

/* group_teardown: the manager stops its sandboxes; remove the state. */
static int group_teardown(void **state)
{
	char cmd[256];

	(void)state;
	if (mgr_pid > 0) {
		kill(mgr_pid, SIGTERM);
		waitpid(mgr_pid, NULL, 0);
	}
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(forged_sk, sizeof(forged_sk));
	snprintf(cmd, sizeof(cmd), "rm -rf %s %s", state_dir, guest_dir);
	return system(cmd) == 0 ? 0 : -1;
}

/* test_install_and_exec: keys + install via the feed, then an honest exec
 * returns output and exit code through admission, bridge and guest. */
static void test_install_and_exec(void **state)
{
	struct tt_keyring kr = { 0 };
	struct tt_err err = { 0 };
	char *bundle;
	json_t *keys;
	struct answer a;
	char *tok;

	(void)state;
	start_manager();
	assert_int_equal(keyring_add(&kr, pk, tt_now() - 60, 0, &err), 0);
	bundle = keyring_to_json(&kr, &err);
	assert_non_null(bundle);
	keys = json_loads(bundle, JSON_REJECT_DUPLICATES, NULL);
	free(bundle);
	json_object_set_new(keys, "rev", json_integer(1));
	json_object_set_new(keys, "kind", json_string("keys"));
	json_object_set_new(keys, "worker", json_null());
	assert_true(feed(keys));
	assert_true(feed(install(2, 1, "w1")));

	tok = mint(sk, 1, "w1", TT_OP_EXEC | TT_OP_FS_READ);
	call(exec_req(tok, "echo hello from $(hostname); exit 3"), &a);
	expect_decision(&a, "allow", "ok");
	assert_non_null(a.result);
	assert_int_equal(json_integer_value(json_object_get(a.result, "exit_code")), 3);
	assert_non_null(strstr(a.out, "hello from"));
	answer_free(&a);
	free(tok);
}

/* test_secret_unreadable: the activation secret lives in the guest agent
 * (PID 1) and its per-connection handler; sandbox code, same uid, cannot
 * open their memory or environment or follow their fds (not dumpable, and
 * commands run without CAP_SYS_PTRACE in the sandbox's user namespace). */
static void test_secret_unreadable(void **state)
{
	struct answer a;
	char *tok = mint(sk, 1, "w1", TT_OP_EXEC);

	(void)state;
	/* Opening is the access check (reading mem at offset 0 fails anyway). */
	call(exec_req(tok, "for p in 1 $PPID; do for f in mem environ; do "
	                   "if (exec 3</proc/$p/$f) 2>/dev/null; then echo \"$p $f open\"; fi; "
	                   "done; readlink /proc/$p/fd/0 >/dev/null 2>&1 && echo \"$p fd link read\"; done; "
	                   "(exec 3</proc/self/environ) && echo checked"), &a);
	expect_decision(&a, "allow", "ok");
	assert_non_null(a.result);
	assert_string_equal(a.out, "checked\n");
	answer_free(&a);
	/* The command's own capability sets: CAP_SYS_PTRACE (bit 19) is gone
	 * from the effective and bounding sets, CAP_DAC_OVERRIDE (bit 1), a
	 * capability root in the sandbox's user namespace keeps, is not. */
	call(exec_req(tok, "sed -n 's/^Cap\\(Eff\\|Bnd\\):[[:space:]]*/\\1 /p' /proc/self/status"),
	     &a);
	expect_decision(&a, "allow", "ok");
	{
		unsigned long long eff = 0, bnd = 0;

		assert_int_equal(sscanf(a.out, "Eff %llx\nBnd %llx", &eff, &bnd), 2);
		assert_true((eff & (1ull << 19)) == 0 && (bnd & (1ull << 19)) == 0);
		assert_true((eff & (1ull << 1)) != 0 && (bnd & (1ull << 1)) != 0);
	}
	answer_free(&a);
	free(tok);
}

/* test_refusals: wrong worker, forged signature, op not permitted: each is
 * refused with the right body and nothing reaches the sandbox. */
static void test_refusals(void **state)
{
	struct answer a;
	char *tok;

	(void)state;
	tok = mint(sk, 1, "w2", TT_OP_EXEC);
	call(exec_req(tok, "touch /tmp/leaked"), &a);
	expect_decision(&a, "refresh_route", "wrong_worker");
	assert_int_equal(json_integer_value(json_object_get(a.decision,
	                                                    "installed_generation")), 1);
	assert_int_equal(a.frames, 0);
	assert_true(a.closed);
	answer_free(&a);
	free(tok);

	tok = mint(forged_sk, 1, "w1", TT_OP_EXEC);
	call(exec_req(tok, "touch /tmp/leaked"), &a);
	expect_decision(&a, "deny", "bad_signature");
	assert_null(json_object_get(a.decision, "installed_generation"));
	assert_int_equal(a.frames, 0);
	answer_free(&a);
	free(tok);

	tok = mint(sk, 1, "w1", TT_OP_FS_READ);
	call(exec_req(tok, "touch /tmp/leaked"), &a);
	expect_decision(&a, "deny", "op_not_permitted");
	answer_free(&a);

	/* fs.stat is a read: allowed with the same token. The refused execs
	 * above never ran: the file does not exist. */
	call(json_pack("{s:s,s:s,s:s,s:s}", "token", tok, "sbx", SBX, "op", "fs.stat",
	               "path", "/tmp/leaked"), &a);
	expect_decision(&a, "allow", "ok");
	assert_non_null(a.error);
	assert_string_equal(json_string_value(json_object_get(a.error, "error")), "not_found");
	answer_free(&a);
	free(tok);
}

/* try_as: in a child, optionally drop to uid, connect and send a REQUEST;
 * exit 0 if the manager closed without answering anything. */
static void try_as(uid_t uid, const char *token)
{
	int st;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		struct answer a = { 0 };
		int fd;

		if (uid != 0 && setresuid(uid, uid, uid) < 0)
			_exit(2);
		fd = connect_mgr();
		if (fd < 0)
			_exit(3);
		wire_send_json(fd, WIRE_REQUEST, exec_req(token, "true"), NULL);
		read_answer(fd, &a);
		_exit(a.decision == NULL && a.frames == 0 && a.closed ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* test_peer_refused: another process (same uid, other pid) and another uid
 * (socket opened up on purpose so only SO_PEERCRED stands in the way) are
 * refused; the honest peer still works afterwards. */
static void test_peer_refused(void **state)
{
	char *tok = mint(sk, 1, "w1", TT_OP_EXEC);
	struct answer a;

	(void)state;
	try_as(0, tok);
	assert_int_equal(chmod(state_dir, 0711), 0);
	assert_int_equal(chmod(sock_path, 0666), 0);
	try_as(65534, tok);
	assert_int_equal(chmod(sock_path, 0600), 0);
	assert_int_equal(chmod(state_dir, 0700), 0);
	call(exec_req(tok, "echo still here"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "still here\n");
	answer_free(&a);
	free(tok);
}

/* test_garbage: non-frames and wrong first frames close the connection;
 * the manager stays up. */
static void test_garbage(void **state)
{
	char *tok = mint(sk, 1, "w1", TT_OP_EXEC);
	struct answer a = { 0 };
	uint8_t hdr[WIRE_HDR_LEN];
	int fd;

	(void)state;
	fd = connect_mgr();
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "GET / HTTP/1.1\r\n\r\n", 18), 18);
	read_answer(fd, &a);
	assert_true(a.closed && a.decision == NULL);
	close(fd);

	fd = connect_mgr();
	wire_hdr_encode(hdr, WIRE_REQUEST, WIRE_PAYLOAD_MAX + 1); /* oversized */
	hdr[11] = 0x01;
	assert_int_equal(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
	memset(&a, 0, sizeof(a));
	read_answer(fd, &a);
	assert_true(a.closed && a.decision == NULL);
	close(fd);

	fd = connect_mgr();
	assert_int_equal(wire_send(fd, WIRE_REQUEST, "{\"op\":1,\"op\":2}", 15, NULL), 0);
	memset(&a, 0, sizeof(a));
	read_answer(fd, &a);
	assert_null(a.decision);
	close(fd);
	answer_free(&a);

	assert_int_equal(waitpid(mgr_pid, NULL, WNOHANG), 0);
	call(exec_req(tok, "echo alive"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "alive\n");
	answer_free(&a);
	free(tok);
}

/* test_retire_and_replace: after retire, the gen-1 token gets RefreshRoute
 * (retired); after installing gen 2, gen-1 gets stale_execution and a
 * gen-2 token works. Across a manager restart the records come back. */
static void test_retire_and_replace(void **state)
{
	char *tok1 = mint(sk, 1, "w1", TT_OP_EXEC);
	char *tok2 = mint(sk, 2, "w1", TT_OP_EXEC);
	struct answer a;
	char dir[256];
	struct stat st;

	(void)state;
	/* A running operation holds a lease on the epoch: retiring the
	 * execution cancels it and tells the opener to refresh the route. */
	{
		int fd = connect_mgr();
		json_t *req = exec_req(tok1, "echo started; sleep 30");
		struct timespec t0, t1;

		assert_true(fd >= 0);
		assert_int_equal(wire_send_json(fd, WIRE_REQUEST, req, NULL), 0);
		json_decref(req);
		usleep(200 * 1000);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		assert_true(feed(json_pack("{s:I,s:s,s:s,s:s,s:I}", "rev", (json_int_t)3,
		                           "kind", "retire", "worker", "w1", "sandbox", SBX,
		                           "generation", (json_int_t)1)));
		memset(&a, 0, sizeof(a));
		read_answer(fd, &a);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		close(fd);
		expect_decision(&a, "allow", "ok");
		assert_string_equal(a.out, "started\n");
		assert_non_null(a.error);
		assert_string_equal(json_string_value(json_object_get(a.error, "error")),
		                    "refresh_route");
		assert_null(a.result);
		assert_true(t1.tv_sec - t0.tv_sec < 10);
		answer_free(&a);
	}
	assert_true(feed(json_pack("{s:I,s:s,s:s,s:s,s:I}", "rev", (json_int_t)3, "kind",
	                           "retire", "worker", "w1", "sandbox", SBX,
	                           "generation", (json_int_t)1)));
	call(exec_req(tok1, "true"), &a);
	expect_decision(&a, "refresh_route", "retired");
	answer_free(&a);

	assert_true(feed(install(4, 2, "w1")));
	call(exec_req(tok1, "true"), &a);
	expect_decision(&a, "refresh_route", "stale_execution");
	assert_int_equal(json_integer_value(json_object_get(a.decision,
	                                                    "installed_generation")), 2);
	answer_free(&a);
	call(exec_req(tok2, "echo gen2"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "gen2\n");
	answer_free(&a);

	/* A replayed older update is acknowledged without effect. */
	assert_true(feed(install(2, 1, "w1")));
	call(exec_req(tok2, "echo gen2"), &a);
	expect_decision(&a, "allow", "ok");
	answer_free(&a);

	/* Restart: the store remembers rev 4 and gen 2; the sandbox was
	 * stopped with the manager, so it is lost -> RefreshRoute. */
	stop_manager();
	start_manager();
	call(json_pack("{s:s}", "op", "status"), &a);
	assert_non_null(a.result);
	assert_int_equal(json_integer_value(json_object_get(a.result, "applied_rev")), 4);
	assert_int_equal(json_integer_value(json_object_get(
		json_array_get(json_object_get(a.result, "executions"), 0), "generation")), 2);
	assert_string_equal(json_string_value(json_object_get(
		json_array_get(json_object_get(a.result, "executions"), 0), "state")), "lost");
	answer_free(&a);
	call(exec_req(tok2, "true"), &a);
	expect_decision(&a, "refresh_route", "retired");
	answer_free(&a);

	/* destroy removes the record and the sandbox directory. */
	assert_true(feed(json_pack("{s:I,s:s,s:s,s:s}", "rev", (json_int_t)5, "kind",
	                           "destroy", "worker", "w1", "sandbox", SBX)));
	snprintf(dir, sizeof(dir), "%s/sandboxes/%s", state_dir, SBX);
	assert_int_equal(stat(dir, &st), -1);
	call(exec_req(tok2, "true"), &a);
	expect_decision(&a, "refresh_route", "not_installed");
	answer_free(&a);
	free(tok1);
	free(tok2);
}

/* pause_update: pause {sandbox, generation, snapshot "<sbx>/<gen>"} of
 * the_sbx. */
static json_t *pause_update(uint64_t rev, uint64_t gen)
{
	char key[64];

	snprintf(key, sizeof(key), "%s/%llu", the_sbx, (unsigned long long)gen);
	return json_pack("{s:I,s:s,s:s,s:s,s:I,s:s}", "rev", (json_int_t)rev, "kind",
	                 "pause", "worker", "w1", "sandbox", the_sbx, "generation",
	                 (json_int_t)gen, "snapshot", key);
}

/* install_from: an install of gen restoring snapshot key. */
static json_t *install_from(uint64_t rev, uint64_t gen, const char *key)
{
	json_t *u = install(rev, gen, "w1");

	json_object_set_new(u, "snapshot", json_string(key));
	return u;
}

/* test_pause_and_restore: pause retires at once, lets the in-flight exec
 * finish (its write is in the snapshot), publishes a checksummed snapshot
 * with progress frames before the RESULT, stops the processes; a second
 * pause is "not running here"; an install restores the snapshot byte for
 * byte; a missing snapshot fails the install. */
static void test_pause_and_restore(void **state)
{
	char *tok6 = mint(sk, 6, "w1", TT_OP_EXEC | TT_OP_FS_WRITE);
	char *tok7 = mint(sk, 7, "w1", TT_OP_EXEC);
	char *tok8 = mint(sk, 8, "w1", TT_OP_EXEC);
	char key[64], path[256];
	struct answer a, inflight;
	json_t *res, *snap;
	struct stat st;
	int fd;

	(void)state;
	assert_true(feed(install(6, 6, "w1")));
	call(exec_req(tok6, "echo keep >/workspace/k && head -c 3000000 /dev/urandom "
	                    ">/home/r && md5sum /home/r"), &a);
	expect_decision(&a, "allow", "ok");
	char sum[64];
	snprintf(sum, sizeof(sum), "%.32s", a.out);
	answer_free(&a);

	/* An operation in flight when the pause arrives. */
	fd = connect_mgr();
	assert_true(fd >= 0);
	{
		json_t *req = exec_req(tok6, "sleep 1; echo done >/workspace/late; echo finished");

		assert_int_equal(wire_send_json(fd, WIRE_REQUEST, req, NULL), 0);
		json_decref(req);
	}
	usleep(200 * 1000);
	call(json_pack("{s:s,s:[o]}", "op", "feed.apply", "updates", pause_update(7, 6)), &a);
	memset(&inflight, 0, sizeof(inflight));
	read_answer(fd, &inflight);
	close(fd);
	expect_decision(&inflight, "allow", "ok");
	assert_non_null(inflight.result);
	assert_string_equal(inflight.out, "finished\n");
	answer_free(&inflight);

	assert_non_null(a.result);
	assert_int_equal(json_integer_value(json_object_get(a.result, "applied_rev")), 7);
	res = json_array_get(json_object_get(a.result, "results"), 0);
	assert_true(json_is_true(json_object_get(res, "ok")));
	snap = json_object_get(res, "snapshot");
	snprintf(key, sizeof(key), "%s/6", SBX);
	assert_string_equal(json_string_value(json_object_get(snap, "key")), key);
	assert_int_equal(json_integer_value(json_object_get(snap, "generation")), 6);
	assert_true(json_integer_value(json_object_get(snap, "size")) > 3000000);
	assert_int_equal(strncmp(json_string_value(json_object_get(snap, "checksum")),
	                         "blake2b:", 8), 0);
	assert_int_equal(strlen(json_string_value(json_object_get(snap, "checksum"))), 8 + 64);
	/* Progress went out as DATA_OUT frames before the RESULT. */
	assert_non_null(strstr(a.out, "\"progress\""));
	answer_free(&a);
	snprintf(path, sizeof(path), "%s/snapshots/%s/6.meta", state_dir, SBX);
	assert_int_equal(stat(path, &st), 0);

	/* Retired: RefreshRoute. The same pause asked again (its answer was
	 * lost on the way to the cp) gets the published snapshot again, from
	 * the store: the same checksum, nothing paused twice. */
	call(exec_req(tok6, "true"), &a);
	expect_decision(&a, "refresh_route", "retired");
	answer_free(&a);
	{
		char sum1[80];
		struct answer b;

		call(json_pack("{s:s,s:[o]}", "op", "feed.apply", "updates", pause_update(7, 6)),
		     &a);
		call(json_pack("{s:s,s:[o]}", "op", "feed.apply", "updates", pause_update(8, 6)),
		     &b);
		res = json_array_get(json_object_get(a.result, "results"), 0);
		assert_true(json_is_true(json_object_get(res, "ok")));
		snprintf(sum1, sizeof(sum1), "%s", json_string_value(json_object_get(
		         json_object_get(res, "snapshot"), "checksum")));
		assert_int_equal(strlen(sum1), 8 + 64);
		res = json_array_get(json_object_get(b.result, "results"), 0);
		assert_true(json_is_true(json_object_get(res, "ok")));
		assert_string_equal(json_string_value(json_object_get(json_object_get(res,
		                    "snapshot"), "checksum")), sum1);
		assert_string_equal(json_string_value(json_object_get(json_object_get(res,
		                    "snapshot"), "key")), key);
		answer_free(&a);
		answer_free(&b);
	}

	/* Resume from the snapshot: same bytes, including the drained write. */
	assert_true(feed(install_from(9, 7, key)));
	call(exec_req(tok7, "cat /workspace/k /workspace/late; md5sum /home/r"), &a);
	expect_decision(&a, "allow", "ok");
	{
		char want[128];

		snprintf(want, sizeof(want), "keep\ndone\n%s  /home/r\n", sum);
		assert_string_equal(a.out, want);
	}
	answer_free(&a);

	/* A snapshot that is not in the store: the install fails, nothing runs. */
	snprintf(key, sizeof(key), "%s/5", SBX);
	assert_false(feed(install_from(10, 8, key)));
	call(exec_req(tok8, "true"), &a);
	expect_decision(&a, "refresh_route", "retired");
	answer_free(&a);
	free(tok6);
	free(tok7);
	free(tok8);
}

/* ---- a bridge the manager did not start (SPEC §5) -------------------------- */

/* mgr_log_has: the manager's log (state_dir/manager.log) holds needle. */
static bool mgr_log_has(const char *needle)
{
	char path[128], buf[65536];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/manager.log", state_dir);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return false;
	/* The tail is enough: the line was just written. */
	if (lseek(fd, 0, SEEK_END) > (off_t)sizeof(buf) - 1)
		lseek(fd, -(off_t)(sizeof(buf) - 1), SEEK_END);
	else
		lseek(fd, 0, SEEK_SET);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	return strstr(buf, needle) != NULL;
}

/* manager_bridge_pid: the bridge of SBX as the manager's status names it,
 * checked to be a tether-bridge child of the manager (the manager also
 * keeps a spare one, waiting for the next execution). */
static pid_t manager_bridge_pid(void)
{
	char path[64], line[512];
	struct answer a;
	json_t *list, *ex;
	pid_t found = 0;
	char *close_paren;
	int ppid = 0;
	size_t i;
	FILE *f;

	call(json_pack("{s:s}", "op", "status"), &a);
	assert_non_null(a.result);
	list = json_object_get(a.result, "executions");
	json_array_foreach(list, i, ex)
		if (strcmp(json_string_value(json_object_get(ex, "sandbox")), the_sbx) == 0)
			found = (pid_t)json_integer_value(json_object_get(ex, "bridge_pid"));
	answer_free(&a);
	assert_true(found > 0);
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)found);
	f = fopen(path, "re");
	assert_non_null(f);
	assert_non_null(fgets(line, sizeof(line), f));
	fclose(f);
	/* "pid (comm) state ppid": comm may hold anything, so the fields
	 * after it are read after the last ')'. */
	close_paren = strrchr(line, ')');
	assert_non_null(close_paren);
	assert_int_equal(sscanf(close_paren + 1, " %*c %d", &ppid), 1);
	assert_int_equal(ppid, (int)mgr_pid);
	assert_non_null(strstr(line, "(tether-bridge)"));
	return found;
}

/* manager_init_pid: the init of SBX as the manager's status names it. */
static pid_t manager_init_pid(void)
{
	struct answer a;
	json_t *ex;
	pid_t found = 0;
	size_t i;

	call(json_pack("{s:s}", "op", "status"), &a);
	assert_non_null(a.result);
	json_array_foreach(json_object_get(a.result, "executions"), i, ex)
		if (strcmp(json_string_value(json_object_get(ex, "sandbox")), the_sbx) == 0)
			found = (pid_t)json_integer_value(json_object_get(ex, "init_pid"));
	answer_free(&a);
	return found;
}

/* exec_state: the state of SBX in the manager's status ("" if absent). */
static void exec_state(char *out, size_t cap)
{
	struct answer a;
	json_t *list;
	size_t i;
	json_t *ex;

	call(json_pack("{s:s}", "op", "status"), &a);
	assert_non_null(a.result);
	out[0] = '\0';
	list = json_object_get(a.result, "executions");
	json_array_foreach(list, i, ex)
		if (strcmp(json_string_value(json_object_get(ex, "sandbox")), the_sbx) == 0)
			snprintf(out, cap, "%s", json_string_value(json_object_get(ex, "state")));
	answer_free(&a);
}

/* A recording impostor of the bridge, and the pipe that stops it. */
struct impostor {
	pid_t pid;
	int stop_wr;    /* closing it tells the impostor to exit */
	char rec[128];  /* every byte it received */
};

/* impostor_serve: accepts on l until stop_rd becomes readable (EOF),
 * appending each connection's bytes to out; never answers. Exits with the
 * number of connections it accepted (capped). */
static _Noreturn void impostor_serve(int l, int stop_rd, int out)
{
	int conns = 0;

	for (;;) {
		struct pollfd pf[2] = { { .fd = l, .events = POLLIN },
		                        { .fd = stop_rd, .events = POLLIN } };
		uint8_t buf[4096];
		ssize_t n;
		int c;

		if (poll(pf, 2, 30000) <= 0)
			_exit(conns > 100 ? 100 : conns);
		if (pf[1].revents != 0) {
			/* Stopping: a connection the manager made may still be
			 * pending in the backlog (the test can get its answer
			 * before we ran): count and record those too. */
			if (fcntl(l, F_SETFL, O_NONBLOCK) < 0 ||
			    (c = accept4(l, NULL, NULL, SOCK_CLOEXEC)) < 0)
				_exit(conns > 100 ? 100 : conns);
		} else if ((c = accept4(l, NULL, NULL, SOCK_CLOEXEC)) < 0) {
			continue;
		}
		conns++;
		/* Bounded: a peer that neither writes nor closes gets 3 s. */
		while ((n = tu_read_within(c, buf, sizeof(buf), 3000)) > 0)
			if (write(out, buf, (size_t)n) != n)
				_exit(101);
		close(c);
	}
}

/* impostor_start: a process (root, like the manager's real bridge) that
 * unlinks SBX's bridge.sock and binds its own listener there, as anything
 * with write access to the sandbox directory could. */
static void impostor_start(struct impostor *imp)
{
	char sock[160];
	int ready[2], stop[2];
	char c;

	snprintf(sock, sizeof(sock), "%s/sandboxes/%s/bridge.sock", state_dir, SBX);
	snprintf(imp->rec, sizeof(imp->rec), "%s/impostor.rec", state_dir);
	assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
	assert_int_equal(pipe2(stop, O_CLOEXEC), 0);
	imp->pid = fork();
	assert_true(imp->pid >= 0);
	if (imp->pid == 0) {
		int l, out;

		close(ready[0]);
		close(stop[1]);
		out = open(imp->rec, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
		unlink(sock);
		l = tu_unix_listen(sock, 16, SOCK_CLOEXEC);
		if (out < 0 || l < 0 || write(ready[1], "r", 1) != 1)
			_exit(102);
		impostor_serve(l, stop[0], out);
	}
	close(ready[1]);
	close(stop[0]);
	imp->stop_wr = stop[1];
	assert_int_equal(tu_read_within(ready[0], &c, 1, 5000), 1);
	close(ready[0]);
}

/* impostor_stop: stops it; the connections it accepted. */
static int impostor_stop(struct impostor *imp)
{
	int conns;

	close(imp->stop_wr);
	conns = tu_exit_code(imp->pid);
	imp->pid = 0;
	return conns;
}

/* impostor_bytes: bytes the impostor recorded (-1: no record). */
static off_t impostor_bytes(const struct impostor *imp)
{
	struct stat st;

	return stat(imp->rec, &st) < 0 ? -1 : st.st_size;
}

/* test_bridge_impostor: a bridge the manager did not start, in front of a
 * running execution through the real manager. (a) While the real bridge
 * lives, an impostor takes over bridge.sock: the manager connects to it,
 * refuses it by SO_PEERCRED/pidfd against the identity pinned at spawn
 * (the opener gets ERROR transport, the log and reason say wrong_peer),
 * and the impostor receives zero bytes. (b) The real bridge is killed and
 * an impostor takes the path: the execution is lost, admission answers
 * RefreshRoute, and nothing connects to the impostor. The honest path
 * works before and after: a fresh generation gets a new real bridge. */
static void test_bridge_impostor(void **state)
{
	char *tok9 = mint(sk, 9, "w1", TT_OP_EXEC);
	char *tok10 = mint(sk, 10, "w1", TT_OP_EXEC);
	struct impostor imp;
	struct answer a;
	struct wire_frame f;
	json_t *hreq;
	char st[32];
	pid_t bridge;
	int held;

	(void)state;
	/* The honest baseline on gen 9. */
	assert_true(feed(install(11, 9, "w1")));
	call(exec_req(tok9, "echo gen9"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "gen9\n");
	answer_free(&a);
	bridge = manager_bridge_pid();

	/* (a) The impostor stands at bridge.sock; the real bridge lives on.
	 * The connection the baseline left idle was verified when it was
	 * opened and still reaches the real bridge: an operation holds it
	 * (its DECISION is read first, so it was admitted and took the idle
	 * connection) while the next one must open a new connection. */
	impostor_start(&imp);
	held = connect_mgr();
	assert_true(held >= 0);
	hreq = exec_req(tok9, "sleep 0.5; echo held");
	assert_int_equal(wire_send_json(held, WIRE_REQUEST, hreq, NULL), 0);
	json_decref(hreq);
	assert_int_equal(wire_recv(held, &f, rbuf, sizeof(rbuf), NULL), 1);
	assert_int_equal(f.type, WIRE_DECISION);
	call(exec_req(tok9, "echo SECRET-ARG-must-not-leak"), &a);
	/* The manager did reach the impostor (one connection), and sent it
	 * nothing: the refusal was the verification, before any byte. */
	assert_int_equal(impostor_stop(&imp), 1);
	assert_int_equal(impostor_bytes(&imp), 0);
	expect_decision(&a, "allow", "ok");
	assert_null(a.result);
	assert_int_equal(a.out_len, 0);
	assert_non_null(a.error);
	assert_string_equal(json_string_value(json_object_get(a.error, "error")), "transport");
	assert_non_null(strstr(json_string_value(json_object_get(a.error, "message")),
	                       "bridge verification failed"));
	answer_free(&a);
	/* The held operation ran on the real bridge all along. */
	read_answer(held, &a);
	close(held);
	assert_non_null(a.result);
	assert_string_equal(a.out, "held\n");
	answer_free(&a);
	if (!mgr_log_has("refused bridge of " SBX " (wrong_peer)"))
		fail_msg("manager log has no wrong_peer refusal for %s", SBX);
	/* The real bridge was never replaced, only unreachable at the path. */
	assert_int_equal(kill(bridge, 0), 0);

	/* (b) The real bridge dies; the manager marks the execution lost
	 * before anyone can use the path, then an impostor takes it. */
	assert_int_equal(kill(bridge, SIGKILL), 0);
	for (int i = 0; i < 500; i++) {
		exec_state(st, sizeof(st));
		if (strcmp(st, "lost") == 0)
			break;
		usleep(10000);
	}
	assert_string_equal(st, "lost");
	impostor_start(&imp);
	call(exec_req(tok9, "echo SECRET-ARG-must-not-leak"), &a);
	expect_decision(&a, "refresh_route", "retired");
	assert_int_equal(a.frames, 0);
	answer_free(&a);
	assert_int_equal(impostor_stop(&imp), 0);
	assert_int_equal(impostor_bytes(&imp), 0);

	/* The honest path: a new generation, a new real bridge, served. */
	assert_true(feed(install(12, 10, "w1")));
	assert_true(manager_bridge_pid() != bridge);
	call(exec_req(tok10, "echo gen10"), &a);
	expect_decision(&a, "allow", "ok");
	assert_non_null(a.result);
	assert_string_equal(a.out, "gen10\n");
	answer_free(&a);
	call(exec_req(tok9, "true"), &a);
	expect_decision(&a, "refresh_route", "stale_execution");
	answer_free(&a);
	free(tok9);
	free(tok10);
}

static pid_t manager_child_pid(const char *comm, const char *arg);

/* cmdline_has: /proc/<pid>/cmdline holds the word arg. */
static bool cmdline_has(const char *pid, const char *arg)
{
	char path[300], buf[1024];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%s/cmdline", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
		if (strcmp(buf + i, arg) == 0)
			return true;
	return false;
}

/* manager_spare_pid: the manager's spare bridge (comm "bridge-spare", a
 * child of the manager), waited for up to 5 s: it is refilled right after
 * each install. 0 if none came. */
static pid_t manager_spare_pid(void)
{
	return manager_child_pid("(bridge-spare)", NULL);
}

/* manager_spare_sandbox_pid: the init of the manager's spare sandbox (its
 * agent waiting, comm "guest-spare"), waited for like manager_spare_pid. */
static pid_t manager_spare_sandbox_pid(void)
{
	return manager_child_pid("(guest-spare)", "--assign-fd");
}

/* manager_child_pid: a child of the manager whose stat holds comm and,
 * unless NULL, whose command line holds arg; waited for up to 5 s. */
static pid_t manager_child_pid(const char *comm, const char *arg)
{
	for (int tries = 0; tries < 500; tries++) {
		DIR *d = opendir("/proc");
		struct dirent *e;
		pid_t found = 0;

		assert_non_null(d);
		while (found == 0 && (e = readdir(d)) != NULL) {
			char path[300], line[512], *close_paren;
			int ppid = 0;
			FILE *f;

			if (e->d_name[0] < '1' || e->d_name[0] > '9')
				continue;
			snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
			if ((f = fopen(path, "re")) == NULL)
				continue;
			if (fgets(line, sizeof(line), f) == NULL)
				line[0] = '\0';
			fclose(f);
			close_paren = strrchr(line, ')');
			if (close_paren != NULL && strstr(line, comm) != NULL &&
			    sscanf(close_paren + 1, " %*c %d", &ppid) == 1 && ppid == (int)mgr_pid &&
			    (arg == NULL || cmdline_has(e->d_name, arg)))
				found = (pid_t)atoi(e->d_name);
		}
		closedir(d);
		if (found)
			return found;
		usleep(10000);
	}
	return 0;
}

/* test_spare_bridge: the manager starts each execution's sandbox and
 * bridge ahead (spares, waiting for their assignment). The install takes
 * both (the execution's init and bridge are those very processes) and new
 * spares are started; spares killed from outside while they wait are
 * noticed at the next install, which starts its own and serves as before. */
static void test_spare_bridge(void **state)
{
	char *tok13, *tok14, *tok15;
	struct answer a;
	pid_t spare, spare2, sandbox, sandbox2, sandbox3;
	int st;

	(void)state;
	the_sbx = SBX2; /* fresh: a spare sandbox serves only new sandboxes */
	tok13 = mint(sk, 13, "w1", TT_OP_EXEC);
	spare = manager_spare_pid();
	assert_true(spare > 0);
	sandbox = manager_spare_sandbox_pid();
	assert_true(sandbox > 0);
	assert_true(feed(install(13, 13, "w1")));
	assert_int_equal(manager_bridge_pid(), spare);
	assert_int_equal(manager_init_pid(), sandbox);
	call(exec_req(tok13, "echo gen13"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "gen13\n");
	answer_free(&a);
	spare2 = manager_spare_pid();
	assert_true(spare2 > 0 && spare2 != spare);
	sandbox2 = manager_spare_sandbox_pid();
	assert_true(sandbox2 > 0 && sandbox2 != sandbox);
	/* Both killed while waiting: the bridge a zombie of the manager's
	 * until it looks; the sandbox noticed at the claim. */
	assert_int_equal(kill(sandbox2, SIGKILL), 0);
	assert_int_equal(kill(spare2, SIGKILL), 0);
	for (int i = 0; i < 500; i++) {
		char path[64], line[256] = "";
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/stat", (int)spare2);
		if ((f = fopen(path, "re")) == NULL)
			break;
		st = fgets(line, sizeof(line), f) != NULL && strstr(line, ") Z ") != NULL;
		fclose(f);
		if (st)
			break;
		usleep(10000);
	}
	the_sbx = SBX3;
	tok14 = mint(sk, 14, "w1", TT_OP_EXEC);
	assert_true(feed(install(14, 14, "w1")));
	assert_true(manager_bridge_pid() != spare2);
	call(exec_req(tok14, "echo gen14"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "gen14\n");
	answer_free(&a);
	if (!mgr_log_has("exited while waiting; starting a new one"))
		fail_msg("manager log does not say the spare bridge was replaced");
	if (!mgr_log_has("the spare sandbox (init pid"))
		fail_msg("manager log does not say the spare sandbox was gone");
	assert_true(manager_init_pid() != sandbox2);
	/* Reaped, and fresh spares wait again. */
	assert_int_equal(kill(spare2, 0), -1);
	assert_true(manager_spare_pid() > 0);
	sandbox3 = manager_spare_sandbox_pid();
	assert_true(sandbox3 > 0);
	/* tether-guest replaced (an upgrade) while a spare agent waits: the
	 * next create does not get the old agent. */
	assert_int_equal(guest_install(), 0);
	the_sbx = SBX4;
	tok15 = mint(sk, 15, "w1", TT_OP_EXEC);
	assert_true(feed(install(15, 15, "w1")));
	assert_true(manager_init_pid() != sandbox3);
	call(exec_req(tok15, "echo gen15"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "gen15\n");
	answer_free(&a);
	if (!mgr_log_has("runs a replaced tether-guest: not used"))
		fail_msg("manager log does not say the old spare agent was dropped");
	the_sbx = SBX;
	free(tok13);
	free(tok14);
	free(tok15);
}

/* ---- a pause whose answer was lost ------------------------------------------ */

#define SBX5 "sbx_efghijklmnopqrstuvwxyzabcd"

static json_t *sbx_update(uint64_t rev, const char *kind, uint64_t gen);

/* store_gens: the generations of the_sbx in the snapshot store ("1 3"),
 * as files with their publication record. */
static void store_gens(char *out, size_t cap)
{
	size_t at = 0;

	out[0] = '\0';
	for (unsigned g = 1; g <= 9; g++) {
		char path[256];
		struct stat st;

		snprintf(path, sizeof(path), "%s/snapshots/%s/%u.meta", state_dir, the_sbx, g);
		if (stat(path, &st) == 0)
			at += (size_t)snprintf(out + at, cap - at, "%s%u", at ? " " : "", g);
	}
}

/* prune_update: prune {sandbox, generation, keep} of the_sbx. */
static json_t *prune_update(uint64_t rev, uint64_t gen, json_t *keep)
{
	return json_pack("{s:I,s:s,s:s,s:s,s:I,s:o}", "rev", (json_int_t)rev, "kind",
	                 "prune", "worker", "w1", "sandbox", the_sbx, "generation",
	                 (json_int_t)gen, "keep", keep);
}

/* test_pause_answer_lost: the manager is killed once its pause has
 * published the snapshot, before the answer went out; its successor,
 * given the same pause again, answers with that snapshot from the store
 * (before: "not running here", or ok without a snapshot, and the cp
 * failed the pause and later resumed from an older snapshot, losing the
 * writes this one holds). Then the cp's prune updates: what they do not
 * keep below their generation leaves the store, nothing newer does. */
static void test_pause_answer_lost(void **state)
{
	char *tok1, *tok2, key[64], path[256], got[64];
	struct answer a;
	json_t *res, *snap;
	struct stat st;
	int fd, wst;

	(void)state;
	the_sbx = SBX5;
	tok1 = mint(sk, 1, "w1", TT_OP_EXEC);
	tok2 = mint(sk, 2, "w1", TT_OP_EXEC);
	assert_true(feed(install(50, 1, "w1")));
	call(exec_req(tok1, "echo acknowledged >/workspace/a && head -c 4000000 /dev/urandom"
	                    " >/home/r"), &a);
	expect_decision(&a, "allow", "ok");
	answer_free(&a);
	/* The pause goes out; the manager dies as soon as it published. */
	fd = connect_mgr();
	assert_true(fd >= 0);
	{
		json_t *req = json_pack("{s:s,s:[o]}", "op", "feed.apply", "updates",
		                        seal(pause_update(51, 1)));

		assert_int_equal(wire_send_json(fd, WIRE_REQUEST, req, NULL), 0);
		json_decref(req);
	}
	snprintf(path, sizeof(path), "%s/snapshots/%s/1.meta", state_dir, the_sbx);
	for (int i = 0; i < 20000 && stat(path, &st) < 0; i++)
		usleep(500);
	assert_int_equal(kill(mgr_pid, SIGKILL), 0);
	assert_int_equal(waitpid(mgr_pid, &wst, 0), mgr_pid);
	close(fd);
	assert_int_equal(stat(path, &st), 0);
	start_manager();
	/* The same pause again (the node re-delivers it, or the cp asks). */
	call(json_pack("{s:s,s:[o]}", "op", "feed.apply", "updates", pause_update(51, 1)), &a);
	res = json_array_get(json_object_get(a.result, "results"), 0);
	assert_true(json_is_true(json_object_get(res, "ok")));
	snap = json_object_get(res, "snapshot");
	snprintf(key, sizeof(key), "%s/1", the_sbx);
	assert_string_equal(json_string_value(json_object_get(snap, "key")), key);
	assert_true(json_integer_value(json_object_get(snap, "size")) > 4000000);
	assert_int_equal(strlen(json_string_value(json_object_get(snap, "checksum"))), 8 + 64);
	answer_free(&a);
	/* Its layer is in the store now: the image is gone. */
	snprintf(path, sizeof(path), "%s/sandboxes/%s/layer.img", state_dir, the_sbx);
	assert_int_equal(stat(path, &st), -1);
	/* Resumed from it: the acknowledged write is there. */
	assert_true(feed(install_from(52, 2, key)));
	call(exec_req(tok2, "cat /workspace/a"), &a);
	expect_decision(&a, "allow", "ok");
	assert_string_equal(a.out, "acknowledged\n");
	answer_free(&a);

	/* Gens 2 and 3 paused too: 1 2 3 in the store. */
	assert_true(feed(pause_update(53, 2)));
	snprintf(key, sizeof(key), "%s/2", the_sbx);
	assert_true(feed(install_from(54, 3, key)));
	assert_true(feed(pause_update(55, 3)));
	store_gens(got, sizeof(got));
	assert_string_equal(got, "1 2 3");
	/* 3 acknowledged, 2 kept: 1 goes. */
	assert_true(feed(prune_update(56, 3, json_pack("[i,i]", 3, 2))));
	store_gens(got, sizeof(got));
	assert_string_equal(got, "2 3");
	/* An older prune arriving late removes nothing at or above its own
	 * generation, whatever it keeps. */
	assert_true(feed(prune_update(57, 2, json_pack("[]"))));
	store_gens(got, sizeof(got));
	assert_string_equal(got, "2 3");
	/* Malformed: refused, nothing removed. */
	assert_false(feed(prune_update(58, 3, json_pack("[s]", "x"))));
	store_gens(got, sizeof(got));
	assert_string_equal(got, "2 3");
	assert_true(feed(sbx_update(59, "destroy", 0)));
	store_gens(got, sizeof(got));
	assert_string_equal(got, "");
	the_sbx = SBX;
	free(tok1);
	free(tok2);
}

/* ---- every child reaped ---------------------------------------------------- */

/* zombie_children: children of pid (every thread's, from
 * /proc/<pid>/task/<tid>/children) in state Z. */
static int zombie_children(pid_t pid)
{
	char path[96];
	struct dirent *e;
	int zombies = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		char cpath[400], kids[8192];
		size_t len;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(cpath, sizeof(cpath), "%s/%s/children", path, e->d_name);
		if ((f = fopen(cpath, "re")) == NULL)
			continue;
		len = fread(kids, 1, sizeof(kids) - 1, f);
		fclose(f);
		kids[len] = '\0';
		for (char *tok = strtok(kids, " \n"); tok != NULL; tok = strtok(NULL, " \n")) {
			char spath[64], line[512] = "", *paren;
			FILE *sf;

			snprintf(spath, sizeof(spath), "/proc/%s/stat", tok);
			if ((sf = fopen(spath, "re")) == NULL)
				continue;
			if (fgets(line, sizeof(line), sf) == NULL)
				line[0] = '\0';
			fclose(sf);
			paren = strrchr(line, ')');
			if (paren != NULL && paren[1] == ' ' && paren[2] == 'Z')
				zombies++;
		}
	}
	closedir(d);
	return zombies;
}

/* settled_zombies: the manager's zombie children once what it reaps on
 * its own (a watcher's callback) had 2 s. */
static int settled_zombies(void)
{
	int z = 0;

	for (int i = 0; i < 200; i++) {
		if ((z = zombie_children(mgr_pid)) == 0)
			return 0;
		usleep(10000);
	}
	return z;
}

/* fresh_sbx: a sandbox id never installed before, numbered i. */
static void fresh_sbx(char *out, size_t cap, unsigned i)
{
	static const char b32[] = "abcdefghijklmnopqrstuvwxyz234567";

	snprintf(out, cap, "sbx_reapreapreapreapreapree%c%c%c", b32[(i >> 10) & 31],
	         b32[(i >> 5) & 31], b32[i & 31]);
}

/* sbx_update: a retire or destroy of the_sbx (gen 0: none named). */
static json_t *sbx_update(uint64_t rev, const char *kind, uint64_t gen)
{
	json_t *u = json_pack("{s:I,s:s,s:s,s:s}", "rev", (json_int_t)rev, "kind", kind,
	                      "worker", "w1", "sandbox", the_sbx);

	if (gen > 0)
		json_object_set_new(u, "generation", json_integer((json_int_t)gen));
	return u;
}

/* wait_state: the_sbx reaches state want in the manager's status (5 s). */
static bool wait_state(const char *want)
{
	char st[32];

	for (int i = 0; i < 500; i++) {
		exec_state(st, sizeof(st));
		if (strcmp(st, want) == 0)
			return true;
		usleep(10000);
	}
	return false;
}

/* test_children_reaped: every child the manager starts is reaped on every
 * way it ends: rm (destroy), retire, pause, a lost execution (its init or
 * its bridge killed from outside), a failed start, spares dropped. Before
 * the fix each stopped init stayed a zombie (a non-blocking pidfd made the
 * reaping waitid fail with EAGAIN): a long-lived worker ran out of pids. */
static void test_children_reaped(void **state)
{
	char ids[8][TT_SBX_ID_LEN + 1], key[64], *tok;
	uint64_t rev = 100;
	struct answer a;
	pid_t pid;

	(void)state;
	assert_int_equal(settled_zombies(), 0);
	/* create / exec / rm, 12 times. */
	for (unsigned i = 0; i < 12; i++) {
		fresh_sbx(ids[0], sizeof(ids[0]), i);
		the_sbx = ids[0];
		tok = mint(sk, 1, "w1", TT_OP_EXEC);
		assert_true(feed(install(rev++, 1, "w1")));
		call(exec_req(tok, "true"), &a);
		expect_decision(&a, "allow", "ok");
		answer_free(&a);
		free(tok);
		assert_true(feed(sbx_update(rev++, "destroy", 0)));
	}
	assert_int_equal(settled_zombies(), 0);

	/* pause, resume from the snapshot, retire, resume again, rm. */
	fresh_sbx(ids[1], sizeof(ids[1]), 100);
	the_sbx = ids[1];
	assert_true(feed(install(rev++, 1, "w1")));
	snprintf(key, sizeof(key), "%s/1", the_sbx);
	assert_true(feed(pause_update(rev++, 1)));
	assert_int_equal(settled_zombies(), 0);
	assert_true(feed(install_from(rev++, 2, key)));
	{
		/* A pause of gen 1 now that gen 2 runs: nothing to pause (its
		 * snapshot is published, but gen 1 is not what runs here). */
		struct answer b;
		json_t *res;

		call(json_pack("{s:s,s:[o]}", "op", "feed.apply", "updates",
		               pause_update(rev++, 1)), &b);
		res = json_array_get(json_object_get(b.result, "results"), 0);
		assert_true(json_is_false(json_object_get(res, "ok")));
		assert_non_null(strstr(json_string_value(json_object_get(res, "error")),
		                       "not running here"));
		answer_free(&b);
	}
	assert_true(feed(sbx_update(rev++, "retire", 2)));
	assert_int_equal(settled_zombies(), 0);
	assert_true(feed(install_from(rev++, 3, key)));

	/* Lost: its init killed from outside. */
	pid = manager_init_pid();
	assert_true(pid > 0);
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_true(wait_state("lost"));
	assert_int_equal(settled_zombies(), 0);
	assert_true(feed(sbx_update(rev++, "destroy", 0)));

	/* Lost: its bridge killed (the manager stops its init). */
	fresh_sbx(ids[2], sizeof(ids[2]), 101);
	the_sbx = ids[2];
	assert_true(feed(install(rev++, 1, "w1")));
	pid = manager_bridge_pid();
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_true(wait_state("lost"));
	assert_int_equal(settled_zombies(), 0);
	assert_true(feed(sbx_update(rev++, "destroy", 0)));

	/* Spares killed while waiting: reaped when the next create looks. */
	pid = manager_spare_sandbox_pid();
	assert_true(pid > 0);
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(kill(manager_spare_pid(), SIGKILL), 0);
	fresh_sbx(ids[3], sizeof(ids[3]), 102);
	the_sbx = ids[3];
	assert_true(feed(install(rev++, 1, "w1")));
	assert_int_equal(settled_zombies(), 0);
	assert_true(feed(sbx_update(rev++, "destroy", 0)));

	/* A start that fails: an agent that exits at once (an upgrade gone
	 * wrong); spares and the create's own launch fail alike. */
	{
		char cmd[600];

		snprintf(cmd, sizeof(cmd), "printf '#!/bin/sh\\nexit 3\\n' >%s.new && "
		         "chmod 0755 %s.new && mv -f %s.new %s", guest_copy, guest_copy,
		         guest_copy, guest_copy);
		assert_int_equal(system(cmd), 0);
	}
	fresh_sbx(ids[4], sizeof(ids[4]), 103);
	the_sbx = ids[4];
	assert_false(feed(install(rev++, 1, "w1")));
	assert_int_equal(settled_zombies(), 0);
	assert_int_equal(guest_install(), 0);
	assert_true(feed(sbx_update(rev++, "destroy", 0)));
	the_sbx = SBX;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_install_and_exec),
		cmocka_unit_test(test_secret_unreadable),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_peer_refused),
		cmocka_unit_test(test_garbage),
		cmocka_unit_test(test_retire_and_replace),
		cmocka_unit_test(test_pause_and_restore),
		cmocka_unit_test(test_bridge_impostor),
		cmocka_unit_test(test_spare_bridge),
		cmocka_unit_test(test_pause_answer_lost),
		cmocka_unit_test(test_children_reaped),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

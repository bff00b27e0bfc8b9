/* libFuzzer target: bridge_assignment_parse (a spare tether-bridge's
 * assignment: the activation secret, then the execution's options as
 * NUL-terminated words) on arbitrary bytes. It must never overrun; what it
 * accepts must name a whole execution and nothing else (no manager, no
 * fds: those are fixed at spawn), with NUL-terminated strings; and the
 * assignment the manager would write for those values (bridgectl_assign's
 * format) must parse back to the same. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/args.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* put: appends key and value (each with its NUL) or aborts. */
static void put(uint8_t *buf, size_t cap, size_t *len, const char *key, const char *val)
{
	size_t kl = strlen(key) + 1, vl = strlen(val) + 1;

	if (*len + kl + vl > cap)
		abort();
	memcpy(buf + *len, key, kl);
	memcpy(buf + *len + kl, val, vl);
	*len += kl + vl;
}

/* LLVMFuzzerTestOneInput: one input; aborts on a broken invariant. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t again[2 * BRIDGE_ASSIGN_MAX + 4 * PATH_MAX];
	struct bridge_args a, b;
	uint8_t secret[HELLO_SECRET_LEN], secret2[HELLO_SECRET_LEN];
	struct tt_err err;
	char gen[24], att[16], ipid[16], istart[24];
	size_t len = HELLO_SECRET_LEN;

	bridge_args_init(&a);
	if (bridge_assignment_parse(data, size, &a, secret, &err) < 0)
		return 0;
	if (memcmp(secret, data, HELLO_SECRET_LEN) != 0 ||
	    memchr(a.sbx, '\0', sizeof(a.sbx)) == NULL || !sbx_id_valid(a.sbx) ||
	    memchr(a.listen_path, '\0', sizeof(a.listen_path)) == NULL ||
	    memchr(a.guest_socket, '\0', sizeof(a.guest_socket)) == NULL ||
	    a.gen == 0 || a.init_pid <= 0 || a.init_start == 0 || a.manager_pid != 0 ||
	    a.secret_fd != -1 || a.ready_fd != -1 || a.assign_fd != -1)
		abort();
	/* The manager's encoding of the same values. */
	snprintf(gen, sizeof(gen), "%" PRIu64, a.gen);
	snprintf(att, sizeof(att), "%" PRIu32, a.att);
	snprintf(ipid, sizeof(ipid), "%d", (int)a.init_pid);
	snprintf(istart, sizeof(istart), "%llu", a.init_start);
	memcpy(again, secret, HELLO_SECRET_LEN);
	put(again, sizeof(again), &len, "--sbx", a.sbx);
	put(again, sizeof(again), &len, "--gen", gen);
	put(again, sizeof(again), &len, "--att", att);
	put(again, sizeof(again), &len, "--listen", a.listen_path);
	put(again, sizeof(again), &len, "--guest-socket", a.guest_socket);
	put(again, sizeof(again), &len, "--init-pid", ipid);
	put(again, sizeof(again), &len, "--init-start", istart);
	if (len > BRIDGE_ASSIGN_MAX)
		return 0; /* long paths: the manager refuses to send it */
	bridge_args_init(&b);
	if (bridge_assignment_parse(again, len, &b, secret2, &err) < 0 ||
	    memcmp(secret, secret2, sizeof(secret)) != 0 || strcmp(a.sbx, b.sbx) != 0 ||
	    a.gen != b.gen || a.att != b.att || strcmp(a.listen_path, b.listen_path) != 0 ||
	    strcmp(a.guest_socket, b.guest_socket) != 0 || a.init_pid != b.init_pid ||
	    a.init_start != b.init_start)
		abort();
	return 0;
}

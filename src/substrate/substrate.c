/* The substrate interface: see substrate.h. */
#include <stdio.h>
#include <string.h>

#include "substrate/substrate.h"

/* substrate_parse: see substrate.h. */
int substrate_parse(const char *name, enum substrate_kind *k)
{
	if (name != NULL && strcmp(name, "ns") == 0)
		*k = SUBSTRATE_NS;
	else if (name != NULL && strcmp(name, "microvm") == 0)
		*k = SUBSTRATE_MICROVM;
	else
		return -1;
	return 0;
}

/* substrate_name: see substrate.h. */
const char *substrate_name(enum substrate_kind k)
{
	return k == SUBSTRATE_MICROVM ? "microvm" : "ns";
}

/* substrate_exec_init: see substrate.h. */
void substrate_exec_init(struct substrate_exec *s, enum substrate_kind k)
{
	s->kind = k;
	ns_sandbox_init(&s->ns);
	microvm_init(&s->vm);
}

/* substrate_owner: see substrate.h. */
void substrate_owner(const struct substrate_exec *s, struct substrate_owner *o)
{
	if (s->kind == SUBSTRATE_MICROVM) {
		*o = (struct substrate_owner){ .pid = s->vm.pid, .pidfd = s->vm.pidfd,
		                               .start_time = s->vm.start_time,
		                               .socket = s->vm.chan, .transport = "vmchan" };
		return;
	}
	*o = (struct substrate_owner){ .pid = s->ns.init_pid, .pidfd = s->ns.pidfd,
	                               .start_time = s->ns.init_start_time,
	                               .socket = s->ns.guest_socket, .transport = "unix" };
}

/* substrate_stop: see substrate.h. */
int substrate_stop(struct substrate_exec *s, struct tt_err *err)
{
	return s->kind == SUBSTRATE_MICROVM ? microvm_stop(&s->vm, err)
	                                    : ns_sandbox_stop(&s->ns, err);
}

/* substrate_freeze: see substrate.h. */
int substrate_freeze(struct substrate_exec *s, unsigned timeout_ms, struct tt_err *err)
{
	return s->kind == SUBSTRATE_MICROVM ? microvm_pause(&s->vm, timeout_ms, err)
	                                    : ns_sandbox_freeze(&s->ns, timeout_ms, err);
}

/* substrate_snapshot_prepare: see substrate.h. */
int substrate_snapshot_prepare(const struct substrate_exec *s, const char *dir, uid_t uid,
                               struct tt_err *err)
{
	return s->kind == SUBSTRATE_MICROVM ? microvm_snapshot(&s->vm, dir, uid, 60000, err) : 0;
}

/* substrate_snapshot_tree: see substrate.h. */
int substrate_snapshot_tree(enum substrate_kind k, const char *dir, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s/%s", dir, k == SUBSTRATE_MICROVM ? MICROVM_DISK_DIR : "layer");

	return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* Refusal reasons of the bridge checks (see refusal.h). */
#include "refusal.h"

#include <stdio.h>

#include "metrics.h"

static const char *const refusal_names[REFUSAL_COUNT] = {
	[REFUSAL_WRONG_PEER] = "wrong_peer",
	[REFUSAL_VERIFY_ERROR] = "verify_error",
	[REFUSAL_PID_REUSED] = "pid_reused",
	[REFUSAL_EXE_CHANGED] = "exe_changed",
	[REFUSAL_OWNER_CHANGED] = "owner_changed",
	[REFUSAL_UID] = "uid",
	[REFUSAL_PEER_EXITED] = "peer_exited",
	[REFUSAL_LISTENER_REPLACED] = "listener_replaced",
	[REFUSAL_HANDSHAKE_CLOSED] = "handshake_closed",
	[REFUSAL_HANDSHAKE_MALFORMED] = "handshake_malformed",
	[REFUSAL_HANDSHAKE_TIMEOUT] = "handshake_timeout",
	[REFUSAL_WRONG_ACTIVATION] = "wrong_activation",
	[REFUSAL_GUEST_REFUSED] = "guest_refused",
	[REFUSAL_BAD_PROOF] = "bad_proof",
	[REFUSAL_ADOPT_MALFORMED] = "adopt_malformed",
	[REFUSAL_ADOPT_BAD_PROOF] = "adopt_bad_proof",
	[REFUSAL_ADOPT_REFUSED] = "adopt_refused",
	[REFUSAL_ADOPT_CLOSED] = "adopt_closed",
	[REFUSAL_ADOPT_TIMEOUT] = "adopt_timeout",
	[REFUSAL_ADOPT_INTERNAL] = "adopt_internal",
	[REFUSAL_NONE] = "none",
};

/* refusal_name: see refusal.h. */
const char *refusal_name(enum refusal r)
{
	if ((unsigned)r >= REFUSAL_COUNT)
		r = REFUSAL_WRONG_PEER;
	return refusal_names[r];
}

/* refusal_of: see refusal.h. */
enum refusal refusal_of(const struct tt_err *err)
{
	if (err->code != TT_ERR_VERIFY)
		return REFUSAL_VERIFY_ERROR;
	if (err->detail < 0 || err->detail >= REFUSAL_COUNT)
		return REFUSAL_WRONG_PEER;
	return (enum refusal)err->detail;
}

/* refusal_count: see refusal.h. */
void refusal_count(enum refusal r)
{
	char labels[64];

	snprintf(labels, sizeof(labels), "reason=\"%s\"", refusal_name(r));
	metrics_inc("tether_bridge_refusals_total", labels);
}

/* Refusal reasons of the bridge checks (SPEC §5): one metric label per
 * kind of evidence that failed, for tether_bridge_refusals_total{reason},
 * counted by the host bridge (src/bridge) and by the sbx-manager's check of
 * its bridges (src/manager/admit.c). The evidence library (lib/procid,
 * lib/sockdiag) names what failed as it fails: a TT_ERR_VERIFY error
 * carries the reason in err->detail (tt_err_verify, err.h); the message is
 * for people. Implementation: lib/refusal.c. */
#ifndef TT_REFUSAL_H
#define TT_REFUSAL_H

#include "err.h"

enum refusal {
	REFUSAL_WRONG_PEER = 0,  /* another process than the pinned one */
	REFUSAL_VERIFY_ERROR,    /* the check itself failed (I/O, ...) */
	REFUSAL_PID_REUSED,      /* same pid, another start time */
	REFUSAL_EXE_CHANGED,     /* same process, another executable */
	REFUSAL_OWNER_CHANGED,   /* the socket file has another owner */
	REFUSAL_UID,             /* the peer runs as another uid or gid */
	REFUSAL_PEER_EXITED,
	REFUSAL_LISTENER_REPLACED, /* no socket, or not the pinned listener */
	REFUSAL_HANDSHAKE_CLOSED,  /* guest handshake (src/bridge/bridge.c) */
	REFUSAL_HANDSHAKE_MALFORMED,
	REFUSAL_HANDSHAKE_TIMEOUT,
	REFUSAL_WRONG_ACTIVATION,
	REFUSAL_GUEST_REFUSED,
	REFUSAL_BAD_PROOF,
	REFUSAL_ADOPT_MALFORMED,   /* adoption (src/bridge/adopt.c) */
	REFUSAL_ADOPT_BAD_PROOF,
	REFUSAL_ADOPT_REFUSED,
	REFUSAL_ADOPT_CLOSED,
	REFUSAL_ADOPT_TIMEOUT,
	REFUSAL_ADOPT_INTERNAL,
	REFUSAL_NONE,              /* not a refusal: the check passed */
	REFUSAL_COUNT,
};

/* refusal_name: the metric label ("pid_reused", ...); an out-of-range
 * value is "wrong_peer". */
const char *refusal_name(enum refusal r);
/* refusal_of: the reason of a failed check: err->detail for TT_ERR_VERIFY,
 * REFUSAL_VERIFY_ERROR for any other error. */
enum refusal refusal_of(const struct tt_err *err);

/* refusal_count: counts one refusal in tether_bridge_refusals_total. */
void refusal_count(enum refusal r);

#endif

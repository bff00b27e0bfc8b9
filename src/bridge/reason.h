/* Refusal reasons of the bridge checks (SPEC §5), shared, header-only, by
 * the host bridge (src/bridge, its own binary) and the sbx-manager's check
 * of its bridges (src/manager/admit.c): one metric label per kind of
 * evidence that failed, for tether_bridge_refusals_total{reason}. The
 * evidence library (lib/procid, lib/sockdiag) says what failed in its
 * TT_ERR_VERIFY message; this maps the message to the label. */
#ifndef TT_BRIDGE_REASON_H
#define TT_BRIDGE_REASON_H

#include <string.h>

#include "err.h"

/* bridge_refusal_reason: the metric label for a failed check. Order
 * matters: "pid reused: ... changed during check" is pid reuse, not a
 * replaced file. */
static inline const char *bridge_refusal_reason(const struct tt_err *err)
{
	const char *m = err->msg;

	if (err->code != TT_ERR_VERIFY)
		return "verify_error"; /* the check itself failed (I/O, ...) */
	if (strstr(m, "pid reused") != NULL)
		return "pid_reused";
	if (strstr(m, "executable differs") != NULL)
		return "exe_changed";
	if (strstr(m, "socket file owner differs") != NULL)
		return "owner_changed";
	if (strstr(m, "uid differs") != NULL || strstr(m, "gid differs") != NULL)
		return "uid";
	if (strstr(m, "exited") != NULL)
		return "peer_exited";
	if (strstr(m, "no socket file") != NULL || strstr(m, "no listener bound") != NULL ||
	    strstr(m, "not held by") != NULL || strstr(m, "replaced during check") != NULL)
		return "listener_replaced";
	/* "peer pid differs", "peer pidfd names ...", "not visible". */
	return "wrong_peer";
}

#endif

#!/bin/bash
# The crash-safety proof suite (issue 12, "Proof suites": crash safety) on a
# cluster of its own: `tether up --workers 3` on free ports in a scratch
# state dir, 6 sandboxes spread over the workers, build/churn as background
# load the whole time (5 clients, a migrate loop), and ROUNDS rounds of
# kill -9, in turn, of the cp, its signer, the edge, a worker's node-api,
# another worker's sbx-manager, a sandbox's host bridge and another's guest
# agent (its init). For each kill: the time until a fresh capability and an
# exec on the affected sandbox succeed again through the edge, a write
# acknowledged before it read back, the capability taken before it
# replayed at its node, and what the system did; the cluster settles
# before the next kill. Afterwards churn's verdict (its exact model of
# acknowledged writes, appends and generations), no runtime record lost, no
# generation reused, admission still correct, and the table of kills.
# See tests/integration/crash_lib.sh.
#
# usage: scripts/crash.sh [ROUNDS]   (default 3; `make crash`)
# Environment: KEEP=1 keeps the scratch dir (state, logs, churn.err);
# CRASH_JSON=FILE keeps churn's JSON summary there; CRASH_BOUND (30 s),
# CRASH_SETTLE (60 s), CRASH_GAP (2 s), CRASH_VERIFY (60 s),
# CRASH_TARGETS, CRASH_SANDBOXES (6): see crash_lib.sh.
# Prints TAP ("ok"/"not ok" per kill and per invariant, figures as "#"
# comments); exit status 0 when every check held, 1 otherwise.
set -u
. "$(dirname "$0")/../tests/integration/lib.sh"
. "$ROOT/tests/integration/crash_lib.sh"
ROUNDS=${1:-3}
case $ROUNDS in '' | *[!0-9]*) echo "usage: scripts/crash.sh [ROUNDS]" >&2; exit 64 ;; esac
CRASH_CHURN_JSON=${CRASH_JSON:-}
TT_DETAIL_LINES=12

cluster_setup tether-crash
echo "# crash.sh: $ROUNDS round(s) of kill -9 ($CRASH_TARGETS); $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
crash_setup
t_start=$(date +%s)
for r in $(seq 0 $((ROUNDS - 1))); do
	echo "# round $((r + 1)) of $ROUNDS"
	crash_round "$r"
done
crash_verdict
crash_pause_ack
echo "# $KN kills in $(($(date +%s) - t_start)) s; load $(cut -d' ' -f1-3 /proc/loadavg)"
crash_cleanup
tap_done

#!/bin/bash
# tether-test: slow
# Crash safety under load (issue 12, "Proof suites"): one round of the
# crash suite (scripts/crash.sh, tests/integration/crash_lib.sh). A
# `tether up --workers 3` cluster, 6 sandboxes, build/churn as background
# load (migrations included), and kill -9 in turn of the cp, its signer,
# the edge, a worker's node-api, another's sbx-manager, a sandbox's bridge
# and another's guest agent. Per kill: operations on the affected sandbox
# succeed again within 30 s (the time as a comment), a write acknowledged
# before it reads back, the capability taken before it is refused at its
# node (or ran, where its execution lived on: never refused yet run, or
# allowed yet not run). Then: churn's verdict (0 wrong-incarnation answers,
# lost writes, stale reads, duplicated executions), no runtime record lost,
# no generation reused, admission still correct (an old capability refused
# everywhere, a forged and a garbage one denied, an honest exec served).
# About 2 minutes. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
CRASH_BOUND=${CRASH_BOUND:-30}
CRASH_SETTLE=${CRASH_SETTLE:-40}
CRASH_GAP=${CRASH_GAP:-1}
CRASH_VERIFY=${CRASH_VERIFY:-20}
. "$ROOT/tests/integration/crash_lib.sh"
TT_DETAIL_LINES=12
cluster_setup tether-crash-test
crash_setup
crash_round 0
crash_verdict
crash_pause_ack
crash_cleanup
tap_done

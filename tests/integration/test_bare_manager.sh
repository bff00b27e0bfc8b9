#!/bin/bash
# A bare sbx-manager (root: it makes namespaces), no cluster around it.
# - A spare sandbox that keeps failing to come up backs off instead of
#   spinning: with a guest binary it cannot execute (as during an upgrade
#   that has not finished) it retries after 250 ms, then 500 ms, 1 s, ...
#   up to 10 s, not in a hot loop (before: ~1900 attempts and ~0.75 s of
#   CPU per second, each making a network namespace). Once the binary is
#   executable again, the spare comes up within the backoff.
# - One manager per state directory: a second one started on it exits at
#   once with a clear error, and the first keeps its sandboxes (before, it
#   failed to adopt them, stopped them all and took over the socket).
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
workdir tether-bare-manager
MGR_PID=
at_exit 'stop_pid "$MGR_PID" 50'
if [ "$(id -u)" != 0 ]; then skip "spare backoff" "needs root"; tap_done; exit; fi

mkdir -p "$WORK/snap"
install -m 0644 "$ROOT/build/tether-guest" "$WORK/guest"
FEEDKEY=$("$ROOT/build/tether-signer" keygen "$WORK/feed.key" | sed -n 's/^public: //p')
"$ROOT/build/tetherd" manager --state "$WORK/state" --socket "$WORK/m.sock" \
	--worker-id wb --peer-pid $$ --peer-uid 0 --snapshots "$WORK/snap" \
	--guest-bin "$WORK/guest" --feed-key "$FEEDKEY" >"$WORK/mgr.log" 2>&1 &
MGR_PID=$!
sleep 3
attempts=$(grep -c "spare sandbox: .*Permission denied" "$WORK/mgr.log")
cpu=$(awk '{print $14 + $15}' "/proc/$MGR_PID/stat" 2>/dev/null)
hz=$(getconf CLK_TCK)
expect "a spare that cannot start is retried a few times in 3 s, not in a loop" \
	'[ "$attempts" -ge 2 ] && [ "$attempts" -le 6 ]' "$attempts attempts; log: $(tail -n 3 "$WORK/mgr.log")"
expect "the manager stays idle meanwhile (< 0.3 s of CPU in 3 s)" \
	'[ -n "$cpu" ] && [ "$cpu" -lt $((hz * 3 / 10)) ]' "cpu ticks: $cpu (hz $hz)"

# The binary becomes executable: the next retry (at most 2 s away now)
# brings the spare up.
chmod 0755 "$WORK/guest"
spare_of_ours() {
	local p
	for p in $(pgrep -x guest-spare); do
		[ "$(awk '/^PPid:/{print $2}' "/proc/$p/status" 2>/dev/null)" = "$MGR_PID" ] && return 0
	done
	return 1
}
if wait_until 60 spare_of_ours; then ok "once the binary is executable, the spare sandbox comes up"
else notok "once the binary is executable, the spare sandbox comes up" "$(tail -n 5 "$WORK/mgr.log"; pgrep -a -x guest-spare)"; fi

# A second manager on the same state directory.
spare_pid=$(for p in $(pgrep -x guest-spare); do
	[ "$(awk '/^PPid:/{print $2}' "/proc/$p/status" 2>/dev/null)" = "$MGR_PID" ] && echo "$p"; done | head -n 1)
timeout 10 "$ROOT/build/tetherd" manager --state "$WORK/state" --socket "$WORK/m2.sock" \
	--worker-id wb --peer-pid $$ --peer-uid 0 --snapshots "$WORK/snap" \
	--guest-bin "$WORK/guest" --feed-key "$FEEDKEY" >"$WORK/mgr2.log" 2>&1
rc=$?
expect "a second manager on the same state directory exits at once with a clear error" \
	'[ $rc = 1 ] && grep -q "another sbx-manager runs on this state directory" "$WORK/mgr2.log"' \
	"rc=$rc; $(cat "$WORK/mgr2.log")"
expect "... and the first manager and its spare sandbox run on" \
	'kill -0 "$MGR_PID" && [ -n "$spare_pid" ] && kill -0 "$spare_pid" && [ -S "$WORK/m.sock" ]' \
	"manager $MGR_PID, spare [$spare_pid]"
tap_done

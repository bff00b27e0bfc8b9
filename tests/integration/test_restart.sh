#!/bin/bash
# Restarts and crashes bring sandboxes back, and nothing acknowledged is lost
# (SPEC §7; issue 12 item 2). A real cluster (`tether up --workers 1`: cp,
# edge, w1) plus a worker w3 started by hand, so this script decides when it
# stops and starts. Each case writes a file through the edge, breaks
# something, and reads the file back through the edge while (or right
# after) it comes back:
# - the guest agent (the sandbox's init) SIGKILLed: re-activated in place,
#   same generation, next activation; `info` says so;
# - the host bridge SIGKILLed: likewise;
# - node-api SIGKILLed: its manager leaves the sandbox running (no "stop" on
#   the lifeline); the next node-api's manager adopts it: a process started
#   before is still there;
# - w3 stopped in order (SIGTERM): the sandbox is paused first (a complete
#   snapshot), the worker shows as stopping; an exec sent meanwhile waits,
#   and runs once w3 is back (resumed there, generation + 1);
# - w3 and every process of its sandbox SIGKILLed (a machine crash): the
#   next w3 relaunches it from its own layer as the next generation.
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-restart
T() { timeout 60 "$ROOT/build/tether" "$@"; }
at_exit 'stop_w3 200'
# rec FIELD: a column of the sandbox's record in w3's runtime.db.
rec() { sqlite3 "$STATE/workers/w3/runtime.db" "SELECT $1 FROM executions WHERE sbx='$ID'"; }
# field F: F of `tether info --json`.
field() { T info "$ID" --json | jget "d.get('$1')"; }
# read_back NAME WANT: an exec through the edge prints the file; ok when it
# is WANT; the time it took is in MS.
read_back() {
	local t0 out
	t0=$(date +%s%N)
	out=$(T exec "$ID" -- cat /workspace/f 2>&1)
	MS=$((($(date +%s%N) - t0) / 1000000))
	if [ "$out" = "$2" ]; then ok "$1 (${MS} ms)"; else notok "$1" "$out"; fi
}

cluster_up_or_bail "cluster up (cp, edge, w1)" 1
start_w3; okrc $? "w3 up"
ID=$(T create --worker w3 2>"$WORK/err")
expect "a sandbox on w3" '[ -n "$ID" ]' "$(cat "$WORK/err")"
T exec "$ID" -- sh -c 'echo one >/workspace/f' >/dev/null 2>&1

# ---- the guest agent dies ------------------------------------------------------------
kill -9 "$(rec init_pid)"
read_back "guest agent SIGKILLed: the next exec reads the file" one
expect "re-activated in place: generation 1, activation 2, with a note" \
	'[ "$(field generation) $(field activation)" = "1 2" ] && field note | grep -q "re-activated in place.*guest agent"' \
	"$(T info "$ID")"

# ---- the bridge dies -------------------------------------------------------------------
T exec "$ID" -- sh -c 'echo two >>/workspace/f' >/dev/null 2>&1
kill -9 "$(rec bridge_pid)"
read_back "host bridge SIGKILLed: the next exec reads the file" "$(printf 'one\ntwo')"
expect "re-activated in place: generation 1, activation 3" \
	'[ "$(field generation) $(field activation)" = "1 3" ] && field note | grep -q "bridge exited"' \
	"$(T info "$ID")"

# ---- node-api dies -----------------------------------------------------------------------
T exec "$ID" -- sh -c 'sleep 600 >/dev/null 2>&1 & echo $! >/tmp/bg' >/dev/null 2>&1
bg=$(T exec "$ID" -- cat /tmp/bg 2>/dev/null)
MGR=$(pgrep -f -o "tetherd manager --state $STATE/workers/w3( |$)")
{ kill -9 "$W3_PID"; wait "$W3_PID"; } 2>/dev/null
for _ in $(seq 1 50); do kill -0 "$MGR" 2>/dev/null || break; sleep 0.1; done
expect "node-api SIGKILLed: its manager exits and leaves the sandbox running" \
	'! kill -0 "$MGR" 2>/dev/null && grep -q "leaving 1 record" "$WORK/w3.log" && [ -n "$(rec init_pid)" ] && kill -0 "$(rec init_pid)"' \
	"$(tail -n 3 "$WORK/w3.log")"
start_w3; okrc $? "w3 started again"
read_back "after the restart the exec reads the file" "$(printf 'one\ntwo')"
alive=$(T exec "$ID" -- sh -c "kill -0 $bg && echo alive" 2>&1)
expect "adopted: the background process started before is still running" \
	'[ "$alive" = alive ] && [ "$(field generation) $(field activation)" = "1 3" ]' \
	"$alive; $(T info "$ID")"

# ---- an orderly stop, then back ----------------------------------------------------------
T exec "$ID" -- sh -c 'echo three >>/workspace/f' >/dev/null 2>&1
kill -TERM "$W3_PID"
for _ in $(seq 1 100); do [ "$(field state)" = paused ] && break; sleep 0.1; done
expect "w3 stops in order: the sandbox is paused first, to resume on w3" \
	'[ "$(field state)" = paused ] && [ "$(field resume_on)" = w3 ] && T workers | grep -q "^w3 *stopping"' \
	"$(T info "$ID"; T workers)"
wait "$W3_PID" 2>/dev/null
W3_PID=
expect "w3 exited after the pause" 'grep -q "every sandbox here is paused" "$WORK/w3.log"' \
	"$(tail -n 3 "$WORK/w3.log")"
( T exec "$ID" -- cat /workspace/f >"$WORK/during" 2>&1; echo $? >"$WORK/during.rc" ) &
waiter=$!
sleep 1.5
start_w3; okrc $? "w3 back"
wait "$waiter"
expect "an exec sent while w3 was stopped waited and read the file" \
	'[ "$(cat "$WORK/during.rc")" = 0 ] && [ "$(cat "$WORK/during")" = "$(printf "one\ntwo\nthree")" ]' \
	"rc $(cat "$WORK/during.rc"): $(cat "$WORK/during")"
expect "resumed on w3 as generation 2" \
	'[ "$(field state) $(field generation) $(field worker)" = "running 2 w3" ]' "$(T info "$ID")"

# ---- a crash: w3 and its sandbox's processes SIGKILLed -------------------------------------
T exec "$ID" -- sh -c 'echo four >>/workspace/f' >/dev/null 2>&1
ipid=$(rec init_pid)
bpid=$(rec bridge_pid)
MGR=$(pgrep -f -o "tetherd manager --state $STATE/workers/w3( |$)")
{
	kill -9 "$W3_PID" "$MGR" "$bpid"
	for p in $(cat /sys/fs/cgroup/pids/tether/"$ID"-g*/cgroup.procs 2>/dev/null) "$ipid"; do
		kill -9 "$p" 2>/dev/null
	done
	wait "$W3_PID"
} 2>/dev/null
W3_PID=
sleep 0.5
start_w3; okrc $? "w3 started after the crash"
read_back "after the crash the exec reads every acknowledged write" "$(printf 'one\ntwo\nthree\nfour')"
expect "relaunched from its own layer as generation 3, with a note" \
	'[ "$(field state) $(field generation) $(field worker)" = "running 3 w3" ] && field note | grep -q "relaunched as generation 3.*own layer"' \
	"$(T info "$ID")"

T rm "$ID" >/dev/null 2>&1
stop_w3
tap_done

#!/bin/bash
# tether up supervises its daemons (issue 12, "Restarts and crashes"):
# `tether up --workers 2` with a sandbox on each worker; kill -9 in turn
# the cp, the edge, w1's node-api and w2's sbx-manager. After each, tether
# up still runs, only the killed daemon has a new pid, the edge's /healthz
# answers, `tether ls` works and an exec on the sandbox succeeds again;
# the time until each does is printed as a comment. A worker that keeps
# dying right away is retried with growing delays (no busy loop) and
# comes back once it can. Ctrl-C then stops the workers before the cp,
# leaves no process, mount or loop device behind. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-supervise
TT_DETAIL_LINES=12

T() { timeout 60 "$ROOT/build/tether" "$@"; }
# The daemons, by the argv tether up gives them (this cluster's only).
cp_pid() { pgrep -f "tetherd cp --state $STATE/cp --listen 127.0.0.1:$BASE\$"; }
edge_pid() { pgrep -f "tetherd edge --listen 127.0.0.1:$((BASE + 1)) "; }
node_pid() { pgrep -f "tetherd node --id $1 --listen 127.0.0.1:$((BASE + 10 + ${1#w})) "; }
mgr_pid() { pgrep -f "tetherd manager --state $STATE/workers/$1 "; }
all_pids() { echo "cp=$(cp_pid) edge=$(edge_pid) w1=$(node_pid w1) w2=$(node_pid w2) m1=$(mgr_pid w1) m2=$(mgr_pid w2)"; }
healthz() { curl -sf -m 2 "http://127.0.0.1:$((BASE + 1))/healthz" >/dev/null; }
ls_ok() { T ls >/dev/null 2>&1; }
# exec_reads SBX WORD: an exec on SBX prints WORD (from /workspace/f).
exec_reads() { [ "$(timeout 20 "$ROOT/build/tether" exec "$1" -- cat /workspace/f 2>"$WORK/exec.err")" = "$2" ]; }

cluster_up_or_bail "tether up --workers 2" 2
A=$(T create --worker w1 2>"$WORK/e")
B=$(T create --worker w2 2>>"$WORK/e")
[[ $A =~ ^sbx_ && $B =~ ^sbx_ ]] || tap_bail "a sandbox on w1 and one on w2" "$(cat "$WORK/e")"
T exec "$A" -- sh -c 'echo a >/workspace/f' >/dev/null 2>&1
T exec "$B" -- sh -c 'echo b >/workspace/f' >/dev/null 2>&1
if exec_reads "$A" a && exec_reads "$B" b; then ok "a sandbox on each worker, a file in each"; else
	tap_bail "a sandbox on each worker" "$(cat "$WORK/exec.err")"; fi

# crash WHO PIDFN ARG SBX WORD [KNOWN]: kill -9 the one process PIDFN ARG
# names, then the checks; KNOWN explains an exec that does not come back.
crash() {
	local who=$1 fn=$2 arg=$3 sbx=$4 word=$5 known=${6:-} old new before after t0 t_new t_hz t_ls t_exec
	old=$($fn $arg)
	if [ -z "$old" ] || [ "$(echo "$old" | wc -w)" != 1 ]; then
		notok "$who: exactly one process to kill" "found: '$old'; $(all_pids)"
		return
	fi
	before=$(all_pids)
	t0=$(ms)
	kill -9 "$old"
	t_new=$(until_ms "$t0" 30 replaced)
	t_hz=$(until_ms "$t0" 30 healthz)
	t_ls=$(until_ms "$t0" 30 ls_ok)
	t_exec=$(until_ms "$t0" 40 exec_reads "$sbx" "$word")
	new=$($fn $arg)
	after=$(all_pids)
	kill -0 "$UP_PID" 2>/dev/null && ok "$who killed: tether up still runs" ||
		tap_bail "$who killed: tether up still runs" "$(tail -n 20 "$WORK/up.err")"
	[ -n "$t_new" ] && [ -n "$new" ] && [ "$new" != "$old" ] && ok "$who is back with a new pid ($old -> $new)" ||
		notok "$who is back with a new pid" "old $old, now '$new'; $(tail -n 12 "$WORK/up.err")"
	[ -n "$t_hz" ] && ok "$who killed: the edge's /healthz answers" || notok "$who killed: the edge's /healthz answers" "$(tail -n 8 "$WORK/up.err")"
	[ -n "$t_ls" ] && ok "$who killed: tether ls works" || notok "$who killed: tether ls works" "$(T ls 2>&1)"
	if [ -n "$t_exec" ]; then ok "$who killed: an exec on its sandbox succeeds again"
	elif [ -n "$known" ]; then notok "$who killed: an exec on its sandbox succeeds again -- FAILS: $known" "$(cat "$WORK/exec.err"; T info "$sbx" 2>&1 | head -n 3)"
	else notok "$who killed: an exec on its sandbox succeeds again" "$(cat "$WORK/exec.err")"; fi
	echo "# $who: after the kill, a new pid in $(in_ms "$t_new"), edge /healthz answers in $(in_ms "$t_hz"), tether ls in $(in_ms "$t_ls"), exec in $(in_ms "$t_exec")"
	LAST_BEFORE=$before LAST_AFTER=$after
}
# in_ms MS: "MS ms", or "never (bound passed)".
in_ms() { if [ -n "$1" ]; then echo "$1 ms"; else echo "never (bound passed)"; fi; }
# replaced: crash's PIDFN ARG names one process, not OLD.
replaced() {
	local p
	p=$($fn $arg)
	[ -n "$p" ] && [ "$p" != "$old" ]
}
# same FIELD...: the named fields of all_pids kept their value across the last crash.
same() {
	local f
	for f in "$@"; do
		[ "$(echo "$LAST_BEFORE" | tr ' ' '\n' | grep "^$f=")" = "$(echo "$LAST_AFTER" | tr ' ' '\n' | grep "^$f=")" ] || return 1
	done
}

crash cp cp_pid "" "$A" a
expect "... the edge and the workers were not restarted" "same edge w1 w2 m1 m2" "before: $LAST_BEFORE; after: $LAST_AFTER"
crash edge edge_pid "" "$A" a
expect "... the cp and the workers were not restarted" "same cp w1 w2 m1 m2" "before: $LAST_BEFORE; after: $LAST_AFTER"
crash "w1 node-api" node_pid w1 "$A" a \
	"a killed node-api's manager sees its lifeline close and stops every sandbox (log: 'node-api closed the lifeline', 'stopping: terminating bridges and sandboxes'); the restarted manager records the execution lost while the cp still says running; the node-api-death path is being fixed elsewhere"
expect "... the cp, the edge and w2 were not restarted" "same cp edge w2 m2" "before: $LAST_BEFORE; after: $LAST_AFTER"
exec_reads "$B" b && ok "... the sandbox on w2 was not disturbed" || notok "sandbox on w2 after w1's node-api died" "$(cat "$WORK/exec.err")"
crash "w2 sbx-manager" mgr_pid w2 "$B" b
expect "... the cp, the edge and w1 were not restarted" "same cp edge w1 m1" "before: $LAST_BEFORE; after: $LAST_AFTER"
grep -q "tether: cp was killed by signal 9 (Killed); restarting it (attempt 1)" "$WORK/up.err" &&
	grep -q "^tether: w2 exited with status 1; restarting it (attempt 1)" "$WORK/up.err" &&
	grep -q -- "--- last lines of $STATE/logs/w1.log ---" "$WORK/up.err" &&
	ok "each death is one line on stderr with the daemon's log tail" || notok "death lines" "$(grep '^tether' "$WORK/up.err")"

# ---- a worker that keeps dying right away ----------------------------------------------
# runtime.db swapped for a directory: every manager start fails at once.
db=$STATE/workers/w2/runtime.db
lines0=$(grep -c '^tether: w2 ' "$WORK/up.err")
mv "$db" "$db.away" && mkdir "$db"
kill -9 "$(mgr_pid w2)"
sleep 7
loop=$(grep '^tether: w2 ' "$WORK/up.err" | tail -n +$((lines0 + 1)))
rmdir "$db" && mv "$db.away" "$db"
n_restarts=$(echo "$loop" | grep -c 'restarting it')
echo "# w2 failing for 7 s: $n_restarts restarts"
[ "$n_restarts" -ge 3 ] && [ "$n_restarts" -le 8 ] && echo "$loop" | grep -q 'restarting it in [0-9.]* s (attempt [0-9]*); it keeps dying right away' &&
	ok "a worker dying right away is retried with backoff ($n_restarts restarts in 7 s), and said so" ||
	notok "crash loop retried with backoff" "$loop"
t0=$(ms)
t_b=$(until_ms "$t0" 30 exec_reads "$B" b)
[ -n "$t_b" ] && ok "once it can start, w2 is back and its sandbox answers (after ${t_b} ms)" ||
	notok "w2 back after the crash loop" "$(cat "$WORK/exec.err"; grep '^tether: w2' "$WORK/up.err" | tail -n 3)"

# ---- Ctrl-C: the workers first, the cp last ------------------------------------------------
# A pause in progress when the stop begins (a 150 MB layer: it takes a
# while): the stop says what became of it.
T exec "$B" -- sh -c 'head -c 150000000 /dev/urandom >/workspace/big' >/dev/null 2>&1
curl -s -m 10 -o /dev/null -X POST -H "Authorization: Bearer $(cluster_key)" "$CP/v1/sandboxes/$B/pause?wait=0"
# Everything of this cluster (tether up reaps the orphans: all descend from it).
descendants() {
	local p
	for p in $(pgrep -P "$1"); do echo "$p:$(cut -d' ' -f22 /proc/"$p"/stat 2>/dev/null)"; descendants "$p"; done
}
procs=$(descendants "$UP_PID")
kill -INT "$UP_PID"
for _ in $(seq 1 600); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$UP_PID" 2>/dev/null; then notok "Ctrl-C: tether up exits within 60 s" "$(tail -n 10 "$WORK/up.err")"; else
	wait "$UP_PID"; rc=$?
	[ "$rc" = 0 ] && ok "Ctrl-C: tether up exits 0" || notok "Ctrl-C: exit status" "rc $rc; $(tail -n 10 "$WORK/up.err")"
fi
UP_PID=
sed -n '/Interrupt received/,$p' "$WORK/up.err" | sed 's/^/# stop: /'
grep -Eq '^stopped: [0-9]+ sandbox(es)? paused' "$WORK/up.err" && ok "the stop says what became of the sandboxes it paused" ||
	notok "stop reports the pausing sandbox" "$(sed -n '/Interrupt received/,$p' "$WORK/up.err")"
# line_ms: the time of each line on stdin (RFC 3339, "…THH:MM:SS.mmmZ",
# leading a log line or as an access record's "ts"), in ms of the day.
line_ms() {
	awk 'match($0, /T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9][0-9][0-9]Z/) {
		split(substr($0, RSTART + 1, 12), t, /[:.]/)
		print ((t[1] * 60 + t[2]) * 60 + t[3]) * 1000 + t[4] }'
}
# last_ms LOG: the time of a log's last line, in ms of the day.
last_ms() { tail -n 1 "$1" | line_ms; }
w1e=$(last_ms "$STATE/logs/w1.log") w2e=$(last_ms "$STATE/logs/w2.log") ee=$(last_ms "$STATE/logs/edge.log") ce=$(last_ms "$STATE/logs/cp.log")
# the cp's own stop: its last "signal" line
cs=$(grep 'signal 15: shutting down' "$STATE/logs/cp.log" | tail -n 1 | line_ms)
es=$(grep 'signal 15: stopping' "$STATE/logs/edge.log" | tail -n 1 | line_ms)
echo "# last lines (ms of the day): w1 $w1e, w2 $w2e, edge stop $es .. $ee, cp stop $cs .. $ce"
[ -n "$cs" ] && [ -n "$es" ] && [ "$w1e" -le "$es" ] && [ "$w2e" -le "$es" ] && [ "$ee" -le "$cs" ] &&
	ok "stop order: the workers' logs end before the edge is signalled, the edge's before the cp's stop" ||
	notok "stop order" "$(for f in w1 w2 edge cp; do tail -n 2 "$STATE/logs/$f.log"; done)"
left=""
for ps in $procs; do
	p=${ps%%:*} st=${ps#*:}
	[ -n "$st" ] && [ "$(cut -d' ' -f22 /proc/"$p"/stat 2>/dev/null)" = "$st" ] && left="$left $(tr '\0' ' ' </proc/"$p"/cmdline | cut -c1-80)"
done
[ -z "$left" ] && ok "every process of the cluster is gone ($(echo "$procs" | wc -w) were running)" || notok "processes left" "$left"
mnts=$(grep -c " $STATE/" /proc/self/mountinfo)
loops=$(losetup -a | grep -c -- "$STATE/")
[ "$mnts" = 0 ] && [ "$loops" = 0 ] && ok "no mount or loop device left under the state dir" ||
	notok "leftover mounts" "$mnts mount(s), $loops loop(s): $(grep " $STATE/" /proc/self/mountinfo; losetup -a | grep -- "$STATE/")"
tap_done

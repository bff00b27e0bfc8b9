#!/bin/bash
# tether-test: alone (its CPU figures need the machine to itself)
# A CPU cap per sandbox, asked at create (issue 13, item 5; SPEC §9), on a
# real cluster (`tether up --workers 2`) plus a hand-started worker w3 run
# with no CPU cap of its own (--cpu-millis 0):
#  - POST /v1/sandboxes refuses a bad "cpu" with 400 and creates nothing
#    (cp.db has no new row); good values are taken, and shown by the API
#    and `tether info`;
#  - a sandbox created with cpu 250 and two busy loops uses ~0.25 CPU,
#    measured from its cgroup's tasks (schedstat) over 3 s, and is
#    throttled; one created without (the worker's default, one CPU) uses
#    ~1 CPU;
#  - the cap survives a migrate to w2 (measured again there), and is in
#    w2's runtime record;
#  - on w3 (no default cap: its spare has no cpu cgroup, so a capped
#    create starts fresh) the cap holds, then survives a crash of w3 (the
#    relaunch from its own layer), node-api's death and the manager's
#    adoption of the sandbox, and a re-activation in place.
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-cpu
TT_DETAIL_LINES=12
EDGE=http://127.0.0.1:$((BASE + 1))
TT_BODY=$WORK/r
TT_HDRS=$WORK/h

T() { timeout 120 "$ROOT/build/tether" "$@"; }
at_exit 'stop_w3 200'
# field ID F: F of `tether info ID --json` (Python repr: None for null).
field() { T info "$1" --json | jget "d.get('$2')"; }
# cpu_cg ID: the cpu cgroup of ID's current generation.
cpu_cg() { echo "/sys/fs/cgroup/cpu/tether/$1-g$(field "$1" generation)"; }
# quota ID: its cgroup's cpu.cfs_quota_us/cpu.cfs_period_us.
quota() {
	local cg
	cg=$(cpu_cg "$1")
	echo "$(cat "$cg/cpu.cfs_quota_us" 2>/dev/null)/$(cat "$cg/cpu.cfs_period_us" 2>/dev/null)"
}
# throttled ID: nr_throttled of its cgroup.
throttled() { awk '/^nr_throttled/ {print $2}' "$(cpu_cg "$1")/cpu.stat" 2>/dev/null; }
# cpu_used ID SECONDS: CPU seconds per second the tasks of ID's cgroup ran
# (their schedstat run time, ns), over SECONDS.
cpu_used() {
	python3 - "$(cpu_cg "$1")" "$2" <<'EOF'
import sys, time
cg, secs = sys.argv[1], float(sys.argv[2])
def snap():
    out = {}
    for t in open(cg + "/tasks").read().split():
        try:
            out[t] = int(open("/proc/%s/schedstat" % t).read().split()[0])
        except OSError:
            pass
    return out
a = snap()
time.sleep(secs)
b = snap()
print("%.3f" % (sum(b[t] - a[t] for t in a if t in b) / secs / 1e9))
EOF
}
# in_range V LO HI: LO <= V <= HI (decimals).
in_range() { python3 -c 'import sys; lo, v, hi = map(float, sys.argv[1:]); sys.exit(not lo <= v <= hi)' "$2" "$1" "$3"; }
BURN='rm -f /tmp/burn; for i in 1 2; do (while :; do :; done) >/dev/null 2>&1 & echo $! >>/tmp/burn; done; echo started'
UNBURN='kill $(cat /tmp/burn)'
# measure ID LO HI NAME: two busy loops in ID, then its CPU use over 3 s;
# ok when within LO..HI (and, with LO < 0.5, its cgroup was throttled).
measure() {
	local used thr0 thr1 out
	out=$(T exec "$1" -- sh -c "$BURN" 2>&1)
	[ "$out" = started ] || { notok "$4" "burn: $out"; return; }
	sleep 1
	thr0=$(throttled "$1")
	used=$(cpu_used "$1" 3)
	thr1=$(throttled "$1")
	T exec "$1" -- sh -c "$UNBURN" >/dev/null 2>&1
	echo "# $1: $used CPU with two busy loops; throttled $((${thr1:-0} - ${thr0:-0})) periods in the 3 s"
	if in_range "$used" "$2" "$3" &&
		{ python3 -c "import sys; sys.exit(not $2 >= 0.5)" || [ "$((${thr1:-0} - ${thr0:-0}))" -gt 0 ]; }; then
		ok "$4: $used CPU"
	else
		notok "$4" "used $used (want $2..$3), throttled ${thr0:-?} -> ${thr1:-?}"
	fi
}
# rows: the sandboxes cp.db holds (deleted ones too).
rows() { sqlite3 "file:$STATE/cp/cp.db?mode=ro" "SELECT count(*) FROM sandboxes"; }
# rec W ID COL: a column of ID's record in worker W's runtime.db.
rec() { sqlite3 "file:$STATE/workers/$1/runtime.db?mode=ro" "SELECT $3 FROM executions WHERE sbx='$2'"; }

cluster_up_or_bail "tether up: cluster with w1, w2" 2
KEY=$(cluster_key)

# ---- bad values: 400, nothing created ---------------------------------------------------
before=$(rows)
bad=0 detail=
for b in '{"cpu":99}' '{"cpu":0}' '{"cpu":-250}' '{"cpu":64001}' '{"cpu":"250"}' \
	'{"cpu":0.5}' '{"cpu":true}' '{"cpu":[250]}' '{"cpu":{}}' '{"cpu":1e3}' \
	'{"worker":"w1","cpu":99999999999999999}' '{"cpu":250,"cpu":300}'; do
	st=$(req_status POST "$EDGE/v1/sandboxes" "Bearer $KEY" "$b")
	if [ "$st" != 400 ]; then bad=$((bad + 1)); detail+="$b -> $st $(cat "$TT_BODY"); "; fi
done
expect "12 bad cpu values (out of 100..64000, not an integer, duplicated) are refused with 400" \
	'[ "$bad" = 0 ]' "$detail"
req_status POST "$EDGE/v1/sandboxes" "Bearer $KEY" '{"cpu":64001}' >/dev/null
expect "the 400 says what cpu takes" \
	'jfield "[\"message\"]" | grep -q "cpu must be an integer number of millicores, 100..64000"' \
	"$(cat "$TT_BODY")"
T create --worker w1 --cpu 50 >"$WORK/out" 2>"$WORK/err"; rc=$?
expect "tether create --cpu 50: exit 1 with the control plane's reason" \
	'[ "$rc" = 1 ] && grep -q "cpu must be an integer number of millicores" "$WORK/err"' \
	"rc $rc: $(cat "$WORK/out" "$WORK/err")"
T create --cpu 0.5 >"$WORK/out" 2>"$WORK/err"; rc=$?
expect "tether create --cpu 0.5: a usage error that says 0.5 CPU is --cpu 500" \
	'[ "$rc" = 1 ] && grep -q "0.5 CPU is --cpu 500" "$WORK/err"' "rc $rc: $(cat "$WORK/err")"
after=$(rows)
expect "nothing was created by the refusals (cp.db: $before sandboxes before, $after after)" \
	'[ "$before" = "$after" ] && [ -n "$before" ]' "before $before, after $after"

# ---- good values -----------------------------------------------------------------------
st=$(req_status POST "$EDGE/v1/sandboxes" "Bearer $KEY" '{"worker":"w2","cpu":100}')
expect "POST {\"cpu\":100} (the lower bound): 201, the answer says cpu 100" \
	'[ "$st" = 201 ] && [ "$(jfield "[\"cpu\"]")" = 100 ]' "$st $(cat "$TT_BODY")"
LOW=$(jfield '["id"]' 2>/dev/null)
st=$(req_status POST "$EDGE/v1/sandboxes" "Bearer $KEY" '{"worker":"w2","cpu":null}')
expect "POST {\"cpu\":null}: 201, cpu null (the worker's default)" \
	'[ "$st" = 201 ] && [ "$(jfield "[\"cpu\"]")" = None ]' "$st $(cat "$TT_BODY")"
NUL=$(jfield '["id"]' 2>/dev/null)
T rm "$LOW" "$NUL" >/dev/null 2>&1

A=$(T create --worker w1 --cpu 250 2>"$WORK/e")
B=$(T create --worker w1 2>>"$WORK/e")
[[ $A =~ ^sbx_ && $B =~ ^sbx_ ]] && ok "A (--cpu 250) and B (no --cpu) on w1" ||
	tap_bail "two sandboxes" "$(cat "$WORK/e")"
expect "tether info: A's cpu is 250 millicores, B's the worker's default" \
	'T info "$A" | grep -q "^cpu: *250 millicores (0.25 CPU)" && T info "$B" | grep -q "^cpu: *the worker.s default" && [ "$(field "$A" cpu)" = 250 ] && [ "$(field "$B" cpu)" = None ]' \
	"$(T info "$A"; T info "$B")"
expect "cp.db stores A's cap with it" \
	'[ "$(sqlite3 "file:$STATE/cp/cp.db?mode=ro" "SELECT cpu FROM sandboxes WHERE id='"'$A'"'")" = 250 ]' ""
expect "A's cgroup: quota 25000 us per 100000 us; B's 100000 (one CPU, w1's --cpu-millis default)" \
	'[ "$(quota "$A")" = 25000/100000 ] && [ "$(quota "$B")" = 100000/100000 ]' \
	"A $(quota "$A"), B $(quota "$B")"
expect "w1's runtime records: A asked 250, B nothing (0)" \
	'[ "$(rec w1 "$A" cpu_millis)" = 250 ] && [ "$(rec w1 "$B" cpu_millis)" = 0 ]' \
	"A $(rec w1 "$A" cpu_millis), B $(rec w1 "$B" cpu_millis)"

# ---- the cap holds ----------------------------------------------------------------------
measure "$A" 0.15 0.40 "A (cpu 250), two busy loops: held to ~0.25 CPU, throttled"
measure "$B" 0.70 1.15 "B (the default, one CPU), two busy loops: ~1 CPU"

# ---- migrate: the new worker's install carries it ----------------------------------------
T migrate "$A" --worker w2 -q >"$WORK/e" 2>&1 || notok "migrate A to w2" "$(cat "$WORK/e")"
expect "A migrated: running on w2 as generation 2, still cpu 250" \
	'[ "$(field "$A" state) $(field "$A" worker) $(field "$A" generation) $(field "$A" cpu)" = "running w2 2 250" ]' \
	"$(T info "$A")"
expect "on w2: A's cgroup has quota 25000, and w2's runtime record says 250" \
	'[ "$(quota "$A")" = 25000/100000 ] && [ "$(rec w2 "$A" cpu_millis)" = 250 ]' \
	"quota $(quota "$A"), record $(rec w2 "$A" cpu_millis)"
measure "$A" 0.15 0.40 "A on w2 after the migrate, two busy loops: still ~0.25 CPU"
T migrate "$B" --worker w2 -q >"$WORK/e" 2>&1 || notok "migrate B to w2" "$(cat "$WORK/e")"
expect "B migrated to w2 keeps the default: quota 100000, nothing asked" \
	'[ "$(quota "$B")" = 100000/100000 ] && [ "$(rec w2 "$B" cpu_millis)" = 0 ] && [ "$(field "$B" cpu)" = None ]' \
	"quota $(quota "$B"), record $(rec w2 "$B" cpu_millis)"
T rm "$A" "$B" >/dev/null 2>&1

# ---- w3, without a default cap: crash, adoption, re-activation ----------------------------------
if start_w3 --cpu-millis 0; then ok "worker w3 up with --cpu-millis 0 (no default cap)"; else
	tap_bail "worker w3 up" "$(tail -n 5 "$WORK/w3.log")"; fi
D=$(T create --worker w3 2>"$WORK/e")
C=$(T create --worker w3 --cpu 300 2>>"$WORK/e")
[[ $C =~ ^sbx_ && $D =~ ^sbx_ ]] && ok "C (--cpu 300) and D (no --cpu) on w3" ||
	notok "two sandboxes on w3" "$(cat "$WORK/e")"
expect "w3: C's cgroup has quota 30000; D has no cpu cgroup (no cap at all)" \
	'[ "$(quota "$C")" = 30000/100000 ] && [ ! -e "$(cpu_cg "$D")" ]' \
	"C $(quota "$C"), D $(ls -d "$(cpu_cg "$D")" 2>&1)"
measure "$C" 0.18 0.45 "C (cpu 300) on w3, two busy loops: held to ~0.3 CPU"
T rm "$D" >/dev/null 2>&1
T exec "$C" -- sh -c 'echo kept >/workspace/f' >/dev/null 2>&1

# a crash: w3 and every process of C SIGKILLed; the next w3 relaunches it
ipid=$(rec w3 "$C" init_pid)
bpid=$(rec w3 "$C" bridge_pid)
MGR=$(pgrep -f -o "tetherd manager --state $STATE/workers/w3( |$)")
{
	kill -9 "$W3_PID" "$MGR" "$bpid"
	for p in $(cat /sys/fs/cgroup/pids/tether/"$C"-g*/cgroup.procs 2>/dev/null) "$ipid"; do
		kill -9 "$p" 2>/dev/null
	done
	wait "$W3_PID"
} 2>/dev/null
W3_PID=
sleep 0.5
start_w3 --cpu-millis 0; okrc $? "w3 started again after the crash"
r=$(T exec "$C" -- cat /workspace/f 2>&1)
expect "C relaunched from its own layer as generation 2, its file kept" \
	'[ "$r" = kept ] && [ "$(field "$C" generation)" = 2 ] && field "$C" note | grep -q "own layer"' \
	"$r; $(T info "$C")"
expect "the relaunch kept the cap: quota 30000, record 300" \
	'[ "$(quota "$C")" = 30000/100000 ] && [ "$(rec w3 "$C" cpu_millis)" = 300 ]' \
	"quota $(quota "$C"), record $(rec w3 "$C" cpu_millis)"

# node-api dies: its manager leaves C running; the next one adopts it
ipid=$(rec w3 "$C" init_pid)
{ kill -9 "$W3_PID"; wait "$W3_PID"; } 2>/dev/null
W3_PID=
sleep 1
start_w3 --cpu-millis 0; okrc $? "w3 started again after node-api was killed"
r=$(T exec "$C" -- cat /workspace/f 2>&1)
expect "C adopted (same init pid $ipid, generation 2): the record still says 300, quota 30000" \
	'[ "$r" = kept ] && [ "$(rec w3 "$C" init_pid)" = "$ipid" ] && [ "$(rec w3 "$C" cpu_millis)" = 300 ] && [ "$(quota "$C")" = 30000/100000 ]' \
	"$r; init $(rec w3 "$C" init_pid) (was $ipid); record $(rec w3 "$C" cpu_millis); quota $(quota "$C")"

# the guest agent dies: re-activated in place, under the same cap
kill -9 "$(rec w3 "$C" init_pid)"
r=$(T exec "$C" -- cat /workspace/f 2>&1)
expect "C re-activated in place (generation 2, activation 2+) with quota 30000" \
	'[ "$r" = kept ] && [ "$(field "$C" generation)" = 2 ] && [ "$(field "$C" activation)" -ge 2 ] && [ "$(quota "$C")" = 30000/100000 ]' \
	"$r; $(T info "$C"); quota $(quota "$C")"
measure "$C" 0.18 0.45 "C after crash, adoption and re-activation, two busy loops: still ~0.3 CPU"
T rm "$C" >/dev/null 2>&1
stop_w3
tap_done

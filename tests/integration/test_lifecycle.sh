#!/bin/bash
# tether-test: slow
# Lifecycle across workers (issue 5, SPEC §7): a real cluster (`tether up
# --workers 2` in a temp HOME, plus a hand-started worker w3 we can kill),
# pause / resume / migrate through the CLI, byte-exact files across workers,
# RefreshRoute for a capability minted before the pause, refused resumes and
# migrations leaving the sandbox unchanged, a manager killed mid-snapshot
# (the partial snapshot is never used), two racing migrates, and a control
# plane restart between migrations. Prints TAP.
#
# Lifecycle verbs go to the control plane URL directly unless the edge
# proxies them (the CLI works against either: same API).
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-lc
TT_DETAIL_LINES=12

# T: the CLI, bounded so a hang fails a check instead of the suite.
T() { timeout 120 "$ROOT/build/tether" "$@"; }
# LC: lifecycle verbs (against LC_URL: the edge once it proxies them, else
# the cp, see above).
LC() { TETHER_URL=$LC_URL TETHER_API_KEY=$KEY timeout 120 "$ROOT/build/tether" "$@"; }
info() { LC info "$1" --json | jget "$2"; }

stop_up() { cluster_down; }
at_exit stop_w3

start_up() { cluster_up 2; }
# cg_gone NAME: no cgroup of that name is left, v1 or v2.
cg_gone() { ! ls -d /sys/fs/cgroup/*/tether/"$1" /sys/fs/cgroup/tether/"$1" >/dev/null 2>&1; }
# node_exec SBX TOKEN NODE_URL CMD: POST exec at a node; prints "STATUS BODY".
node_exec() {
	curl -s -o "$WORK/ne.body" -w '%{http_code}' -X POST -H "Authorization: Capability $2" \
		-H 'Content-Type: application/json' --data "{\"cmd\":[\"sh\",\"-c\",\"$4\"]}" \
		"$3/v1/sandboxes/$1/exec"
	echo " $(cat "$WORK/ne.body")"
}
cap_json() { T cap "$1" --ops exec; }

# ---- cluster -----------------------------------------------------------------
cluster_up_or_bail "tether up: cluster with w1, w2" 2
KEY=$(cat "$STATE/cp/admin.key")
LC_URL=$CP
if ! curl -s -X POST -H "Authorization: Bearer $KEY" -d '{}' \
	"http://127.0.0.1:$((BASE + 1))/v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa/resume" | grep -q "no route"; then
	LC_URL=http://127.0.0.1:$((BASE + 1))
fi
echo "# lifecycle verbs via $LC_URL"
if [ -d "$STATE/snapshots" ] && grep -q -- "--snapshots" /proc/$(pgrep -f -o "tetherd manager --state $STATE/workers/w1")/cmdline 2>/dev/null; then
	ok "tether up gives every manager the shared snapshot store"
else notok "tether up gives every manager the shared snapshot store"; fi

# ---- create, write, pause ----------------------------------------------------
S=$(T create --worker w1 2>"$WORK/e")
[[ $S =~ ^sbx_ ]] && ok "create on w1" || notok "create on w1" "$(cat "$WORK/e")"
T exec "$S" -- sh -c 'head -c 10485760 /dev/urandom >/home/big && echo hello >/workspace/a.txt &&
	mkdir -p /workspace/d/e && echo deep >/workspace/d/e/f && ln -s a.txt /workspace/link &&
	chmod 640 /workspace/a.txt' >"$WORK/e" 2>&1 || notok "write files" "$(cat "$WORK/e")"
SUMS='md5sum /home/big /workspace/a.txt /workspace/d/e/f; stat -c "%a %s %U" /workspace/a.txt; readlink /workspace/link'
T exec "$S" -- sh -c "$SUMS" >"$WORK/sums1" 2>&1
grep -q big "$WORK/sums1" && ok "files written (10 MiB among them)" || notok "files written" "$(cat "$WORK/sums1")"
CAP1=$(cap_json "$S")
TOK1=$(echo "$CAP1" | jget 'd["token"]')
URL1=$(echo "$CAP1" | jget 'd["node_url"]')
r=$(node_exec "$S" "$TOK1" "$URL1" 'echo pre')
[[ $r == 200* && $r == *'"generation":1'* ]] && ok "honest exec at w1 before the pause (generation 1)" || notok "honest exec before the pause" "$r"

if LC pause "$S" >"$WORK/p.out" 2>"$WORK/p.err" && grep -q "^paused $S: paused, generation 1 on w1" "$WORK/p.out"; then
	ok "pause: CLI reports paused"; else notok "pause: CLI reports paused" "$(cat "$WORK/p.out" "$WORK/p.err")"; fi
[ "$(info "$S" 'd["state"], d["snapshot"]["generation"], d["snapshot"]["checksum"][:8]')" = "('paused', 1, 'blake2b:')" ] &&
	ok "info: paused with a complete, checksummed snapshot of generation 1" || notok "info after pause" "$(LC info "$S" --json)"
[ -f "$STATE/snapshots/$S/1.meta" ] && ok "snapshot published in the shared store" || notok "snapshot published" "$(ls -R "$STATE/snapshots")"

r=$(node_exec "$S" "$TOK1" "$URL1" 'echo stale')
[[ $r == 409* && $r == *'"decision":"refresh_route"'* ]] && ok "paused: w1 answers 409 RefreshRoute to a capability minted before the pause" ||
	notok "paused: RefreshRoute for the old capability" "$r"
if LC pause "$S" >"$WORK/e" 2>&1; then notok "pause of a paused sandbox is refused"; else
	grep -q "paused" "$WORK/e" && ok "pause of a paused sandbox is refused" || notok "pause of a paused sandbox is refused" "$(cat "$WORK/e")"; fi

# ---- resume elsewhere -----------------------------------------------------------
if LC resume "$S" --worker w2 >"$WORK/r.out" 2>&1 && grep -q "generation 2 on w2" "$WORK/r.out"; then
	ok "resume --worker w2: generation 2 on w2"; else notok "resume --worker w2" "$(cat "$WORK/r.out")"; fi
T exec "$S" -- sh -c "$SUMS" >"$WORK/sums2" 2>&1
cmp -s "$WORK/sums1" "$WORK/sums2" && ok "files byte-exact on w2 (content, mode, owner, symlink)" ||
	notok "files byte-exact on w2" "$(diff "$WORK/sums1" "$WORK/sums2")"
CAP2=$(cap_json "$S")
r=$(node_exec "$S" "$(echo "$CAP2" | jget 'd["token"]')" "$(echo "$CAP2" | jget 'd["node_url"]')" 'echo now')
[[ $r == 200* && $r == *'"generation":2'* ]] && ok "exec on the new execution stamps generation 2" || notok "exec stamps generation 2" "$r"
r=$(node_exec "$S" "$TOK1" "$URL1" 'echo stale')
[[ $r == 409* ]] && ok "the generation-1 capability is still refused at w1" || notok "gen-1 capability at w1" "$r"
r=$(node_exec "$S" "$TOK1" "$(echo "$CAP2" | jget 'd["node_url"]')" 'echo stale')
[[ $r == 409* && $r == *refresh_route* ]] && ok "the generation-1 capability is refused at w2 (RefreshRoute)" || notok "gen-1 capability at w2" "$r"

# ---- refusals leave the sandbox unchanged -------------------------------------------
before=$(info "$S" 'd["state"], d["generation"], d["worker"]')
if LC resume "$S" >"$WORK/e" 2>&1; then notok "resume of a running sandbox is refused"; else
	grep -q "running" "$WORK/e" && ok "resume of a running sandbox: clear error" || notok "resume of a running sandbox: clear error" "$(cat "$WORK/e")"; fi
[ "$(info "$S" 'd["state"], d["generation"], d["worker"]')" = "$before" ] && ok "... and the sandbox is unchanged" || notok "unchanged after refused resume" "$before"
if LC migrate "$S" --worker w9 >"$WORK/e" 2>&1; then notok "migrate to an unknown worker is refused"; else
	grep -q "w9" "$WORK/e" && ok "migrate to an unknown worker: clear error" || notok "migrate to an unknown worker: clear error" "$(cat "$WORK/e")"; fi
[ "$(info "$S" 'd["state"], d["generation"], d["worker"]')" = "$before" ] && ok "... and the sandbox is unchanged" || notok "unchanged after refused migrate" "$before"

# ---- migrate back ------------------------------------------------------------------
if LC migrate "$S" --worker w1 >"$WORK/m.out" 2>&1 && grep -q "generation 3 on w1" "$WORK/m.out"; then
	ok "migrate --worker w1: generation 3 on w1"; else notok "migrate back to w1" "$(cat "$WORK/m.out")"; fi
T exec "$S" -- sh -c "$SUMS" >"$WORK/sums3" 2>&1
cmp -s "$WORK/sums1" "$WORK/sums3" && ok "files byte-exact after the round trip" || notok "files after round trip" "$(diff "$WORK/sums1" "$WORK/sums3")"

# ---- two concurrent migrates: exactly one wins ----------------------------------
LC migrate "$S" --worker w2 >"$WORK/c1" 2>&1 & c1=$!
LC migrate "$S" --worker w2 >"$WORK/c2" 2>&1 & c2=$!
wait $c1; r1=$?
wait $c2; r2=$?
if [ $((r1 + r2)) = 1 ]; then ok "two concurrent migrates: exactly one wins"; else
	notok "two concurrent migrates: exactly one wins" "rc $r1 $r2: $(cat "$WORK/c1" "$WORK/c2")"; fi
[ "$(info "$S" 'd["state"], d["generation"], d["worker"]')" = "('running', 4, 'w2')" ] &&
	ok "... the winner's result: generation 4 on w2" || notok "after concurrent migrates" "$(LC info "$S" --json)"

# ---- a manager killed mid-snapshot ----------------------------------------------------
if start_w3; then ok "extra worker w3 up"; else notok "extra worker w3 up" "$(tail -n 5 "$WORK/w3.log")"; fi
K=$(T create --worker w3 2>"$WORK/e")
T exec "$K" -- sh -c 'echo v1 >/workspace/keep' >/dev/null 2>&1
LC pause "$K" >/dev/null 2>&1 && LC resume "$K" --worker w3 >/dev/null 2>&1
[ "$(info "$K" 'd["state"], d["generation"], d["worker"], d["snapshot"]["generation"]')" = "('running', 2, 'w3', 1)" ] &&
	ok "sandbox on w3 at generation 2 with a complete snapshot of generation 1" || notok "w3 sandbox setup" "$(LC info "$K" --json; cat "$WORK/e")"
T exec "$K" -- sh -c 'echo v2 >/workspace/keep && head -c 600000000 /dev/zero >/home/huge' >"$WORK/e" 2>&1 ||
	notok "write a large layer on w3" "$(cat "$WORK/e")"
MGR3=$(pgrep -f -o "tetherd manager --state $STATE/workers/w3")
# The manager keeps one bridge started ahead for the next create.
spares() { ps -eo comm=,args= | awk -v m="--manager-pid $MGR3 " '$1 == "bridge-spare" && index($0, m)' | wc -l; }
[ "$(spares)" = 1 ] && ok "w3's manager keeps one spare bridge" || notok "one spare bridge" "$(ps -eo pid,comm,args | grep "manager-pid $MGR3 ")"
# ... and one spare sandbox (cgroups "spare<manager pid>-g<n>" until assigned).
spare_procs() { cat /sys/fs/cgroup/pids/tether/spare"$MGR3"-g*/cgroup.procs /sys/fs/cgroup/tether/spare"$MGR3"-g*/cgroup.procs 2>/dev/null | wc -l; }
[ "$(spare_procs)" = 1 ] && ok "... and one spare sandbox, its agent alone in it" || notok "one spare sandbox" "$(spare_procs) processes"
curl -s -o /dev/null -X POST -H "Authorization: Bearer $KEY" "$CP/v1/sandboxes/$K/pause?wait=0"
killed=0
for _ in $(seq 1 1000); do
	if [ -n "$(find "$STATE/snapshots/.partial" -type f -size +1M 2>/dev/null)" ]; then
		kill -KILL "$MGR3" && killed=1
		break
	fi
	sleep 0.01
done
[ $killed = 1 ] && ok "w3's manager killed with SIGKILL mid-snapshot" || notok "kill mid-snapshot" "no partial snapshot seen"
# Its spare bridge sees its assignment pipe end and exits by itself.
for _ in $(seq 1 50); do [ "$(spares)" = 0 ] && break; sleep 0.1; done
[ "$(spares)" = 0 ] && ok "the dead manager's spare bridge exited by itself" || notok "spare bridge after its manager's death" "$(ps -eo pid,comm,args | grep "manager-pid $MGR3 ")"
for _ in $(seq 1 50); do [ "$(spare_procs)" = 0 ] && break; sleep 0.1; done
[ "$(spare_procs)" = 0 ] && ok "... and its spare sandbox ended (the agent read EOF)" || notok "spare sandbox after its manager's death" "$(spare_procs) processes"
for _ in $(seq 1 100); do kill -0 "$W3_PID" 2>/dev/null || break; sleep 0.1; done
[ ! -e "$STATE/snapshots/$K/2.meta" ] && ok "the partial snapshot was never published" || notok "partial never published" "$(ls "$STATE/snapshots/$K")"
# w3 comes back: its manager kills (and thaws) the frozen leftovers, hears
# the pause again and fails it, since that execution is retired; the
# worker still holds the layer, so the cp relaunches the sandbox there from
# it (before, it failed, and a resume restored the older snapshot: every
# write since was lost).
W3_PID=
start_w3 >/dev/null
for _ in $(seq 1 400); do
	[ "$(info "$K" 'd["state"], d["generation"]')" = "('running', 3)" ] && break
	sleep 0.1
done
[ "$(info "$K" 'd["state"], d["generation"], d["worker"]')" = "('running', 3, 'w3')" ] &&
	info "$K" 'd["note"]' | grep -q "relaunched as generation 3 on w3 from its own layer (pause failed" &&
	ok "the cut pause: relaunched on w3 from its own layer as generation 3, and says so" ||
	notok "state after the cut pause" "$(LC info "$K" --json)"
[ ! -e "/sys/fs/cgroup/freezer/tether/$K-g2" ] && ok "the restarted manager released the frozen execution" ||
	notok "frozen leftovers released" "$(cat "/sys/fs/cgroup/freezer/tether/$K-g2/cgroup.procs")"
cg_gone "$K-g2" && ok "... and removed its cgroups" || notok "cgroups of the cut execution" "$(ls -d /sys/fs/cgroup/*/tether/"$K-g2" /sys/fs/cgroup/tether/"$K-g2" 2>/dev/null)"
[ "$(info "$K" 'd["snapshot"]["generation"]')" = 1 ] &&
	ok "the last complete snapshot is still generation 1 (the partial never counted)" ||
	notok "snapshot after the cut pause" "$(LC info "$K" --json)"
out=$(T exec "$K" -- sh -c 'cat /workspace/keep; ls /home' 2>&1)
[ "$out" = "$(printf 'v2\nhuge')" ] && ok "content is every write acknowledged before the pause (v2, /home/huge)" ||
	notok "content after the relaunch" "$out"
stop_w3

# ---- a manager killed with a running sandbox: its successor adopts it --------------
# The sandbox and its bridge outlive the manager; the next one proves the
# recorded adoption key to the bridge and serves the same execution: same
# generation, same files, its background process still running.
start_w3 >/dev/null
A=$(T create --worker w3 2>"$WORK/e")
T exec "$A" -- sh -c 'echo adopted-v1 >/workspace/a; sleep 1000 >/dev/null 2>&1 &' >/dev/null 2>&1
pid_before=$(T exec "$A" -- pgrep -x sleep 2>&1)
MGR3=$(pgrep -f -o "tetherd manager --state $STATE/workers/w3")
kill -KILL "$MGR3"
for _ in $(seq 1 100); do kill -0 "$W3_PID" 2>/dev/null || break; sleep 0.1; done
W3_PID=
# The cp may still list the dead w3 as up: wait for the new one's listener.
listening=$(grep -c "node-api w3 listening" "$WORK/w3.log")
w3_back() { [ "$(grep -c "node-api w3 listening" "$WORK/w3.log")" -gt "$listening" ]; }
start_w3 >/dev/null
wait_until 100 w3_back
out=$(T exec "$A" -- sh -c 'cat /workspace/a; pgrep -x sleep' 2>&1)
if [ -n "$pid_before" ] && [ "$out" = "adopted-v1
$pid_before" ]; then ok "after its manager's SIGKILL, the sandbox is served as it was (file, background process)"
else notok "sandbox after a manager restart" "before [$pid_before] after [$out]"; fi
[ "$(info "$A" 'd["state"], d["generation"]')" = "('running', 1)" ] &&
	ok "... the same execution (generation 1, not re-activated)" || notok "adopted generation" "$(LC info "$A" --json)"
grep -q "bridge for $A generation 1 adopted by manager pid" "$WORK/w3.log" &&
	ok "... its bridge was adopted by the new manager" || notok "adoption logged" "$(grep -i adopt "$WORK/w3.log" | tail -3)"
stop_w3
cg_gone "$A-g1" && ok "... and stopping it removed its cgroups" || notok "cgroups of the adopted execution" "$(ls -d /sys/fs/cgroup/*/tether/"$A-g1" /sys/fs/cgroup/tether/"$A-g1" 2>/dev/null)"

# ---- a manager killed between starting a sandbox and recording it -------------------
# Its record says STARTING with no pids (what the window between the two
# writes of a create leaves): the successor cannot adopt what it cannot
# name, and finds the sandbox by its cgroups and kills it rather than
# leave it running out of reach in a uid range a later create may reuse.
start_w3 >/dev/null
B=$(T create --worker w3 2>"$WORK/e")
T exec "$B" -- sh -c 'sleep 1000 >/dev/null 2>&1 &' >/dev/null 2>&1
b_procs=$(cat /sys/fs/cgroup/pids/tether/"$B"-g1/cgroup.procs 2>/dev/null | tr '\n' ' ')
MGR3=$(pgrep -f -o "tetherd manager --state $STATE/workers/w3")
kill -KILL "$MGR3"
for _ in $(seq 1 100); do kill -0 "$W3_PID" 2>/dev/null || break; sleep 0.1; done
W3_PID=
python3 - "$STATE/workers/w3/runtime.db" "$B" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("UPDATE executions SET state='starting', init_pid=0, init_start=0,"
           " bridge_pid=0, bridge_start=0, adopt_key=NULL WHERE sbx=?", (sys.argv[2],))
db.commit()
PY
start_w3 >/dev/null
b_alive() { for p in $b_procs; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
for _ in $(seq 1 100); do b_alive || break; sleep 0.1; done
if [ -n "$b_procs" ] && ! b_alive && cg_gone "$B-g1"; then
	ok "a sandbox whose record lost its pids is killed through its cgroups on restart"
else notok "sandbox with a pid-less record after a restart" "procs before [$b_procs] alive: $(for p in $b_procs; do kill -0 $p 2>/dev/null && echo $p; done)"; fi
grep -q "execution $B generation 1 lost across restart" "$WORK/w3.log" &&
	ok "... and recorded lost" || notok "lost recorded" "$(grep "$B" "$WORK/w3.log" | tail -3)"
stop_w3

# ---- progress and a control-plane restart between migrations ------------------------------
T exec "$S" -- sh -c 'head -c 300000000 /dev/zero >/home/large' >/dev/null 2>&1
if LC pause "$S" >"$WORK/p.out" 2>"$WORK/p.err" && grep -qE '^snapshot [0-9.]+ MiB / [0-9.]+ MiB$' "$WORK/p.err"; then
	ok "pause of a large layer shows snapshot progress on stderr"
else notok "pause progress" "$(cat "$WORK/p.out" "$WORK/p.err")"; fi
stop_up
if start_up; then ok "cluster (control plane included) restarted on the same state"; else notok "restart" "$(cat "$WORK/up.err")"; fi
if LC resume "$S" --worker w1 >"$WORK/r.out" 2>&1 && grep -q "generation 5 on w1" "$WORK/r.out"; then
	ok "after the restart: resume gives generation 5 (never reused)"; else notok "generation after restart" "$(cat "$WORK/r.out")"; fi
T exec "$S" -- sh -c "$SUMS" >"$WORK/sums5" 2>&1
cmp -s "$WORK/sums1" "$WORK/sums5" && ok "files byte-exact after the restart" || notok "files after restart" "$(diff "$WORK/sums1" "$WORK/sums5")"
if LC migrate "$S" --worker w2 >"$WORK/m.out" 2>&1 && grep -q "generation 6 on w2" "$WORK/m.out"; then
	ok "migrate after the restart: generation 6"; else notok "migrate after restart" "$(cat "$WORK/m.out")"; fi

tap_done

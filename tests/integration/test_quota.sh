#!/bin/bash
# Each sandbox's writable layer is its own size- and inode-capped
# filesystem (task Q, SPEC §9 ns substrate, §7 lifecycle): a real cluster
# (`tether up --workers 2 --disk-mb 64`) plus a hand-started worker w3 with
# a 16 MiB cap. Attacks refused and honest requests served side by side:
# a sandbox writing past its cap gets ENOSPC while the worker's filesystem
# loses at most the image; creating files past the inode cap fails while
# writes to existing files and other sandboxes still work; files survive
# pause/resume/migrate; a snapshot larger than the target's cap fails
# cleanly (and resumes elsewhere); rm and cluster stop leave no mount or
# loop device behind; a stopped-then-restarted cluster resumes its paused
# sandbox with its files. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-quota
TT_DETAIL_LINES=12
W3_PID=
MIB=$((1 << 20))

T() { timeout 120 "$ROOT/build/tether" "$@"; }
at_exit stop_w3
# sbx_dir W SBX: the sandbox's directory on worker W.
sbx_dir() { echo "$STATE/workers/$1/sandboxes/$2"; }
# mgr_pid W: the sbx-manager of worker W.
mgr_pid() { pgrep -f -o "tetherd manager --state $STATE/workers/$1( |$)"; }
# loops_of PATTERN: loop devices whose backing file matches PATTERN.
loops_of() { losetup -a | grep -c -- "$1"; }
# free_bytes: free bytes of the filesystem holding the workers' state.
free_bytes() { df -B1 --output=avail "$STATE/workers" | tail -n1 | tr -d ' '; }

LOOPS_BEFORE=$(losetup -a | wc -l)
cluster_up_or_bail "tether up --disk-mb 64: cluster with w1, w2" 2 --disk-mb 64

# ---- the cap is a filesystem of its own -------------------------------------------
A=$(T create --worker w1 2>"$WORK/e")
B=$(T create --worker w1 2>>"$WORK/e")
[[ $A =~ ^sbx_ && $B =~ ^sbx_ ]] && ok "two sandboxes on w1" || tap_bail "two sandboxes on w1" "$(cat "$WORK/e")"
M1=$(mgr_pid w1)
if grep -q " $(sbx_dir w1 "$A")/layer .* ext4 /dev/loop[0-9]* rw,.*" /proc/"$M1"/mountinfo &&
	grep " $(sbx_dir w1 "$A")/layer " /proc/"$M1"/mountinfo | grep -q 'nosuid,nodev'; then
	ok "A's layer is an ext4 loop mount, nosuid,nodev, in the manager's mount namespace"
else notok "A's layer is a loop mount" "$(grep sandboxes /proc/"$M1"/mountinfo)"; fi
T exec "$A" -- sh -c 'df -k /workspace | tail -n1' >"$WORK/df" 2>&1
size_kb=$(awk '{print $2}' "$WORK/df")
[ -n "$size_kb" ] && [ "$size_kb" -le $((64 * 1024)) ] && [ "$size_kb" -ge $((48 * 1024)) ] &&
	ok "inside, /workspace is a ${size_kb} KiB filesystem (cap 64 MiB)" || notok "df inside" "$(cat "$WORK/df")"

# ---- disk cap ---------------------------------------------------------------------
free0=$(free_bytes)
T exec "$A" -- sh -c 'dd if=/dev/zero of=/tmp/big bs=1M count=200' >"$WORK/dd" 2>&1
rc=$?
free1=$(free_bytes)
[ "$rc" != 0 ] && grep -q "No space left" "$WORK/dd" &&
	ok "dd of 200 MiB in A fails: No space left on device (exit $rc)" || notok "dd past the cap fails" "rc $rc: $(cat "$WORK/dd")"
alloc=$(( $(stat -c '%b * %B' "$(sbx_dir w1 "$A")/layer.img") ))
[ "$alloc" -le $((64 * MIB)) ] && ok "A's image holds $((alloc / MIB)) MiB of the host's disk (<= 64 MiB)" ||
	notok "image allocation within the cap" "$alloc bytes"
drop=$((free0 - free1))
[ "$drop" -lt $((100 * MIB)) ] && ok "the worker's free space fell by $((drop / MIB)) MiB, not 200" ||
	notok "worker free space within the cap" "fell by $drop bytes"
r=$(T exec "$B" -- sh -c 'echo honest >/workspace/h && cat /workspace/h' 2>&1)
[ "$r" = honest ] && ok "B (same worker) writes and reads back while A is full" || notok "B writes while A is full" "$r"
r=$(T exec "$A" -- sh -c 'rm /tmp/big && echo again >/workspace/a && cat /workspace/a' 2>&1)
[ "$r" = again ] && ok "A writes again once it freed its space" || notok "A writes after freeing" "$r"

# An upload past the cap through the edge: 507 no_space within a second of
# the cap being hit, with the CLI and with curl (with and without
# Expect: 100-continue), and the connection still answers the next request.
head -c $((100 * MIB)) /dev/zero >"$WORK/100m"
t0=$(date +%s%N)
T cp "$WORK/100m" "$A:/tmp/up" >"$WORK/cp" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" = 1 ] && grep -q "No space left" "$WORK/cp" && [ "$ms" -lt 3000 ] &&
	ok "tether cp of 100 MiB into A fails: No space left, in $ms ms" ||
	notok "cp past the cap" "rc $rc in $ms ms: $(cat "$WORK/cp")"
for ex in "Expect: 100-continue" "Expect:"; do
	out=$(curl -s -m 30 -H "Authorization: Bearer $(cluster_key)" -H "$ex" -T "$WORK/100m" \
		-w ' %{http_code} %{time_total}' "http://127.0.0.1:$((BASE + 1))/v1/sandboxes/$A/files?path=/tmp/up" \
		--next -s -m 5 -w ' %{http_code}' "http://127.0.0.1:$((BASE + 1))/healthz")
	case $out in
	*'"no_space"'*' 507 '[0-2].*'} 200') ok "curl PUT of 100 MiB ($ex): 507 no_space within 3 s; /healthz next" ;;
	*) notok "curl PUT past the cap ($ex)" "$out" ;;
	esac
done
T exec "$A" -- sh -c 'rm -f /tmp/up' >/dev/null 2>&1

# ---- inode cap ----------------------------------------------------------------------
T exec "$A" -- sh -c 'mkdir /tmp/many && cd /tmp/many && i=0;
	while [ $i -lt 20000 ]; do true >f$i || { echo "stopped at $i"; exit 3; }; i=$((i + 1)); done' >"$WORK/in" 2>&1
rc=$?
[ "$rc" = 3 ] && grep -q "No space left" "$WORK/in" &&
	ok "creating 20000 files in A fails with ENOSPC: $(grep -o 'stopped at [0-9]*' "$WORK/in")" ||
	notok "inode cap" "rc $rc: $(tail -n 3 "$WORK/in")"
r=$(T exec "$A" -- sh -c 'echo more >>/workspace/a && cat /workspace/a' 2>&1)
[ "$r" = "$(printf 'again\nmore')" ] && ok "A still appends to an existing file at its inode cap" || notok "A appends at the inode cap" "$r"
r=$(T exec "$B" -- sh -c 'echo fresh >/workspace/new && cat /workspace/new' 2>&1)
[ "$r" = fresh ] && ok "B creates a new file while A is at its inode cap" || notok "B creates a file" "$r"
T exec "$A" -- sh -c 'rm -rf /tmp/many' >/dev/null 2>&1

# ---- files survive pause, resume and migrate ------------------------------------------
T exec "$A" -- sh -c 'head -c 3000000 /dev/urandom >/home/r && mkdir -p /workspace/d/e && echo deep >/workspace/d/e/f &&
	ln -s ../a /workspace/d/l && chmod 640 /workspace/a' >"$WORK/e" 2>&1 || notok "write files in A" "$(cat "$WORK/e")"
SUMS='md5sum /home/r /workspace/a /workspace/d/e/f; stat -c "%a %s %U" /workspace/a; readlink /workspace/d/l'
T exec "$A" -- sh -c "$SUMS" >"$WORK/s1" 2>&1
grep -q /home/r "$WORK/s1" && ok "files written in A" || notok "files written in A" "$(cat "$WORK/s1")"
T pause "$A" >"$WORK/e" 2>&1 || notok "pause A" "$(cat "$WORK/e")"
if ! grep -q " $(sbx_dir w1 "$A")/" /proc/"$M1"/mountinfo && [ ! -e "$(sbx_dir w1 "$A")/layer.img" ] &&
	[ "$(loops_of "$(sbx_dir w1 "$A")/")" = 0 ]; then
	ok "paused: A's layer unmounted, its image and loop device gone on w1"
else notok "paused: nothing of A's layer stays" "$(grep sandboxes /proc/"$M1"/mountinfo; losetup -a)"; fi
T resume "$A" --worker w1 >"$WORK/e" 2>&1 || notok "resume A on w1" "$(cat "$WORK/e")"
T exec "$A" -- sh -c "$SUMS" >"$WORK/s2" 2>&1
cmp -s "$WORK/s1" "$WORK/s2" && ok "resumed on w1: same bytes, modes, owner, symlink" || notok "files after resume" "$(diff "$WORK/s1" "$WORK/s2")"
T migrate "$A" --worker w2 >"$WORK/e" 2>&1 || notok "migrate A to w2" "$(cat "$WORK/e")"
T exec "$A" -- sh -c "$SUMS" >"$WORK/s3" 2>&1
cmp -s "$WORK/s1" "$WORK/s3" && ok "migrated to w2: same bytes" || notok "files after migrate" "$(diff "$WORK/s1" "$WORK/s3")"
r=$(T exec "$A" -- sh -c 'df -k /workspace | tail -n1 | awk "{print \$2}"' 2>&1)
[ -n "$r" ] && [ "$r" -le $((64 * 1024)) ] && ok "on w2, A is still capped (${r} KiB)" || notok "cap on w2" "$r"

# ---- a snapshot larger than the target's cap -----------------------------------------------
if start_w3 --disk-mb 16; then ok "extra worker w3 up (--disk-mb 16)"; else notok "extra worker w3 up" "$(tail -n 5 "$WORK/w3.log")"; fi
T exec "$A" -- sh -c 'head -c 31457280 /dev/urandom >/workspace/big30' >"$WORK/e" 2>&1 || notok "30 MiB in A" "$(cat "$WORK/e")"
T exec "$A" -- sh -c "md5sum /workspace/big30; $SUMS" >"$WORK/s4" 2>&1
T migrate "$A" --worker w3 >"$WORK/m3" 2>&1
rc=$?
[ "$rc" != 0 ] && grep -qi "does not fit" "$WORK/m3" &&
	ok "migrate to w3 (16 MiB cap) fails with a clear error: $(grep -o 'does not fit[^:]*' "$WORK/m3" | head -n1)" ||
	notok "restore past the cap fails cleanly" "rc $rc: $(cat "$WORK/m3")"
M3=$(mgr_pid w3)
if [ -n "$M3" ] && ! grep -q " $(sbx_dir w3 "$A")/layer " /proc/"$M3"/mountinfo &&
	[ "$(loops_of "$(sbx_dir w3 "$A")/")" = 0 ]; then
	ok "w3 keeps no mount or loop device of the failed restore"
else notok "w3 clean after the failed restore" "$(grep sandboxes /proc/"$M3"/mountinfo; losetup -a)"; fi
T resume "$A" --worker w1 >"$WORK/e" 2>&1
T exec "$A" -- sh -c "md5sum /workspace/big30; $SUMS" >"$WORK/s5" 2>&1
cmp -s "$WORK/s4" "$WORK/s5" && ok "the same snapshot then resumes on w1, byte-exact (nothing corrupted)" ||
	notok "resume after the failed restore" "$(cat "$WORK/e"; diff "$WORK/s4" "$WORK/s5")"
stop_w3

# ---- a sparse file larger than the cap: the pause fails, nothing is published ----------------
# (the archive stores files expanded: before, the pause published a
# snapshot no worker with this cap could restore, then deleted the layer).
# The worker keeps the layer, so the sandbox is relaunched from it there.
C=$(T create --worker w1 2>"$WORK/e")
T exec "$C" -- sh -c 'truncate -s 200M /workspace/sparse && echo small >/workspace/keep' >"$WORK/e" 2>&1
T pause "$C" >"$WORK/e" 2>&1
rc=$?
if [ "$rc" != 0 ] && ! ls "$STATE/snapshots/$C/"*.meta >/dev/null 2>&1; then
	ok "pause of a sandbox holding a 200 MiB sparse file (64 MiB cap) fails; no snapshot is published"
else notok "pause past the cap through a sparse file" "rc $rc: $(cat "$WORK/e"; ls "$STATE/snapshots/$C" 2>&1)"; fi
r=$(T exec "$C" -- cat /workspace/keep 2>&1)
[ "$r" = small ] && [ "$(T info "$C" --json | jget 'd["state"], d["generation"]')" = "('running', 2)" ] &&
	ok "... it runs on, relaunched from the layer its worker kept (generation 2, files there)" ||
	notok "after the failed pause" "$r $(T info "$C" --json)"
T rm "$C" >/dev/null 2>&1

# ---- rm of a paused sandbox removes its snapshots from the shared store --------------------
D=$(T create --worker w1 2>"$WORK/e")
T exec "$D" -- sh -c 'echo kept >/workspace/f' >/dev/null 2>&1
T pause "$D" >"$WORK/e" 2>&1
if ls "$STATE/snapshots/$D/"*.meta >/dev/null 2>&1 && T rm "$D" >>"$WORK/e" 2>&1 &&
	wait_until 50 sh -c "! ls '$STATE/snapshots/$D/' 2>/dev/null | grep -q ."; then
	ok "rm of a paused sandbox: its snapshot leaves the store"
else notok "rm of a paused sandbox: its snapshot leaves the store" "$(cat "$WORK/e"; ls -la "$STATE/snapshots/$D" 2>&1)"; fi

# ---- rm unmounts and frees the loop device --------------------------------------------------
M1=$(mgr_pid w1)
T rm "$A" >"$WORK/e" 2>&1 || notok "rm A" "$(cat "$WORK/e")"
T rm "$B" >>"$WORK/e" 2>&1 || notok "rm B" "$(cat "$WORK/e")"
wait_until 20 test "$(loops_of "$(sbx_dir w1 "$A")/")" = 0
if ! grep -q -e "$A" -e "$B" /proc/"$M1"/mountinfo && [ "$(loops_of "/$A/")" = 0 ] &&
	[ "$(loops_of "/$B/")" = 0 ] && [ ! -e "$(sbx_dir w1 "$B")" ]; then
	ok "rm: no mount of A or B in the manager's mountinfo, no loop device, B's dir gone"
else notok "rm leaves nothing mounted" "$(grep sandboxes /proc/"$M1"/mountinfo; losetup -a)"; fi

# ---- stop and start again: no leak, paused files kept -------------------------------------------
P=$(T create --worker w2 2>"$WORK/e")
T exec "$P" -- sh -c 'echo kept >/workspace/k && head -c 100000 /dev/urandom >/home/r && md5sum /home/r' >"$WORK/p1" 2>&1
T pause "$P" >"$WORK/e" 2>&1 || notok "pause P" "$(cat "$WORK/e")"
R=$(T create --worker w1 2>"$WORK/e")
T exec "$R" -- sh -c 'echo run >/workspace/k' >/dev/null 2>&1
cluster_down
left=$(loops_of "$STATE/")
mnts=$(grep -c " $STATE/" /proc/self/mountinfo)
[ "$left" = 0 ] && [ "$mnts" = 0 ] && ok "cluster stopped: no loop device, no mount under the state dir" ||
	notok "cluster stop leaks nothing" "$left loop(s), $mnts mount(s): $(losetup -a)"
ls "$STATE/snapshots/$R/"*.meta >/dev/null 2>&1 &&
	ok "... the running sandbox was paused by the stop (its snapshot is in the store)" ||
	notok "running sandbox paused at stop" "$(ls -la "$(sbx_dir w1 "$R")" "$STATE/snapshots/$R" 2>&1; tail -n 5 "$WORK/up.err")"
if cluster_up 2 --disk-mb 64; then ok "cluster up again on the same state"; else
	tap_bail "cluster up again" "$(cat "$WORK/up.err"; tail -n 5 "$STATE"/logs/*.log)"; fi
r=$(T exec "$R" -- cat /workspace/k 2>&1)
[ "$r" = run ] && [ "$(T info "$R" --json | jget 'd["state"], d["worker"]')" = "('running', 'w1')" ] &&
	ok "... and resumed on its worker when the cluster came back, its files there" ||
	notok "resumed after the restart" "$r $(T info "$R" --json)"
T resume "$P" >"$WORK/e" 2>&1 || notok "resume P after the restart" "$(cat "$WORK/e")"
T exec "$P" -- sh -c 'cat /workspace/k; md5sum /home/r' >"$WORK/p2" 2>&1
[ "$(head -n1 "$WORK/p2")" = kept ] && [ "$(tail -n1 "$WORK/p2")" = "$(cat "$WORK/p1")" ] &&
	ok "the paused sandbox resumes after the restart with its files" || notok "paused files after restart" "$(cat "$WORK/p1" "$WORK/p2")"
T rm "$P" >/dev/null 2>&1
T rm "$R" >/dev/null 2>&1
cluster_down
# (Counted for this state dir only: other suites may run meanwhile.)
echo "# loop devices on the host: $LOOPS_BEFORE before, $(losetup -a | wc -l) after"
[ "$(loops_of "$STATE/")" = 0 ] && [ "$(grep -c " $STATE/" /proc/self/mountinfo)" = 0 ] &&
	ok "no loop device or mount left by this test's cluster" || notok "loop devices leaked" "$(losetup -a)"
tap_done

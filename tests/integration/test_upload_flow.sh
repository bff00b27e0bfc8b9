#!/bin/bash
# Uploads (PUT /v1/sandboxes/ID/files) with node-api's lws service buffer
# forced to 32 KiB (TETHER_NODE_SERV_BUF): a small body then arrives in the
# read that carried the headers, after node-api paused rx to hold it until
# the manager's Allow. node-api once left rx paused and asked for a write
# slot, which lws 4.1 never serves on a paused wsi: EPOLLOUT woke the loop
# forever (100 % CPU) and the client waited. Checks, on a real cluster:
# files of 100 B, 4 KiB (repeated: the trigger depends on how the bytes are
# split into reads), 100 KiB and 3 MiB arrive byte-exact; an upload the
# guest refuses part-way (no such directory) is answered; a 32 MiB upload
# does not grow node-api's memory by its size (backpressure holds); and
# node-api's CPU time (/proc/PID/stat) stays small throughout. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
workdir tether-upload
scratch_home
BASE=$(port_base)
STATE=$WORK/state
T=$ROOT/build/tether
export TETHER_NODE_SERV_BUF=32768
TT_CURL_MAX=20

cluster_up_or_bail "cluster up (node-api service buffer 32 KiB)" 1
ID=$("$T" create --worker w1 2>"$WORK/err")
expect "create a sandbox" '[ -n "$ID" ]' "$(cat "$WORK/err")"
NP=$(pgrep -f "tetherd node --id w1 --listen 127.0.0.1:$((BASE + 11)) " | head -n1)
expect "node-api w1 found" '[ -n "$NP" ]' "no process"
grep -q "lws service buffer 32768 bytes" "$STATE"/logs/w1.log 2>/dev/null
okrc $? "node-api runs with the 32 KiB service buffer"

HZ=$(getconf CLK_TCK)
# cpu_ms: node-api's user+system CPU time so far, in ms.
cpu_ms() { awk -v hz="$HZ" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$NP/stat"; }
hwm_kb() { awk '/^VmHWM/ { print $2 }' "/proc/$NP/status"; }

# up_down NAME SIZE: upload SIZE random bytes, read them back, compare; the
# upload must finish within 20 s (a spinning node-api never answers).
up_down() {
	local name=$1 size=$2 rc
	head -c "$size" /dev/urandom >"$WORK/in.$name"
	timeout 20 "$T" cp "$WORK/in.$name" "$ID:/tmp/$name" >"$WORK/o" 2>&1
	rc=$?
	if [ "$rc" != 0 ]; then
		notok "upload $name ($size bytes)" "rc=$rc $(cat "$WORK/o")"
		return
	fi
	timeout 20 "$T" cp "$ID:/tmp/$name" "$WORK/back.$name" >"$WORK/o" 2>&1 &&
		cmp -s "$WORK/in.$name" "$WORK/back.$name"
	okrc $? "upload $name ($size bytes) arrives byte-exact"
}

c0=$(cpu_ms)
up_down tiny 100
for i in $(seq 1 16); do up_down "small$i" 4096; done
up_down medium 102400
up_down large 3145728
c1=$(cpu_ms)
echo "# node-api CPU for 19 uploads + reads (3.2 MiB): $((c1 - c0)) ms"
expect "node-api CPU stays small (< 2000 ms)" '[ $((c1 - c0)) -lt 2000 ]' \
	"$((c1 - c0)) ms"

# ---- a refusal part-way through the body --------------------------------
head -c 3145728 /dev/urandom >"$WORK/in.refused"
c0=$(cpu_ms)
timeout 20 "$T" cp "$WORK/in.refused" "$ID:/no/such/dir/x" >"$WORK/o" 2>&1
rc=$?
c1=$(cpu_ms)
expect "an upload into a missing directory is refused, not hung" \
	'[ "$rc" != 0 ] && [ "$rc" != 124 ]' "rc=$rc $(cat "$WORK/o")"
expect "node-api CPU stays small on the refusal (< 1000 ms)" \
	'[ $((c1 - c0)) -lt 1000 ]' "$((c1 - c0)) ms"
up_down after 4096

# ---- backpressure: the body is streamed, not held -------------------------
h0=$(hwm_kb)
c0=$(cpu_ms)
up_down huge 33554432
h1=$(hwm_kb)
c1=$(cpu_ms)
echo "# 32 MiB upload: node-api peak RSS +$((h1 - h0)) KiB, CPU $((c1 - c0)) ms"
expect "node-api memory stays bounded during 32 MiB (< 8 MiB growth)" \
	'[ $((h1 - h0)) -lt 8192 ]' "+$((h1 - h0)) KiB"
expect "node-api CPU stays small during 32 MiB (< 3000 ms)" \
	'[ $((c1 - c0)) -lt 3000 ]' "$((c1 - c0)) ms"
expect "node-api is still alive" 'kill -0 "$NP" 2>/dev/null' "gone"
tap_done

#!/bin/bash
# Slow downloads (GET /v1/sandboxes/ID/files) cost no CPU while waiting, and
# arrive byte-exact, directly from node-api and through the edge, with
# node-api's lws service buffer at 32 KiB (TETHER_NODE_SERV_BUF). lws 4.1.6
# neither reads nor stops polling a client socket while a response is in
# progress (h1 state DOING_TRANSACTION): a client that sent anything after
# its request (a pipelined byte) or half-closed (shutdown(SHUT_WR)) kept
# EPOLLIN level-triggered for the whole response, and a stalled reader then
# made node-api (or the edge) spin at 100 % CPU. Checks: rate-limited curl
# downloads through both; a reader that stalls 2 s after a pipelined byte
# or a half-close, whose daemon must stay idle meanwhile; the honest read
# afterwards. CPU from /proc/PID/stat. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
workdir tether-slowdl
scratch_home
BASE=$(port_base)
STATE=$WORK/state
T=$ROOT/build/tether
export TETHER_NODE_SERV_BUF=32768
SIZE=$((12 * 1024 * 1024))

cluster_up_or_bail "cluster up (node-api service buffer 32 KiB)" 1
ID=$("$T" create --worker w1 2>"$WORK/err")
expect "create a sandbox" '[ -n "$ID" ]' "$(cat "$WORK/err")"
NP=$(pgrep -f "tetherd node --id w1 --listen 127.0.0.1:$((BASE + 11)) " | head -n1)
EP=$(pgrep -f "tetherd edge --listen 127.0.0.1:$((BASE + 1)) " | head -n1)
expect "node-api and edge found" '[ -n "$NP" ] && [ -n "$EP" ]' "node=$NP edge=$EP"
head -c "$SIZE" /dev/urandom >"$WORK/big"
timeout 20 "$T" cp "$WORK/big" "$ID:/tmp/big" >"$WORK/o" 2>&1
okrc $? "a 12 MiB file uploaded"
KEY=$(cluster_key)
TOK=$("$T" cap "$ID" 2>/dev/null | jget 'd["token"]' 2>/dev/null)
expect "a capability for node-api" '[[ $TOK == v4.public.* ]]' "$TOK"
NODE=http://127.0.0.1:$((BASE + 11))
EDGE=http://127.0.0.1:$((BASE + 1))
Q="/v1/sandboxes/$ID/files?path=/tmp/big"

HZ=$(getconf CLK_TCK)
# cpu_ms PID: the process's user+system CPU time so far, in ms.
cpu_ms() { awk -v hz="$HZ" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$1/stat"; }

# slow_curl NAME URL AUTH: a download rate-limited to 4 MiB/s (3 s): exact
# bytes, and node-api and the edge each spend little CPU on it.
slow_curl() {
	local n0 e0 n1 e1
	n0=$(cpu_ms "$NP"); e0=$(cpu_ms "$EP")
	curl -s -m 20 --limit-rate 4M -o "$WORK/dl" -H "Authorization: $3" "$2$Q"
	okrc "$(cmp -s "$WORK/big" "$WORK/dl"; echo $?)" "$1: rate-limited download is byte-exact"
	n1=$(cpu_ms "$NP"); e1=$(cpu_ms "$EP")
	echo "# $1: 12 MiB at 4 MiB/s: node-api $((n1 - n0)) ms, edge $((e1 - e0)) ms CPU"
	expect "$1: node-api and edge CPU stay small (< 800 ms each)" \
		'[ $((n1 - n0)) -lt 800 ] && [ $((e1 - e0)) -lt 800 ]' \
		"node-api $((n1 - n0)) ms, edge $((e1 - e0)) ms"
}
slow_curl node "$NODE" "Capability $TOK"
slow_curl edge "$EDGE" "Bearer $KEY"

# stall PORT AUTH MODE: GET the file, read 1 MiB, then MODE ("pipeline":
# send one more byte, as a pipelining client would; "halfclose":
# shutdown(SHUT_WR)), stop reading for 2 s, then read what comes (10 s at
# most, up to the file's size). Prints "STALL_CPU_MS BYTES_AFTER_HEADERS" where STALL_CPU_MS is the
# CPU the daemons in PIDS spent during the stall.
stall() {
	PIDS="$NP $EP" HZ=$HZ timeout 30 python3 - "$@" "$Q" "$SIZE" <<'PY'
import os, socket, sys, time
port, auth, mode, q = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
size = int(sys.argv[5])
hz = int(os.environ["HZ"])
def cpu():
    t = 0
    for p in os.environ["PIDS"].split():
        f = open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()
        t += int(f[11]) + int(f[12])
    return t * 1000 // hz
s = socket.create_connection(("127.0.0.1", port))
s.sendall(("GET %s HTTP/1.1\r\nHost: t\r\nAuthorization: %s\r\n\r\n" % (q, auth)).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    b = s.recv(65536)
    if not b:
        break
    buf += b
got = len(buf.split(b"\r\n\r\n", 1)[1]) if b"\r\n\r\n" in buf else 0
while got < (1 << 20):
    b = s.recv(65536)
    if not b:
        break
    got += len(b)
if mode == "pipeline":
    s.sendall(b"G")
else:
    s.shutdown(socket.SHUT_WR)
c0 = cpu()
time.sleep(2)
c1 = cpu()
s.settimeout(10)
try:
    while got < size:
        b = s.recv(65536)
        if not b:
            break
        got += len(b)
except OSError:
    pass
print(c1 - c0, got)
PY
}
for tgt in node edge; do
	if [ $tgt = node ]; then port=$((BASE + 11)); auth="Capability $TOK"
	else port=$((BASE + 1)); auth="Bearer $KEY"; fi
	for mode in pipeline halfclose; do
		read -r ms got <<<"$(stall "$port" "$auth" "$mode")"
		echo "# $tgt $mode: daemons' CPU during a 2 s stall: ${ms:-?} ms; $got bytes read"
		expect "$tgt: a stalled reader after a $mode costs no CPU (< 300 ms in 2 s)" \
			'[ -n "$ms" ] && [ "$ms" -lt 300 ]' "cpu=${ms:-none} ms"
	done
done
expect "node-api and edge still alive" 'kill -0 "$NP" 2>/dev/null && kill -0 "$EP" 2>/dev/null' "gone"
code=$(curl -s -m 20 -o "$WORK/dl" -w '%{http_code}' -H "Authorization: Bearer $KEY" "$EDGE$Q")
expect "the honest read afterwards: 200, byte-exact" \
	'[ "$code" = 200 ] && cmp -s "$WORK/big" "$WORK/dl"' "code=$code"
tap_done

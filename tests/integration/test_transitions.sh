#!/bin/bash
# Transitions are absorbed, not surfaced (SPEC §7, §8): on a real cluster,
# operations sent while their sandbox migrates wait for the migration and
# run on the execution that follows; lifecycle calls queue behind a
# transition in progress; a streamed upload refused by a receiver
# (RefreshRoute) is rebuilt whole, since the edge sends its body only after
# the node's 100 Continue. The wait is what absorbs them: with
# "X-Tether-Wait: 0" the same call meets the transition (409). A paused
# sandbox is refused at once with its reason. And an upload answered before
# its body was read never leaves the edge spinning (a fake control plane
# refuses it after a delay, with 4 MiB already buffered). Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-trans
T=$ROOT/build/tether
TT_CURL_MAX=60

cluster_up_or_bail "cluster up (3 workers)" 3
KEY=$(cluster_key)
EDGE=http://127.0.0.1:$((BASE + 1))
ID=$("$T" create --worker w1 2>"$WORK/err")
expect "create a sandbox on w1" '[ -n "$ID" ]' "$(cat "$WORK/err")"

# op NAME ARGS...: one operation through the edge; prints the HTTP status
# (the body of anything but a 200 is kept in WORK/failures).
op() {
	local code
	code=$(tcurl -o "$WORK/op.$1" -w '%{http_code}' -H "Authorization: Bearer $KEY" "${@:2}")
	[ "$code" = 200 ] || { echo "$1 $code $(head -c 300 "$WORK/op.$1")" >>"$WORK/failures"; }
	echo "$code"
}
# migrate_loop TAG TARGETS...: migrates ID to each target in turn, one line
# "TAG TARGET STATUS" per call into WORK/mig.TAG.
migrate_loop() {
	local tag=$1 w
	shift
	for w in "$@"; do
		echo "$tag $w $(tcurl -o "$WORK/mig.$tag.body" -w '%{http_code}' \
			-H "Authorization: Bearer $KEY" -d "{\"worker\":\"$w\"}" \
			"$EDGE/v1/sandboxes/$ID/migrate")" >>"$WORK/mig.$tag"
	done
}

# ---- operations during migrations --------------------------------------------
head -c 300000 /dev/urandom >"$WORK/blob"
: >"$WORK/codes"
(
	for i in $(seq 1 60); do
		echo "exec $(op e -d '{"cmd":["sh","-c","echo hi"]}' "$EDGE/v1/sandboxes/$ID/exec")"
		# curl sends this one with Expect: 100-continue, as the CLI would not
		echo "put $(op p -T "$WORK/blob" "$EDGE/v1/sandboxes/$ID/files?path=/tmp/b$i")"
		echo "get $(op g "$EDGE/v1/sandboxes/$ID/files?path=/tmp/b$i")"
		cmp -s "$WORK/blob" "$WORK/op.g" || echo "get-differs $i"
	done >>"$WORK/codes"
) &
ops=$!
migrate_loop a w2 w3 w1 w2 w3 w1 &
ma=$!
migrate_loop b w3 w1 w2 w3 w1 w2 &
mb=$!
wait "$ops" "$ma" "$mb"
n_ok=$(grep -c ' 200$' "$WORK/codes")
expect "180 operations during 12 concurrent migrate calls: all answered 200" \
	'[ "$n_ok" = 180 ]' "$(grep -v ' 200$' "$WORK/codes" | sort | uniq -c; cat "$WORK/failures" 2>/dev/null)"
expect "every read during the migrations returned the bytes written" \
	'! grep -q get-differs "$WORK/codes"' "$(grep get-differs "$WORK/codes")"
cat "$WORK/mig.a" "$WORK/mig.b" >"$WORK/mig.all"
n_mig=$(grep -c ' 200$' "$WORK/mig.all")
# two loops racing: a call whose target the other one reached first is the
# one conflict left (exactly one winner); none meets "is pausing"
bad=$(grep -v ' 200$' "$WORK/mig.all" | grep -v ' 409$')
expect "migrate calls from two loops: each 200 or 409 (already there)" \
	'[ -z "$bad" ] && [ "$n_mig" -ge 6 ]' "$(cat "$WORK/mig.all")"
expect "no lifecycle call met a transition ('is pausing')" \
	'! grep -q "is pausing\|is resuming" "$WORK"/mig.*.body' "$(cat "$WORK"/mig.*.body)"
gen=$("$T" info "$ID" --json | jget 'd["generation"]')
expect "the sandbox moved $n_mig times (generation $gen)" '[ "$gen" -ge $((n_mig + 1)) ]' ""

# ---- a lifecycle call queues behind a pause in progress ---------------------------
on=$("$T" info "$ID" --json | jget 'd["worker"]')
to=w1
[ "$on" = w1 ] && to=w2
st=$(tcurl -o "$WORK/p" -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" \
	"$EDGE/v1/sandboxes/$ID/pause?wait=0")
st2=$(tcurl -o "$WORK/r" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-H 'X-Tether-Wait: 0' -d '{}' "$EDGE/v1/sandboxes/$ID/resume")
expect "with X-Tether-Wait: 0 a resume meets the pause (409 is pausing)" \
	'[ "$st" = 202 ] && [ "$st2" = 409 ] && grep -q "is pausing" "$WORK/r"' \
	"pause $st, resume $st2: $(cat "$WORK/r")"
st=$(tcurl -o "$WORK/p" -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" \
	"$EDGE/v1/sandboxes/$ID/pause?wait=0")
st2=$(tcurl -o "$WORK/r" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-d "{\"worker\":\"$to\"}" "$EDGE/v1/sandboxes/$ID/resume")
# the first pause may still run: the second then queued behind it too
expect "a resume sent during a pause waits for it and then runs (200 on $to)" \
	'[ "$st2" = 200 ] && grep -q "\"worker\":\"$to\"" "$WORK/r"' \
	"pause $st $(cat "$WORK/p"), resume $st2: $(cat "$WORK/r")"

# ---- a paused sandbox: refused at once, with the reason ---------------------------
"$T" pause "$ID" >/dev/null 2>&1
t0=$(date +%s%N)
st=$(op x -d '{"cmd":["true"]}' "$EDGE/v1/sandboxes/$ID/exec")
ms=$((($(date +%s%N) - t0) / 1000000))
expect "an exec on a paused sandbox: 409 is paused, at once (${ms} ms)" \
	'[ "$st" = 409 ] && grep -q "is paused" "$WORK/op.x" && [ "$ms" -lt 2000 ]' \
	"$st $(cat "$WORK/op.x")"
"$T" resume "$ID" >/dev/null 2>&1

# ---- a streamed upload refused as stale is rebuilt whole -------------------------
# The edge caches the route; a migrate sent to the cp directly (not through
# the edge, which would drop its cache) leaves it stale.
op g "$EDGE/v1/sandboxes/$ID/files?path=/tmp/b1" >/dev/null
on=$("$T" info "$ID" --json | jget 'd["worker"]')
to=w1
[ "$on" = w1 ] && to=w3
r0=$(metric "$EDGE" 'tether_edge_rebuilt_attempts_total{why="refresh_route"}')
st=$(tcurl -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-d "{\"worker\":\"$to\"}" "$CP/v1/sandboxes/$ID/migrate")
head -c 3000000 /dev/urandom >"$WORK/big"
st2=$(op p -H 'Expect:' -T "$WORK/big" "$EDGE/v1/sandboxes/$ID/files?path=/tmp/big")
r1=$(metric "$EDGE" 'tether_edge_rebuilt_attempts_total{why="refresh_route"}')
op g "$EDGE/v1/sandboxes/$ID/files?path=/tmp/big" >/dev/null
expect "a 3 MB upload on a stale route is rebuilt once and lands whole" \
	'[ "$st" = 200 ] && [ "$st2" = 200 ] && [ "$r1" -gt "$r0" ] && cmp -s "$WORK/big" "$WORK/op.g"' \
	"migrate $st, put $st2 $(cat "$WORK/op.p"), rebuilt $r0 -> $r1"

# ---- an upload answered before its body is read: no spin --------------------------
# A fake control plane answers capability requests 409 after 1.5 s, while the
# client has sent 4 MiB (the edge holds 1 MiB and stops reading the rest).
FP=$(free_port)
EP=$(free_port)
python3 - "$FP" >"$WORK/fakecp.log" 2>&1 <<'EOF' &
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        time.sleep(1.5)
        b = b'{"error":"conflict","message":"sandbox is paused, not running"}'
        self.send_response(409)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
FAKE=$!
at_exit "kill $FAKE 2>/dev/null"
"$TETHERD" edge --listen "127.0.0.1:$EP" --cp "http://127.0.0.1:$FP" >"$WORK/edge2.log" 2>&1 &
E2=$!
at_exit "stop_pid $E2"
wait_until 50 curl -sf -m 2 "http://127.0.0.1:$EP/healthz"
python3 - "$EP" "$ID" >"$WORK/spin.out" 2>&1 <<'EOF'
import socket, sys, time
port, sbx = int(sys.argv[1]), sys.argv[2]
s = socket.create_connection(("127.0.0.1", port))
body = b"x" * (4 << 20)
s.sendall(("PUT /v1/sandboxes/%s/files?path=/tmp/x HTTP/1.1\r\nHost: a\r\n"
           "Authorization: Bearer k\r\nContent-Length: %d\r\n\r\n" % (sbx, len(body))).encode())
s.setblocking(False)
sent, t0, got = 0, time.time(), b""
while time.time() - t0 < 5 and b"\r\n\r\n" not in got:
    try:
        sent += s.send(body[sent:sent + 65536]) if sent < len(body) else 0
    except BlockingIOError:
        pass
    try:
        got += s.recv(65536)
    except BlockingIOError:
        time.sleep(0.01)
print("status", got.split(b"\r\n")[0].decode(errors="replace"))
time.sleep(1)
EOF
HZ=$(getconf CLK_TCK)
c0=$(awk -v hz="$HZ" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$E2/stat")
sleep 1
c1=$(awk -v hz="$HZ" '{ print int(($14 + $15) * 1000 / hz) }' "/proc/$E2/stat")
hz_ok=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$EP/healthz")
expect "an upload refused with 4 MiB unread is answered (409)" \
	'grep -q "409" "$WORK/spin.out"' "$(cat "$WORK/spin.out")"
expect "then the edge stays idle ($((c1 - c0)) ms of CPU in 1 s) and answers /healthz" \
	'[ $((c1 - c0)) -lt 200 ] && [ "$hz_ok" = 200 ]' "cpu $((c1 - c0)) ms, healthz $hz_ok"

"$T" rm "$ID" >/dev/null 2>&1
tap_done

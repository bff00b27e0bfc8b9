#!/bin/bash
# Streamed exec over WebSocket (docs/API.md "Streamed exec", SPEC §6) on a
# real cluster (`tether up --workers 2`): `tether exec` prints output as it
# comes (the first line long before the command ends), keeps stderr apart,
# propagates the exit status, forwards stdin, streams 20 MiB with bounded
# memory at the edge and the node; a stream through the edge after the
# sandbox was moved behind the edge's back succeeds with exactly one rebuilt
# attempt; a forged capability straight at the node's endpoint is closed
# with 4403 and the command never runs (the honest one does). Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-stream
EDGE=http://127.0.0.1:$((BASE + 1))
T=$ROOT/build/tether

cluster_up_or_bail "cluster up" 2
KEY=$(cluster_key)
ID=$("$T" create --worker w1 2>"$WORK/err")
expect "create a sandbox" '[ -n "$ID" ]' "$(cat "$WORK/err")"

# node_pid W: pid of this cluster's worker W's node-api (wN listens on
# BASE+10+N; another cluster on the machine may have a w1 too).
node_pid() { pgrep -f "tetherd node --id $1 --listen 127.0.0.1:$((BASE + 10 + ${1#w}))" | head -n1; }
edge_pid() { pgrep -f "tetherd edge --listen 127.0.0.1:$((BASE + 1))" | head -n1; }
hwm_kb() { awk '/^VmHWM/ { print $2 }' "/proc/$1/status"; }

# ---- timing: a line is printed while the command still runs ---------------
python3 - "$T" "$ID" >"$WORK/timing" 2>&1 <<'EOF'
import subprocess, sys, time
t0 = time.monotonic()
p = subprocess.Popen([sys.argv[1], "exec", sys.argv[2], "--", "sh", "-c",
                      "echo a; sleep 1; echo b"], stdout=subprocess.PIPE)
first = p.stdout.readline(); t1 = time.monotonic()
rest = p.stdout.read(); rc = p.wait(); t2 = time.monotonic()
print(first.decode().strip(), rest.decode().strip(), rc, round(t2 - t1, 3))
EOF
read -r first second rc gap <"$WORK/timing"
expect "exec streams: 'a' printed >= 0.8 s before the command ends" \
	'[ "$first" = a ] && [ "$second" = b ] && [ "$rc" = 0 ] && python3 -c "import sys; sys.exit(0 if $gap >= 0.8 else 1)"' \
	"$(cat "$WORK/timing")"

# ---- stderr apart, exit status -----------------------------------------------
"$T" exec "$ID" -- sh -c 'echo out; echo err >&2; exit 7' >"$WORK/o" 2>"$WORK/e"
rc=$?
expect "stdout and stderr are kept apart" \
	'[ "$(cat "$WORK/o")" = out ] && [ "$(cat "$WORK/e")" = err ]' \
	"stdout: $(cat "$WORK/o") / stderr: $(cat "$WORK/e")"
expect "the command's exit status propagates (7)" '[ "$rc" = 7 ]' "rc=$rc"
"$T" exec "$ID" -- true
okrc $? "exit status 0"

# ---- stdin ---------------------------------------------------------------------
head -c 300000 /dev/urandom | base64 -w 0 >"$WORK/in"
"$T" exec --stdin "$ID" -- sh -c 'wc -c' <"$WORK/in" >"$WORK/o" 2>"$WORK/e"
expect "--stdin forwards 400000 bytes of stdin" \
	'[ "$(tr -d " " <"$WORK/o")" = "$(wc -c <"$WORK/in" | tr -d " ")" ]' \
	"got $(cat "$WORK/o") $(cat "$WORK/e")"

# ---- 20 MiB with bounded memory ------------------------------------------------
EP=$(edge_pid) NP=$(node_pid w1)
e0=$(hwm_kb "$EP") n0=$(hwm_kb "$NP")
"$T" exec "$ID" -- sh -c 'head -c 20971520 /dev/zero' | wc -c >"$WORK/big"
e1=$(hwm_kb "$EP") n1=$(hwm_kb "$NP")
expect "20 MiB of output arrive whole" '[ "$(cat "$WORK/big")" = 20971520 ]' \
	"got $(cat "$WORK/big") bytes"
echo "# peak RSS growth during 20 MiB: edge $((e1 - e0)) KiB, node-api $((n1 - n0)) KiB"
expect "edge and node-api memory stay bounded (< 8 MiB growth each)" \
	'[ $((e1 - e0)) -lt 8192 ] && [ $((n1 - n0)) -lt 8192 ]' \
	"edge +$((e1 - e0)) KiB, node +$((n1 - n0)) KiB"

# ---- a stream after a move behind the edge's back: one rebuilt attempt --------
"$T" exec "$ID" -- true # the edge caches the route to w1
r0=$(metric "$EDGE" 'tether_edge_rebuilt_attempts_total{why="refresh_route"}')
c1=$(req_status POST "$CP/v1/sandboxes/$ID/pause" "Bearer $KEY")
c2=$(req_status POST "$CP/v1/sandboxes/$ID/resume" "Bearer $KEY" '{"worker":"w2"}')
expect "moved to w2 straight at the cp" '[ "$c1" = 200 ] && [ "$c2" = 200 ]' "$c1 $c2 $(cat "$TT_BODY")"
out=$("$T" exec "$ID" -- sh -c 'echo moved; exit 3' 2>&1)
rc=$?
r1=$(metric "$EDGE" 'tether_edge_rebuilt_attempts_total{why="refresh_route"}')
expect "stream after the move succeeds (exit 3 propagated)" \
	'[ "$out" = moved ] && [ "$rc" = 3 ]' "rc=$rc out=$out"
expect "exactly one rebuilt attempt" '[ "$((r1 - r0))" = 1 ]' "before $r0 after $r1"

# ---- forged capability straight at the node: 4403, nothing runs --------------
W2=$(curl -s -m 10 -H "Authorization: Bearer $KEY" "$CP/v1/sandboxes/$ID" | jget 'd["node_url"]')
CAP=$(curl -s -m 10 -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
	-d '{"purpose":"control","ops":["exec"]}' "$CP/v1/sandboxes/$ID/capabilities" | jget 'd["token"]')
# forge: change one character of the signed claims (a valid encoding whose
# signature no longer verifies)
FORGED=$(python3 -c 'import sys; t=sys.argv[1]; i=len("v4.public.")+20; print(t[:i]+("A" if t[i]!="A" else "B")+t[i+1:])' "$CAP")
# ws_exec TOKEN CMD: a minimal WebSocket client (test-only) at the node's
# endpoint; prints the close code and the server's text messages.
ws_exec() {
	python3 - "$W2" "$ID" "$1" "$2" <<'EOF'
import base64, json, os, socket, struct, sys, urllib.parse
url, sbx, tok, cmd = sys.argv[1:5]
u = urllib.parse.urlparse(url)
s = socket.create_connection((u.hostname, u.port), timeout=20)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall((f"GET /v1/sandboxes/{sbx}/exec/ws HTTP/1.1\r\nHost: {u.hostname}\r\n"
           f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
           f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: tether.exec.v1\r\n"
           f"Authorization: Capability {tok}\r\n\r\n").encode())
buf = b""
while b"\r\n\r\n" not in buf:
    d = s.recv(4096)
    if not d: print("no-upgrade"); sys.exit(0)
    buf += d
head, buf = buf.split(b"\r\n\r\n", 1)
if b" 101 " not in head.split(b"\r\n")[0]: print("no-upgrade"); sys.exit(0)
msg = json.dumps({"cmd": ["sh", "-c", cmd]}).encode()
mask = os.urandom(4)
s.sendall(bytes([0x81, 0x80 | len(msg)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(msg)))
def need(n):
    global buf
    while len(buf) < n:
        d = s.recv(65536)
        if not d: raise EOFError
        buf += d
    r, buf = buf[:n], buf[n:]; return r
try:
    while True:
        b0, b1 = need(2); n = b1 & 0x7f
        if n == 126: n = struct.unpack(">H", need(2))[0]
        elif n == 127: n = struct.unpack(">Q", need(8))[0]
        p = need(n); op = b0 & 0x0f
        if op == 1: print("text", p.decode())
        elif op == 8: print("close", struct.unpack(">H", p[:2])[0] if len(p) >= 2 else 0); break
except EOFError:
    print("eof")
EOF
}
MARK=/tmp/forged-$$ # inside the sandbox
ws_exec "$FORGED" "touch $MARK" >"$WORK/forged" 2>&1
ran=$("$T" exec "$ID" -- sh -c "test -e $MARK && echo ran || echo no")
expect "forged capability at the node: closed with 4403, deny decision" \
	'grep -q "^close 4403" "$WORK/forged" && grep -q "\"decision\":\"deny\",\"reason\":\"bad_signature\"" "$WORK/forged"' \
	"$(cat "$WORK/forged")"
expect "the forged stream's command never ran" '[ "$ran" = no ]' "$ran"
ws_exec "$CAP" "echo honest" >"$WORK/honest" 2>&1
expect "the honest capability at the node: allow, exit 0, close 1000" \
	'grep -q "\"decision\":\"allow\"" "$WORK/honest" && grep -q "\"type\":\"exit\",\|\"exit_code\":0" "$WORK/honest" && grep -q "^close 1000" "$WORK/honest"' \
	"$(cat "$WORK/honest")"

# ---- refusals through the edge ------------------------------------------------
out=$(TETHER_API_KEY=not-a-key "$T" exec "$ID" -- true 2>&1)
rc=$?
expect "a bad API key: exit 125 (tether's own failure) with a one-line error" '[ "$rc" = 125 ] && [ "$(echo "$out" | wc -l)" = 1 ]' "rc=$rc $out"
out=$("$T" exec sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa -- true 2>&1)
rc=$?
expect "an unknown sandbox: exit 125, not found" '[ "$rc" = 125 ] && echo "$out" | grep -qi "not.found\|unknown\|no such"' "rc=$rc $out"

# ---- the start message comes before authentication: bounded, and timed -------
# (before, anyone could hold 1 MiB per connection at the edge, for good).
python3 - "$BASE" "$ID" >"$WORK/wsstart" 2>&1 <<'PY'
import base64, os, socket, struct, sys, time
port, sbx = int(sys.argv[1]) + 1, sys.argv[2]
def conn():
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /v1/sandboxes/{sbx}/exec/ws HTTP/1.1\r\nHost: x\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
               "Sec-WebSocket-Protocol: tether.exec.v1\r\n"
               "Authorization: Bearer not-a-key\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return s
def frame(payload, fin=True):
    mask = os.urandom(4)
    n = len(payload)
    hdr = bytes([0x81 if fin else 0x01])
    hdr += bytes([0x80 | n]) if n < 126 else (bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
    return hdr + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
def closed_with(s):
    data = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            data += d
    except OSError:
        pass
    while len(data) >= 2:  # server frames are unmasked
        op, n, off = data[0] & 0x0f, data[1] & 0x7f, 2
        if n == 126:
            n, off = struct.unpack(">H", data[2:4])[0], 4
        elif n == 127:
            n, off = struct.unpack(">Q", data[2:10])[0], 10
        if op == 8:
            return struct.unpack(">H", data[off:off + 2])[0] if n >= 2 else None
        data = data[off + n:]
    return None
s = conn()
s.sendall(frame(b"{" + b" " * 70000 + b"}", fin=False))
print("oversized", closed_with(s))
s = conn()
t0 = time.time()
code = closed_with(s)
print("silent", round(time.time() - t0))
PY
expect "edge: a start message over 60 KiB, before authentication, is refused (1009)" \
	'grep -q "^oversized 1009$" "$WORK/wsstart"' "$(cat "$WORK/wsstart")"
expect "edge: a connection that sends no start message is closed after ~10 s" \
	'secs=$(sed -n "s/^silent //p" "$WORK/wsstart"); [ -n "$secs" ] && [ "$secs" -ge 8 ] && [ "$secs" -le 14 ]' "$(cat "$WORK/wsstart")"

# ---- a pause cancels an open input stream at once (SPEC §6/§7) ----------------
# pause_cancels NAME ERRFILE: pauses $PS while the stream $XP runs; ok when
# the pause succeeds and the stream ends at once (well within the 5 s
# drain) with refresh_route in ERRFILE.
pause_cancels() {
	local t0 t1 prc xrc errf=$2
	t0=$(date +%s%N)
	"$T" pause "$PS" >/dev/null 2>&1; prc=$?
	wait "$XP"; xrc=$?
	t1=$(date +%s%N)
	expect "$1" '[ "$prc" = 0 ] && [ "$xrc" != 0 ] && grep -q "refresh_route" "$errf" && [ $(( (t1 - t0) / 1000000 )) -lt 4000 ]' \
		"pause=$prc exec=$xrc ms=$(( (t1 - t0) / 1000000 )) err=$(cat "$errf")"
}
PS=$("$T" create --worker w1 2>/dev/null)
mkfifo "$WORK/in.fifo"
sleep 60 >"$WORK/in.fifo" &
HOLD=$!
"$T" exec --stdin "$PS" -- sh -c 'echo open; cat' <"$WORK/in.fifo" >"$WORK/po" 2>"$WORK/pe" &
XP=$!
wait_until 100 grep -q open "$WORK/po"
pause_cancels "a pause cancels an open stdin stream (refresh_route) before its drain deadline" "$WORK/pe"
kill "$HOLD" 2>/dev/null; wait "$HOLD" 2>/dev/null
"$T" rm "$PS" >/dev/null 2>&1

# ... while a streamed exec without stdin is an operation in flight like an
# HTTP exec: the pause's drain lets a short one finish (the caller never
# sees the pause), and cuts an endless one at the drain bound (5 s) with
# transport, never repeated.
PS=$("$T" create --worker w1 2>/dev/null)
"$T" exec "$PS" -- sh -c 'echo begin; sleep 1; echo end' >"$WORK/so" 2>"$WORK/se" &
XP=$!
wait_until 100 grep -q begin "$WORK/so"
"$T" pause "$PS" >/dev/null 2>&1; prc=$?
wait "$XP"; xrc=$?
expect "a short output-only exec stream finishes during a pause (exit 0, its output whole)" \
	'[ "$prc" = 0 ] && [ "$xrc" = 0 ] && [ "$(cat "$WORK/so")" = "$(printf "begin\nend")" ]' \
	"pause=$prc exec=$xrc out=$(cat "$WORK/so") err=$(cat "$WORK/se")"
"$T" resume "$PS" >/dev/null 2>&1
"$T" exec "$PS" -- sh -c 'while :; do echo tick; sleep 0.2; done' >"$WORK/to" 2>"$WORK/te" &
XP=$!
wait_until 100 grep -q tick "$WORK/to"
t0=$(date +%s%N)
"$T" pause "$PS" >/dev/null 2>&1; prc=$?
wait "$XP"; xrc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
expect "an endless output-only stream is cut at the drain bound with transport (${ms} ms)" \
	'[ "$prc" = 0 ] && [ "$xrc" != 0 ] && grep -q "transport" "$WORK/te" && [ "$ms" -ge 4500 ] && [ "$ms" -lt 9000 ]' \
	"pause=$prc exec=$xrc ms=$ms err=$(cat "$WORK/te")"
"$T" rm "$PS" >/dev/null 2>&1

# ---- a backend that drops mid-stream: transport error, never repeated --------
# (last: tether up restarts the node-api, but its sandboxes do not survive its
# death yet)
"$T" exec "$ID" -- sh -c "echo started; sleep 30" >"$WORK/o" 2>"$WORK/e" &
XP=$!
wait_until 100 grep -q started "$WORK/o"
kill -KILL "$(node_pid "$(curl -s -m 10 -H "Authorization: Bearer $KEY" "$CP/v1/sandboxes/$ID" | jget 'd["worker"]')")"
wait "$XP"
rc=$?
expect "node-api killed mid-stream: exit 125, transport error, 'not repeated'" \
	'[ "$rc" = 125 ] && grep -q "transport" "$WORK/e" && grep -q "not repeated" "$WORK/e" && [ "$(cat "$WORK/o")" = started ]' \
	"rc=$rc out=$(cat "$WORK/o") err=$(cat "$WORK/e")"

tap_done

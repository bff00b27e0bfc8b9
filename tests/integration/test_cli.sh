#!/bin/bash
# End-to-end: `tether up` with two workers in a temp HOME, then every CLI
# verb, node admission (RefreshRoute for the wrong worker, Deny for a forged
# signature, Allow for the honest request) and sandbox isolation seen
# through exec. Prints TAP; the cluster is stopped on exit.
set -u
. "$(dirname "$0")/lib.sh"
workdir tether-cli
# every CLI call is bounded, so a hung operation fails its check instead
# of hanging the suite
T=$WORK/tether
printf '#!/bin/sh\nexec timeout 60 %s "$@"\n' "$ROOT/build/tether" >"$T"
chmod +x "$T"
scratch_home
BASE=$(port_base)
STATE=$WORK/state
LISTENER_PID=
at_exit '[ -n "$LISTENER_PID" ] && kill "$LISTENER_PID" 2>/dev/null'

# ---- up ----------------------------------------------------------------------
cluster_up_or_bail "tether up: cluster ready" 2
cfg=$HOME/.config/tether/config
if [ "$(stat -c %a "$cfg")" = 600 ] && grep -q "^url=http://127.0.0.1:$((BASE + 1))$" "$cfg"; then
	ok "up wrote a 0600 config pointing at the edge"
else notok "up wrote a 0600 config pointing at the edge" "$(ls -l "$cfg")"; fi
check "welcome names the edge and next commands" grep -q "tether create" "$WORK/up.out"

# ---- lifecycle ---------------------------------------------------------------
if "$T" workers >"$WORK/w" 2>&1 && grep -q "^w1 .*up" "$WORK/w" && grep -q "^w2 .*up" "$WORK/w"; then
	ok "workers lists w1 and w2 up"; else notok "workers lists w1 and w2 up" "$(cat "$WORK/w")"; fi
S1=$("$T" create --worker w1 2>"$WORK/e1")
S2=$("$T" create --worker w2 2>"$WORK/e2")
if [[ $S1 =~ ^sbx_[a-z2-7]{26}$ ]]; then ok "create --worker w1 prints an id"; else notok "create --worker w1 prints an id" "$S1 $(cat "$WORK/e1")"; fi
if [[ $S2 =~ ^sbx_[a-z2-7]{26}$ ]]; then ok "create --worker w2 prints an id"; else notok "create --worker w2 prints an id" "$S2 $(cat "$WORK/e2")"; fi
S3=$("$T" create 2>"$WORK/e3")
if [[ $S3 =~ ^sbx_ ]]; then ok "create (placed by the cp)"; else notok "create (placed by the cp)" "$(cat "$WORK/e3")"; fi
"$T" ls >"$WORK/ls" 2>&1
if head -n1 "$WORK/ls" | grep -qE '^ID +STATE +GEN +WORKER$' && grep -q "^$S1 .* 1  w1$" "$WORK/ls" &&
   grep -q "^$S2 .* 1  w2$" "$WORK/ls"; then ok "ls: aligned table with both sandboxes"
else notok "ls: aligned table with both sandboxes" "$(cat "$WORK/ls")"; fi
info=$("$T" info "$S1" --json 2>&1)
if [ "$(echo "$info" | jget 'd["generation"], d["worker"], d["state"]')" = "(1, 'w1', 'running')" ]; then
	ok "info --json: generation 1, worker w1, running"; else notok "info --json: generation 1, worker w1, running" "$info"; fi
info2=$("$T" info "$S2" --json 2>&1)
if [ "$(echo "$info2" | jget 'd["worker"]')" = w2 ]; then ok "info: second sandbox on w2"; else notok "info: second sandbox on w2" "$info2"; fi

# ---- exec --------------------------------------------------------------------
out=$("$T" exec "$S1" -- sh -c 'echo hi; echo oops >&2; exit 3' 2>"$WORK/err"); rc=$?
if [ "$out" = hi ] && [ $rc = 3 ] && [ "$(cat "$WORK/err")" = oops ]; then
	ok "exec: stdout, stderr and exit status 3 propagate"
else notok "exec: stdout, stderr and exit status 3 propagate" "rc=$rc out=$out err=$(cat "$WORK/err")"; fi
out=$("$T" exec "$S2" -- echo on-w2 2>&1)
if [ "$out" = on-w2 ]; then ok "exec on the w2 sandbox"; else notok "exec on the w2 sandbox" "$out"; fi
code=$(tcurl -o "$TT_BODY" -w '%{http_code}' -X POST "http://127.0.0.1:$((BASE + 1))/v1/sandboxes/$S1/exec" \
	-H "Authorization: Bearer $(cluster_key)" -H 'Transfer-Encoding: chunked' \
	-H 'Content-Type: application/json' --data-binary '{"cmd":["touch","/tmp/chunked"]}')
out=$("$T" exec "$S1" -- sh -c 'test -e /tmp/chunked && echo ran || echo not-run' 2>&1)
if [ "$code" = 411 ] && [ "$out" = not-run ]; then ok "edge: a chunked exec body gets 411 and runs nothing"
else notok "edge: a chunked exec body gets 411 and runs nothing" "code $code out $out $(cat "$TT_BODY")"; fi

# ---- cp ----------------------------------------------------------------------
head -c $((3 * 1024 * 1024 + 17)) /dev/urandom >"$WORK/in.bin"
check "cp local -> sandbox (3 MiB)" "$T" cp "$WORK/in.bin" "$S1:/tmp/in.bin"
check "cp sandbox -> local" "$T" cp "$S1:/tmp/in.bin" "$WORK/back.bin"
check "cp round trip is byte-exact" cmp "$WORK/in.bin" "$WORK/back.bin"
sz=$("$T" exec "$S1" -- sh -c 'wc -c < /tmp/in.bin' 2>&1)
if [ "$sz" = $((3 * 1024 * 1024 + 17)) ]; then ok "file in the sandbox has the right size"; else notok "file in the sandbox has the right size" "$sz"; fi
"$T" cp "$WORK/nope.bin" "$S1:/tmp/x" >"$WORK/o" 2>"$WORK/e"; rc=$?
if [ $rc = 1 ] && [ "$(wc -l <"$WORK/e")" = 1 ] && grep -q '^tether: ' "$WORK/e"; then
	ok "cp of a missing local file: exit 1, one line"; else notok "cp of a missing local file: exit 1, one line" "rc=$rc $(cat "$WORK/e")"; fi
"$T" cp "$S1:/tmp/does-not-exist" "$WORK/x.bin" >"$WORK/o" 2>"$WORK/e"; rc=$?
if [ $rc = 1 ] && [ "$(wc -l <"$WORK/e")" = 1 ] && [ ! -e "$WORK/x.bin" ] &&
   [ -z "$(ls -A "$WORK" | grep '^\.x\.bin')" ]; then
	ok "cp of a missing remote file: exit 1, one line, no partial file"
else notok "cp of a missing remote file: exit 1, one line, no partial file" "rc=$rc $(cat "$WORK/e")"; fi

# ---- cap + node admission ----------------------------------------------------
"$T" cap "$S1" >"$WORK/cap.json" 2>&1
TOK=$(jget 'd["token"]' <"$WORK/cap.json" 2>/dev/null)
NODE=$(jget 'd["node_url"]' <"$WORK/cap.json" 2>/dev/null)
if [[ $TOK == v4.public.* ]] && [ "$NODE" = "http://127.0.0.1:$((BASE + 11))" ] &&
   grep -q expires_at "$WORK/cap.json"; then ok "cap prints token, expires_at, node_url"
else notok "cap prints token, expires_at, node_url" "$(cat "$WORK/cap.json")"; fi
if "$T" cap inspect "$TOK" >"$WORK/insp" 2>&1 && grep -q "\"sbx\": \"$S1\"" "$WORK/insp" &&
   grep -q '"wrk": "w1"' "$WORK/insp"; then ok "cap inspect decodes the token"
else notok "cap inspect decodes the token" "$(cat "$WORK/insp")"; fi

body='{"cmd":["echo","direct"]}'
W1=http://127.0.0.1:$((BASE + 11)); W2=http://127.0.0.1:$((BASE + 12))
code=$(curl -s -m 60 -o "$WORK/r" -w '%{http_code}' -H "Authorization: Capability $TOK" \
	-H 'Content-Type: application/json' -d "$body" "$W1/v1/sandboxes/$S1/exec")
if [ "$code" = 200 ] && grep -q direct "$WORK/r"; then ok "node w1 admits the honest capability"
else notok "node w1 admits the honest capability" "$code $(cat "$WORK/r")"; fi
code=$(curl -s -m 60 -o "$WORK/r" -w '%{http_code}' -H "Authorization: Capability $TOK" \
	-H 'Content-Type: application/json' -d "$body" "$W2/v1/sandboxes/$S1/exec")
# w2 never recorded w1's execution (protocol: "not ours: record nothing"), so
# its reason is not_installed; a receiver holding another route says
# wrong_worker. Either way: RefreshRoute, nothing forwarded.
dec=$(jget 'd["decision"] + " " + d["reason"]' <"$WORK/r" 2>/dev/null)
if [ "$code" = 409 ] && { [ "$dec" = "refresh_route wrong_worker" ] || [ "$dec" = "refresh_route not_installed" ]; }; then
	ok "node w2 answers 409 ($dec) to w1's capability"
else notok "node w2 answers 409 refresh_route to w1's capability" "$code $(cat "$WORK/r")"; fi
# tamper one character of the signature (the last char of the payload part)
FORGED=$(python3 -c '
import sys
t = sys.argv[1]; head, payload, footer = t[:10], t[10:].split(".")[0], t[10:].split(".")[1:]
i = len(payload) - 10
c = "A" if payload[i] != "A" else "B"
print(head + payload[:i] + c + payload[i + 1:] + "".join("." + f for f in footer))' "$TOK")
code=$(curl -s -m 60 -o "$WORK/r" -w '%{http_code}' -H "Authorization: Capability $FORGED" \
	-H 'Content-Type: application/json' -d "$body" "$W1/v1/sandboxes/$S1/exec")
if [ "$code" = 403 ] && [ "$(jget 'd["decision"]' <"$WORK/r")" = deny ] &&
   ! grep -q installed_generation "$WORK/r"; then ok "forged signature: 403 deny, no identity leaked"
else notok "forged signature: 403 deny, no identity leaked" "$code $(cat "$WORK/r")"; fi
code=$(curl -s -m 60 -o "$WORK/r" -w '%{http_code}' -d "$body" "http://127.0.0.1:$((BASE + 1))/v1/sandboxes/$S1/exec")
if [ "$code" = 401 ]; then ok "edge: operation without an API key is 401"; else notok "edge: operation without an API key is 401" "$code"; fi
code=$(curl -s -m 60 -o "$WORK/r" -w '%{http_code}' -H "Authorization: Bearer wrong-key" -d "$body" \
	"http://127.0.0.1:$((BASE + 1))/v1/sandboxes/$S1/exec")
if [ "$code" = 401 ]; then ok "edge: operation with a wrong API key is 401 (cp decides)"; else notok "edge: operation with a wrong API key is 401 (cp decides)" "$code $(cat "$WORK/r")"; fi

# ---- file downloads: Content-Length, broken reads, listings ------------------
KEY=$(cluster_key)
EDGE=http://127.0.0.1:$((BASE + 1))
insz=$((3 * 1024 * 1024 + 17))
# hdr FILE NAME: the value of header NAME in a curl -D dump ("" if absent).
hdr() { tr -d '\r' <"$1" | sed -n "s/^$2: *//Ip" | tail -n 1; }
code=$(curl -s -m 60 -D "$WORK/h" -o "$WORK/dl" -w '%{http_code}' -H "Authorization: Capability $TOK" \
	"$W1/v1/sandboxes/$S1/files?path=/tmp/in.bin")
if [ "$code" = 200 ] && [ "$(hdr "$WORK/h" Content-Length)" = "$insz" ] &&
   [ -z "$(hdr "$WORK/h" Transfer-Encoding)" ] && cmp -s "$WORK/in.bin" "$WORK/dl"; then
	ok "node: file GET has Content-Length = file size, no chunking, exact bytes"
else notok "node: file GET has Content-Length = file size, no chunking, exact bytes" "$code $(cat "$WORK/h")"; fi
code=$(curl -s -m 60 -D "$WORK/h" -o "$WORK/dl" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	"$EDGE/v1/sandboxes/$S1/files?path=/tmp/in.bin")
if [ "$code" = 200 ] && [ "$(hdr "$WORK/h" Content-Length)" = "$insz" ] &&
   [ -z "$(hdr "$WORK/h" Transfer-Encoding)" ] && cmp -s "$WORK/in.bin" "$WORK/dl"; then
	ok "edge: passes Content-Length through, exact bytes"
else notok "edge: passes Content-Length through, exact bytes" "$code $(cat "$WORK/h")"; fi
"$T" exec "$S1" -- sh -c ': > /tmp/empty' >/dev/null 2>&1
code=$(curl -s -m 60 -D "$WORK/h" -o "$WORK/dl" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	"$EDGE/v1/sandboxes/$S1/files?path=/tmp/empty")
if [ "$code" = 200 ] && [ "$(hdr "$WORK/h" Content-Length)" = 0 ] && [ ! -s "$WORK/dl" ]; then
	ok "empty file: 200, Content-Length 0"
else notok "empty file: 200, Content-Length 0" "$code $(cat "$WORK/h")"; fi
# A 64 MiB file read by a slow client, truncated in the sandbox meanwhile:
# the download must fail (closed short of Content-Length), never succeed short.
# shrink_read URL AUTH: prints "curl-exit bytes content-length".
shrink_read() {
	"$T" exec "$S1" -- sh -c 'head -c 67108864 /dev/zero > /tmp/shrink' >/dev/null 2>&1
	curl -s -m 120 --limit-rate 4M -D "$WORK/sh" -o "$WORK/sdl" -H "Authorization: $2" \
		"$1/v1/sandboxes/$S1/files?path=/tmp/shrink" &
	local cpid=$!
	sleep 1
	"$T" exec "$S1" -- truncate -s 1000 /tmp/shrink >/dev/null 2>&1
	wait $cpid
	echo "$? $(stat -c %s "$WORK/sdl" 2>/dev/null) $(hdr "$WORK/sh" Content-Length)"
}
read -r rc got len <<<"$(shrink_read "$W1" "Capability $TOK")"
if [ "$rc" = 18 ] && [ "$len" = 67108864 ] && [ "$got" -lt 67108864 ]; then
	ok "node: file shrinking during the read -> transfer cut short (curl 18, $got of $len bytes)"
else notok "node: file shrinking during the read -> transfer cut short" "rc=$rc got=$got len=$len"; fi
read -r rc got len <<<"$(shrink_read "$EDGE" "Bearer $KEY")"
if [ "$rc" = 18 ] && [ "$len" = 67108864 ] && [ "$got" -lt 67108864 ]; then
	ok "edge: file shrinking during the read -> transfer cut short (curl 18, $got of $len bytes)"
else notok "edge: file shrinking during the read -> transfer cut short" "rc=$rc got=$got len=$len"; fi
code=$(curl -s -m 60 -o "$WORK/dl" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	"$EDGE/v1/sandboxes/$S1/files?path=/tmp/shrink")
if [ "$code" = 200 ] && [ "$(stat -c %s "$WORK/dl")" = 1000 ]; then ok "the honest read of the shrunk file: 1000 bytes"
else notok "the honest read of the shrunk file: 1000 bytes" "$code $(stat -c %s "$WORK/dl")"; fi
# Listings larger than one 64 KiB frame stream through; over 10000 is 413.
"$T" exec "$S1" -- sh -c 'mkdir /tmp/many && cd /tmp/many && i=0; while [ $i -lt 3000 ]; do : > "entry-with-a-longish-name-$i"; i=$((i+1)); done' >/dev/null 2>&1
code=$(curl -s -m 60 -o "$WORK/ls.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	"$EDGE/v1/sandboxes/$S1/list?path=/tmp/many")
cnt=$(jget 'len(d["entries"]), d["entries"][0]["name"], "entries_total" in d' <"$WORK/ls.json" 2>&1)
if [ "$code" = 200 ] && [ "$cnt" = "(3000, 'entry-with-a-longish-name-0', False)" ] &&
   [ "$(stat -c %s "$WORK/ls.json")" -gt 65536 ]; then ok "list: 3000 entries (over 64 KiB) in one JSON body"
else notok "list: 3000 entries (over 64 KiB) in one JSON body" "$code $cnt"; fi
"$T" exec "$S1" -- sh -c 'cd /tmp/many && i=3000; while [ $i -lt 10001 ]; do : > "entry-with-a-longish-name-$i"; i=$((i+1)); done' >/dev/null 2>&1
code=$(curl -s -m 60 -o "$WORK/ls.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	"$EDGE/v1/sandboxes/$S1/list?path=/tmp/many")
if [ "$code" = 413 ] && [ "$(jget 'd["error"]' <"$WORK/ls.json")" = too_large ]; then ok "list: 10001 entries -> 413 too_large"
else notok "list: 10001 entries -> 413 too_large" "$code $(head -c 300 "$WORK/ls.json")"; fi

# ---- isolation through exec ---------------------------------------------------
pids=$("$T" exec "$S1" -- sh -c 'ls /proc | grep -E "^[0-9]+$"' 2>&1); rc=$?
if [ $rc = 0 ] && [ -n "$pids" ] && ! echo "$pids" | grep -qvE '^[0-9]+$' &&
   [ "$(echo "$pids" | wc -l)" -le 8 ] && ! echo "$pids" | grep -qx "$UP_PID"; then
	ok "ls /proc in the sandbox shows only its own pids"
else notok "ls /proc in the sandbox shows only its own pids" "$pids"; fi
"$T" exec "$S1" -- sh -c 'echo x > /usr/x' >/dev/null 2>&1; rc=$?
"$T" exec "$S1" -- sh -c 'echo x > /tmp/x && cat /tmp/x' >"$WORK/o" 2>&1; rc2=$?
if [ $rc != 0 ] && [ $rc2 = 0 ] && [ "$(cat "$WORK/o")" = x ]; then ok "writing /usr/x fails (while /tmp works)"
else notok "writing /usr/x fails (while /tmp works)" "rc=$rc rc2=$rc2 $(cat "$WORK/o")"; fi
LPORT=$((BASE + 9))
python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
while True:
    c, _ = s.accept(); c.sendall(b"host-secret\n"); c.close()' "$LPORT" &
LISTENER_PID=$!
host_got=
for _ in $(seq 1 50); do
	host_got=$(timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$LPORT && cat <&3" 2>&1)
	[ "$host_got" = host-secret ] && break
	sleep 0.1
done
"$T" exec "$S1" -- bash -c "exec 3<>/dev/tcp/127.0.0.1/$LPORT && cat <&3" >"$WORK/o" 2>&1; rc=$?
if [ "$host_got" = host-secret ] && [ $rc != 0 ] && ! grep -q host-secret "$WORK/o"; then
	ok "a host listener on 127.0.0.1 is unreachable from the sandbox"
else notok "a host listener on 127.0.0.1 is unreachable from the sandbox" "host=$host_got rc=$rc $(cat "$WORK/o")"; fi

# A sandbox process asking the guest agent for a handshake proof (it would
# make the agent an oracle for the activation secret) is refused; the host
# bridge's next operation still works.
"$T" exec "$S1" -- perl -MIO::Socket::UNIX -e '
$SIG{PIPE} = "IGNORE"; # the agent may refuse and close before our write
my $s = IO::Socket::UNIX->new(Peer => "/run/tether/guest.sock") or die "connect: $!\n";
my $m = q({"v":1,"challenge":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","sbx":"x","generation":1,"activation":1});
print $s pack("NCCnN", 0x54545700, 1, 9, 0, length $m), $m;
read($s, my $h, 12) == 12 or die "no answer\n";
my ($mg, $v, $t, $z, $n) = unpack("NCCnN", $h);
read($s, my $p, $n); print "type=$t $p\n";' >"$WORK/o" 2>&1
"$T" exec "$S1" -- true >/dev/null 2>&1; rc=$?
if grep -q 'type=8.*peer_refused' "$WORK/o" && [ $rc = 0 ]; then
	ok "the guest agent refuses a handshake from inside the sandbox (bridge still served)"
else notok "the guest agent refuses a handshake from inside the sandbox (bridge still served)" "rc=$rc $(cat "$WORK/o")"; fi

# ---- rm ----------------------------------------------------------------------
check "rm" "$T" rm "$S1"
"$T" info "$S1" >"$WORK/o" 2>"$WORK/e"; rc=$?
if [ $rc = 1 ] && [ "$(wc -l <"$WORK/e")" = 1 ]; then ok "info after rm: exit 1, one line"
else notok "info after rm: exit 1, one line" "rc=$rc $(cat "$WORK/o" "$WORK/e")"; fi
"$T" exec "$S1" -- true >"$WORK/o" 2>"$WORK/e"; rc=$?
if [ $rc = 125 ] && [ "$(wc -l <"$WORK/e")" = 1 ]; then ok "exec after rm fails: exit 125 (tether's own failure), one line"; else notok "exec after rm fails: exit 125 (tether's own failure), one line" "rc=$rc $(cat "$WORK/e")"; fi
"$T" rm "$S2" >/dev/null 2>&1; "$T" rm "$S3" >/dev/null 2>&1

# ---- shutdown ----------------------------------------------------------------
# Operations just ran, so node-api holds idle connections to its manager:
# every daemon must still stop on its own, well before `tether up` would
# kill it (10 s; the managers used to wait for those connections).
kill -TERM "$UP_PID"
stopped=0
for _ in $(seq 1 50); do kill -0 "$UP_PID" 2>/dev/null || { stopped=1; break; }; sleep 0.1; done
[ $stopped = 1 ] || sleep 10
wait "$UP_PID" 2>/dev/null; rc=$?
left=$(pgrep -f "tetherd .*127.0.0.1:$BASE" | wc -l)
killed=$(grep -c "did not stop" "$WORK/up.err" 2>/dev/null)
if [ $stopped = 1 ] && [ $rc = 0 ] && [ "$left" = 0 ] && [ "${killed:-0}" = 0 ]; then
	ok "SIGTERM stops the whole cluster within 5 s (exit 0, no strays, none killed)"
else notok "SIGTERM stops the whole cluster within 5 s (exit 0, no strays, none killed)" \
	"stopped=$stopped rc=$rc left=$left $(cat "$WORK/up.err")"; fi
UP_PID=

# ---- an upload whose answer does not confirm every byte is a failure ------------
# (a fake edge: 200 {"ok":true,"bytes":1} for an 11-byte file; before, exit 0)
FAKE_PORT=$(free_port)
python3 - "$FAKE_PORT" <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"ok":true,"bytes":1}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
FAKE_PID=$!
wait_until 50 python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $FAKE_PORT)).close()" 2>/dev/null
printf 'hello world' >"$WORK/eleven"
out=$(TETHER_URL=http://127.0.0.1:$FAKE_PORT TETHER_API_KEY=k timeout 20 "$ROOT/build/tether" cp "$WORK/eleven" sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa:/tmp/x 2>&1); rc=$?
kill "$FAKE_PID" 2>/dev/null; wait "$FAKE_PID" 2>/dev/null
expect "cp: an upload answered without all its bytes confirmed fails (exit != 0)" \
	'[ "$rc" != 0 ] && echo "$out" | grep -q "does not confirm 11 bytes"' "rc=$rc $out"
# ---- the exec stream believes only an honest sequence ---------------------------
# A fake edge that says "exit 0" before any decision, or an exit status
# outside 0..255: the CLI fails instead of reporting success; one that
# sends the decision first is believed (exit 7).
ws_fake() {
	python3 - "$1" "$2" <<'PY' &
import base64, hashlib, socket, struct, sys
port, mode = int(sys.argv[1]), sys.argv[2]
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port)); srv.listen(4)
def text(c, s):
    b = s.encode()
    c.sendall(bytes([0x81, len(b)]) + b)
while True:
    c, _ = srv.accept()
    req = b""
    while b"\r\n\r\n" not in req:
        d = c.recv(4096)
        if not d:
            break
        req += d
    key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key:")]
    if not key:
        c.close(); continue
    acc = base64.b64encode(hashlib.sha1(key[0] + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Protocol: tether.exec.v1\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    c.recv(65536)  # the start message
    if mode == "early":
        text(c, '{"type":"exit","exit_code":0}')
    elif mode == "range":
        text(c, '{"type":"decision","decision":"allow"}')
        text(c, '{"type":"exit","exit_code":4294967296}')
    else:
        text(c, '{"type":"decision","decision":"allow"}')
        text(c, '{"type":"exit","exit_code":7,"generation":1}')
    c.sendall(bytes([0x88, 2]) + struct.pack(">H", 1000))
    c.close()
PY
}
for mode in early range honest; do
	FAKE_PORT=$(free_port)
	ws_fake "$FAKE_PORT" "$mode"; FAKE_PID=$!
	wait_until 50 python3 -c "import socket; socket.create_connection(('127.0.0.1', $FAKE_PORT)).close()"
	out=$(TETHER_URL=http://127.0.0.1:$FAKE_PORT TETHER_API_KEY=k timeout 20 "$ROOT/build/tether" exec sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa -- true 2>&1); rc=$?
	kill "$FAKE_PID" 2>/dev/null; wait "$FAKE_PID" 2>/dev/null
	eval "rc_$mode=\$rc; out_$mode=\$out"
done
expect "exec stream: an exit before the decision is refused, not reported as success" \
	'[ "$rc_early" != 0 ] && echo "$out_early" | grep -q "before the decision"' "rc=$rc_early $out_early"
expect "exec stream: an exit status outside 0..255 is refused" \
	'[ "$rc_range" != 0 ] && echo "$out_range" | grep -q "valid exit_code"' "rc=$rc_range $out_range"
expect "exec stream: the honest sequence from the same fake is believed (exit 7)" \
	'[ "$rc_honest" = 7 ]' "rc=$rc_honest $out_honest"
tap_done

#!/bin/bash
# tether-test: slow
# The front doors anyone can reach (the cp, the edge, node-api; issue 12):
# each attack is refused and the honest request next to it still works.
# - upgrades: only GET /v1/sandboxes/{id}/exec/ws with subprotocol
#   tether.exec.v1 at the edge and node-api, nothing at the cp; every other
#   upgrade is refused before 101; h2c gets no HTTP/2 answer;
# - timeouts: nothing sent, half a header, a header dripped, a kept-alive
#   connection idle, an h2c connection silent, a CONNECT, a WebSocket without its
#   start message: all closed; TCP keepalive armed; a 30 s long-poll, 35 s
#   execs (HTTP at node-api and the edge, WebSocket through the CLI) and a
#   42 s download to a slow reader are not;
# - 414 / 431 for oversized URIs / header fields, not a dropped connection;
# - framing: 411 for chunked bodies, 400 for two Content-Lengths, at all three;
# - log lines rate-limited (a flood of refused tokens, of overflowing headers);
# - fds used up: the cp neither spins nor floods its log, and answers again.
# Prints TAP. Takes ~100 s (the 60 s keep-alive bound).
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-frontdoor
T=$ROOT/build/tether
P="python3 $ROOT/tests/integration/frontdoor_probe.py"
HZ=$(getconf CLK_TCK)
# cpu_ticks PID: user+system CPU of PID so far, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# bytes FILE: its size (0 if absent).
bytes() { stat -c %s "$1" 2>/dev/null || echo 0; }
# within LO HI VALUE: LO <= VALUE <= HI (VALUE a decimal number).
within() { python3 -c 'import sys; lo, hi, v = sys.argv[1:]; sys.exit(0 if v != "open" and float(lo) <= float(v) <= float(hi) else 1)' "$@" 2>/dev/null; }

cluster_up_or_bail "cluster up (1 worker)" 1
KEY=$(cluster_key)
CPP=$BASE
EDP=$((BASE + 1))
NDP=$((BASE + 11))
EDGE=http://127.0.0.1:$EDP
NODE=http://127.0.0.1:$NDP
provision "$STATE/cp" w9 http://127.0.0.1:9 "$WORK/w9.cred"; NT=$CRED
ID=$("$T" create --worker w1 2>"$WORK/err")
expect "create a sandbox" '[ -n "$ID" ]' "$(cat "$WORK/err")"
TOK=$("$T" cap "$ID" 2>/dev/null | jget 'd["token"]' 2>/dev/null)
expect "a capability for node-api" '[[ $TOK == v4.public.* ]]' "$TOK"
WSP=/v1/sandboxes/$ID/exec/ws
head -c $((8 * 1024 * 1024)) /dev/urandom >"$WORK/big"
timeout 30 "$T" cp "$WORK/big" "$ID:/tmp/big" >"$WORK/o" 2>&1
okrc $? "an 8 MiB file uploaded"

# ---- background: what must time out, and what must not ----------------------
B=$WORK/bg
mkdir -p "$B"
for d in cp:$CPP edge:$EDP node:$NDP; do
	name=${d%%:*} port=${d#*:}
	for m in none half drip h2c connect; do $P idle "$port" $m 30 >"$B/$name.$m" 2>&1 & done
	$P idle "$port" keepalive 80 >"$B/$name.keepalive" 2>&1 &
done
$P idle "$EDP" wsnostart 30 "$WSP" "Bearer $KEY" >"$B/edge.wsnostart" 2>&1 &
$P idle "$NDP" wsnostart 30 "$WSP" "Capability $TOK" >"$B/node.wsnostart" 2>&1 &
# honest long operations, started together
# (a fake worker w9 long-polls; the sandbox is on w1 already)
tcurl -o /dev/null -H "Authorization: Worker $NT" -H 'Content-Type: application/json' \
	-d '{"id":"w9","node_url":"http://127.0.0.1:9"}' "http://127.0.0.1:$CPP/v1/workers/register"
REV=$(curl -s -m 10 -H "Authorization: Worker $NT" "http://127.0.0.1:$CPP/v1/feed?worker=w9&after=0&wait=0" | jget 'd["rev"]')
(s=$(date +%s); c=$(curl -s -m 60 -o "$B/lp.body" -w '%{http_code}' -H "Authorization: Worker $NT" \
	"http://127.0.0.1:$CPP/v1/feed?worker=w9&after=$REV&wait=30"); echo "$c $(( $(date +%s) - s ))") >"$B/longpoll" 2>&1 &
curl -s -m 60 -o "$B/nexec" -w '%{http_code}' -H "Authorization: Capability $TOK" -H 'Content-Type: application/json' \
	-d '{"cmd":["sh","-c","sleep 35; echo slept"]}' "$NODE/v1/sandboxes/$ID/exec" >"$B/nexec.code" 2>&1 &
curl -s -m 60 -o "$B/eexec" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
	-d '{"cmd":["sh","-c","sleep 35; echo slept"]}' "$EDGE/v1/sandboxes/$ID/exec" >"$B/eexec.code" 2>&1 &
(timeout 60 "$T" exec "$ID" -- sh -c 'sleep 35; echo slept' >"$B/wsexec" 2>&1; echo "rc=$?" >>"$B/wsexec") &
# (more than the sockets' buffers hold: the edge still writes at 30 s; lws
# cut it there before, at ~5 of 8 MiB)
$P slowget "$EDP" "/v1/sandboxes/$ID/files?path=/tmp/big" "Bearer $KEY" 200000 "$B/dl" >"$B/dl.code" 2>&1 &
BG_T0=$(date +%s)
BG_PIDS=$(jobs -p)
# bg_running: whether one of those still runs
bg_running() { local p; for p in $BG_PIDS; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }

# a peer that vanishes during a long operation is found by TCP keepalive
# (probes after 60 s idle): armed on the accepted sockets of all three
sleep 1
for d in cp:$CPP edge:$EDP node:$NDP; do
	name=${d%%:*} port=${d#*:}
	ka=$(ss -tno state established "( sport = :$port )" 2>&1)
	expect "$name: accepted connections have TCP keepalive armed (60 s)" \
		'grep -q "timer:(keepalive," <<<"$ka"' "$(head -n 4 <<<"$ka")"
done

# ---- upgrades -------------------------------------------------------------------
for d in cp:$CPP edge:$EDP node:$NDP; do
	name=${d%%:*} port=${d#*:}
	r1=$($P upgrade "$port" /anything - -)
	r2=$($P upgrade "$port" /healthz http -)
	r3=$($P upgrade "$port" "$WSP" - -)
	r4=$($P upgrade "$port" /v1/sandboxes tether.exec.v1 -)
	expect "$name: WebSocket upgrades on other paths or without the subprotocol are refused before 101" \
		'[ "$r1" != 101 ] && [ "$r2" != 101 ] && [ "$r3" != 101 ] && [ "$r4" != 101 ]' \
		"no subprotocol: $r1; \"http\": $r2; exec path without subprotocol: $r3; other path: $r4"
	r=$($P h2c "$port")
	expect "$name: an h2c upgrade gets no HTTP/2 answer" '[ "$r" != served ]' "$r"
	check "$name: /healthz still answers" tcurl -f -o /dev/null "http://127.0.0.1:$port/healthz"
done
r=$($P upgrade "$CPP" "$WSP" tether.exec.v1 "Bearer $KEY")
expect "cp: no stream endpoint at all (refused before 101)" '[ "$r" != 101 ]' "$r"
r1=$($P upgrade "$EDP" "$WSP" tether.exec.v1 "Bearer $KEY" POST)
r2=$($P upgrade "$EDP" "$WSP" tether.exec.v1 -)
r3=$($P upgrade "$NDP" "$WSP" tether.exec.v1 -)
r4=$($P upgrade "$NDP" "/v1/sandboxes/sbx_notanid/exec/ws" tether.exec.v1 "Capability $TOK")
expect "the stream endpoint refuses a POST, no credentials, a bad id before 101" \
	'[ "$r1" != 101 ] && [ "$r2" != 101 ] && [ "$r3" != 101 ] && [ "$r4" != 101 ]' \
	"edge POST: $r1; edge no key: $r2; node no capability: $r3; node bad id: $r4"
r1=$($P upgrade "$EDP" "$WSP" tether.exec.v1 "Bearer $KEY")
r2=$($P upgrade "$NDP" "$WSP" tether.exec.v1 "Capability $TOK")
expect "the stream endpoint with its subprotocol and credentials: 101 at the edge and node-api" \
	'[ "$r1" = 101 ] && [ "$r2" = 101 ]' "edge $r1 node $r2"
out=$("$T" exec "$ID" -- echo honest 2>&1)
expect "tether exec (WebSocket through the edge) works" '[ "$out" = honest ]' "$out"

# ---- 414 / 431 ----------------------------------------------------------------
LONG=$(head -c 10000 /dev/zero | tr '\0' a)
HUGE=$(head -c 100000 /dev/zero | tr '\0' a)
F9K=$(head -c 9000 /dev/zero | tr '\0' a)
F7K=$(head -c 7000 /dev/zero | tr '\0' a)
for d in cp:$CPP edge:$EDP node:$NDP; do
	name=${d%%:*} port=${d#*:}
	u=http://127.0.0.1:$port
	c1=$(tcurl -o "$WORK/b1" -w '%{http_code}' "$u/$LONG")
	c2=$(tcurl -o /dev/null -w '%{http_code}' "$u/x?path=$HUGE")
	expect "$name: a 10 KB and a 100 KB request target: 414 (JSON error)" \
		'[ "$c1" = 414 ] && [ "$c2" = 414 ] && [ "$(jfield "[\"error\"]" "$WORK/b1")" = too_large ]' "$c1 $c2 $(head -c 200 "$WORK/b1")"
	c1=$(tcurl -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $F9K" "$u/healthz")
	c2=$(tcurl -o /dev/null -w '%{http_code}' -H "Cookie: $HUGE" "$u/healthz")
	c3=$(tcurl -o /dev/null -w '%{http_code}' -H "Cookie: $F7K" -H "User-Agent: $F7K" -H "Referer: $F7K" "$u/healthz")
	expect "$name: a 9 KB field, a 100 KB field, 21 KB of fields: 431" \
		'[ "$c1" = 431 ] && [ "$c2" = 431 ] && [ "$c3" = 431 ]' "$c1 $c2 $c3"
	c1=$(tcurl -o /dev/null -w '%{http_code}' "$u/healthz?pad=$(head -c 4000 /dev/zero | tr '\0' b)")
	c2=$(tcurl -o /dev/null -w '%{http_code}' -H "Cookie: $F7K" -H "X-Big: $LONG" "$u/healthz")
	expect "$name: a 4 KB target, a 7 KB field and a 10 KB unknown field are served" \
		'[ "$c1" = 200 ] && [ "$c2" = 200 ]' "$c1 $c2"
done
c=$(tcurl -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "$EDGE/v1/sandboxes/$ID/files?path=/tmp/big")
expect "edge: the honest download still answers 200" '[ "$c" = 200 ]' "$c"

# ---- framing: one Content-Length, no chunked bodies ---------------------------------
for d in cp:$CPP:/v1/sandboxes:Bearer\ $KEY edge:$EDP:/v1/sandboxes/$ID/exec:Bearer\ $KEY \
	node:$NDP:/v1/sandboxes/$ID/exec:Capability\ $TOK; do
	IFS=: read -r name port path auth <<<"$d"
	body='{"cmd":["true"]}'
	c1=$(printf 'POST %s HTTP/1.1\\nHost: x\\nAuthorization: %s\\nContent-Type: application/json\\nTransfer-Encoding: chunked\\n\\n10\\n%s\\n0\\n\\n' \
		"$path" "$auth" "$body" | $P raw "$port")
	c2=$(printf 'POST %s HTTP/1.1\\nHost: x\\nAuthorization: %s\\nContent-Type: application/json\\nContent-Length: 16\\nContent-Length: 16\\n\\n%s' \
		"$path" "$auth" "$body" | $P raw "$port")
	c3=$(printf 'POST %s HTTP/1.1\\nHost: x\\nAuthorization: %s\\nContent-Type: application/json\\nContent-Length: 16, 16\\n\\n%s' \
		"$path" "$auth" "$body" | $P raw "$port")
	c4=$(printf 'POST %s HTTP/1.1\\nHost: x\\nAuthorization: %s\\nContent-Type: application/json\\nContent-Length: 16\\nTransfer-Encoding: chunked\\n\\n%s' \
		"$path" "$auth" "$body" | $P raw "$port")
	expect "$name: chunked 411, two Content-Lengths 400, a list 400, length + chunked 400" \
		'[ "$c1" = 411 ] && [ "$c2" = 400 ] && [ "$c3" = 400 ] && [ "$c4" = 400 ]' "$c1 $c2 $c3 $c4"
done
c=$(tcurl -o "$WORK/ex" -w '%{http_code}' -H "Authorization: Capability $TOK" -H 'Content-Type: application/json' \
	-d '{"cmd":["echo","ok"]}' "$NODE/v1/sandboxes/$ID/exec")
expect "node: an exec with one Content-Length runs" '[ "$c" = 200 ] && [ "$(jfield "[\"stdout\"]" "$WORK/ex")" = "ok" ]' "$c $(cat "$WORK/ex")"
c=$(req_status POST "http://127.0.0.1:$CPP/v1/sandboxes/$ID/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')
expect "cp: a POST with one Content-Length is served" '[ "$c" = 201 ]' "$c"

# ---- log lines rate-limited ---------------------------------------------------------
W1LOG=$STATE/logs/w1.log
a0=$(grep -c "admission refused" "$W1LOG")
l0=$(bytes "$W1LOG")
r=$($P hammer "$NDP" 400 "Capability v4.public.Z2FyYmFnZQ" "/v1/sandboxes/$ID/stat?path=/")
a1=$(grep -c "admission refused" "$W1LOG")
expect "400 refused garbage tokens: each refused (403), at most ~2 log lines a second" \
	'[ "$r" = 403x400 ] && [ $((a1 - a0)) -le 8 ]' "answers: $r; log lines: $((a1 - a0)); $(tail -n 3 "$W1LOG")"
sleep 1.2
$P hammer "$NDP" 1 "Capability v4.public.Z2FyYmFnZQ" "/v1/sandboxes/$ID/stat?path=/" >/dev/null
expect "the held-back lines are summarized (\"repeated N times\")" \
	'grep -q "admission refused.*repeated [0-9]* times" "$W1LOG"' "$(tail -n 4 "$W1LOG")"
echo "# w1.log: +$(( $(bytes "$W1LOG") - l0 )) bytes for ~400 refused tokens"
c0=$(bytes "$STATE/logs/cp.log")
HDR40=$(head -c 40000 /dev/zero | tr '\0' h)
for _ in $(seq 1 60); do curl -s -m 5 -o /dev/null -H "X-Big: $HDR40" "http://127.0.0.1:$CPP/healthz"; done
c1=$(bytes "$STATE/logs/cp.log")
expect "60 requests past lws' header buffer: the cp log grows < 3 KB" '[ $((c1 - c0)) -lt 3000 ]' "+$((c1 - c0)) bytes"
check "the cp answers after them" tcurl -f -o /dev/null "http://127.0.0.1:$CPP/healthz"

# ---- fds used up ------------------------------------------------------------------
# flood_check NAME PID PORT LOG: 100 connections held 6 s against a daemon
# whose RLIMIT_NOFILE is 64: it neither spins nor floods its log, and
# answers again once they are closed.
flood_check() {
	local name=$1 pid=$2 port=$3 log=$4 t0 t1 s0 s1 got
	t0=$(cpu_ticks "$pid"); s0=$(bytes "$log")
	got=$($P flood "$port" 100 6)
	t1=$(cpu_ticks "$pid"); s1=$(bytes "$log")
	echo "# $name: $got connections held 6 s: $((t1 - t0)) CPU ticks (hz $HZ), log +$((s1 - s0)) bytes"
	expect "$name: fds used up: < 0.2 s CPU and < 8 KB of log in 6 s" \
		'[ $((t1 - t0)) -lt $((HZ / 5)) ] && [ $((s1 - s0)) -lt 8192 ]' \
		"$((t1 - t0)) ticks, +$((s1 - s0)) bytes; $(tail -n 3 "$log")"
	expect "$name: answers again once the connections are closed (2 s)" \
		'wait_until 20 curl -sf -m 1 -o /dev/null "http://127.0.0.1:$port/healthz"' "$(tail -n 3 "$log")"
}
# a bare cp started with 64 fds: lws stops accepting short of the limit
CST=$WORK/cp64
mkdir -p "$CST"
FP=$(free_port)
prlimit --nofile=64:64 "$ROOT/build/tetherd" cp --state "$CST" --listen "127.0.0.1:$FP" >"$CST/cp.log" 2>&1 &
CP64=$!
at_exit 'stop_pid "$CP64" 50'
wait_until 50 curl -sf -m 1 -o /dev/null "http://127.0.0.1:$FP/healthz"
okrc $? "a cp with RLIMIT_NOFILE 64 starts"
flood_check "cp (started at 64 fds)" "$CP64" "$FP" "$CST/cp.log"
# ---- collect the background results --------------------------------------------
while [ $(( $(date +%s) - BG_T0 )) -lt 85 ] && bg_running; do sleep 1; done
for name in cp edge node; do
	expect "$name: a connection that sends nothing is closed (10-16 s)" 'within 8 17 "$(cat "$B/$name.none")"' "$(cat "$B/$name.none")"
	expect "$name: half a header is closed (10-16 s)" 'within 8 17 "$(cat "$B/$name.half")"' "$(cat "$B/$name.half")"
	expect "$name: a header dripped a byte a second is closed (10-16 s)" 'within 8 17 "$(cat "$B/$name.drip")"' "$(cat "$B/$name.drip")"
	expect "$name: a silent h2c connection is closed after its 101 (15-17 s)" 'within 14 18 "$(cat "$B/$name.h2c")"' "$(cat "$B/$name.h2c")"
	expect "$name: a CONNECT (a raw socket to lws) is closed at once" 'within 0 2 "$(cat "$B/$name.connect")"' "$(cat "$B/$name.connect")"
	expect "$name: a kept-alive connection idle is closed (~60 s)" 'within 55 70 "$(cat "$B/$name.keepalive")"' "$(cat "$B/$name.keepalive")"
done
for name in edge node; do
	expect "$name: a WebSocket without its start message is closed (~10 s)" 'within 8 13 "$(cat "$B/$name.wsnostart")"' "$(cat "$B/$name.wsnostart")"
done
read -r lpc lps <"$B/longpoll"
expect "cp: a 30 s feed long-poll is answered (200, empty, after ~30 s)" \
	'[ "$lpc" = 200 ] && [ "$lps" -ge 29 ] && [ "$(jfield "[\"updates\"]" "$B/lp.body")" = "[]" ]' "$(cat "$B/longpoll") $(cat "$B/lp.body" 2>/dev/null)"
expect "node: a 35 s exec over HTTP is answered" \
	'[ "$(cat "$B/nexec.code")" = 200 ] && grep -q slept "$B/nexec"' "$(cat "$B/nexec.code") $(head -c 300 "$B/nexec")"
expect "edge: a 35 s exec over HTTP is answered" \
	'[ "$(cat "$B/eexec.code")" = 200 ] && grep -q slept "$B/eexec"' "$(cat "$B/eexec.code") $(head -c 300 "$B/eexec")"
expect "a 35 s tether exec (WebSocket) ends normally" \
	'grep -q "^slept$" "$B/wsexec" && grep -q "^rc=0$" "$B/wsexec"' "$(cat "$B/wsexec")"
read -r dlc dlb dls <"$B/dl.code"
expect "edge: an 8 MiB download to a 200 KB/s reader takes ~42 s and arrives whole" \
	'[ "$dlc" = 200 ] && [ "$dls" -ge 38 ] && cmp -s "$WORK/big" "$B/dl"' "$(cat "$B/dl.code") (status bytes seconds)"

# ---- fds used up (the cluster's daemons) -------------------------------------
# the cluster's daemons lowered to 64 while running (their budget was made
# for more): accept fails with EMFILE, and they pause accepting
NPID=$(pgrep -f "tetherd node --id w1 --listen 127.0.0.1:$NDP " | head -n1)
EPID=$(pgrep -f "tetherd edge --listen 127.0.0.1:$EDP " | head -n1)
CPID=$(pgrep -f "tetherd cp --state $STATE/cp " | head -n1)
for d in cp:$CPID:$CPP:cp edge:$EPID:$EDP:edge node:$NPID:$NDP:w1; do
	IFS=: read -r name pid port logname <<<"$d"
	[ -n "$pid" ] || { notok "$name: found" "no pid"; continue; }
	if ! prlimit --pid "$pid" --nofile=64:64 2>"$WORK/prlimit.err"; then
		# node-api runs unprivileged (a uid of its own), not dumpable: prlimit(2) on it needs
		# CAP_SYS_PTRACE, which a container may not have
		skip "$name: fds used up" "prlimit refused: $(cat "$WORK/prlimit.err")"
		continue
	fi
	flood_check "$name (lowered to 64 fds while running)" "$pid" "$port" "$STATE/logs/$logname.log"
done
grep -q "not accepting for" "$STATE/logs/cp.log"
okrc $? "the cp said it paused accepting"
out=$("$T" exec "$ID" -- echo after 2>&1)
expect "an exec through all three works after the floods" '[ "$out" = after ]' "$out"

tap_done

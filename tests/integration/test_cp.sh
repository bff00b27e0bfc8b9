#!/bin/bash
# Control plane against a real `tetherd cp` on a temp state dir and a free
# port, driven with curl (a fake worker registers, long-polls and acks).
# Prints TAP. TETHERD overrides the binary (default build/tetherd).
set -u
cd "$(dirname "$0")/../.."
TETHERD=${TETHERD:-build/tetherd}
ST=$(mktemp -d /tmp/tt-cp-test.XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
U=http://127.0.0.1:$PORT
CP_PID=
n=0
fails=0

# ok COND NAME: one TAP line.
ok() {
	n=$((n + 1))
	if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fails=$((fails + 1)); fi
}
# check NAME CMD...: TAP line from a command's status.
check() {
	local name=$1; shift
	"$@" >/dev/null 2>&1
	ok $? "$name"
}
start_cp() {
	"$TETHERD" cp --state "$ST" --listen "127.0.0.1:$PORT" >>"$ST/cp.log" 2>&1 &
	CP_PID=$!
	for _ in $(seq 50); do
		curl -sf "$U/healthz" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}
stop_cp() {
	[ -n "$CP_PID" ] && kill "$CP_PID" 2>/dev/null && wait "$CP_PID" 2>/dev/null
	CP_PID=
}
cleanup() {
	stop_cp
	rm -rf "$ST"
}
trap cleanup EXIT
# status METHOD PATH AUTH [BODY]: prints the HTTP status, body in $ST/out.
status() {
	local args=(-s -o "$ST/out" -w '%{http_code}' -X "$1")
	[ -n "$3" ] && args+=(-H "Authorization: $3")
	[ $# -ge 4 ] && args+=(--data-binary "$4")
	curl "${args[@]}" "$U$2"
}
jget() { python3 -c "import json,sys; d=json.load(open('$ST/out')); print(eval('d'+sys.argv[1]))" "$1"; }

start_cp; ok $? "cp starts and answers /healthz"
KEY=$(cat "$ST/admin.key"); NT=$(cat "$ST/node.token")
check "admin.key and node.token are mode 0600" \
	test "$(stat -c %a "$ST/admin.key") $(stat -c %a "$ST/node.token") $(stat -c %a "$ST/signer.key")" = "600 600 600"
check "the admin key was announced on stderr" grep -q "admin API key written to $ST/admin.key" "$ST/cp.log"

# Authentication: refused without / with a wrong key, allowed with the key.
ok "$([ "$(status GET /v1/sandboxes '')" = 401 ]; echo $?)" "401 without an API key"
ok "$([ "$(status GET /v1/sandboxes 'Bearer ttk_wrong')" = 401 ]; echo $?)" "401 with a wrong API key"
ok "$([ "$(status GET /v1/sandboxes "Node $NT")" = 401 ]; echo $?)" "401 with the node token as API key"
ok "$([ "$(status GET /v1/sandboxes "Bearer $KEY")" = 200 ]; echo $?)" "200 with the admin key"
ok "$([ "$(status POST /v1/workers/register "Bearer $KEY" '{"id":"w1","node_url":"http://127.0.0.1:1"}')" = 401 ]; echo $?)" \
	"worker register refused with an API key instead of the node token"

# Worker registration and the feed.
ok "$([ "$(status POST /v1/workers/register "Node $NT" "{\"id\":\"w1\",\"node_url\":\"http://127.0.0.1:$((PORT + 11))\"}")" = 200 ]; echo $?)" \
	"worker registers with the node token"
ok "$([ "$(status GET "/v1/feed?worker=w1&after=0&wait=5" "Node $NT")" = 200 ] && [ "$(jget '["updates"][0]["kind"]')" = keys ]; echo $?)" \
	"feed returns the keys update at once"
KID=$(jget '["updates"][0]["keys"][0]["kid"]'); REV0=$(jget '["rev"]')
check "the published kid is a k4.pid" test "${KID#k4.pid.}" != "$KID"
t0=$(date +%s%N)
ok "$([ "$(status GET "/v1/feed?worker=w1&after=$REV0&wait=1" "Node $NT")" = 200 ] && [ "$(jget '["updates"]')" = "[]" ]; echo $?)" \
	"an idle long-poll answers empty after wait"
el=$(( ($(date +%s%N) - t0) / 1000000 ))
check "the idle long-poll was parked ~1 s (${el} ms)" test "$el" -ge 900 -a "$el" -lt 3000

# Create wakes the parked long-poll; the ack completes the create.
status POST /v1/sandboxes "Bearer $KEY" '{"worker":"w1"}' >"$ST/create.code" &
CR=$!
ok "$([ "$(status GET "/v1/feed?worker=w1&after=$REV0&wait=10" "Node $NT")" = 200 ] && [ "$(jget '["updates"][0]["kind"]')" = install ]; echo $?)" \
	"create wakes the long-poll with an install update"
SBX=$(jget '["updates"][0]["sandbox"]'); IREV=$(jget '["updates"][0]["rev"]')
check "install names generation 1 on w1" test "$(jget '["updates"][0]["generation"]') $(jget '["updates"][0]["worker"]')" = "1 w1"
cp "$ST/out" "$ST/feed.json"
status POST /v1/feed/ack "Node $NT" "{\"worker\":\"w1\",\"rev\":$IREV,\"results\":[{\"rev\":$IREV,\"ok\":true}]}" >/dev/null
wait $CR
check "create answers 201 once the worker acked" test "$(cat "$ST/create.code")" = 201
ok "$([ "$(status GET "/v1/sandboxes/$SBX" "Bearer $KEY")" = 200 ] && [ "$(jget '["state"]')" = running ]; echo $?)" \
	"the sandbox is running"

# A failed install: 503 with state failed.
status POST /v1/sandboxes "Bearer $KEY" '{}' >"$ST/create2.code" &
CR=$!
status GET "/v1/feed?worker=w1&after=$IREV&wait=10" "Node $NT" >/dev/null
FREV=$(jget '["updates"][0]["rev"]'); FSBX=$(jget '["updates"][0]["sandbox"]')
status POST /v1/feed/ack "Node $NT" "{\"worker\":\"w1\",\"rev\":$FREV,\"results\":[{\"rev\":$FREV,\"ok\":false,\"error\":\"no space\"}]}" >/dev/null
wait $CR
check "a failed install answers 503" test "$(cat "$ST/create2.code")" = 503
ok "$([ "$(status GET "/v1/sandboxes/$FSBX" "Bearer $KEY")" = 200 ] && [ "$(jget '["state"]')" = failed ] && [ "$(jget '["error"]')" = "no space" ]; echo $?)" \
	"the failed sandbox records the worker's error"
ok "$([ "$(status POST "/v1/sandboxes/$FSBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 409 ]; echo $?)" \
	"no capability for a sandbox that is not running (409)"

# Placement errors.
ok "$([ "$(status POST /v1/sandboxes "Bearer $KEY" '{"worker":"w9"}')" = 404 ] && [ "$(jget '["error"]')" = not_found ]; echo $?)" \
	"create on an unknown worker: 404 not_found"
ok "$(grep -q 'no worker w9' "$ST/out"; echo $?)" "the error names the worker"

# Capabilities.
ok "$([ "$(status POST /v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa/capabilities "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 404 ]; echo $?)" \
	"capabilities for an unknown sandbox: 404"
ok "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec","fs.read"]}')" = 201 ] && [ "$(jget '["generation"]')" = 1 ] && [ "$(jget '["node_url"]')" = "http://127.0.0.1:$((PORT + 11))" ]; echo $?)" \
	"control capability minted for the running sandbox"
TOKEN=$(jget '["token"]')
PAYLOAD=$(python3 -c "import base64,sys; t=sys.argv[1].split('.')[2]; b=base64.urlsafe_b64decode(t+'='*(-len(t)%4)); print(b[:-64].decode())" "$TOKEN")
check "claims carry sub=admin, aud=node, the identity and ops" python3 -c "
import json,sys; c=json.loads(sys.argv[1])
assert c['sub']=='admin' and c['aud']=='node' and c['sbx']=='$SBX' and c['gen']==1
assert c['wrk']=='w1' and c['sst']=='ns' and c['att']==1 and c['ops']==['exec','fs.read']
assert c['iss']=='tether-cp' and c['pur']=='control' and len(c['jti'])>=16" "$PAYLOAD"
ok "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"port","port":8080,"proto":"http"}')" = 201 ]; echo $?)" \
	"port capability minted"
ok "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"],"iss":"x"}')" = 201 ]; echo $?)" \
	"extra request fields cannot inject claims (still minted by the cp's rules)"
ok "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["root"]}')" = 400 ]; echo $?)" \
	"unknown operation refused (400)"
ok "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"port","port":70000,"proto":"http"}')" = 400 ]; echo $?)" \
	"port out of range refused (400)"
ok "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer ttk_wrong" '{"purpose":"control","ops":["exec"]}')" = 401 ]; echo $?)" \
	"capability refused with a wrong key (401)"

# Malformed and oversized bodies; the daemon keeps answering.
ok "$([ "$(status POST /v1/sandboxes "Bearer $KEY" '{"worker":')" = 400 ] && [ "$(jget '["error"]')" = bad_request ]; echo $?)" \
	"malformed JSON: 400 bad_request"
ok "$([ "$(status POST /v1/sandboxes "Bearer $KEY" '{"worker":"w1","worker":"w2"}')" = 400 ]; echo $?)" \
	"duplicate JSON keys: 400"
head -c 1100000 /dev/zero | tr '\0' ' ' >"$ST/big"
ok "$([ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" --data-binary @"$ST/big" "$U/v1/sandboxes")" = 413 ]; echo $?)" \
	"body over 1 MiB: 413"
ok "$([ "$(status GET "/v1/feed?worker=w1&after=-1" "Node $NT")" = 400 ]; echo $?)" "bad feed query: 400"
ok "$([ "$(status GET /v1/sandboxes "Bearer $KEY")" = 200 ]; echo $?)" "daemon still answers after bad input"

# Delete waits for the destroy ack.
status DELETE "/v1/sandboxes/$SBX" "Bearer $KEY" >"$ST/del.code" &
DL=$!
status GET "/v1/feed?worker=w1&after=$FREV&wait=10" "Node $NT" >/dev/null
DREV=$(jget '["updates"][0]["rev"]')
check "delete publishes a destroy update" test "$(jget '["updates"][0]["kind"]')" = destroy
status POST /v1/feed/ack "Node $NT" "{\"worker\":\"w1\",\"rev\":$DREV,\"results\":[]}" >/dev/null
wait $DL
check "delete answers 200 after the ack" test "$(cat "$ST/del.code")" = 200
ok "$([ "$(status GET "/v1/sandboxes/$SBX" "Bearer $KEY")" = 404 ]; echo $?)" "deleted sandbox: 404"

# Restart: state survives, the admin key is not rewritten, keys not
# republished, revs continue.
KEYSUM=$(sha256sum "$ST/admin.key")
stop_cp
sleep 0.2
start_cp; ok $? "cp restarts"
check "admin.key unchanged across restart" test "$(sha256sum "$ST/admin.key")" = "$KEYSUM"
check "the key is not announced again" test "$(grep -c 'admin API key written' "$ST/cp.log")" = 1
ok "$([ "$(status GET "/v1/sandboxes/$FSBX" "Bearer $KEY")" = 200 ] && [ "$(jget '["state"]')" = failed ]; echo $?)" \
	"sandbox state survived the restart"
ok "$([ "$(status GET /v1/workers "Bearer $KEY")" = 200 ] && [ "$(jget '["workers"][0]["id"]')" = w1 ] && [ "$(jget '["workers"][0]["acked_rev"]')" = "$DREV" ]; echo $?)" \
	"workers and their acked rev survived"
ok "$([ "$(status GET "/v1/feed?worker=w1&after=$DREV&wait=0" "Node $NT")" = 200 ] && [ "$(jget '["updates"]')" = "[]" ]; echo $?)" \
	"same signing key: no new keys update after restart"
status POST /v1/sandboxes "Bearer $KEY" '{}' >/dev/null &
CR=$!
status GET "/v1/feed?worker=w1&after=$DREV&wait=10" "Node $NT" >/dev/null
NREV=$(jget '["updates"][0]["rev"]')
check "feed revs continue after restart ($NREV > $DREV)" test "$NREV" -gt "$DREV"
NS=$(jget '["updates"][0]["sandbox"]')
status POST /v1/feed/ack "Node $NT" "{\"worker\":\"w1\",\"rev\":$NREV,\"results\":[{\"rev\":$NREV,\"ok\":true}]}" >/dev/null
wait $CR
ok "$([ "$(status POST "/v1/sandboxes/$NS/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 201 ]; echo $?)" \
	"capabilities still minted after restart (signer respawned)"
check "metrics are served" sh -c "curl -sf $U/metrics | grep -q '^tether_cp_capabilities_total 1$'"

echo "1..$n"
[ "$fails" -eq 0 ]

#!/bin/bash
# Control plane against a real `tetherd cp` on a temp state dir and a free
# port, driven with curl (a fake worker registers, long-polls and acks).
# Prints TAP. TETHERD overrides the binary (default build/tetherd).
set -u
. "$(dirname "$0")/lib.sh"
workdir tt-cp-test
ST=$WORK
PORT=$(free_port)
U=http://127.0.0.1:$PORT

start_cp() { cp_start "$ST" "$PORT"; }
stop_cp() { cp_stop; }
# ufield EXPR: EXPR of the first feed update's signed body (lib/feedsig.h:
# the cp serves each update as {rev,kind,body,sig}).
ufield() { python3 -c "import json,sys; d=json.loads(json.load(open(sys.argv[2]))['updates'][0]['body']); print(eval('d'+sys.argv[1]))" "$1" "$TT_BODY"; }
# status METHOD PATH AUTH [BODY]: prints the HTTP status, body in $ST/out.
status() { req_status "$1" "$U$2" "$3" "${@:4}"; }

start_cp; okrc $? "cp starts and answers /healthz"
cp_secrets "$ST"
check "admin.key and signer.key are mode 0600; no shared node token" \
	test "$(stat -c %a "$ST/admin.key") $(stat -c %a "$ST/signer.key") $(ls "$ST/node.token" 2>&1 >/dev/null | grep -c 'No such')" = "600 600 1"
# w1's own credential (tetherd worker add), 0600, stored only hashed
provision "$ST" w1 "http://127.0.0.1:$((PORT + 11))" "$ST/w1.cred"; W1=$CRED
check "the worker credential file is mode 0600" test "$(stat -c %a "$ST/w1.cred")" = 600
check "cp.db holds the credential's SHA-256, not the credential" \
	test "$(sqlite3 "$ST/cp.db" "SELECT hash FROM worker_creds WHERE id='w1'") $(sqlite3 "$ST/cp.db" .dump | grep -c "$W1")" = "$(printf %s "$W1" | sha256sum | cut -d' ' -f1) 0"
check "the admin key was announced on stderr" grep -q "admin API key written to $ST/admin.key" "$ST/cp.log"

# Headers past lws' buffer (32 KiB; unknown fields are bounded by it alone),
# from anyone: the connection is dropped and the cp answers the next request
# (it used to crash: a close with no session). Known fields and URIs past
# their bounds get 431/414 instead (test_frontdoor).
big=$(head -c 40000 /dev/zero | tr '\0' a)
tcurl -o /dev/null "${U}/healthz" -H "X-Big: $big"
tcurl -o /dev/null -X POST "${U}/v1/sandboxes" -H "X-Big: $big" -d '{}'
check "the cp survives requests whose headers overflow its buffer" tcurl -f -o /dev/null "${U}/healthz"

# A chunked body (no Content-Length) is refused, not read as no body.
okrc "$([ "$(tcurl -o "$TT_BODY" -w '%{http_code}' -X POST "$U/v1/sandboxes" -H "Authorization: Bearer $(cat "$ST/admin.key")" \
	-H 'Transfer-Encoding: chunked' -H 'Content-Type: application/json' --data-binary '{"worker":"w1"}')" = 411 ] &&
	[ "$(jfield '["error"]')" = length_required ]; echo $?)" "a chunked request body: 411 length_required"

# Authentication: refused without / with a wrong key, allowed with the key.
okrc "$([ "$(status GET /v1/sandboxes '')" = 401 ]; echo $?)" "401 without an API key"
okrc "$([ "$(status GET /v1/sandboxes 'Bearer ttk_wrong')" = 401 ]; echo $?)" "401 with a wrong API key"
okrc "$([ "$(status GET /v1/sandboxes "Bearer $W1")" = 401 ]; echo $?)" "401 with a worker credential as API key"
okrc "$([ "$(status GET /v1/sandboxes "Bearer $KEY")" = 200 ]; echo $?)" "200 with the admin key"
okrc "$([ "$(status POST /v1/workers/register "Bearer $KEY" '{"id":"w1","node_url":"http://127.0.0.1:1"}')" = 401 ]; echo $?)" \
	"worker register refused with an API key instead of the worker credential"

# Worker registration and the feed.
okrc "$([ "$(status POST /v1/workers/register "Worker $W1" "{\"id\":\"w1\",\"node_url\":\"http://127.0.0.1:$((PORT + 11))\"}")" = 200 ]; echo $?)" \
	"worker registers with its own credential"
okrc "$([ "$(status GET "/v1/feed?worker=w1&after=0&wait=5" "Worker $W1")" = 200 ] && [ "$(jfield '["updates"][0]["kind"]')" = keys ]; echo $?)" \
	"feed returns the keys update at once"
KID=$(ufield '["keys"][0]["kid"]'); REV0=$(jfield '["rev"]')
check "the published kid is a k4.pid" test "${KID#k4.pid.}" != "$KID"
t0=$(date +%s%N)
okrc "$([ "$(status GET "/v1/feed?worker=w1&after=$REV0&wait=1" "Worker $W1")" = 200 ] && [ "$(jfield '["updates"]')" = "[]" ]; echo $?)" \
	"an idle long-poll answers empty after wait"
el=$(( ($(date +%s%N) - t0) / 1000000 ))
check "the idle long-poll was parked ~1 s (${el} ms)" test "$el" -ge 900 -a "$el" -lt 3000

# Create wakes the parked long-poll; the ack completes the create.
status POST /v1/sandboxes "Bearer $KEY" '{"worker":"w1"}' >"$ST/create.code" &
CR=$!
okrc "$([ "$(status GET "/v1/feed?worker=w1&after=$REV0&wait=10" "Worker $W1")" = 200 ] && [ "$(jfield '["updates"][0]["kind"]')" = install ]; echo $?)" \
	"create wakes the long-poll with an install update"
SBX=$(ufield '["sandbox"]'); IREV=$(jfield '["updates"][0]["rev"]')
check "the install comes signed for w1, chained to the keys update" \
	test "$(ufield '["to"]') $(ufield '["prev"]') $(jfield '["updates"][0]["sig"]' | wc -c)" = "w1 $REV0 87"
check "install names generation 1 on w1" test "$(ufield '["generation"]') $(ufield '["worker"]')" = "1 w1"
cp "$ST/out" "$ST/feed.json"
status POST /v1/feed/ack "Worker $W1" "{\"worker\":\"w1\",\"rev\":$IREV,\"results\":[{\"rev\":$IREV,\"ok\":true}]}" >/dev/null
wait $CR
check "create answers 201 once the worker acked" test "$(cat "$ST/create.code")" = 201
okrc "$([ "$(status GET "/v1/sandboxes/$SBX" "Bearer $KEY")" = 200 ] && [ "$(jfield '["state"]')" = running ]; echo $?)" \
	"the sandbox is running"

# A failed install: 503 with state failed.
status POST /v1/sandboxes "Bearer $KEY" '{}' >"$ST/create2.code" &
CR=$!
status GET "/v1/feed?worker=w1&after=$IREV&wait=10" "Worker $W1" >/dev/null
FREV=$(jfield '["updates"][0]["rev"]'); FSBX=$(ufield '["sandbox"]')
status POST /v1/feed/ack "Worker $W1" "{\"worker\":\"w1\",\"rev\":$FREV,\"results\":[{\"rev\":$FREV,\"ok\":false,\"error\":\"no space\"}]}" >/dev/null
wait $CR
check "a failed install answers 503" test "$(cat "$ST/create2.code")" = 503
okrc "$([ "$(status GET "/v1/sandboxes/$FSBX" "Bearer $KEY")" = 200 ] && [ "$(jfield '["state"]')" = failed ] && [ "$(jfield '["error"]')" = "no space" ]; echo $?)" \
	"the failed sandbox records the worker's error"
okrc "$([ "$(status POST "/v1/sandboxes/$FSBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 409 ]; echo $?)" \
	"no capability for a sandbox that is not running (409)"

# Placement errors.
okrc "$([ "$(status POST /v1/sandboxes "Bearer $KEY" '{"worker":"w9"}')" = 404 ] && [ "$(jfield '["error"]')" = not_found ]; echo $?)" \
	"create on an unknown worker: 404 not_found"
okrc "$(grep -q 'no worker w9' "$ST/out"; echo $?)" "the error names the worker"

# Capabilities.
okrc "$([ "$(status POST /v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa/capabilities "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 404 ]; echo $?)" \
	"capabilities for an unknown sandbox: 404"
okrc "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec","fs.read"]}')" = 201 ] && [ "$(jfield '["generation"]')" = 1 ] && [ "$(jfield '["node_url"]')" = "http://127.0.0.1:$((PORT + 11))" ]; echo $?)" \
	"control capability minted for the running sandbox"
TOKEN=$(jfield '["token"]')
PAYLOAD=$(python3 -c "import base64,sys; t=sys.argv[1].split('.')[2]; b=base64.urlsafe_b64decode(t+'='*(-len(t)%4)); print(b[:-64].decode())" "$TOKEN")
check "claims carry sub=admin, aud=node, the identity and ops" python3 -c "
import json,sys; c=json.loads(sys.argv[1])
assert c['sub']=='admin' and c['aud']=='node' and c['sbx']=='$SBX' and c['gen']==1
assert c['wrk']=='w1' and c['sst']=='ns' and c['att']==1 and c['ops']==['exec','fs.read']
assert c['iss']=='tether-cp' and c['pur']=='control' and len(c['jti'])>=16" "$PAYLOAD"
okrc "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"port","port":8080,"proto":"http"}')" = 201 ]; echo $?)" \
	"port capability minted"

# The signer dies, or stops answering: the next capability comes from a
# new signer on the same key (before: every later one failed with 503).
signer_pid() { pgrep -P "$CP_PID" -f "tether-signer --key"; }
cap_ok() { [ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 201 ] &&
	[ "$(python3 -c "import base64,json,sys; t=sys.argv[1].split('.'); print(json.loads(base64.urlsafe_b64decode(t[3]+'='*(-len(t[3])%4)))['kid'])" "$(jfield '["token"]')")" = "$KID" ]; }
SIG1=$(signer_pid)
kill -KILL "$SIG1"
if cap_ok && [ -n "$(signer_pid)" ] && [ "$(signer_pid)" != "$SIG1" ]; then
	ok "signer killed: the next capability is minted by a new signer, same kid"
else notok "signer killed: the next capability is minted by a new signer, same kid" "$(cat "$TT_BODY"; tail -n 3 "$ST/cp.log")"; fi
SIG2=$(signer_pid)
kill -STOP "$SIG2"
code=$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')
if [ "$code" = 201 ] && [ "$(signer_pid)" != "$SIG2" ] && ! kill -0 "$SIG2" 2>/dev/null; then
	ok "signer stuck past its 1 s timeout: replaced (killed, reaped), the request still served"
else notok "signer stuck past its 1 s timeout: replaced (killed, reaped), the request still served" "code $code; $(tail -n 3 "$ST/cp.log")"; fi
cap_ok && ok "... and later capabilities are fine" || notok "capabilities after the signer was replaced" "$(cat "$TT_BODY")"
# A signer restarted on another key (the file swapped) is refused: the
# workers know only the published kid. The original file back: served.
cp "$ST/signer.key" "$WORK/signer.key.orig"
"$ROOT/build/tether-signer" keygen "$ST/signer.key" --force >/dev/null 2>&1
kill -KILL "$(signer_pid)"
code=$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')
if [ "$code" = 503 ] && grep -q "restarted signer holds another key" "$ST/cp.log"; then
	ok "a signer restarted on a different key is refused (503), no capability under it"
else notok "a signer restarted on a different key is refused" "code $code; $(cat "$TT_BODY")"; fi
cp "$WORK/signer.key.orig" "$ST/signer.key"
cap_ok && ok "... the right key file back: capabilities are minted again" ||
	notok "capabilities once the key file is back" "$(cat "$TT_BODY"; tail -n 3 "$ST/cp.log")"
okrc "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"],"iss":"x"}')" = 201 ]; echo $?)" \
	"extra request fields cannot inject claims (still minted by the cp's rules)"
okrc "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["root"]}')" = 400 ]; echo $?)" \
	"unknown operation refused (400)"
okrc "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer $KEY" '{"purpose":"port","port":70000,"proto":"http"}')" = 400 ]; echo $?)" \
	"port out of range refused (400)"
okrc "$([ "$(status POST "/v1/sandboxes/$SBX/capabilities" "Bearer ttk_wrong" '{"purpose":"control","ops":["exec"]}')" = 401 ]; echo $?)" \
	"capability refused with a wrong key (401)"

# Malformed and oversized bodies; the daemon keeps answering.
okrc "$([ "$(status POST /v1/sandboxes "Bearer $KEY" '{"worker":')" = 400 ] && [ "$(jfield '["error"]')" = bad_request ]; echo $?)" \
	"malformed JSON: 400 bad_request"
okrc "$([ "$(status POST /v1/sandboxes "Bearer $KEY" '{"worker":"w1","worker":"w2"}')" = 400 ]; echo $?)" \
	"duplicate JSON keys: 400"
head -c 1100000 /dev/zero | tr '\0' ' ' >"$ST/big"
okrc "$([ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" --data-binary @"$ST/big" "$U/v1/sandboxes")" = 413 ]; echo $?)" \
	"body over 1 MiB: 413"
okrc "$([ "$(status GET "/v1/feed?worker=w1&after=-1" "Worker $W1")" = 400 ]; echo $?)" "bad feed query: 400"
okrc "$([ "$(status GET /v1/sandboxes "Bearer $KEY")" = 200 ]; echo $?)" "daemon still answers after bad input"

# Delete waits for the destroy ack.
status DELETE "/v1/sandboxes/$SBX" "Bearer $KEY" >"$ST/del.code" &
DL=$!
status GET "/v1/feed?worker=w1&after=$FREV&wait=10" "Worker $W1" >/dev/null
DREV=$(jfield '["updates"][0]["rev"]')
check "delete publishes a destroy update" test "$(jfield '["updates"][0]["kind"]')" = destroy
status POST /v1/feed/ack "Worker $W1" "{\"worker\":\"w1\",\"rev\":$DREV,\"results\":[]}" >/dev/null
wait $DL
check "delete answers 200 after the ack" test "$(cat "$ST/del.code")" = 200
okrc "$([ "$(status GET "/v1/sandboxes/$SBX" "Bearer $KEY")" = 404 ]; echo $?)" "deleted sandbox: 404"

# Restart: state survives, the admin key is not rewritten, keys not
# republished, revs continue.
KEYSUM=$(sha256sum "$ST/admin.key")
stop_cp
sleep 0.2
start_cp; okrc $? "cp restarts"
check "admin.key unchanged across restart" test "$(sha256sum "$ST/admin.key")" = "$KEYSUM"
check "the key is not announced again" test "$(grep -c 'admin API key written' "$ST/cp.log")" = 1
okrc "$([ "$(status GET "/v1/sandboxes/$FSBX" "Bearer $KEY")" = 200 ] && [ "$(jfield '["state"]')" = failed ]; echo $?)" \
	"sandbox state survived the restart"
okrc "$([ "$(status GET /v1/workers "Bearer $KEY")" = 200 ] && [ "$(jfield '["workers"][0]["id"]')" = w1 ] && [ "$(jfield '["workers"][0]["acked_rev"]')" = "$DREV" ]; echo $?)" \
	"workers and their acked rev survived"
okrc "$([ "$(status GET "/v1/feed?worker=w1&after=$DREV&wait=0" "Worker $W1")" = 200 ] && [ "$(jfield '["updates"]')" = "[]" ]; echo $?)" \
	"same signing key: no new keys update after restart"
status POST /v1/sandboxes "Bearer $KEY" '{}' >/dev/null &
CR=$!
status GET "/v1/feed?worker=w1&after=$DREV&wait=10" "Worker $W1" >/dev/null
NREV=$(jfield '["updates"][0]["rev"]')
check "feed revs continue after restart ($NREV > $DREV)" test "$NREV" -gt "$DREV"
NS=$(ufield '["sandbox"]')
status POST /v1/feed/ack "Worker $W1" "{\"worker\":\"w1\",\"rev\":$NREV,\"results\":[{\"rev\":$NREV,\"ok\":true}]}" >/dev/null
wait $CR
okrc "$([ "$(status POST "/v1/sandboxes/$NS/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 201 ]; echo $?)" \
	"capabilities still minted after restart (signer respawned)"
check "metrics are served" sh -c "curl -sf $U/metrics | grep -q '^tether_cp_capabilities_total 1$'"

tap_done

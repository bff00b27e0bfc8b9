#!/bin/bash
# Per-worker credentials and per-worker node-api uids (issue 13 items 2
# and 3; SPEC §7: each worker has its own credential; none can register,
# poll or acknowledge for another). A real cluster (`tether up --workers
# 2`): `tether up` provisions w1 and w2 with a credential each (`tetherd
# worker add`) and runs each node-api under a uid of its own. curl then
# plays a compromised w1 (it holds w1's credential) attacking w2, and w2
# itself sending what it was never sent:
# - w1's credential refused for w2's register, poll, ack, progress, lost
#   and drain (403), nothing changed; an unknown or the old shared
#   scheme refused (401);
# - w2's own credential registering another node_url: 403, the cp keeps
#   the provisioned one (the edge sends capabilities there);
# - w2 acking rev 999999999, or one past what its feed sent: 409, nothing
#   recorded, and w2 still creates and serves sandboxes afterwards;
# - a revoked credential is refused;
# - w1's node-api uid cannot connect to w2's manager socket (the file is
#   w2's node-api uid's, 0600), and with the file check bypassed
#   (CAP_DAC_OVERRIDE) the manager's SO_PEERCRED check refuses it;
#   w2's own node-api reaches its manager and serves.
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-wcred
T() { timeout 60 "$ROOT/build/tether" "$@"; }
# st STATUS-FILE: status and body of one call; body in $TT_BODY.
# wk CRED METHOD PATH [BODY]: a worker-authenticated call to the cp.
wk() { req_status "$2" "$CP$3" "Worker $1" "${@:4}"; }
# wstate W: W's state and node_url and acked_rev in GET /v1/workers.
wstate() {
	req_status GET "$CP/v1/workers" "Bearer $KEY" >/dev/null
	jget "' '.join(str(w[k]) for w in d['workers'] if w['id']=='$1' for k in ('state','node_url','acked_rev'))" <"$TT_BODY"
}
# msg: the refusal's message.
msg() { jget 'd.get("message","")' <"$TT_BODY" 2>/dev/null; }

cluster_up_or_bail "cluster up (cp, edge, w1, w2)" 2
KEY=$(cluster_key)
C1=$(cat "$STATE/workers/w1/credential")
C2=$(cat "$STATE/workers/w2/credential")
U2=http://127.0.0.1:$((BASE + 12))

# ---- provisioning: one credential per worker, stored hashed --------------------------
expect "each worker has its own 0600 credential file; the two differ" \
	'[ "$(stat -c %a "$STATE/workers/w1/credential") $(stat -c %a "$STATE/workers/w2/credential")" = "600 600" ] &&
	 [[ $C1 == ttw_* ]] && [[ $C2 == ttw_* ]] && [ "$C1" != "$C2" ]' "$C1 / $C2"
h2=$(printf %s "$C2" | sha256sum | cut -d' ' -f1)
expect "cp.db holds their SHA-256 only, with the provisioned node_url; no shared node token" \
	'[ "$(sqlite3 "$STATE/cp/cp.db" "SELECT hash, node_url FROM worker_creds WHERE id='"'w2'"'")" = "$h2|$U2" ] &&
	 ! sqlite3 "$STATE/cp/cp.db" .dump | grep -qF -e "$C1" -e "$C2" && [ ! -e "$STATE/cp/node.token" ]' \
	"$(sqlite3 "$STATE/cp/cp.db" "SELECT id, hash, node_url FROM worker_creds")"
W2=$(wstate w2)
expect "the honest workers registered, polled and acked: both up at their URLs" \
	'[ "${W2% *}" = "up $U2" ] && [ "$(wstate w1 | cut -d" " -f1)" = up ]' "$W2"

# ---- w1's credential acting for w2: refused everywhere --------------------------------
code=$(wk "$C1" POST /v1/workers/register "{\"id\":\"w2\",\"node_url\":\"http://127.0.0.1:9\"}")
expect "register as w2 with w1's credential: 403, says whose it is" \
	'[ "$code" = 403 ] && [[ "$(msg)" == *"worker w1"*"worker w2"* ]]' "$code $(cat "$TT_BODY")"
code=$(wk "$C1" GET "/v1/feed?worker=w2&after=0&wait=0")
expect "poll w2's feed with w1's credential: 403" '[ "$code" = 403 ]' "$code $(cat "$TT_BODY")"
code=$(wk "$C1" POST /v1/feed/ack '{"worker":"w2","rev":1,"results":[]}')
expect "ack for w2 with w1's credential: 403" '[ "$code" = 403 ]' "$code $(cat "$TT_BODY")"
code=$(wk "$C1" POST /v1/feed/progress '{"worker":"w2","rev":1,"sandbox":"sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa","bytes":1}')
expect "progress for w2 with w1's credential: 403" '[ "$code" = 403 ]' "$code $(cat "$TT_BODY")"
code=$(wk "$C1" POST /v1/feed/lost '{"worker":"w2","sandbox":"sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa","generation":1,"activation":1,"reason":"x","reactivate":false}')
expect "lost report for w2 with w1's credential: 403" '[ "$code" = 403 ]' "$code $(cat "$TT_BODY")"
code=$(wk "$C1" POST /v1/feed/drain '{"worker":"w2"}')
expect "drain of w2 with w1's credential: 403" '[ "$code" = 403 ]' "$code $(cat "$TT_BODY")"
code=$(wk "$C1" POST /v1/workers/register '{"id":"w9","node_url":"http://127.0.0.1:9"}')
expect "register a new worker w9 with w1's credential: 403" '[ "$code" = 403 ]' "$code $(cat "$TT_BODY")"
code=$(wk "ttw_guess" POST /v1/workers/register '{"id":"w9","node_url":"http://127.0.0.1:9"}')
code2=$(req_status POST "$CP/v1/workers/register" "Node $C2" "{\"id\":\"w2\",\"node_url\":\"$U2\"}")
expect "an unknown credential, and w2's own under the old shared scheme (Node): 401" \
	'[ "$code $code2" = "401 401" ]' "$code $code2 $(cat "$TT_BODY")"
sleep 1.2 # a refused drain would show as "stopping"
expect "after all that, w2 is unchanged: up at its URL, same acked rev; no w9" \
	'[ "$(wstate w2)" = "$W2" ] && [ -z "$(wstate w9)" ]' "$(wstate w2) (was $W2)"

# ---- w2's own credential, beyond what it was provisioned or sent ---------------------
code=$(wk "$C2" POST /v1/workers/register '{"id":"w2","node_url":"http://127.0.0.1:9"}')
expect "w2 registering another node_url: 403 naming the provisioned one" \
	'[ "$code" = 403 ] && [[ "$(msg)" == *"provisioned at $U2"* ]]' "$code $(cat "$TT_BODY")"
code=$(wk "$C2" POST /v1/workers/register "{\"id\":\"w2\",\"node_url\":\"$U2\"}")
expect "w2 registering its own node_url: 200" '[ "$code" = 200 ]' "$code $(cat "$TT_BODY")"
code=$(wk "$C2" POST /v1/feed/ack '{"worker":"w2","rev":999999999,"results":[]}')
m=$(msg) now=$(wstate w2)
expect "w2 acking rev 999999999: 409, nothing recorded" \
	'[ "$code" = 409 ] && [[ $m == *"beyond rev"*"nothing recorded"* ]] && [ "$now" = "$W2" ]' \
	"$code $m; $now (was $W2)"
wk "$C2" GET "/v1/feed?worker=w2&after=0&wait=0" >/dev/null
R=$(jget 'd["rev"]' <"$TT_BODY")
code=$(wk "$C2" POST /v1/feed/ack "{\"worker\":\"w2\",\"rev\":$((R + 1)),\"results\":[]}")
code2=$(wk "$C2" POST /v1/feed/ack "{\"worker\":\"w2\",\"rev\":$R,\"results\":[]}")
expect "an ack one past the rev its feed sent ($R): 409; of that very rev: 200" \
	'[ "$code $code2" = "409 200" ]' "$code $code2 $(cat "$TT_BODY")"
ID=$(T create --worker w2 2>"$WORK/err")
out=$(T exec "$ID" -- sh -c 'echo served by $(hostname)' 2>&1)
expect "w2 still creates and serves sandboxes afterwards" \
	'[ -n "$ID" ] && [[ $out == "served by"* ]] && [ "$(T info "$ID" --json | jget "d[\"worker\"]")" = w2 ]' \
	"$(cat "$WORK/err") $out"
A2=$(wstate w2 | cut -d' ' -f3)
expect "... and its acked rev moved on ($A2 > ${W2##* })" '[ "$A2" -gt "${W2##* }" ]' "$(wstate w2)"

# ---- provisioning and revocation by hand ---------------------------------------------
provision "$STATE/cp" w9 http://127.0.0.1:9 "$WORK/w9.cred"
code=$(wk "$CRED" GET "/v1/feed?worker=w9&after=0&wait=0")
"$ROOT/build/tetherd" worker revoke --state "$STATE/cp" --id w9 2>/dev/null
code2=$(wk "$CRED" GET "/v1/feed?worker=w9&after=0&wait=0")
expect "a provisioned w9 is known to the cp (404: not registered yet); revoked: 401" \
	'[ "$code $code2" = "404 401" ]' "$code $code2 $(cat "$TT_BODY")"

# ---- node-api uids: one each; w1's cannot reach w2's manager --------------------------
# napi W: the pid of W's node-api in this cluster.
napi() { ps -eo pid=,args= | grep -F -- "--state $STATE/workers/$1 " | grep -F "tetherd node" | awk '{print $1}' | head -n1; }
uid_of() { sed -n 's/^Uid:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$1/status"; }
P1=$(napi w1) P2=$(napi w2)
UID1=$(uid_of "$P1") UID2=$(uid_of "$P2")
expect "w1's and w2's node-apis run under two different uids, neither root nor nobody" \
	'[ -n "$UID1" ] && [ -n "$UID2" ] && [ "$UID1" != "$UID2" ] && [ "$UID1" != 0 ] && [ "$UID2" != 0 ] &&
	 [ "$UID1" != "$(id -u nobody)" ] && [ "$UID2" != "$(id -u nobody)" ]' "pids $P1 $P2 uids $UID1 $UID2"
M2=$(ps -eo args= | grep -F -- "--state $STATE/workers/w2 " | grep -F "tetherd manager" | head -n1 |
	sed -n 's/.*--socket \([^ ]*\).*/\1/p')
expect "w2's manager.sock is 0600, owned by w2's node-api uid" \
	'[ -S "$M2" ] && [ "$(stat -c "%a %u" "$M2")" = "600 $UID2" ]' "$M2: $(stat -c '%a %u' "$M2" 2>&1)"
# probe UID [CAPS]: one connection to w2's manager.sock as UID (with the
# given ambient capabilities), sending a status request: 2 = connect
# refused, 3 = connected but closed unanswered, 0 = answered.
probe() {
	setpriv --reuid "$1" --regid "$1" --clear-groups ${2:+--inh-caps "+$2" --ambient-caps "+$2"} \
		/usr/bin/python3 -c '
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:", e.strerror); sys.exit(2)
p = json.dumps({"op": "status"}).encode()
try:
    s.sendall(struct.pack(">IBBHI", 0x54545700, 1, 1, 0, len(p)) + p)
    s.settimeout(5)
    d = s.recv(65536)
except OSError:
    d = b""
sys.exit(0 if d else 3)
' "$M2"
}
out=$(probe "$UID1" 2>&1); rc=$?
expect "w1's node-api uid cannot connect to w2's manager.sock (Permission denied)" \
	'[ $rc = 2 ] && [[ $out == *"Permission denied"* ]]' "rc $rc: $out"
out=$(probe "$UID2" 2>&1); rc=$?
expect "the probe works: w2's uid gets past the file check (then the pid check closes it)" '[ $rc = 3 ]' "rc $rc: $out"
before=$(grep -c "peer refused: pid [0-9]* uid $UID1 " "$STATE/logs/w2.log")
out=$(probe "$UID1" dac_override 2>&1); rc=$?
sleep 0.3
after=$(grep -c "peer refused: pid [0-9]* uid $UID1 " "$STATE/logs/w2.log")
expect "w1's uid past the file check (CAP_DAC_OVERRIDE): w2's manager refuses it by SO_PEERCRED, unanswered" \
	'[ $rc = 3 ] && [ "$after" -gt "$before" ]' "rc $rc: $out; $(grep 'peer refused' "$STATE/logs/w2.log" | tail -n 2)"
out=$(T exec "$ID" -- echo still 2>&1)
expect "w2's own node-api still reaches its manager and serves" '[ "$out" = still ]' "$out"
T rm "$ID" >/dev/null 2>&1
# the honest node-apis' own acks were never refused: the cp refused the
# two above, no more
expect "the cp refused exactly the two forged acks, none of the workers' own" \
	'[ "$(grep -c "acked rev .* beyond rev" "$STATE/logs/cp.log")" = 2 ] &&
	 ! grep -q "refused our ack" "$STATE/logs/w1.log" "$STATE/logs/w2.log"' \
	"$(grep "beyond rev" "$STATE/logs/cp.log")"

# ---- a cp that forgot what it sent w2 (as if restored from an older state) -----------
# w2's node-api, restarted, acks what its manager applied: refused, it goes
# back to polling (no retry loop), and w2 serves again.
sqlite3 "$STATE/cp/cp.db" "UPDATE workers SET sent_rev=0, acked_rev=0 WHERE id='w2'"
kill -KILL "$(napi w2)"
wait_until 300 grep -q "refused our ack" "$STATE/logs/w2.log"
ID3=$(T create --worker w2 2>"$WORK/err")
out=$(T exec "$ID3" -- echo back 2>&1)
sleep 2
expect "an honest ack the cp cannot have sent is refused once; w2 polls again and serves" \
	'[ "$out" = back ] && [ "$(grep -c "refused our ack" "$STATE/logs/w2.log")" = 1 ]' \
	"$(cat "$WORK/err") $out; $(grep -c "refused our ack" "$STATE/logs/w2.log") refusals"
T rm "$ID3" >/dev/null 2>&1
tap_done

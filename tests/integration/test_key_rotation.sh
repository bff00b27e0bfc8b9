#!/bin/bash
# Capability key rotation through the signed feed (SPEC §3, issue 13 item
# 1): `tether admin rotate-keys` under load, on a cluster of two workers.
# - Two loads run across the rotation: execs through the edge (whose cached
#   capabilities were signed by the old key) and, straight at node-api, a
#   capability fetched fresh for every exec (the first ones signed by the
#   new key reach the workers right after it starts signing). None of them
#   is refused: the new key signs only once every worker acknowledged the
#   bundle holding it, and the old key verifies on.
# - Afterwards new capabilities name the new kid; one issued before the
#   rotation is still admitted; a non-admin key may not rotate.
# - Once everything the old key signed has expired (135 s after it
#   stopped signing), it leaves the bundle, and the workers' key rings.
# Prints TAP.
# tether-test: background (most of it waits for the old key's capabilities to expire)
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-key-rotation
T() { timeout 60 "$ROOT/build/tether" "$@"; }
# kid_of TOKEN: the kid in a capability's footer.
kid_of() { python3 -c 'import base64,json,sys; f=sys.argv[1].split(".")[3]; print(json.loads(base64.urlsafe_b64decode(f+"="*(-len(f)%4)))["kid"])' "$1"; }
# ring W: the kids in worker W's key ring (runtime.db).
ring() { sqlite3 "$STATE/workers/$1/runtime.db" "SELECT kid FROM keys ORDER BY kid" | tr '\n' ' '; }
if [ "$(id -u)" != 0 ]; then skip "key rotation" "needs root"; tap_done; exit; fi

cluster_up_or_bail "a cluster of two workers comes up" 2
A=$(T create --worker w1) && B=$(T create --worker w2)
expect "two sandboxes, one per worker" '[ -n "$A" ] && [ -n "$B" ]' "$A $B"
T cap "$A" >"$WORK/old.json"
OLD_TOK=$(jfield '["token"]' "$WORK/old.json"); NODE_A=$(jfield '["node_url"]' "$WORK/old.json")
OLD_KID=$(kid_of "$OLD_TOK")

# load_edge: execs through the edge, alternating sandboxes, until STOP.
load_edge() {
	local i=0
	while [ ! -e "$WORK/stop" ]; do
		if [ $((i % 2)) = 0 ]; then id=$A; else id=$B; fi
		out=$(T exec "$id" -- echo "e$i" 2>&1)
		[ "$out" = "e$i" ] && echo ok >>"$WORK/edge.log" || echo "FAIL $i: $out" >>"$WORK/edge.log"
		i=$((i + 1))
	done
}
# load_fresh: a new capability per exec, straight to node-api.
load_fresh() {
	local i=0 tok url kid code
	while [ ! -e "$WORK/stop" ]; do
		if [ $((i % 2)) = 0 ]; then id=$A; else id=$B; fi
		if T cap "$id" >"$WORK/c.json" 2>&1; then
			read -r tok url kid < <(python3 -c 'import base64,json,sys; d=json.load(open(sys.argv[1])); f=d["token"].split(".")[3]; print(d["token"], d["node_url"], json.loads(base64.urlsafe_b64decode(f+"="*(-len(f)%4)))["kid"])' "$WORK/c.json")
			code=$(tcurl -o "$WORK/f.out" -w '%{http_code}' -X POST "$url/v1/sandboxes/$id/exec" \
				-H "Authorization: Capability $tok" -d '{"cmd":["true"]}')
			[ "$code" = 200 ] && echo "ok $kid" >>"$WORK/fresh.log" ||
				echo "FAIL $i: $code $(cat "$WORK/f.out")" >>"$WORK/fresh.log"
		else
			echo "FAIL $i: cap: $(cat "$WORK/c.json")" >>"$WORK/fresh.log"
		fi
		i=$((i + 1))
	done
}
: >"$WORK/edge.log"; : >"$WORK/fresh.log"
load_edge & L1=$!
load_fresh & L2=$!
sleep 3
t0=$(ms)
T admin rotate-keys >"$WORK/rot.out" 2>&1; rc=$?
t1=$(ms)
sleep 6
touch "$WORK/stop"; wait "$L1" "$L2"
NEW_KID=$(sed -n 's/^signing with //p' "$WORK/rot.out")
expect "tether admin rotate-keys under load: the new key signs ($((t1 - t0)) ms)" \
	'[ $rc = 0 ] && [ -n "$NEW_KID" ] && [ "$NEW_KID" != "$OLD_KID" ]' "rc $rc: $(cat "$WORK/rot.out")"
ne=$(grep -c '^ok' "$WORK/edge.log"); nf=$(grep -c '^ok' "$WORK/fresh.log")
expect "no exec through the edge refused or failed across the rotation ($ne run)" \
	'[ "$ne" -ge 10 ] && ! grep -q FAIL "$WORK/edge.log"' "$(grep FAIL "$WORK/edge.log" | head -n 3)"
expect "no freshly minted capability refused across the rotation ($nf run)" \
	'[ "$nf" -ge 10 ] && ! grep -q FAIL "$WORK/fresh.log"' "$(grep FAIL "$WORK/fresh.log" | head -n 3)"
expect "capabilities of both keys were admitted during the load" \
	'grep -q "ok $OLD_KID" "$WORK/fresh.log" && grep -q "ok $NEW_KID" "$WORK/fresh.log"' \
	"$(sort "$WORK/fresh.log" | uniq -c)"
echo "# rotation: $((t1 - t0)) ms from the request to the new key signing; $ne execs via the edge, $nf with fresh capabilities, none refused"

T cap "$A" >"$WORK/new.json"
expect "a capability issued now names the new kid" \
	'[ "$(kid_of "$(jfield "[\"token\"]" "$WORK/new.json")")" = "$NEW_KID" ]' "$(cat "$WORK/new.json")"
code=$(tcurl -o "$WORK/o.out" -w '%{http_code}' -X POST "$NODE_A/v1/sandboxes/$A/exec" \
	-H "Authorization: Capability $OLD_TOK" -d '{"cmd":["true"]}')
expect "a capability the old key signed before the rotation is still admitted" '[ "$code" = 200 ]' \
	"$code $(cat "$WORK/o.out")"
expect "both workers hold both keys meanwhile" \
	'[ "$(ring w1)" = "$(ring w2)" ] && [[ "$(ring w1)" == *"$OLD_KID"* ]] && [[ "$(ring w1)" == *"$NEW_KID"* ]]' \
	"w1: $(ring w1); w2: $(ring w2)"
# A key of another name may not rotate.
KEY=$(cluster_key)
code=$(TT_BODY=$WORK/k.out req_status POST "$CP/v1/admin/rotate-keys" "Bearer not-a-key")
expect "rotating needs the admin key (401 without a valid one)" '[ "$code" = 401 ]' "$code"
code=$(req_status GET "$CP/v1/admin/keys" "Bearer $KEY")
expect "GET /v1/admin/keys shows the new key signing, the old one retired" \
	'[ "$code" = 200 ] && [ "$(jfield "[\"signing\"]")" = "$NEW_KID" ] && [ "$(jfield "[\"keys\"][0][\"not_after\"]" )" != None ]' \
	"$code $(cat "$TT_BODY")"

# The old key leaves once what it signed has expired (135 s + the sweep).
dropped() { [ "$(ring w1)" = "$NEW_KID " ] && [ "$(ring w2)" = "$NEW_KID " ]; }
if wait_until 1700 dropped; then ok "the old key left both workers' key rings once its capabilities expired"
else notok "the old key left both workers' key rings once its capabilities expired" "w1: $(ring w1); w2: $(ring w2)"; fi
code=$(tcurl -o "$WORK/o.out" -w '%{http_code}' -X POST "$NODE_A/v1/sandboxes/$A/exec" \
	-H "Authorization: Capability $OLD_TOK" -d '{"cmd":["true"]}')
expect "... and the old capability (expired) is refused" '[ "$code" = 403 ]' "$code $(cat "$WORK/o.out")"
out=$(T exec "$A" -- echo still 2>&1)
expect "operations go on under the new key" '[ "$out" = still ]' "$out"
cluster_down
tap_done

#!/bin/bash
# tether-test: slow
# Control-plane lifecycle (issue 5): pause, resume, migrate, forced resume,
# failures, progress and generations across a cp restart, against a real
# `tetherd cp` (--worker-timeout 4: the keep-alive loops below must get a poll in
# within it on a loaded machine). curl plays the workers: register,
# long-poll the feed, acknowledge with results we choose; background loops
# keep w1/w2 "up" until a test stops one. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
workdir tt-cplc-test
ST=$WORK
PORT=$(free_port)
U=http://127.0.0.1:$PORT
declare -A AFTER=([w1]=0 [w2]=0 [w3]=0) ALIVE=() CR=()

start_cp() { cp_start "$ST" "$PORT" --worker-timeout 4; }
stop_cp() { cp_stop; }
# alive W: a background loop polls as W (wait=0, past the end) so the cp
# sees W up; dead W stops it.
alive() {
	( while :; do tcurl -o /dev/null -H "Authorization: Worker ${CR[$1]}" \
		"$U/v1/feed?worker=$1&after=999999999&wait=0"; sleep 0.4; done ) &
	ALIVE[$1]=$!
}
dead() {
	[ -n "${ALIVE[$1]:-}" ] && kill "${ALIVE[$1]}" 2>/dev/null && wait "${ALIVE[$1]}" 2>/dev/null
	unset "ALIVE[$1]"
}
# the keep-alive loops stop at exit (lib.sh then stops the cp).
at_exit 'for w in "${!ALIVE[@]}"; do dead "$w"; done'
# status METHOD PATH AUTH [BODY]: prints the HTTP status, body in $ST/out.
status() { req_status "$1" "$U$2" "$3" "${@:4}"; }
# bg NAME METHOD PATH BODY: a Bearer call in the background; status in
# $ST/NAME.code, body in $ST/NAME.json.
bg() {
	tcurl -o "$ST/$1.json" -w '%{http_code}' -X "$2" -H "Authorization: Bearer $KEY" \
		--data-binary "$4" "$U$3" >"$ST/$1.code"
}
# go ...: bg in the background; waitgo waits for those calls only (not
# for the keep-alive loops).
BGP=()
go() { bg "$@" & BGP+=($!); }
waitgo() { for p in "${BGP[@]}"; do wait "$p"; done; BGP=(); }
# feed W [WAIT]: W's next updates into $ST/feed.W (AFTER[W] advances).
# Each update arrives signed (lib/feedsig.h): feed.W holds the signed
# bodies, which is what a manager applies after verifying them.
feed() {
	tcurl -o "$ST/feed.$1" -H "Authorization: Worker ${CR[$1]}" \
		"$U/v1/feed?worker=$1&after=${AFTER[$1]}&wait=${2:-5}"
	python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
d['updates']=[json.loads(u['body']) for u in d.get('updates',[])]
json.dump(d,open(sys.argv[1],'w'))" "$ST/feed.$1" 2>/dev/null
	AFTER[$1]=$(jfield '["rev"]' "$ST/feed.$1")
}
# feedfor W KIND SBX: polls as W until a KIND update for SBX arrived (a
# background call may append it after an earlier update woke the poll);
# feed.W then holds every update seen meanwhile.
feedfor() {
	local acc=$ST/acc.$1
	echo '{"rev":0,"updates":[]}' >"$acc"
	for _ in 1 2 3 4 5 6; do
		feed "$1" 2
		python3 -c "
import json,sys
a=json.load(open(sys.argv[1])); f=json.load(open(sys.argv[2]))
a['updates']+=f['updates']; a['rev']=f['rev']
json.dump(a,open(sys.argv[1],'w'))" "$acc" "$ST/feed.$1"
		cp "$acc" "$ST/feed.$1"
		[ "$(count "$1" "$2" "$3")" != 0 ] && return 0
	done
	return 1
}
# upd W KIND SBX FIELD: FIELD of the first KIND update for SBX in feed.W.
upd() {
	python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
u=[u for u in d['updates'] if u['kind']==sys.argv[2] and u.get('sandbox')==sys.argv[3]]
print(u[0].get(sys.argv[4]) if u else 'NONE')" "$ST/feed.$1" "$2" "$3" "$4"
}
# count W KIND SBX: how many KIND updates for SBX are in feed.W.
count() {
	python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
print(len([u for u in d['updates'] if u['kind']==sys.argv[2] and u.get('sandbox')==sys.argv[3]]))" "$ST/feed.$1" "$2" "$3"
}
# ack W REV RESULT: acknowledges REV with one result object.
ack() {
	tcurl -o /dev/null -w '%{http_code}' -H "Authorization: Worker ${CR[$1]}" --data-binary \
		"{\"worker\":\"$1\",\"rev\":$2,\"results\":[$3]}" "$U/v1/feed/ack"
}
# snapok SBX GEN: a pause result with a complete snapshot.
snapok() {
	echo "\"ok\":true,\"snapshot\":{\"key\":\"$1/$2\",\"generation\":$2,\"size\":10485760,\"checksum\":\"blake2b:00ff$2\"}"
}
# sbx SBX: GET the sandbox into $ST/out; prints "state gen worker".
sbx() {
	status GET "/v1/sandboxes/$1" "Bearer $KEY" >/dev/null
	echo "$(jfield '["state"]') $(jfield '["generation"]') $(jfield '["worker"]')"
}

start_cp; okrc $? "cp starts with --worker-timeout 4"
cp_secrets "$ST"
for w in w1 w2 w3; do
	provision "$ST" "$w" http://127.0.0.1:1 && CR[$w]=$CRED
	status POST /v1/workers/register "Worker ${CR[$w]}" "{\"id\":\"$w\",\"node_url\":\"http://127.0.0.1:1\"}" >/dev/null
	feed "$w" 0
done
alive w1; alive w2
sleep 5.2 # w3 never polls again: down
okrc "$([ "$(status GET /v1/workers "Bearer $KEY")" = 200 ] && [ "$(python3 -c "import json; print(' '.join(w['state'] for w in json.load(open('$ST/out'))['workers']))")" = "up up down" ]; echo $?)" \
	"w1, w2 up; w3 down after 4 s without a poll"

# A running sandbox on w1 (gen 1).
go c1 POST /v1/sandboxes '{"worker":"w1"}'
feed w1
S=$(python3 -c "import json; print(json.load(open('$ST/feed.w1'))['updates'][0]['sandbox'])")
ack w1 "${AFTER[w1]}" "{\"rev\":${AFTER[w1]},\"ok\":true}" >/dev/null; waitgo
check "sandbox created, running gen 1 on w1" test "$(cat "$ST/c1.code") $(sbx "$S")" = "201 running 1 w1"
check "no snapshot yet" test "$(jfield '["snapshot"]')" = None

# --- pause with progress ---------------------------------------------------
okrc "$([ "$(status POST "/v1/sandboxes/$S/pause?wait=0" "Bearer $KEY")" = 202 ] && [ "$(jfield '["state"]')" = pausing ] && [ "$(jfield '["progress"]')" = "{'bytes': 0, 'total': None}" ]; echo $?)" \
	"pause?wait=0: 202 pausing with empty progress"
feedfor w1 pause "$S"
PREV=$(upd w1 pause "$S" rev)
check "w1 sees a pause update for gen 1, snapshot key $S/1" test "$(upd w1 pause "$S" generation) $(upd w1 pause "$S" snapshot)" = "1 $S/1"
okrc "$([ "$(status POST /v1/feed/progress "Worker ${CR[w1]}" "{\"worker\":\"w1\",\"rev\":$PREV,\"sandbox\":\"$S\",\"bytes\":4096,\"total\":10485760}")" = 200 ]; echo $?)" \
	"progress report accepted"
sbx "$S" >/dev/null
check "progress shows in the sandbox object" test "$(jfield '["progress"]["bytes"]') $(jfield '["progress"]["total"]')" = "4096 10485760"
okrc "$([ "$(status POST /v1/feed/progress "Worker ${CR[w1]}" "{\"worker\":\"w1\",\"rev\":$((PREV - 1)),\"sandbox\":\"$S\",\"bytes\":9,\"total\":null}")" = 409 ]; echo $?)" \
	"progress for another rev: 409"
okrc "$([ "$(status POST /v1/feed/progress "Worker ${CR[w2]}" "{\"worker\":\"w2\",\"rev\":$PREV,\"sandbox\":\"$S\",\"bytes\":9}")" = 409 ]; echo $?)" \
	"progress from a worker that does not hold the sandbox: 409"
okrc "$([ "$(status POST /v1/feed/progress "Worker ${CR[w1]}" "{\"worker\":\"w1\",\"rev\":$PREV,\"sandbox\":\"$S\",\"bytes\":-1}")" = 400 ]; echo $?)" \
	"negative progress: 400"
okrc "$([ "$(status POST /v1/feed/progress "Bearer $KEY" "{\"worker\":\"w1\",\"rev\":$PREV,\"sandbox\":\"$S\",\"bytes\":1}")" = 401 ]; echo $?)" \
	"progress with an API key instead of the worker credential: 401"
check "the refused reports did not change the progress" test "$(sbx "$S" >/dev/null; jfield '["progress"]["bytes"]')" = 4096
okrc "$([ "$(tcurl -o "$ST/out" -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" -H 'X-Tether-Wait: 0' "$U/v1/sandboxes/$S/pause")" = 409 ] && grep -q "is pausing" "$ST/out"; echo $?)" \
	"a second pause while pausing, X-Tether-Wait: 0: 409 is pausing at once"
okrc "$([ "$(tcurl -o "$ST/out" -w '%{http_code}' -X POST -H "Authorization: Bearer $KEY" -H 'X-Tether-Wait: x' "$U/v1/sandboxes/$S/pause")" = 400 ]; echo $?)" \
	"a malformed X-Tether-Wait: 400"
# a second pause (and a capability request) queue behind the one in flight
go p2 POST "/v1/sandboxes/$S/pause" ''
go c2 POST "/v1/sandboxes/$S/capabilities" '{"purpose":"control","ops":["exec"]}'
sleep 0.5
check "the queued calls are still waiting" test ! -s "$ST/p2.code" -a ! -s "$ST/c2.code"
ack w1 "$PREV" "{\"rev\":$PREV,$(snapok "$S" 1)}" >/dev/null
waitgo
okrc "$([ "$(cat "$ST/p2.code")" = 409 ] && grep -q "is paused" "$ST/p2.json" && [ "$(cat "$ST/c2.code")" = 409 ] && grep -q "is paused" "$ST/c2.json"; echo $?)" \
	"once paused, the queued pause and capability answer 409 is paused"
check "ack with a complete snapshot: paused" test "$(sbx "$S")" = "paused 1 w1"
check "the snapshot metadata is on the sandbox" test "$(jfield '["snapshot"]["generation"]') $(jfield '["snapshot"]["key"]') $(jfield '["snapshot"]["size"]') $(jfield '["snapshot"]["checksum"]')" = "1 $S/1 10485760 blake2b:00ff1"
check "no progress once paused" test "$(jfield '.get("progress")')" = None
okrc "$([ "$(status POST "/v1/sandboxes/$S/pause" "Bearer $KEY")" = 409 ] && grep -q "is paused" "$ST/out"; echo $?)" \
	"pause of a paused sandbox: 409 \"… is paused\""
okrc "$([ "$(status POST "/v1/sandboxes/$S/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 409 ]; echo $?)" \
	"no capability while paused (409)"

# --- resume on w2 ----------------------------------------------------------
go r1 POST "/v1/sandboxes/$S/resume" '{"worker":"w2"}'
feedfor w2 install "$S"
IREV=$(upd w2 install "$S" rev)
check "w2 gets install gen 2 for w2 with snapshot $S/1" test "$(upd w2 install "$S" generation) $(upd w2 install "$S" worker) $(upd w2 install "$S" snapshot)" = "2 w2 $S/1"
check "while the install is pending the sandbox is resuming" test "$(sbx "$S")" = "resuming 2 w2"
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "resume answers 200 running gen 2 on w2, resumed from 1" test "$(cat "$ST/r1.code") $(jfield '["state"]' "$ST/r1.json") $(jfield '["generation"]' "$ST/r1.json") $(jfield '["worker"]' "$ST/r1.json") $(jfield '["resumed_from"]' "$ST/r1.json")" = "200 running 2 w2 1"
check "the resume is not marked forced" test "$(jfield '.get("forced")' "$ST/r1.json")" = None
okrc "$([ "$(status POST "/v1/sandboxes/$S/capabilities" "Bearer $KEY" '{"purpose":"control","ops":["exec"]}')" = 201 ] && [ "$(jfield '["generation"]') $(jfield '["worker"]')" = "2 w2" ]; echo $?)" \
	"capabilities now name gen 2 on w2"

# --- refusals that change nothing --------------------------------------------
okrc "$([ "$(status POST "/v1/sandboxes/$S/resume" "Bearer $KEY" '{"worker":"w1"}')" = 409 ] && grep -q "is running" "$ST/out"; echo $?)" \
	"resume of a running sandbox: 409"
check "… unchanged" test "$(sbx "$S")" = "running 2 w2"
okrc "$([ "$(status POST "/v1/sandboxes/$S/migrate" "Bearer $KEY" '{"worker":"w9"}')" = 404 ] && grep -q "no worker w9" "$ST/out"; echo $?)" \
	"migrate to an unknown worker: 404"
check "… unchanged" test "$(sbx "$S")" = "running 2 w2"
okrc "$([ "$(status POST "/v1/sandboxes/$S/migrate" "Bearer $KEY" '{"worker":"w3"}')" = 409 ] && grep -q "w3 is down" "$ST/out"; echo $?)" \
	"migrate to a down worker: 409"
check "… unchanged" test "$(sbx "$S")" = "running 2 w2"
okrc "$([ "$(status POST "/v1/sandboxes/$S/migrate" "Bearer $KEY" '{"worker":"w2"}')" = 409 ]; echo $?)" \
	"migrate to the worker it is on: 409"
okrc "$([ "$(status POST "/v1/sandboxes/$S/migrate" "Bearer $KEY" '{}')" = 400 ] && [ "$(status POST "/v1/sandboxes/$S/resume" "Bearer $KEY" '{"force":"yes"}')" = 400 ]; echo $?)" \
	"malformed migrate/resume bodies: 400"
feed w2 0
check "none of the refusals reached a feed" test "$(count w2 pause "$S") $(count w2 install "$S")" = "0 0"
okrc "$([ "$(status POST /v1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa/pause "Bearer $KEY")" = 404 ]; echo $?)" "pause of an unknown sandbox: 404"
okrc "$([ "$(status POST "/v1/sandboxes/$S/pause" "Bearer ttk_wrong")" = 401 ]; echo $?)" "pause with a wrong key: 401"

# --- two concurrent migrates: exactly one wins ------------------------------
go m1 POST "/v1/sandboxes/$S/migrate" '{"worker":"w1"}'
go m2 POST "/v1/sandboxes/$S/migrate" '{"worker":"w1"}'
feedfor w2 pause "$S"
check "exactly one pause reached w2" test "$(count w2 pause "$S")" = 1
PREV=$(upd w2 pause "$S" rev)
ack w2 "$PREV" "{\"rev\":$PREV,$(snapok "$S" 2)}" >/dev/null
feedfor w1 install "$S"
check "w1 gets install gen 3 with snapshot $S/2" test "$(upd w1 install "$S" generation) $(upd w1 install "$S" snapshot)" = "3 $S/2"
IREV=$(upd w1 install "$S" rev)
ack w1 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
MC=$(printf '%s\n%s\n' "$(cat "$ST/m1.code")" "$(cat "$ST/m2.code")" | sort | tr '\n' ' ')
check "one migrate 200, the other 409 ($MC)" test "$MC" = "200 409 "
check "the sandbox migrated once: running gen 3 on w1" test "$(sbx "$S")" = "running 3 w1"

# --- cp restart between migrations: generations continue ------------------
stop_cp; sleep 0.2
start_cp; okrc $? "cp restarts"
check "state survived the restart" test "$(sbx "$S")" = "running 3 w1"
sleep 0.5 # keep-alive loops poll the new cp
go m3 POST "/v1/sandboxes/$S/migrate" '{"worker":"w2"}'
feedfor w1 pause "$S"; PREV=$(upd w1 pause "$S" rev)
ack w1 "$PREV" "{\"rev\":$PREV,$(snapok "$S" 3)}" >/dev/null
feedfor w2 install "$S"; IREV=$(upd w2 install "$S" rev)
check "after the restart the install is gen 4 (never reused)" test "$(upd w2 install "$S" generation) $(upd w2 install "$S" snapshot)" = "4 $S/3"
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "migrate after the restart: 200, running gen 4 on w2" test "$(cat "$ST/m3.code") $(sbx "$S")" = "200 running 4 w2"

# --- a failed pause: relaunched from the layer the worker kept -------------
# (before, it failed, and a resume restored the last snapshot: every write
# since was lost although the worker still held the layer)
go p2 POST "/v1/sandboxes/$S/pause" ''
feedfor w2 pause "$S"; PREV=$(upd w2 pause "$S" rev)
ack w2 "$PREV" "{\"rev\":$PREV,\"ok\":false,\"error\":\"disk full\"}" >/dev/null
feedfor w2 install "$S"; IREV=$(upd w2 install "$S" rev)
check "pause acked ok:false: w2 gets install gen 5 from its own layer, no snapshot" \
	test "$(upd w2 install "$S" generation) $(upd w2 install "$S" from_layer) $(upd w2 install "$S" snapshot)" = "5 True None"
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "the pause answers 503 naming the worker's error" sh -c "test \"\$(cat '$ST/p2.code')\" = 503 && grep -q 'disk full' '$ST/p2.json'"
check "the sandbox runs on: running gen 5 on w2, its note naming the failed pause" \
	sh -c "test \"\$(echo '$(sbx "$S")')\" = 'running 5 w2' && grep -q 'relaunched as generation 5.*disk full' '$ST/out'"
check "the last complete snapshot is still gen 3" test "$(jfield '["snapshot"]["generation"]')" = 3
# a relaunch that fails too: failed, retired, resumable from the snapshot
go p2b POST "/v1/sandboxes/$S/pause" ''
feedfor w2 pause "$S"; PREV=$(upd w2 pause "$S" rev)
ack w2 "$PREV" "{\"rev\":$PREV,\"ok\":false,\"error\":\"disk full\"}" >/dev/null
feedfor w2 install "$S"; IREV=$(upd w2 install "$S" rev)
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":false,\"error\":\"install: no layer here\"}" >/dev/null; waitgo
check "a relaunch that fails: failed gen 6 on w2 with the worker's error" sh -c "test \"\$(echo '$(sbx "$S")')\" = 'failed 6 w2' && grep -q 'no layer here' '$ST/out'"
feedfor w2 retire "$S"
check "a retire for gen 6 is on w2's feed" test "$(upd w2 retire "$S" generation)" = 6
go r2 POST "/v1/sandboxes/$S/resume" '{"worker":"w1"}'
feedfor w1 install "$S"; IREV=$(upd w1 install "$S" rev)
check "resume from failed: install gen 7 from snapshot $S/3" test "$(upd w1 install "$S" generation) $(upd w1 install "$S" snapshot)" = "7 $S/3"
ack w1 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "resume from failed: 200 running gen 7 on w1" test "$(cat "$ST/r2.code") $(sbx "$S")" = "200 running 7 w1"

# --- a pause ack with a snapshot that is not the one asked for --------------
go p3 POST "/v1/sandboxes/$S/pause" ''
feedfor w1 pause "$S"; PREV=$(upd w1 pause "$S" rev)
ack w1 "$PREV" "{\"rev\":$PREV,\"ok\":true,\"snapshot\":{\"key\":\"$S/3\",\"generation\":7,\"size\":1,\"checksum\":\"blake2b:00\"}}" >/dev/null
feedfor w1 install "$S"; IREV=$(upd w1 install "$S" rev)
ack w1 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "ok with a wrong snapshot key: 503, relaunched from its layer: running gen 8 on w1" test "$(cat "$ST/p3.code") $(sbx "$S")" = "503 running 8 w1"
check "… the bogus snapshot is not recorded (latest still gen 3)" test "$(jfield '["snapshot"]["generation"]')" = 3

# --- forced resume with the old worker down ---------------------------------
dead w1; sleep 5.2
okrc "$([ "$(status POST "/v1/sandboxes/$S/resume" "Bearer $KEY" '{"worker":"w2"}')" = 409 ] && grep -q "worker w1 is down; use --force to resume from the last complete snapshot (generation 3)" "$ST/out"; echo $?)" \
	"resume with the worker down and no force: 409 naming --force and generation 3"
check "… unchanged" test "$(sbx "$S")" = "running 8 w1"
okrc "$([ "$(status POST "/v1/sandboxes/$S/pause" "Bearer $KEY")" = 409 ] && grep -q "w1 is down" "$ST/out"; echo $?)" \
	"pause with the worker down: 409"
go f1 POST "/v1/sandboxes/$S/resume" '{"worker":"w2","force":true}'
feedfor w2 install "$S"; IREV=$(upd w2 install "$S" rev)
check "forced: w2 gets install gen 9 from snapshot $S/3" test "$(upd w2 install "$S" generation) $(upd w2 install "$S" snapshot)" = "9 $S/3"
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "forced resume: 200 forced:true resumed_from 3, running gen 9 on w2" test "$(cat "$ST/f1.code") $(jfield '["forced"]' "$ST/f1.json") $(jfield '["resumed_from"]' "$ST/f1.json") $(sbx "$S")" = "200 True 3 running 9 w2"
feed w1 0
check "the retire for gen 8 is on w1's feed" test "$(upd w1 retire "$S" generation)" = 8
check "… and w1 got no install" test "$(count w1 install "$S")" = 0
alive w1

# --- the worker dies during a pause: failed + retire, resumable with force --
sleep 0.5
go p4 POST "/v1/sandboxes/$S/pause" ''
feedfor w2 pause "$S"; check "w2 gets the pause for gen 9" test "$(upd w2 pause "$S" generation)" = 9
dead w2
waitgo
check "pause answers 503 once w2 is down" test "$(cat "$ST/p4.code")" = 503
check "the sandbox failed: worker went down during the pause" sh -c "test \"\$(echo '$(sbx "$S")')\" = 'failed 9 w2' && grep -q 'w2 went down during the pause' '$ST/out'"
okrc "$([ "$(status POST "/v1/sandboxes/$S/resume" "Bearer $KEY" '{}')" = 409 ] && grep -q "worker w2 is down; use --force" "$ST/out"; echo $?)" \
	"resume from failed with the worker down needs --force (409)"
go f2 POST "/v1/sandboxes/$S/resume" '{"force":true}'
feedfor w1 install "$S"; IREV=$(upd w1 install "$S" rev)
ack w1 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "forced resume with placement: running gen 10 on w1 (the only up worker)" test "$(cat "$ST/f2.code") $(jfield '["forced"]' "$ST/f2.json") $(sbx "$S")" = "200 True running 10 w1"
feed w2 0
check "a retire for gen 9 is on w2's feed (its pause failed)" test "$(upd w2 retire "$S" generation) $(count w2 install "$S")" = "9 0"

# --- a failed install on resume: failed, retired, generation not reused ------
alive w2; sleep 0.5
go m4 POST "/v1/sandboxes/$S/migrate" '{"worker":"w2"}'
feedfor w1 pause "$S"; PREV=$(upd w1 pause "$S" rev)
ack w1 "$PREV" "{\"rev\":$PREV,$(snapok "$S" 10)}" >/dev/null
feedfor w2 install "$S"; IREV=$(upd w2 install "$S" rev)
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":false,\"error\":\"snapshot checksum mismatch\"}" >/dev/null; waitgo
check "install failure on the target: migrate 503, failed gen 11 on w2" test "$(cat "$ST/m4.code") $(sbx "$S")" = "503 failed 11 w2"
feedfor w2 retire "$S"
check "a retire for gen 11 is on w2's feed" test "$(upd w2 retire "$S" generation)" = 11
go r4 POST "/v1/sandboxes/$S/resume" '{}'
sleep 0.3; feed w1 1; feed w2 1
W=$( [ "$(count w1 install "$S")" = 1 ] && echo w1 || echo w2 )
IREV=$(upd "$W" install "$S" rev)
check "the next resume is gen 12 from snapshot $S/10" test "$(upd "$W" install "$S" generation) $(upd "$W" install "$S" snapshot)" = "12 $S/10"
ack "$W" "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "running gen 12" test "$(sbx "$S" | cut -d' ' -f1,2)" = "running 12"

# --- a sandbox never paused has nothing to resume from ----------------------
go c2 POST /v1/sandboxes '{"worker":"w2"}'
feed w2; IREV=$(python3 -c "import json; print([u for u in json.load(open('$ST/feed.w2'))['updates'] if u['kind']=='install'][0]['rev'])")
T=$(python3 -c "import json; print([u for u in json.load(open('$ST/feed.w2'))['updates'] if u['kind']=='install'][0]['sandbox'])")
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":false,\"error\":\"boom\"}" >/dev/null; waitgo
okrc "$([ "$(status POST "/v1/sandboxes/$T/resume" "Bearer $KEY" '{}')" = 409 ] && grep -q "no complete snapshot" "$ST/out"; echo $?)" \
	"resume without any complete snapshot: 409"

# --- the worker dies before acknowledging a create: failed + retire --------
# (before, the sandbox stayed "starting" for good, counted as load, and a
# late ack could still turn it running after the caller was told 503).
go c3 POST /v1/sandboxes '{"worker":"w2"}'
feed w2 1; C3=$(python3 -c "import json; print([u for u in json.load(open('$ST/feed.w2'))['updates'] if u['kind']=='install'][-1]['sandbox'])")
dead w2
t0=$(date +%s)
waitgo
check "a create whose worker dies before its ack: 503 as soon as it is failed (not after the 30 s ack wait)" \
	test "$(cat "$ST/c3.code")" = 503 -a $(( $(date +%s) - t0 )) -lt 15
check "a create whose worker dies before its ack: failed, and the cp says why" \
	sh -c "test \"\$(echo '$(sbx "$C3")')\" = 'failed 1 w2' && grep -q 'w2 went down during the create' '$ST/cp.log'"
alive w2; feed w2 0
check "... its generation is retired on that worker" test "$(upd w2 retire "$C3" generation)" = 1

# --- a migrate whose caller left: the cp finishes it --------------------------
# (before, the resume on the target ran only from the caller's parked
# request: a caller that gave up left the sandbox paused on the old worker).
go c4 POST /v1/sandboxes '{"worker":"w1"}'
feed w1; M=$(python3 -c "import json; print([u for u in json.load(open('$ST/feed.w1'))['updates'] if u['kind']=='install'][-1]['sandbox'])")
IREV=$(upd w1 install "$M" rev); ack w1 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
check "a sandbox to migrate: running gen 1 on w1" test "$(cat "$ST/c4.code") $(sbx "$M")" = "201 running 1 w1"
TT_CURL_MAX=1 go m5 POST "/v1/sandboxes/$M/migrate" '{"worker":"w2"}'
feedfor w1 pause "$M"; PREV=$(upd w1 pause "$M" rev)
waitgo # the caller gave up after 1 s, before the pause's ack
ack w1 "$PREV" "{\"rev\":$PREV,$(snapok "$M" 1)}" >/dev/null
feedfor w2 install "$M"; IREV=$(upd w2 install "$M" rev)
check "a migrate whose caller left: the install on the target follows the pause (gen 2 from $M/1)" \
	test "$(upd w2 install "$M" generation) $(upd w2 install "$M" snapshot)" = "2 $M/1"
ack w2 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null
check "... and the sandbox runs on the target" test "$(sbx "$M")" = "running 2 w2"

# --- snapshots: retention, and late or lost pause answers (issue 12) --------
# resume_on W SBX GEN: resumes SBX on W and acks its install (gen GEN).
resume_on() {
	go rz POST "/v1/sandboxes/$2/resume" "{\"worker\":\"$1\"}"
	feedfor "$1" install "$2"; local irev; irev=$(upd "$1" install "$2" rev)
	ack "$1" "$irev" "{\"rev\":$irev,\"ok\":true}" >/dev/null; waitgo
	[ "$(sbx "$2")" = "running $3 $1" ]
}
# pause_on W SBX GEN: pauses SBX (on W) and acks with its snapshot.
pause_on() {
	go pz POST "/v1/sandboxes/$2/pause" ''
	feedfor "$1" pause "$2"; local prev; prev=$(upd "$1" pause "$2" rev)
	ack "$1" "$prev" "{\"rev\":$prev,$(snapok "$2" "$3")}" >/dev/null; waitgo
	[ "$(sbx "$2")" = "paused $3 $1" ]
}
go c5 POST /v1/sandboxes '{"worker":"w1"}'
P=
for _ in 1 2 3 4 5; do # past the prunes queued for w1 before it
	feed w1 2
	P=$(python3 -c "import json; u=[u for u in json.load(open('$ST/feed.w1'))['updates'] if u['kind']=='install']; print(u[-1]['sandbox'] if u else '')")
	[ -n "$P" ] && break
done
IREV=$(upd w1 install "$P" rev); ack w1 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo
pause_on w1 "$P" 1 && resume_on w1 "$P" 2 && pause_on w1 "$P" 2 && resume_on w1 "$P" 3 &&
	pause_on w1 "$P" 3
okrc $? "three pauses and resumes of a fresh sandbox on w1"
feedfor w1 prune "$P"
check "each recorded snapshot is followed by a prune for w1: generation 3 keeps [3, 2]" \
	test "$(python3 -c "
import json
u=[u for u in json.load(open('$ST/feed.w1'))['updates'] if u['kind']=='prune' and u['sandbox']=='$P']
print(u[-1]['generation'], u[-1]['keep'])")" = "3 [3, 2]"
check "... and the sandbox names snapshot 3" test "$(sbx "$P" >/dev/null; jfield '["snapshot"]["generation"]')" = 3

# The worker goes down during the pause, after publishing its snapshot:
# the pause fails; when the worker is back, its answer is taken.
resume_on w1 "$P" 4; okrc $? "resumed: running gen 4 on w1"
go p6 POST "/v1/sandboxes/$P/pause" ''
feedfor w1 pause "$P"; PREV=$(upd w1 pause "$P" rev)
dead w1; waitgo
check "w1 went down during the pause: failed 4" test "$(sbx "$P")" = "failed 4 w1"
alive w1
ack w1 "$PREV" "{\"rev\":$PREV,$(snapok "$P" 4)}" >/dev/null
check "its late answer with a complete snapshot: recorded, the sandbox paused at 4" \
	test "$(sbx "$P") $(jfield '["snapshot"]["generation"]')" = "paused 4 w1 4"
go r6 POST "/v1/sandboxes/$P/resume" '{"worker":"w1"}'
feedfor w1 install "$P"; IREV=$(upd w1 install "$P" rev)
check "the resume restores snapshot 4, not 3 (which lacks gen 4's writes)" \
	test "$(upd w1 install "$P" generation) $(upd w1 install "$P" snapshot)" = "5 $P/4"
ack w1 "$IREV" "{\"rev\":$IREV,\"ok\":true}" >/dev/null; waitgo

# An ack that covers the pause without its result (the node-api restarted
# between applying and acknowledging): asked again, the answer is taken.
go p7 POST "/v1/sandboxes/$P/pause" ''
feedfor w1 pause "$P"; PREV=$(upd w1 pause "$P" rev)
ack w1 "$PREV" '{"rev":0,"ok":true}' >/dev/null
feedfor w1 pause "$P"
check "an ack without the pause's result: the pause is asked again (marked again), still pausing" \
	test "$(python3 -c "
import json
u=[u for u in json.load(open('$ST/feed.w1'))['updates'] if u['kind']=='pause' and u['sandbox']=='$P']
print(u[-1]['generation'], u[-1].get('again'), u[-1]['rev'] > $PREV)") $(sbx "$P")" = "5 True True pausing 5 w1"
AREV=$(python3 -c "
import json
print([u for u in json.load(open('$ST/feed.w1'))['updates'] if u['kind']=='pause' and u['sandbox']=='$P'][-1]['rev'])")
ack w1 "$AREV" "{\"rev\":$AREV,$(snapok "$P" 5)}" >/dev/null; waitgo
check "... answered with the snapshot: paused 5, snapshot 5, the caller told 200" \
	test "$(cat "$ST/p7.code") $(sbx "$P") $(jfield '["snapshot"]["generation"]')" = "200 paused 5 w1 5"

# The same after the pause had failed: asked again once the worker acks.
resume_on w1 "$P" 6; okrc $? "resumed: running gen 6 on w1"
go p8 POST "/v1/sandboxes/$P/pause" ''
feedfor w1 pause "$P"
dead w1; waitgo
check "the pause of gen 6 failed with w1 down" test "$(sbx "$P")" = "failed 6 w1"
alive w1; feedfor w1 retire "$P"
ack w1 "${AFTER[w1]}" '{"rev":0,"ok":true}' >/dev/null
feedfor w1 pause "$P"
AREV=$(python3 -c "
import json
u=[u for u in json.load(open('$ST/feed.w1'))['updates'] if u['kind']=='pause' and u['sandbox']=='$P' and u.get('again')]
print(u[-1]['rev'] if u else 0)")
ack w1 "$AREV" "{\"rev\":$AREV,$(snapok "$P" 6)}" >/dev/null
check "a failed pause acknowledged without its result is asked again; the answer makes it paused at 6" \
	test "$AREV $(sbx "$P") $(jfield '["snapshot"]["generation"]')" != "0 paused 6 w1 6" -a \
	"$(sbx "$P") $(jfield '["snapshot"]["generation"]')" = "paused 6 w1 6"
ack w1 "${AFTER[w1]}" '{"rev":0,"ok":true}' >/dev/null
feed w1 1
check "... and asked only once (no second again)" test "$(count w1 pause "$P")" = 0

check "cp log records the forced resume" grep -q "forced resume: retire gen 8 on w1" "$ST/cp.log"
curl -sf "$U/metrics" >"$ST/metrics"
check "metrics count forced resumes since the restart" grep -q '^tether_cp_forced_resumes_total 2$' "$ST/metrics"

tap_done

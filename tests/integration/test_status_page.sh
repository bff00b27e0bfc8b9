#!/bin/bash
# The edge's status page (docs/API.md "Status page") and the metrics it
# sits beside, against a real `tether up` cluster with two workers:
# - login: a wrong API key is refused (401, no cookie), a cross-origin or
#   Origin-less POST is refused (403), the right key gives a session cookie
#   (HttpOnly, SameSite=Strict, not the key) and a redirect to /;
# - GET /status/data: refused without the cookie and with a made-up one,
#   served with it (workers, sandboxes, the migration, the decisions the
#   edge saw); GET / is the login form without a session, the page with;
#   logout ends the session;
# - the page in headless Chromium (a real login through its form): the DOM
#   holds both workers and the migration; a screenshot in WORK;
# - tether logs: merged by time with role prefixes, -n, one role as it
#   is, --follow like tail -F (new lines, a replaced, a truncated and a
#   late file);
# - gauges and durations: tether_cp_sandboxes{state}, the lifecycle
#   durations and tether_edge_decisions_total move after a create and a
#   migrate; tether_edge_streams_open counts an open exec stream.
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-status
T=$WORK/tether
printf '#!/bin/sh\nexec timeout 60 %s "$@"\n' "$ROOT/build/tether" >"$T"
chmod +x "$T"
cluster_up_or_bail "tether up: cluster ready" 2
EDGE=http://127.0.0.1:$((BASE + 1))
KEY=$(cluster_key)
J=$WORK/cookies
# m URL NAME{LABELS}: one sample (0 when absent).
m() { metric "$@"; }

created0=$(m "$CP" 'tether_cp_lifecycle_duration_seconds_count{op="create",result="ok"}')
running0=$(m "$CP" 'tether_cp_sandboxes{state="running"}')
A=$("$T" create --worker w1 2>"$WORK/err") || tap_bail "create on w1" "$(cat "$WORK/err")"
ok "create on w1"
expect "the create's duration is observed when its ack arrives" \
	'[ "$(m "$CP" "tether_cp_lifecycle_duration_seconds_count{op=\"create\",result=\"ok\"}")" = $((created0 + 1)) ]' \
	"$(curl -s "$CP/metrics" | grep lifecycle_duration)"
expect "tether_cp_sandboxes{state=running} is read at scrape time: one more" \
	'[ "$(m "$CP" "tether_cp_sandboxes{state=\"running\"}")" = $((running0 + 1)) ]' \
	"$(curl -s "$CP/metrics" | grep tether_cp_sandboxes)"
expect "and it is a gauge, beside tether_cp_workers{state=up} = 2" \
	'curl -s "$CP/metrics" | grep -qx "# TYPE tether_cp_sandboxes gauge" && [ "$(m "$CP" "tether_cp_workers{state=\"up\"}")" = 2 ]' \
	"$(curl -s "$CP/metrics" | grep -A3 tether_cp_workers)"
# the migrate goes to the cp directly, past the edge, whose cached route
# (from this exec) then names the retired execution
"$T" exec "$A" -- sh -c 'echo before > /workspace/f' >/dev/null 2>&1
code=$(req_status POST "$CP/v1/sandboxes/$A/migrate" "Bearer $KEY" '{"worker":"w2"}')
expect "migrate to w2 (at the cp)" '[ "$code" = 200 ]' "$code $(cat "$TT_BODY")"
expect "the migrate, its pause and its resume are each timed" \
	'for op in migrate pause resume; do [ "$(m "$CP" "tether_cp_lifecycle_duration_seconds_count{op=\"$op\",result=\"ok\"}")" -ge 1 ] || exit 1; done' \
	"$(curl -s "$CP/metrics" | grep lifecycle_duration_seconds_count)"
sum=$(m "$CP" 'tether_cp_lifecycle_duration_seconds_sum{op="migrate",result="ok"}')
expect "the migrate took more than nothing and less than a minute" \
	'python3 -c "import sys; sys.exit(not (0 < float(sys.argv[1]) < 60))" "$sum"' "$sum"
# an operation after the migrate: the edge's cached route is stale, so
# the node's RefreshRoute and the rebuilt attempt's Allow are both seen
refresh0=$(curl -s "$EDGE/metrics" | awk '/^tether_edge_decisions_total\{receiver="node",decision="refresh_route"/ { s += $2 } END { print s + 0 }')
"$T" exec "$A" -- cat /workspace/f >"$WORK/out" 2>&1
refresh1=$(curl -s "$EDGE/metrics" | awk '/^tether_edge_decisions_total\{receiver="node",decision="refresh_route"/ { s += $2 } END { print s + 0 }')
expect "the exec after it reads what the old execution wrote" '[ "$(cat "$WORK/out")" = before ]' "$(cat "$WORK/out")"
expect "the edge counts the admission decisions it saw, by receiver: the RefreshRoute, and Allows" \
	'[ "$refresh1" = $((refresh0 + 1)) ] && [ "$(m "$EDGE" "tether_edge_decisions_total{receiver=\"node\",decision=\"allow\",reason=\"\"}")" -ge 2 ]' \
	"$refresh0 $refresh1 $(curl -s "$EDGE/metrics" | grep decisions)"

# ---- cp: GET /v1/events --------------------------------------------------------------
code=$(req_status GET "$EDGE/v1/events?after=0" "Bearer $KEY")
expect "GET /v1/events (through the edge): the migrate from w1 to w2, with its duration" \
	'[ "$code" = 200 ] && jfield "[\"events\"]" | python3 -c "
import ast, sys
ev = ast.literal_eval(sys.stdin.read())
sys.exit(not any(e[\"op\"] == \"migrate\" and e[\"from\"] == \"w1\" and e[\"to\"] == \"w2\" and e[\"result\"] == \"ok\" and e[\"generation\"] == 2 and e[\"duration_s\"] > 0 for e in ev))"' \
	"$code $(cat "$TT_BODY")"
last=$(jfield '["last"]')
code=$(req_status GET "$EDGE/v1/events?after=$last" "Bearer $KEY")
expect "GET /v1/events?after=LAST: nothing newer" '[ "$code" = 200 ] && [ "$(jfield "[\"events\"]")" = "[]" ]' "$(cat "$TT_BODY")"
code=$(req_status GET "$CP/v1/events?after=0" "")
expect "GET /v1/events without a key: 401" '[ "$code" = 401 ]' "$code"
code=$(req_status GET "$CP/v1/events?after=x" "Bearer $KEY")
expect "GET /v1/events?after=x: 400" '[ "$code" = 400 ]' "$code"

# ---- login ----------------------------------------------------------------------------
# login KEY [ORIGIN]: POST /login as the form does; status printed, the
# cookie jar in $J, headers in $TT_HDRS
login() {
	local o=()
	[ -n "${2-}" ] && o=(-H "Origin: $2")
	rm -f "$J"
	tcurl -o "$TT_BODY" -D "$TT_HDRS" -w '%{http_code}' -c "$J" "${o[@]}" \
		--data-urlencode "key=$1" "$EDGE/login"
}
code=$(login "wrong-$KEY" "$EDGE")
expect "login with a wrong key: 401, the form again, no cookie" \
	'[ "$code" = 401 ] && grep -q "refused" "$TT_BODY" && ! grep -qi "^set-cookie" "$TT_HDRS"' "$code $(cat "$TT_HDRS")"
code=$(login "$KEY" "http://evil.example")
expect "login from another origin: 403, no cookie" '[ "$code" = 403 ] && ! grep -qi "^set-cookie" "$TT_HDRS"' "$code"
code=$(login "$KEY")
expect "login without an Origin: 403" '[ "$code" = 403 ] && ! grep -qi "^set-cookie" "$TT_HDRS"' "$code"
code=$(tcurl -o /dev/null -w '%{http_code}' "$EDGE/login?key=$KEY")
expect "GET /login (state never changes on a GET): 405" '[ "$code" = 405 ]' "$code"
code=$(login "$KEY" "$EDGE")
SC=$(grep -i '^set-cookie:' "$TT_HDRS" | tr -d '\r')
SID=$(sed -n 's/^[Ss]et-[Cc]ookie: tether_session=\([^;]*\);.*/\1/p' <<<"$SC")
expect "login with the key: 303 to /, a session cookie HttpOnly, SameSite=Strict" \
	'[ "$code" = 303 ] && grep -qi "^location: /" "$TT_HDRS" && [[ $SC == *HttpOnly* ]] && [[ $SC == *SameSite=Strict* ]] && [ ${#SID} -ge 40 ]' \
	"$code $(cat "$TT_HDRS")"
expect "the cookie holds a random id, not the API key" \
	'[[ $SC != *"$KEY"* ]] && [[ $SC != *"${KEY:0:12}"* ]]' "$SC"

# ---- the data endpoint ----------------------------------------------------------------------
code=$(tcurl -o "$TT_BODY" -w '%{http_code}' "$EDGE/status/data")
expect "GET /status/data without the cookie: 401, no data" \
	'[ "$code" = 401 ] && ! grep -q "$A" "$TT_BODY"' "$code $(cat "$TT_BODY")"
code=$(tcurl -o "$TT_BODY" -w '%{http_code}' -H "Cookie: tether_session=${SID%?}x" "$EDGE/status/data")
expect "with a made-up session id: 401" '[ "$code" = 401 ]' "$code"
code=$(tcurl -o "$TT_BODY" -w '%{http_code}' -H "Authorization: Bearer $KEY" "$EDGE/status/data")
expect "with the API key instead of a session: 401 (the page takes sessions only)" '[ "$code" = 401 ]' "$code"
code=$(tcurl -o "$TT_BODY" -D "$TT_HDRS" -w '%{http_code}' -b "$J" "$EDGE/status/data")
expect "with the cookie: 200, both workers, the sandbox (generation 2 on w2)" \
	'[ "$code" = 200 ] && [ "$(jfield "[\"workers\"]" | grep -o "'"'"'id'"'"': '"'"'w[12]'"'"'" | wc -l)" = 2 ] &&
	 jfield "[\"sandboxes\"]" | grep -q "'"'"'id'"'"': '"'"'$A'"'"'" &&
	 [ "$(jget "[s for s in d[\"sandboxes\"] if s[\"id\"] == \"$A\"][0][\"generation\"]" <"$TT_BODY")" = 2 ] &&
	 grep -qi "^cache-control: no-store" "$TT_HDRS"' "$code $(head -c 600 "$TT_BODY")"
expect "the data has the migration and the decisions the edge saw" \
	'jget "[e for e in d[\"events\"] if e[\"op\"] == \"migrate\"][0][\"to\"]" <"$TT_BODY" | grep -qx w2 &&
	 jget "[o[\"decision\"] for o in d[\"operations\"]]" <"$TT_BODY" | grep -q refresh_route &&
	 jget "[o[\"decision\"] for o in d[\"operations\"]]" <"$TT_BODY" | grep -q allow' "$(head -c 1500 "$TT_BODY")"
code=$(tcurl -o "$TT_BODY" -w '%{http_code}' "$EDGE/")
expect "GET / without a session: the login form, no data" \
	'[ "$code" = 200 ] && grep -q "action=\"/login\"" "$TT_BODY" && ! grep -q "$A" "$TT_BODY"' "$code"
code=$(tcurl -o "$TT_BODY" -D "$TT_HDRS" -w '%{http_code}' -b "$J" "$EDGE/")
expect "GET / with the session: the page, served with a strict CSP" \
	'[ "$code" = 200 ] && grep -q "id=\"sandboxes\"" "$TT_BODY" && grep -qi "^content-security-policy: default-src .none.; script-src .self." "$TT_HDRS"' \
	"$code $(cat "$TT_HDRS")"
code=$(tcurl -o /dev/null -w '%{http_code}' -X DELETE -b "$J" "$EDGE/")
expect "DELETE /: 405" '[ "$code" = 405 ]' "$code"

# ---- the front door's rules hold for the page's paths ----------------------------------------
P=$ROOT/tests/integration/frontdoor_probe.py
up1=$(python3 "$P" upgrade $((BASE + 1)) / - -)
up2=$(python3 "$P" upgrade $((BASE + 1)) /status/data tether.exec.v1 "Bearer $KEY")
expect "a WebSocket upgrade of / or /status/data is refused before 101" \
	'[ "$up1" != 101 ] && [ "$up2" != 101 ]' "$up1 $up2"
code=$(tcurl -o /dev/null -w '%{http_code}' -H "Cookie: tether_session=$(head -c 9000 /dev/zero | tr '\0' a)" "$EDGE/status/data")
expect "an oversized Cookie header: 431" '[ "$code" = 431 ]' "$code"
code=$(tcurl -o /dev/null -w '%{http_code}' -H "Origin: $EDGE" --data-binary "key=$(head -c 6000 /dev/zero | tr '\0' a)" "$EDGE/login")
expect "a login form over 4 KiB: 413 before its body, no session" '[ "$code" = 413 ]' "$code"
code=$(tcurl -o /dev/null -w '%{http_code}' -H "Origin: $EDGE" -H 'Transfer-Encoding: chunked' --data-binary "key=$KEY" "$EDGE/login")
expect "a chunked login without a length: 411, no session" '[ "$code" = 411 ]' "$code"
for i in $(seq 1 70); do
	tcurl -o /dev/null -H "Origin: $EDGE" --data-urlencode "key=$KEY" "$EDGE/login"
done
sessions=$(m "$EDGE" tether_edge_status_sessions)
code=$(tcurl -o /dev/null -w '%{http_code}' -b "$J" "$EDGE/status/data")
expect "70 more logins: the table holds at most 64 sessions; the least recently used went" \
	'[ "$sessions" = 64 ] && [ "$code" = 401 ]' "sessions=$sessions code=$code"
code=$(login "$KEY" "$EDGE")
expect "log in again" '[ "$code" = 303 ]' "$code"

# ---- the page in headless Chromium --------------------------------------------------------
CHROMIUM=$(command -v chromium || true)
if [ -z "$CHROMIUM" ]; then
	notok "chromium is installed (scripts/deps.sh)" "no chromium on PATH"
else
	out=$(timeout 120 python3 "$ROOT/tests/integration/status_browser.py" "$CHROMIUM" "$EDGE" "$KEY" \
		"$WORK/page" w1 w2 "$A" "migrate $A w1 → w2" --then "$T create --worker w1" 2>"$WORK/browser.err")
	rc=$?
	expect "Chromium: a real login through the form, the page renders both workers and the migration, then a new sandbox without a reload" \
		'[ $rc = 0 ] && echo "$out" | jget "d[\"ok\"], d[\"location\"]" | grep -qx "(True, ./.)"' \
		"rc=$rc $out $(cat "$WORK/browser.err")"
	expect "the DOM holds worker-w1, worker-w2, sandbox-A and the migrate event" \
		'grep -q "id=\"worker-w1\"" "$WORK/page.html" && grep -q "id=\"worker-w2\"" "$WORK/page.html" &&
		 grep -q "id=\"sandbox-$A\"" "$WORK/page.html" && grep -q "class=\"event migrate ok\"" "$WORK/page.html"' \
		"$(grep -o "<tbody>.\{0,300\}" "$WORK/page.html" | head -3)"
	expect "the page's script cannot read the session cookie (HttpOnly)" \
		'echo "$out" | jget "d[\"script_sees_cookie\"]" | grep -qx False' "$out"
	expect "a screenshot of it: $WORK/page.png" \
		'[ "$(head -c 8 "$WORK/page.png" | od -An -tx1 | tr -d " ")" = 89504e470d0a1a0a ] && [ "$(stat -c %s "$WORK/page.png")" -gt 10000 ]' \
		"$(ls -la "$WORK"/page.* 2>&1)"
	[ -n "${STATUS_SHOT:-}" ] && cp "$WORK/page.png" "$STATUS_SHOT"
fi

# ---- a stream open is a gauge at the edge --------------------------------------------------
open0=$(m "$EDGE" 'tether_edge_streams_open{kind="exec"}')
"$T" exec "$A" -- sleep 3 >/dev/null 2>&1 &
EXEC_PID=$!
at_exit 'kill $EXEC_PID 2>/dev/null'
wait_until 25 sh -c "[ \"\$(curl -s $EDGE/metrics | awk '\$1 == \"tether_edge_streams_open{kind=\\\"exec\\\"}\" {print \$2}')\" = $((open0 + 1)) ]"
during=$(m "$EDGE" 'tether_edge_streams_open{kind="exec"}')
node_during=$(m "http://127.0.0.1:$((BASE + 12))" 'tether_node_streams_open{kind="exec"}')
wait "$EXEC_PID"
wait_until 30 sh -c "[ \"\$(curl -s $EDGE/metrics | awk '\$1 == \"tether_edge_streams_open{kind=\\\"exec\\\"}\" {print \$2}')\" = $open0 ]"
after=$(m "$EDGE" 'tether_edge_streams_open{kind="exec"}')
expect "tether_edge_streams_open: one more while an exec streams, back after it (and node-api's on w2)" \
	'[ "$during" = $((open0 + 1)) ] && [ "$after" = "$open0" ] && [ "$node_during" -ge 1 ]' \
	"before=$open0 during=$during after=$after node=$node_during"

# ---- tether logs -----------------------------------------------------------------------------
L="$ROOT/build/tether logs --state $STATE"
# (a copy, so that the counts below hold still)
mkdir -p "$WORK/snap" && cp -r "$STATE/logs" "$WORK/snap/"
"$ROOT/build/tether" logs --state "$WORK/snap" >"$WORK/logs.all" 2>"$WORK/err"
expect "tether logs: every role's lines, each prefixed with its role" \
	'for r in cp edge w1 w2; do grep -q "^$r  *20[0-9][0-9]-" "$WORK/logs.all" || exit 1; done &&
	 [ "$(grep -c "" "$WORK/logs.all")" = "$(cat "$WORK"/snap/logs/*.log | grep -c "")" ]' \
	"$(cat "$WORK/err"; head -3 "$WORK/logs.all")"
expect "each role's lines keep their file's order" \
	'for r in cp edge w1 w2; do cmp -s <(sed -n "s/^$r  *//p" "$WORK/logs.all") "$WORK/snap/logs/$r.log" || exit 1; done' \
	"$(for r in cp edge w1 w2; do diff <(sed -n "s/^$r  *//p" "$WORK/logs.all") "$WORK/snap/logs/$r.log" | head -3; done)"
# the merge itself, on files of known times: log lines, an access record
# (its "ts"), a line without a time (it keeps the one before it)
mkdir -p "$WORK/m/logs"
printf '%s\n' '2026-01-01T00:00:01.000Z a[1] info: one' 'no time here' '2026-01-01T00:00:04.000Z a[1] info: four' >"$WORK/m/logs/a.log"
printf '%s\n' '{"ts":"2026-01-01T00:00:02.000Z","role":"edge","status":200}' '2026-01-01T00:00:03.000Z bb[2] info: three' >"$WORK/m/logs/bb.log"
"$ROOT/build/tether" logs --state "$WORK/m" >"$WORK/m/out"
expect "merged by time (RFC 3339 starts, access records' ts), each line prefixed with its role" \
	'[ "$(cat "$WORK/m/out")" = "$(printf "%s\n" "a  2026-01-01T00:00:01.000Z a[1] info: one" "a  no time here" \
	   "bb {\"ts\":\"2026-01-01T00:00:02.000Z\",\"role\":\"edge\",\"status\":200}" "bb 2026-01-01T00:00:03.000Z bb[2] info: three" \
	   "a  2026-01-01T00:00:04.000Z a[1] info: four")" ]' "$(cat "$WORK/m/out")"
"$ROOT/build/tether" logs --state "$WORK/snap" -n 5 edge >"$WORK/logs.edge"
expect "tether logs -n 5 edge: the edge's last 5 lines as they are" \
	'cmp -s "$WORK/logs.edge" <(tail -n 5 "$WORK/snap/logs/edge.log")' "$(diff "$WORK/logs.edge" <(tail -n 5 "$WORK/snap/logs/edge.log"))"
rc=0; $L nosuchrole >/dev/null 2>"$WORK/err" || rc=$?
expect "tether logs of a role without a log: exit 1, one line" '[ $rc = 1 ] && [ "$(grep -c "" "$WORK/err")" = 1 ]' "$rc $(cat "$WORK/err")"
# --follow: the edge's next access line, and tail -F's cases on files of
# our own (a file replaced, one truncated, one that appears later)
printf '2026-01-01T00:00:00.000Z fake[1] info: old line\n' >"$STATE/logs/fake.log"
$L -f -n 0 edge fake later >"$WORK/logs.follow" 2>&1 &
FOLLOW_PID=$!
at_exit 'kill $FOLLOW_PID 2>/dev/null'
sleep 0.5
tcurl -o /dev/null -H 'X-Request-Id: logs-follow-1' "$EDGE/v1/sandboxes/$A" -H "Authorization: Bearer $KEY"
wait_until 50 grep -q "logs-follow-1" "$WORK/logs.follow"
echo '2026-01-01T00:00:01.000Z fake[1] info: appended' >>"$STATE/logs/fake.log"
wait_until 50 grep -q "appended" "$WORK/logs.follow"
printf '2026-01-01T00:00:02.000Z fake[2] info: replaced\n' >"$STATE/logs/fake.new" && mv "$STATE/logs/fake.new" "$STATE/logs/fake.log"
wait_until 50 grep -q "replaced" "$WORK/logs.follow"
: >"$STATE/logs/fake.log"; sleep 0.5
echo '2026-01-01T00:00:03.000Z fake[2] info: after truncation' >>"$STATE/logs/fake.log"
wait_until 50 grep -q "after truncation" "$WORK/logs.follow"
echo '2026-01-01T00:00:04.000Z later[3] info: a late role' >"$STATE/logs/later.log"
wait_until 50 grep -q "a late role" "$WORK/logs.follow"
kill $FOLLOW_PID 2>/dev/null; wait $FOLLOW_PID 2>/dev/null
expect "tether logs -f: new lines of each role, prefixed, as they are written (not the old ones with -n 0)" \
	'grep -q "^edge .*logs-follow-1" "$WORK/logs.follow" && grep -q "^fake  *2026-01-01T00:00:01.000Z fake.1. info: appended" "$WORK/logs.follow" &&
	 ! grep -q "old line" "$WORK/logs.follow"' "$(cat "$WORK/logs.follow")"
expect "and like tail -F: a replaced file, a truncated one, one that appears later" \
	'grep -q "^fake .*replaced" "$WORK/logs.follow" && grep -q "^fake .*after truncation" "$WORK/logs.follow" &&
	 grep -q "^later .*a late role" "$WORK/logs.follow"' "$(cat "$WORK/logs.follow")"
rm -f "$STATE/logs/fake.log" "$STATE/logs/later.log"
roles=$(bash -c '. "$1"; COMP_WORDS=(tether logs --state "$2" ""); COMP_CWORD=4; _tether; printf "%s\n" "${COMPREPLY[@]}" | grep -v "^-" | sort | tr "\n" " "' \
	_ "$ROOT/contrib/bash-completion/tether" "$STATE")
expect "bash completion of tether logs: the roles of --state DIR" '[ "$roles" = "cp edge w1 w2 " ]' "$roles"

# ---- logout --------------------------------------------------------------------------------
code=$(tcurl -o /dev/null -D "$TT_HDRS" -w '%{http_code}' -X POST -b "$J" -H "Origin: http://evil.example" "$EDGE/logout")
code2=$(tcurl -o /dev/null -w '%{http_code}' -b "$J" "$EDGE/status/data")
expect "a cross-origin logout is refused (403) and the session lives on" '[ "$code" = 403 ] && [ "$code2" = 200 ]' "$code $code2"
code=$(tcurl -o /dev/null -D "$TT_HDRS" -w '%{http_code}' -X POST -b "$J" -H "Origin: $EDGE" "$EDGE/logout")
code2=$(tcurl -o /dev/null -w '%{http_code}' -b "$J" "$EDGE/status/data")
expect "logout: 303, the cookie cleared, the session gone server-side (the old cookie is refused)" \
	'[ "$code" = 303 ] && grep -qi "^set-cookie: tether_session=;.*Max-Age=0" "$TT_HDRS" && [ "$code2" = 401 ]' \
	"$code $code2 $(cat "$TT_HDRS")"
expect "the edge logged the page's requests (login refusals included)" \
	'grep "^{" "$STATE/logs/edge.log" | grep "\"path\":\"/login\"" | grep -q "\"status\":401" &&
	 grep "^{" "$STATE/logs/edge.log" | grep -q "\"path\":\"/status/data\",\"status\":200"' \
	"$(grep "^{" "$STATE/logs/edge.log" | grep -E "login|status/data" | head -3)"

tap_done

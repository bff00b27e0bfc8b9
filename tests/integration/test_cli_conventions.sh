#!/bin/bash
# The CLI conventions of docs/CLI.md against a real `tether up` cluster:
# exec's exit statuses (125 for tether's own failures, 126/127 as sh, the
# command's own), the stdin warning, rm of several ids, unique id
# prefixes, --version, ls --state/-q, cap inspect's exit status with the
# cluster's keys (tether keys), cp - both ways, cp -r round trips, and the
# edge's access log line with its request id. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-conv
T=$WORK/tether
printf '#!/bin/sh\nexec timeout 60 %s "$@"\n' "$ROOT/build/tether" >"$T"
chmod +x "$T"
O=$WORK/out E=$WORK/err
# run CMD...: CMD with stdout in $O, stderr in $E, status in $rc.
run() { rc=0; "$@" >"$O" 2>"$E" </dev/null || rc=$?; }
lines() { grep -c '' "$1"; }

cluster_up_or_bail "tether up: cluster ready" 2
EDGE=http://127.0.0.1:$((BASE + 1))
A=$("$T" create 2>"$E") && B=$("$T" create 2>>"$E") && C=$("$T" create 2>>"$E") ||
	tap_bail "three sandboxes" "$(cat "$E")"
ok "three sandboxes"

# ---- exec exit statuses -----------------------------------------------------------
run "$T" exec "$A" -- sh -c 'echo out; exit 7'
expect "exec: the command's own status (7) and output" '[ $rc = 7 ] && [ "$(cat "$O")" = out ]' "rc=$rc $(cat "$E")"
run "$T" exec "$A" -- no-such-command-here
expect "exec: a command not found exits 127" '[ $rc = 127 ] && grep -q "No such file" "$E"' "rc=$rc $(cat "$E")"
run "$T" exec "$A" -- /etc/passwd
expect "exec: a file that is not executable exits 126" '[ $rc = 126 ]' "rc=$rc $(cat "$E")"
run "$T" exec "$A" -- /tmp
expect "exec: a directory exits 126" '[ $rc = 126 ]' "rc=$rc $(cat "$E")"
run "$T" exec "$A" -- sh -c 'exit 125'
expect "exec: a command's own 125 passes through" '[ $rc = 125 ] && [ ! -s "$E" ]' "rc=$rc $(cat "$E")"
run "$T" exec --bogus "$A" -- true
expect "exec: bad usage exits 125 with one line" \
	'[ $rc = 125 ] && [ "$(lines "$E")" = 1 ] && grep -q "^tether: usage: tether exec" "$E"' "rc=$rc $(cat "$E")"
run "$T" exec sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa -- true
expect "exec: an unknown sandbox exits 125, one 'tether: exec ID:' line" \
	'[ $rc = 125 ] && [ "$(lines "$E")" = 1 ] && grep -q "^tether: exec sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa: " "$E"' "rc=$rc $(cat "$E")"
run env TETHER_URL=http://127.0.0.1:1 "$T" exec "$A" -- true
expect "exec: an edge that cannot be reached exits 125" \
	'[ $rc = 125 ] && [ "$(lines "$E")" = 1 ] && grep -q "^tether: " "$E"' "rc=$rc $(cat "$E")"

# ---- stdin ------------------------------------------------------------------------
# (the sleep: the bytes are in the pipe before tether looks)
rc=0; out=$(echo piped | { sleep 0.3; "$T" exec "$A" -- sh -c 'cat; echo end'; } 2>"$E") || rc=$?
expect "exec without --stdin: piped input is not read, one warning line" \
	'[ $rc = 0 ] && [ "$out" = end ] && [ "$(lines "$E")" = 1 ] && grep -q "stdin is not forwarded" "$E"' \
	"rc=$rc out=$out $(cat "$E")"
echo data >"$WORK/in"
rc=0; out=$("$T" exec "$A" -- sh -c 'cat; echo end' <"$WORK/in" 2>"$E") || rc=$?
expect "exec without --stdin: a file on stdin, the same warning" \
	'[ $rc = 0 ] && [ "$out" = end ] && grep -q "stdin is not forwarded" "$E"' "rc=$rc out=$out $(cat "$E")"
rc=0; out=$( (sleep 2 | "$T" exec "$A" -- echo quiet) 2>"$E") || rc=$?
expect "exec without --stdin: an idle pipe (nothing waiting) gets no warning" \
	'[ $rc = 0 ] && [ "$out" = quiet ] && [ ! -s "$E" ]' "rc=$rc out=$out $(cat "$E")"
rc=0; out=$(echo piped | "$T" exec -i "$A" -- cat 2>"$E") || rc=$?
expect "exec -i forwards it, no warning" '[ $rc = 0 ] && [ "$out" = piped ] && [ ! -s "$E" ]' "rc=$rc out=$out $(cat "$E")"
run "$T" exec "$A" -- true
expect "exec with stdin from /dev/null: no warning" '[ $rc = 0 ] && [ ! -s "$E" ]' "$(cat "$E")"

# ---- --version, ls ------------------------------------------------------------------
run "$T" --version
expect "--version prints 'tether X.Y.Z'" '[ $rc = 0 ] && grep -qE "^tether [0-9]+\.[0-9]+\.[0-9]+$" "$O"' "$(cat "$O" "$E")"
run "$T" ls -q
expect "ls -q: the ids only" \
	'[ $rc = 0 ] && [ "$(lines "$O")" = 3 ] && grep -qx "$A" "$O" && grep -qx "$B" "$O" && grep -qx "$C" "$O"' "$(cat "$O" "$E")"
run "$T" pause "$C"
expect "pause C" '[ $rc = 0 ]' "$(cat "$E")"
run "$T" ls --state paused -q
expect "ls --state paused -q: C alone" '[ $rc = 0 ] && [ "$(cat "$O")" = "$C" ]' "$(cat "$O" "$E")"
run "$T" ls --state running
expect "ls --state running: a table of A and B" \
	'[ $rc = 0 ] && [ "$(lines "$O")" = 3 ] && head -1 "$O" | grep -q "^ID " && ! grep -q "$C" "$O"' "$(cat "$O" "$E")"
run "$T" ls --state sleeping
expect "ls --state with an unknown state: exit 1, one line" '[ $rc = 1 ] && [ "$(lines "$E")" = 1 ]' "$(cat "$E")"

# ---- id prefixes --------------------------------------------------------------------
# unique: the shortest prefix of A's base32 part no other id shares
uniq_prefix() {
	local id=$1 i p
	for ((i = 5; i <= 30; i++)); do
		p=${id:4:i-4}
		[ "$(printf '%s\n' "$A" "$B" "$C" | grep -c "^sbx_$p")" = 1 ] && { echo "$p"; return; }
	done
}
PA=$(uniq_prefix "$A")
run "$T" info "$PA" --json
expect "info with a unique prefix without sbx_ ($PA)" '[ $rc = 0 ] && [ "$(jfield "[\"id\"]" "$O")" = "$A" ]' "$(cat "$O" "$E")"
run "$T" exec "sbx_$PA" -- echo via-prefix
expect "exec with a unique prefix with sbx_" '[ $rc = 0 ] && [ "$(cat "$O")" = via-prefix ]' "$(cat "$E")"
run "$T" info sbx_
expect "an ambiguous prefix: exit 1, one line naming two matches" \
	'[ $rc = 1 ] && [ "$(lines "$E")" = 1 ] && grep -q "ambiguous" "$E" && [ "$(grep -o "sbx_[a-z2-7]\{26\}" "$E" | wc -l)" = 2 ]' "$(cat "$E")"
run "$T" exec sbx_ -- true
expect "exec with an ambiguous prefix exits 125" '[ $rc = 125 ] && grep -q ambiguous "$E"' "rc=$rc $(cat "$E")"
# a prefix nobody has: one letter after sbx_ that starts no id
for l in a b c d e f g h i j k l m n o p q r s t u v w x y z 2 3 4 5 6 7; do
	printf '%s\n' "$A" "$B" "$C" | grep -q "^sbx_$l" || { NONE=$l; break; }
done
run "$T" info "$NONE"
expect "an unknown prefix: exit 1, 'no sandbox matches'" '[ $rc = 1 ] && grep -q "no sandbox matches" "$E"' "$(cat "$E")"
run "$T" info "bad/id"
expect "a malformed id: exit 1, one line" '[ $rc = 1 ] && [ "$(lines "$E")" = 1 ]' "$(cat "$E")"

# ---- keys and cap inspect ---------------------------------------------------------
run "$T" keys
KEYS=$(cat "$O")
expect "keys prints the cluster's k4.public key" '[ $rc = 0 ] && [[ $KEYS == k4.public.* ]] && [ "$(lines "$O")" = 1 ]' "$(cat "$O" "$E")"
run "$T" keys --json
expect "keys --json has kid and validity" \
	'[ "$(jfield "[\"keys\"][0][\"public\"]" "$O")" = "$KEYS" ] && jfield "[\"keys\"][0][\"kid\"]" "$O" | grep -q "^k4.pid."' "$(cat "$O" "$E")"
TOK=$("$T" cap "$PA" | jget 'd["token"]')
run "$T" cap inspect "$TOK" --key "$KEYS"
expect "a fresh capability verifies with the key from tether keys" \
	'[ $rc = 0 ] && grep -q "^signature: valid" "$E" && grep -q "$A" "$O"' "rc=$rc $(cat "$E")"
if build_mint "$WORK/mint"; then
	OLD=$("$WORK/mint" "$STATE/cp/signer.key" 1000)
	run "$T" cap inspect "$OLD" --key "$KEYS"
	expect "cap inspect of an expired cluster token: exit 1, claims printed, EXPIRED" \
		'[ $rc = 1 ] && grep -q "EXPIRED" "$E" && grep -q "\"gen\": 7" "$O"' "rc=$rc $(cat "$E")"
else
	notok "minting helper builds" "$(cat "$WORK/mint.err")"
fi
run "$T" cap inspect "${TOK%?}A" --key "$KEYS"
run2=$rc
run "$T" cap inspect "${TOK%?}B" --key "$KEYS"
expect "cap inspect of a changed token: exit 1" '[ $run2 = 1 ] || [ $rc = 1 ]' "$(cat "$E")"

# ---- cp - -------------------------------------------------------------------------
head -c 300000 /dev/urandom >"$WORK/blob"
rc=0; "$T" cp - "$A:/tmp/blob" <"$WORK/blob" 2>"$E" || rc=$?
expect "cp - ID:/f from a file on stdin" '[ $rc = 0 ]' "$(cat "$E")"
rc=0; cat "$WORK/blob" | "$T" cp - "$PA:/tmp/blob2" 2>"$E" || rc=$?
expect "cp - ID:/f from a pipe (a prefix as the id)" '[ $rc = 0 ]' "$(cat "$E")"
rc=0; "$T" cp "$A:/tmp/blob2" - >"$WORK/back" 2>"$E" || rc=$?
expect "cp ID:/f - writes the file to stdout, byte for byte" \
	'[ $rc = 0 ] && cmp -s "$WORK/blob" "$WORK/back" && [ ! -e ./- ]' "$(cat "$E")"
rc=0; "$T" cp "$A:/tmp/nope" - >"$WORK/back" 2>"$E" || rc=$?
expect "cp of a missing file to stdout: exit 1, one line" '[ $rc = 1 ] && [ "$(lines "$E")" = 1 ]' "$(cat "$E")"

# ---- cp -r ------------------------------------------------------------------------
D=$WORK/tree
mkdir -p "$D/sub/deeper" "$D/empty"
head -c 200000 /dev/urandom >"$D/bin1"
head -c 70000 /dev/urandom >"$D/sub/deeper/bin2"
printf 'text\n' >"$D/sub/a.txt"
printf '\000\001\377' >"$D/sub/tiny"
chmod 0751 "$D/sub/deeper/bin2"
ln -s a.txt "$D/sub/link"
run "$T" cp -r "$D" "$A:/workspace"
expect "cp -r DIR ID:/workspace" '[ $rc = 0 ]' "$(cat "$E")"
run "$T" exec "$A" -- sh -c 'cd /workspace/tree && find . | sort && cat sub/link && stat -c %a sub/deeper/bin2'
expect "the tree is in the sandbox under its name, modes and links kept" \
	'grep -qx "./sub/deeper/bin2" "$O" && grep -qx "./empty" "$O" && grep -qx text "$O" && grep -qx 751 "$O"' "$(cat "$O" "$E")"
run "$T" cp -r "$A:/workspace/tree" "$WORK/back1"
expect "cp -r ID:/dir LOCAL (LOCAL made)" '[ $rc = 0 ]' "$(cat "$E")"
expect "the round trip is identical (diff -r, binary files included)" \
	'diff -r "$D" "$WORK/back1" >/dev/null && [ -L "$WORK/back1/sub/link" ] && [ -d "$WORK/back1/empty" ]' \
	"$(diff -r "$D" "$WORK/back1" 2>&1)"
mkdir "$WORK/into"
run "$T" cp -r "$A:/workspace/tree/" "$WORK/into"
expect "cp -r into an existing directory lands in DIR/NAME" 'cmp -s "$D/bin1" "$WORK/into/tree/bin1"' "$(cat "$E"; ls -R "$WORK/into")"
run "$T" cp -r "$A:/no/such/dir" "$WORK/back2"
expect "cp -r of a missing directory: exit 1" '[ $rc = 1 ] && grep -q "tar in the sandbox" "$E"' "rc=$rc $(cat "$E")"
run "$T" cp "$D" "$A:/tmp/x"
expect "cp of a directory without -r: exit 1, says to use -r" '[ $rc = 1 ] && grep -q -- "-r" "$E"' "$(cat "$E")"

# ---- progress on a terminal (script(1) gives the CLI one) ----------------------------
head -c $((96 << 20)) /dev/urandom >"$WORK/big"
# tty CMD: CMD on a pseudo-terminal; its output (stdout and stderr) in $O,
# each rewrite of the progress line on a line of its own
tty() {
	rc=0
	script -qec "$*" /dev/null >"$O.raw" 2>&1 </dev/null || rc=$?
	tr '\r' '\n' <"$O.raw" | sed 's/\x1b\[K//g' >"$O"
}
tty "$T" cp "$WORK/big" "$A:/tmp/big"
expect "cp on a terminal: a progress line with bytes, rate and ETA" \
	'[ $rc = 0 ] && grep -aqE "upload [0-9.]+ [KMG]?i?B / 96.0 MiB, [0-9.]+ [KMG]?i?B/s, ETA [0-9]+ s" "$O"' \
	"rc=$rc $(tail -3 "$O")"
run "$T" cp "$WORK/big" "$A:/tmp/big2"
expect "cp not on a terminal: quiet" '[ $rc = 0 ] && [ ! -s "$E" ]' "$(cat "$E")"
tty "$T" cp -q "$WORK/big" "$A:/tmp/big3"
expect "cp -q on a terminal: quiet" '[ $rc = 0 ] && [ ! -s "$O" ]' "$(tr '\r' '\n' <"$O" | tail -3)"
W=$("$T" info "$A" --json | jget 'd["worker"]')
[ "$W" = w1 ] && TO=w2 || TO=w1
tty "$T" migrate "$A" --worker "$TO"
expect "migrate on a terminal: a progress line, then the result" \
	'[ $rc = 0 ] && grep -aqE "migrate[: ]" "$O" && grep -aq "^migrated $A" "$O"' \
	"rc=$rc $(tail -3 "$O")"
rm -f "$WORK/big"

# ---- the edge's access log ----------------------------------------------------------
ELOG=$STATE/logs/edge.log
# access RID: the edge's access-log records with that request id, one
# JSON object a line (python's repr), after checking each is a whole line
access() {
	python3 - "$ELOG" "$1" <<'PY'
import json, re, sys
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("{"):
        d = json.loads(line)
        if d.get("rid") == sys.argv[2]:
            print(json.dumps(d, sort_keys=True))
PY
}
code=$(tcurl -o "$TT_BODY" -D "$TT_HDRS" -w '%{http_code}' -X POST "$EDGE/v1/sandboxes/$A/exec?x=secret" \
	-H "Authorization: Bearer $(cluster_key)" -H 'X-Request-Id: conv-test.rid:1' \
	-H 'Content-Type: application/json' --data-binary '{"cmd":["echo","logged"]}')
wait_until 30 sh -c "grep -q 'conv-test.rid:1' '$ELOG'"
rec=$(access conv-test.rid:1)
expect "the edge answers with the caller's X-Request-Id" \
	'[ "$code" = 200 ] && grep -qi "^x-request-id: conv-test.rid:1" "$TT_HDRS"' "$code $(cat "$TT_HDRS")"
expect "one access line for it: method, path without the query, sandbox, status, generation, duration, bytes" \
	'[ "$(echo "$rec" | grep -c .)" = 1 ] && echo "$rec" | jget "d[\"method\"], d[\"path\"], d[\"sandbox\"], d[\"status\"], d[\"role\"]" |
	 grep -qx "(.POST., ./v1/sandboxes/$A/exec., .$A., 200, .edge.)" &&
	 echo "$rec" | jget "d[\"duration_ms\"] > 0 and d[\"bytes_in\"] == 25 and d[\"bytes_out\"] > 20 and d[\"generation\"] >= 1" | grep -qx True &&
	 ! echo "$rec" | grep -q secret' "$rec"
# naccess RID: node-api's access records with that request id (the
# workers' logs), one JSON object a line
naccess() {
	python3 - "$1" "$STATE"/logs/w*.log <<'PY'
import json, sys
for f in sys.argv[2:]:
    for line in open(f, errors="replace"):
        if line.startswith("{"):
            d = json.loads(line)
            if d.get("rid") == sys.argv[1] and d.get("role") == "node":
                print(json.dumps(d, sort_keys=True))
PY
}
# decisions: "STATUS DECISION" of each record on stdin, sorted, on one line
decisions() {
	python3 -c 'import json, sys
print(" ".join("%d %s" % t for t in sorted((d["status"], d.get("decision", "-")) for d in map(json.loads, sys.stdin))))'
}
nrec=$(naccess conv-test.rid:1)
expect "node-api logs the same request id for the operation it served: route, sandbox, status" \
	'[ "$(echo "$nrec" | grep -c .)" = 1 ] && echo "$nrec" | jget "d[\"route\"], d[\"sandbox\"], d[\"status\"], d[\"duration_ms\"] > 0" | grep -qx "(.exec., .$A., 200, True)"' \
	"$nrec; edge: $rec"
expect "its ts is RFC 3339 with a date" \
	'echo "$rec" | jget "d[\"ts\"]" | grep -qE "^20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]\.[0-9]{3}Z$"' "$rec"
code=$(tcurl -o "$TT_BODY" -D "$TT_HDRS" -w '%{http_code}' "$EDGE/v1/sandboxes/$A" \
	-H "Authorization: Bearer $(cluster_key)" -H 'X-Request-Id: bad id with spaces')
GEN_RID=$(sed -n 's/^[Xx]-[Rr]equest-[Ii]d: *\([^\r]*\).*/\1/p' "$TT_HDRS")
wait_until 30 sh -c "grep -q '$GEN_RID' '$ELOG'"
expect "a malformed X-Request-Id is replaced by a generated one, logged with the lifecycle call" \
	'[[ $GEN_RID =~ ^req_[a-z2-7]{26}$ ]] && access "$GEN_RID" | jget "d[\"path\"], d[\"status\"]" | grep -qx "(./v1/sandboxes/$A., 200)"' \
	"$GEN_RID $(cat "$TT_HDRS")"
code=$(tcurl -o "$TT_BODY" -w '%{http_code}' "$EDGE/v1/sandboxes/$A/files?path=/tmp/x" -H 'X-Request-Id: conv-unauth')
wait_until 30 sh -c "grep -q 'conv-unauth' '$ELOG'"
expect "a request refused at the edge is logged too (401)" \
	'[ "$code" = 401 ] && access conv-unauth | jget "d[\"status\"]" | grep -qx 401' "$code $(access conv-unauth)"
"$T" exec "$A" -- true >/dev/null 2>&1
wait_until 30 sh -c "grep -q '/exec/ws' '$ELOG'"
rec=$(grep '/exec/ws' "$ELOG" | tail -n 1)
expect "an exec stream is logged when it ends: result exit, generation" \
	'echo "$rec" | jget "d[\"result\"], d[\"status\"], d[\"generation\"] >= 1, d[\"rid\"][:4]" | grep -qx "(.exit., 101, True, .req_.)"' "$rec"
expect "every other edge log line starts with an RFC 3339 time with a date" \
	'! grep -v "^{" "$ELOG" | grep -qvE "^20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-9:.]{12}Z edge\[[0-9]+\] "' \
	"$(grep -v "^{" "$ELOG" | head -3)"

# a RefreshRoute the edge repairs: its cached capability names A's
# execution, which a pause + resume at the cp (past the edge) retires
"$T" exec "$A" -- true >/dev/null 2>&1
for step in pause resume; do
	curl -s -m 60 -o /dev/null -X POST -H "Authorization: Bearer $(cluster_key)" \
		-H 'Content-Type: application/json' -d '{}' "$CP/v1/sandboxes/$A/$step"
done
code=$(tcurl -o "$TT_BODY" -w '%{http_code}' -X POST "$EDGE/v1/sandboxes/$A/exec" \
	-H "Authorization: Bearer $(cluster_key)" -H 'X-Request-Id: conv-refresh' \
	-H 'Content-Type: application/json' --data-binary '{"cmd":["true"]}')
wait_until 30 sh -c "grep -q 'conv-refresh' '$ELOG'"
rec=$(access conv-refresh)
expect "a repaired RefreshRoute: logged with the node's decision and reason, rebuilt, status 200" \
	'[ "$code" = 200 ] && echo "$rec" | jget "d[\"status\"], d[\"decision\"], d[\"rebuilt\"], len(d[\"reason\"]) > 0" | grep -qx "(200, .refresh_route., True, True)"' \
	"$code $rec $(cat "$TT_BODY")"
nrec=$(naccess conv-refresh)
expect "... and node-api logged both attempts under its request id: the refusal (409 refresh_route) and the rebuilt one (200)" \
	'[ "$(echo "$nrec" | decisions)" = "200 - 409 refresh_route" ]' "$nrec"

# ---- metrics: every name in the one table and in docs/METRICS.md, HELP + TYPE ----
used=$(grep -rhoE 'metrics_(inc|add|observe_us|gauge_set|gauge_add)\("tether_[a-z_]+"|"tether_[a-z_]+_total"' "$ROOT/src" "$ROOT/lib" |
	grep -oE 'tether_[a-z_]+' | sort -u)
table=$(sed -n '/^} metrics_docs\[\] = {/,/^};/p' "$ROOT/lib/metrics.c" | grep -oE '"tether_[a-z_]+"' | tr -d '"' | sort -u)
missing=$(comm -23 <(echo "$used") <(echo "$table"))
expect "every metric name the code uses is in lib/metrics.c's table" '[ -n "$used" ] && [ -z "$missing" ]' "$missing"
undoc=$(for m in $table; do grep -q "\`$m\`" "$ROOT/docs/METRICS.md" || echo "$m"; done)
expect "and in docs/METRICS.md" '[ -z "$undoc" ]' "$undoc"
expect "no metric name holds another unit than its suffix says (no _us)" '! echo "$used" | grep -q "_us$"' "$used"
for port in 0 1 11; do
	curl -s -m 10 "http://127.0.0.1:$((BASE + port))/metrics" >"$WORK/m.$port"
done
bad=$(for port in 0 1 11; do
	awk -v p="$port" '/^# HELP /{h[$3]=1} /^# TYPE /{t[$3]=1} /^[a-z]/{n=$1; sub(/[{ ].*/,"",n);
		b=n; sub(/_(bucket|sum|count)$/,"",b); if (!(n in t) && !(b in t)) print p": "n" has no TYPE"; if (!(n in h) && !(b in h)) print p": "n" has no HELP"}
		/^# TYPE /{if ($4 != "counter" && $4 != "histogram" && $4 != "gauge") print p": "$3" bad type "$4}' "$WORK/m.$port"
done | sort -u)
expect "cp, edge and node serve HELP and TYPE for every metric" \
	'[ -z "$bad" ] && grep -q "^# HELP tether_edge_requests_total " "$WORK/m.1" && grep -q "^# TYPE tether_node_request_duration_seconds histogram" "$WORK/m.11"' \
	"$bad $(head -5 "$WORK/m.11")"

# ---- bash completion (contrib/bash-completion/tether) ---------------------------------
# complete WORD...: COMPREPLY for the command line WORD... (the last one
# being completed), sorted, one a line; $T stands for tether
complete_line() {
	bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _tether; printf "%s\n" "${COMPREPLY[@]}" | sort' \
		_ "$ROOT/contrib/bash-completion/tether" "$T" "$@"
}
expect "completion: verbs" '[ "$(complete_line mi)" = migrate ] && [ "$(complete_line p)" = pause ]' "$(complete_line p)"
expect "completion: a sandbox id from its start" '[ "$(complete_line info "sbx_$PA")" = "$A" ]' "$(complete_line info "sbx_$PA")"
expect "completion: ls --state" '[ "$(complete_line ls --state pa | tr "\n" " ")" = "paused pausing " ]' "$(complete_line ls --state pa)"
expect "completion: workers after --worker" '[ "$(complete_line migrate "$A" --worker w | tr "\n" " ")" = "w1 w2 " ]' "$(complete_line migrate "$A" --worker w)"
expect "completion: nothing of ours after exec's --" '[ -z "$(complete_line exec "$A" -- s)" ]' "$(complete_line exec "$A" -- s)"

# ---- rm of several ids --------------------------------------------------------------
run "$T" rm sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa "$B" "$NONE" "$C"
expect "rm of several ids: each removed id printed, going on past failures, exit 1" \
	'[ $rc = 1 ] && [ "$(cat "$O")" = "$(printf "%s\n%s" "$B" "$C")" ] && [ "$(lines "$E")" = 2 ]' \
	"rc=$rc out=$(cat "$O") err=$(cat "$E")"
run "$T" ls -q
expect "only A is left" '[ "$(cat "$O")" = "$A" ]' "$(cat "$O" "$E")"
run "$T" rm "$PA"
expect "rm by prefix: exit 0, prints the whole id" '[ $rc = 0 ] && [ "$(cat "$O")" = "$A" ]' "$(cat "$E")"

tap_done

#!/bin/bash
# node-api over HTTP against a real sbx-manager (spawned by the node):
# refusals before anything is forwarded, bad ids, malformed requests,
# oversized bodies, and that the daemon survives all of them. Needs the
# manager role in build/tetherd; prints a SKIP line otherwise.
# TETHERD=path overrides the binary (e.g. a build with a stand-in manager).
set -u
. "$(dirname "$0")/lib.sh"
workdir tether-node
bin=$TETHERD
port=$(port_base 1)
url=http://127.0.0.1:$port
dir=$WORK
sbx=sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa
node_pid=
at_exit '[ -n "$node_pid" ] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null'

# req ARGS...: curl; sets code and body.
req() {
	body=$(curl -s -o - -w '\n%{http_code}' "$@")
	code=${body##*$'\n'}
	body=${body%$'\n'*}
}

if ! "$bin" manager --help >/dev/null 2>&1 && "$bin" manager --help 2>&1 | grep -q "not part of this build"; then
	skip "node-api" "manager role not built yet"
	tap_done; exit 0
fi
echo "tok-$RANDOM" >"$dir/node.token"
"$bin" node --id w1 --listen 127.0.0.1:$port --cp http://127.0.0.1:1 \
	--node-token-file "$dir/node.token" --state "$dir/w1" 2>"$dir/node.log" &
node_pid=$!
wait_until 100 curl -s -o /dev/null "$url/healthz"

req "$url/healthz"
check "healthz answers" [ "$code" = 200 ]
req -X POST "$url/v1/sandboxes/$sbx/exec" -d '{"cmd":["true"]}'
check "no capability: 403 deny malformed" \
	[ "$code" = 403 -a "$(jq -r .reason <<<"$body")" = malformed -a "$(jq -r .decision <<<"$body")" = deny ]
req -X POST "$url/v1/sandboxes/$sbx/exec" -H 'Authorization: Bearer x' -d '{"cmd":["true"]}'
check "wrong scheme: 403 malformed" [ "$code" = 403 -a "$(jq -r .reason <<<"$body")" = malformed ]
req -X POST "$url/v1/sandboxes/$sbx/exec" -H 'Authorization: Capability v4.public.garbage' -d '{"cmd":["true"]}'
check "garbled capability: 403 deny from admission" \
	[ "$code" = 403 -a "$(jq -r .decision <<<"$body")" = deny -a "$(jq -r .sandbox <<<"$body")" = "$sbx" ]
req "$url/v1/sandboxes/$sbx/files?path=/etc/passwd" -H 'Authorization: Capability v4.public.garbage'
check "garbled capability on a file read: 403" [ "$code" = 403 ]
req -X POST "$url/v1/sandboxes/sbx_NOT-AN-ID/exec" -H 'Authorization: Capability x' -d '{}'
check "bad sandbox id: 404" [ "$code" = 404 -a "$(jq -r .error <<<"$body")" = not_found ]
req "$url/v1/nothing"
check "unknown path: 404" [ "$code" = 404 ]
head -c 1100000 /dev/zero | tr '\0' a >"$dir/big"
req -X POST "$url/v1/sandboxes/$sbx/exec" -H 'Expect:' -H 'Authorization: Capability x' --data-binary @"$dir/big"
check "oversized exec body: 413" [ "$code" = 413 ]
req -X POST "$url/v1/sandboxes/$sbx/exec" -H 'Authorization: Capability x' -H 'Transfer-Encoding: chunked' -H 'Expect:' --data-binary @"$dir/big"
check "oversized chunked body: 413 or closed" [ "$code" = 413 -o "$code" = 000 ]
req -X POST "$url/v1/sandboxes/$sbx/exec" -H 'Authorization: Capability x' -d '{"cmd":[1]}'
check "invalid exec body: 400" [ "$code" = 400 ]
printf 'GARBAGE \x01\x02 HTTP/9\r\n\r\n' | timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port; cat >&3; cat <&3" >/dev/null 2>&1
printf 'GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n' | timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port; cat >&3; cat <&3" >/dev/null 2>&1
req "$url/healthz"
check "survives malformed request lines" [ "$code" = 200 ]
req "$url/metrics"
check "metrics count refusals" grep -q 'tether_node_requests_total{route="exec",code="403"}' <<<"$body"
check "no token in the log" bash -c "! grep -q 'v4.public.garbage' '$dir/node.log'"
kill -0 "$node_pid"
check "node-api still running" [ $? = 0 ]
tap_done

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
echo "ttw_test$RANDOM" >"$dir/node.cred"
# A feed key of its own (no cp here): node-api hands its public half to
# the manager, which refuses to start without one.
"$ROOT/build/tether-signer" keygen "$dir/feed.key" | sed -n 's/^public: //p' >"$dir/feed.pub"
chmod 0644 "$dir/node.cred"
"$bin" node --id w1 --listen 127.0.0.1:$port --cp http://127.0.0.1:1 \
	--credential-file "$dir/node.cred" --feed-key-file "$dir/feed.pub" --state "$dir/w1" 2>"$dir/node.log"; rc=$?
expect "a credential file others can read is refused" \
	'[ $rc = 1 ] && grep -q "mode 0600" "$dir/node.log"' "rc $rc: $(cat "$dir/node.log")"
chmod 0600 "$dir/node.cred"
"$bin" node --id w1 --listen 127.0.0.1:$port --cp http://127.0.0.1:1 \
	--credential-file "$dir/node.cred" --feed-key-file "$dir/feed.pub" --state "$dir/w1" 2>"$dir/node.log" &
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
check "a chunked body (no Content-Length): 411 length_required" [ "$code" = 411 -a "$(jq -r .error <<<"$body")" = length_required ]
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

# ---- privilege separation: node-api runs as nobody, the manager as root --------
# st PID FIELD: the tab-separated values of one /proc/PID/status line.
st() { sed -n "s/^$2:[[:space:]]*//p" "/proc/$1/status" | tr -s '\t ' ' '; }
nuid=$(id -u nobody) ngid=$(id -g nobody)
mgr_pid=$(pgrep -P "$node_pid" -f 'tetherd manager' | head -n1)
if [ "$(id -u)" != 0 ]; then
	skip "privilege separation" "needs root"
else
	expect "node-api Uid is nobody (all four)" '[ "$(st $node_pid Uid)" = "$nuid $nuid $nuid $nuid" ]' "$(st $node_pid Uid)"
	expect "node-api Gid is nogroup (all four)" '[ "$(st $node_pid Gid)" = "$ngid $ngid $ngid $ngid" ]' "$(st $node_pid Gid)"
	expect "node-api has no groups" '[ -z "$(st $node_pid Groups)" ]' "$(st $node_pid Groups)"
	expect "node-api NoNewPrivs 1" '[ "$(st $node_pid NoNewPrivs)" = 1 ]' "$(st $node_pid NoNewPrivs)"
	expect "node-api CapEff/CapPrm 0" '[ "$(st $node_pid CapEff)" = 0000000000000000 -a "$(st $node_pid CapPrm)" = 0000000000000000 ]' \
		"$(grep Cap /proc/$node_pid/status)"
	expect "manager is still root" '[ -n "$mgr_pid" ] && [ "$(st $mgr_pid Uid)" = "0 0 0 0" ]' "pid '$mgr_pid'"
	sock=$(tr '\0' ' ' <"/proc/$mgr_pid/cmdline" | sed -n 's/.*--socket \([^ ]*\).*/\1/p')
	expect "manager.sock is outside the state dir, 0600 owned by nobody" \
		'[ -S "$sock" ] && [ "$(stat -c "%a %u" "$sock")" = "600 $nuid" ] && [ "$(stat -c "%a %u" "$(dirname "$sock")")" = "711 0" ]' \
		"$sock: $(stat -c '%a %u' "$sock" 2>&1)"
	# connect_as UID GID: one connection to manager.sock as that identity.
	connect_as() {
		setpriv --reuid "$1" --regid "$2" --clear-groups /usr/bin/python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(e.strerror); sys.exit(1)
s.settimeout(3)
try:
    sys.exit(2 if s.recv(1) == b"" else 3)   # 2: the peer check closed it
except OSError:
    sys.exit(3)
' "$sock"
	}
	out=$(connect_as 65533 65533 2>&1); rc=$?
	expect "uid 65533 cannot connect to manager.sock" '[ $rc = 1 ] && grep -q "Permission denied" <<<"$out"' "rc $rc: $out"
	out=$(connect_as "$nuid" "$ngid" 2>&1); rc=$?
	expect "another nobody process is refused by the peer check" '[ $rc = 2 ]' "rc $rc: $out"
	expect "the manager logged the refused peer" 'grep -q "peer refused" "$dir/node.log"' "$(tail -n 3 "$dir/node.log")"

	req -X POST "$url/v1/sandboxes/$sbx/exec" -H 'Authorization: Capability v4.public.garbage' -d '{"cmd":["true"]}'
	expect "node-api (nobody) still reaches the manager" '[ "$code" = 403 -a "$(jq -r .decision <<<"$body")" = deny ]' "$code $body"
	kill "$node_pid"; wait "$node_pid"; rc=$?; node_pid=
	expect "unprivileged node-api stops the root manager on SIGTERM" \
		'[ $rc = 0 ] && ! kill -0 "$mgr_pid" 2>/dev/null && [ ! -e "$(dirname "$sock")" ]' \
		"rc $rc; $(tail -n 5 "$dir/node.log")"
	"$bin" node --id w1 --listen 127.0.0.1:$port --cp http://127.0.0.1:1 --user root \
		--credential-file "$dir/node.cred" --feed-key-file "$dir/feed.pub" --state "$dir/w1" 2>"$dir/node2.log"; rc=$?
	expect "--user root is refused" '[ $rc = 1 ] && grep -q "must not run with uid or gid 0" "$dir/node2.log"' "$(cat "$dir/node2.log")"
fi
tap_done

#!/bin/bash
# Proxy settings in the environment never carry the cluster's own traffic.
# libcurl honours http_proxy even for 127.0.0.1, so a `tether up` started
# in a shell that exports one (common behind a corporate proxy) would send
# the edge's capabilities, the workers' credentials and the admin API key
# to whatever the variable names. A trap listening where the variables
# point records every connection: curl itself (which honours them) is
# caught, showing the trap works; the cluster's daemons and the CLI talking
# to the local edge are not, and every operation succeeds. Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-proxy
TRAP_PID=
at_exit '[ -n "$TRAP_PID" ] && kill "$TRAP_PID" 2>/dev/null'
T() { timeout 60 "$ROOT/build/tether" "$@"; }

# The trap: logs the request line of every connection, answers 502.
python3 - "$WORK/trap.port" "$WORK/trap.log" <<'EOF' &
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    c, _ = s.accept()
    c.settimeout(2)
    try:
        line = c.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError:
        line = "(nothing)"
    with open(sys.argv[2], "a") as f:
        f.write(line + "\n")
    try:
        c.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    except OSError:
        pass
    c.close()
EOF
TRAP_PID=$!
wait_until 50 test -s "$WORK/trap.port" || tap_bail "proxy trap listening" "no port"
TRAP=http://127.0.0.1:$(cat "$WORK/trap.port")
: >"$WORK/trap.log"
trapped() { grep -c . "$WORK/trap.log"; }

export http_proxy=$TRAP HTTP_PROXY=$TRAP https_proxy=$TRAP HTTPS_PROXY=$TRAP all_proxy=$TRAP ALL_PROXY=$TRAP
unset no_proxy NO_PROXY

# The trap catches what honours the variables (so a leak would show).
curl -s -m 5 -o /dev/null "http://127.0.0.1:$BASE/healthz"
expect "the trap sees a request that honours http_proxy" '[ "$(trapped)" -ge 1 ]' \
	"trap log: $(cat "$WORK/trap.log")"
: >"$WORK/trap.log"

cluster_up_or_bail "tether up with proxy variables exported" 1 --disk-mb 64
S=$(T create 2>"$WORK/e")
if [[ $S =~ ^sbx_ ]]; then ok "create"; else notok "create" "$(cat "$WORK/e")"; fi
out=$(T exec "$S" -- sh -c 'echo hi; exit 3' 2>&1); rc=$?
expect "exec through edge, node-api, manager and bridge" '[ "$out" = hi ] && [ $rc = 3 ]' \
	"rc=$rc out=$out"
head -c 200000 /dev/urandom >"$WORK/in.bin"
check "cp in" T cp "$WORK/in.bin" "$S:/tmp/in.bin"
check "cp out" T cp "$S:/tmp/in.bin" "$WORK/back.bin"
check "cp round trip is byte-exact" cmp "$WORK/in.bin" "$WORK/back.bin"
check "workers" T workers
check "rm" T rm "$S"
expect "nothing reached the proxy: no capability, worker credential or API key left the cluster" \
	'[ "$(trapped)" = 0 ]' "trap log: $(sort "$WORK/trap.log" | uniq -c | head)"

# A remote edge still goes through the configured proxy (the client keeps
# the user's choice; only loopback is exempt).
TETHER_URL=http://203.0.113.7:9 TETHER_API_KEY=k T ls >/dev/null 2>&1
expect "the CLI honours http_proxy for a remote edge" \
	'grep -q "203.0.113.7" "$WORK/trap.log"' "trap log: $(cat "$WORK/trap.log")"
tap_done

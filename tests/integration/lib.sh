# Shared helpers for tests/integration/test_*.sh (sourced, never run): TAP
# output, a scratch dir and exit-time cleanup, free ports, a `tether up`
# cluster, a bare `tetherd cp`, and bounded curl calls. Sourcing it enters
# the repository root, so build/ paths work wherever the script is run from.
# shellcheck shell=bash

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
ROOT=$PWD

# ---- TAP ------------------------------------------------------------------------
n=0
fails=0

# ok NAME / notok NAME [DETAIL]: one TAP line each; DETAIL (first lines) as
# "#" comments under a failure.
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() {
	n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"
	[ $# -gt 1 ] && printf '%s\n' "$2" | head -n "${TT_DETAIL_LINES:-8}" | sed 's/^/#   /'
	return 0
}
# skip NAME WHY: a TAP skip (counts as ok).
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
# okrc STATUS NAME: ok when STATUS is 0 (for `okrc $? NAME` and
# `okrc "$(COND; echo $?)" NAME`).
okrc() { if [ "$1" = 0 ]; then ok "$2"; else notok "$2"; fi; }
# expect NAME COND DETAIL: ok when the shell condition COND (eval'd) holds.
expect() { if eval "$2"; then ok "$1"; else notok "$1" "$3"; fi; }
# check NAME CMD...: ok when CMD succeeds; its output is the failure detail.
check() {
	local name=$1 out
	shift
	out=$("$@" 2>&1)
	if [ $? = 0 ]; then ok "$name"; else notok "$name" "$out"; fi
}
# tap_done: the plan line; the exit status says whether every check passed.
tap_done() {
	echo "1..$n"
	[ "$fails" = 0 ]
}
# tap_bail NAME DETAIL: a failed prerequisite; ends the script with its plan.
tap_bail() {
	notok "$1" "$2"
	echo "1..$n"
	exit 1
}

# ---- scratch dir and cleanup ------------------------------------------------------
TT_AT_EXIT=()
WORK=
# at_exit CMD: eval CMD when the script exits (last registered runs first);
# then the cluster and the cp are stopped and WORK is removed.
at_exit() { TT_AT_EXIT+=("$1"); }
tt_exit() {
	local i
	for ((i = ${#TT_AT_EXIT[@]} - 1; i >= 0; i--)); do
		eval "${TT_AT_EXIT[i]}"
	done
	cluster_down
	cp_stop
	[ -z "$WORK" ] || [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap tt_exit EXIT

# workdir PREFIX: WORK = a fresh /tmp/PREFIX.XXXXXX, removed at exit (kept
# when KEEP is set); req_status bodies and headers go there.
workdir() {
	WORK=$(mktemp -d "/tmp/$1.XXXXXX")
	TT_BODY=$WORK/out
	TT_HDRS=$WORK/hdrs
}
# cluster_setup NAME: what a test that runs its own cluster starts with:
# WORK (workdir NAME), a scratch HOME, a free port BASE, the cluster's
# STATE dir and its control-plane URL CP.
cluster_setup() {
	workdir "$1"
	scratch_home
	BASE=$(port_base)
	STATE=$WORK/state
	CP=http://127.0.0.1:$BASE
}
# scratch_home: HOME inside WORK, no inherited client settings.
scratch_home() {
	export HOME=$WORK/home
	unset TETHER_URL TETHER_API_KEY
	mkdir -p "$HOME"
}
# stop_pid PID [TENTHS]: SIGTERM, up to TENTHS/10 s to go (default 15 s),
# then SIGKILL. Only the given pid, never a name.
stop_pid() {
	local pid=$1 tries=${2:-150}
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid"
	for _ in $(seq 1 "$tries"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$pid" 2>/dev/null
	return 0
}
# wait_until TRIES CMD...: runs CMD every 0.1 s until it succeeds (0) or
# TRIES attempts failed (1).
wait_until() {
	local tries=$1
	shift
	for _ in $(seq 1 "$tries"); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}

# ms: a wall clock in milliseconds (for recovery times).
ms() { echo $(($(date +%s%N) / 1000000)); }
# until_ms T0 BOUND_S CMD...: ms from T0 until CMD succeeds (tried every
# 0.1 s), or "" once BOUND_S seconds passed without it.
until_ms() {
	local t0=$1 end=$(($(ms) + $2 * 1000))
	shift 2
	while [ "$(ms)" -lt "$end" ]; do
		"$@" >/dev/null 2>&1 && { echo $(($(ms) - t0)); return 0; }
		sleep 0.1
	done
	echo ""
}

# ---- ports ----------------------------------------------------------------------
# free_port: one port the kernel says is free now.
free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# port_base [SPAN]: a base port, a multiple of 10 (so `tether up` worker
# wN listens on a port ending in N, at BASE+10+N), whose SPAN (default 20)
# ports from it are all free to bind on 127.0.0.1 now. The search starts
# at a point derived from the pid, so scripts run in parallel spread out.
port_base() {
	python3 - "${1:-20}" "$$" <<'EOF'
import socket, sys
span, seed = int(sys.argv[1]), int(sys.argv[2])
lo, slots = 20000, (60000 - 20000 - span) // 10
slot = seed * 7919 % slots
for _ in range(200):
    base, socks = lo + slot * 10, []
    try:
        for p in range(base, base + span):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", p))
        print(base)
        sys.exit(0)
    except OSError:
        slot = (slot + 37 * (span // 10 + 1)) % slots
    finally:
        for s in socks:
            s.close()
sys.exit("no free port range")
EOF
}

# ---- HTTP -------------------------------------------------------------------------
# jget EXPR: EXPR (python, over the JSON document d) of the JSON on stdin.
jget() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"; }
# jfield SUFFIX [FILE]: d+SUFFIX (e.g. '["state"]') of the JSON in FILE
# (default $TT_BODY, the last req_status body).
jfield() { python3 -c "import json,sys; d=json.load(open(sys.argv[2])); print(eval('d'+sys.argv[1]))" "$1" "${2:-$TT_BODY}"; }
# tcurl ARGS...: curl, silent and bounded (TT_CURL_MAX seconds, default 60).
tcurl() { curl -s -m "${TT_CURL_MAX:-60}" "$@"; }
# req_status METHOD URL AUTH [BODY]: prints the HTTP status; the body goes
# to $TT_BODY, the headers to $TT_HDRS (both default under WORK). AUTH ""
# sends no Authorization header; a BODY is sent as JSON.
req_status() {
	local args=(-o "$TT_BODY" -D "$TT_HDRS" -w '%{http_code}' -X "$1")
	[ -n "$3" ] && args+=(-H "Authorization: $3")
	[ $# -ge 4 ] && args+=(-H 'Content-Type: application/json' --data-binary "$4")
	tcurl "${args[@]}" "$2"
}
# metric URL NAME{LABELS}: the value of one sample at URL/metrics (0 if absent).
metric() {
	curl -s -m 10 "$1/metrics" | awk -v k="$2" '$1 == k { v = $2 } END { print v + 0 }'
}

# ---- a bare control plane -----------------------------------------------------------
TETHERD=${TETHERD:-build/tetherd}
CP_PID=
# cp_start STATE PORT [ARGS...]: `tetherd cp` on 127.0.0.1:PORT (log
# appended to STATE/cp.log); 0 once /healthz answers (5 s).
cp_start() {
	local st=$1 port=$2
	shift 2
	"$TETHERD" cp --state "$st" --listen "127.0.0.1:$port" "$@" >>"$st/cp.log" 2>&1 &
	CP_PID=$!
	wait_until 50 curl -sf -m 5 "http://127.0.0.1:$port/healthz"
}
# cp_stop: stops the cp started by cp_start and reaps it.
cp_stop() {
	[ -n "$CP_PID" ] && kill "$CP_PID" 2>/dev/null && wait "$CP_PID" 2>/dev/null
	CP_PID=
}
# cp_secrets STATE: KEY (admin API key) from the cp's state dir.
cp_secrets() {
	KEY=$(cat "$1/admin.key")
}
# provision CPSTATE ID URL [FILE]: `tetherd worker add` (credential in FILE,
# default CPSTATE/ID.cred, mode 0600); CRED is the credential.
provision() {
	local f=${4:-$1/$2.cred}
	"$TETHERD" worker add --state "$1" --id "$2" --node-url "$3" --out "$f" 2>/dev/null &&
		CRED=$(cat "$f")
}

# ---- a `tether up` cluster ------------------------------------------------------------
UP_PID=
# cluster_up WORKERS [ARGS...]: `tether up --workers WORKERS --state $STATE
# --port $BASE ARGS...` in the background (output in WORK/up.out, up.err);
# 0 once it says "tether is up" (60 s), 1 if it exited or never did.
# Stopped at exit.
cluster_up() {
	"$ROOT/build/tether" up --workers "$1" --state "$STATE" --port "$BASE" "${@:2}" \
		>"$WORK/up.out" 2>"$WORK/up.err" &
	UP_PID=$!
	for _ in $(seq 1 600); do
		grep -q "tether is up" "$WORK/up.out" 2>/dev/null && return 0
		kill -0 "$UP_PID" 2>/dev/null || break
		sleep 0.1
	done
	return 1
}
# cluster_down: SIGTERM to the cluster (by pid), SIGKILL after 15 s.
cluster_down() {
	stop_pid "$UP_PID"
	UP_PID=
}
# cluster_up_or_bail NAME WORKERS [ARGS...]: cluster_up as the check NAME;
# a cluster that does not come up ends the script (nothing else can run).
cluster_up_or_bail() {
	if cluster_up "${@:2}"; then ok "$1"; else
		tap_bail "$1" "$(cat "$WORK/up.err"; tail -n 5 "$STATE"/logs/*.log 2>/dev/null)"
	fi
}
# ---- a worker w3 started by hand, beside a `tether up` cluster ------------------------
# Scripts that stop and start a worker themselves run w3 alone (node-api,
# its manager with it) on the cluster's cp, snapshot store and state dir.
W3_PID=
# start_w3 [ARGS...]: `tetherd node --id w3` (ARGS appended, log in
# WORK/w3.log); 0 once the cp lists w3 up (10 s).
start_w3() {
	mkdir -p "$STATE/workers/w3"
	[ -s "$STATE/workers/w3/credential" ] ||
		TETHERD=$ROOT/build/tetherd provision "$STATE/cp" w3 "http://127.0.0.1:$((BASE + 13))" \
			"$STATE/workers/w3/credential" || return 1
	"$ROOT/build/tetherd" node --id w3 --listen 127.0.0.1:$((BASE + 13)) --cp "$CP" \
		--credential-file "$STATE/workers/w3/credential" --feed-key-file "$STATE/cp/feed.pub" --state "$STATE/workers/w3" \
		--uid $((900000 + BASE + 13)) \
		--guest-bin "$ROOT/build/tether-guest" --snapshots "$STATE/snapshots" \
		"$@" >>"$WORK/w3.log" 2>&1 &
	W3_PID=$!
	wait_until 100 w3_up
}
# w3_up: the cp lists w3 up.
w3_up() { timeout 20 "$ROOT/build/tether" workers 2>/dev/null | grep -q "^w3 .*up"; }
# stop_w3 [TENTHS]: SIGTERM to w3 (an orderly stop), SIGKILL after TENTHS/10 s
# (default 10 s). Registered at exit by the scripts that use w3.
stop_w3() {
	stop_pid "$W3_PID" "${1:-100}"
	W3_PID=
}

# build_mint OUT: compiles tests/integration/mint.c (a capability minted
# from a k4.secret file, backdated on demand) to OUT against
# build/libtethercore.a; compiler errors in OUT.err.
build_mint() {
	# shellcheck disable=SC2046
	cc -std=c17 -D_GNU_SOURCE -I"$ROOT/lib" -o "$1" "$ROOT/tests/integration/mint.c" \
		"$ROOT/build/libtethercore.a" $(pkg-config --libs libsodium jansson) 2>"$1.err"
}

# cluster_key: the admin API key `tether up` wrote to the client config.
cluster_key() { sed -n 's/^api_key=//p' "$HOME/.config/tether/config"; }

# The crash-safety proof suite (issue 12, "Proof suites": crash safety),
# sourced after lib.sh by scripts/crash.sh (any number of rounds) and
# tests/integration/test_crash.sh (one round, in make check).
#
# crash_setup: `tether up --workers 3` on free ports in a scratch state dir,
# CRASH_SANDBOXES (6) sandboxes spread over the workers, a marker file in
# each, a capability taken before any kill, and build/churn as background
# load for the whole run (with migrations).
# crash_round R: kill -9 in turn the cp, the signer, the edge, a worker's
# node-api, another worker's sbx-manager, a sandbox's host bridge and
# another sandbox's guest agent (its init). Before each kill an
# acknowledged write and a capability of the affected sandbox; after it,
# the time until a fresh capability and an exec on that sandbox succeed
# again through the edge (the probe, X-Tether-Wait 5 s per call), the
# write read back, the capability replayed at its node (refused, never
# run, whenever the execution it names was replaced), what the system did
# (from tether up's stderr, the logs and the cp's note), and the cluster
# settled (every daemon there, every worker up, every sandbox answering)
# before the next kill.
# crash_verdict: churn stopped (SIGINT: it settles and verifies every
# file) and its verdict; no runtime record lost; no generation reused;
# admission still correct; every acknowledged write read back; the table.
#
# Tunables: CRASH_BOUND (30 s: a kill must be recovered within it),
# CRASH_SETTLE (60 s), CRASH_GAP (2 s of undisturbed load after each
# settle), CRASH_VERIFY (churn --verify-seconds, 60), CRASH_TARGETS (all
# seven, in order).
# shellcheck shell=bash

CRASH_K=${CRASH_SANDBOXES:-6}
CRASH_BOUND=${CRASH_BOUND:-30}
CRASH_SETTLE=${CRASH_SETTLE:-60}
CRASH_GAP=${CRASH_GAP:-2}
CRASH_VERIFY=${CRASH_VERIFY:-60}
CRASH_TARGETS=${CRASH_TARGETS:-"cp signer edge node-api manager bridge guest"}
CHK="python3 $ROOT/tests/integration/crash_check.py"
KN=0         # kills so far
KILLS=()     # one line per kill: "N|target|pid|detail|ms|settle_ms|did"
KWIN=()      # one line per kill: "N target T0_MS T1_MS" (epoch ms)
WRITES=()    # writes acknowledged before a kill: "SBX|N|CONTENT"
CHURN_PID=

# jx FILE EXPR: EXPR (python, over d) of the JSON in FILE ("" if it is not JSON).
jx() { python3 -c 'import json,sys
try: d=json.load(open(sys.argv[1]))
except Exception: sys.exit(0)
print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null; }

# ---- this cluster's processes ------------------------------------------------------
pid_cp() { pgrep -f "tetherd cp --state $STATE/cp --listen 127.0.0.1:$BASE\$"; }
pid_signer() { pgrep -f "tether-signer --key $STATE/cp/signer.key "; }
pid_edge() { pgrep -f "tetherd edge --listen 127.0.0.1:$((BASE + 1)) "; }
pid_node() { pgrep -f "tetherd node --id $1 --listen 127.0.0.1:$((BASE + 10 + ${1#w})) "; }
pid_manager() { pgrep -f "tetherd manager --state $STATE/workers/$1 "; }
# rec W SBX COLS: columns of SBX's record in W's runtime.db ("|"-separated).
rec() { sqlite3 -cmd '.timeout 2000' "$STATE/workers/$1/runtime.db" "SELECT $3 FROM executions WHERE sbx='$2'" 2>/dev/null; }
# daemons_there: one cp, signer, edge, and a node-api and manager per worker.
daemons_there() {
	local w
	[ "$(pid_cp | wc -w)" = 1 ] && [ "$(pid_signer | wc -w)" = 1 ] && [ "$(pid_edge | wc -w)" = 1 ] || return 1
	for w in w1 w2 w3; do
		[ "$(pid_node $w | wc -w)" = 1 ] && [ "$(pid_manager $w | wc -w)" = 1 ] || return 1
	done
}

# ---- calls through the edge --------------------------------------------------------
# ecall OUT WAIT METHOD PATH [JSON]: one call through the edge with the admin
# key and X-Tether-Wait WAIT; the body to OUT; prints the HTTP status.
ecall() {
	local args=(-s -m $(($2 + 10)) -o "$1" -w '%{http_code}' -X "$3"
		-H "Authorization: Bearer $KEY" -H "X-Tether-Wait: $2")
	[ $# -ge 5 ] && args+=(-H 'Content-Type: application/json' --data-binary "$5")
	curl "${args[@]}" "$EDGE$4"
}
# sbx_now ID: S_STATE S_WORKER S_GEN S_ATT S_NODE of ID as the cp says now.
sbx_now() {
	local f=$WORK/sbx.$1
	S_STATE= S_WORKER= S_GEN= S_ATT= S_NODE=
	[ "$(ecall "$f" 0 GET "/v1/sandboxes/$1")" = 200 ] || return 1
	read -r S_STATE S_WORKER S_GEN S_ATT S_NODE < <(jx "$f" '" ".join(str(d[k]) for k in ("state","worker","generation","activation","node_url"))')
	[ -n "$S_STATE" ]
}
# put_file ID PATH CONTENT: an acknowledged write (200) through the edge.
put_file() {
	[ "$(curl -s -m 40 -o "$WORK/put.out" -w '%{http_code}' -X PUT -H "Authorization: Bearer $KEY" \
		-H 'X-Tether-Wait: 30' -H 'Content-Type: application/octet-stream' \
		--data-binary "$3" "$EDGE/v1/sandboxes/$1/files?path=$2")" = 200 ]
}
# get_file ID PATH: prints the file's bytes; status 0 on 200, 2 on 404, 1 else.
get_file() {
	local code
	code=$(curl -s -m 40 -o "$WORK/get.out" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
		-H 'X-Tether-Wait: 30' "$EDGE/v1/sandboxes/$1/files?path=$2")
	case $code in
	200) cat "$WORK/get.out" ;;
	404) return 2 ;;
	*) echo "HTTP $code $(head -c 200 "$WORK/get.out")" >&2; return 1 ;;
	esac
}
# probe ID: a fresh capability and an exec reading the marker, through the
# edge (X-Tether-Wait 5 s each): the operations a caller of ID needs.
probe() {
	[ "$(ecall "$WORK/probe.cap" 5 POST "/v1/sandboxes/$1/capabilities" '{"purpose":"control","ops":["exec"]}')" = 201 ] &&
		[ "$(ecall "$WORK/probe.out" 5 POST "/v1/sandboxes/$1/exec" '{"cmd":["cat","/workspace/crash-probe"]}')" = 200 ] &&
		[ "$(jx "$WORK/probe.out" 'd["exit_code"], d["stdout"]')" = "(0, 'probe $1')" ]
}
# settled: every daemon there, three workers up, every sandbox answering.
settled() {
	local id
	kill -0 "$UP_PID" 2>/dev/null && daemons_there || return 1
	[ "$(ecall "$WORK/workers" 0 GET /v1/workers)" = 200 ] &&
		[ "$(jx "$WORK/workers" 'sum(w["state"] == "up" for w in d["workers"])')" = 3 ] || return 1
	for id in "${IDS[@]}"; do probe "$id" || return 1; done
}

# ---- setup -----------------------------------------------------------------------------
crash_setup() {
	local i id
	[ -x build/churn ] && [ -x build/tether ] && command -v sqlite3 >/dev/null ||
		tap_bail "build/churn, build/tether and sqlite3 are there" "make all; apt-get install sqlite3"
	cluster_up_or_bail "tether up --workers 3" 3
	EDGE=http://127.0.0.1:$((BASE + 1))
	KEY=$(cluster_key)
	export TETHER_URL=$EDGE TETHER_API_KEY=$KEY
	IDS=()
	for i in $(seq 0 $((CRASH_K - 1))); do
		id=$(timeout 60 build/tether create --worker "w$((i % 3 + 1))" 2>>"$WORK/create.err")
		[ -n "$id" ] && put_file "$id" /workspace/crash-probe "probe $id" && IDS+=("$id")
	done
	[ ${#IDS[@]} = "$CRASH_K" ] && ok "$CRASH_K sandboxes on w1..w3, a marker file in each" ||
		tap_bail "$CRASH_K sandboxes on w1..w3" "$(cat "$WORK/create.err")"
	# the capability the admission check replays at the end
	timeout 20 build/tether cap "${IDS[0]}" >"$WORK/cap0.json" 2>&1
	[ -n "$(jx "$WORK/cap0.json" 'd["token"]')" ] && ok "a capability of ${IDS[0]} taken before the kills" ||
		notok "a capability before the kills" "$(cat "$WORK/cap0.json")"
	CHURN_JSON=${CRASH_CHURN_JSON:-$WORK/churn.json}
	build/churn --workers w1,w2,w3 --json "$CHURN_JSON" --fresh-upload-connections \
		--seconds 86400 --timeout 60 --verify-seconds "$CRASH_VERIFY" --progress 10 \
		--verbose "${IDS[@]}" >"$WORK/churn.out" 2>"$WORK/churn.err" &
	CHURN_PID=$!
	at_exit '[ -n "$CHURN_PID" ] && kill -9 "$CHURN_PID" 2>/dev/null'
	sleep 3
	kill -0 "$CHURN_PID" 2>/dev/null && grep -q 'the run starts' "$WORK/churn.err" &&
		ok "churn runs as background load (5 clients, migrations; pid $CHURN_PID)" ||
		tap_bail "churn runs as background load" "$(tail -n 5 "$WORK/churn.err")"
	echo "# state $STATE; edge $EDGE; sandboxes ${IDS[*]}"
}

# ---- one kill ------------------------------------------------------------------------------
# victim_sbx TARGET ROUND: V_SBX, the sandbox whose operations are probed
# (for a worker's daemon, one on that worker V_W if the migrations left one
# there; for a bridge or guest agent, whose process is killed).
victim_sbx() {
	local t=$1 r=$2 i id
	V_SBX=${IDS[$((r % CRASH_K))]} V_W=
	case $t in
	node-api) V_W=w$((r % 3 + 1)) ;;
	manager) V_W=w$(((r + 1) % 3 + 1)) ;;
	bridge) V_SBX=${IDS[$((2 * r % CRASH_K))]} ;;
	guest) V_SBX=${IDS[$(((2 * r + 1) % CRASH_K))]} ;;
	esac
	[ -n "$V_W" ] || return 0
	for i in $(seq 0 $((CRASH_K - 1))); do
		id=${IDS[$(((r + i) % CRASH_K))]}
		sbx_now "$id" && [ "$S_WORKER" = "$V_W" ] && { V_SBX=$id; return 0; }
	done
}
# victim TARGET: V_PID, the one process to kill now, and V_DETAIL. A
# bridge or guest agent is that of V_SBX's current execution: the cp's
# view, the worker's record (runtime.db) agreeing with it, and the process
# (its cmdline; a guest agent also in the execution's pids cgroup).
victim() {
	local t=$1 r_gen r_att r_st r_ret r_init r_br
	V_PID= V_DETAIL=
	case $t in
	cp) V_PID=$(pid_cp) V_DETAIL="control plane" ;;
	signer) V_PID=$(pid_signer) V_DETAIL="the cp's signer" ;;
	edge) V_PID=$(pid_edge) V_DETAIL="edge" ;;
	node-api) V_PID=$(pid_node "$V_W") V_DETAIL="node-api of $V_W" ;;
	manager) V_PID=$(pid_manager "$V_W") V_DETAIL="sbx-manager of $V_W" ;;
	bridge | guest)
		for _ in $(seq 1 100); do
			if sbx_now "$V_SBX" && [ "$S_STATE" = running ]; then
				IFS='|' read -r r_gen r_att r_st r_ret r_init r_br < <(rec "$S_WORKER" "$V_SBX" gen,att,state,retired,init_pid,bridge_pid)
				if [ "$r_gen $r_att $r_st $r_ret" = "$S_GEN $S_ATT running 0" ]; then
					if [ "$t" = bridge ]; then
						tr '\0' ' ' <"/proc/$r_br/cmdline" 2>/dev/null | grep -q tether-bridge && V_PID=$r_br
					else
						tr '\0' ' ' <"/proc/$r_init/cmdline" 2>/dev/null | grep -q tether-guest &&
							grep -qx "$r_init" "/sys/fs/cgroup/pids/tether/$V_SBX-g$S_GEN/cgroup.procs" 2>/dev/null &&
							V_PID=$r_init
					fi
					[ -n "$V_PID" ] && { V_W=$S_WORKER; V_DETAIL="$t of $V_SBX g$S_GEN a$S_ATT on $S_WORKER"; return 0; }
				fi
			fi
			sleep 0.1
		done
		V_DETAIL="$t of $V_SBX (no running execution found in 10 s)"
		;;
	esac
}

# what_did TARGET: what the system did after the kill (from the lines the
# logs gained since the kill: U0 of up.err, C0 of cp.log, L0 of the
# worker's log, and the sandbox's note).
what_did() {
	local t=$1 up cpl wl name back why adopted notad lost
	up=$(tail -n +$((U0 + 1)) "$WORK/up.err" | grep '^tether: ')
	case $t in cp | edge) name=$t ;; node-api | manager) name=$V_W ;; esac
	case $t in
	cp | edge | node-api | manager)
		back=$(echo "$up" | grep -o "^tether: $name is back (pid [0-9]*, [0-9.]* s after it died)" | head -n 1 | sed 's/^tether: //')
		why=$(echo "$up" | grep -o "^tether: $name \(was killed by signal [0-9]*\|exited with status [0-9]*\)" | head -n 1 | sed "s/^tether: $name //")
		DID="tether up: $name ${why:-?}, restarted; ${back:-not said back}"
		;;
	signer)
		cpl=$(tail -n +$((C0 + 1)) "$STATE/logs/cp.log")
		if echo "$cpl" | grep -q 'the signer died or stopped answering: starting it again'; then
			DID="cp: 'the signer died ...: starting it again'; new signer pid $(pid_signer) ($(echo "$cpl" | grep -o 'signer\[[0-9]*\] info: ready, kid [^ ]*' | tail -n 1 | cut -c1-60)...)"
		else DID="cp: no signer restart logged"; fi
		;;
	esac
	case $t in
	node-api | manager)
		wl=$(tail -n +$((L0 + 1)) "$STATE/logs/$V_W.log")
		adopted=$(echo "$wl" | grep -c 'info: adopted sbx_')
		notad=$(echo "$wl" | grep -c 'not adopted')
		lost=$(echo "$wl" | grep -c 'lost across restart')
		DID="$DID; new manager adopted $adopted execution(s)"
		[ "$notad" -gt 0 ] && DID="$DID, $notad NOT adopted"
		[ "$lost" -gt 0 ] && DID="$DID, $lost lost across the restart"
		;;
	bridge | guest)
		# the cp's own line for it: re-activated in place, or relaunched
		cpl=$(tail -n +$((C0 + 1)) "$STATE/logs/cp.log" | grep "sandbox $V_SBX: \(re-activated\|relaunched\|.*failed\)" | head -n 1 | sed "s/.*sandbox $V_SBX: //")
		sbx_now "$V_SBX"
		DID="cp: ${cpl:-no re-activation or relaunch logged}; now $S_STATE g$S_GEN a$S_ATT on $S_WORKER"
		;;
	esac
	case $t in
	node-api | manager | bridge | guest)
		# a migration of the sandbox probed that the kill made fail
		cpl=$(tail -n +$((C0 + 1)) "$STATE/logs/cp.log" | grep "sandbox [a-z0-9_]*: gen [0-9]* pause failed\|relaunched as generation" | grep -v "sandbox $V_SBX: relaunched" | head -n 2 | sed 's/.*warn: //' | tr '\n' ';')
		[ -n "$cpl" ] && DID="$DID; also: $cpl"
		;;
	esac
}

# take_cap FILE: a capability of V_SBX (all data ops) through the edge.
take_cap() { ecall "$1" 30 POST "/v1/sandboxes/$V_SBX/capabilities" '{"purpose":"control","ops":["exec","fs.read","fs.write"]}' >/dev/null; }

# crash_one TARGET ROUND: one kill and its checks.
crash_one() {
	local t=$1 r=$2 word t0 t_rec t_set capf code exists replay_ok got
	REPLAY="no capability to replay"
	KN=$((KN + 1))
	kill -0 "$CHURN_PID" 2>/dev/null || notok "kill $KN ($t): churn still runs" "$(tail -n 5 "$WORK/churn.err")"
	# before: an acknowledged write and a capability of the sandbox probed
	victim_sbx "$t" "$r"
	word="kill $KN $t $RANDOM$RANDOM"
	if ! put_file "$V_SBX" "/workspace/crash-k$KN" "$word"; then
		notok "kill $KN ($t): an acknowledged write before it" "$(cat "$WORK/put.out")"
		word=
	else WRITES+=("$V_SBX|$KN|$word"); fi
	victim "$t"
	# a bridge or guest agent the migrations retired between the look and the
	# kill is looked for again (it must be a live one that dies)
	local tries=1
	while [ -n "$V_PID" ] && [ "$(echo "$V_PID" | wc -w)" = 1 ] && ! kill -0 "$V_PID" 2>/dev/null && [ "$tries" -lt 5 ]; do
		victim "$t"
		tries=$((tries + 1))
	done
	if [ -z "$V_PID" ] || [ "$(echo "$V_PID" | wc -w)" != 1 ]; then
		notok "kill $KN ($t): exactly one process to kill" "found '$V_PID' for $t ($V_DETAIL)"
		KILLS+=("$KN|$t|-|$V_DETAIL|-|-|not found")
		return
	fi
	# the capability replayed after the kill: taken last, so for a bridge or
	# guest agent it names the very execution killed (its activation)
	capf=$WORK/cap-k$KN.json
	take_cap "$capf"
	U0=$(wc -l <"$WORK/up.err") C0=$(wc -l <"$STATE/logs/cp.log") L0=0
	[ -n "$V_W" ] && L0=$(wc -l <"$STATE/logs/$V_W.log")
	t0=$(ms)
	if ! kill -9 "$V_PID" 2>/dev/null; then
		case $t in
		bridge | guest) # once more on a fresh look; else say so
			victim "$t"
			take_cap "$capf"
			t0=$(ms)
			kill -9 "$V_PID" 2>/dev/null || V_DETAIL="$V_DETAIL (already gone at the kill)" ;;
		*) V_DETAIL="$V_DETAIL (already gone at the kill)" ;;
		esac
	fi
	t_rec=$(until_ms "$t0" $CRASH_BOUND probe "$V_SBX")
	if [ -n "$t_rec" ]; then
		ok "kill $KN: $t ($V_DETAIL, pid $V_PID): a capability and an exec on $V_SBX succeed again within $CRASH_BOUND s ($t_rec ms)"
	else
		notok "kill $KN: $t ($V_DETAIL, pid $V_PID): operations on $V_SBX succeed again within $CRASH_BOUND s" \
			"$(cat "$WORK/probe.cap" "$WORK/probe.out" 2>/dev/null | head -c 400; echo; tail -n +$((U0 + 1)) "$WORK/up.err" | grep '^tether' | tail -n 3)"
	fi
	# the capability taken before the kill, replayed at its node
	if [ -n "$(jx "$capf" 'd["token"]')" ]; then
		code=$(curl -s -m 20 -o "$WORK/replay.out" -w '%{http_code}' -H "Authorization: Capability $(jx "$capf" 'd["token"]')" \
			-H 'Content-Type: application/json' --data-binary "{\"cmd\":[\"sh\",\"-c\",\"echo replay >/workspace/crash-replay-k$KN\"]}" \
			"$(jx "$capf" 'd["node_url"]')/v1/sandboxes/$V_SBX/exec")
		get_file "$V_SBX" "/workspace/crash-replay-k$KN" >/dev/null 2>&1
		exists=$?
		REPLAY="replayed cap g$(jx "$capf" 'd["generation"]') a$(jx "$capf" 'd["activation"]'): $code $(jx "$WORK/replay.out" 'd.get("decision", d.get("error", "")) + " " + d.get("reason", "")' 2>/dev/null)"
		case $code in
		200) [ "$exists" = 0 ] && replay_ok=1 || replay_ok= ;;
		403 | 409 | 503) [ "$exists" = 2 ] && replay_ok=1 || replay_ok= ;;
		*) replay_ok=1 ;;
		esac
		case $t in bridge | guest) [ "$code" = 409 ] || [ "$code" = 403 ] || replay_ok= ;; esac
		[ -n "$replay_ok" ] && ok "kill $KN ($t): the capability from before it, replayed at its node: $code, and ran iff allowed" ||
			notok "kill $KN ($t): the capability from before it is refused (or ran, if its execution lives on)" "$REPLAY; marker exists: $exists"
	fi
	# the write acknowledged before the kill
	if [ -n "$word" ]; then
		got=$(get_file "$V_SBX" "/workspace/crash-k$KN" 2>&1)
		[ "$got" = "$word" ] && ok "kill $KN ($t): the write acknowledged before it reads back" ||
			notok "kill $KN ($t): the write acknowledged before it reads back" "wanted '$word', got '$got'"
	fi
	what_did "$t"
	t_set=$(until_ms "$t0" $CRASH_SETTLE settled)
	[ -n "$t_set" ] || notok "kill $KN ($t): the cluster settles within $CRASH_SETTLE s" "$(daemons_there || echo 'a daemon is missing'; cat "$WORK/workers" 2>/dev/null | head -c 300)"
	KWIN+=("$KN $t $t0 $(ms)")
	KILLS+=("$KN|$t|$V_PID|$V_DETAIL|${t_rec:-never}|${t_set:-never}|$DID; $REPLAY")
	echo "# kill $KN: $t pid $V_PID ($V_DETAIL): recovered in ${t_rec:-NEVER} ms, settled in ${t_set:-NEVER} ms; $DID; $REPLAY"
	sleep "$CRASH_GAP"
}

# crash_round R: each target in turn.
crash_round() {
	local t
	for t in $CRASH_TARGETS; do crash_one "$t" "$1"; done
}

# ---- the verdict -------------------------------------------------------------------
crash_verdict() {
	local rc out f v id w node code cur forged ex
	# churn stops (SIGINT: settle, verify every file, report)
	kill -INT "$CHURN_PID" 2>/dev/null
	for _ in $(seq 1 $((10 * (CRASH_VERIFY + 60)))); do kill -0 "$CHURN_PID" 2>/dev/null || break; sleep 0.1; done
	if kill -0 "$CHURN_PID" 2>/dev/null; then
		kill -9 "$CHURN_PID"
		notok "churn stops and verifies within $((CRASH_VERIFY + 60)) s" "$(tail -n 5 "$WORK/churn.err")"
	fi
	wait "$CHURN_PID" 2>/dev/null
	rc=$?
	CHURN_PID=
	if [ -s "$CHURN_JSON" ] && [ "$rc" -le 2 ]; then ok "churn stopped cleanly and verified (exit $rc)"; else
		notok "churn stopped cleanly and verified" "exit $rc; $(tail -n 8 "$WORK/churn.err")"; fi
	viol_detail=$(grep 'VIOLATION' "$WORK/churn.err" | head -n 8)
	for f in wrong_incarnation lost_writes stale_reads duplicated_execs phantom_ops corrupt_answers; do
		v=$(jx "$CHURN_JSON" "d['$f']")
		expect "churn: 0 $f" '[ "$v" = 0 ]' "${v:-no figure}; $viol_detail"
	done
	v=$(jx "$CHURN_JSON" 'd["unverified"]')
	expect "churn: every file verified at the end" '[ "$v" = 0 ]' "${v:-no figure} unverified"
	jx "$CHURN_JSON" '"%d operations (%.0f/s) over %.0f s, %d failed: error rate %.4f %%; migrations %d ok, %d failed; dropped connections %d; edge /healthz unanswered %d of %d checks (longest %.1f s)" % (d["operations"], d["ops_per_s"], d["seconds"], d["failed"], d["error_rate_pct"], d["migrations"]["ok"], d["migrations"]["failed"], d["dropped_connections"], d["edge_health"]["unanswered"], d["edge_health"]["checks"], d["edge_health"]["longest_unresponsive_s"])' | sed 's/^/# churn: /'
	echo "# churn failure classes:"
	jx "$CHURN_JSON" '"\n".join("%6d  %s" % (c["count"], c["class"]) for c in d["failure_classes"][:15]) or "(none)"' | sed 's/^/#   /'
	echo "# churn migration failures:"
	jx "$CHURN_JSON" '"\n".join("%6d  %s" % (c["count"], c["class"]) for c in d["migrations"]["failure_classes"][:10]) or "(none)"' | sed 's/^/#   /'
	printf '%s\n' "${KWIN[@]}" >"$WORK/windows"
	echo "# churn failures per kill window (kill .. settled):"
	$CHK windows "$WORK/churn.err" "$WORK/windows" >"$WORK/windows.out"
	sed 's/^/#   /' "$WORK/windows.out"

	# (b) no runtime record lost
	for id in "${IDS[@]}"; do until_ms "$(ms)" 30 sbx_running "$id" >/dev/null; done
	ecall "$WORK/ls.json" 0 GET /v1/sandboxes >/dev/null
	out=$($CHK records "$STATE" "$WORK/ls.json" "${IDS[@]}")
	okrc $? "no runtime record lost: every sandbox runs, its worker's record is its current execution, no other worker runs it"
	echo "$out" | sed 's/^/#   /'
	# (c) no generation reused
	out=$($CHK feed "$STATE/cp/cp.db" "${IDS[@]}")
	okrc $? "no generation reused: each sandbox's installs strictly increase (generation, activation), none repeated with other contents"
	echo "$out" | sed 's/^/#   /'
	# every write acknowledged before a kill is still there
	local bad=0 wr wid wk wword
	ex=""
	for wr in "${WRITES[@]}"; do
		IFS='|' read -r wid wk wword <<<"$wr"
		got=$(get_file "$wid" "/workspace/crash-k$wk" 2>&1)
		[ "$got" = "$wword" ] || { bad=$((bad + 1)); ex="$ex $wid:crash-k$wk='$got'"; }
	done
	expect "every write acknowledged before a kill reads back at the end (${#WRITES[@]} files)" \
		'[ "$bad" = 0 ]' "$bad wrong:$ex"

	# (d) admission: the capability from before the kills is refused and never runs
	id=${IDS[0]}
	sbx_now "$id"
	local tok=$(jx "$WORK/cap0.json" 'd["token"]') seen="" refused=1
	for node in "$(jx "$WORK/cap0.json" 'd["node_url"]')" http://127.0.0.1:$((BASE + 11)) http://127.0.0.1:$((BASE + 12)) http://127.0.0.1:$((BASE + 13)); do
		case " $seen " in *" $node "*) continue ;; esac
		seen="$seen $node"
		code=$(curl -s -m 20 -o "$WORK/attack.out" -w '%{http_code}' -H "Authorization: Capability $tok" -H 'Content-Type: application/json' \
			--data-binary '{"cmd":["sh","-c","echo attack >/workspace/crash-attack"]}' "$node/v1/sandboxes/$id/exec")
		echo "#   capability g$(jx "$WORK/cap0.json" 'd["generation"]') a$(jx "$WORK/cap0.json" 'd["activation"]') from before the kills at $node: $code $(head -c 160 "$WORK/attack.out")"
		case $code in 403 | 409) ;; *) refused= ;; esac
	done
	get_file "$id" /workspace/crash-attack >/dev/null 2>&1
	ex=$?
	expect "admission: the capability from before the kills is refused by every node (409/403), and nothing ran" \
		'[ -n "$refused" ] && [ "$ex" = 2 ]' "refused: ${refused:-no}; marker: $ex (2 = absent)"
	code=$(ecall "$WORK/honest.out" 30 POST "/v1/sandboxes/$id/exec" '{"cmd":["cat","/workspace/crash-probe"]}')
	expect "admission: an honest exec through the edge succeeds (g$S_GEN a$S_ATT on $S_WORKER)" \
		'[ "$code" = 200 ] && [ "$(jx "$WORK/honest.out" "d[\"stdout\"]")" = "probe $id" ]' "$code $(head -c 300 "$WORK/honest.out")"
	sbx_now "$id"
	forged=$($CHK forge "$tok" "$id" "$S_GEN" "$S_ATT" "$S_WORKER")
	code=$(curl -s -m 20 -o "$WORK/forged.out" -w '%{http_code}' -H "Authorization: Capability $forged" -H 'Content-Type: application/json' \
		--data-binary '{"cmd":["sh","-c","echo forged >/workspace/crash-forged"]}' "$S_NODE/v1/sandboxes/$id/exec")
	get_file "$id" /workspace/crash-forged >/dev/null 2>&1
	ex=$?
	expect "admission: a forged capability (claims of the current execution, old signature) is denied, nothing ran" \
		'[ "$code" = 403 ] && [ "$ex" = 2 ]' "$code $(head -c 200 "$WORK/forged.out"); marker $ex"
	echo "#   forged at $S_NODE: $code $(head -c 160 "$WORK/forged.out")"
	code=$(curl -s -m 20 -o "$WORK/garbage.out" -w '%{http_code}' -H "Authorization: Capability v4.public.garbage" -H 'Content-Type: application/json' \
		--data-binary '{"cmd":["true"]}' "$S_NODE/v1/sandboxes/$id/exec")
	expect "admission: a garbage capability is denied (403)" '[ "$code" = 403 ]' "$code $(head -c 200 "$WORK/garbage.out")"
	code=$(curl -s -m 20 -o "$WORK/badkey.out" -w '%{http_code}' -H "Authorization: Bearer not-a-key" -H 'Content-Type: application/json' \
		--data-binary '{"cmd":["true"]}' "$EDGE/v1/sandboxes/$id/exec")
	expect "admission: a wrong API key at the edge is refused (401)" '[ "$code" = 401 ]' "$code $(head -c 200 "$WORK/badkey.out")"

	# the table
	echo "# kills (ms from the kill until a capability and an exec on the sandbox succeed through the edge):"
	printf '%s\n' "${KILLS[@]}" | awk -F'|' '{ printf "#   %2s  %-9s pid %-7s %-8s settled %-7s %s: %s\n", $1, $2, $3, $5, $6, $4, $7 }'
}
# sbx_running ID: the cp says ID runs.
sbx_running() { sbx_now "$1" && [ "$S_STATE" = running ]; }

# crash_cleanup: deletes the sandboxes (so the cluster's stop has nothing to pause).
crash_cleanup() {
	local id pids=()
	for id in "${IDS[@]}"; do
		timeout 30 build/tether rm "$id" >/dev/null 2>&1 &
		pids+=($!)
	done
	wait "${pids[@]}"
}

# ---- a node-api killed between its manager's apply of a pause and the ack ----------
# crash_pause_ack: deterministic, without load. A sandbox on w1 with a
# snapshot (paused and resumed once), then a write acknowledged after that
# snapshot and a 150 MB file (so the next pause takes a moment); a pause;
# node-api is stopped (SIGSTOP) as soon as the manager begins it and killed
# once the manager has published the snapshot, so the manager's answer
# never reaches the cp. The restarted node-api must let the cp learn it:
# the pause ends with that snapshot, and the write survives a resume
# elsewhere. (Before the fix in src/node/feed.c the cp heard nothing until
# the pause timed out, 30 s, and failed the sandbox; a resume then restored
# the older snapshot, without the write.)
crash_pause_ack() {
	local id np l0 g t0 t_p st sg
	id=$(timeout 60 build/tether create --worker w1 2>"$WORK/pa.err")
	[ -n "$id" ] || { notok "pause/ack case: a sandbox on w1" "$(cat "$WORK/pa.err")"; return; }
	put_file "$id" /workspace/pa "one" &&
		[ "$(ecall "$WORK/pa.out" 30 POST "/v1/sandboxes/$id/pause" '{}')" = 200 ] &&
		[ "$(ecall "$WORK/pa.out" 30 POST "/v1/sandboxes/$id/resume" '{"worker":"w1"}')" = 200 ] &&
		put_file "$id" /workspace/pa "two, acknowledged after the last snapshot" &&
		[ "$(ecall "$WORK/pa.out" 60 POST "/v1/sandboxes/$id/exec" '{"cmd":["sh","-c","head -c 150000000 /dev/urandom >/workspace/big"]}')" = 200 ] ||
		{ notok "pause/ack case: setup" "$(head -c 300 "$WORK/pa.out")"; return; }
	sbx_now "$id"
	g=$S_GEN np=$(pid_node w1) l0=$(wc -l <"$STATE/logs/w1.log")
	ecall "$WORK/pa.out" 0 POST "/v1/sandboxes/$id/pause?wait=0" >/dev/null
	for _ in $(seq 1 200); do
		tail -n +$((l0 + 1)) "$STATE/logs/w1.log" | grep -q "pausing $id generation $g" && break
		sleep 0.05
	done
	kill -STOP "$np"
	for _ in $(seq 1 300); do
		tail -n +$((l0 + 1)) "$STATE/logs/w1.log" | grep -q "paused $id generation $g" && break
		sleep 0.1
	done
	t0=$(ms)
	kill -9 "$np"
	t_p=$(until_ms "$t0" 10 sbx_paused_at "$id" "$g")
	sbx_now "$id"
	st=$S_STATE sg=$(jx "$WORK/sbx.$id" '(d.get("snapshot") or {}).get("generation")')
	[ -n "$t_p" ] && ok "node-api killed after its manager paused $id (g$g) but before the ack: paused with the snapshot of g$g within 10 s (${t_p} ms; the pause times out at 30 s)" ||
		notok "node-api killed between a pause's apply and its ack: the pause ends with that snapshot within 10 s" \
			"state $st, snapshot of generation $sg (wanted $g); $(grep -h "$id" "$STATE/logs/cp.log" | tail -n 4)"
	echo "# pause/ack case: $(tail -n +$((l0 + 1)) "$STATE/logs/w1.log" | grep -o "pause of $id generation $g.*answered from the store" | head -n 1)"
	ecall "$WORK/pa.out" 30 POST "/v1/sandboxes/$id/resume" '{"worker":"w2"}' >/dev/null
	got=$(get_file "$id" /workspace/pa 2>&1)
	[ "$got" = "two, acknowledged after the last snapshot" ] && ok "... and the write acknowledged after the older snapshot survives a resume on w2" ||
		notok "pause/ack case: the write acknowledged after the older snapshot survives" "got '$got'; $(head -c 300 "$WORK/pa.out")"
	timeout 30 build/tether rm "$id" >/dev/null 2>&1
}
# sbx_paused_at ID G: the cp says ID is paused with the snapshot of generation G.
sbx_paused_at() { sbx_now "$1" && [ "$S_STATE" = paused ] && [ "$(jx "$WORK/sbx.$1" '(d.get("snapshot") or {}).get("generation")')" = "$2" ]; }

#!/bin/bash
# Runs the test suites and ends with "N passed, N failed". Every suite speaks
# TAP ("ok N - name" / "not ok N - name"); a suite that exits non-zero
# without reporting a failing case counts as one failure.
# usage: run-tests.sh all|unit|asan|fuzz|integration [BUILD]
set -u
cd "$(dirname "$0")/.."
what=${1:-all}
build=${2:-build}
passed=0
failed=0
failures=()
log_dir=$(mktemp -d /tmp/tether-tests.XXXXXX)

# suite_log NAME: where a suite's output goes.
suite_log() { echo "$log_dir/$(echo "$1" | tr '/ ' '__').log"; }

# tally NAME RC SECONDS: counts a finished suite's TAP lines.
tally() {
	local name=$1 rc=$2 secs=$3 out ok notok
	out=$(suite_log "$name")
	ok=$(grep -cE '^ok [0-9]+' "$out")
	notok=$(grep -cE '^not ok [0-9]+' "$out")
	if [ "$rc" -ne 0 ] && [ "$notok" -eq 0 ]; then
		notok=1
	fi
	passed=$((passed + ok))
	failed=$((failed + notok))
	if [ "$notok" -gt 0 ]; then
		failures+=("$name")
		echo "FAIL $name ($ok ok, $notok failed, exit $rc, ${secs} s); log: $out"
		# the failing cases first (each with its detail lines), then the rest
		awk '/^not ok/ { show = 1; n = 0; print; next }
		     /^ok / { show = 0; next }
		     show && /^#/ && n < 12 { print; n++ }' "$out" | head -n 40 | sed 's/^/    /'
		grep -E 'ERROR|Assert|runtime error|AddressSanitizer' "$out" | head -n 10 | sed 's/^/    /'
	else
		echo "ok   $name ($ok, ${secs} s)"
	fi
}

# run_suite NAME CMD...: runs one suite now, counts its TAP lines.
run_suite() {
	local name=$1 rc=0 t0=$SECONDS
	shift
	"$@" >"$(suite_log "$name")" 2>&1 || rc=$?
	tally "$name" "$rc" $((SECONDS - t0))
}

# A pool of suites running at once (most integration suites spend their
# time waiting on daemons, sandboxes and timeouts, not on the CPU). Each
# finished suite is counted as it ends.
pool_max=1
declare -A pool_name=() pool_t0=()
# pool_reap: waits for one suite of the pool and counts it.
# (A background suite ending meanwhile is skipped: bg_finish counts it
# from its .rc file.)
pool_reap() {
	local pid rc
	while :; do
		pid= rc=0
		wait -n -p pid || rc=$?
		[ -n "$pid" ] || return 1
		[ -n "${pool_name[$pid]+set}" ] && break
	done
	tally "${pool_name[$pid]}" "$rc" $((SECONDS - pool_t0[$pid]))
	unset "pool_name[$pid]" "pool_t0[$pid]"
}
# pool_run NAME CMD...: starts a suite once fewer than pool_max run.
pool_run() {
	local name=$1
	shift
	while [ "${#pool_name[@]}" -ge "$pool_max" ]; do pool_reap || break; done
	"$@" >"$(suite_log "$name")" 2>&1 &
	pool_name[$!]=$name
	pool_t0[$!]=$SECONDS
}
# pool_drain: waits for every suite of the pool.
pool_drain() {
	while [ "${#pool_name[@]}" -gt 0 ]; do pool_reap || break; done
}

# Suites marked "# tether-test: background" spend most of their time
# waiting (a capability lifetime to run out): they start first, run beside
# the others and are counted at the end.
bg_names=()
bg_pids=()
bg_start=()
# run_background NAME CMD...: starts a suite; bg_finish counts it.
run_background() {
	local name=$1 out
	shift
	out=$(suite_log "$name")
	( rc=0; "$@" >"$out" 2>&1 || rc=$?; echo "$rc" >"$out.rc" ) &
	bg_names+=("$name")
	bg_pids+=($!)
	bg_start+=("$SECONDS")
}
# bg_finish: waits for the background suites and counts them.
bg_finish() {
	local i out
	for i in "${!bg_pids[@]}"; do
		wait "${bg_pids[$i]}" 2>/dev/null
		out=$(suite_log "${bg_names[$i]}")
		tally "${bg_names[$i]}" "$(cat "$out.rc" 2>/dev/null || echo 1)" \
			$((SECONDS - bg_start[i]))
	done
}

# Unit suites that make sandboxes and cgroups under fixed names (test_ns,
# test_manager) hold one lock, so the plain and the ASan build never run
# them at once (nor two checkouts on one host).
NS_LOCK=/tmp/tether-ns-tests.lock
# unit_one BIN: one unit suite, under the lock when it needs it.
unit_one() {
	case $(basename "$1") in
	test_ns|test_manager) CMOCKA_MESSAGE_OUTPUT=TAP flock "$NS_LOCK" "$1" ;;
	*) CMOCKA_MESSAGE_OUTPUT=TAP "$1" ;;
	esac
}
unit_suites() {
	local dir=$1 label=$2 t
	for t in "$dir"/tests/test_*; do
		[ -x "$t" ] || continue
		pool_run "$label/$(basename "$t")" unit_one "$t"
	done
}

# fuzz_suite BIN: runs a fuzzer briefly over its committed corpus (read-only:
# new inputs go to a scratch directory) and reports one TAP line.
fuzz_one() {
	local bin=$1 name corpus scratch
	name=$(basename "$bin")
	corpus=fuzz/corpus/${name#fuzz_}
	scratch=$(mktemp -d)
	if "$bin" -max_total_time="${FUZZ_SECONDS:-3}" -timeout=5 -rss_limit_mb=1024 \
		-print_final_stats=0 "$scratch" "$corpus" >"$scratch.log" 2>&1; then
		echo "ok 1 - $name"
	else
		tail -n 30 "$scratch.log"
		echo "not ok 1 - $name"
	fi
	rm -rf "$scratch" "$scratch.log"
}

# mark SCRIPT WORD: the suite carries "# tether-test: WORD".
mark() { grep -q "^# tether-test: $2" "$1"; }

# How many suites run at once: TT_JOBS, else one per CPU for unit suites and
# fuzzers, and one integration suite (TT_JOBS=3 runs three: they mostly
# wait; not yet the default until CI proves it). Marks on an
# integration suite: "background" (above), "slow" (started first, so the
# long ones do not end the run alone), "alone" (its figures need the
# machine: run after the others, with nothing beside it but background
# suites).
cpus=$(nproc 2>/dev/null || echo 2)
pool_max=${TT_JOBS:-$cpus}
case $what in
all|unit) unit_suites "$build" unit ;;
esac
case $what in
all|asan) unit_suites build-asan asan ;;
esac
case $what in
all|fuzz)
	for f in build-fuzz/fuzz_*; do
		[ -x "$f" ] && pool_run "fuzz/$(basename "$f")" fuzz_one "$f"
	done ;;
esac
pool_drain
case $what in
all|integration)
	pool_max=${TT_JOBS:-1}
	ints=(tests/integration/test_*.sh)
	for t in "${ints[@]}"; do
		mark "$t" background && run_background "integration/$(basename "$t" .sh)" bash "$t"
	done
	for t in "${ints[@]}"; do
		mark "$t" slow && ! mark "$t" background && ! mark "$t" alone &&
			pool_run "integration/$(basename "$t" .sh)" bash "$t"
	done
	for t in "${ints[@]}"; do
		! mark "$t" slow && ! mark "$t" background && ! mark "$t" alone &&
			pool_run "integration/$(basename "$t" .sh)" bash "$t"
	done
	pool_drain
	for t in "${ints[@]}"; do
		mark "$t" alone && ! mark "$t" background &&
			run_suite "integration/$(basename "$t" .sh)" bash "$t"
	done
	bg_finish ;;
esac

echo
[ ${#failures[@]} -gt 0 ] && echo "failed suites: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

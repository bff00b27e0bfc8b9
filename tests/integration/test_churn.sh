#!/bin/bash
# tether-test: slow
# The short churn run (issue 12): a `tether up --workers 3` cluster, 6
# sandboxes spread over the workers, and build/churn for 40 s through the
# edge: 5 client threads of mixed exec / file read / file write / append /
# CLI exec, each checked against an exact model of what the client was
# acknowledged, while a migrate loop moves the sandboxes continuously; then a
# last verification of every file and append log. Checks: 0 wrong-
# incarnation answers, 0 lost acknowledged writes, 0 stale reads, 0
# duplicated executions (and 0 phantom operations / corrupt answers), and
# migrations at least once a second. The error rate and the failure classes
# are printed as comments; the error rate fails the test only when
# CHURN_MAX_ERROR_RATE (percent, e.g. 0.0001) is set, since the transitions
# are still surfaced to clients today. CHURN_TEST_SECONDS overrides the 40 s;
# CHURN_UPLOAD_KEEPALIVE=1 sends the file PUTs on keep-alive connections too
# (see scripts/churn.sh: today's edge stops answering after those).
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-churn-test
T=$ROOT/build/tether
SECS=${CHURN_TEST_SECONDS:-40}
CHURN_MAX_ERROR_RATE=${CHURN_MAX_ERROR_RATE:-}

[ -x build/churn ] || tap_bail "build/churn is built" "run make all"
cluster_up_or_bail "cluster up (3 workers)" 3
export TETHER_URL=http://127.0.0.1:$((BASE + 1))
TETHER_API_KEY=$(cluster_key)
export TETHER_API_KEY

ids=()
for i in 0 1 2 3 4 5; do
	id=$("$T" create --worker "w$((i % 3 + 1))" 2>>"$WORK/create.err")
	[ -n "$id" ] && ids+=("$id")
done
[ ${#ids[@]} = 6 ] || tap_bail "6 sandboxes created on w1..w3" "$(cat "$WORK/create.err")"
ok "6 sandboxes created on w1..w3"

upload=(--fresh-upload-connections)
[ "${CHURN_UPLOAD_KEEPALIVE:-1}" = 1 ] && upload=()
J=$WORK/churn.json
# bounded: the run, then at most ~15 s of settling and verification, and
# 15 s per call (a wedged daemon cannot hold the script)
timeout $((SECS + 90)) build/churn --seconds "$SECS" --workers w1,w2,w3 --json "$J" \
	--progress 0 --timeout 15 --verify-seconds 15 "${upload[@]}" "${ids[@]}" \
	>"$WORK/churn.out" 2>"$WORK/churn.err"
rc=$?
# exit 0 (clean), 1 (violations) and 2 (error rate) all produce the figures
if [ -s "$J" ] && [ "$rc" -le 2 ]; then
	ok "harness ran ($SECS s, exit $rc)"
else
	tap_bail "harness ran ($SECS s)" "exit $rc; $(tail -n 8 "$WORK/churn.err")"
fi

# field EXPR: a value of the JSON summary (python, over d).
field() { jget "$1" <"$J"; }
for f in wrong_incarnation lost_writes stale_reads duplicated_execs phantom_ops \
	corrupt_answers operations failed migrations_ok; do
	case $f in
	migrations_ok) v=$(field 'd["migrations"]["ok"]') ;;
	*) v=$(field "d[\"$f\"]") ;;
	esac
	printf -v "v_$f" '%s' "$v"
done
viol_detail=$(grep 'VIOLATION' "$WORK/churn.err" | head -n 8)
expect "0 wrong-incarnation answers" '[ "$v_wrong_incarnation" = 0 ]' \
	"$v_wrong_incarnation; $viol_detail"
expect "0 lost acknowledged writes" '[ "$v_lost_writes" = 0 ]' "$v_lost_writes; $viol_detail"
expect "0 stale reads" '[ "$v_stale_reads" = 0 ]' "$v_stale_reads; $viol_detail"
expect "0 duplicated executions" '[ "$v_duplicated_execs" = 0 ]' \
	"$v_duplicated_execs; $viol_detail"
expect "0 phantom operations, 0 corrupt answers" \
	'[ "$v_phantom_ops" = 0 ] && [ "$v_corrupt_answers" = 0 ]' \
	"phantom $v_phantom_ops, corrupt $v_corrupt_answers; $viol_detail"
run_s=$(field 'd["seconds"]')
expect "migrations happened (>= 1/s on average)" \
	"python3 -c 'import sys; sys.exit(0 if $v_migrations_ok >= $run_s else 1)'" \
	"$v_migrations_ok migrations in $run_s s; $(field 'd["migrations"]["failure_classes"]')"

# the figures, as comments
field '"%d operations (%.0f/s), %d failed: error rate %.6f %%" % (d["operations"], d["ops_per_s"], d["failed"], d["error_rate_pct"])' | sed 's/^/# /'
field '"migrations: %d ok, %d failed, p50 %.1f ms, p99 %.1f ms" % (d["migrations"]["ok"], d["migrations"]["failed"], d["migrations"]["p50_ms"], d["migrations"]["p99_ms"])' | sed 's/^/# /'
field '"overlapping a migration: %d ops (%d failed), p99 %.1f ms (goal: <= migration p99 + 50 ms, none failed: %s)" % (d["latency"]["overlap_ops"], d["latency"]["overlap_failed"], d["latency"]["overlap_p99_ms"], "met" if d["latency"]["goal_met"] else "not met")' | sed 's/^/# /'
field '"dropped client connections %d; edge /healthz unanswered %d of %d checks; unverified files %d" % (d["dropped_connections"], d["edge_health"]["unanswered"], d["edge_health"]["checks"], d["unverified"])' | sed 's/^/# /'
field '"violations on sandboxes resumed from their last snapshot after a failed migration: %d" % d["violations_after_recovery"]' | sed 's/^/# /'
echo "# failure classes:"
field '"\n".join("%8d  %s" % (c["count"], c["class"]) for c in d["failure_classes"][:12]) or "(none)"' | sed 's/^/#   /'

echo "# migration failures:"
field '"\n".join("%8d  %s" % (c["count"], c["class"]) for c in d["migrations"]["failure_classes"]) or "(none)"' | sed 's/^/#   /'
grep -h '^churn: .*migrate .* failed\|^churn: .* resumed on' "$WORK/churn.err" | head -n 6 | sed 's/^/#   /'

if [ -n "$CHURN_MAX_ERROR_RATE" ]; then
	rate=$(field 'd["error_rate_pct"]')
	expect "error rate <= CHURN_MAX_ERROR_RATE ($CHURN_MAX_ERROR_RATE %)" \
		"python3 -c 'import sys; sys.exit(0 if $rate <= $CHURN_MAX_ERROR_RATE else 1)'" \
		"error rate $rate %"
fi
tap_done

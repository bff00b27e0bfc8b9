#!/bin/bash
# The churn proof suite (issue 12) on a cluster of its own: starts `tether up
# --workers 3` on free ports in a scratch state dir, creates 6 sandboxes
# spread over the 3 workers, runs build/churn against the edge (mixed client
# operations while a migrate loop moves the sandboxes continuously), prints
# its summary, then stops the cluster.
#
# usage: scripts/churn.sh [SECONDS | --ops N] [build/churn options...]
#   default 60 s. `make churn` runs the long version (--ops 1000000).
# Environment: CHURN_SANDBOXES (6), CHURN_WORKERS (3), CHURN_JSON=FILE (keep
# the JSON summary there), KEEP=1 (keep the scratch dir: state, logs),
# CHURN_UPLOAD_KEEPALIVE (default 1, see below).
#
# CHURN_UPLOAD_KEEPALIVE=1 (the default) sends file PUTs on kept-alive
# connections like every other call; 0 sends each on a connection of its own
# (build/churn --fresh-upload-connections: the edge once spun at 100 % CPU
# after a refused upload on a kept-alive connection; fixed, see
# tests/integration/test_transitions.sh).
# Exit status: build/churn's (0 ok, 1 safety violations, 2 error rate above
# --max-error-rate, 3 setup), or 3 when the cluster does not come up.
set -u
. "$(dirname "$0")/../tests/integration/lib.sh"

run=(--seconds 60)
case ${1:-} in
--ops) run=(--ops "${2:?--ops needs a count}"); shift 2 ;;
'' | -*) ;;
*) run=(--seconds "$1"); shift ;;
esac
nsbx=${CHURN_SANDBOXES:-6}
nwk=${CHURN_WORKERS:-3}
T=$ROOT/build/tether

[ -x build/churn ] && [ -x build/tether ] || {
	echo "churn.sh: build/churn or build/tether missing (make all)" >&2
	exit 3
}
cluster_setup tether-churn
if ! cluster_up "$nwk"; then
	echo "churn.sh: the cluster did not come up" >&2
	cat "$WORK/up.err" >&2
	tail -n 5 "$STATE"/logs/*.log >&2 2>/dev/null
	exit 3
fi
export TETHER_URL=http://127.0.0.1:$((BASE + 1))
TETHER_API_KEY=$(cluster_key)
export TETHER_API_KEY
workers=$(seq -s, -f 'w%g' 1 "$nwk")
echo "churn.sh: cluster up (edge $TETHER_URL, state $STATE)"

ids=()
for i in $(seq 0 $((nsbx - 1))); do
	id=$("$T" create --worker "w$((i % nwk + 1))" 2>"$WORK/create.err")
	if [ -z "$id" ]; then
		echo "churn.sh: create on w$((i % nwk + 1)) failed: $(cat "$WORK/create.err")" >&2
		exit 3
	fi
	ids+=("$id")
done
echo "churn.sh: ${#ids[@]} sandboxes on $workers"

edge_pid=$(pgrep -f "tetherd edge --listen 127.0.0.1:$((BASE + 1)) " | head -n1)
# edge_cpu_s: the edge's CPU time so far, in seconds.
edge_cpu_s() {
	[ -n "$edge_pid" ] && [ -r "/proc/$edge_pid/stat" ] || { echo "?"; return; }
	awk -v hz="$(getconf CLK_TCK)" '{ printf "%.1f", ($14 + $15) / hz }' "/proc/$edge_pid/stat"
}
upload=(--fresh-upload-connections)
[ "${CHURN_UPLOAD_KEEPALIVE:-1}" = 1 ] && upload=()
json=${CHURN_JSON:-$WORK/churn.json}
t0=$(date +%s)
build/churn --workers "$workers" --json "$json" "${upload[@]}" "${run[@]}" "$@" "${ids[@]}"
rc=$?
echo "churn.sh: build/churn exited $rc after $(($(date +%s) - t0)) s; edge CPU $(edge_cpu_s) s"
if curl -sf -m 5 "$TETHER_URL/healthz" >/dev/null; then
	echo "churn.sh: edge /healthz answers"
else
	echo "churn.sh: edge /healthz does NOT answer (5 s)"
fi
rms=()
for id in "${ids[@]}"; do
	timeout 20 "$T" rm "$id" >/dev/null 2>&1 &
	rms+=($!)
done
wait "${rms[@]}"
exit "$rc"

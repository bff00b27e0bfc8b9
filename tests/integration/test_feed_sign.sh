#!/bin/bash
# The signed feed (SPEC §7, issue 13 item 1): the root sbx-manager applies
# only updates signed by the control plane's feed key, for its own worker,
# in order; node-api (or anyone on the path) relays them and cannot forge.
# - A bare manager, fed over its real unix socket (SO_PEERCRED: the probe
#   is its peer, as node-api is), with signatures from the real signer
#   (tests/integration/feed_sign_probe.py): an unsigned update, one signed
#   with another key, one changed in transit, relabelled, for another
#   worker, reordered, and a replay with other content are each refused
#   (not applied, applied_rev unchanged, reason in the result); the honest
#   updates are applied and a sandbox runs an exec; a plain replay is
#   answered from the record; a capability under the attacker's key is
#   denied; the manager refuses to start without a feed key, or with
#   another one than it was provisioned with.
# - A cluster (`tether up`): workers are provisioned with the cp's
#   feed.pub, and a sandbox is created and runs through the signed feed.
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-feed-sign
T() { timeout 60 "$ROOT/build/tether" "$@"; }
if [ "$(id -u)" != 0 ]; then skip "signed feed" "needs root"; tap_done; exit; fi

# ---- a bare manager, forged updates over its socket -----------------------
mkdir -p "$WORK/probe"
python3 "$ROOT/tests/integration/feed_sign_probe.py" "$ROOT" "$WORK/probe" >"$WORK/probe.out" 2>"$WORK/probe.err"
while IFS= read -r line; do
	case "$line" in
	PASS\ *) ok "${line#PASS }" ;;
	FAIL\ *) rest=${line#FAIL }; notok "${rest%% | *}" "${rest#* | }" ;;
	esac
done <"$WORK/probe.out"
expect "the probe ran to its end" 'grep -q "pinned key holds" "$WORK/probe.out"' \
	"$(tail -n 5 "$WORK/probe.err"; tail -n 5 "$WORK/probe/manager.log")"
expect "the manager logged each refusal" \
	'[ "$(grep -c "feed update refused" "$WORK/probe/manager.log")" -ge 7 ]' \
	"$(grep "refused" "$WORK/probe/manager.log" | head -n 3)"

# ---- a cluster: provisioned with the cp's feed key, end to end ---------------------
cluster_up_or_bail "a cluster comes up with signed feeds" 1
expect "the worker's manager pinned the cp's feed key" \
	'cmp -s "$STATE/cp/feed.pub" "$STATE/workers/w1/feed.pub"' \
	"$(cat "$STATE/cp/feed.pub" "$STATE/workers/w1/feed.pub" 2>&1)"
expect "the feed key is not the capability key, and only the signer holds it" \
	'[ "$(stat -c %a "$STATE/cp/feed.key")" = 600 ] && ! cmp -s "$STATE/cp/feed.key" "$STATE/cp/signer.key"' ""
ID=$(T create --worker w1 2>"$WORK/err")
out=$(T exec "$ID" -- sh -c 'echo signed' 2>&1)
expect "create and exec through the signed feed" '[ "$out" = signed ]' "$ID: $out $(cat "$WORK/err")"
T rm "$ID" >/dev/null 2>&1
expect "... and rm" '! T info "$ID" >/dev/null 2>&1' ""
expect "no update was refused on the honest path" \
	'! grep -q "refused" "$STATE"/logs/w1.log "$STATE"/logs/cp.log' \
	"$(grep refused "$STATE"/logs/*.log | head -n 3)"
cluster_down
tap_done

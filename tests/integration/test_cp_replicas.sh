#!/usr/bin/env bash
# Two control-plane replicas on one PostgreSQL (a server this script starts
# and stops: scripts/pgtest.sh), behind the edge, under load: four clients
# each cycle exec (a write), capability, pause, resume or migrate, and read
# back after each resume what they wrote before the pause. Meanwhile each
# replica is killed with SIGKILL in turn (`tether up` restarts it). Then:
# no generation was allocated twice or skipped (the database's installs
# of every sandbox are exactly 1..N), the feed's revs have no gap, every
# acknowledged lifecycle call holds (generations and final states as
# acknowledged, writes read back), the feed goes on (workers acknowledge
# everything, a new sandbox runs), and the clients saw nothing but the
# documented failover errors (docs/API.md "Control-plane replicas").
# Then a repeated call under one Idempotency-Key, on the other replica,
# waits for what the first started instead of starting another.
# shellcheck source=tests/integration/lib.sh
. "$(dirname "$0")/lib.sh"

cluster_setup tt-replicas
if ! PG=$(scripts/pgtest.sh start "$WORK/pg" 2>"$WORK/pg.err"); then
	if grep -q "not installed" "$WORK/pg.err"; then
		skip "PostgreSQL" "not installed (scripts/deps.sh)"
		tap_done
		exit
	fi
	tap_bail "a PostgreSQL server starts" "$(cat "$WORK/pg.err")"
fi
at_exit "scripts/pgtest.sh stop '$WORK/pg'"
ok "a PostgreSQL server starts"
psqlq() { psql "$PG" -Atqc "$1"; }

cluster_up_or_bail "tether up --cp-replicas 2 --db postgresql://…" 2 --cp-replicas 2 --db "$PG"
KEY=$(cat "$STATE/cp/admin.key")
CP2=http://127.0.0.1:$((BASE + 2))
EDGE=http://127.0.0.1:$((BASE + 1))
export TETHER_URL=$EDGE TETHER_API_KEY=$KEY
expect "both replicas answer, on one database" \
	'[ "$(curl -s -m 5 -H "Authorization: Bearer $KEY" "$CP/v1/workers" | jget "len(d[\"workers\"])")" = 2 ] &&
	 [ "$(curl -s -m 5 -H "Authorization: Bearer $KEY" "$CP2/v1/workers" | jget "len(d[\"workers\"])")" = 2 ]' \
	"$(tail -n 5 "$STATE"/logs/cp*.log)"

# pid_on PORT: the process listening there.
pid_on() { ss -ltnpH "sport = :$1" | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2; }

python3 tests/integration/replicas_load.py "$EDGE" "$KEY" 24 4 "$WORK/load.json" &
LOAD=$!
at_exit "kill $LOAD 2>/dev/null"
sleep 5
p1=$(pid_on "$BASE")
kill -KILL "$p1" && echo "# killed replica 1 (pid $p1) at $(date +%T.%N | cut -c1-12)"
sleep 8
p2=$(pid_on $((BASE + 2)))
kill -KILL "$p2" && echo "# killed replica 2 (pid $p2) at $(date +%T.%N | cut -c1-12)"
wait "$LOAD"
expect "the load ran to its end" '[ -s "$WORK/load.json" ]' ""

# What the clients saw: the acknowledged results, reads, failures.
python3 - "$WORK/load.json" >"$WORK/verdict" <<'EOF'
import json, sys
out = json.load(open(sys.argv[1]))
bad, fails, acks = [], [], 0
# docs/API.md "Control-plane replicas": what a client may see while a
# replica dies (the edge retries everything else on the other one)
documented = ("control plane did not answer",)
for i, c in enumerate(out):
    if c is None or c["sbx"] is None:
        bad.append("client %d made no sandbox: %s" % (i, c and c["failures"]))
        continue
    gens = [a["generation"] for a in c["acks"]]
    acks += len(c["acks"])
    for a, b in zip(c["acks"], c["acks"][1:]):
        if b["op"] in ("resume", "migrate") and b["generation"] <= a["generation"]:
            bad.append("%s: %s acknowledged generation %d after %d" % (c["sbx"], b["op"], b["generation"], a["generation"]))
        if b["op"] == "pause" and b["generation"] < a["generation"]:
            bad.append("%s: pause of generation %d after %d" % (c["sbx"], b["generation"], a["generation"]))
    if c["read_mismatch"]:
        bad.append("%s: acknowledged writes lost: %s" % (c["sbx"], c["read_mismatch"][:2]))
    last = c["acks"][-1]
    fin = c.get("final", {})
    if fin.get("generation", 0) < last["generation"]:
        bad.append("%s: final generation %s below the acknowledged %d" % (c["sbx"], fin.get("generation"), last["generation"]))
    if not c["failures"] or c["failures"][-1]["at"] < 0:
        pass
    for f in c["failures"]:
        msg = json.dumps(f["body"])
        fails.append(f)
        if not any(d in msg for d in documented):
            bad.append("%s: undocumented failure of %s: %s %s" % (c["sbx"], f["op"], f["status"], msg[:200]))
    if len(c["acks"]) < 4:
        bad.append("%s: only %d acknowledged calls" % (c["sbx"], len(c["acks"])))
print("acks=%d failures=%d" % (acks, len(fails)))
for b in bad:
    print("BAD " + b)
EOF
echo "# $(head -n 1 "$WORK/verdict")"
expect "every acknowledged lifecycle call holds; only documented failover errors" \
	'! grep -q "^BAD" "$WORK/verdict"' "$(grep "^BAD" "$WORK/verdict")"

# The database: every sandbox's installs (not the re-asks of one) are its
# generations 1..N exactly once, N its generation now; feed revs 1..max.
psqlq "SELECT s.id, s.generation, string_agg((f.body::json->>'generation'), ',' ORDER BY f.rev)
       FROM sandboxes s JOIN feed f ON f.kind='install' AND f.body::json->>'sandbox'=s.id
       AND coalesce(f.body::json->>'again','false')<>'true' GROUP BY s.id, s.generation" >"$WORK/gens"
expect "no generation allocated twice or skipped (installs are 1..N)" \
	'[ -s "$WORK/gens" ] && awk -F"|" "{ n=split(\$3, g, \",\"); if (n != \$2) exit 1;
	   for (i = 1; i <= n; i++) if (g[i] != i) exit 1 }" "$WORK/gens"' "$(cat "$WORK/gens")"
expect "feed revs have no gap" \
	'[ "$(psqlq "SELECT count(*) = max(rev) AND min(rev) = 1 FROM feed")" = t ]' \
	"$(psqlq "SELECT count(*), min(rev), max(rev) FROM feed")"

# The feed goes on: both workers acknowledge every update, a new sandbox runs.
caught_up() {
	[ "$(psqlq "SELECT count(*) FROM workers w WHERE w.acked_rev < (SELECT max(rev)
	  FROM feed f WHERE f.worker IS NULL OR f.worker = w.id)")" = 0 ]
}
check "the workers acknowledge every update" wait_until 300 caught_up
sbx=$(timeout 60 build/tether create 2>&1) && out=$(timeout 30 build/tether exec "$sbx" -- echo fresh 2>&1)
expect "a sandbox created after the kills runs" '[ "$out" = fresh ]' "$sbx $out"
kills=$(grep -c "restarting\|restarted\|died" "$WORK/up.err" "$WORK/up.out" 2>/dev/null | awk -F: '{s += $2} END {print s + 0}')
echo "# tether up reported $kills restarts; edge cp failovers: $(metric "$EDGE" tether_edge_cp_failovers_total)"

# Idempotency-Key: the call repeated on the other replica (as the edge does
# when an answer is lost) waits for the sandbox the first one created.
n0=$(psqlq "SELECT count(*) FROM sandboxes")
c1=$(req_status POST "$CP/v1/sandboxes" "Bearer $KEY" '{}' ; echo " $(jfield '["id"]')")
c2=$(curl -s -m 60 -o "$WORK/c2" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-H 'Content-Type: application/json' -H 'Idempotency-Key: test-key-1' -d '{}' "$CP/v1/sandboxes")
c3=$(curl -s -m 60 -o "$WORK/c3" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-H 'Content-Type: application/json' -H 'Idempotency-Key: test-key-1' -d '{}' "$CP2/v1/sandboxes")
id2=$(jfield '["id"]' "$WORK/c2") id3=$(jfield '["id"]' "$WORK/c3")
n1=$(psqlq "SELECT count(*) FROM sandboxes")
expect "a create repeated under its Idempotency-Key on the other replica: one sandbox" \
	'[ "${c1%% *}" = 201 ] && [ "$c2" = 201 ] && [ "$c3" = 201 ] && [ "$id2" = "$id3" ] && [ "$n1" = $((n0 + 2)) ]' \
	"c1=$c1 c2=$c2 c3=$c3 $id2 $id3 n0=$n0 n1=$n1"
st=$(curl -s -m 60 -o "$WORK/c4" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-H 'Idempotency-Key: test-key-1' -X POST "$CP2/v1/sandboxes/$id2/pause")
expect "the same key for another call is refused (422), nothing paused" \
	'[ "$st" = 422 ] && [ "$(psqlq "SELECT state FROM sandboxes WHERE id='"'"'$id2'"'"'")" = running ]' \
	"$st $(cat "$WORK/c4")"
tap_done

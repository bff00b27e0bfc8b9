#!/usr/bin/env python3
"""Checks for the crash-safety proof suite (tests/integration/crash_lib.sh;
test-only). Each mode prints what it found, one line per item; the exit
status says whether the invariant held (0) or not (1).

  feed CPDB ID...        no generation reused: for each sandbox, its
        `install` updates in the cp's feed, in revision order, name strictly
        increasing (generation, activation) pairs (a new generation, or the
        same generation re-activated in place with a higher activation on
        the same worker); an identical (sandbox, generation, activation)
        installed again with the very same contents is counted, one with
        different contents is a violation; the last install is what the cp
        records now. Prints one line per sandbox ("ok ..." / "BAD ...").
  records STATE SBXJSON ID...   no runtime record lost: every sandbox the
        cp lists (SBXJSON: GET /v1/sandboxes) is running, or paused with a
        complete snapshot (resumable); its worker's runtime.db has its
        current generation and activation, running, not retired, with its
        init and bridge alive; no other worker runs it. One line each.
  windows CHURNERR KILLS  churn's failures (--verbose lines) per kill
        window. KILLS: lines "N TARGET T0_MS T1_MS" (epoch ms). Prints one
        line per window: "N TARGET FAILED CLASS=COUNT;..." and a last line
        "outside FAILED CLASS=COUNT;...".
  forge TOKEN SBX GEN ATT WRK   TOKEN's claims rewritten to name that
        execution (fresh iat/exp), its signature kept: a forgery.
  token FIELD CAPJSON     a field of a `tether cap` / capability answer.
"""
import base64
import collections
import datetime
import json
import os
import re
import sqlite3
import sys


def ro(path):
    return sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=5)


def mode_feed(cpdb, ids):
    db = ro(cpdb)
    rows = db.execute(
        "SELECT rev, body FROM feed WHERE kind = 'install' ORDER BY rev").fetchall()
    now = {r[0]: (r[1], r[2], r[3]) for r in db.execute(
        "SELECT id, generation, activation, worker FROM sandboxes")}
    per = collections.defaultdict(list)
    for rev, body in rows:
        b = json.loads(body)
        per[b.get("sandbox")].append((rev, b))
    bad = 0
    for sid in ids:
        seen = {}
        last = None
        dups = react = 0
        errs = []
        for rev, b in per.get(sid, []):
            key = (b["generation"], b["activation"])
            content = {k: v for k, v in b.items() if k != "rev"}
            if key in seen:
                if seen[key] == content:
                    dups += 1
                    continue
                errs.append("rev %d: generation %d activation %d installed again "
                            "with different contents (%s vs %s)"
                            % (rev, key[0], key[1], json.dumps(seen[key]),
                               json.dumps(content)))
                continue
            if last is not None:
                lkey, lw = (last["generation"], last["activation"]), last["worker"]
                if key <= lkey:
                    errs.append("rev %d: generation %d activation %d after %d/%d"
                                % (rev, key[0], key[1], lkey[0], lkey[1]))
                elif key[0] == lkey[0]:
                    react += 1
                    if b["worker"] != lw:
                        errs.append("rev %d: generation %d re-activated on %s, "
                                    "was on %s" % (rev, key[0], b["worker"], lw))
            seen[key] = content
            last = b
        gens = sorted({g for g, _ in seen})
        if last is None:
            errs.append("no install in the feed")
        elif sid not in now:
            errs.append("the cp has no record of it")
        elif (last["generation"], last["activation"], last["worker"]) != now[sid]:
            errs.append("the cp records generation %d activation %d on %s, the last "
                        "install was %d/%d on %s" % (now[sid] + (
                            last["generation"], last["activation"], last["worker"])))
        desc = "%s: %d installs, generations %s..%s (%d distinct), %d re-activations " \
               "in place, %d identical repeats" % (
                   sid, len(per.get(sid, [])), gens[0] if gens else "-",
                   gens[-1] if gens else "-", len(gens), react, dups)
        if errs:
            bad += 1
            print("BAD " + desc + "; " + "; ".join(errs[:5]))
        else:
            print("ok " + desc)
    return 1 if bad else 0


def alive_as(pid, word):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return word.encode() in f.read()
    except OSError:
        return False


def mode_records(state, sbxjson, ids):
    with open(sbxjson) as f:
        listed = {s["id"]: s for s in json.load(f)["sandboxes"]}
    workers = sorted(os.listdir(os.path.join(state, "workers")))
    recs = {}
    for w in workers:
        db = ro(os.path.join(state, "workers", w, "runtime.db"))
        for row in db.execute("SELECT sbx, gen, att, state, retired, init_pid, "
                              "bridge_pid FROM executions"):
            recs[(w, row[0])] = row[1:]
    bad = 0
    for sid in ids:
        s = listed.get(sid)
        errs = []
        if s is None:
            print("BAD %s: the cp does not list it" % sid)
            bad += 1
            continue
        st, w, g, a = s["state"], s["worker"], s["generation"], s["activation"]
        if st == "paused" and s.get("snapshot"):
            print("ok %s: paused, resumable from the snapshot of generation %d"
                  % (sid, s["snapshot"]["generation"]))
            continue
        if st != "running":
            errs.append("state %s%s" % (st, (": " + s["error"]) if s.get("error") else ""))
        r = recs.get((w, sid))
        if r is None:
            errs.append("no record in %s's runtime.db" % w)
        else:
            rg, ra, rst, ret, ip, bp = r
            if (rg, ra) != (g, a) or rst != "running" or ret:
                errs.append("%s's record is generation %d activation %d %s%s, the cp "
                            "says %d/%d" % (w, rg, ra, rst, " retired" if ret else "", g, a))
            if not alive_as(ip, "tether-guest"):
                errs.append("its init (pid %d) is not running" % ip)
            if not alive_as(bp, "tether-bridge"):
                errs.append("its bridge (pid %d) is not running" % bp)
        for ow in workers:
            if ow == w or (ow, sid) not in recs:
                continue
            og, oa, ost, oret, _, _ = recs[(ow, sid)]
            if not oret and ost in ("running", "starting"):
                errs.append("%s also runs it (generation %d activation %d %s)"
                            % (ow, og, oa, ost))
        if errs:
            bad += 1
            print("BAD %s: %s" % (sid, "; ".join(errs)))
        else:
            print("ok %s: running, generation %d activation %d on %s: the record "
                  "matches, init and bridge alive" % (sid, g, a, w))
    extra = sorted(set(listed) - set(ids))
    if extra:
        print("note: the cp also lists %s" % " ".join(extra))
    return 1 if bad else 0


def mode_windows(churnerr, kills):
    start = None
    fails = []  # (epoch ms, class)
    pat = re.compile(r"^churn: ([0-9.]+) s: (\S+) on \S+ failed after [0-9.]+ ms: (.*)$")
    mpat = re.compile(r"^churn: ([0-9.]+) s: migrate \S+ -> \S+ failed: (.*)$")
    with open(churnerr, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^churn: the run starts at ([0-9.]+) \(epoch s\)", line)
            if m:
                start = float(m.group(1)) * 1000
                continue
            m = pat.match(line)
            if m and start is not None:
                fails.append((start + float(m.group(1)) * 1000,
                              "%s: %s" % (m.group(2), m.group(3))))
                continue
            m = mpat.match(line)
            if m and start is not None:
                fails.append((start + float(m.group(1)) * 1000, "migrate: " + m.group(2)))
    used = [False] * len(fails)
    with open(kills) as f:
        for line in f:
            n, target, t0, t1 = line.split()
            t0, t1 = float(t0), float(t1)
            c = collections.Counter()
            for i, (t, cls) in enumerate(fails):
                if t0 <= t <= t1:
                    c[cls] += 1
                    used[i] = True
            print("%s %s %d %s" % (n, target, sum(c.values()),
                                   "; ".join("%dx %s" % (v, k) for k, v in c.most_common(6))))
    c = collections.Counter(cls for i, (_, cls) in enumerate(fails) if not used[i])
    print("outside - %d %s" % (sum(c.values()),
                              "; ".join("%dx %s" % (v, k) for k, v in c.most_common(6))))
    return 0


def b64d(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def mode_forge(token, sbx, gen, att, wrk):
    parts = token.split(".")
    raw = b64d(parts[2])
    claims, sig = json.loads(raw[:-64]), raw[-64:]
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    claims.update(sbx=sbx, gen=int(gen), att=int(att), wrk=wrk,
                  iat=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                  exp=(now + datetime.timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ"))
    body = json.dumps(claims, separators=(",", ":")).encode() + sig
    parts[2] = base64.urlsafe_b64encode(body).decode().rstrip("=")
    print(".".join(parts))
    return 0


def mode_token(field, capjson):
    with open(capjson) as f:
        print(json.load(f)[field])
    return 0


def main():
    m, args = sys.argv[1], sys.argv[2:]
    if m == "feed":
        return mode_feed(args[0], args[1:])
    if m == "records":
        return mode_records(args[0], args[1], args[2:])
    if m == "windows":
        return mode_windows(args[0], args[1])
    if m == "forge":
        return mode_forge(*args)
    if m == "token":
        return mode_token(*args)
    sys.exit("crash_check.py: unknown mode %s" % m)


if __name__ == "__main__":
    sys.exit(main())

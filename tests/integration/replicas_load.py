#!/usr/bin/env python3
"""Load on a tether cluster through its edge, for test_cp_replicas.sh.

usage: replicas_load.py EDGE_URL API_KEY SECONDS CLIENTS OUT.json

Each client owns one sandbox and cycles: exec (a write), a capability,
then pause and resume, or (every third round) migrate to the other worker,
and reads back after each resume what it wrote before. Every call and its
answer is recorded; OUT.json gets, per client, the acknowledged lifecycle
results (op, generation, worker, state) and every failure (status, body).
Bounded: no call starts after SECONDS, each call at most 60 s.
"""
import json
import sys
import threading
import time
import urllib.error
import urllib.request

EDGE, KEY, SECONDS, CLIENTS, OUT = (sys.argv[1], sys.argv[2], float(sys.argv[3]),
                                    int(sys.argv[4]), sys.argv[5])
WORKERS = ["w1", "w2"]


def call(method, path, body=None):
    """One request: (status, parsed body or text); status 0 = transport."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(EDGE + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + KEY)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    except Exception as e:  # transport: the edge itself did not answer
        return 0, str(e)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def client(i, deadline, out):
    rec = {"acks": [], "failures": [], "reads": 0, "read_mismatch": [], "sbx": None}
    out[i] = rec

    def fail(op, st, b):
        rec["failures"].append({"op": op, "status": st,
                                "body": b if isinstance(b, (dict, str)) else str(b),
                                "at": time.time()})

    st, b = call("POST", "/v1/sandboxes", {"worker": WORKERS[i % 2]})
    if st != 201:
        fail("create", st, b)
        return
    sbx = b["id"]
    rec["sbx"] = sbx
    rec["acks"].append({"op": "create", "generation": b["generation"],
                        "worker": b["worker"], "state": b["state"]})
    k = 0
    state = "running"

    def read_back():
        want = next((a["word"] for a in reversed(rec["acks"]) if "word" in a), None)
        st, b = call("POST", "/v1/sandboxes/%s/exec" % sbx, {"cmd": ["cat", "/tmp/word"]})
        rec["reads"] += 1
        if st != 200 or b.get("stdout", "").strip() != want:
            rec["read_mismatch"].append({"want": want, "status": st, "got": b})

    while time.time() < deadline:
        k += 1
        if state == "running":
            word = "v%d" % k
            st, b = call("POST", "/v1/sandboxes/%s/exec" % sbx,
                         {"cmd": ["sh", "-c", "echo %s > /tmp/word" % word]})
            if st != 200 or b.get("exit_code") != 0:
                fail("exec", st, b)
                state = None
                continue
            st, b = call("POST", "/v1/sandboxes/%s/capabilities" % sbx,
                         {"purpose": "control", "ops": ["exec"]})
            if st != 201:
                fail("capability", st, b)
            if k % 3 == 0:  # migrate: pause here, resume on the other worker
                cur = rec["acks"][-1]["worker"]
                other = WORKERS[1] if cur == WORKERS[0] else WORKERS[0]
                st, b = call("POST", "/v1/sandboxes/%s/migrate" % sbx, {"worker": other})
                if st != 200:
                    fail("migrate", st, b)
                    state = None
                    continue
                rec["acks"].append({"op": "migrate", "generation": b["generation"],
                                    "worker": b["worker"], "state": b["state"],
                                    "word": word})
                read_back()
                continue
            st, b = call("POST", "/v1/sandboxes/%s/pause" % sbx)
            if st != 200:
                fail("pause", st, b)
                state = None
                continue
            rec["acks"].append({"op": "pause", "generation": b["generation"],
                                "worker": b["worker"], "state": b["state"],
                                "word": word})
            state = "paused"
        elif state == "paused":
            st, b = call("POST", "/v1/sandboxes/%s/resume" % sbx, {})
            if st != 200:
                fail("resume", st, b)
                state = None
                continue
            rec["acks"].append({"op": "resume", "generation": b["generation"],
                                "worker": b["worker"], "state": b["state"]})
            state = "running"
            read_back()
        else:
            # after a failure: go on from the state the cp records
            time.sleep(0.2)
            st, b = call("GET", "/v1/sandboxes/%s" % sbx)
            if st == 200 and b.get("state") in ("running", "paused"):
                state = b["state"]
    st, b = call("GET", "/v1/sandboxes/%s" % sbx)
    rec["final"] = b if st == 200 else {"status": st, "body": b}


def main():
    deadline = time.time() + SECONDS
    out = [None] * CLIENTS
    threads = [threading.Thread(target=client, args=(i, deadline, out)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SECONDS + 180)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)


main()

#!/usr/bin/env python3
"""Feed updates sent to a bare sbx-manager over its real unix socket, as a
node-api (or anyone who took its place) would send them: the manager
accepts only its peer pid and uid (SO_PEERCRED), so this process starts
the manager with itself as the peer. Signatures come from the real signer
(build/tether-signer on a socketpair, fd 3, speaking lib/wire.h frames):
the honest one holds the cp's feed key, the attacker's its own. Prints one
line per check, "PASS <name>" or "FAIL <name> | <detail>", for
test_feed_sign.sh to turn into TAP.

usage: feed_sign_probe.py ROOT WORKDIR"""
import json
import os
import socket
import struct
import subprocess
import sys
import time

ROOT, WORK = sys.argv[1], sys.argv[2]
SBX = "sbx_" + "feedsignprobeabcdefghijklm"[:26]
HDR = struct.Struct(">4sBBHI")  # magic TTW\0, version, type, 0, length
REQUEST, DECISION, DATA_OUT, STDERR, RESULT, ERROR = 1, 2, 5, 6, 7, 8


def frame(ftype, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    return HDR.pack(b"TTW\0", 1, ftype, 0, len(data)) + data


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("peer closed")
        buf += chunk
    return buf


def read_frame(s):
    _, _, ftype, _, n = HDR.unpack(read_exact(s, HDR.size))
    return ftype, read_exact(s, n)


class Signer:
    """tether-signer on a socketpair (fd 3), keys in dir."""

    def __init__(self, d):
        os.makedirs(d, exist_ok=True)
        a, b = socket.socketpair()
        os.set_inheritable(b.fileno(), True)
        # fd 3 of the signer is our socketpair end (sh moves it there)
        self.proc = subprocess.Popen(
            ["sh", "-c", 'exec "$0" --key "$1" --feed-key "$2" --feed-pub "$3" 3<&%d %d<&-'
             % (b.fileno(), b.fileno()), ROOT + "/build/tether-signer", d + "/signer.key",
             d + "/feed.key", d + "/feed.pub"],
            pass_fds=(b.fileno(),), stderr=open(d + "/signer.log", "w"))
        b.close()
        self.s = a
        self.s.settimeout(5)
        pub = self.call({"op": "public"})
        self.cap_pub, self.kid, self.feed_pub = pub["public"], pub["kid"], pub["feed_public"]

    def call(self, req):
        self.s.sendall(frame(REQUEST, req))
        ftype, data = read_frame(self.s)
        res = json.loads(data)
        if ftype != RESULT:
            raise RuntimeError("signer refused: %s" % res)
        return res

    def envelope(self, update, to, prev):
        inner = dict(update, to=to, prev=prev)
        body = json.dumps(inner, separators=(",", ":"), sort_keys=True)
        sig = self.call({"op": "feed.sign", "body": body})["sig"]
        return {"rev": update["rev"], "kind": update["kind"], "body": body, "sig": sig}

    def capability(self, gen):
        claims = {"sub": "probe", "aud": "node", "sbx": SBX, "gen": gen, "wrk": "wf",
                  "sst": "ns", "pod": "", "att": 1, "pur": "control", "ops": ["exec"]}
        return self.call({"op": "sign", "claims": claims})["token"]

    def stop(self):
        self.s.close()
        self.proc.wait(5)


def manager_cmd(feed_key, sock):
    cmd = [ROOT + "/build/tetherd", "manager", "--state", WORK + "/state", "--socket", sock,
           "--worker-id", "wf", "--peer-pid", str(os.getpid()), "--peer-uid", "0",
           "--snapshots", WORK + "/snap", "--guest-bin", ROOT + "/build/tether-guest"]
    return cmd + (["--feed-key", feed_key] if feed_key else [])


def call(sock, req, timeout=30):
    """One operation: REQUEST, then frames until RESULT/ERROR (or a
    non-allow DECISION). Returns (decision, out, result, error)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock)
    s.sendall(frame(REQUEST, req))
    decision, out = None, b""
    try:
        while True:
            ftype, data = read_frame(s)
            if ftype == DECISION:
                decision = json.loads(data)
                if decision.get("decision") != "allow":
                    return decision, out, None, None
            elif ftype == DATA_OUT:
                out += data
            elif ftype == RESULT:
                return decision, out, json.loads(data), None
            elif ftype == ERROR:
                return decision, out, None, json.loads(data)
    finally:
        s.close()


def apply(sock, *envs):
    _, _, res, err = call(sock, {"op": "feed.apply", "updates": list(envs)})
    if res is None:
        raise RuntimeError("feed.apply failed: %s" % err)
    return res


def status(sock):
    return call(sock, {"op": "status"})[2]


results = []


def check(name, cond, detail=""):
    print(("PASS %s" % name) if cond else ("FAIL %s | %s" % (name, detail)), flush=True)
    results.append(cond)


def main():
    os.makedirs(WORK + "/snap", exist_ok=True)
    cp = Signer(WORK + "/cp")          # the control plane's signer
    evil = Signer(WORK + "/attacker")  # a signer with keys of its own
    sock = WORK + "/m.sock"
    log = open(WORK + "/manager.log", "ab")

    # No feed key: the manager refuses to start (no test mode).
    r = subprocess.run(manager_cmd(None, sock), stderr=subprocess.PIPE, timeout=20)
    check("a manager without a pinned feed key refuses to start",
          r.returncode != 0 and b"--feed-key" in r.stderr, r.stderr.decode()[-300:])

    mgr = subprocess.Popen(manager_cmd(cp.feed_pub, sock), stderr=log)
    for _ in range(300):
        if os.path.exists(sock):
            break
        time.sleep(0.02)
    try:
        run(cp, evil, sock, mgr)
    finally:
        mgr.terminate()
        mgr.wait(20)
        cp.stop()
        evil.stop()
    # The pin: the same state directory with the attacker's key.
    r = subprocess.run(manager_cmd(evil.feed_pub, WORK + "/m2.sock"), stderr=subprocess.PIPE,
                       timeout=20)
    check("the pinned key holds: a restart with another feed key is refused",
          r.returncode != 0 and b"provisioned with another feed key" in r.stderr,
          r.stderr.decode()[-300:])
    return 0 if all(results) else 1


def refused(res, reason):
    r = res["results"][0] if res["results"] else {}
    return r.get("ok") is False and r.get("refused") == reason


def run(cp, evil, sock, mgr):
    keys = {"rev": 1, "kind": "keys", "worker": None,
            "keys": [{"kid": cp.kid, "public": cp.cap_pub, "not_before": "2020-01-01T00:00:00Z",
                      "not_after": None}]}
    install = {"rev": 2, "kind": "install", "worker": "wf", "sandbox": SBX, "generation": 1,
               "substrate": "ns", "pod": "", "activation": 1}
    res = apply(sock, cp.envelope(keys, "wf", 0))
    check("an honest signed key bundle is applied", res["applied_rev"] == 1 and
          res["results"][0].get("ok") is True, res)

    # The attack of issue 13: a key of one's own, then capabilities under it.
    evil_keys = dict(keys, rev=2, keys=[{"kid": evil.kid, "public": evil.cap_pub,
                                         "not_before": "2020-01-01T00:00:00Z", "not_after": None}])
    plain = dict(evil_keys)
    res = apply(sock, plain)
    check("an unsigned update (a key bundle of the attacker's) is refused",
          refused(res, "unsigned") and res["applied_rev"] == 1, res)
    res = apply(sock, evil.envelope(evil_keys, "wf", 1))
    check("an update signed with another key is refused (bad_signature)",
          refused(res, "bad_signature") and res["applied_rev"] == 1, res)
    env = cp.envelope(install, "wf", 1)
    flipped = dict(env, body=env["body"].replace('"generation":1', '"generation":7'))
    res = apply(sock, flipped)
    check("an honest update with its body changed in transit is refused",
          refused(res, "bad_signature") and res["applied_rev"] == 1, res)
    res = apply(sock, dict(env, rev=5))
    check("an honest update relabelled with another revision is refused",
          refused(res, "mismatch") and res["applied_rev"] == 1, res)
    res = apply(sock, cp.envelope(install, "w2", 1))
    check("an update signed for another worker is refused",
          refused(res, "wrong_worker") and res["applied_rev"] == 1, res)
    retire = {"rev": 3, "kind": "retire", "worker": "wf", "sandbox": SBX, "generation": 1}
    res = apply(sock, cp.envelope(retire, "wf", 2))
    check("a reordered update (rev 3 before rev 2) is refused",
          refused(res, "out_of_order") and res["applied_rev"] == 1, res)
    tok = evil.capability(1)
    dec = call(sock, {"token": tok, "sbx": SBX, "op": "exec", "cmd": ["id"]})[0]
    check("a capability minted with the attacker's key is denied (its key was never installed)",
          dec is not None and dec.get("decision") == "deny", dec)

    # The honest install, then the sandbox works end to end.
    res = apply(sock, env)
    check("the honest install (rev 2 after 1) is applied",
          res["applied_rev"] == 2 and res["results"][0].get("ok") is True, res)
    tok = cp.capability(1)
    dec, out, result, err = call(sock, {"token": tok, "sbx": SBX, "op": "exec",
                                        "cmd": ["sh", "-c", "echo honest"]})
    check("... and an exec with the cp's capability runs in the sandbox",
          dec is not None and dec.get("decision") == "allow" and out == b"honest\n",
          (dec, out, result, err))

    # Replays.
    res = apply(sock, env)
    check("the same update replayed is answered from the record (ok, not applied again)",
          res["applied_rev"] == 2 and res["results"][0].get("ok") is True and
          "refused" not in res["results"][0], res)
    other = cp.envelope(dict(install, generation=9), "wf", 1)
    res = apply(sock, other)
    check("other content signed under an applied revision is refused",
          refused(res, "replay_mismatch") and res["applied_rev"] == 2, res)
    st = status(sock)
    rec = [e for e in st.get("executions", []) if e.get("sandbox") == SBX]
    check("the record is still generation 1, running", st["applied_rev"] == 2 and rec and
          rec[0].get("generation") == 1 and rec[0].get("state") == "running", st)

    # A batch with a forged update in the middle: what precedes it is
    # applied, it and what follows are not.
    destroy = {"rev": 4, "kind": "destroy", "worker": "wf", "sandbox": SBX}
    forged = evil.envelope(destroy, "wf", 3)
    res = apply(sock, cp.envelope(retire, "wf", 2), forged, cp.envelope(destroy, "wf", 3))
    rs = res["results"]
    check("a batch stops at a forged update: the honest one before it applied, none after",
          res["applied_rev"] == 3 and len(rs) == 2 and rs[0].get("ok") is True and
          rs[1].get("refused") == "bad_signature", res)
    res = apply(sock, cp.envelope(destroy, "wf", 3))
    check("the honest update that was held back is applied when it comes",
          res["applied_rev"] == 4 and res["results"][0].get("ok") is True, res)


if __name__ == "__main__":
    sys.exit(main())

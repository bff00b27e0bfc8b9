#!/usr/bin/env python3
"""Drives headless Chromium through the edge's status page, as a user
would: opens URL/, types the API key into the login form and submits it
(a real POST /login from the page: the browser sends its Origin and keeps
the session cookie), waits until the page has rendered what WAIT_FOR
names, then writes the DOM (OUT.html) and a screenshot (OUT.png).

Chromium is driven over the DevTools protocol with --remote-debugging-pipe
(JSON messages separated by NUL bytes on fds 3 and 4: no WebSocket needed).

usage: status_browser.py CHROMIUM URL KEY OUT WAIT_FOR... [--then CMD]
(each WAIT_FOR a string the rendered page must contain); with --then,
once they are there, CMD runs (sh -c) and what it prints (stripped) must
appear too without a reload: the page refreshes itself. Exit 0 when all
appeared within 30 s each, 1 otherwise (the DOM and screenshot are
written either way, after the last wait).
"""
import base64
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time


class Browser:
    def __init__(self, exe, profile):
        r_in, self.w_in = os.pipe()    # we write -> chromium's fd 3
        self.r_out, w_out = os.pipe()  # chromium's fd 4 -> we read
        # above 10 first, so that the dup2s below cannot clobber them
        r_in = self._high(r_in)
        w_out = self._high(w_out)
        def fds():
            os.dup2(r_in, 3)
            os.dup2(w_out, 4)
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-pipe", "--no-first-run",
             "--user-data-dir=" + profile, "--window-size=1280,900",
             "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4, r_in, w_out),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(r_in)
        os.close(w_out)
        self.buf = b""
        self.next_id = 0

    @staticmethod
    def _high(fd):
        h = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return h

    def send(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w_in, json.dumps(msg).encode() + b"\0")
        want = self.next_id
        while True:
            m = self.recv(20)
            if m.get("id") == want:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})

    def recv(self, timeout):
        end = time.time() + timeout
        while b"\0" not in self.buf:
            if time.time() > end:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.r_out, 1 << 20)
            if not chunk:
                raise EOFError("chromium went away")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def close(self):
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main():
    exe, url, key, out = sys.argv[1:5]
    wants, then = sys.argv[5:], None
    if "--then" in wants:
        then = wants[wants.index("--then") + 1]
        wants = wants[:wants.index("--then")]
    profile = tempfile.mkdtemp(prefix="tt-chromium.")
    b = Browser(exe, profile)
    ok = False
    try:
        tid = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = b.send("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        b.send("Page.enable", session=sid)
        b.send("Runtime.enable", session=sid)

        def js(expr):
            r = b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                       session=sid)
            return r.get("result", {}).get("value")

        def until(expr, secs):
            end = time.time() + secs
            while time.time() < end:
                try:
                    if js(expr):
                        return True
                except (RuntimeError, TimeoutError):
                    pass
                time.sleep(0.2)
            return False

        b.send("Page.navigate", {"url": url + "/"}, session=sid)
        if not until("!!document.getElementById('login')", 15):
            print("no login form at " + url + "/", file=sys.stderr)
        else:
            js("document.getElementById('key').value = %s;"
               "document.getElementById('login').submit(); true" % json.dumps(key))
            def has(ws):
                return " && ".join("document.body.innerText.includes(%s)" % json.dumps(w)
                                   for w in ws) or "true"
            ok = until("!!document.getElementById('workers') && (" + has(wants) + ")", 30)
            if ok and then:
                loads = js("performance.getEntriesByType('navigation').length")
                new = subprocess.run(["sh", "-c", then], capture_output=True,
                                     text=True, timeout=60).stdout.strip()
                ok = bool(new) and until(has([new]), 30)
                # the same document: no navigation happened in between
                ok = ok and js("performance.getEntriesByType('navigation').length") == loads
                if not ok:
                    print("the page did not show %r by itself" % new, file=sys.stderr)
        time.sleep(0.3)
        html = js("document.documentElement.outerHTML") or ""
        cookie = js("document.cookie")
        with open(out + ".html", "w") as f:
            f.write(html)
        shot = b.send("Page.captureScreenshot", {"format": "png"}, session=sid)
        with open(out + ".png", "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        # the session cookie is HttpOnly: the page's script cannot read it
        print(json.dumps({"ok": ok, "script_sees_cookie": bool(cookie),
                          "location": js("location.pathname")}))
    finally:
        b.close()
        subprocess.run(["rm", "-rf", profile])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

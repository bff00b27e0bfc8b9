#!/usr/bin/env python3
"""Raw-socket probes for tests/integration/test_frontdoor.sh (test-only; the
daemons' HTTP and WebSocket framing is lws', never ours). Each mode prints one
line:

  upgrade PORT PATH PROTO AUTH [METHOD]  status of a WebSocket upgrade
        ("101", "403", ... or "closed" when refused without an answer);
        PROTO/AUTH "-" = header left out
  idle PORT MODE SECS [PATH AUTH]   seconds until the server closes, or "open"
        MODE: none (send nothing), half (half a header), drip (a header one
        byte a second), keepalive (one whole request, then nothing),
        h2c (an h2c upgrade, then silence), connect (a CONNECT request,
        which lws turns into a raw socket), wsnostart (a WebSocket upgrade of
        PATH with AUTH, then no start message)
  h2c PORT                          "served" if an HTTP/2 answer came after an
        h2c upgrade, "101-closed" if the 101 came and then only the close,
        else the status / "closed"
  raw PORT                          status of the request read from stdin
        ("\\n" in it become CRLF), "closed" without an answer
  flood PORT N SECS                 opens up to N connections (1 s each),
        prints how many were accepted by the kernel, holds them SECS
  slowget PORT PATH AUTH RATE OUT   GET PATH reading at most RATE bytes a
        second through a 32 KiB receive buffer into OUT; prints the status,
        the bytes and the seconds it took
  hammer PORT N AUTH PATH           N keep-alive GETs of PATH with AUTH
        ("Authorization: AUTH") on few connections, prints the statuses seen
"""
import base64
import os
import socket
import sys
import time


def connect(port, timeout=5):
    return socket.create_connection(("127.0.0.1", int(port)), timeout=timeout)


def read_head(s, limit=65536):
    """The response head, or None if the server closed first."""
    buf = b""
    try:
        while b"\r\n\r\n" not in buf and len(buf) < limit:
            d = s.recv(4096)
            if not d:
                break
            buf += d
    except OSError:
        pass
    if b"\r\n" not in buf:
        return None, buf
    return buf.split(b"\r\n", 1)[0], buf


def status_of(first):
    if first is None:
        return "closed"
    parts = first.split(b" ")
    return parts[1].decode() if len(parts) > 1 else "garbage"


def upgrade_request(path, proto, auth, method="GET"):
    key = base64.b64encode(os.urandom(16)).decode()
    req = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
           "Sec-WebSocket-Version: 13\r\n")
    if proto != "-":
        req += f"Sec-WebSocket-Protocol: {proto}\r\n"
    if auth != "-":
        req += f"Authorization: {auth}\r\n"
    return (req + "\r\n").encode()


def upgrade(port, path, proto, auth, method="GET"):
    s = connect(port)
    s.sendall(upgrade_request(path, proto, auth, method))
    first, _ = read_head(s)
    print(status_of(first))


H2C = (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
       b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")


def wait_closed(s, secs, t0):
    """Seconds from t0 until EOF/reset, None if still open after secs."""
    s.settimeout(0.5)
    while time.time() - t0 < secs:
        try:
            d = s.recv(65536)
            if not d:
                return time.time() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.time() - t0
    return None


def idle(port, mode, secs, path="-", auth="-"):
    secs = float(secs)
    s = connect(port)
    t0 = time.time()
    if mode == "half":
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    elif mode == "connect":
        s.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    elif mode == "keepalive":
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first, _ = read_head(s)
        if status_of(first) != "200":
            print("no-answer")
            return
        t0 = time.time()  # idle from the answer on
    elif mode == "h2c":
        s.sendall(H2C)
        first, _ = read_head(s)
        if status_of(first) != "101":
            print("no-101:" + status_of(first))
            return
    elif mode == "wsnostart":
        s.sendall(upgrade_request(path, "tether.exec.v1", auth))
        first, _ = read_head(s)
        if status_of(first) != "101":
            print("no-101:" + status_of(first))
            return
        t0 = time.time()
    elif mode == "drip":
        drip = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 600
        s.settimeout(1)
        for i in range(len(drip)):
            try:
                s.sendall(drip[i:i + 1])
                if not s.recv(1):
                    print("%.1f" % (time.time() - t0))
                    return
            except socket.timeout:
                continue
            except OSError:
                print("%.1f" % (time.time() - t0))
                return
            if time.time() - t0 > secs:
                print("open")
                return
    el = wait_closed(s, secs, t0)
    print("open" if el is None else "%.1f" % el)


def h2c(port):
    s = connect(port)
    s.sendall(H2C)
    first, buf = read_head(s)
    if status_of(first) != "101":
        print(status_of(first))
        return
    rest = buf.split(b"\r\n\r\n", 1)[1]
    # the client preface and an empty SETTINGS frame
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    s.settimeout(3)
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            rest += d
    except OSError:
        pass
    # any HEADERS frame (type 1) on stream 1 is an answer
    i = 0
    while i + 9 <= len(rest):
        n = int.from_bytes(rest[i:i + 3], "big")
        typ, sid = rest[i + 3], int.from_bytes(rest[i + 5:i + 9], "big") & 0x7fffffff
        if typ == 1 and sid == 1:
            print("served")
            return
        i += 9 + n
    print("101-closed")


def raw(port):
    req = sys.stdin.read().replace("\\n", "\r\n").encode()
    s = connect(port)
    s.sendall(req)
    first, _ = read_head(s)
    print(status_of(first))


def flood(port, n, secs):
    socks = []
    for _ in range(int(n)):
        try:
            socks.append(connect(port, timeout=1))
        except OSError:
            break
    print(len(socks), flush=True)
    time.sleep(float(secs))


def slowget(port, path, auth, rate, out):
    rate = float(rate)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    s.settimeout(60)
    s.connect(("127.0.0.1", int(port)))
    t0 = time.time()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\r\n").encode())
    first, buf = read_head(s)
    head, body = buf.split(b"\r\n\r\n", 1) if b"\r\n\r\n" in buf else (buf, b"")
    clen = -1
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            clen = int(line.split(b":")[1])
    with open(out, "wb") as f:
        got = len(body)
        f.write(body)
        try:
            while got < clen:
                d = s.recv(4096)
                if not d:
                    break
                f.write(d)
                got += len(d)
                ahead = got / rate - (time.time() - t0)
                if ahead > 0:
                    time.sleep(ahead)
        except OSError:
            pass
    print(status_of(first), got, int(time.time() - t0))


def hammer(port, n, auth, path):
    seen = {}
    s = None
    for _ in range(int(n)):
        if s is None:
            s = connect(port)
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\r\n").encode())
        first, buf = read_head(s)
        st = status_of(first)
        seen[st] = seen.get(st, 0) + 1
        # read the body (Content-Length) so the next answer starts clean
        head = buf.split(b"\r\n\r\n", 1)
        clen = 0
        for line in head[0].split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                clen = int(line.split(b":")[1])
        body = head[1] if len(head) > 1 else b""
        try:
            while len(body) < clen:
                d = s.recv(65536)
                if not d:
                    break
                body += d
        except OSError:
            pass
        if first is None or b"close" in buf.split(b"\r\n\r\n", 1)[0].lower():
            s.close()
            s = None
    print(" ".join(f"{k}x{v}" for k, v in sorted(seen.items())))


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    {"upgrade": upgrade, "idle": idle, "h2c": h2c, "raw": raw,
     "flood": flood, "hammer": hammer, "slowget": slowget}[mode](*args)

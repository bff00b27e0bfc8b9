#!/bin/bash
# The sandbox's own limits and the worker side's hold on it (issue 13,
# item 5; SPEC §9 ns substrate), on a real cluster (`tether up --workers 2`)
# plus a hand-started worker w3 with a lower CPU cap. Each attack is shown
# refused next to the honest use that still works:
#  - seccomp: AF_VSOCK (which host root opens here) and other families a
#    sandbox has no use for are refused; AF_UNIX, AF_INET, netlink work;
#  - the guest socket swapped for a symlink to a host socket: the bridge
#    never connects there, and execs keep working once it is put back;
#  - /run/tether is a capped tmpfs: filling it stops at 4 MiB / 256 inodes;
#  - a tree deeper than PATH_MAX is removed by `rm`; after a migrate the
#    old worker's sandbox directory is gone;
#  - a CPU-bound sandbox is held to its cgroup CPU cap;
#  - inotify instances exhausted in one sandbox: another sandbox and host
#    root still get theirs (the user namespace belongs to the sandbox's uid);
#  - disjoint host uid ranges per worker;
#  - every bridge runs without root and with only the capabilities listed;
#  - cp.db and its -wal/-shm are 0600.
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
cluster_setup tether-limits
TT_DETAIL_LINES=12
W3_PID=
EVIL_PID=

T() { timeout 120 "$ROOT/build/tether" "$@"; }
stop_evil() { stop_pid "$EVIL_PID" 20; EVIL_PID=; }
at_exit stop_w3
at_exit stop_evil
sbx_dir() { echo "$STATE/workers/$1/sandboxes/$2"; }
mgr_pid() { pgrep -f -o "tetherd manager --state $STATE/workers/$1( |$)"; }
# init_of W SBX: a process of the sandbox (the first in its pids cgroup).
init_of() { head -n1 "$(ls -d /sys/fs/cgroup/pids/tether/"$2"-g* 2>/dev/null | head -n1)/tasks" 2>/dev/null; }
# cg_tasks SBX: the pids in the sandbox's cpu cgroup.
cpu_cg() { ls -d /sys/fs/cgroup/cpu/tether/"$1"-g* 2>/dev/null | head -n1; }

cluster_up_or_bail "tether up: cluster with w1, w2" 2
A=$(T create --worker w1 2>"$WORK/e")
B=$(T create --worker w2 2>>"$WORK/e")
C=$(T create --worker w1 2>>"$WORK/e")
[[ $A =~ ^sbx_ && $B =~ ^sbx_ && $C =~ ^sbx_ ]] && ok "sandboxes A, C on w1 and B on w2" ||
	tap_bail "three sandboxes" "$(cat "$WORK/e")"

# ---- seccomp: address families ------------------------------------------------------
PY_FAM='
import errno, socket, sys
def try_(name, fam, typ, proto=0):
    try:
        s = socket.socket(fam, typ, proto); s.close(); print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
try_("vsock", socket.AF_VSOCK, socket.SOCK_STREAM)
try_("packet", socket.AF_PACKET, socket.SOCK_DGRAM)
try_("bluetooth", 31, socket.SOCK_STREAM)
try_("netlink-audit", socket.AF_NETLINK, socket.SOCK_RAW, 9)
try:
    socket.socketpair(socket.AF_INET); print("pair-inet ok")
except OSError as e:
    print("pair-inet", errno.errorcode.get(e.errno, e.errno))
# honest: TCP over loopback, a unix pair, rtnetlink
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
c.sendall(b"hi"); print("inet", a.recv(2).decode())
p, q = socket.socketpair(); p.sendall(b"ux"); print("unix", q.recv(2).decode())
try_("netlink-route", socket.AF_NETLINK, socket.SOCK_RAW, 0)
'
host=$(python3 -c 'import socket; socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); print("ok")' 2>&1)
T exec "$A" -- python3 -c "$PY_FAM" >"$WORK/fam" 2>&1
echo "# host root: AF_VSOCK socket $host"
grep -qx "vsock EAFNOSUPPORT" "$WORK/fam" && [ "$host" = ok ] &&
	ok "AF_VSOCK socket refused in the sandbox (EAFNOSUPPORT; host root opens one here)" ||
	notok "AF_VSOCK refused" "host: $host; $(cat "$WORK/fam")"
grep -qx "packet EAFNOSUPPORT" "$WORK/fam" && grep -qx "bluetooth EAFNOSUPPORT" "$WORK/fam" &&
	grep -qx "pair-inet EAFNOSUPPORT" "$WORK/fam" && grep -qx "netlink-audit EPROTONOSUPPORT" "$WORK/fam" &&
	ok "AF_PACKET, AF_BLUETOOTH, socketpair(AF_INET), netlink audit refused" ||
	notok "other families refused" "$(cat "$WORK/fam")"
grep -qx "inet hi" "$WORK/fam" && grep -qx "unix ux" "$WORK/fam" && grep -qx "netlink-route ok" "$WORK/fam" &&
	ok "honest: TCP on loopback, a unix socketpair and rtnetlink work" || notok "honest sockets" "$(cat "$WORK/fam")"
r=$(T exec "$A" -- ip -o link show lo 2>&1)
[[ $r == *"lo:"* ]] && ok "ip link (rtnetlink) works inside" || notok "ip link inside" "$r"

# ---- the guest socket swapped for a symlink -------------------------------------------
# A host socket of the tenant's choice, counting every connection it gets.
EVIL=$WORK/evil.sock
python3 - "$EVIL" "$WORK/evil.log" <<'EOF' &
import socket, sys
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(64)
log = open(sys.argv[2], "a", buffering=1)
while True:
    c, _ = s.accept(); log.write("connection\n"); c.close()
EOF
EVIL_PID=$!
wait_until 50 test -S "$EVIL"
: >"$WORK/evil.log"
r=$(T exec "$A" -- sh -c "mv /run/tether/guest.sock /run/tether/real.sock && ln -s $EVIL /run/tether/guest.sock && ls -l /run/tether/guest.sock" 2>&1)
[[ $r == *"guest.sock -> $EVIL"* ]] && ok "inside: guest.sock swapped for a symlink to a host socket" ||
	notok "swap guest.sock" "$r"
# More operations at once than the bridge keeps idle connections: new
# guest connections are opened, and each is refused.
pids=()
for i in $(seq 1 8); do T exec "$A" -- sleep 1 >"$WORK/x$i" 2>&1 & pids+=($!); done
wait "${pids[@]}"
refused=$(grep -l "listener_replaced\|guest listener" "$WORK"/x* 2>/dev/null | wc -l)
[ ! -s "$WORK/evil.log" ] && [ "$refused" -gt 0 ] && ok "the bridge never connected to the host socket (0 connections; $refused of 8 concurrent execs refused)" ||
	notok "bridge redirected" "$(wc -l <"$WORK/evil.log") connection(s) to the tenant's socket"
T exec "$A" -- sh -c 'rm /run/tether/guest.sock && mv /run/tether/real.sock /run/tether/guest.sock' >"$WORK/e" 2>&1
pids=()
for i in $(seq 1 8); do T exec "$A" -- echo honest >"$WORK/y$i" 2>&1 & pids+=($!); done
wait "${pids[@]}"
good=$(grep -lx honest "$WORK"/y* | wc -l)
[ "$good" = 8 ] && [ ! -s "$WORK/evil.log" ] && ok "once put back, 8 concurrent honest execs all work" ||
	notok "honest execs after the swap" "$good of 8: $(cat "$WORK"/y* | head -n 4)"
stop_evil

# ---- /run/tether is capped ------------------------------------------------------------
T exec "$A" -- sh -c 'dd if=/dev/zero of=/run/tether/fill bs=1M count=100 2>&1; ls -l /run/tether/fill' >"$WORK/dd" 2>&1
size=$(awk '/fill$/ {print $5}' "$WORK/dd")
grep -q "No space left" "$WORK/dd" && [ -n "$size" ] && [ "$size" -le $((4 << 20)) ] &&
	ok "dd of 100 MiB into /run/tether stops at $size bytes (cap 4 MiB): No space left" ||
	notok "/run/tether byte cap" "$(cat "$WORK/dd")"
T exec "$A" -- sh -c 'rm -f /run/tether/fill; mkdir /run/tether/m; i=0; while [ $i -lt 2000 ]; do
	true >/run/tether/m/f$i || { echo "stopped at $i"; exit 3; }; i=$((i + 1)); done' >"$WORK/in" 2>&1
at=$(grep -o 'stopped at [0-9]*' "$WORK/in" | awk '{print $3}')
[ -n "$at" ] && [ "$at" -le 256 ] && ok "creating 2000 files in /run/tether stops at $at (256 inodes)" ||
	notok "/run/tether inode cap" "$(tail -n 3 "$WORK/in")"
r=$(T exec "$A" -- sh -c 'rm -rf /run/tether/m; echo fine' 2>&1)
[ "$r" = fine ] && ok "honest: A works on once it cleaned up" || notok "A after the fill" "$r"
M1=$(mgr_pid w1)
grep -q " $(sbx_dir w1 "$A")/run .* tmpfs " /proc/"$M1"/mountinfo &&
	ok "on the host, A's run dir is its own tmpfs" || notok "run tmpfs on the host" "$(grep "$A" /proc/"$M1"/mountinfo)"

# ---- removal: deep trees, migrate ---------------------------------------------------
# 20 levels of 250-byte names (>5000 bytes, past PATH_MAX) in the layer
# and in /run/tether.
DEEP='
import os
n = "d" * 250
for top in ("/workspace", "/run/tether"):
    os.chdir(top)
    for i in range(20):
        os.mkdir(n)
        os.chdir(n)
    open("leaf", "w").write("x")
print("deep")
'
r=$(T exec "$C" -- python3 -c "$DEEP" 2>&1)
[ "$r" = deep ] && ok "C made two trees deeper than PATH_MAX" || notok "deep trees" "$r"
T rm "$C" >"$WORK/e" 2>&1 || notok "rm C" "$(cat "$WORK/e")"
wait_until 50 test ! -e "$(sbx_dir w1 "$C")" && ok "rm C: its sandbox directory on w1 is gone" ||
	notok "rm removes deep trees" "$(ls -la "$(sbx_dir w1 "$C")" 2>&1 | head -n 5)"
T exec "$A" -- sh -c 'echo moved >/workspace/m' >/dev/null 2>&1
T migrate "$A" --worker w2 >"$WORK/e" 2>&1 || notok "migrate A to w2" "$(cat "$WORK/e")"
r=$(T exec "$A" -- cat /workspace/m 2>&1)
[ "$r" = moved ] && [ ! -e "$(sbx_dir w1 "$A")" ] && [ -d "$(sbx_dir w2 "$A")" ] &&
	ok "after the migrate A runs on w2 with its files, and w1's directory of A is gone" ||
	notok "old worker's dir after migrate" "$r; $(ls -la "$(sbx_dir w1 "$A")" 2>&1 | head -n 5)"
[ -d "$STATE/snapshots/$A" ] && ok "the snapshot store keeps A's snapshot" || notok "snapshot store" "$(ls "$STATE/snapshots")"

# ---- CPU cap --------------------------------------------------------------------------
# cpu_used SBX SECONDS: CPU seconds per second its cgroup's tasks used.
cpu_used() {
	local cg t0 t1
	cg=$(cpu_cg "$1")
	t0=$(for p in $(cat "$cg/tasks"); do awk '{print $14 + $15}' /proc/"$p"/stat 2>/dev/null; done | paste -sd+ | bc)
	sleep "$2"
	t1=$(for p in $(cat "$cg/tasks"); do awk '{print $14 + $15}' /proc/"$p"/stat 2>/dev/null; done | paste -sd+ | bc)
	echo "scale=2; ($t1 - $t0) / $(getconf CLK_TCK) / $2" | bc
}
BURN='for i in 1 2; do (while :; do :; done) >/dev/null 2>&1 & done; echo started'
cg=$(cpu_cg "$B")
q=$(cat "$cg/cpu.cfs_quota_us" 2>/dev/null)/$(cat "$cg/cpu.cfs_period_us" 2>/dev/null)
[ "$q" = 100000/100000 ] && ok "B's cpu cgroup: quota 100000 us per 100000 us (the default: one CPU)" ||
	notok "default cpu cap" "$cg: $q"
if start_w3 --cpu-millis 300; then ok "worker w3 up with --cpu-millis 300"; else
	notok "worker w3 up" "$(tail -n 5 "$WORK/w3.log")"; fi
D=$(T create --worker w3 2>"$WORK/e") || notok "create D on w3" "$(cat "$WORK/e")"
T exec "$D" -- sh -c "$BURN" >"$WORK/e" 2>&1
sleep 1
used=$(cpu_used "$D" 4)
thr=$(awk '/nr_throttled/ {print $2}' "$(cpu_cg "$D")/cpu.stat")
echo "# D (two busy loops, cap 0.3 CPU): $used CPU; throttled $thr periods"
[ -n "$used" ] && [ "$(echo "$used <= 0.45 && $used >= 0.1" | bc)" = 1 ] && [ "${thr:-0}" -gt 0 ] &&
	ok "a CPU-bound sandbox is held to its cap: $used CPU for a 0.3 cap (two loops), throttled" ||
	notok "cpu cap held" "used $used, throttled $thr"
r=$(T exec "$D" -- echo alive 2>&1)
[ "$r" = alive ] && ok "honest: the capped sandbox still answers" || notok "capped sandbox answers" "$r"
T rm "$D" >/dev/null 2>&1

# ---- inotify instances are the sandbox's own -------------------------------------------
HOLD='
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while True:
    if libc.inotify_init() < 0:
        print("EMFILE" if ctypes.get_errno() == 24 else ctypes.get_errno(), "after", n, flush=True); break
    n += 1
    if n > 100000: break
time.sleep(int(sys.argv[1]))
'
ONE='
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
print("ok" if fd >= 0 else "errno %d" % ctypes.get_errno())
'
B2=$(T create --worker w2 2>"$WORK/e") || notok "create B2" "$(cat "$WORK/e")"
T exec "$B" -- sh -c "python3 -c '$HOLD' 30 >/tmp/hold.out 2>&1 & sleep 2; cat /tmp/hold.out" >"$WORK/ino" 2>&1
r_other=$(T exec "$B2" -- python3 -c "$ONE" 2>&1)
r_w1=$(T exec "$A" -- python3 -c "$ONE" 2>&1)
r_host=$(python3 -c "$ONE" 2>&1)
echo "# B: $(cat "$WORK/ino"); B2 (same worker): $r_other; A (other worker): $r_w1; host root: $r_host"
grep -q "EMFILE after" "$WORK/ino" && ok "B exhausts its inotify instances: $(cat "$WORK/ino")" ||
	notok "B exhausts inotify" "$(cat "$WORK/ino")"
[ "$r_other" = ok ] && [ "$r_w1" = ok ] && [ "$r_host" = ok ] &&
	ok "meanwhile another sandbox on w2, one on w1 and host root each get an inotify instance" ||
	notok "inotify exhaustion confined" "B2 $r_other, A $r_w1, host $r_host"
ib=$(init_of w2 "$B")
[ -n "$ib" ] && owner=$(stat -c %u /proc/"$ib"/ns/user 2>/dev/null)
ns_uid=$(python3 - "$ib" <<'EOF' 2>/dev/null
import fcntl, os, struct, sys
fd = os.open("/proc/%s/ns/user" % sys.argv[1], os.O_RDONLY)
uid = struct.pack("I", 0)
# NS_GET_OWNER_UID = _IO(0xb7, 0x4)
print(struct.unpack("I", fcntl.ioctl(fd, 0xb704, uid))[0])
EOF
)
map_b=$(awk '{print $2}' /proc/"$ib"/uid_map 2>/dev/null)
[ -n "$ns_uid" ] && [ "$ns_uid" = "$map_b" ] && [ "$ns_uid" != 0 ] &&
	ok "B's user namespace is owned by its own host uid $ns_uid, not root" ||
	notok "userns owner" "owner '$ns_uid', map base '$map_b' (init $ib)"
T rm "$B2" >/dev/null 2>&1

# ---- disjoint uid ranges per worker ----------------------------------------------------
ia=$(init_of w2 "$A")
map_a=$(awk '{print $2}' /proc/"$ia"/uid_map 2>/dev/null)
B3=$(T create --worker w1 2>"$WORK/e")
i3=$(init_of w1 "$B3")
map_3=$(awk '{print $2}' /proc/"$i3"/uid_map 2>/dev/null)
echo "# host uid bases: w1 sandbox $map_3, w2 sandboxes $map_a, $map_b"
[ -n "$map_3" ] && [ -n "$map_b" ] && [ "$map_3" -lt 269566528 ] && [ "$map_b" -ge 269566528 ] &&
	ok "w1's sandboxes map from $map_3, w2's from $map_b: disjoint per-worker ranges" ||
	notok "per-worker uid ranges" "w1 $map_3, w2 $map_b"

# ---- bridges run unprivileged ---------------------------------------------------------
bad=0
nb=0
for mp in $(mgr_pid w1) $(mgr_pid w2); do
	for bp in $(pgrep -P "$mp" -x tether-bridge); do
		nb=$((nb + 1))
		st=/proc/$bp/status
		uid=$(awk '/^Uid:/ {print $3}' "$st")
		eff=$(awk '/^CapEff:/ {print $2}' "$st")
		bnd=$(awk '/^CapBnd:/ {print $2}' "$st")
		nnp=$(awk '/^NoNewPrivs:/ {print $2}' "$st")
		echo "# bridge $bp: uid $uid CapEff $eff CapBnd $bnd NoNewPrivs $nnp"
		# CAP_DAC_READ_SEARCH (2) and CAP_SYS_PTRACE (19) only.
		[ "$uid" != 0 ] && [ "$eff" = 0000000000080004 ] && [ "$bnd" = 0000000000080004 ] &&
			[ "$nnp" = 1 ] || bad=$((bad + 1))
	done
done
[ "$nb" -gt 0 ] && [ "$bad" = 0 ] &&
	ok "every bridge ($nb) runs as a non-root uid with CapEff/CapBnd = DAC_READ_SEARCH+SYS_PTRACE, NoNewPrivs" ||
	notok "bridges unprivileged" "$bad of $nb still privileged"
r=$(T exec "$B3" -- echo via-bridge 2>&1)
[ "$r" = via-bridge ] && ok "honest: execs go through the unprivileged bridge" || notok "exec via bridge" "$r"

# ---- cp.db is private -------------------------------------------------------------
modes=$(stat -c '%a %n' "$STATE"/cp/cp.db* 2>&1)
echo "$modes" | sed 's/^/# /'
! echo "$modes" | grep -qv '^600 ' && echo "$modes" | grep -q 'cp.db-wal' &&
	ok "cp.db, cp.db-wal and cp.db-shm are 0600" || notok "cp.db modes" "$modes"

T rm "$A" >/dev/null 2>&1
T rm "$B" >/dev/null 2>&1
T rm "$B3" >/dev/null 2>&1
stop_w3
cluster_down
tap_done

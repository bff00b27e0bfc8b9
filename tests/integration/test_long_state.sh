#!/bin/bash
# Long state paths and reaped children (issue 12, item 3). A unix socket
# path holds at most 108 bytes (sun_path); under a state dir of ~200 bytes
# every worker socket is longer: each sandbox's bridge.sock, the guest
# socket the bridge connects to (after its sock_diag and peer checks), and
# manager.sock when node-api runs unprivileged from the start. Before, the
# worker refused to start ("state dir too long for a unix socket path"), or
# the first create failed ("bridge socket path too long" / "cannot reach
# the guest") and left a failed sandbox. Now:
# - `tether up --state <469 bytes>` (the longest it takes for 2 workers):
#   create, exec, cp both ways, pause/resume, migrate, rm all work;
# - an unprivileged `tetherd node` (manager.sock under its ~200-byte state
#   dir, node-api connecting as nobody) comes up and serves its status;
# - a state dir past the limit of manager/paths.h is refused at once, naming
#   the limit, by `tether up` and by `tetherd node`;
# - after 20 create/rm cycles, a pause and a resume, the manager has no
#   zombie child (before, each stopped sandbox's init stayed one).
# Prints TAP.
set -u
. "$(dirname "$0")/lib.sh"
workdir tether-long
scratch_home
BASE=$(port_base)
CP=http://127.0.0.1:$BASE
TT_DETAIL_LINES=12
NB_PID=
at_exit 'stop_pid "$NB_PID" 50'

# long_dir ROOT LEN: ROOT plus components of up to 60 chars (aaa...,
# bbb..., ...) to exactly LEN bytes (LEN > length of ROOT + 1).
long_dir() {
	local d=$1 i=0 c k
	while [ ${#d} -lt "$2" ]; do
		k=$(($2 - ${#d} - 1))
		[ $k -gt 60 ] && k=60
		[ $k -lt 1 ] && k=1
		c=$(printf "\\$(printf %03o $((97 + i % 26)))")
		d=$d/$(printf "%0.s$c" $(seq 1 "$k"))
		i=$((i + 1))
	done
	echo "$d"
}
# The longest state dir tether up takes for 2 workers: each worker's,
# STATE/workers/wN, at most 480 bytes (manager/paths.h: runtime.db within
# SQLite's pathname bound).
STATE=$(long_dir "$WORK/st" $((480 - 11))) # 11: /workers/w2
mkdir -p "$STATE"
T() { timeout 120 "$ROOT/build/tether" "$@"; }
mgr_pid() { pgrep -f -o "tetherd manager --state $STATE/workers/$1( |$)"; }
# zombies PID: its zombie children (every thread's).
zombies() {
	local n=0 c
	for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
		[ "$(awk '{print $3}' /proc/"$c"/stat 2>/dev/null)" = Z ] && n=$((n + 1))
	done
	echo "$n"
}

tail_=/workers/w1/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa/run/guest.sock
sock_len=$((${#STATE} + ${#tail_}))
cluster_up_or_bail "tether up with a ${#STATE}-byte state dir (guest socket paths ~$sock_len bytes)" 2

# ---- the sandbox verbs ------------------------------------------------------------
A=$(T create --worker w1 2>"$WORK/e")
[[ $A =~ ^sbx_ ]] && ok "create on w1" || tap_bail "create on w1" "$(cat "$WORK/e"; tail -n 5 "$STATE"/logs/w1.log)"
[ ${#STATE} -gt 108 ] && [ -S "$STATE/workers/w1/sandboxes/$A/bridge.sock" ] &&
	ok "its bridge listens at $((${#STATE} + 53))-byte $STATE/.../bridge.sock" ||
	notok "bridge.sock under the long state dir" "$(ls -la "$STATE/workers/w1/sandboxes/$A")"
r=$(T exec "$A" -- sh -c 'echo hi; exit 3' 2>&1)
rc=$?
[ "$r" = hi ] && [ $rc = 3 ] && ok "exec: output and exit status through bridge and guest" ||
	notok "exec" "rc $rc: $r"
head -c 100000 /dev/urandom >"$WORK/f"
T cp "$WORK/f" "$A:/workspace/f" >"$WORK/e" 2>&1 && T cp "$A:/workspace/f" "$WORK/g" >>"$WORK/e" 2>&1 &&
	cmp -s "$WORK/f" "$WORK/g" && ok "cp in and out, byte for byte" || notok "cp" "$(cat "$WORK/e")"
T pause "$A" >"$WORK/e" 2>&1 && T resume "$A" --worker w1 >>"$WORK/e" 2>&1 &&
	T cp "$A:/workspace/f" "$WORK/g2" >>"$WORK/e" 2>&1 && cmp -s "$WORK/f" "$WORK/g2" &&
	ok "pause, resume: the file is back" || notok "pause, resume" "$(cat "$WORK/e")"
T migrate "$A" --worker w2 >"$WORK/e" 2>&1 && T cp "$A:/workspace/f" "$WORK/h" >>"$WORK/e" 2>&1 &&
	cmp -s "$WORK/f" "$WORK/h" && ok "migrate to w2: the file came along" || notok "migrate" "$(cat "$WORK/e")"
T rm "$A" >"$WORK/e" 2>&1 && ! [ -e "$STATE/workers/w2/sandboxes/$A" ] && ok "rm" ||
	notok "rm" "$(cat "$WORK/e")"

# ---- every stopped init reaped --------------------------------------------------------
M1=$(mgr_pid w1)
fails=0
for i in $(seq 1 20); do
	id=$(T create --worker w1 2>/dev/null) && T exec "$id" -- true && T rm "$id" >/dev/null ||
		fails=$((fails + 1))
done
B=$(T create --worker w1) && T pause "$B" >/dev/null && T resume "$B" --worker w1 >/dev/null &&
	T rm "$B" >/dev/null || fails=$((fails + 1))
sleep 0.5
z=$(zombies "$M1")
expect "20 create/exec/rm cycles, a pause and a resume: the manager has 0 zombie children" \
	'[ "$fails" = 0 ] && [ "$z" = 0 ]' \
	"$fails cycles failed; $z zombies: $(ps --ppid "$M1" -o pid,stat,comm)"

# ---- manager.sock under a long state dir (an unprivileged node) ---------------------
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
	NB=$(long_dir /tmp/tether-long-nb.$$ 400)
	at_exit "rm -rf /tmp/tether-long-nb.$$"
	mkdir -p "$NB/state" "$NB/snap"
	install -m 0644 "$STATE/cp/feed.pub" "$NB/feed.pub"
	chown -R nobody "/tmp/tether-long-nb.$$"
	chmod -R u+rwX,go+rX "/tmp/tether-long-nb.$$"
	# w9's own credential, 0600 and owned by the uid node-api runs as
	TETHERD=$ROOT/build/tetherd provision "$STATE/cp" w9 "http://127.0.0.1:$((BASE + 19))" "$NB/token"
	chown nobody "$NB/token"
	setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
		"$ROOT/build/tetherd" node --id w9 --listen 127.0.0.1:$((BASE + 19)) --cp "$CP" \
		--credential-file "$NB/token" --feed-key-file "$NB/feed.pub" --state "$NB/state" --snapshots "$NB/snap" \
		--guest-bin "$ROOT/build/tether-guest" >"$WORK/w9.log" 2>&1 &
	NB_PID=$!
	w9_up() { T workers 2>/dev/null | grep -q "^w9 .*up"; }
	if wait_until 100 w9_up && [ -S "$NB/state/manager.sock" ]; then
		ok "an unprivileged node: node-api reaches its manager at the $((${#NB} + 19))-byte $NB/state/manager.sock"
	else
		notok "an unprivileged node with a long manager.sock" "$(tail -n 8 "$WORK/w9.log")"
	fi
	stop_pid "$NB_PID" 50
	NB_PID=
else
	skip "an unprivileged node with a long manager.sock" "needs root and a nobody user"
fi

# ---- past the limit: refused at once, naming it -----------------------------------------
cluster_down
TOO=$(long_dir "$WORK/too" 600)
out=$(timeout 20 "$ROOT/build/tether" up --workers 1 --state "$TOO" --port "$BASE" 2>&1)
rc=$?
expect "tether up --state <${#TOO} bytes> refuses at once, naming the limit" \
	'[ $rc = 1 ] && [[ $out == *"at most "* ]] && ! [ -e "$TOO/cp" ]' "rc $rc: $out"
out=$(timeout 20 "$ROOT/build/tetherd" node --id w8 --listen 127.0.0.1:$((BASE + 18)) --cp "$CP" \
	--credential-file /dev/null --feed-key-file "$STATE/cp/feed.pub" --state "$TOO" 2>&1)
rc=$?
expect "tetherd node --state <${#TOO} bytes> refuses at once, naming the limit" \
	'[ $rc != 0 ] && [[ $out == *"at most 480"* ]]' "rc $rc: $out"
tap_done

#!/bin/sh
# A throwaway PostgreSQL server for tests and benchmarks (Debian's
# postgresql package, scripts/deps.sh): a fresh cluster in DIR, on a free
# loopback port, trust authentication for user "tether" (loopback only).
#   scripts/pgtest.sh start DIR   prints the connection URL on stdout
#   scripts/pgtest.sh stop DIR    stops it (immediate) and removes DIR
# PostgreSQL refuses to run as root: as root, the cluster belongs to and
# runs as "nobody", in a directory of its own under /tmp (DIR, which may
# sit in a private directory, only names it). Nothing is kept between runs.
set -eu
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$bin/initdb" ] || { echo "pgtest: PostgreSQL is not installed (scripts/deps.sh)" >&2; exit 3; }
as() {
	if [ "$(id -u)" -eq 0 ]; then runuser -u nobody -- "$@"; else "$@"; fi
}
case "$cmd" in
start)
	mkdir -p "$dir"
	data=$(mktemp -d /tmp/tether-pg.XXXXXX)
	echo "$data" >"$dir/datadir"
	[ "$(id -u)" -eq 0 ] && chown nobody "$data"
	as "$bin/initdb" -D "$data/data" -U tether --auth=trust -E UTF8 \
		--no-instructions >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; exit 1; }
	tries=0
	while :; do
		port=$(( 20000 + $(od -An -N2 -tu2 /dev/urandom) % 20000 ))
		if as "$bin/pg_ctl" -D "$data/data" -l "$data/server.log" -w -t 30 \
			-o "-p $port -k $data -c listen_addresses=127.0.0.1 -c max_connections=100" \
			start >/dev/null 2>&1; then
			break
		fi
		tries=$((tries + 1))
		[ "$tries" -lt 5 ] || { cat "$data/server.log" >&2; exit 1; }
	done
	echo "$port" >"$dir/port"
	echo "postgresql://tether@127.0.0.1:$port/postgres"
	;;
stop)
	data=$(cat "$dir/datadir" 2>/dev/null || true)
	case "$data" in
	/tmp/tether-pg.*)
		[ -d "$data/data" ] && as "$bin/pg_ctl" -D "$data/data" -m immediate -w stop \
			>/dev/null 2>&1 || true
		rm -rf "$data"
		;;
	esac
	rm -rf "$dir"
	;;
*)
	echo "usage: $0 start|stop DIR" >&2
	exit 2
	;;
esac

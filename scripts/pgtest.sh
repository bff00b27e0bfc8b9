#!/bin/sh
# A throwaway PostgreSQL server for tests and benchmarks (Debian's
# postgresql package, scripts/deps.sh): a fresh cluster in DIR, on a free
# loopback port, trust authentication for user "tether" (loopback only).
#   scripts/pgtest.sh start DIR   prints the connection URL on stdout
#   scripts/pgtest.sh stop DIR    stops it (immediate) and removes DIR
# PostgreSQL refuses to run as root: as root, the cluster belongs to and
# runs as "nobody". Nothing is kept between runs.
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
	[ "$(id -u)" -eq 0 ] && chown nobody "$dir"
	chmod 0700 "$dir"
	as "$bin/initdb" -D "$dir/data" -U tether --auth=trust -E UTF8 \
		--no-instructions >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; exit 1; }
	tries=0
	while :; do
		port=$(( 20000 + $(od -An -N2 -tu2 /dev/urandom) % 20000 ))
		if as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
			-o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=100" \
			start >/dev/null 2>&1; then
			break
		fi
		tries=$((tries + 1))
		[ "$tries" -lt 5 ] || { cat "$dir/server.log" >&2; exit 1; }
	done
	echo "$port" >"$dir/port"
	echo "postgresql://tether@127.0.0.1:$port/postgres"
	;;
stop)
	[ -d "$dir/data" ] && as "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop \
		>/dev/null 2>&1 || true
	rm -rf "$dir"
	;;
*)
	echo "usage: $0 start|stop DIR" >&2
	exit 2
	;;
esac

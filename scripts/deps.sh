#!/bin/sh
# Installs the Debian packages tether builds and tests with, only when
# something is missing. Idempotent; needs root (or sudo) the first time.
set -eu
quiet=${1:-}
PKGS="build-essential pkg-config clang libclang-rt-14-dev libsodium-dev
libjansson-dev libwebsockets-dev libuv1-dev libcurl4-openssl-dev
libsqlite3-dev sqlite3 libpq-dev postgresql libseccomp-dev libcmocka-dev
iproute2 util-linux procps curl jq python3 perl e2fsprogs chromium
qemu-system-x86 qemu-utils cpio"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'ok installed' ||
		missing="$missing $p"
done
if [ -z "$missing" ]; then
	[ "$quiet" = --quiet ] || echo "deps: all packages present"
	exit 0
fi
echo "deps: installing:$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing

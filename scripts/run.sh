#!/bin/sh
# make run: starts a local cluster in the foreground (see README).
set -eu
cd "$(dirname "$0")/.."
exec build/tether up --workers 2

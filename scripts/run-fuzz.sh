#!/bin/sh
# make fuzz: runs every fuzzer for the given seconds, growing its corpus.
set -eu
cd "$(dirname "$0")/.."
secs=${1:-60}
for f in build-fuzz/fuzz_*; do
	name=$(basename "$f")
	corpus=fuzz/corpus/${name#fuzz_}
	mkdir -p "$corpus"
	echo "== $name ($secs s)"
	"$f" -max_total_time="$secs" -timeout=5 "$corpus"
done

#!/usr/bin/env bash
# Instructions per C ABI alloc/free pair (same stream; with record_stream on a second stream, also
# after 48 other streams were used; in many_streams' turns) on the simulated device, for two builds
# of libstreamalloc.so, counted by callgrind. Wall-clock medians on a shared 2-core machine move by
# 30% between runs; instruction counts repeat.
# Usage: bench/tools/icount_ab.sh BASE_LIB_DIR NEW_LIB_DIR     (each a build's lib/ folder)
set -euo pipefail
base=$1 new=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cc -O2 "$(dirname "$0")/icount_pairs.c" -o "$dir/pairs" -L"$new" -lstreamalloc
count() {  # LIB MODE N ARGS... -> instructions of the whole run
  LD_LIBRARY_PATH=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$dir/pairs" "${@:2}" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
# LIB MODE ARGS... -> instructions per pair: 120,000 pairs less 20,000 (start-up cancels out)
per_pair() { echo $(( ($(count "$1" "$2" 120000 "${@:3}") - $(count "$1" "$2" 20000 "${@:3}")) / 100000 )); }
row() {  # MODE LABEL BASE NEW
  printf '%-6s %9s %10s %10s %7.3f\n' "$1" "$2" "$3" "$4" "$(awk -v n="$4" -v b="$3" 'BEGIN { print n / b }')"
}
printf '%-6s %9s %10s %10s %7s\n' mode bytes base new new/base
for mode in same cross; do
  for bytes in 4096 1048576; do
    row "$mode" "$bytes" "$(per_pair "$base" "$mode" "$bytes")" "$(per_pair "$new" "$mode" "$bytes")"
  done
done
# The 1 MiB cross-stream pair after 48 other streams allocated once (a long-running process's other
# streams): what a miss's poll pays per stream the cache knows.
row cross "1M+48str" "$(per_pair "$base" cross 1048576 48)" "$(per_pair "$new" cross 1048576 48)"
# many_streams' turns (22 pairs each), on one stream and on 32 taking turns: the device-locked path.
per_turn_pair() { echo $(( ($(count "$1" turns 3200 "$2") - $(count "$1" turns 320 "$2")) / (2880 * 22) )); }
for streams in 1 32; do
  row turns "${streams}str" "$(per_turn_pair "$base" "$streams")" "$(per_turn_pair "$new" "$streams")"
done

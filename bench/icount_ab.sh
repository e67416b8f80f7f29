#!/usr/bin/env bash
# Instructions per C ABI alloc/free pair (same stream; with record_stream on a second stream, also
# after 48 other streams were used; in many_streams' turns) on the simulated device, for two builds
# of libstreamalloc.so, counted by callgrind. Wall-clock medians on a shared 2-core machine move by
# 30% between runs; instruction counts repeat.
# Usage: bench/icount_ab.sh BASE_LIB_DIR NEW_LIB_DIR     (each a build's lib/ folder)
set -euo pipefail
base=$1 new=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cc -O2 "$(dirname "$0")/icount_pairs.c" -o "$dir/pairs" -L"$new" -lstreamalloc
count() {  # LIB MODE N ARGS... -> instructions of the whole run
  LD_LIBRARY_PATH=$1 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$dir/pairs" "${@:2}" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '%-6s %9s %10s %10s %7s\n' mode bytes base new new/base
for mode in same cross; do
  for bytes in 4096 1048576; do
    per_pair() { echo $(( ($(count "$1" "$mode" 120000 "$bytes") - $(count "$1" "$mode" 20000 "$bytes")) / 100000 )); }
    b=$(per_pair "$base"); n=$(per_pair "$new")
    printf '%-6s %9s %10s %10s %7.3f\n' "$mode" "$bytes" "$b" "$n" "$(awk -v n="$n" -v b="$b" 'BEGIN { print n / b }')"
  done
done
# The 1 MiB cross-stream pair after 48 other streams allocated once (a long-running process's other
# streams): what a miss's poll pays per stream the cache knows.
per_pair_others() { echo $(( ($(count "$1" cross 120000 1048576 48) - $(count "$1" cross 20000 1048576 48)) / 100000 )); }
b=$(per_pair_others "$base"); n=$(per_pair_others "$new")
printf '%-6s %9s %10s %10s %7.3f\n' cross "1M+48str" "$b" "$n" "$(awk -v n="$n" -v b="$b" 'BEGIN { print n / b }')"
# many_streams' turns (22 pairs each), on one stream and on 32 taking turns: the device-locked path.
for streams in 1 32; do
  per_turn_pair() { echo $(( ($(count "$1" turns 3200 "$streams") - $(count "$1" turns 320 "$streams")) / (2880 * 22) )); }
  b=$(per_turn_pair "$base"); n=$(per_turn_pair "$new")
  printf '%-6s %9s %10s %10s %7.3f\n' turns "${streams}str" "$b" "$n" "$(awk -v n="$n" -v b="$b" 'BEGIN { print n / b }')"
done

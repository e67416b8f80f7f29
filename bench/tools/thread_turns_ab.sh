#!/usr/bin/env bash
# bench/tools/thread_turns.c for two builds of libstreamalloc.so at 1, 4 and 16 threads, with the default
# options and with hot_list_mb:64 (whose counts repeat exactly; the default's move a little with the clock).
# Usage: bench/tools/thread_turns_ab.sh BASE_LIB_DIR NEW_LIB_DIR [TURNS]     (each a build's lib/ folder)
set -euo pipefail
base=$1 new=$2 turns=${3:-100000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cc -O2 "$(dirname "$0")/thread_turns.c" -o "$dir/turns" -lpthread -L"$new" -lstreamalloc
for conf in backend:sim backend:sim,hot_list_mb:64; do
  for threads in 1 4 16; do
    for side in base new; do
      lib=$base
      [ "$side" = new ] && lib=$new
      printf '%-28s %-4s ' "$conf" "$side"
      STREAMALLOC_CONF=$conf LD_LIBRARY_PATH=$lib "$dir/turns" "$threads" "$turns"
    done
  done
done

#!/usr/bin/env bash
# Install the build into a fresh prefix and build a project against it, as a user would.
#   check_install.sh core  BUILD_DIR WORK_DIR   the "core" component only (no Torch anywhere on the path):
#                                               tests/install/consumer is configured, built and run, and
#                                               the installed streamalloc_report reads its snapshot
#   check_install.sh torch BUILD_DIR WORK_DIR TORCH_PREFIX
#                                               every component: the LibTorch example of docs/pytorch.md,
#                                               taken from the doc itself, is configured and built against
#                                               the install and Torch's CMake package at TORCH_PREFIX (not
#                                               run: it needs a GPU); exits 77 (skipped) with the reason
#                                               when TORCH_PREFIX is empty (the build has no LibTorch plugin)
set -euo pipefail
mode=$1 build=$2 work=$3 torch_prefix=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cmake=${CMAKE_COMMAND:-cmake}
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

# The projects set no C++ standard: C++17 comes from the package's targets (target_compile_features), and
# CMAKE_CXX_STANDARD=14 below would leave them at C++14, which streamalloc's headers do not compile as.
configure_and_build() {  # SOURCE BINARY PREFIX_PATH
  if ! "$cmake" -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_PREFIX_PATH=$3" \
      -DCMAKE_CXX_STANDARD=14 -DCMAKE_CXX_EXTENSIONS=OFF >"$2.configure.log" 2>&1; then
    cat "$2.configure.log"
    echo "check_install: configuring $1 against $prefix failed" >&2
    exit 1
  fi
  "$cmake" --build "$2"
}

case $mode in
  core)
    "$cmake" --install "$build" --prefix "$prefix" --component core >/dev/null
    configure_and_build "$here/consumer" "$work/consumer" "$prefix"
    "$work/consumer/consumer" "$work/snapshot.json"
    "$work/consumer/consumer_c"
    "$prefix/bin/streamalloc_report" "$work/snapshot.json" --rows 5
    ;;
  torch)
    if [[ -z $torch_prefix ]]; then
      echo "SKIPPED: this build has no LibTorch plugin (it needs Torch and the CUDA toolkit at configure time)"
      exit 77
    fi
    "$cmake" --install "$build" --prefix "$prefix" >/dev/null
    # The doc's example, as the doc has it: the C++ block and the CMake block of "## LibTorch (C++)".
    mkdir -p "$work/example"
    python3 - "$root/docs/pytorch.md" "$work/example" <<'PY'
import re, sys
doc, out = sys.argv[1], sys.argv[2]
text = open(doc, encoding="utf-8").read()
section = text.split("\n## LibTorch (C++)\n", 1)
if len(section) != 2:
    sys.exit(f"{doc}: no '## LibTorch (C++)' section")
section = re.split(r"\n## ", section[1], maxsplit=1)[0]
blocks = dict((lang, body) for lang, body in re.findall(r"```(cpp|cmake)\n(.*?)```", section, re.S))
if set(blocks) != {"cpp", "cmake"}:
    sys.exit(f"{doc}: the LibTorch section needs a ```cpp and a ```cmake block")
open(f"{out}/main.cpp", "w").write(blocks["cpp"])
open(f"{out}/CMakeLists.txt", "w").write(
    "cmake_minimum_required(VERSION 3.24)\nproject(doc_libtorch_example LANGUAGES CXX)\n"
    "add_executable(app main.cpp)\n" + blocks["cmake"])
PY
    configure_and_build "$work/example" "$work/example-build" "$prefix;$torch_prefix"
    echo "check_install: the docs/pytorch.md LibTorch example built against $prefix"
    ;;
  *)
    echo "usage: check_install.sh core|torch BUILD_DIR WORK_DIR" >&2
    exit 2
    ;;
esac

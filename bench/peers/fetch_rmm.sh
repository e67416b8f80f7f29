#!/usr/bin/env bash
# Fetch RMM (the RAPIDS Memory Manager) for the rmm_* benchmark peers: the librmm-cu13 wheel (RMM's C++
# headers, librmm.so, and the CCCL headers RMM is built against) and the rapids-logger wheel librmm.so
# needs, unpacked into one install prefix:
#
#   third_party/rmm/include   rmm/, rapids/ (CCCL 3.5: cuda/, cub/, thrust/, nv/), nvtx3/, rapids_logger/
#   third_party/rmm/lib64     librmm.so, librapids_logger.so (side by side: librmm.so finds it by $ORIGIN)
#
# bench/CMakeLists.txt builds the peers when that folder exists (STREAMALLOC_RMM_ROOT). The folder is
# git-ignored; it is ~28 MB, small enough to carry to a machine without a package index.
#
# Usage: bench/peers/fetch_rmm.sh [PREFIX]   (default: third_party/rmm at the repository root)
# Needs python3 with pip and access to a package index. Replaces PREFIX when it succeeds.
set -euo pipefail

# RMM 26.10 for CUDA 13, and the rapids-logger series it requires (its wheel metadata: rapids-logger==0.3.*).
RMM_WHEEL="librmm-cu13==26.10.0"
LOGGER_WHEEL="rapids-logger==0.3.0"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${1:-$repo_root/third_party/rmm}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetch_rmm: downloading $RMM_WHEEL and $LOGGER_WHEEL"
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work/wheels" "$RMM_WHEEL" "$LOGGER_WHEEL"

staging="$work/prefix"
mkdir -p "$staging/include" "$staging/lib64" "$staging/licenses"
for wheel in "$work"/wheels/*.whl; do
  unpacked="$work/unpacked/$(basename "$wheel" .whl)"
  python3 -m zipfile -e "$wheel" "$unpacked"
  # Each wheel holds one Python package folder (librmm/ or rapids_logger/) laid out as an install prefix.
  package="$(find "$unpacked" -mindepth 1 -maxdepth 1 -type d ! -name '*.dist-info')"
  cp -a "$package/include/." "$staging/include/"
  cp -a "$package/lib64/." "$staging/lib64/"
  name="$(basename "$package")"
  cp "$unpacked"/*.dist-info/licenses/LICENSE "$staging/licenses/$name.LICENSE"
  echo "$name $(cat "$package/VERSION")" >>"$staging/VERSIONS"
done

for needed in include/rmm/mr/arena_memory_resource.hpp include/rapids/cuda/memory_resource \
              include/rapids_logger/logger.hpp lib64/librmm.so lib64/librapids_logger.so; do
  [[ -e "$staging/$needed" ]] || { echo "fetch_rmm: $needed is missing from the wheels" >&2; exit 1; }
done

rm -rf "$prefix"
mkdir -p "$(dirname "$prefix")"
mv "$staging" "$prefix"
echo "fetch_rmm: $(tr '\n' ' ' <"$prefix/VERSIONS")in $prefix ($(du -sh "$prefix" | cut -f1))"

"""torch.cuda.MemPool(allocator=...) under PyTorch's allocator (the contract) and streamalloc: the
pool's segments come from the given allocator (a CUDAPluggableAllocator compiled here from
COUNTING_SOURCE, which counts its calls), allocations outside the pool do not reach it, graph capture
into the pool works, and deleting the pool frees through it. Then ProcessGroupNCCL's mem_allocator on a
one-rank process group, as NCCL buffer registration uses it.

Run on a CUDA machine after building:
    STREAMALLOC_LIBRARY_DIR=$PWD/build/lib PYTHONPATH=$PWD/torch_plugin \\
        python3 -m pytest -v -rs tests/python/test_gpu_mempool_allocator.py
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support import ProbeRun, requires_cuda, requires_extension, requires_native, run_probe

pytestmark = [requires_cuda, requires_native]

COUNTING_SOURCE = r"""
#include <cuda_runtime_api.h>
#include <stddef.h>
static long allocs, frees;
void* counting_malloc(size_t size, int device, cudaStream_t stream) {
  (void)device; (void)stream;
  void* ptr = NULL;
  if (cudaMalloc(&ptr, size) != cudaSuccess) return NULL;
  __atomic_add_fetch(&allocs, 1, __ATOMIC_RELAXED);
  return ptr;
}
void counting_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  (void)size; (void)device; (void)stream;
  cudaFree(ptr);
  __atomic_add_fetch(&frees, 1, __ATOMIC_RELAXED);
}
long counting_allocs(void) { return __atomic_load_n(&allocs, __ATOMIC_RELAXED); }
long counting_frees(void) { return __atomic_load_n(&frees, __ATOMIC_RELAXED); }
"""

ALLOCATORS = [pytest.param("native", id="native"),
              pytest.param("streamalloc", id="streamalloc", marks=requires_extension)]


def cuda_home() -> Path | None:
    for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if candidate and (Path(candidate) / "include" / "cuda_runtime_api.h").exists():
            return Path(candidate)
    return None


@functools.lru_cache(maxsize=None)
def counting_library(folder: str) -> str:
    home = cuda_home()
    compiler = shutil.which("cc") or shutil.which("gcc")
    if home is None or compiler is None:
        pytest.skip("building the counting allocator needs a C compiler and the CUDA toolkit (CUDA_HOME)")
    source = Path(folder) / "counting.c"
    source.write_text(COUNTING_SOURCE)
    library = Path(folder) / "libcounting.so"
    lib_dirs = [d for d in (home / "lib64", home / "lib") if d.is_dir()]
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", f"-I{home / 'include'}", str(source), "-o", str(library),
                    *[f"-L{d}" for d in lib_dirs], "-lcudart"], check=True)
    return str(library)


@functools.lru_cache(maxsize=None)
def probe(allocator: str, library: str) -> ProbeRun:
    return run_probe("mempool_allocator_probe.py", allocator, (library,), timeout=300)


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> str:
    return counting_library(str(tmp_path_factory.mktemp("counting")))


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_pool_segments_come_from_the_given_allocator(allocator, library):
    f = probe(allocator, library).facts("routing_capture_and_delete")
    start = f["start"]["allocs"]
    assert f["after_use_mem_pool"]["allocs"] > start, f
    assert f["after_outside_allocation"] == f["after_use_mem_pool"], "an allocation outside the pool used it"
    assert f["pool_tensors_in_pool_segments"] and not f["outside_tensor_in_pool_segments"], f
    assert f["values"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_graph_capture_into_the_pool(allocator, library):
    f = probe(allocator, library).facts("routing_capture_and_delete")
    assert f["graph_output_in_pool_segments"] and f["graph_values"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_deleting_the_pool_frees_through_the_allocator(allocator, library):
    f = probe(allocator, library).facts("routing_capture_and_delete")
    assert f["after_capture"]["frees"] == 0, f
    assert f["after_pool_deleted"]["frees"] == f["after_pool_deleted"]["allocs"] > 0, f
    assert f["after_empty_cache"] == f["after_pool_deleted"], "the default pool's empty_cache used the allocator"


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_nccl_mem_allocator_one_rank(allocator, library):
    # PyTorch's allocator is the contract: where NCCL's registered memory does not work under it on this
    # machine (NCCL's cuMem allocation refused, say), there is nothing to compare.
    contract = probe("native", library).result()["behaviours"]["nccl_mem_allocator"]
    if "skipped" in contract:
        pytest.skip(contract["skipped"])
    if "error" in contract:
        pytest.skip("NCCL's mem_allocator fails under PyTorch's allocator too on this machine: "
                    + contract["error"].strip().splitlines()[-1])
    f = probe(allocator, library).facts("nccl_mem_allocator")
    assert f == {"in_pool": True, "all_reduce_values": True}, f

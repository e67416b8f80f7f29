"""torch.cuda.MemPool(allocator=...): a pool whose segments come from another allocator, here a tiny
CUDAPluggableAllocator (LIBRARY, built by the test) that counts its calls. Run under PyTorch's
allocator (the contract) and under streamalloc; prints one JSON line.

    mempool_allocator_probe.py LIBRARY
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import behaviour, emit  # noqa: E402

MiB = 1 << 20


def main() -> None:
    library = sys.argv[1]
    counts = ctypes.CDLL(library)
    counts.counting_allocs.restype = ctypes.c_long
    counts.counting_frees.restype = ctypes.c_long
    counting = torch.cuda.memory.CUDAPluggableAllocator(library, "counting_malloc", "counting_free")
    torch.cuda.init()
    results: dict = {"behaviours": {}}
    facts = results["behaviours"]

    def calls():
        return {"allocs": counts.counting_allocs(), "frees": counts.counting_frees()}

    def pool_segments(pool):
        return [(s["address"], s["total_size"]) for s in pool.snapshot()]

    def inside(ptr, segments):
        return any(base <= ptr < base + size for base, size in segments)

    def routing_capture_and_delete():
        out: dict = {"start": calls()}
        pool = torch.cuda.MemPool(counting.allocator())
        with torch.cuda.use_mem_pool(pool):
            small = torch.full((1024,), 3.0, device="cuda")
            large = torch.full((8 * MiB,), 4.0, device="cuda")
        out["after_use_mem_pool"] = calls()
        outside = torch.ones(8 * MiB, device="cuda")
        out["after_outside_allocation"] = calls()
        segments = pool_segments(pool)
        out["pool_tensors_in_pool_segments"] = inside(small.data_ptr(), segments) and inside(large.data_ptr(), segments)
        out["outside_tensor_in_pool_segments"] = inside(outside.data_ptr(), segments)
        out["values"] = bool((small == 3).all().item() and (large == 4).all().item())

        # Graph capture into the pool.
        static_in = torch.full((4 * MiB,), 2.0, device="cuda")
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static_in * 2  # warm-up, as torch.cuda.graph's users do
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph, pool=pool.id):
            static_out = static_in * 2 + 1
        static_in.fill_(5.0)
        graph.replay()
        torch.cuda.synchronize()
        out["after_capture"] = calls()
        out["graph_output_in_pool_segments"] = inside(static_out.data_ptr(), pool_segments(pool))
        out["graph_values"] = bool((static_out == 11.0).all().item())

        del small, large, static_out, graph
        gc.collect()
        out["use_count_before_delete"] = pool.use_count()
        del pool
        gc.collect()
        torch.cuda.synchronize()
        out["after_pool_deleted"] = calls()
        del outside
        torch.cuda.empty_cache()
        out["after_empty_cache"] = calls()
        return out

    behaviour(facts, "routing_capture_and_delete", routing_capture_and_delete)

    def nccl_mem_allocator():
        import torch.distributed as dist

        if not dist.is_nccl_available():
            return {"skipped": "NCCL is not available in this torch"}
        with tempfile.TemporaryDirectory() as folder:
            store = dist.FileStore(os.path.join(folder, "store"), 1)
            dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
            try:
                backend = dist.group.WORLD._get_backend(torch.device("cuda"))
                allocator = backend.mem_allocator
                pool = torch.cuda.MemPool(allocator)
                with torch.cuda.use_mem_pool(pool):
                    tensor = torch.full((1 << 20,), 2.0, device="cuda")
                in_pool = inside(tensor.data_ptr(), pool_segments(pool))
                dist.all_reduce(tensor)
                torch.cuda.synchronize()
                values = bool((tensor == 2.0).all().item())
                del tensor
                gc.collect()
                del pool
                gc.collect()
                return {"in_pool": in_pool, "all_reduce_values": values}
            finally:
                dist.destroy_process_group()

    behaviour(facts, "nccl_mem_allocator", nccl_mem_allocator)
    emit(results)


if __name__ == "__main__":
    main()

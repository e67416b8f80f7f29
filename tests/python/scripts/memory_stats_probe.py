"""torch.cuda.memory_stats() and friends after a known set of allocations, under any allocator."""

import torch
from _common import emit, streamalloc_enabled

MiB = 1 << 20
# Small-pool sizes, large-pool sizes that split a 20 MiB segment, and one size with its own segment.
SIZES = [1, 100, 513, 4097, 100_000, 3 * MiB + 7, 5 * MiB, 24 * MiB - 100]


def round512(n: int) -> int:
    return max(512, (n + 511) // 512 * 512)


def main() -> None:
    # torch.cuda.memory_stats()'s keys in each state, to compare with PyTorch's allocator: before CUDA
    # is initialised (an empty dict under any allocator), after initialisation, with live blocks, after
    # empty_cache() and after each reset.
    keys = {"fresh": sorted(torch.cuda.memory_stats())}
    torch.cuda.init()
    keys["initialised"] = sorted(torch.cuda.memory_stats())
    tensors = [torch.empty(s, dtype=torch.uint8, device="cuda") for s in SIZES]
    torch.cuda.synchronize()
    keys["allocated"] = sorted(torch.cuda.memory_stats())
    result = {
        "expected_allocated": sum(round512(s) for s in SIZES),
        "memory_allocated": torch.cuda.memory_allocated(),
        "memory_reserved": torch.cuda.memory_reserved(),
        "keys": sorted(torch.cuda.memory_stats().keys()),
        "live_allocations": torch.cuda.memory_stats()["allocation.all.current"],
    }
    if streamalloc_enabled():
        import streamalloc

        torch_view = torch.cuda.memory_stats()
        own = streamalloc.stats()["memory_stats"]  # nothing allocates in between
        result["differing"] = {k: [torch_view[k], v] for k, v in own.items() if k in torch_view and torch_view[k] != v}
        result["streamalloc_only_keys"] = sorted(k for k in own if k not in torch_view)

    big = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    result["peak_with_big"] = torch.cuda.max_memory_allocated()
    del big
    result["current_after_big"] = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result["peak_after_reset"] = torch.cuda.max_memory_allocated()
    result["current_after_reset"] = torch.cuda.memory_allocated()
    result["fraction"] = torch.cuda.get_per_process_memory_fraction()
    keys["peak_reset"] = sorted(torch.cuda.memory_stats())
    torch.cuda.reset_accumulated_memory_stats()
    keys["accumulated_reset"] = sorted(torch.cuda.memory_stats())
    del tensors
    torch.cuda.empty_cache()
    keys["emptied"] = sorted(torch.cuda.memory_stats())
    result["reserved_after_empty_cache"] = torch.cuda.memory_reserved()
    result["keys_by_state"] = keys
    emit(result)


if __name__ == "__main__":
    main()

"""PyTorch's record_stream contract, probed the same way under any allocator.

A tensor used on a busy side stream and then freed must not be handed out again before that stream
has finished with it, if (and only if) record_stream told the allocator; recording a view that starts
inside the block protects the whole block; once the side stream is synchronised the memory is
reusable. Each scenario uses its own size (whole segments above 10 MiB, so nothing else fits there),
so that "the same address comes back" means "the freed block was reused"."""

import torch

from _common import emit, streamalloc_enabled

MiB = 1 << 20
BUSY_CYCLES = 2_000_000_000  # ~1 s of side-stream work; every check below runs well inside it


def block_of(ptr: int):
    import streamalloc

    return next((b for b in streamalloc.blocks() if b["address"] == ptr), None)


def scenario(size_mib: int, protect: str, side: torch.cuda.Stream) -> dict:
    main = torch.cuda.current_stream()
    n = size_mib * MiB // 4
    base = torch.ones(n, device="cuda")
    ptr = base.data_ptr()
    view = base[n // 2:]  # a view that starts inside the block
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(BUSY_CYCLES)
        view.mul_(2)
    if protect == "base":
        base.record_stream(side)
    elif protect == "view":
        view.record_stream(side)
    del base, view
    again = torch.empty(n, device="cuda")
    result = {"reused_while_busy": again.data_ptr() == ptr, "side_busy": not side.query()}
    if streamalloc_enabled():
        block = block_of(ptr)
        result["state_while_busy"] = block and block["state"]
        result["recorded_streams"] = block and block["recorded_streams"]
    side.synchronize()
    keep, attempts, reused = [again], 0, result["reused_while_busy"]
    while not reused and attempts < 8:
        attempts += 1
        torch.cuda.synchronize()
        keep.append(torch.empty(n, device="cuda"))
        reused = keep[-1].data_ptr() == ptr
    result.update(reused_after_sync=reused, attempts_after_sync=attempts)
    return result


def main() -> None:
    side = torch.cuda.Stream()
    # Warm up: the first launch of each kernel loads its module on the host, which can outlast the spin.
    warm = torch.ones(1024, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(1)
        warm[512:].mul_(2)
    torch.cuda.synchronize()
    scenarios = {
        "unprotected": scenario(12, "none", side),
        "record_base": scenario(14, "base", side),
        "record_view": scenario(16, "view", side),
    }
    result = {"scenarios": scenarios, "side_stream": side.cuda_stream}
    if streamalloc_enabled():
        import streamalloc

        result["stream_stats"] = streamalloc.stats()["stream_stats"]
    emit(result)


if __name__ == "__main__":
    main()

"""PyTorch's record_stream contract, probed the same way under any allocator.

A tensor used on a busy side stream and then freed must not be handed out again before that stream
has finished with it, if (and only if) record_stream told the allocator; recording a view that starts
inside the block protects the whole block; once the host has synchronised with the side stream
(stream.synchronize(), torch.cuda.synchronize() or an event's synchronize()), the next allocation of the
same size on the block's stream gets it back. Each scenario uses its own size (whole segments above
10 MiB, so nothing else fits there), so that "the same address comes back" means "the freed block was
reused"."""

import torch
from _common import emit, streamalloc_enabled

MiB = 1 << 20
BUSY_CYCLES = 2_000_000_000  # ~1 s of side-stream work; every check below runs well inside it


def block_of(ptr: int):
    import streamalloc

    return next((b for b in streamalloc.blocks() if b["address"] == ptr), None)


def host_sync(how: str, side: torch.cuda.Stream) -> None:
    if how == "stream":
        side.synchronize()
    elif how == "device":
        torch.cuda.synchronize()
    else:  # an event recorded on the side stream behind its work
        event = torch.cuda.Event()
        event.record(side)
        event.synchronize()


def scenario(size_mib: int, protect: str, side: torch.cuda.Stream, sync: str = "stream") -> dict:
    main = torch.cuda.current_stream()
    n = size_mib * MiB // 4
    base = torch.ones(n, device="cuda")
    ptr = base.data_ptr()
    view = base[n // 2:]  # a view that starts inside the block (a storage offset)
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
    host_sync(sync, side)
    after = torch.empty(n, device="cuda")  # the first allocation after the sync
    result["reused_after_sync"] = after.data_ptr() == ptr
    del again, after
    return result


def open_batch_scenario(side: torch.cuda.Stream) -> dict:
    """Two recorded blocks freed back to back, nothing allocated until the host sync: under streamalloc
    the first free puts a fence in flight and the second joins the side stream's open batch, which is
    still open (no event) when the host synchronises. The first allocation after the sync must get it."""
    main = torch.cuda.current_stream()
    first = torch.ones(24 * MiB // 4, device="cuda")
    second = torch.ones(26 * MiB // 4, device="cuda")
    ptr = second.data_ptr()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(BUSY_CYCLES)
        first.mul_(2)
        second.mul_(2)
    first.record_stream(side)
    second.record_stream(side)
    del first, second
    result = {"side_busy": not side.query()}
    side.synchronize()
    after = torch.empty(26 * MiB // 4, device="cuda")
    result["reused_after_sync"] = after.data_ptr() == ptr
    del after
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
        "record_base_device_sync": scenario(18, "base", side, sync="device"),
        "record_view_event_sync": scenario(22, "view", side, sync="event"),
        "open_batch": open_batch_scenario(side),
    }
    result = {"scenarios": scenarios, "side_stream": side.cuda_stream}
    if streamalloc_enabled():
        import streamalloc

        result["stream_stats"] = streamalloc.stats()["stream_stats"]
    emit(result)


if __name__ == "__main__":
    main()

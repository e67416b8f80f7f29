"""torch.cuda.memory._snapshot() under streamalloc, fed to every torch.cuda._memory_viz view."""

import collections
import os
import pickle
import tempfile

import streamalloc
import torch
from _common import emit
from torch.cuda import _memory_viz

MiB = 1 << 20


def check_viz(snapshot: dict) -> list[str]:
    """Run each memory_viz view; return the names of those that worked."""
    local = lambda lines: lines  # noqa: E731  (memory()/segments() would fetch flamegraph.pl)
    views = {
        "segsum": lambda: _memory_viz.segsum(snapshot),
        "trace": lambda: _memory_viz.trace(snapshot),
        "segments": lambda: _memory_viz.segments(snapshot, format_flamegraph=local),
        "memory": lambda: _memory_viz.memory(snapshot, format_flamegraph=local),
        "trace_plot": lambda: _memory_viz.trace_plot(snapshot),
        "segment_plot": lambda: _memory_viz.segment_plot(snapshot),
    }
    worked = []
    for name, view in views.items():
        view()
        worked.append(name)
    return worked


def main() -> None:
    keep = [torch.empty(n, device="cuda") for n in (100, 1000, 300_000, 3 * MiB)]
    # One block pending free: used on a busy side stream, recorded, dropped.
    side = torch.cuda.Stream()
    pending = torch.ones(2 * MiB, device="cuda")
    pending_ptr = pending.data_ptr()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(400_000_000)
        pending.add_(1)
    pending.record_stream(side)
    del pending

    snapshot = torch.cuda.memory._snapshot()
    ours = streamalloc.snapshot()
    states = collections.Counter(b["state"] for s in snapshot["segments"] for b in s["blocks"])
    result = {
        "states": dict(states),
        "segment_allocated_sum": sum(s["allocated_size"] for s in snapshot["segments"]),
        "memory_allocated": torch.cuda.memory_allocated(),
        "viz_torch": check_viz(snapshot),
        "viz_streamalloc": check_viz(ours),
        "pending_in_ours": [b for b in streamalloc.blocks() if b["address"] == pending_ptr],
        "side_stream": side.cuda_stream,
        "settings": snapshot["allocator_settings"].get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            result["pickled_segments"] = len(pickle.load(f)["segments"])
    side.synchronize()
    del keep
    emit(result)


if __name__ == "__main__":
    main()

"""Turn a memory snapshot with allocation history into memory_viz's page and a picture of its timeline.

    python examples/seed_fixed_pipeline.py --steps 200 --memory-history native.pickle
    python -m streamalloc examples/seed_fixed_pipeline.py --steps 200 --memory-history streamalloc.pickle
    python examples/memory_viz.py streamalloc.pickle --html timeline.html --png timeline.png

The HTML is PyTorch's own memory_viz page (torch.cuda._memory_viz.trace_plot, "Active Memory
Timeline"); it loads memory_viz's script from the web when opened. The picture is drawn here with
matplotlib from the same trace, so it can be looked at without a browser: the bytes allocated on each
stream over time, and on top of them the bytes whose free was requested but is not complete yet
(free_requested -> free_completed: the block was used on another stream, via record_stream, and the
allocator holds it until that stream's work is done). Works for any snapshot with device_traces, from
PyTorch's native allocator or from streamalloc.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from collections import defaultdict


def _stream_name(stream: int, names: dict[int, str]) -> str:
    return names.get(stream) or ("default stream" if not stream else f"stream {stream:#x}")


def timeline(trace: list[dict]) -> tuple[list[float], dict[int, list[int]], dict[int, list[int]], list[tuple]]:
    """Step functions over the trace's times (ms from its first entry): allocated and held-back bytes
    per stream (the allocation's stream), and the holds (stream, start ms, end ms, bytes, metadata)."""
    if not trace:
        return [], {}, {}, []
    t0 = trace[0]["time_us"]
    live: dict[int, tuple[int, int]] = {}  # addr -> (stream, size) of allocated blocks
    held: dict[int, tuple[int, int, float, str]] = {}  # addr -> (stream, size, since ms, metadata)
    allocated: dict[int, int] = defaultdict(int)
    pending: dict[int, int] = defaultdict(int)
    times: list[float] = []
    samples_alloc: list[dict[int, int]] = []
    samples_pending: list[dict[int, int]] = []
    holds: list[tuple] = []
    for entry in trace:
        action, addr, size = entry["action"], entry["addr"], entry["size"]
        now = (entry["time_us"] - t0) / 1000.0
        if action == "alloc":
            live[addr] = (entry["stream"], size)
            allocated[entry["stream"]] += size
        elif action == "free_requested" and addr in live:
            stream, size = live.pop(addr)
            allocated[stream] -= size
            held[addr] = (stream, size, now, entry.get("user_metadata", ""))
            pending[stream] += size
        elif action == "free_completed" and addr in held:
            stream, size, since, metadata = held.pop(addr)
            pending[stream] -= size
            if now > since:
                holds.append((stream, since, now, size, entry.get("user_metadata") or metadata))
        else:
            continue
        times.append(now)
        samples_alloc.append(dict(allocated))
        samples_pending.append(dict(pending))
    streams = sorted({s for sample in samples_alloc + samples_pending for s in sample})
    alloc_series = {s: [sample.get(s, 0) for sample in samples_alloc] for s in streams}
    pending_series = {s: [sample.get(s, 0) for sample in samples_pending] for s in streams}
    return times, alloc_series, pending_series, holds


def draw(snapshot: dict, out: str, title: str, device: int = 0) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("--png needs matplotlib (pip install matplotlib)")
    trace = snapshot["device_traces"][device]
    times, alloc_series, pending_series, holds = timeline(trace)
    if not times:
        sys.exit(f"the snapshot has no trace entries on device {device}: record history before the workload "
                 "(torch.cuda.memory._record_memory_history())")
    mib = float(1 << 20)
    streams = list(alloc_series)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    layers, labels, colors, hatches = [], [], [], []
    palette = plt.get_cmap("tab10").colors
    for i, stream in enumerate(streams):
        layers.append([v / mib for v in alloc_series[stream]])
        labels.append(f"allocated, {_stream_name(stream, {})}")
        colors.append(palette[i % len(palette)])
        hatches.append(None)
    for i, stream in enumerate(streams):
        if any(pending_series[stream]):
            layers.append([v / mib for v in pending_series[stream]])
            labels.append(f"freed, held for another stream, {_stream_name(stream, {})}")
            colors.append(palette[i % len(palette)])
            hatches.append("////")
    polys = top.stackplot(times, layers, labels=labels, colors=colors, step="post", alpha=0.8)
    for poly, hatch in zip(polys, hatches):
        if hatch:
            poly.set_hatch(hatch)
            poly.set_alpha(0.35)
    top.set_ylabel("MiB")
    top.set_title(title)
    top.legend(loc="upper left", fontsize=8)
    for row, (stream, start, end, size, _metadata) in enumerate(holds[:400]):
        bottom.plot([start, end], [row, row], color=palette[streams.index(stream) % len(palette)], linewidth=1.5)
    durations = sorted(end - start for _, start, end, _, _ in holds)
    median = durations[len(durations) // 2] * 1000.0 if durations else 0.0
    bottom.set_ylabel("held-back frees")
    bottom.set_xlabel("time since the first trace entry (ms)")
    bottom.set_title(f"free_requested -> free_completed of each freed block used on another stream "
                     f"({len(holds)} blocks, median hold {median:.0f} us)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", help="a pickle from torch.cuda.memory._dump_snapshot()")
    parser.add_argument("--html", help="write memory_viz's Active Memory Timeline page here")
    parser.add_argument("--png", help="write the picture of the timeline here")
    parser.add_argument("--title", default=None)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    if args.html:
        from torch.cuda import _memory_viz

        with open(args.html, "w") as f:
            f.write(_memory_viz.trace_plot(snapshot))
    if args.png:
        draw(snapshot, args.png, args.title or args.snapshot, args.device)
    if not args.html and not args.png:
        parser.error("name --html and/or --png")


if __name__ == "__main__":
    main()

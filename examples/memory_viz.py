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


def _scale(values: list[int]) -> tuple[float, str]:
    peak = max(values, default=0)
    for factor, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if peak >= factor:
            return float(factor), unit
    return 1.0, "bytes"


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
    streams = list(alloc_series)
    palette = plt.get_cmap("tab10").colors
    # One panel per stream, each on its own scale: a stream holding a few small batches back would
    # vanish next to another stream's long-lived weights on a shared axis.
    fig, axes = plt.subplots(len(streams) + 1, 1, figsize=(11, 2.2 * len(streams) + 3), sharex=True)
    for i, (stream, ax) in enumerate(zip(streams, axes)):
        color = palette[i % len(palette)]
        factor, unit = _scale([a + p for a, p in zip(alloc_series[stream], pending_series[stream])])
        allocated = [v / factor for v in alloc_series[stream]]
        held = [(a + p) / factor for a, p in zip(alloc_series[stream], pending_series[stream])]
        ax.fill_between(times, 0, allocated, step="post", color=color, alpha=0.8, label="allocated")
        if any(pending_series[stream]):
            ax.fill_between(times, allocated, held, step="post", facecolor="none", edgecolor=color, hatch="////",
                            linewidth=0.0, label="freed, held until the streams that used it are done")
        ax.set_ylabel(unit)
        ax.set_title(f"blocks allocated on {_stream_name(stream, {})}", fontsize=9, loc="left")
        ax.legend(loc="upper right", fontsize=8)
    axes[0].figure.suptitle(title)
    bottom = axes[-1]
    for i, stream in enumerate(streams):
        mine = [(start, (end - start) * 1000.0) for s, start, end, _, _ in holds if s == stream]
        if mine:
            bottom.scatter([m[0] for m in mine], [m[1] for m in mine], s=6, color=palette[i % len(palette)],
                           label=_stream_name(stream, {}))
    durations = sorted((end - start) * 1000.0 for _, start, end, _, _ in holds)
    median = durations[len(durations) // 2] if durations else 0.0
    bottom.set_ylabel("held (us)")
    bottom.set_xlabel("time since the first trace entry (ms)")
    bottom.set_title(f"free_requested -> free_completed of each block held back at its free ({len(holds)} blocks, "
                     f"median {median:.0f} us), by the stream it was allocated on", fontsize=9, loc="left")
    if holds:
        bottom.legend(loc="upper right", fontsize=8)
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

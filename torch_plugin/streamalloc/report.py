"""Human-readable reports of streamalloc's stats and snapshots. Needs neither torch nor CUDA.

    python -m streamalloc.report FILE.json [--blocks N] [--timeline OUT.png|.svg|.html]

FILE is what streamalloc.dump() writes, or a bare stats(), snapshot() or pending_history() dict saved
as JSON ("-" reads standard input). --timeline draws the pending bytes of each stream over time (needs
matplotlib and a run with pending_history:N).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(count: int | float) -> str:
    """"1.50 MiB", as the C++ library writes byte counts."""
    value = float(count)
    unit = 0
    while abs(value) >= 1024.0 and unit < len(_UNITS) - 1:
        value /= 1024.0
        unit += 1
    return f"{int(count)} B" if unit == 0 else f"{value:.2f} {_UNITS[unit]}"


def _paths(entry):
    """A stream's path counts, as a suffix of its line ('' when it has none)."""
    cached, locked = entry.get("allocations_cached", 0), entry.get("allocations_device_locked", 0)
    if not cached and not locked:
        return ""
    flushes = entry.get("hot_list_flushes", 0)
    return f"; allocations {cached} cached / {locked} device-locked, {flushes} hot-list flushes"


def _stream(value: int | None) -> str:
    return "default" if not value else hex(value)


def _stream_label(history: dict, stream: int) -> str:
    """'stream 0x2', or 'compute (stream 0x2)' where the history names its streams (the demo's does)."""
    name = history.get("stream_names", {}).get(str(stream))
    return f"{name} (stream {_stream(stream)})" if name else f"stream {_stream(stream)}"


def _device_label(device: str, history: dict) -> str:
    """'device 0', or 'device 0 (simulated device)' where the history says what kind of device ran."""
    kind = history.get("device_kind")
    return f"device {device} ({kind})" if kind else f"device {device}"


def _count(stat) -> int:
    return stat.get("current", 0) if isinstance(stat, dict) else int(stat or 0)


def format_stats(stats: dict, device: int | str | None = None) -> str:
    """A few lines summing up one device's stats() dict: memory, then stream behaviour, with hints
    where the numbers show a wasteful or suspicious use of record_stream."""
    title = "streamalloc" if device is None else f"streamalloc device {device}"
    if not stats:
        return f"{title}: no statistics (CUDA not initialised yet)"
    mem = stats.get("memory_stats", {})
    st = stats.get("stream_stats", {})

    def m(key: str) -> int:
        return int(mem.get(key, 0))

    lines = [
        title,
        f"  memory      allocated {format_bytes(m('allocated_bytes.all.current'))} "
        f"(peak {format_bytes(m('allocated_bytes.all.peak'))}), "
        f"reserved {format_bytes(m('reserved_bytes.all.current'))} "
        f"(peak {format_bytes(m('reserved_bytes.all.peak'))}), "
        f"live blocks {m('allocation.all.current')}",
        f"  device      {m('num_device_alloc')} reservations, {m('num_device_free')} releases, "
        f"{m('num_alloc_retries')} retries, {m('num_ooms')} OOMs",
    ]
    if not st:
        return "\n".join(lines)
    lines.append(
        f"  record_stream {st.get('record_stream_calls', 0)} calls: "
        f"{st.get('record_stream_on_alloc_stream', 0)} on the allocation stream, "
        f"{st.get('record_stream_duplicate', 0)} duplicate, "
        f"{st.get('record_stream_unknown_ptr', 0)} on pointers not live")
    lines.append(
        f"  fences      {st.get('fences_recorded', 0)} recorded, {st.get('fences_polled', 0)} polled, "
        f"{st.get('fences_waited_gpu', 0)} waited on the GPU, {st.get('fences_synced_host', 0)} synced on the host")
    lines.append(
        f"  reuse       {st.get('cross_stream_reuse_settled', 0)} blocks of other streams taken when settled, "
        f"{st.get('cross_stream_reuse_waited', 0)} after a GPU wait")
    pending_blocks = st.get("pending_blocks", {})
    pending_bytes = st.get("pending_bytes", {})
    lines.append(
        f"  pending     {_count(pending_blocks)} blocks / {format_bytes(_count(pending_bytes))} now, peak "
        f"{pending_blocks.get('peak', 0)} blocks / {format_bytes(pending_bytes.get('peak', 0))}")
    for entry in st.get("per_stream", []):
        lines.append(
            f"    stream {_stream(entry.get('stream'))}: {_count(entry.get('pending_blocks', {}))} blocks / "
            f"{format_bytes(_count(entry.get('pending_bytes', {})))} pending now, peak "
            f"{entry.get('pending_blocks', {}).get('peak', 0)}" + _paths(entry))
    cached, locked = st.get("allocations_cached", 0), st.get("allocations_device_locked", 0)
    if cached or locked:
        lines.append(
            f"  paths       {cached} allocations served by their stream's shard alone, {locked} took the device "
            f"lock; the device lock taken {st.get('device_lock_acquisitions', 0)} times, waited "
            f"{st.get('device_lock_wait_ns', 0) / 1e6:.1f} ms, held {st.get('device_lock_held_ns', 0) / 1e6:.1f} ms; "
            f"{st.get('headroom_gathers', 0)} headroom gathers, {st.get('hot_list_flushes', 0)} hot-list flushes")
    histogram = [(b.get("below_us"), b.get("count", 0)) for b in st.get("free_to_reusable_us", [])]
    if any(count for _, count in histogram):
        cells = [f"<{_us(limit)}: {count}" if limit is not None else f"more: {count}"
                 for limit, count in histogram if count]
        lines.append("  free->reusable  " + ", ".join(cells))
    if st.get("frees_deferred_capture", 0):
        lines.append(f"  capture     {st['frees_deferred_capture']} frees waited for a graph capture to end")
    if st.get("invalid_frees", 0):
        lines.append(f"  invalid     {st['invalid_frees']} frees rejected (double free, foreign pointer, wrong size)")
    if st.get("missing_wait_warnings", 0):
        lines.append(f"  check_sync  {st['missing_wait_warnings']} blocks used on a stream never ordered after their "
                     "producer")
    lines.extend("  hint: " + hint for hint in stream_hints(st))
    return "\n".join(lines)


def _us(limit: int) -> str:
    if limit >= 1_000_000:
        return f"{limit // 1_000_000}s"
    if limit >= 1000:
        return f"{limit // 1000}ms"
    return f"{limit}us"


def stream_hints(stream_stats: dict) -> list[str]:
    """What the stream stats suggest fixing (the checklist: record_stream only where a tensor
    crosses streams, once, while it is still alive)."""
    hints = []
    if stream_stats.get("record_stream_on_alloc_stream", 0):
        hints.append("record_stream on the stream that allocated the tensor does nothing; drop those calls")
    if stream_stats.get("record_stream_duplicate", 0):
        hints.append("record_stream repeated for the same tensor and stream; one call per stream is enough")
    if stream_stats.get("record_stream_unknown_ptr", 0):
        hints.append("record_stream on tensors already freed comes too late to protect them; call it while "
                     "the tensor is alive, right after handing it to the other stream")
    if stream_stats.get("invalid_frees", 0):
        hints.append("frees were rejected: run with audit:warn to see which")
    if stream_stats.get("missing_wait_warnings", 0):
        hints.append("a consumer stream read memory without waiting for the stream that filled it: add "
                     "consumer.wait_event(<event recorded after the producer's work>) before the read")
    return hints


def format_blocks(blocks: Iterable[dict], limit: int = 20) -> str:
    """The largest allocated and pending blocks with their streams (free blocks are left out)."""
    used = [b for b in blocks if b.get("state") != "inactive"]
    used.sort(key=lambda b: b.get("size", 0), reverse=True)
    if not used:
        return "no allocated or pending blocks"
    lines = [f"{'address':>16} {'size':>11} {'state':<20} {'alloc stream':>14}  recorded streams (calls), "
             "fences left, age"]
    for block in used[:limit]:
        recorded = ", ".join(_stream(s) for s in block.get("recorded_streams", [])) or "-"
        lines.append(
            f"{hex(block.get('address', 0)):>16} {format_bytes(block.get('size', 0)):>11} "
            f"{block.get('state', '?'):<20} {_stream(block.get('allocation_stream')):>14}  "
            f"{recorded} ({block.get('record_stream_calls', 0)}), {block.get('pending_fences', 0)}, "
            f"{block.get('age_ms', 0):.1f} ms")
    if len(used) > limit:
        lines.append(f"... and {len(used) - limit} more")
    return "\n".join(lines)


def format_snapshot(snapshot: dict, limit: int = 10) -> str:
    """Per device: segments, reserved and allocated bytes, pending blocks; then the largest blocks."""
    segments = snapshot.get("segments", [])
    lines = []
    for device in sorted({s.get("device", 0) for s in segments}):
        mine = [s for s in segments if s.get("device", 0) == device]
        reserved = sum(s.get("total_size", 0) for s in mine)
        allocated = sum(s.get("allocated_size", 0) for s in mine)
        pending = [b for s in mine for b in s.get("blocks", []) if b.get("state") == "active_pending_free"]
        lines.append(f"device {device}: {len(mine)} segments, {format_bytes(reserved)} reserved, "
                     f"{format_bytes(allocated)} allocated, {len(pending)} blocks pending free "
                     f"({format_bytes(sum(b.get('size', 0) for b in pending))})")
        flat = [b for s in mine for b in s.get("blocks", [])]
        lines.append(format_blocks(flat, limit))
    return "\n".join(lines) if lines else "no segments"


def histories_of(data: dict) -> dict[str, dict]:
    """The pending histories in a dump() file ({device: history}) or a bare pending_history() dict."""
    if "time_us" in data:
        return {str(data.get("device", 0)): data}
    return {str(d): h for d, h in data.get("pending_history", {}).items() if h}


Series = dict[int, tuple[list[float], list[int]]]  # per stream: times (s) and pending bytes after each change


def history_series(histories: dict[str, dict]) -> tuple[dict[str, Series], float]:
    """Per device (in order), per stream (in order): the times (seconds since the first sample of any
    device; one clock for the whole process) and the pending bytes after each change; and the time of
    the last sample. Devices without samples are left out."""
    starts = [h["time_us"][0] for h in histories.values() if h.get("time_us")]
    if not starts:
        return {}, 0.0
    origin = min(starts)
    series: dict[str, Series] = {}
    end = 0.0
    for device, h in sorted(histories.items()):
        streams: Series = {}
        for t, stream, size in zip(h.get("time_us", []), h.get("stream", []), h.get("pending_bytes", [])):
            times, values = streams.setdefault(stream, ([], []))
            times.append((t - origin) / 1e6)
            values.append(size)
            end = max(end, times[-1])
        if streams:
            series[device] = dict(sorted(streams.items()))
    return series, end


def format_history(histories: dict[str, dict]) -> str:
    """Per device: how many samples the history holds and over how long; per stream: its peak of
    pending bytes (and when) and where it ended."""
    series, _ = history_series(histories)
    lines = []
    for device, h in sorted(histories.items()):
        samples = len(h.get("time_us", []))
        span = (h["time_us"][-1] - h["time_us"][0]) / 1e6 if samples else 0.0
        lost = h.get("recorded", samples) - samples
        lines.append(f"pending history, {_device_label(device, h)}: {samples} changes over {span:.3f} s "
                     f"(ring of {h.get('capacity', 0)}" + (f", {lost} older ones overwritten)" if lost else ")"))
        for stream, (times, values) in series.get(device, {}).items():
            peak = max(range(len(values)), key=values.__getitem__)
            lines.append(f"  {_stream_label(h, stream)}: peak {format_bytes(values[peak])} pending at "
                         f"{times[peak]:.3f} s, {format_bytes(values[-1])} at its last change ({len(values)} changes)")
    return "\n".join(lines)


def write_timeline(histories: dict[str, dict], out: str) -> None:
    """Draw the pending bytes of each stream over time into `out` (.png, .svg, .pdf, or .html: the SVG
    and the text summary in one page). A step plot: a stream's pending bytes hold until its next change."""
    series, end = history_series(histories)
    if not series:
        raise ValueError("the pending history holds no samples: nothing was freed while used on another "
                         "stream, or the run did not set pending_history:N")
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--timeline needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 1, figsize=(10, 3.2 * len(series)), squeeze=False, sharex=True)
    for ax, (device, streams) in zip(axes[:, 0], series.items()):
        for stream, (times, values) in streams.items():
            ax.step(times + [end], [v / 2**20 for v in values + values[-1:]], where="post",
                    label=_stream_label(histories[device], stream))
        ax.set_ylabel("pending MiB")
        ax.set_title(f"{_device_label(device, histories[device])}: bytes freed but waiting for each stream's fences")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
    axes[-1, 0].set_xlabel("seconds since the first sample")
    fig.tight_layout()
    if out.endswith(".html"):
        import html
        import io

        buffer = io.StringIO()
        fig.savefig(buffer, format="svg")
        svg = buffer.getvalue()
        page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>streamalloc pending timeline</title>"
                "</head>\n<body>\n<h1>streamalloc: pending bytes per stream</h1>\n"
                + svg[svg.index("<svg"):]
                + "\n<pre>" + html.escape(format_history(histories)) + "</pre>\n</body></html>\n")
        with open(out, "w", encoding="utf-8") as f:
            f.write(page)
    else:
        fig.savefig(out, dpi=120)
    plt.close(fig)


def format_report(data: dict, limit: int = 10) -> str:
    """A dump() file, a stats() dict, a snapshot() dict or a pending_history() dict, whichever `data` is."""
    if "memory_stats" in data or "stream_stats" in data:
        return format_stats(data)
    if "time_us" in data:
        return format_history(histories_of(data))
    parts = []
    if data.get("conf") is not None or data.get("path") is not None:
        parts.append(f"streamalloc via {data.get('path')} with options: {data.get('conf') or '(defaults)'}")
    for device, stats in sorted(data.get("stats", {}).items()):
        parts.append(format_stats(stats, device))
    snap = data.get("snapshot", data if "segments" in data else None)
    if snap is not None:
        parts.append(format_snapshot(snap, limit))
    histories = histories_of(data)
    if histories:
        parts.append(format_history(histories))
    if not parts:
        raise ValueError("not a streamalloc dump, stats, snapshot or pending history: expected keys 'stats', "
                         "'snapshot', 'memory_stats', 'segments' or 'time_us'")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamalloc.report", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="JSON written by streamalloc.dump(), stats() or snapshot(); - for stdin")
    parser.add_argument("--blocks", type=int, default=10, metavar="N", help="largest blocks to list per device")
    parser.add_argument("--timeline", metavar="OUT", default=None,
                        help="draw the pending bytes per stream over time into OUT (.png, .svg, .pdf or .html); "
                             "the file must hold a pending history (run with pending_history:N)")
    args = parser.parse_args(argv)
    if args.timeline is not None and not args.timeline.endswith((".png", ".svg", ".pdf", ".html")):
        parser.error(f"--timeline {args.timeline}: name a .png, .svg, .pdf or .html file")
    try:
        if args.file == "-":
            data = json.load(sys.stdin)
        else:
            with open(args.file, encoding="utf-8") as f:
                data = json.load(f)
        print(format_report(data, args.blocks))
        if args.timeline is not None:
            histories = histories_of(data)
            if not histories:
                raise ValueError(f"{args.file} holds no pending history: run with pending_history:N (e.g. "
                                 "STREAMALLOC_CONF=pending_history:100000) and save it with streamalloc.dump()")
            write_timeline(histories, args.timeline)
            print(f"timeline written to {args.timeline}")
    except (OSError, ValueError) as error:
        print(f"streamalloc.report: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

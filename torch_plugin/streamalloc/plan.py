"""Plan GPU memory without a GPU: replay a PyTorch memory snapshot under allocator settings.

    python -m streamalloc.plan SNAPSHOT.pickle [--cap GiB] [--torch-conf CONF] [--conf CONF]
                               [--device N] [--plot FILE.png] [--json] [--write-events FILE]

The snapshot is the file `torch.cuda.memory._dump_snapshot()` writes after
`torch.cuda.memory._record_memory_history()`. Its trace (every alloc, free and stream use) is replayed
under a model of PyTorch's caching allocator (default, expandable segments, and --torch-conf) and
under streamalloc on its simulated device (default, expandable segments, and --conf). For each
setting it prints the peak reserved and allocated bytes, their ratio, the number of device
allocations, whether it fits under --cap and where it first fails, and then a recommendation.

Neither torch nor a GPU is needed: the snapshot is read as plain Python data (a pickle that refers to
any class is refused), and the replay runs in libstreamalloc_planner.so (found like the other native
libraries, through STREAMALLOC_LIBRARY_DIR or next to this package). docs/planning.md has a guide.
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import io
import json
import lzma
import pickle
import sys
import zlib
from pathlib import Path

from . import _native

PLANNER_LIBRARY_NAME = "libstreamalloc_planner.so"
EVENTS_MAGIC = "#streamalloc-plan v1"
GiB = 1 << 30


class PlanError(Exception):
    """Bad input or a failed plan; the message is one line for the user."""


# ---------------------------------------------------------------------------------------- snapshot


class _PlainUnpickler(pickle.Unpickler):
    """A snapshot is dicts, lists, strings and numbers: any class reference is refused."""

    def find_class(self, module, name):
        raise PlanError(f"the pickle refers to the Python class {module}.{name}; a memory snapshot written by "
                        "torch.cuda.memory._dump_snapshot() holds plain dicts and lists (re-dump it with "
                        "_dump_snapshot, or load it with torch and pickle.dump(dict(...)))")


def load_snapshot(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PlanError(f"cannot read {path}: {e.strerror or e}") from None
    if not data:
        raise PlanError(f"{path} is empty, not a memory snapshot")
    if data[:2] == b"\x1f\x8b":  # gzip-compressed snapshot
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise PlanError(f"{path} is truncated: the gzip stream ends early") from None
        except (OSError, zlib.error) as e:
            raise PlanError(f"{path} is not a readable gzip file ({e})") from None
    elif data[:6] == b"\xfd7zXZ\x00":  # xz-compressed snapshot
        try:
            data = lzma.decompress(data)
        except lzma.LZMAError as e:
            if "ended before" in str(e):
                raise PlanError(f"{path} is truncated: the xz stream ends early") from None
            raise PlanError(f"{path} is not a readable xz file ({e})") from None
    try:
        snapshot = _PlainUnpickler(io.BytesIO(data)).load()
    except PlanError:
        raise
    except EOFError:
        raise PlanError(f"{path} is truncated: the pickle ends early (was the file copied completely?)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            UnicodeDecodeError, OverflowError) as e:
        if "truncated" in str(e):
            raise PlanError(f"{path} is truncated: the pickle ends early (was the file copied completely?)") from None
        raise PlanError(f"{path} is not a memory snapshot: it is not a pickle ({e})") from None
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        kind = type(snapshot).__name__
        raise PlanError(f"{path} is not a PyTorch memory snapshot: expected a dict with 'segments' and "
                        f"'device_traces', got a {kind}")
    return snapshot


def pick_device(snapshot: dict, device: int | None) -> int:
    traces = snapshot.get("device_traces") or []
    if device is not None:
        if device < 0 or device >= len(traces) or not traces[device]:
            raise PlanError(f"the snapshot has no trace entries for device {device}")
        return device
    sizes = [len(t) if isinstance(t, list) else 0 for t in traces]
    if not sizes or max(sizes) == 0:
        raise PlanError("the snapshot has no trace entries: record it with "
                        "torch.cuda.memory._record_memory_history() before the workload runs")
    return sizes.index(max(sizes))


class Conversion:
    """A device trace turned into the planner's event list.

    lines: the event list; entry_of[i]: the trace entry behind event i; segments: the recorded segment
    events as (index of the next event, action, size, stream index); recorded_peak_reserved: the peak
    of reserved bytes the segment events add up to; truncated: the trace frees blocks it never
    allocated (the history's ring buffer dropped its start)."""

    def __init__(self):
        self.lines = [f"{EVENTS_MAGIC} completions=1 source=snapshot"]
        self.entry_of: list[int] = []
        self.segments: list[tuple[int, str, int, int]] = []
        self.recorded_peak_reserved = 0
        self.streams: dict[int, int] = {}
        self.allocs = 0
        self.truncated = False
        self.unknown_frees = 0

    @property
    def events(self) -> int:
        return len(self.entry_of)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


_SEGMENT_ACTIONS = {"segment_alloc": "a", "segment_free": "f", "segment_map": "m", "segment_unmap": "u"}


def convert(entries: list) -> Conversion:
    """Alloc -> `a`; free_requested -> `f` (with `r` first when the block had uses on other streams: PyTorch
    logs free_completed later then, when their events complete, which becomes `c`); segment_alloc -> `d` (where the
    device put the segment, which the model of PyTorch's allocator follows)."""
    out = Conversion()
    live: dict[int, tuple[int, int]] = {}     # addr -> (id, stream index)
    pending: dict[int, int] = {}              # addr -> id, freed with stream uses, not yet completed
    last_alloc_stream: list[int] = []         # stream indices in order of allocation (last few)
    reserved = 0
    next_id = 0

    def stream_index(raw) -> int:
        return out.streams.setdefault(int(raw or 0), len(out.streams))

    def emit(line: str, entry: int):
        out.lines.append(line)
        out.entry_of.append(entry)

    n = len(entries)
    start_us = None  # time_us of the first trace entry: `t` lines count from it
    last_us = -1
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "action" not in entry:
            raise PlanError(f"trace entry {i} is not a PyTorch trace entry (a dict with 'action', 'addr', 'size')")
        action = entry["action"]
        time_us = entry.get("time_us")
        if isinstance(time_us, int) and not isinstance(time_us, bool):
            if start_us is None:
                start_us = time_us
            if time_us - start_us > last_us:  # the clock never runs back
                last_us = time_us - start_us
                out.lines.append(f"t {last_us}")
        addr = int(entry.get("addr", 0) or 0)
        size = int(entry.get("size", 0) or 0)
        if action == "alloc":
            stream = stream_index(entry.get("stream"))
            if addr in live:  # an alloc of a live address: its free fell outside the trace
                live.pop(addr)
            live[addr] = (next_id, stream)
            emit(f"a {next_id} {size} {stream}", i)
            next_id += 1
            out.allocs += 1
            last_alloc_stream.append(stream)
            if len(last_alloc_stream) > 64:
                del last_alloc_stream[:32]
        elif action == "free_requested":
            if addr not in live:
                out.unknown_frees += 1
                out.truncated = True
                continue
            block, stream = live.pop(addr)
            nxt = entries[i + 1] if i + 1 < n else None
            immediate = (isinstance(nxt, dict) and nxt.get("action") == "free_completed"
                         and int(nxt.get("addr", 0) or 0) == addr)
            if not immediate:
                # Used on another stream; which one the trace does not say: the last other stream that
                # allocated (a prefetch pipeline's consumer), else a stream of its own.
                other = next((s for s in reversed(last_alloc_stream) if s != stream), None)
                if other is None:
                    other = stream_index(-1)
                emit(f"r {block} {other}", i)
                pending[addr] = block
            emit(f"f {block}", i)
        elif action == "free_completed":
            block = pending.pop(addr, None)
            if block is not None:
                emit(f"c {block}", i)
        elif action in _SEGMENT_ACTIONS:
            code = _SEGMENT_ACTIONS[action]
            reserved += size if code in "am" else -size
            out.recorded_peak_reserved = max(out.recorded_peak_reserved, reserved)
            out.segments.append((out.events, code, size, stream_index(entry.get("stream"))))
            if code == "a" and addr:
                out.lines.append(f"d {size} {addr}")
    if out.allocs == 0:
        raise PlanError("the snapshot's trace has no allocations to replay")
    return out


# ---------------------------------------------------------------------------------------- engine


def find_planner_library() -> Path | None:
    for directory in _native.search_dirs():
        candidate = directory / PLANNER_LIBRARY_NAME
        if candidate.is_file():
            return candidate
    return None


def run_engine(events_text: str, request: dict) -> dict:
    path = find_planner_library()
    if path is None:
        raise PlanError(_native.not_found_message(PLANNER_LIBRARY_NAME))
    lib = ctypes.CDLL(str(path))
    lib.streamalloc_plan_json.restype = ctypes.c_void_p
    lib.streamalloc_plan_json.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.streamalloc_plan_free.argtypes = [ctypes.c_void_p]
    raw = lib.streamalloc_plan_json(events_text.encode(), json.dumps(request).encode())
    try:
        report = json.loads(ctypes.string_at(raw).decode())
    finally:
        lib.streamalloc_plan_free(raw)
    if "error" in report:
        raise PlanError(report["error"])
    return report


def default_settings(torch_conf: str = "", conf: str = "") -> list[dict]:
    settings = [{"name": "pytorch", "allocator": "pytorch", "conf": ""},
                {"name": "pytorch expandable", "allocator": "pytorch", "conf": "expandable_segments:True"}]
    if torch_conf:
        settings.append({"name": f"pytorch {torch_conf}", "allocator": "pytorch", "conf": torch_conf})
    settings += [{"name": "streamalloc", "allocator": "streamalloc", "conf": ""},
                 {"name": "streamalloc expandable", "allocator": "streamalloc", "conf": "expandable_segments:true"}]
    if conf:
        settings.append({"name": f"streamalloc {conf}", "allocator": "streamalloc", "conf": conf})
    return settings


def plan_snapshot(snapshot: dict, *, cap_bytes: int = 0, torch_conf: str = "", conf: str = "",
                  device: int | None = None, segment_events: bool = False, settings: list | None = None):
    """Returns (report, conversion). The report is the engine's JSON with the failure points located in
    the trace (first_failure.trace_entry and .frame)."""
    dev = pick_device(snapshot, device)
    entries = snapshot["device_traces"][dev]
    conversion = convert(entries)
    request = {"cap_bytes": int(cap_bytes), "series_points": 400, "segment_events": segment_events,
               "settings": settings if settings is not None else default_settings(torch_conf, conf)}
    report = run_engine(conversion.text(), request)
    report["device"] = dev
    report["trace_entries"] = len(entries)
    report["truncated"] = conversion.truncated
    for setting in report["settings"]:
        failure = setting.get("first_failure")
        if failure:
            entry_index = conversion.entry_of[failure["event"]]
            failure["trace_entry"] = entry_index
            failure["frame"] = _user_frame(entries[entry_index])
    return report, conversion


def _user_frame(entry: dict) -> str:
    frames = entry.get("frames") or []
    for frame in frames:
        name = str(frame.get("filename", ""))
        if name and "/torch/" not in name and not name.startswith("??"):
            return f"{name}:{frame.get('line', '?')} {frame.get('name', '')}".strip()
    if frames:
        f = frames[0]
        return f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '')}".strip()
    return ""


# ---------------------------------------------------------------------------------------- output


def format_table(report: dict) -> str:
    cap = report.get("cap_bytes") or 0
    lines = [f"{report['events']} events ({report['allocs']} allocations, {report['streams']} streams) "
             f"from {report['trace_entries']} trace entries of device {report['device']}"]
    if report.get("truncated"):
        lines.append("note: the trace frees blocks it never allocated: the history's ring buffer dropped its "
                     "start, so the plan covers the recorded window only")
    head = f"{'setting':<38} {'reserved GiB':>12} {'allocated GiB':>13} {'res/alloc':>9} {'device allocs':>13}"
    if cap:
        head += f"  fits under {cap / GiB:.2f} GiB"
    lines.append(head)
    for s in report["settings"]:
        row = (f"{s['name']:<38} {s['peak_reserved'] / GiB:>12.3f} {s['peak_allocated'] / GiB:>13.3f} "
               f"{s['reserved_per_allocated']:>9.3f} {s['device_allocs']:>13}")
        if cap:
            if s["fits"]:
                retries = s.get("alloc_retries_under_cap", 0)
                many = retries != 1
                row += (f"  yes, {retries} allocation{'s' if many else ''} release{'' if many else 's'} cached memory "
                        "first") if retries else "  yes"
            else:
                f = s["first_failure"]
                where = f"trace entry {f['trace_entry']} (alloc #{f['alloc']} of {f['size']} B)"
                row += f"  no: first fails at {where}" + (f" {f['frame']}" if f.get("frame") else "")
        lines.append(row)
    lines.append(f"recommendation: {report['recommendation']}")
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlanError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for s in report["settings"]:
        every = s["series"]["every"]
        ys = [v / GiB for v in s["series"]["reserved"]]
        xs = [k * every for k in range(len(ys))]
        ax.step(xs, ys, where="post", label=f"{s['name']} (peak {s['peak_reserved'] / GiB:.2f} GiB)")
    if report.get("cap_bytes"):
        ax.axhline(report["cap_bytes"] / GiB, color="black", linestyle="--", linewidth=1, label="cap")
    ax.set_xlabel("event of the trace")
    ax.set_ylabel("reserved GiB")
    ax.set_title("Reserved memory over the trace, per allocator setting")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamalloc.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", help="a memory snapshot pickle (torch.cuda.memory._dump_snapshot), "
                        "or it gzip- or xz-compressed")
    parser.add_argument("--cap", type=float, default=0.0, help="GiB: whether each setting fits, and where it fails")
    parser.add_argument("--torch-conf", default="", help="one more PyTorch setting (PYTORCH_CUDA_ALLOC_CONF syntax)")
    parser.add_argument("--conf", default="", help="one more streamalloc setting (STREAMALLOC_CONF syntax)")
    parser.add_argument("--device", type=int, default=None, help="device trace to plan (default: the longest)")
    parser.add_argument("--plot", default=None, help="write reserved bytes over the trace per setting (PNG)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--write-events", default=None, help="also write the event list (for streamalloc_plan)")
    args = parser.parse_args(argv)
    if args.cap < 0:
        print("streamalloc.plan: --cap must be a positive number of GiB", file=sys.stderr)
        return 2
    try:
        snapshot = load_snapshot(args.snapshot)
        report, conversion = plan_snapshot(snapshot, cap_bytes=int(args.cap * GiB), torch_conf=args.torch_conf,
                                           conf=args.conf, device=args.device)
        if args.write_events:
            Path(args.write_events).write_text(conversion.text())
        if args.plot:
            plot(report, args.plot)
    except PlanError as e:
        print(f"streamalloc.plan: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report))
    else:
        print(format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Turn a PyTorch memory snapshot with allocation history into a streamalloc trace.

    python3 bench/replay/convert_snapshot.py SNAPSHOT.pickle OUT.trace [--workload NAME]
        [--device 0] [--max-ops 100000] [--record-log RECORD_LOG.jsonl]

The snapshot comes from `torch.cuda.memory._record_memory_history(max_entries=N)`, the workload, then
`pickle.dump(torch.cuda.memory._snapshot(), f)`. Its `device_traces[device]` list is read in order
(PyTorch 2.11 TraceEntry fields: action, addr, size, stream, time_us, frames):

  alloc                      -> `a <id> <size> <stream>`  (size: the requested bytes)
  free_requested             -> `f <id>`, preceded by `r <id> <stream>` when the block had stream uses
  free_completed             -> nothing (used only to detect stream uses, below)
  segment_alloc/segment_map  -> reserved bytes go up   (for the native peaks in the header)
  segment_free/segment_unmap -> reserved bytes go down
  anything else (oom, snapshot, user_defined, ...) is skipped

record_stream calls are not in the trace; the converter infers them. PyTorch's native allocator logs
`free_completed` right after `free_requested` when the block has no other stream uses, and only later
(when the events recorded on those streams complete) when it has some. So a free_requested that is not
immediately followed by the matching free_completed is a block that was used on another stream. Which
stream: from `--record-log` when given (JSON lines {"t_us", "addr", "stream"} written by
record_workloads.py, matched to the block whose lifetime contains the call), else the most recent
stream other than the block's own that allocated before the free (the consumer in a prefetch pipeline),
else a stream of its own. A record_stream only matters when the block is freed, so the `r` line is
written just before the `f` line.

The header carries the native allocator's peaks over the converted window, computed from the trace:
peak reserved from the segment events, peak allocated from the live blocks' sizes rounded as native
rounds them (512 B). A trace cut at --max-ops has these peaks for the part that was kept.
"""

import argparse
import bisect
import json
import pickle
import sys

TRACE_MAGIC = "#streamalloc-trace v1"


def native_round(size):
    """PyTorch's round_size(): at least 512 bytes, then multiples of 512."""
    return 512 if size < 512 else (size + 511) // 512 * 512


class RecordLog:
    """record_stream calls logged by the recorder: addr -> sorted [(t_us, raw_stream)]."""

    def __init__(self, items=()):
        self.calls = {}
        for item in items:
            self.calls.setdefault(int(item["addr"]), []).append((int(item["t_us"]), int(item["stream"])))
        for calls in self.calls.values():
            calls.sort()

    @classmethod
    def load(cls, path):
        if path is None:
            return cls()
        with open(path) as f:
            return cls(json.loads(line) for line in f if line.strip())

    def streams_for(self, addr, t_alloc, t_free, slack_us=2):
        """Raw streams recorded on the block at `addr` that lived from t_alloc to t_free."""
        calls = self.calls.get(addr)
        if not calls or t_alloc is None or t_free is None:
            return []
        lo = bisect.bisect_left(calls, (t_alloc - slack_us, -(1 << 63)))
        hi = bisect.bisect_right(calls, (t_free + slack_us, 1 << 63))
        return sorted({stream for _, stream in calls[lo:hi]})


def convert(snapshot, device=0, max_ops=100000, record_log=None, workload="workload", extra_header=None):
    """Returns (lines, header dict, summary dict)."""
    traces = snapshot.get("device_traces")
    if not traces or device >= len(traces):
        raise ValueError(f"the snapshot has no allocation history for device {device}: record it with "
                         "torch.cuda.memory._record_memory_history() before the workload")
    entries = traces[device]
    record_log = record_log or RecordLog()

    stream_ids = {}

    def stream_id(raw):
        if raw not in stream_ids:
            stream_ids[raw] = len(stream_ids)
        return stream_ids[raw]

    live = {}  # addr -> (id, requested size, raw stream, alloc time)
    next_id = 0
    lines = []
    reserved = allocated = peak_reserved = peak_allocated = 0
    last_alloc_stream = {}  # raw stream -> index of its latest alloc
    summary = {"entries": len(entries), "unknown_frees": 0, "inferred_records": 0, "logged_records": 0,
               "truncated": False}
    unknown_consumer = None

    for index, entry in enumerate(entries):
        if len(lines) >= max_ops:
            summary["truncated"] = True
            break
        action = entry.get("action")
        addr = entry.get("addr")
        size = int(entry.get("size", 0))
        if action in ("segment_alloc", "segment_map"):
            reserved += size
            peak_reserved = max(peak_reserved, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        elif action == "alloc":
            if size == 0:
                continue
            raw = entry.get("stream", 0)
            live[addr] = (next_id, size, raw, entry.get("time_us"))
            lines.append(f"a {next_id} {size} {stream_id(raw)}")
            next_id += 1
            last_alloc_stream[raw] = index
            allocated += native_round(size)
            peak_allocated = max(peak_allocated, allocated)
        elif action == "free_requested":
            if addr not in live:
                summary["unknown_frees"] += 1  # allocated before the history started
                continue
            block, block_size, raw, t_alloc = live.pop(addr)
            following = entries[index + 1] if index + 1 < len(entries) else None
            immediate = (following is not None and following.get("action") == "free_completed"
                         and following.get("addr") == addr)
            if not immediate:
                users = [s for s in record_log.streams_for(addr, t_alloc, entry.get("time_us")) if s != raw]
                if users:
                    summary["logged_records"] += len(users)
                else:
                    others = [(i, s) for s, i in last_alloc_stream.items() if s != raw]
                    if others:
                        users = [max(others)[1]]
                    else:
                        if unknown_consumer is None:
                            unknown_consumer = object()  # a stream id of its own, distinct from any raw one
                        users = [unknown_consumer]
                    summary["inferred_records"] += 1
                for user in users:
                    lines.append(f"r {block} {stream_id(user)}")
            lines.append(f"f {block}")
            allocated -= native_round(block_size)

    header = {"workload": workload, "native_peak_reserved": peak_reserved,
              "native_peak_allocated": peak_allocated, "ops": len(lines), "streams": len(stream_ids),
              "truncated": int(summary["truncated"])}
    header.update(extra_header or {})
    summary.update(live_at_end=len(live), streams=len(stream_ids))
    return lines, header, summary


def write_trace(path, lines, header, comments=()):
    items = " ".join(f"{key}={str(value).replace(' ', '_')}" for key, value in header.items())
    with open(path, "w") as f:
        f.write(f"{TRACE_MAGIC} {items}\n")
        f.writelines(f"# {comment}\n" for comment in comments)
        f.write("\n".join(lines))
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", help="pickled torch.cuda.memory._snapshot() with history")
    parser.add_argument("output", help="trace file to write")
    parser.add_argument("--workload", default=None, help="workload name for the header (default: file name)")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--max-ops", type=int, default=100000, help="keep the first N ops (default 100000)")
    parser.add_argument("--record-log", default=None, help="record_stream log (JSON lines) from the recorder")
    args = parser.parse_args()

    with open(args.snapshot, "rb") as f:
        snapshot = pickle.load(f)
    workload = args.workload or args.output.rsplit("/", 1)[-1].split(".")[0]
    try:
        lines, header, summary = convert(snapshot, args.device, args.max_ops, RecordLog.load(args.record_log), workload)
    except ValueError as e:
        sys.exit(f"convert_snapshot: {e}")
    write_trace(args.output, lines, header)
    print(f"wrote {args.output}: {len(lines)} ops, {summary['streams']} streams, native peak reserved "
          f"{header['native_peak_reserved']}, peak allocated {header['native_peak_allocated']}; record_stream: "
          f"{summary['logged_records']} from the log, {summary['inferred_records']} inferred; "
          f"{summary['unknown_frees']} frees of blocks allocated before the history (skipped)"
          + ("; truncated" if summary["truncated"] else ""))


if __name__ == "__main__":
    main()

"""Allocation history (torch.cuda.memory._record_memory_history), probed the same way under any allocator.

    python history_probe.py                 # PyTorch's allocator
    python -m streamalloc history_probe.py  # streamalloc

Each behaviour reports the facts it observed (or the traceback of what it raised) under its own key;
the last stdout line is one JSON object: {"allocator": ..., "behaviours": {name: facts}}. The tests
(test_gpu_history.py) take the facts of contract_probe.py, which runs these behaviours after CUDA graph
work and PyTorch's other allocator behaviours in one process; run alone, this script is for debugging.
"""

import os
import pickle
import subprocess
import sys
import tempfile

import torch
from _common import behaviour as run_behaviour
from _common import emit
from torch.cuda import _memory_viz

MiB = 1 << 20
THIS_FILE = os.path.basename(__file__)


def behaviour(results: dict, name: str, fn) -> None:
    """One behaviour (_common.behaviour), then the history off and the cache emptied."""
    run_behaviour(results, name, fn,
                  after=lambda: (torch.cuda.memory._record_memory_history(None), torch.cuda.empty_cache()))


def trace() -> list:
    return torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]


def entries_at(entries: list, address: int) -> list:
    return [e for e in entries if e.get("addr") == address]


def frame_names(entry_or_block: dict) -> list:
    return [f["name"] for f in entry_or_block.get("frames", [])]


def block_of(snapshot: dict, address: int):
    for segment in snapshot["segments"]:
        at = segment["address"]
        for block in segment["blocks"]:
            if at == address:
                return block
            at += block["size"]
    return None


# ---- behaviours ----

def allocate_here():
    return torch.rand(311, 411, device="cuda")


def free_here(tensors: list) -> None:
    tensors.clear()


def release_segments_here() -> None:
    torch.cuda.empty_cache()


def snapshot_shape():
    # test_memory_snapshot: entries for an allocation and its free, with frames, in PyTorch's keys.
    torch.cuda.memory._record_memory_history("all", stacks="python")
    tensors = [allocate_here()]
    address = tensors[0].data_ptr()
    snapshot = torch.cuda.memory._snapshot()
    block = block_of(snapshot, address)
    free_here(tensors)
    entries = trace()
    mine = entries_at(entries, address)
    # Every entry has PyTorch's keys; a block's entries have frames too (snapshot and oom entries need not).
    keys_ok = all({"action", "addr", "size", "stream", "time_us"} <= set(e) for e in entries) and all(
        "frames" in e for e in entries if e["action"] in ("alloc", "free_requested", "free_completed"))
    times = [e["time_us"] for e in entries]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snap.pickle")
        torch.cuda.memory._dump_snapshot(path)
        with open(path, "rb") as f:
            loaded = pickle.load(f)
    torch.cuda.memory._record_memory_history(None)
    after_off = trace()
    return {
        "actions": [e["action"] for e in mine],
        "alloc_frames_here": "allocate_here" in frame_names(mine[0]) if mine else False,
        "block_frames_here": block is not None and "allocate_here" in frame_names(block),
        "block_state": block["state"] if block else None,
        "keys_ok": keys_ok,
        "times_sorted": times == sorted(times),
        "pickled_has_traces": bool(loaded["device_traces"][torch.cuda.current_device()]),
        "entries_after_off": len(after_off),
    }


def snapshot_with_cpp():
    # test_memory_snapshot_with_cpp: stacks="all" adds C++ frames.
    torch.cuda.memory._record_memory_history("all", stacks="all")
    x = allocate_here()
    mine = entries_at(trace(), x.data_ptr())
    files = [f["filename"] for f in mine[0]["frames"]] if mine else []
    return {"has_python_frame": any(THIS_FILE in f for f in files),
            "has_cpp_frame": any(f.endswith((".cpp", ".h", ".cc")) or f.startswith("??") for f in files)}


def snapshot_script():
    # test_memory_snapshot_script: a TorchScript function's allocations still carry frames.
    @torch.jit.script
    def make():
        return torch.rand(311, 411, device="cuda")

    torch.cuda.memory._record_memory_history("all", stacks="python")
    x = make()
    mine = entries_at(trace(), x.data_ptr())
    return {"alloc_entries": sum(e["action"] == "alloc" for e in mine),
            "frames": len(mine[0]["frames"]) if mine else -1}


def plots():
    # test_memory_plots: the viewers accept the snapshot; the command-line tool writes a trace plot.
    torch.cuda.memory._record_memory_history("all", stacks="python")
    tensors = [torch.rand(128, 128, device="cuda") for _ in range(4)]
    del tensors[1:3]
    snapshot = torch.cuda.memory._snapshot()
    trace_html = _memory_viz.trace_plot(snapshot)
    segment_html = _memory_viz.segment_plot(snapshot)
    summary = _memory_viz.segsum(snapshot)
    trace_text = _memory_viz.trace(snapshot)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snap.pickle")
        out = os.path.join(tmp, "trace.html")
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
        cli = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", path, "-o", out],
                             capture_output=True, text=True)
        cli_bytes = os.path.getsize(out) if os.path.exists(out) else 0
    return {"trace_html": len(trace_html) > 1000, "segment_html": len(segment_html) > 1000,
            "segsum": len(summary) > 0, "trace_text": len(trace_text) > 0, "cli_rc": cli.returncode,
            "cli_html": cli_bytes > 1000,
            "cli_stderr": cli.stderr[-2000:]}


def free_stack(context: str):
    # test_memory_plots_free_stack: with context "all" a free carries its own stack; with "alloc" none.
    torch.cuda.memory._record_memory_history("all", context=context, stacks="python")
    tensors = [allocate_here()]
    address = tensors[0].data_ptr()
    free_here(tensors)
    mine = entries_at(trace(), address)
    requested = [e for e in mine if e["action"] == "free_requested"]
    return {"free_frames_here": bool(requested) and "free_here" in frame_names(requested[0]),
            "alloc_frames_on_free": bool(requested) and "allocate_here" in frame_names(requested[0])}


def free_segment_stack():
    # test_memory_plots_free_segment_stack: segment_free entries carry empty_cache's caller.
    torch.cuda.memory._record_memory_history("all", stacks="python")
    x = torch.rand(64 * MiB // 4, device="cuda")
    del x
    release_segments_here()
    frees = [e for e in trace() if e["action"] == "segment_free"]
    return {"segment_frees": len(frees),
            "frames_here": bool(frees) and all("release_segments_here" in frame_names(e) for e in frees)}


def history_context(context):
    # test_memory_plots_history_context: "state" keeps stacks on live blocks only; None keeps none.
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks="python")
    x = allocate_here()
    snapshot = torch.cuda.memory._snapshot()
    mine = entries_at(snapshot["device_traces"][torch.cuda.current_device()], x.data_ptr())
    block = block_of(snapshot, x.data_ptr())
    return {"trace_frames": sum(len(e.get("frames", [])) for e in mine),  # no "frames" key without stacks
            "block_frames": len(block["frames"]) if block else -1}


def metadata():
    # test_memory_plots_metadata: the user's metadata lands on the entries made while it is set.
    if not hasattr(torch.cuda.memory, "_set_memory_metadata"):
        return {"skipped": "torch.cuda.memory._set_memory_metadata is missing in this torch"}
    torch.cuda.memory._record_memory_history("all", stacks="python")
    torch.cuda.memory._set_memory_metadata("phase one")
    x = allocate_here()
    torch.cuda.memory._set_memory_metadata("")
    y = allocate_here()
    entries = trace()
    return {"first": [e.get("user_metadata") for e in entries_at(entries, x.data_ptr()) if e["action"] == "alloc"],
            "second": [e.get("user_metadata") for e in entries_at(entries, y.data_ptr()) if e["action"] == "alloc"],
            "get": torch.cuda.memory._get_memory_metadata()}


def max_entries():
    torch.cuda.memory._record_memory_history("all", max_entries=3, stacks="python")
    tensors = [torch.rand(1024, device="cuda") for _ in range(10)]
    entries = trace()
    last = tensors[-1].data_ptr()
    return {"count": len(entries), "newest_alloc_kept": any(e.get("addr") == last for e in entries)}


def record_stream_free():
    # streamalloc's stream facts: a block used on a side stream and freed is held until that stream's
    # work is done; free_completed follows free_requested, later, and says which stream held it.
    torch.cuda.memory._record_memory_history("all", stacks="python")
    side = torch.cuda.Stream()
    x = torch.rand(1 << 20, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(20):
            x.mul_(1.0001)
    x.record_stream(side)
    address = x.data_ptr()
    del x
    before_sync = [e["action"] for e in entries_at(trace(), address)]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    mine = entries_at(trace(), address)
    actions = [e["action"] for e in mine]
    requested = next((e for e in mine if e["action"] == "free_requested"), {})
    completed = next((e for e in mine if e["action"] == "free_completed"), {})
    return {
        "actions": actions,
        "completed_before_sync": "free_completed" in before_sync,
        "requested_metadata": requested.get("user_metadata", ""),
        "completed_metadata": completed.get("user_metadata", ""),
        "side_stream": hex(side.cuda_stream),
        "completed_after_requested": completed.get("time_us", -1) >= requested.get("time_us", 0),
    }


def oom_entry():
    torch.cuda.memory._record_memory_history("all", stacks="python")
    seen = {}

    def observer(device, alloc, device_allocated, device_free):
        seen["oom_entries_when_observed"] = sum(e["action"] == "oom" for e in trace())

    torch._C._cuda_attach_out_of_memory_observer(observer)
    try:
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda")
        raised = False
    except torch.cuda.OutOfMemoryError:
        raised = True
    ooms = [e for e in trace() if e["action"] == "oom"]
    return {"raised": raised, "oom_entries": len(ooms),
            "device_free": ooms[0].get("device_free", -1) if ooms else -1,
            "size_at_least_request": bool(ooms) and ooms[0]["size"] >= (1 << 45), **seen}


def profiler_memory():
    # test_memory_profiler_viz: profile_memory=True sees the CUDA allocations.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True,
                 record_shapes=True, with_stack=True) as prof:
        x = torch.rand(256, 256, device="cuda")
        y = x @ x + x
        del x, y
    usage = [getattr(e, "device_memory_usage", getattr(e, "cuda_memory_usage", 0)) for e in prof.events()]
    html = _memory_viz.profile_plot(prof)
    return {"allocated_bytes_seen": sum(u for u in usage if u > 0), "freed_bytes_seen": -sum(u for u in usage if u < 0),
            "profile_plot": len(html) > 1000}


# Name -> behaviour, in the order they run; contract_probe.py runs them too, after its graph work and
# its own behaviours, in the same process.
BEHAVIOURS = {
    "snapshot_shape": snapshot_shape,
    "snapshot_with_cpp": snapshot_with_cpp,
    "snapshot_script": snapshot_script,
    "plots": plots,
    "free_stack_all": lambda: free_stack("all"),
    "free_stack_alloc": lambda: free_stack("alloc"),
    "free_segment_stack": free_segment_stack,
    "history_context_state": lambda: history_context("state"),
    "history_context_none": lambda: history_context(None),
    "metadata": metadata,
    "max_entries": max_entries,
    "record_stream_free": record_stream_free,
    "oom_entry": oom_entry,
    "profiler_memory": profiler_memory,
}


def run_all(results: dict) -> None:
    for name, fn in BEHAVIOURS.items():
        behaviour(results, name, fn)


def main() -> None:
    torch.cuda.init()
    results = {}
    run_all(results)
    emit({"behaviours": results})


if __name__ == "__main__":
    main()

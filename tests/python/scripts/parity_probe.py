"""Every torch.cuda memory API called the same way under any allocator, for a side-by-side comparison:

    python parity_probe.py                  # PyTorch's allocator: the contract
    python -m streamalloc parity_probe.py   # streamalloc

The script allocates a known pattern and walks through states (fresh, initialised, allocated, freed,
a block pending on a busy stream, after a host sync, after each reset, emptied), recording the whole
memory_stats() dict and the getters built on it in each; then calls memory_summary, mem_get_info,
caching_allocator_alloc/delete (good and bad pointers), _snapshot, _record_memory_history,
get/set_per_process_memory_fraction (good and bad values), the out-of-memory observer,
_set_allocator_settings and list_gpu_processes. Each section reports what it saw (values, types,
key sets, exceptions' types and messages) or the traceback of what it raised, under its own key; the
last stdout line is one JSON object {"allocator": ..., "sections": {name: facts}}. test_gpu_contract.py
decides which values must agree between the two runs.
"""

import gc
import re
import traceback

import torch
from _common import emit

MiB = 1 << 20
# Small-pool sizes (up to 1 MiB in PyTorch's allocator), large-pool sizes, and sizes that are not
# multiples of 512 (PyTorch rounds every request up to one).
SIZES = [1, 512, 513, 4096, 100_000, MiB, MiB + 1, 3 * MiB + 7, 12 * MiB, 30 * MiB]
PENDING_SIZE = 2 * MiB + 3
SYNCED_SIZE = 700


def round512(n: int) -> int:
    return max(512, (n + 511) // 512 * 512)


def section(results: dict, name: str, fn) -> None:
    try:
        facts = fn()
    except Exception:  # noqa: BLE001  (reported to the test, which shows it)
        facts = {"error": traceback.format_exc()}
    results[name] = facts


def raised(fn) -> dict | None:
    """The type and message of what fn raised, or None if it returned."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001
        return {"type": type(error).__name__, "is_runtime_error": isinstance(error, RuntimeError),
                "message": str(error).splitlines()[0][:300] if str(error) else ""}
    return None


def getters() -> dict:
    return {"memory_allocated": torch.cuda.memory_allocated(),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "memory_reserved": torch.cuda.memory_reserved(),
            "max_memory_reserved": torch.cuda.max_memory_reserved()}


def key_shape(value):
    """The structure of a nested dict: its keys, recursively; leaves become their type's name."""
    if isinstance(value, dict):
        return {str(k): key_shape(v) for k, v in value.items()}
    return type(value).__name__


def streamalloc_counts() -> dict | None:
    """Under streamalloc, its own counters of the paths and fences (None under PyTorch's allocator): where a
    state differs from PyTorch's, they say which step (a poll, a fence, the fast path) did not run."""
    try:
        import streamalloc
    except ImportError:
        return None
    if not streamalloc.is_enabled() or not torch.cuda.is_initialized():
        return None
    return streamalloc.stats()["stream_stats"]


def walk_states() -> dict:
    """memory_stats() and its getters in each state of a fixed allocation pattern."""
    states = {}

    def record(name: str) -> None:
        stats = torch.cuda.memory_stats()
        states[name] = {"stats": dict(stats), "getters": getters(), "streamalloc": streamalloc_counts()}

    record("fresh")  # before CUDA is initialised
    torch.cuda.init()
    record("initialised")
    tensors = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in SIZES]
    torch.cuda.synchronize()
    record("allocated")
    kept = tensors[1::2]
    del tensors
    record("freed")

    # A block freed while a busy stream it was recorded on still uses it: no longer allocated,
    # still active (PyTorch counts it in active_bytes until its event completes).
    side = torch.cuda.Stream()
    pending = torch.ones(PENDING_SIZE, dtype=torch.uint8, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s: busy while the stats are read
        pending.add_(1)
    pending.record_stream(side)
    del pending
    side_was_busy = not side.query()  # before record(), which may take long enough for the spin to end
    record("pending")
    side.synchronize()
    kept.append(torch.empty(SYNCED_SIZE, dtype=torch.uint8, device="cuda"))  # settles the pending block
    record("synced")
    torch.cuda.reset_peak_memory_stats()
    record("peak_reset")
    torch.cuda.reset_accumulated_memory_stats()
    record("accumulated_reset")
    del kept
    gc.collect()
    torch.cuda.empty_cache()
    record("emptied")
    return {"states": states, "side_was_busy": side_was_busy,
            "expected": {"allocated": sum(round512(n) for n in SIZES),
                         "freed": sum(round512(n) for n in SIZES[1::2]),
                         "synced": sum(round512(n) for n in SIZES[1::2]) + round512(SYNCED_SIZE),
                         "requested_allocated": sum(SIZES)}}


def summary() -> dict:
    """memory_summary()'s text: its row labels (the first column) and header, with live blocks."""
    live = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 3 * MiB)]
    text = torch.cuda.memory_summary()
    short = torch.cuda.memory_summary(abbreviated=True)
    del live

    def labels(table: str) -> list[str]:
        rows = []
        for line in table.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if line.startswith("|") and cells and cells[0] and not cells[0].startswith("="):
                # Counts inside labels ("CUDA OOMs: 0") are values, not row names.
                rows.append(re.sub(r"\d+", "N", cells[0].split("  ")[0].strip()))
        return rows

    def row(table: str, label: str) -> list[str]:
        line = next((line for line in table.splitlines() if line.startswith(f"| {label} ")), "")
        return [c.strip() for c in line.strip("|").split("|")][1:]

    return {"type": type(text).__name__, "labels": labels(text), "abbreviated_labels": labels(short),
            "rows": {label: row(text, label) for label in ("Allocated memory", "Requested memory", "Allocations",
                                                           "Active allocs")},
            "lines": len(text.splitlines()), "abbreviated_lines": len(short.splitlines())}


def mem_get_info() -> dict:
    free, total = torch.cuda.mem_get_info()
    return {"types": [type(free).__name__, type(total).__name__], "total": total,
            "device_total": torch.cuda.get_device_properties(0).total_memory, "free_le_total": free <= total,
            "device_arg_same_total": torch.cuda.mem_get_info(0)[1] == total}


def caching_allocator() -> dict:
    gc.collect()
    before = torch.cuda.memory_allocated()
    facts = {"deltas": {}, "types": []}
    side = torch.cuda.Stream()
    for n in (1, 1000, MiB + 1):
        for stream in (None, side):
            ptr = torch.cuda.caching_allocator_alloc(n, stream=stream)
            facts["types"].append(type(ptr).__name__)
            facts["deltas"][f"{n}{'@side' if stream else ''}"] = torch.cuda.memory_allocated() - before
            torch.cuda.caching_allocator_delete(ptr)
    facts["after_all"] = torch.cuda.memory_allocated() - before
    # Bad pointers: one inside a live block, and one freed twice. Each must raise and change nothing.
    ptr = torch.cuda.caching_allocator_alloc(4096)
    live = torch.cuda.memory_allocated()
    facts["delete_inside_block"] = raised(lambda: torch.cuda.caching_allocator_delete(ptr + 8))
    facts["unchanged_after_inside"] = torch.cuda.memory_allocated() == live
    torch.cuda.caching_allocator_delete(ptr)
    facts["delete_twice"] = raised(lambda: torch.cuda.caching_allocator_delete(ptr))
    facts["after_bad"] = torch.cuda.memory_allocated() - before
    facts["alloc_negative"] = raised(lambda: torch.cuda.caching_allocator_alloc(-1))
    facts["alloc_zero"] = raised(lambda: torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(0)))
    return facts


def snapshot() -> dict:
    """_snapshot()'s dict: the keys of it and of its entries, and the invariants its numbers keep."""
    live = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (100, 5000, 2 * MiB, 25 * MiB)]
    snap = torch.cuda.memory._snapshot()
    segments = snap["segments"]
    blocks = [b for s in segments for b in s["blocks"]]
    facts = {
        "top_keys": sorted(snap),
        "segment_keys": sorted({k for s in segments for k in s}),
        "block_keys": sorted({k for b in blocks for k in b}),
        "device_traces_type": type(snap.get("device_traces")).__name__,
        "device_traces_inner": sorted({type(t).__name__ for t in snap.get("device_traces", [])}),
        "block_states": sorted({b["state"] for b in blocks}),
        "segment_types": sorted({s.get("segment_type") for s in segments}),
        "sizes_add_up": all(s["total_size"] == sum(b["size"] for b in s["blocks"]) for s in segments),
        "allocated_is_memory_allocated": sum(s["allocated_size"] for s in segments) == torch.cuda.memory_allocated(),
        "reserved_is_memory_reserved": sum(s["total_size"] for s in segments) == torch.cuda.memory_reserved(),
        "live_found": all(any(b["address"] == t.data_ptr() and b["state"] == "active_allocated" for b in blocks)
                          for t in live),
        "memory_snapshot_is_segments": len(torch.cuda.memory_snapshot()) == len(segments),
        "settings_type": type(snap.get("allocator_settings")).__name__,
    }
    del live
    return facts


def record_memory_history() -> dict:
    """Turning allocation history on, allocating, and turning it off: the trace entries' keys."""
    # Python stacks only: symbolising C++ stacks can take seconds, and the entries' keys are the same.
    facts = {"enable": raised(lambda: torch.cuda.memory._record_memory_history(stacks="python", max_entries=1000))}
    if facts["enable"] is None:
        keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 4 * MiB)]
        del keep[0]
        snap = torch.cuda.memory._snapshot()
        entries = [e for trace in snap["device_traces"] for e in trace]
        facts["trace_keys"] = sorted({k for e in entries for k in e})
        facts["actions"] = sorted({e["action"] for e in entries})
        facts["blocks_have_frames"] = any("frames" in b for s in snap["segments"] for b in s["blocks"])
        del keep
    facts["disable"] = raised(lambda: torch.cuda.memory._record_memory_history(enabled=None))
    facts["after_disable_traces"] = sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])
    return facts


def memory_fraction() -> dict:
    set_ = torch.cuda.set_per_process_memory_fraction
    facts = {"default": torch.cuda.get_per_process_memory_fraction(),
             "default_type": type(torch.cuda.get_per_process_memory_fraction()).__name__,
             "valid": {}, "invalid": {}}
    for value in (0.0, 0.25, 0.999, 1.0):
        facts["valid"][repr(value)] = [raised(lambda: set_(value)), torch.cuda.get_per_process_memory_fraction()]
    cases = {"int_1": lambda: set_(1), "str": lambda: set_("0.5"), "negative": lambda: set_(-0.1),
             "above_one": lambda: set_(1.5), "nan": lambda: set_(float("nan")), "inf": lambda: set_(float("inf")),
             "bad_device_set": lambda: set_(0.5, 99),
             "bad_device_get": lambda: torch.cuda.get_per_process_memory_fraction(99)}
    for name, fn in cases.items():
        facts["invalid"][name] = raised(fn)
        set_(1.0)  # whatever a bad value did, the next case starts from no cap
    facts["after_invalid"] = torch.cuda.get_per_process_memory_fraction()
    probe = torch.empty(MiB, device="cuda")  # still allocates once the fraction is back to 1
    facts["allocates_after"] = probe.numel() == MiB
    return facts


def oom_observer() -> dict:
    calls = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: calls.append(args))
    error = raised(lambda: torch.empty(1 << 50, dtype=torch.uint8, device="cuda"))
    return {"error_type": error and error["type"], "calls": len(calls),
            "arity": sorted({len(c) for c in calls}),
            "arg_types": sorted({type(a).__name__ for c in calls for a in c}),
            "device_arg": sorted({c[0] for c in calls if c}),
            "num_ooms": torch.cuda.memory_stats()["num_ooms"]}


def allocator_settings() -> dict:
    facts = {"valid": raised(lambda: torch.cuda.memory._set_allocator_settings("garbage_collection_threshold:0.9")),
             "unknown_key": raised(lambda: torch.cuda.memory._set_allocator_settings("no_such_setting:1"))}
    facts["allocates_after"] = torch.empty(1000, device="cuda").numel() == 1000
    return facts


def gpu_processes() -> dict:
    out = {}
    try:
        text = torch.cuda.list_gpu_processes()
        out["type"] = type(text).__name__
        out["first_line"] = text.splitlines()[0] if text else ""
    except Exception as error:  # noqa: BLE001
        out["raised"] = type(error).__name__
    return out


def misc() -> dict:
    live = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    nested = torch.cuda.memory_stats_as_nested_dict()
    facts = {"nested_shape": key_shape(nested),
             "device_arg_same": torch.cuda.memory_stats(0) == torch.cuda.memory_stats(),
             "allocator_backend": torch.cuda.get_allocator_backend(),
             "is_initialized": torch.cuda.memory.is_initialized() if hasattr(torch.cuda.memory, "is_initialized")
             else None}
    del live
    return facts


SECTIONS = {
    "states": walk_states,
    "summary": summary,
    "mem_get_info": mem_get_info,
    "caching_allocator": caching_allocator,
    "snapshot": snapshot,
    "record_memory_history": record_memory_history,
    "memory_fraction": memory_fraction,
    "oom_observer": oom_observer,
    "misc": misc,
    "gpu_processes": gpu_processes,
    "allocator_settings": allocator_settings,  # last: it may change PyTorch's allocator's behaviour
}


def main() -> None:
    results = {}
    for name, fn in SECTIONS.items():
        section(results, name, fn)
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
    emit({"sections": results})


if __name__ == "__main__":
    main()

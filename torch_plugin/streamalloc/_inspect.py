"""stats(), snapshot(), blocks(), pending_history(), reset_peak_stats(), dump(): streamalloc's view of
its memory.

All of them read the allocator that enable() installed, whichever path serves it. Before PyTorch has
initialised CUDA (or on a machine without a CUDA device) the allocator does not exist yet, and they
report an allocator that has served nothing, in the same shape as one in use (stats() with every
number zero, no blocks), rather than initialising CUDA as a side effect.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import _enable

Device = Any  # None, int, "cuda:N" or torch.device


def _device_index(device: Device) -> int:
    """The CUDA device index `device` names; None means the current device."""
    if device is None:
        import torch

        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda":
            raise ValueError(f"streamalloc: {device!r} is not a CUDA device")
        return int(index) if index else _device_index(None)
    kind = getattr(device, "type", None)
    if kind == "cuda":
        index = getattr(device, "index", None)
        return _device_index(None) if index is None else int(index)
    raise ValueError(f"streamalloc: {device!r} is not a CUDA device")


def stats(device: Device = None) -> dict:
    """Statistics of one device: {"memory_stats": {torch.cuda.memory_stats() keys},
    "stream_stats": {record_stream calls, fences, pending blocks per stream, ...},
    "pools": [the default pool, then each private pool: id, use_count, routed, flags, bytes]}.
    The same keys with every number zero before PyTorch has initialised CUDA."""
    path = _enable.enabled_path()
    if not path.is_initialized():
        _device_index(device)  # a bad device argument is still an error
        return json.loads(path.zero_stats_json())
    return json.loads(path.stats_json(_device_index(device)))


def snapshot() -> dict:
    """All devices' segments and blocks in the dict shape of torch.cuda.memory._snapshot() (so
    torch.cuda._memory_viz reads it), each block with its allocation stream, recorded streams,
    record_stream calls, pending fences and age."""
    path = _enable.enabled_path()
    if not path.is_initialized():
        return {"segments": [], "device_traces": [], "allocator_settings": {}}
    return json.loads(path.snapshot_json())


def blocks_of(snap: dict, device: int | None = None) -> list[dict]:
    """The blocks of a snapshot as flat dicts, each with its device and segment address."""
    result = []
    for segment in snap.get("segments", []):
        if device is not None and segment.get("device") != device:
            continue
        for block in segment.get("blocks", []):
            entry = {"device": segment.get("device"), "segment_address": segment.get("address")}
            entry.update({k: v for k, v in block.items() if k != "frames"})
            result.append(entry)
    return result


def blocks(device: Device = None) -> list[dict]:
    """Every block (allocated, pending free and free) of one device, or of all devices when device
    is None: address, size, requested_size, state, allocation_stream, recorded_streams,
    record_stream_calls, pending_fences, settled, age_ms, device, segment_address."""
    return blocks_of(snapshot(), None if device is None else _device_index(device))


def pending_history(device: Device = None) -> dict:
    """The last changes of pending bytes per stream of one device, recorded when the allocator runs
    with pending_history:N (0, the default, records nothing): {"device", "capacity", "recorded",
    "time_us", "stream", "pending_bytes", "pending_blocks"}, one list per field, oldest first. A
    sample is taken when a free makes blocks wait for a stream's fence and when one of its fences
    completes; time_us is the steady clock. `python -m streamalloc.report FILE --timeline OUT` draws
    it from a dump(). Empty before PyTorch has initialised CUDA."""
    path = _enable.enabled_path()
    if not path.is_initialized():
        return {}
    return json.loads(path.pending_history_json(_device_index(device)))


def reset_peak_stats(device: Device = None) -> None:
    """Reset the peak of every statistic of one device to its current value."""
    path = _enable.enabled_path()
    if path.is_initialized():
        path.reset_peak_stats(_device_index(device))


def dump(file: str | os.PathLike) -> None:
    """Write {"conf", "path", "stats": {device: stats}, "snapshot"} as JSON, plus
    "pending_history": {device: pending_history} when the allocator records one, for
    `python -m streamalloc.report FILE [--timeline OUT]` or later comparison."""
    snap = snapshot()
    devices = range(snap.get("streamalloc", {}).get("devices", 0))
    data = {
        "conf": _enable.enabled_conf(),
        "path": _enable.active_path(),
        "stats": {str(d): stats(d) for d in devices},
        "snapshot": snap,
    }
    histories = {str(d): pending_history(d) for d in devices}
    if any(h.get("capacity") for h in histories.values()):
        data["pending_history"] = histories
    with open(file, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1)

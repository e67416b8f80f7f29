"""examples/memory_viz.py: the timeline it draws from a snapshot's trace (no GPU, no torch needed)."""

from __future__ import annotations

import importlib.util
import pickle

import pytest
from support import EXAMPLES

spec = importlib.util.spec_from_file_location("memory_viz", EXAMPLES / "memory_viz.py")
memory_viz = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory_viz)


def entry(action, addr, size, stream, time_us, **extra):
    return dict(action=action, addr=addr, size=size, stream=stream, time_us=time_us, frames=[], **extra)


TRACE = [
    entry("segment_alloc", 0x1000, 1 << 21, 1, 0),
    entry("alloc", 0x1000, 512, 1, 1000),            # block A on stream 1
    entry("alloc", 0x1200, 1024, 2, 2000),           # block B on stream 2
    entry("free_requested", 0x1000, 512, 1, 3000, user_metadata="held for stream 0x3"),
    entry("free_requested", 0x1200, 1024, 2, 3500),  # freed with no other stream: completes at once
    entry("free_completed", 0x1200, 1024, 2, 3500),
    entry("free_completed", 0x1000, 512, 1, 5000),
]


def test_allocated_and_held_bytes_follow_the_trace():
    times, allocated, pending, holds = memory_viz.timeline(TRACE)
    assert times == [1.0, 2.0, 3.0, 3.5, 3.5, 5.0]  # ms from the first entry; segment entries draw nothing
    assert allocated[1] == [512, 512, 0, 0, 0, 0]
    assert allocated[2] == [0, 1024, 1024, 0, 0, 0]
    assert pending[1] == [0, 0, 512, 512, 512, 0]
    assert pending[2] == [0, 0, 0, 1024, 0, 0]
    # Only a free that waited is a hold: block A, 2 ms, with the metadata its entries carried.
    assert holds == [(1, 3.0, 5.0, 512, "held for stream 0x3")]


def test_picture_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    snapshot = tmp_path / "s.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": [TRACE]}))
    out = tmp_path / "t.png"
    memory_viz.draw(pickle.loads(snapshot.read_bytes()), str(out), "trace")
    assert out.stat().st_size > 10_000


def test_empty_trace_is_refused_with_the_fix():
    with pytest.raises(SystemExit, match="record history before the workload"):
        memory_viz.draw({"device_traces": [[]]}, "unused.png", "empty")

"""Allocation history (torch.cuda.memory._record_memory_history, _snapshot's device_traces, memory_viz)
and the profiler's memory reporting under streamalloc, on a GPU.

The behaviours of scripts/history_probe.py run in scripts/contract_probe.py's interpreter, after its CUDA
graph work and PyTorch's other allocator behaviours, as a test suite would run them; it is started
with plain `python` (PyTorch's allocator, whose behaviour is the contract) and with
`python -m streamalloc`; each test asserts the facts for both and compares them where they must agree.

Run on a CUDA machine, after building (the extension needs LibTorch on CMAKE_PREFIX_PATH):
    STREAMALLOC_LIBRARY_DIR=$PWD/build/lib PYTHONPATH=$PWD/torch_plugin \\
        python3 -m pytest -v -rs tests/python/test_gpu_history.py
"""

from __future__ import annotations

import pytest
from support import ProbeRun, contract_probe, requires_cuda, requires_extension, requires_native

pytestmark = [requires_cuda, requires_native]

ALLOCATORS = [pytest.param("native", id="native"),
              pytest.param("streamalloc", id="streamalloc", marks=requires_extension)]


def probe(allocator: str) -> ProbeRun:
    return contract_probe(allocator)


def facts(allocator: str, name: str) -> dict:
    return probe(allocator).facts(name)


def block_actions(f: dict) -> list[str]:
    """The block's own entries at its address: a segment that starts there has entries at it too."""
    return [a for a in f["actions"] if not a.startswith("segment_")]


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_snapshot_traces_an_allocation_and_its_free_with_frames(allocator):
    f = facts(allocator, "snapshot_shape")
    assert block_actions(f) == ["alloc", "free_requested", "free_completed"], f
    assert f["alloc_frames_here"] and f["block_frames_here"], f
    assert f["block_state"] == "active_allocated", f
    assert f["keys_ok"], f
    if allocator == "streamalloc":
        assert f["times_sorted"], f  # PyTorch's approximate clock need not be monotonic; streamalloc's is
    assert f["pickled_has_traces"], f
    assert f["entries_after_off"] == 0, f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_snapshot_with_cpp_frames(allocator):
    f = facts(allocator, "snapshot_with_cpp")
    assert f == facts("native", "snapshot_with_cpp"), f
    assert f["has_python_frame"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_snapshot_of_a_torchscript_allocation(allocator):
    f = facts(allocator, "snapshot_script")
    assert f["alloc_entries"] == 1, f
    assert (f["frames"] > 0) == (facts("native", "snapshot_script")["frames"] > 0), f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_memory_viz_plots(allocator):
    f = facts(allocator, "plots")
    assert f["trace_html"] and f["segment_html"] and f["segsum"] and f["trace_text"], f
    assert f["cli_rc"] == 0 and f["cli_html"], f["cli_stderr"]


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_free_stack_only_with_context_all(allocator):
    assert facts(allocator, "free_stack_all")["free_frames_here"]
    # With context "alloc" a free gathers no stack of its own: its entry shows the allocation's stack.
    alloc_only = facts(allocator, "free_stack_alloc")
    assert not alloc_only["free_frames_here"] and alloc_only["alloc_frames_on_free"], alloc_only


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_segment_free_carries_empty_caches_stack(allocator):
    f = facts(allocator, "free_segment_stack")
    assert f["segment_frees"] >= 1 and f["frames_here"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_history_context_levels(allocator):
    state = facts(allocator, "history_context_state")
    assert state["trace_frames"] == 0 and state["block_frames"] > 0, state
    none = facts(allocator, "history_context_none")
    assert none["trace_frames"] == 0 and none["block_frames"] == 0, none


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_user_metadata_on_entries(allocator):
    f = facts(allocator, "metadata")
    if "skipped" in f:
        pytest.skip(f["skipped"])
    assert f == facts("native", "metadata"), f
    assert f["first"] == ["phase one"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_max_entries_keeps_the_newest(allocator):
    f = facts(allocator, "max_entries")
    assert f["count"] <= 3 and f["newest_alloc_kept"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_record_stream_free_completes_after_the_side_stream(allocator):
    f = facts(allocator, "record_stream_free")
    assert block_actions(f)[:3] == ["alloc", "free_requested", "free_completed"], f
    assert f["completed_after_requested"], f
    if allocator == "streamalloc":
        # The stream facts: which stream held the block back, and what let it go.
        assert f"pending on stream(s) {f['side_stream']}" in f["requested_metadata"], f
        assert f["side_stream"] in f["completed_metadata"], f
        assert "held" in f["completed_metadata"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_oom_entry_is_recorded_before_the_observers_run(allocator):
    f = facts(allocator, "oom_entry")
    assert f["raised"] and f["oom_entries"] == 1, f
    assert f["device_free"] > 0 and f["size_at_least_request"], f
    assert f.get("oom_entries_when_observed") == 1, f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_profiler_sees_cuda_allocations(allocator):
    f = facts(allocator, "profiler_memory")
    assert f["allocated_bytes_seen"] >= 256 * 256 * 4, f
    assert f["freed_bytes_seen"] > 0, f
    assert f["profile_plot"], f

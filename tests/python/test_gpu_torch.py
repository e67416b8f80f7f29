"""streamalloc as PyTorch's CUDA allocator, on a GPU.

PyTorch chooses its CUDA allocator once per process, so every case runs its body in a fresh
interpreter: a probe script under tests/python/scripts/ or an example under examples/, started with
`python -m streamalloc` or, for the comparison runs, with plain `python` (PyTorch's own allocator).
"""

import json
import math
import re

import pytest
from support import (
    EXAMPLES,
    HAS_EXTENSION,
    SCRIPTS,
    last_json,
    requires_cuda,
    requires_extension,
    requires_native,
    run_python,
)

pytestmark = [requires_cuda, requires_native]

PIPELINE_STEPS = "3000"


def run(script, *args, streamalloc=True, conf=None, path=None, timeout=300):
    argv = [str(script), *map(str, args)]
    if streamalloc:
        argv = ["-m", "streamalloc", *argv]
    env = {}
    if conf:
        env["STREAMALLOC_CONF"] = conf
    if path:
        env["STREAMALLOC_TORCH_PATH"] = path
    result = run_python(argv, env=env, timeout=timeout)
    assert result.returncode == 0, (f"{' '.join(argv)} exited {result.returncode}\n--- stdout\n{result.stdout}"
                                    f"\n--- stderr\n{result.stderr}")
    return last_json(result)


# ---- PyTorch's record_stream contract ----

@pytest.mark.parametrize("allocator", ["native", "streamalloc"])
def test_record_stream_contract(allocator):
    out = run(SCRIPTS / "record_stream_semantics.py", streamalloc=allocator == "streamalloc")
    s = out["scenarios"]
    for name in s:
        assert s[name]["side_busy"], f"{name}: the side stream finished before the checks; raise BUSY_CYCLES"
    # Control: without record_stream the allocator reuses the block at once (unsafe, and expected).
    assert s["unprotected"]["reused_while_busy"]
    recorded = ["record_base", "record_view", "record_base_device_sync", "record_view_event_sync"]
    # Recorded on the busy stream (directly, or through a view starting inside it): not reused early...
    for name in recorded:
        assert not s[name]["reused_while_busy"], name
    # ...and handed back by the first allocation after the host synchronises with that stream, however
    # it synchronises, even when the free's batch was still open at the sync.
    for name in recorded + ["open_batch"]:
        assert s[name]["reused_after_sync"], name
    if allocator == "streamalloc":
        side = out["side_stream"]
        for name in recorded:
            assert s[name]["state_while_busy"] == "active_pending_free"
            assert s[name]["recorded_streams"] == [side]
        assert out["stream_stats"]["record_stream_calls"] == 6
        assert out["stream_stats"]["fences_skipped_idle"] >= 1  # the open batch, released without an event


# ---- the prefetch pipelines ----

@pytest.fixture(scope="module")
def native_pipelines():
    """Each fixed pipeline under PyTorch's allocator, run once for all comparisons."""
    return {name: run(EXAMPLES / f"{name}.py", "--steps", PIPELINE_STEPS, streamalloc=False)
            for name in ("seed_fixed_pipeline", "seed_double_buffered")}


@pytest.mark.parametrize("name", ["seed_fixed_pipeline", "seed_double_buffered"])
def test_fixed_pipelines_are_bit_identical_to_native(name, native_pipelines):
    native = native_pipelines[name]
    # poison:both turns any premature reuse or early read into NaN, so "identical" is a strong claim.
    ours = run(EXAMPLES / f"{name}.py", "--steps", PIPELINE_STEPS, conf="poison:both")
    assert native["mismatched_steps"] == 0 and ours["mismatched_steps"] == 0
    assert ours["nan_steps"] == 0
    assert ours["digest"] == native["digest"]
    stream_stats = ours["stream_stats"]
    assert stream_stats["record_stream_calls"] == int(PIPELINE_STEPS)  # one per batch
    assert stream_stats["record_stream_duplicate"] == 0
    assert stream_stats["record_stream_on_alloc_stream"] == 0
    # Fences are batched: at most one per recorded use (when the GPU keeps up, each free finds the last
    # fence done and records the next), plus a few allocation-stream fences recorded on cache misses.
    assert stream_stats["fences_recorded"] <= stream_stats["record_stream_calls"] + 16


def test_fixed_pipeline_through_the_c_abi(native_pipelines):
    ours = run(EXAMPLES / "seed_fixed_pipeline.py", "--steps", PIPELINE_STEPS, conf="poison:both", path="c-abi")
    assert ours["allocator"] == "streamalloc (c-abi)"
    assert ours["mismatched_steps"] == 0
    assert ours["digest"] == native_pipelines["seed_fixed_pipeline"]["digest"]
    assert ours["stream_stats"]["record_stream_calls"] == int(PIPELINE_STEPS)


@pytest.mark.parametrize("name, conf", [("seed_broken_pipeline", "poison:both"),
                                        ("seed_missing_record_stream", "poison:free,quarantine_mb:64")])
def test_broken_pipelines_show_up_as_nan(name, conf):
    # Under PyTorch's allocator these read stale but finite data; poisoning makes the bug loud.
    # A ~10 ms spin per step keeps the consumer behind the host, so the free (and its poison) lands
    # before the late read on every run.
    ours = run(EXAMPLES / f"{name}.py", "--steps", 300, "--delay-cycles", 20_000_000, conf=conf)
    assert ours["mismatched_steps"] > 0
    assert ours["nan_steps"] > 0


@pytest.mark.parametrize("name, missing_wait", [("seed_broken_pipeline", True), ("seed_fixed_pipeline", False),
                                                 ("seed_double_buffered", False)])
def test_check_sync_flags_exactly_the_missing_wait(name, missing_wait):
    # check_sync sees the program's event records and waits through PyTorch's GPU trace hooks.
    ours = run(EXAMPLES / f"{name}.py", "--steps", 200, conf="check_sync:1")
    warnings = ours["stream_stats"]["missing_wait_warnings"]
    assert (warnings > 0) == missing_wait, f"{name}: {warnings} missing-wait warnings"


def test_pending_history_draws_the_consumer_streams_timeline(tmp_path):
    """pending_history under PyTorch: the fixed pipeline's dump holds the consumer stream's pending
    bytes over time, which replay its per-stream stats, and the report draws them."""
    dump = tmp_path / "dump.json"
    ours = run(EXAMPLES / "seed_fixed_pipeline.py", "--steps", 500, "--dump", dump, conf="pending_history:100000")
    assert ours["mismatched_steps"] == 0
    data = json.loads(dump.read_text())
    history = data["pending_history"]["0"]
    assert history["capacity"] == 100000 and history["recorded"] == len(history["time_us"]) > 0
    per_stream = {s["stream"]: s["pending_bytes"] for s in data["stats"]["0"]["stream_stats"]["per_stream"]}
    streams = set(history["stream"])
    assert len(streams) == 1, "only the compute stream has blocks recorded on it"
    (compute,) = streams
    assert max(history["pending_bytes"]) == per_stream[compute]["peak"]
    assert history["pending_bytes"][-1] == per_stream[compute]["current"]
    assert history["time_us"] == sorted(history["time_us"])
    out = tmp_path / "timeline.png"
    result = run_python(["-m", "streamalloc.report", str(dump), "--timeline", str(out)])
    assert result.returncode == 0, result.stderr
    assert f"stream {hex(compute)}: peak" in result.stdout
    assert out.read_bytes().startswith(b"\x89PNG")


# ---- training ----

def test_training_reaches_the_same_loss_as_native():
    args = ("--epochs", 2, "--samples", 1024)
    native = run(EXAMPLES / "train_with_prefetcher.py", *args, streamalloc=False)
    ours = run(EXAMPLES / "train_with_prefetcher.py", *args)
    # Deterministic algorithms, same seed: the allocator must not change a single bit.
    assert ours["losses"] == native["losses"]
    assert ours["losses"][-1] < ours["losses"][0]
    assert ours["stream_stats"]["record_stream_calls"] > 0


def test_cudnn_benchmark_works():
    import torch

    if not torch.backends.cudnn.is_available():
        pytest.skip("cuDNN is not available to this PyTorch")
    # cudnn.benchmark sizes its workspaces from cacheInfo(), which PyTorch's pluggable base class
    # refuses; streamalloc serves it.
    ours = run(EXAMPLES / "train_with_prefetcher.py", "--benchmark", "--epochs", 1, "--samples", 512)
    assert ours["benchmark"] and math.isfinite(ours["final_loss"])


# ---- PyTorch's memory APIs, served from streamalloc's numbers ----

@requires_extension
def test_memory_stats_match_native_keys_and_live_bytes():
    native = run(SCRIPTS / "memory_stats_probe.py", streamalloc=False)
    ours = run(SCRIPTS / "memory_stats_probe.py")
    assert ours["allocator"] == "extension"
    assert ours["keys"] == native["keys"]
    # The exact key set in every state: PyTorch builds the dict from every field of its DeviceStats,
    # each of which streamalloc fills (tests/torch/test_torch_convert.cpp).
    assert ours["keys_by_state"] == native["keys_by_state"]
    states = ours["keys_by_state"]
    assert states["fresh"] == []  # before CUDA is initialised, under either allocator
    for name in ("initialised", "allocated", "peak_reset", "accumulated_reset", "emptied"):
        assert states[name] == native["keys"], name
    for key in ("active_bytes.all.current", "requested_bytes.large_pool.peak", "oversize_allocations.current",
                "oversize_segments.freed", "max_split_size", "num_sync_all_streams", "num_device_alloc",
                "num_device_free", "inactive_split_bytes.small_pool.allocated"):
        assert key in native["keys"], key
    for out in (native, ours):
        assert out["reserved_after_empty_cache"] == 0
        assert out["memory_allocated"] == out["expected_allocated"]
        assert out["live_allocations"] == 8
        assert out["peak_with_big"] >= out["expected_allocated"] + (64 << 20)
        assert out["current_after_big"] == out["expected_allocated"]
        assert out["peak_after_reset"] == out["current_after_reset"]
        assert out["fraction"] == 1.0
    assert ours["differing"] == {}  # torch.cuda.memory_stats() is streamalloc.stats()["memory_stats"]
    assert ours["streamalloc_only_keys"] == []


@requires_extension
def test_snapshot_is_readable_by_memory_viz():
    out = run(SCRIPTS / "snapshot_probe.py", conf="audit:warn")
    views = ["segsum", "trace", "segments", "memory", "trace_plot", "segment_plot"]
    assert out["viz_torch"] == views and out["viz_streamalloc"] == views
    assert out["states"].get("active_allocated", 0) >= 4
    assert out["states"].get("active_pending_free", 0) >= 1
    assert out["segment_allocated_sum"] == out["memory_allocated"]
    [pending] = out["pending_in_ours"]
    assert pending["state"] == "active_pending_free" and pending["recorded_streams"] == [out["side_stream"]]
    assert "audit:warn" in out["settings"]
    assert out["pickled_segments"] > 0


SIZE = r"(?:\d+ bytes|\d+\.\d\d (?:KiB|MiB|GiB))"  # PyTorch's format_size


def oom_head(tried=SIZE, allowed=False):
    """PyTorch's first sentences of an out-of-memory error; NVML's per-process lines are optional."""
    return (rf"^CUDA out of memory\. Tried to allocate {tried}\. GPU 0 has a total capacity of {SIZE} of which "
            rf"{SIZE} is free\. (?:(?:Process \d+|Including non-PyTorch memory, this process) has {SIZE} memory "
            rf"in use\. )*{SIZE + ' allowed; ' if allowed else ''}Of the allocated memory {SIZE} is allocated by "
            rf"PyTorch, and {SIZE} is reserved by PyTorch but unallocated\.")


@requires_extension
@pytest.mark.parametrize("allocator", ["native", "streamalloc"])
def test_out_of_memory_raises_and_training_continues(allocator):
    out = run(SCRIPTS / "oom_probe.py", streamalloc=allocator == "streamalloc")
    assert re.match(oom_head(tried=r"1048576\.00 GiB"), out["huge"]), out["huge"]
    assert re.match(oom_head(tried=r"800000000\.00 GiB"), out["huge_pytorch_test"]), out["huge_pytorch_test"]
    assert out["exa"].startswith("CUDA out of memory. Tried to allocate more than 1EB memory."), out["exa"]
    assert re.match(oom_head(allowed=True), out["capped"]), out["capped"]
    assert out["fraction_zero"] == 0.0
    assert re.match(oom_head(tried=r"64\.00 MiB", allowed=True), out["zero_cap"]), out["zero_cap"]
    assert "0 bytes allowed; " in out["zero_cap"]
    if allocator == "streamalloc":
        for key in ("huge", "huge_pytorch_test", "capped", "zero_cap"):
            assert re.search(r"unallocated\. streamalloc \(cuda\): ", out[key]), out[key]
    assert out["gib_held_at_oom"] >= 1
    assert math.isfinite(out["loss_after"])
    assert out["num_ooms"] >= 4
    assert len(out["observer_calls"]) >= 4 and all(call[0] == 0 for call in out["observer_calls"])


def test_enable_after_cuda_init_fails_clearly():
    out = run(SCRIPTS / "too_late.py", streamalloc=False)
    assert "after CUDA was initialised" in out["enable"]
    assert "python -m streamalloc script.py" in out["enable"]
    if HAS_EXTENSION:
        assert "already initialised" in out["extension"]
    assert not out["enabled"]
    assert out["still_works"] == 4.0

"""PyTorch's allocator contract, checked under PyTorch's allocator and under streamalloc side by side.

Two probe scripts, each run once per pytest run under plain `python` (PyTorch's own allocator, the
contract) and under `python -m streamalloc` (the extension path):

- scripts/contract_probe.py: in one process, after CUDA graph work (a capture with a forked side
  stream, a MemPool used and deleted, make_graphed_callables), the observable behaviour of PyTorch's
  own tests in test/test_cuda.py: record_stream, memory stats, caching_allocator_alloc, out of
  memory, memory fraction, matmul memory use, streaming backwards, non-blocking copies, autocast's
  cache. Each test below asserts what the upstream test asserts, for each allocator.
- scripts/parity_probe.py: every torch.cuda memory API in a fixed sequence of states; the tests
  compare the two runs: types, key sets, exception types, and the values that must agree.

Which values may differ between the allocators, and why, is written next to each comparison.

Run on a CUDA machine, after building (the extension needs LibTorch on CMAKE_PREFIX_PATH):
    STREAMALLOC_LIBRARY_DIR=$PWD/build/lib PYTHONPATH=$PWD/torch_plugin \\
        python3 -m pytest -v -rs tests/python/test_gpu_contract.py
"""

from __future__ import annotations

import functools
import math

import pytest
from support import ProbeRun, contract_probe, requires_cuda, requires_extension, requires_native, run_probe

pytestmark = [requires_cuda, requires_native]

ALLOCATORS = [pytest.param("native", id="native"),
              pytest.param("streamalloc", id="streamalloc", marks=requires_extension)]


def contract(allocator: str) -> ProbeRun:
    return contract_probe(allocator)


@functools.lru_cache(maxsize=None)
def parity(allocator: str) -> ProbeRun:
    return run_probe("parity_probe.py", allocator, group="sections")


def close(got: float, want: float) -> bool:
    """A memory fraction read back: PyTorch's allocator may return it as allowed bytes / total bytes,
    so the bar is PyTorch's own test's float tolerance, not bit equality."""
    return math.isclose(got, want, rel_tol=1.3e-6, abs_tol=1e-5)


def behaviour(allocator: str, name: str) -> dict:
    return contract(allocator).facts(name)


def both(name: str) -> tuple[dict, dict]:
    """A parity section's facts under PyTorch's allocator and under streamalloc."""
    return parity("native").facts(name), parity("streamalloc").facts(name)


def diff(native, ours, path: str = "") -> list[str]:
    """Readable differences between two JSON values: one line per differing leaf or key."""
    if isinstance(native, dict) and isinstance(ours, dict):
        lines = []
        for key in sorted(set(native) | set(ours), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in ours:
                lines.append(f"{where}: only under native ({native[key]!r})")
            elif key not in native:
                lines.append(f"{where}: only under streamalloc ({ours[key]!r})")
            else:
                lines.extend(diff(native[key], ours[key], where))
        return lines
    where = path or "value"
    if (isinstance(native, list) and isinstance(ours, list) and native != ours
            and all(isinstance(x, str) for x in native + ours)):  # key lists: what each lacks
        missing, extra = sorted(set(native) - set(ours)), sorted(set(ours) - set(native))
        return [f"{where}: streamalloc lacks {missing}, has extra {extra}"
                if missing or extra else f"{where}: same items, other order: {native} vs {ours}"]
    if native != ours:
        return [f"{where}: native={native!r} streamalloc={ours!r}"]
    return []


def assert_same(native, ours, what: str) -> None:
    lines = diff(native, ours)
    assert not lines, f"{what} differs between PyTorch's allocator and streamalloc:\n  " + "\n  ".join(lines)


# ==== 1. upstream behaviours, after graph work ====

@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_graph_work_before_the_behaviours(allocator):
    f = behaviour(allocator, "graph_capture_with_side_stream")
    assert f["sums"] == f["expected"], f
    f = behaviour(allocator, "mempool_used_and_deleted")
    assert f["total"] == f["expected"] and f["segments_in_pool"] >= 1, f
    f = behaviour(allocator, "graphed_mlp")
    assert all(f["steps_matching_eager"]), f
    # One process, in suite order: graph work, PyTorch's allocator behaviours, then the allocation
    # history's (test_gpu_history.py reads the same run).
    out = contract(allocator).result()
    order = list(out["behaviours"])
    graph_work, history = set(out["graph_work"]), set(out["history"])
    assert set(order[:len(graph_work)]) == graph_work and set(order[-len(history):]) == history, order


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_record_stream(allocator):
    f = behaviour(allocator, "record_stream")
    assert f["current_was_busy"], f"the recorded stream finished before the check; the test proves nothing: {f}"
    assert not f["reused_too_soon"], f
    assert f["result"] == [1.0, 2.0, 3.0, 4.0], f
    # PyTorch's test skips this under cudaMallocAsync; a caching allocator must hand the block back to
    # the stream it belongs to once the host has synchronised with the recorded stream.
    assert f["reused_after_sync"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_record_stream_on_shifted_view(allocator):
    f = behaviour(allocator, "record_stream_on_shifted_view")
    assert f["storage_offset"] > 0 and f["recorded_was_busy"], f
    assert not f["reused_while_recorded_busy"], f
    # Beyond PyTorch's test: once the recorded stream is done and the host knows it, the block serves again.
    assert f["reused_after_recorded_sync"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_memory_stats(allocator):
    f = behaviour(allocator, "memory_stats")
    assert f["allocated"] == f["max_allocated"] and f["reserved"] == f["max_reserved"], f
    # 256 floats are 1024 bytes, a multiple of 512: the rounding of both allocators keeps it exact.
    assert f["active_delta_live"] == 1024 and f["active_freed_live"] == 0, f
    assert f["active_delta_after"] == 0 and f["active_freed_after"] == 1024, f
    assert f["max_allocated_after_reset"] == f["max_allocated"], f
    assert f["max_reserved_after_reset"] == f["max_reserved"], f
    assert f["cuda_matches_accelerator"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_memory_allocation(allocator):
    f = behaviour(allocator, "memory_allocation")
    assert f["ptr_type"] == "int", f
    assert f["during"] > 0 and f["after"] == 0, f
    assert f["during_on_stream"] >= 1 << 20 and f["after_on_stream"] == 0, f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_out_of_memory(allocator):
    f = behaviour(allocator, "out_of_memory")
    huge, exa = f["huge"], f["exa"]
    assert huge and huge["is_oom"], f
    assert huge["message"].startswith(
        "CUDA out of memory. Tried to allocate 800000000.00 GiB. GPU 0 has a total capacity of"), huge
    assert exa and exa["is_oom"] and "Tried to allocate more than 1EB memory" in exa["message"], exa
    assert f["kernel_after"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_out_of_memory_retry(allocator):
    f = behaviour(allocator, "out_of_memory_retry")
    refused = f["second_while_first_lives"]
    assert refused and refused["is_oom"] and refused["message"].startswith("CUDA out of memory. Tried to allocate"), f
    assert f["second_after_free"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_set_per_process_memory_fraction(allocator):
    f = behaviour(allocator, "set_per_process_memory_fraction")
    # PyTorch's Python refuses these before any allocator sees them: the same under both.
    assert f["int_one"]["type"] == "TypeError" and "Invalid type" in f["int_one"]["message"], f
    for key in ("negative", "two"):
        assert f[key]["type"] == "ValueError" and "Invalid fraction value" in f[key]["message"], f
    assert close(f["get_after_half"], 0.5), f
    assert f["just_under_half"] is None, f"49.9% of the device minus what is reserved must fit under a 0.5 cap: {f}"
    half = f["half"]
    assert half and half["is_runtime_error"] and "out of memory" in half["message"], f
    assert f["kernel_after"] and close(f["restored"], f["original"]), f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_get_per_process_memory_fraction(allocator):
    f = behaviour(allocator, "get_per_process_memory_fraction")
    assert [pair[0] for pair in f["set_and_got"][:2]] == [1.0, 0.0]
    # PyTorch's test compares with its default float tolerances; a fraction of exactly 0 must read
    # back as 0 (no new device memory at all).
    for value, got in f["set_and_got"]:
        assert close(got, value), f
    assert f["set_and_got"][1][1] == 0.0, f
    assert close(f["restored"], f["initial"]), f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_caching_allocator_record_stream_oom(allocator):
    f = behaviour(allocator, "caching_allocator_record_stream_oom")
    # Blocks waiting on record_stream must be reclaimed when the cap is reached, not fail the request...
    assert f["error"] is None and f["steps_done"] == 100, f
    # ...and only once the recorded stream has read them: a block handed out early changes the sum.
    assert f["sum_ok"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_matmul_memory_use(allocator):
    f = behaviour(allocator, "matmul_memory_use")
    assert f["matmul"] == f["matmul_expanded"] == f["bmm"], f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_streaming_backwards_sync(allocator):
    f = behaviour(allocator, "streaming_backwards_sync")
    assert f["grad_outside_ok"] and f["stream_restored"], f
    assert f["grad_in_ambient_ok"] and f["ambient_current"], f
    assert f["backward_on_wrong_stream"] == 0, f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_streaming_backwards_multiple_streams(allocator):
    f = behaviour(allocator, "streaming_backwards_multiple_streams")
    assert len(f["cases"]) == 6, f
    bad = [c for c in f["cases"] if not (c["grad_ok"] and c["hook_streams_ok"])]
    assert not bad, bad
    assert f["backward_on_wrong_stream"] == 0, f


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_to_non_blocking(allocator):
    f = behaviour(allocator, "to_non_blocking")
    assert len(f["cases"]) == 4, f
    for case in f["cases"]:
        assert case["stream_done_at_return"] == (not case["non_blocking"]), case
        assert case["equal"], case
        assert case["pinned"] == (case["non_blocking"] and case["dst"] == "cpu"), case


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_autocast_cache_leak(allocator):
    f = behaviour(allocator, "autocast_cache_leak")
    assert f["after"] == [f["first"]] * 3, f


@requires_extension
def test_upstream_behaviours_report_the_same_facts_where_policy_does_not_enter():
    """Beyond each upstream bar: the facts that depend on no caching policy are the same numbers."""
    for name, keys in {"memory_stats": ("active_delta_live", "active_freed_live", "active_delta_after",
                                        "active_freed_after"),
                       "memory_allocation": ("during", "after", "during_on_stream", "after_on_stream"),
                       "record_stream": ("reused_too_soon", "reused_after_sync", "result"),
                       "record_stream_on_shifted_view": ("reused_while_recorded_busy", "reused_after_recorded_sync"),
                       "autocast_cache_leak": ("first", "after")}.items():
        native, ours = behaviour("native", name), behaviour("streamalloc", name)
        assert_same({k: native[k] for k in keys}, {k: ours[k] for k in keys}, name)
    # matmul's peaks include the result and cuBLAS's workspace; both are requests PyTorch makes,
    # and both allocators round them to 512 bytes, so the peaks are the same number.
    assert_same(behaviour("native", "matmul_memory_use"), behaviour("streamalloc", "matmul_memory_use"),
                "matmul peaks")


# ==== 2. parity of every torch.cuda memory API ====

# memory_stats() values that must agree after the same allocations: what was asked for and what is
# live (the 512-byte rounding is the same in both, as is the 1 MiB small/large boundary), and the
# number of out-of-memory errors. Everything else is caching policy and may differ: reserved_bytes
# and segment (how much device memory is held, in how many cudaMalloc'd pieces), inactive_split*
# (free pieces inside segments), oversize_* (PyTorch's max_split_size rule), num_device_alloc/free,
# num_alloc_retries and num_sync_all_streams (when each allocator goes to the driver or waits),
# max_split_size (a setting).
AGREEING_STATS = ("allocation", "allocated_bytes", "requested_bytes", "active", "active_bytes")
AGREEING_SCALARS = ("num_ooms",)
POOLS = ("all", "small_pool", "large_pool")
METRICS = ("current", "peak", "allocated", "freed")


def agreeing(stats: dict) -> dict:
    keys = [f"{s}.{p}.{m}" for s in AGREEING_STATS for p in POOLS for m in METRICS] + list(AGREEING_SCALARS)
    return {k: stats.get(k, "<missing>") for k in keys}


@requires_extension
def test_memory_stats_keys_in_every_state():
    native, ours = both("states")
    assert list(ours["states"]) == list(native["states"])
    for state in native["states"]:
        assert_same(sorted(native["states"][state]["stats"]), sorted(ours["states"][state]["stats"]),
                    f"memory_stats() keys in state {state!r}")
    assert native["states"]["fresh"]["stats"] == {} == ours["states"]["fresh"]["stats"]


@requires_extension
def test_memory_stats_values_that_must_agree():
    native, ours = both("states")
    # Whether the side stream was still busy when the stats were read does not matter here: both
    # allocators notice that a recorded stream is done only at their next allocation, so the block is
    # counted active in the "pending" state either way (side_was_busy is reported for the record).
    lines = []
    for state in native["states"]:
        if state == "fresh":
            continue
        # memory_allocated() and its peak are allocated_bytes.all; reserved ones are policy.
        pick = lambda s: {**agreeing(s["stats"]), **{k: s["getters"][k] for k in  # noqa: E731
                                                     ("memory_allocated", "max_memory_allocated")}}
        lines += [f"[{state}] {line}" for line in diff(pick(native["states"][state]), pick(ours["states"][state]))]
    assert not lines, "memory_stats() values differ:\n  " + "\n  ".join(lines)


@pytest.mark.parametrize("allocator", ALLOCATORS)
def test_memory_stats_states_follow_the_allocation_pattern(allocator):
    f = parity(allocator).facts("states")
    states, expected = f["states"], f["expected"]
    stats = {name: s["stats"] for name, s in states.items()}
    assert stats["allocated"]["allocated_bytes.all.current"] == expected["allocated"]
    assert stats["allocated"]["requested_bytes.all.current"] == expected["requested_allocated"]
    assert stats["freed"]["allocated_bytes.all.current"] == expected["freed"]
    # Freed while recorded on a busy stream: no longer allocated, still active until the stream is done.
    pending = stats["pending"]
    assert pending["allocated_bytes.all.current"] == expected["freed"]
    assert pending["active_bytes.all.current"] > expected["freed"], pending["active_bytes.all.current"]
    # Under streamalloc the message carries its path and fence counters before and after the sync.
    assert stats["synced"]["active_bytes.all.current"] == expected["synced"], {
        name: states[name].get("streamalloc") for name in ("pending", "synced")}
    for key, value in stats["peak_reset"].items():
        if key.endswith(".peak"):
            assert value == stats["peak_reset"][key[:-len("peak")] + "current"], key
    for key, value in stats["accumulated_reset"].items():
        if key.endswith((".allocated", ".freed")) or key in ("num_alloc_retries", "num_ooms",
                                                              "num_sync_all_streams", "num_device_alloc",
                                                              "num_device_free"):
            assert value == 0, (key, value)
    assert stats["emptied"]["allocated_bytes.all.current"] == 0
    assert stats["emptied"]["reserved_bytes.all.current"] == 0


@requires_extension
def test_memory_stats_as_nested_dict_and_misc():
    native, ours = both("misc")
    assert_same(native["nested_shape"], ours["nested_shape"], "memory_stats_as_nested_dict()'s shape")
    assert native["device_arg_same"] and ours["device_arg_same"]
    assert native["is_initialized"] == ours["is_initialized"]
    # The backend's name is what tells them apart; PyTorch's own says "native".
    assert native["allocator_backend"] == "native"


@requires_extension
def test_memory_summary_has_the_same_rows():
    native, ours = both("summary")
    assert ours["type"] == native["type"] == "str"
    assert_same(native["labels"], ours["labels"], "memory_summary() row labels")
    assert_same(native["abbreviated_labels"], ours["abbreviated_labels"], "memory_summary(abbreviated=True) rows")
    assert len(native["labels"]) > 5
    # The rows of live and requested bytes and counts are allocated_bytes, requested_bytes, allocation
    # and active: the same after the same requests (reserved and segment rows are policy).
    assert all(native["rows"].values()), native["rows"]
    assert_same(native["rows"], ours["rows"], "memory_summary() rows of allocated and requested memory")


@requires_extension
def test_mem_get_info():
    native, ours = both("mem_get_info")
    # Free memory is the driver's number at that moment, and depends on what each allocator holds.
    for f in (native, ours):
        assert f["types"] == ["int", "int"] and f["free_le_total"] and f["device_arg_same_total"], f
        assert f["total"] == f["device_total"], f


@requires_extension
def test_caching_allocator_alloc_and_delete():
    native, ours = both("caching_allocator")
    assert set(native["types"]) == set(ours["types"]) == {"int"}
    # Live bytes of raw allocations are the 512-byte rounded sizes under both.
    assert_same(native["deltas"], ours["deltas"], "memory_allocated() growth per caching_allocator_alloc")
    for f in (native, ours):
        assert f["after_all"] == 0 and f["after_bad"] == 0 and f["unchanged_after_inside"], f
    # Bad pointers raise, and with the same exception type (the messages are each allocator's own).
    # caching_allocator_alloc(-1) asks for SIZE_MAX bytes. PyTorch's allocator rounds that size up to a
    # multiple of 512, which wraps to 0, and hands out a block; streamalloc refuses it as PyTorch refuses
    # any request of 1 EiB or more ("Tried to allocate more than 1EB memory"): a clear error beats a
    # pointer to no memory.
    assert ours["alloc_negative"] is not None and ours["alloc_negative"]["type"] == "OutOfMemoryError", ours
    assert "more than 1EB" in ours["alloc_negative"]["message"], ours
    for key in ("delete_inside_block", "delete_twice", "alloc_zero"):
        n, o = native[key], ours[key]
        assert (n is None) == (o is None), f"{key}: native={n} streamalloc={o}"
        if n is not None:
            assert n["type"] == o["type"] and n["is_runtime_error"] == o["is_runtime_error"], (key, n, o)


@requires_extension
def test_snapshot_shape():
    native, ours = both("snapshot")
    for key in ("top_keys", "segment_keys", "block_keys", "device_traces_type", "device_traces_inner",
                "settings_type"):
        assert_same(native[key], ours[key], f"_snapshot() {key}")
    for f in (native, ours):
        assert f["sizes_add_up"] and f["allocated_is_memory_allocated"] and f["reserved_is_memory_reserved"], f
        assert f["live_found"] and f["memory_snapshot_is_segments"], f
        assert "active_allocated" in f["block_states"], f
    # Block states and segment types present depend on what is cached (policy); each must be one
    # PyTorch's memory_viz knows.
    assert set(ours["block_states"]) <= {"active_allocated", "active_pending_free", "inactive"}, ours
    assert set(ours["segment_types"]) <= {"small", "large"}, ours


@requires_extension
def test_record_memory_history():
    native, ours = both("record_memory_history")
    assert native["enable"] is None, native
    assert native["disable"] is None and ours["disable"] is None, (native, ours)
    assert ours["enable"] is None, ours
    assert_same(native["trace_keys"], ours["trace_keys"], "device_traces entries' keys")
    # The actions of a block's life must all be traced; PyTorch's also traces segment and snapshot
    # events, which follow each allocator's policy.
    core = {"alloc", "free_requested", "free_completed"} & set(native["actions"])
    assert core <= set(ours["actions"]), (native["actions"], ours["actions"])
    assert native["after_disable_traces"] == ours["after_disable_traces"]


@requires_extension
def test_memory_fraction_valid_and_invalid_values():
    native, ours = both("memory_fraction")
    assert close(native["default"], 1.0) and close(ours["default"], 1.0) and ours["default_type"] == "float"
    for value, (error, got) in native["valid"].items():
        our_error, our_got = ours["valid"][value]
        assert error is None and our_error is None, (value, error, our_error)
        assert close(got, float(value)) and close(our_got, float(value)), (value, got, our_got)
    # Which bad values raise, and what type; PyTorch's Python catches most before either allocator.
    lines = []
    for case, n in native["invalid"].items():
        o = ours["invalid"][case]
        if (n is None) != (o is None) or (
                n and (n["type"], n["is_runtime_error"]) != (o["type"], o["is_runtime_error"])):
            lines.append(f"{case}: native={n} streamalloc={o}")
    assert not lines, "set/get_per_process_memory_fraction differ on bad input:\n  " + "\n  ".join(lines)
    assert close(native["after_invalid"], 1.0) and close(ours["after_invalid"], 1.0), (native, ours)
    assert native["allocates_after"] and ours["allocates_after"]


@requires_extension
def test_out_of_memory_observer():
    native, ours = both("oom_observer")
    assert native["error_type"] == ours["error_type"] == "OutOfMemoryError", (native, ours)
    for f in (native, ours):
        assert f["calls"] >= 1 and f["device_arg"] == [0] and f["num_ooms"] >= 1, f
    assert ours["arity"] == native["arity"] and ours["arg_types"] == native["arg_types"], (native, ours)


@requires_extension
def test_allocator_settings_and_gpu_processes():
    native, ours = both("allocator_settings")
    for key in ("valid", "unknown_key"):
        n, o = native[key], ours[key]
        assert (n is None) == (o is None) and (n is None or n["type"] == o["type"]), (key, n, o)
    assert native["allocates_after"] and ours["allocates_after"]
    native, ours = both("gpu_processes")
    assert_same(native, ours, "list_gpu_processes()")  # NVML's answer or its 'pynvml not found' line

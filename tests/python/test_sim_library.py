"""The C ABI binding and the stats/snapshot/report plumbing, on the simulated device (CPU only)."""

import json

import pytest

from streamalloc import _inspect, report
from support import SCRIPTS, HAS_TORCH, last_json, requires_native, run_python

pytestmark = requires_native


@pytest.fixture(scope="module")
def sim():
    result = run_python([str(SCRIPTS / "sim_library.py")])
    assert result.returncode == 0, result.stderr
    return last_json(result)


def test_record_stream_calls_are_counted_by_kind(sim):
    stream_stats = sim["stats"]["stream_stats"]
    assert stream_stats["record_stream_calls"] == 3
    assert stream_stats["record_stream_duplicate"] == 1
    assert stream_stats["record_stream_on_alloc_stream"] == 1
    assert stream_stats["pending_blocks"]["current"] == 1


def test_memory_stats_use_pytorch_key_names(sim):
    memory = sim["stats"]["memory_stats"]
    assert memory["allocation.all.current"] == 1  # the large block; the small one is pending free
    assert memory["allocated_bytes.all.current"] == 3 << 20
    assert memory["requested_bytes.all.current"] == 3 << 20
    assert memory["active.all.current"] == 2  # pending blocks are still active, as in PyTorch
    for key in ("segment.small_pool.current", "reserved_bytes.large_pool.peak", "num_alloc_retries",
                "num_device_alloc", "oversize_allocations.current", "max_split_size"):
        assert key in memory


def test_a_double_free_is_refused_with_a_message(sim):
    assert "free" in sim["double_free"] and sim["double_free"] != "accepted"


def test_blocks_carry_their_streams(sim):
    blocks = {b["address"]: b for b in _inspect.blocks_of(sim["snapshot"], 0)}
    pending = blocks[sim["small"]]
    assert pending["state"] == "active_pending_free"
    assert pending["allocation_stream"] == 0x11
    assert pending["recorded_streams"] == [0x22]
    # Per block, only the call that added a stream counts; duplicates and calls on the allocation
    # stream show in the stream stats above.
    assert pending["record_stream_calls"] == 1
    assert pending["pending_fences"] == 1
    assert blocks[sim["large"]]["state"] == "active_allocated"
    assert all(b["device"] == 0 for b in blocks.values())
    assert _inspect.blocks_of(sim["snapshot"], 1) == []


def test_reports_show_the_pending_block(sim):
    text = report.format_report({"stats": {"0": sim["stats"]}, "snapshot": sim["snapshot"]})
    assert "1 blocks pending free" in text
    assert hex(sim["small"]) in text and "active_pending_free" in text


@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")
def test_snapshot_is_readable_by_torch_memory_viz(sim):
    from torch.cuda import _memory_viz

    snapshot = sim["snapshot"]
    local = lambda lines: lines  # noqa: E731  (memory()/segments() would fetch flamegraph.pl)
    assert "segments: " in _memory_viz.segsum(snapshot)
    assert "active_pending_free" in _memory_viz.segments(snapshot, format_flamegraph=local)
    assert _memory_viz.memory(snapshot, format_flamegraph=local)
    _memory_viz.trace(snapshot)  # no allocation history: one empty trace per device
    for html in (_memory_viz.trace_plot(snapshot), _memory_viz.segment_plot(snapshot)):
        assert "<html" in html.lower()


def test_pending_history_follows_the_side_streams_pending_bytes(sim):
    history = sim["history"]
    assert history["capacity"] == 1000
    assert history["stream"] == [0x22]  # the free made the small block wait for SIDE_STREAM's fence
    assert history["pending_blocks"] == [1]
    small_size = sim["stats"]["stream_stats"]["pending_bytes"]["current"]
    assert history["pending_bytes"] == [small_size]
    after = sim["history_after_empty_cache"]
    assert after["stream"] == [0x22, 0x22] and after["pending_bytes"] == [small_size, 0]
    assert after["time_us"][0] <= after["time_us"][1]
    assert after["recorded"] == 2


def test_report_reads_the_pending_history(sim):
    dump = {"stats": {"0": sim["stats"]}, "snapshot": sim["snapshot"],
            "pending_history": {"0": sim["history_after_empty_cache"]}}
    text = report.format_report(dump)
    assert "pending history, device 0: 2 changes" in text
    assert "stream 0x22: peak 1.00 KiB pending" in text
    assert report.format_report(sim["history_after_empty_cache"]).startswith("pending history, device 0")


@pytest.mark.parametrize("suffix", [".png", ".svg", ".html"])
def test_timeline_is_drawn_from_a_dump(sim, tmp_path, suffix):
    pytest.importorskip("matplotlib", reason="--timeline draws with matplotlib")
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"snapshot": sim["snapshot"], "pending_history": {"0": sim["history_after_empty_cache"]}}))
    out = tmp_path / f"timeline{suffix}"
    assert report.main([str(dump), "--timeline", str(out)]) == 0
    data = out.read_bytes()
    assert len(data) > 1000
    if suffix == ".png":
        assert data.startswith(b"\x89PNG")
    elif suffix == ".html":
        assert b"<svg" in data and b"stream 0x22: peak" in data


def test_timeline_without_a_history_says_how_to_record_one(sim, tmp_path, capsys):
    dump = tmp_path / "dump.json"
    dump.write_text(json.dumps({"snapshot": sim["snapshot"]}))
    assert report.main([str(dump), "--timeline", str(tmp_path / "t.png")]) == 2
    assert "pending_history:N" in capsys.readouterr().err

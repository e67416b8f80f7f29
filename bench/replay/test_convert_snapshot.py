#!/usr/bin/env python3
"""Tests of convert_snapshot.py on hand-made snapshots: record_stream inference, the record log, the
native peaks in the header, truncation. Runs under pytest or as a script (exit status 1 on failure)."""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert_snapshot import RecordLog, convert, write_trace

SIDE, MAIN, OTHER = 0x11, 0x22, 0x33  # raw cudaStream_t values


def entry(action, addr, size, stream, t):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t, "frames": []}


def snapshot(*entries):
    return {"segments": [], "device_traces": [list(entries)]}


def pipeline():
    """A batch allocated on the side stream and used on main (its free completes late), a temporary on
    main freed at once, a block allocated before the history started."""
    return snapshot(
        entry("segment_alloc", 0x1000, 2 << 20, SIDE, 1),
        entry("alloc", 0x1000, 4096, SIDE, 2),
        entry("alloc", 0x9000, 100, MAIN, 3),
        entry("free_requested", 0x9000, 100, MAIN, 4),
        entry("free_completed", 0x9000, 100, MAIN, 4),
        entry("free_requested", 0x1000, 4096, SIDE, 5),
        entry("alloc", 0x5000, 1000, MAIN, 6),
        entry("free_completed", 0x1000, 4096, SIDE, 7),
        entry("free_requested", 0x7777, 10, MAIN, 8),
        entry("segment_free", 0x1000, 2 << 20, SIDE, 9),
    )


def test_delayed_free_completed_becomes_record_stream_on_latest_other_stream():
    lines, _, summary = convert(pipeline())
    assert lines == ["a 0 4096 0", "a 1 100 1", "f 1", "r 0 1", "f 0", "a 2 1000 1"]
    assert summary["inferred_records"] == 1 and summary["logged_records"] == 0
    assert summary["unknown_frees"] == 1 and summary["live_at_end"] == 1


def test_record_log_names_the_stream():
    log = RecordLog([{"t_us": 3, "addr": 0x1000, "stream": OTHER}, {"t_us": 50, "addr": 0x1000, "stream": MAIN}])
    lines, _, summary = convert(pipeline(), record_log=log)
    assert "r 0 2" in lines  # OTHER, a stream of its own; the call at t=50 is outside the block's life
    assert summary["logged_records"] == 1 and summary["inferred_records"] == 0


def test_no_other_stream_gets_a_stream_of_its_own():
    snap = snapshot(entry("alloc", 0x10, 512, SIDE, 1), entry("free_requested", 0x10, 512, SIDE, 2),
                    entry("alloc", 0x20, 512, SIDE, 3), entry("free_completed", 0x10, 512, SIDE, 4))
    lines, _, _ = convert(snap)
    assert lines == ["a 0 512 0", "r 0 1", "f 0", "a 1 512 0"]


def test_native_peaks_over_the_window():
    _, header, _ = convert(pipeline())
    assert header["native_peak_reserved"] == 2 << 20
    assert header["native_peak_allocated"] == 4096 + 512  # the 100-byte block counts as 512 B, as in PyTorch


def test_truncation_keeps_the_first_ops_and_their_peaks():
    lines, header, summary = convert(pipeline(), max_ops=1)
    assert lines == ["a 0 4096 0"] and summary["truncated"]
    assert header["native_peak_allocated"] == 4096 and header["truncated"] == 1


def test_missing_history_is_an_error():
    try:
        convert({"segments": [], "device_traces": []})
    except ValueError as error:
        assert "_record_memory_history" in str(error)
    else:
        raise AssertionError("no error for a snapshot without history")


def test_written_header_has_no_spaces_in_values():
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.trace")
        write_trace(path, ["a 0 512 0"], {"workload": "w", "gpu": "NVIDIA H200"})
        with open(path) as f:
            assert f.readline() == "#streamalloc-trace v1 workload=w gpu=NVIDIA_H200\n"


if __name__ == "__main__":
    failed = 0
    for name, test in sorted(globals().items()):
        if name.startswith("test_") and callable(test):
            try:
                test()
                print(f"ok   {name}")
            except AssertionError as error:
                failed += 1
                print(f"FAIL {name}: {error!r}")
    sys.exit(1 if failed else 0)

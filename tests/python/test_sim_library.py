"""The C ABI binding and the stats/snapshot/report plumbing, on the simulated device (CPU only)."""

import json
import re

import pytest
from streamalloc import _conf, _inspect, _native, report
from support import HAS_TORCH, REPO, SCRIPTS, last_json, requires_extension, requires_native, run_code, run_python

HEADER = (REPO / "allocator" / "include" / "streamalloc" / "streamalloc.h").read_text()

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
    # Requested bytes count the pending block too (1000 requested), as PyTorch counts them until the
    # block's events complete.
    assert memory["requested_bytes.all.current"] == (3 << 20) + 1000
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
    pending = {"0": sim["history_after_empty_cache"]}
    dump.write_text(json.dumps({"snapshot": sim["snapshot"], "pending_history": pending}))
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


# ---- one table of the C ABI for Python, checked against the header and the libraries ----

def header_functions() -> dict[str, int]:
    """streamalloc.h's functions: name -> number of parameters."""
    functions = {}
    for name, params in re.findall(r"STREAMALLOC_API\s+[\w\s\*]*?\b(streamalloc_\w+)\(([^)]*)\)", HEADER):
        params = params.strip()
        functions[name] = 0 if params in ("", "void") else params.count(",") + 1
    return functions


def test_every_bound_function_is_the_headers_with_its_arity():
    declared = header_functions()
    for function in _native.ABI + _native._PLUMBING:
        name = "streamalloc_" + function.name
        assert name in declared, f"{name} is bound in _native.ABI but not declared in streamalloc.h"
        assert len(function.argtypes) == declared[name], name


def test_the_library_exports_the_table_and_binds_one_method_each():
    lib = _native.CLibrary(_native.find_c_library())
    for function in _native.ABI:
        assert callable(getattr(lib, function.name)), function.name


@requires_extension
def test_the_extension_has_every_shared_function():
    result = run_code(
        "import json\n"
        "from streamalloc import _native\n"
        "ext = _native.load_extension(_native.find_extension())\n"
        "print(json.dumps(sorted(n for n in _native.SHARED if not callable(getattr(ext, n, None)))))\n")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == []


def test_error_numbers_come_from_the_headers_enum():
    lib = _native.CLibrary(_native.find_c_library())
    enum = dict(re.findall(r"STREAMALLOC_(?:ERROR_)?(\w+) = (\d+)", HEADER))
    assert enum, "no error codes found in streamalloc.h"
    for name, number in enum.items():
        assert lib.error_name(int(number)) == name.lower()
    assert lib.error_name(max(int(n) for n in enum.values()) + 1) is None


def test_config_errors_are_config_errors_and_others_carry_the_headers_number():
    result = run_code(
        "import json\n"
        "from streamalloc import _native\n"
        "lib = _native.CLibrary(_native.find_c_library())\n"
        "out = {}\n"
        "try:\n"
        "    lib.configure('nope:1')\n"
        "except _native.ConfigError as e:\n"
        "    out['config'] = str(e)\n"
        "lib.configure('backend:sim,log_level:off')\n"
        "try:\n"
        "    lib.free(0x1234, 8, 0, 0)\n"
        "except _native.StreamallocError as e:\n"
        "    out['code'] = e.code\n"
        "print(json.dumps(out))\n")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert "unknown option 'nope' in the string passed to streamalloc_configure()" in out["config"]
    assert out["code"] == int(re.search(r"STREAMALLOC_ERROR_INVALID_ARGUMENT = (\d+)", HEADER).group(1))


def test_zero_stats_have_the_keys_of_a_device_in_use(sim):
    lib = _native.CLibrary(_native.find_c_library())
    zero = json.loads(lib.zero_stats_json())
    assert not lib.is_initialized()

    def paths(d, prefix=""):
        out = set()
        for key, value in d.items():
            out.add(prefix + key)
            if isinstance(value, dict):
                out |= paths(value, prefix + key + ".")
        return out

    assert paths(zero) == paths(sim["stats"])
    assert all(v == 0 for k, v in zero["memory_stats"].items() if k != "max_split_size")


def test_resolve_conf_layers_keyword_options_and_names_the_source():
    lib = _native.CLibrary(_native.find_c_library())
    resolved = json.loads(lib.resolve_conf("audit:off,poison:free", "audit:warn", "the test"))
    assert resolved["options"]["audit"] == "warn" and resolved["options"]["poison"] == "free"
    assert "audit:warn" in resolved["conf"]
    with pytest.raises(_native.ConfigError, match="malformed item 'x' in --conf"):
        lib.resolve_conf("", "x", "--conf")
    assert not lib.is_initialized()


def test_expandable_segments_takes_pythons_bool_and_pytorchs_spelling():
    # enable(expandable_segments=True) spells the bool as "1"; PyTorch's users write "True".
    lib = _native.CLibrary(_native.find_c_library())
    for spelled in (_conf.options_conf({"expandable_segments": True}), "expandable_segments:True"):
        resolved = json.loads(lib.resolve_conf("", spelled, "the test"))
        assert resolved["options"]["expandable_segments"] == "true"
    off = json.loads(lib.resolve_conf("", _conf.options_conf({"expandable_segments": False}), "the test"))
    assert off["options"]["expandable_segments"] == "false"
    with pytest.raises(_native.ConfigError, match="accepted: true\\|false\\|True\\|False\\|1\\|0"):
        lib.resolve_conf("", "expandable_segments:yes", "the test")
    assert not lib.is_initialized()

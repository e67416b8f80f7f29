"""The CPU-side parts of the package: importing without torch, conf strings, reports."""

import importlib.util
import json

import pytest
from streamalloc import _conf, report
from support import REPO, run_code, run_python


def test_imports_without_torch():
    # sys.modules[name] = None makes `import torch` fail, as on a machine without PyTorch.
    result = run_code(
        "import sys; sys.modules['torch'] = None\n"
        "import streamalloc, streamalloc.report, streamalloc._launcher\n"
        "assert not streamalloc.is_enabled() and streamalloc.active_path() is None\n"
        "try:\n"
        "    streamalloc.enable()\n"
        "except RuntimeError as e:\n"
        "    print('enable:', e)\n")
    assert result.returncode == 0, result.stderr
    # Either the native library is missing or torch is: both are reported, neither crashes.
    assert "enable:" in result.stdout


def test_launcher_help_needs_no_torch():
    result = run_code("import sys; sys.modules['torch'] = None; sys.argv = ['streamalloc', '--help']\n"
                      "from streamalloc._launcher import main; raise SystemExit(main())")
    assert result.returncode == 0
    assert "usage: python -m streamalloc" in result.stdout


class TestConf:
    def test_keyword_options_override_items_of_the_same_key(self):
        assert _conf.merge_conf("audit:off, poison:free", {"audit": "warn"}) == "poison:free,audit:warn"

    def test_values_are_spelled_as_the_conf_syntax(self):
        merged = _conf.merge_conf("", {"check_sync": True, "quarantine_mb": 16, "memory_fraction": 0.5})
        assert merged == "check_sync:1,quarantine_mb:16,memory_fraction:0.5"
        assert _conf.merge_conf("", {"check_sync": False}) == "check_sync:0"

    def test_malformed_items_are_kept_for_the_native_parser_to_name(self):
        assert _conf.merge_conf("oops,audit:off", {"audit": "warn"}) == "oops,audit:warn"

    def test_a_value_with_a_comma_is_rejected_naming_the_key(self):
        with pytest.raises(ValueError, match="audit_file"):
            _conf.merge_conf("", {"audit_file": "a,b"})

    def test_a_value_of_another_type_is_rejected_naming_the_key(self):
        with pytest.raises(TypeError, match="poison"):
            _conf.merge_conf("", {"poison": ["free"]})

    def test_conf_from_env(self):
        assert _conf.conf_from_env({"STREAMALLOC_CONF": "audit:warn"}) == "audit:warn"
        assert _conf.conf_from_env({}) == ""

    def test_keyword_options_as_one_conf_string(self):
        assert _conf.options_conf({"audit": "warn", "check_sync": True}) == "audit:warn,check_sync:1"
        assert _conf.options_conf({}) == ""
        with pytest.raises(ValueError, match="not an option name"):
            _conf.options_conf({"a:b": 1})


STATS = {
    "memory_stats": {"allocated_bytes.all.current": 3 * 1024 * 1024, "allocated_bytes.all.peak": 4 * 1024 * 1024,
                     "reserved_bytes.all.current": 20 * 1024 * 1024, "reserved_bytes.all.peak": 20 * 1024 * 1024,
                     "allocation.all.current": 3, "num_device_alloc": 1, "num_ooms": 0},
    "stream_stats": {"record_stream_calls": 7, "record_stream_on_alloc_stream": 2, "record_stream_duplicate": 1,
                     "record_stream_unknown_ptr": 0, "fences_recorded": 4, "fences_polled": 9,
                     "pending_blocks": {"current": 1, "peak": 2}, "pending_bytes": {"current": 512, "peak": 1024},
                     "per_stream": [{"stream": 0x1234, "pending_blocks": {"current": 1, "peak": 2},
                                     "pending_bytes": {"current": 512, "peak": 1024}}],
                     "free_to_reusable_us": [{"below_us": 10, "count": 0}, {"below_us": 100, "count": 3},
                                             {"below_us": None, "count": 1}]},
}


class TestReport:
    def test_format_bytes(self):
        assert report.format_bytes(512) == "512 B"
        assert report.format_bytes(3 * 1024 * 1024) == "3.00 MiB"

    def test_the_benchmark_report_writes_bytes_with_the_same_function(self):
        spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
        bench_report = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench_report)
        assert bench_report.format_bytes is report.format_bytes
        assert bench_report.fmt_bytes(5 * 2**40) == report.format_bytes(5 * 2**40) == "5.00 TiB"
        assert bench_report.fmt_bytes(None) == bench_report.fmt_bytes(-1) == "n/a"

    def test_stats_report_names_the_numbers(self):
        text = report.format_stats(STATS, 0)
        assert "streamalloc device 0" in text
        assert "allocated 3.00 MiB (peak 4.00 MiB)" in text
        assert "record_stream 7 calls: 2 on the allocation stream, 1 duplicate" in text
        assert "stream 0x1234: 1 blocks / 512 B pending now" in text
        assert "<100us: 3" in text and "more: 1" in text

    def test_hints_follow_wasteful_record_stream_use(self):
        hints = report.stream_hints(STATS["stream_stats"])
        assert any("allocated the tensor does nothing" in h for h in hints)
        assert any("one call per stream" in h for h in hints)
        assert report.stream_hints({"record_stream_calls": 5}) == []

    def test_empty_stats_say_cuda_was_not_initialised(self):
        assert "not initialised" in report.format_stats({}, 0)

    def test_blocks_list_the_used_ones_largest_first(self):
        blocks = [
            {"address": 0x1000, "size": 512, "state": "active_allocated", "allocation_stream": 0},
            {"address": 0x2000, "size": 4096, "state": "active_pending_free", "allocation_stream": 0x10,
             "recorded_streams": [0x20], "record_stream_calls": 1, "pending_fences": 1, "age_ms": 2.5},
            {"address": 0x3000, "size": 8192, "state": "inactive"},
        ]
        lines = report.format_blocks(blocks).splitlines()
        assert len(lines) == 3  # header + the two used blocks; the free one is left out
        assert "0x2000" in lines[1] and "0x20 (1), 1, 2.5 ms" in lines[1]
        assert "0x1000" in lines[2]

    def test_report_cli_reads_a_dump(self, tmp_path):
        dump = {"conf": "audit:warn", "path": "extension", "stats": {"0": STATS},
                "snapshot": {"segments": [], "device_traces": [[]]}}
        path = tmp_path / "dump.json"
        path.write_text(json.dumps(dump))
        result = run_python(["-m", "streamalloc.report", str(path)])
        assert result.returncode == 0, result.stderr
        assert "streamalloc via extension with options: audit:warn" in result.stdout
        assert "record_stream 7 calls" in result.stdout

    def test_report_cli_rejects_other_json(self, tmp_path):
        path = tmp_path / "other.json"
        path.write_text("{\"x\": 1}")
        result = run_python(["-m", "streamalloc.report", str(path)])
        assert result.returncode == 2
        assert "not a streamalloc dump" in result.stderr

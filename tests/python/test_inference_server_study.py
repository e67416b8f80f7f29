"""bench/studies/inference_server.py without a GPU: how an allocator name becomes the server's allocator
and options, and the table of a saved run keeps a settings variant in a column of its own."""

from __future__ import annotations

import json
import subprocess
import sys

from support import REPO

STUDY = REPO / "bench" / "studies" / "inference_server.py"
sys.path.insert(0, str(STUDY.parent))
import inference_server  # noqa: E402


def test_a_streamalloc_variant_runs_streamalloc_with_its_options_after_the_common_ones():
    split = inference_server.split_variant
    assert split("streamalloc[cross_stream_reuse:never;hot_list_mb:8]", "log_level:warn") == (
        "streamalloc", "log_level:warn,cross_stream_reuse:never,hot_list_mb:8")
    assert split("streamalloc[cross_stream_reuse:never]") == ("streamalloc", "cross_stream_reuse:never")
    assert split("streamalloc", "hot_list_mb:8") == ("streamalloc", "hot_list_mb:8")
    assert split("native", "hot_list_mb:8") == ("native", "")  # the options are streamalloc's alone


def test_the_table_of_a_saved_run_has_a_column_per_variant(tmp_path):
    # A line of a stored H200 run, as the server writes it, under three allocator names.
    stored = REPO / "bench/results/2026-12-04-h200-b2072f0/threads/server.json"
    template = json.loads(stored.read_text().splitlines()[0])
    runs = (("native", 1000), ("streamalloc", 1100), ("streamalloc[cross_stream_reuse:never]", 1300))
    lines = [dict(template, allocator=name, requests_per_s=rps, requests_per_s_reps=[rps]) for name, rps in runs]
    saved = tmp_path / "run.json"
    saved.write_text("".join(json.dumps(line) + "\n" for line in lines))
    table = tmp_path / "run.md"
    result = subprocess.run([sys.executable, str(STUDY), "--from-json", str(saved), "--markdown", str(table)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    text = table.read_text()
    assert "| model | threads | native | streamalloc | streamalloc[cross_stream_reuse:never] |" in text
    assert "1,300 (1.30x)" in text

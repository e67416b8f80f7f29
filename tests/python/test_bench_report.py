"""The generated numbers stay in step with the stored results.

docs/benchmarks.md and the README's block between <!-- results:begin --> and <!-- results:end --> are
written by bench/report.py. The page names the stored runs (bench/results/DATE-MACHINE-COMMIT) it was
made from; these tests regenerate from those runs into a temporary folder and compare, so a number
edited by hand, or a generator change committed without regenerating (`make bench-report`), fails.
CPU only: the generator reads JSON and draws PNGs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

REPORT = REPO / "bench" / "report.py"
PAGE = REPO / "docs" / "benchmarks.md"
README = REPO / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
RUN_DIR = re.compile(r"`(bench/results/\d{4}-\d{2}-\d{2}-[A-Za-z0-9]+-[0-9a-f]{7,40})`")


def block(text: str) -> str:
    assert BEGIN in text and END in text, "the README has no generated results block"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def stored_runs() -> list[str]:
    """The run folders the committed page names, in the order they are first named."""
    runs = list(dict.fromkeys(RUN_DIR.findall(PAGE.read_text())))
    assert runs, "docs/benchmarks.md names no stored run (bench/results/...): regenerate with make bench-report"
    return runs


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    (out / "docs").mkdir()
    shutil.copy(README, out / "README.md")
    (out / "README.md").write_text(README.read_text().replace(block(README.read_text()), "stale"))
    args = [sys.executable, str(REPORT)] + [f"--from={REPO / run}" for run in stored_runs()]
    result = subprocess.run(args + [str(out / "docs" / "benchmarks.md")], capture_output=True, text=True,
                            timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_the_readme_block_is_what_the_generator_writes(regenerated):
    assert block((regenerated / "README.md").read_text()) == block(README.read_text()), (
        "README.md's results block differs from bench/report.py's output: run make bench-report")


def test_the_readme_block_has_the_headline_rows(regenerated):
    text = block(README.read_text())
    for row in ("cached alloc+free on one stream", "record_stream", "8 threads", "peak reserved, replayed",
                "GPT-2 training"):
        assert row in text, f"headline row {row!r} missing"
    assert "docs/img/headline.png" in text


def test_the_page_is_what_the_generator_writes(regenerated):
    if not have_matplotlib():
        pytest.skip("matplotlib is not installed: the page's plot section would differ (pip install matplotlib)")
    assert (regenerated / "docs" / "benchmarks.md").read_text() == PAGE.read_text(), (
        "docs/benchmarks.md differs from bench/report.py's output: run make bench-report")
    assert (regenerated / "docs" / "img" / "headline.png").is_file()


def test_a_folder_not_named_as_a_run_is_refused(tmp_path):
    odd = tmp_path / "latest"
    odd.mkdir()
    result = subprocess.run([sys.executable, str(REPORT), f"--from={odd}", str(tmp_path / "out.md")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DATE-MACHINE-COMMIT" in result.stderr
    assert not (tmp_path / "out.md").exists()

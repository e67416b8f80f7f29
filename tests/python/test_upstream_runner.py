"""tests/upstream/run_test_cuda.py on a small test file of our own (no GPU, no PyTorch tests): it runs
only the selected tests, in one pytest process, records each outcome as it finishes (a failure with its
message and the failing frame's locals), reports selected tests the file lacks, writes the table, and
refuses a missing file with a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[1] / "upstream" / "run_test_cuda.py"

FAKE_TEST_FILE = '''
import unittest


class TestCuda(unittest.TestCase):
    def test_memory_stats(self):
        pass

    def test_not_selected(self):
        self.fail("a test outside the selection ran")


class TestMemPool(unittest.TestCase):
    def test_mempool_id(self):
        seen = "the locals of a failing test are kept"
        self.assertEqual(seen, "something else")
'''


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


def test_runs_the_selection_and_writes_the_table(tmp_path):
    test_file = tmp_path / "test_cuda.py"
    test_file.write_text(FAKE_TEST_FILE)
    selection = tmp_path / "selection.txt"
    selection.write_text("# comment\nTestCuda::test_memory_stats\nTestMemPool::test_mempool_id\n"
                         "TestCuda::test_absent  # not in the file\n")
    out = tmp_path / "out"
    result = run(tmp_path, str(test_file), "--out", str(out), "--modes", "native", "--tests", str(selection))
    assert result.returncode == 0, result.stdout + result.stderr  # no streamalloc mode: nothing to compare
    rows = {r["test"]: r["native"] for r in json.loads((out / "table.json").read_text())}
    assert rows == {"TestCuda::test_memory_stats": "passed", "TestMemPool::test_mempool_id": "failed",
                    "TestCuda::test_absent": "not run"}
    report = json.loads((out / "native.json").read_text())
    assert report["selected_but_not_in_file"] == ["TestCuda::test_absent"]
    failures = [json.loads(line) for line in (out / "native.jsonl").read_text().splitlines()
                if json.loads(line)["outcome"] == "failed"]
    assert [f["test"] for f in failures] == ["TestMemPool::test_mempool_id"]
    assert "the locals of a failing test are kept" in failures[0]["locals"]["seen"]
    assert "| `TestCuda::test_memory_stats` | passed |" in (out / "table.md").read_text()


def test_a_missing_test_file_is_a_clear_error(tmp_path):
    result = run(tmp_path, str(tmp_path / "absent.py"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "docs/pytorch.md" in result.stderr


def test_an_unknown_mode_is_refused(tmp_path):
    test_file = tmp_path / "test_cuda.py"
    test_file.write_text(FAKE_TEST_FILE)
    result = run(tmp_path, str(test_file), "--out", str(tmp_path / "out"), "--modes", "native,fast")
    assert result.returncode == 2 and "unknown mode 'fast'" in result.stderr


def test_arguments_after_a_double_dash_go_to_pytest(tmp_path):
    # A collection-only dry run: pytest collects the selection and runs nothing.
    test_file = tmp_path / "test_cuda.py"
    test_file.write_text(FAKE_TEST_FILE)
    selection = tmp_path / "selection.txt"
    selection.write_text("TestCuda::test_memory_stats\nTestMemPool::test_mempool_id\n")
    out = tmp_path / "out"
    result = run(tmp_path, str(test_file), "--out", str(out), "--modes", "native", "--tests", str(selection),
                 "--", "--collect-only")
    assert result.returncode == 0, result.stdout + result.stderr
    log = (out / "native.log").read_text()
    assert "--collect-only" in log.splitlines()[0]
    assert "2/3 tests collected (1 deselected)" in log
    rows = {r["test"]: r["native"] for r in json.loads((out / "table.json").read_text())}
    assert set(rows.values()) == {"not run"}

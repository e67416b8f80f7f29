#!/usr/bin/env python3
"""Run the allocator tests of PyTorch's own test/test_cuda.py (the list in allocator_tests.txt) under
PyTorch's allocator and under streamalloc, each mode in ONE pytest process (as a test suite runs them:
every test after the ones before it), and write a per-test table.

    python3 tests/upstream/run_test_cuda.py PATH/TO/test_cuda.py --out DIR [--modes native,streamalloc,...]

Nothing is fetched: PATH/TO/test_cuda.py is a copy of test/test_cuda.py from the pytorch repository at a
commit that runs on the installed torch (docs/pytorch.md, "PyTorch's own allocator tests"). Modes:
  native                  PyTorch's allocator
  streamalloc             streamalloc's extension path for the whole process
  streamalloc-expandable  the same with STREAMALLOC_CONF=expandable_segments:true
Writes DIR/MODE.log (pytest's output), DIR/MODE.jsonl (each test's outcome as it finished; a failure's
message and the failing frame's locals), DIR/MODE.json (what ran), DIR/table.md and DIR/table.json.
Exits 0 when every test that passes under native passes under each streamalloc mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODES = {
    "native": {"STREAMALLOC_UPSTREAM_MODE": "native"},
    "streamalloc": {"STREAMALLOC_UPSTREAM_MODE": "streamalloc", "STREAMALLOC_CONF": ""},
    "streamalloc-expandable": {"STREAMALLOC_UPSTREAM_MODE": "streamalloc",
                               "STREAMALLOC_CONF": "expandable_segments:true"},
}


def selection(path: Path) -> list[str]:
    tests = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            tests.append(line)
    return tests


def run_mode(mode: str, test_file: Path, tests_file: Path, out: Path, timeout: float, extra: list[str]) -> None:
    env = dict(os.environ)
    for key in ("STREAMALLOC_ENABLE", "STREAMALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(key, None)  # each mode says what it wants
    env.update(MODES[mode])
    env["STREAMALLOC_UPSTREAM_REPORT"] = str(out / f"{mode}.json")
    env["STREAMALLOC_UPSTREAM_TESTS"] = str(tests_file)
    env["STREAMALLOC_UPSTREAM_PROGRESS"] = str(out / f"{mode}.jsonl")
    (out / f"{mode}.jsonl").unlink(missing_ok=True)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), str(REPO / "torch_plugin"), env.get("PYTHONPATH", ""))
                                        if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The selection is the plugin's (a name the file lacks is reported, not an error that stops the run).
    argv = [sys.executable, "-m", "pytest", "-p", "streamalloc_upstream_plugin", "-p", "no:cacheprovider",
            "-q", "-rfEs", "--tb=short", *extra,
            str(test_file)]
    with open(out / f"{mode}.log", "w") as log:
        log.write(" ".join(argv) + "\n")
        log.flush()
        try:
            subprocess.run(argv, env=env, cwd=test_file.parent, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                           check=False)
        except subprocess.TimeoutExpired:
            log.write(f"\nrun_test_cuda.py: {mode} killed after {timeout:.0f} s\n")


def outcomes(progress: Path) -> dict[str, str]:
    """Each test's outcome from the plugin's progress file: "passed", "failed", "error" (setup or
    teardown), "skipped", "xfail"/"xpass"; a failure in teardown after a passed call counts as error."""
    result: dict[str, str] = {}
    if not progress.exists():
        return result
    for line in progress.read_text().splitlines():
        entry = json.loads(line)
        previous = result.get(entry["test"])
        if previous in ("failed", "error"):
            continue
        result[entry["test"]] = entry["outcome"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("test_file", type=Path, help="a copy of pytorch's test/test_cuda.py")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", default="native,streamalloc,streamalloc-expandable")
    parser.add_argument("--tests", type=Path, default=HERE / "allocator_tests.txt")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for each mode's pytest process")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (e.g. -- --collect-only)")
    # Everything after "--" goes to pytest as it is: argparse would take it for this script's own
    # arguments once the positional test file has been matched.
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.pytest_args = [*args.pytest_args, *extra]
    test_file = args.test_file.resolve()
    if not test_file.is_file():
        parser.error(f"{test_file} does not exist: obtain test/test_cuda.py as docs/pytorch.md says")
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}; modes: {', '.join(MODES)}")
    tests = selection(args.tests)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for mode in modes:
        run_mode(mode, test_file, args.tests.resolve(), args.out, args.timeout, args.pytest_args)
        results[mode] = outcomes(args.out / f"{mode}.jsonl")

    rows = []
    for test in tests:
        rows.append({"test": test, **{m: results[m].get(test, "not run") for m in modes}})
    (args.out / "table.json").write_text(json.dumps(rows, indent=1))
    lines = ["| test | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    lines += [f"| `{r['test']}` | " + " | ".join(r[m] for m in modes) + " |" for r in rows]
    totals = {m: sum(1 for r in rows if r[m] == "passed") for m in modes}
    lines.append("| **passed** | " + " | ".join(str(totals[m]) for m in modes) + " |")
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    regressions = []
    if "native" in modes:
        for r in rows:
            for m in modes:
                if m != "native" and r["native"] == "passed" and r[m] != "passed":
                    regressions.append(f"{r['test']} under {m}: {r[m]}")
    for line in regressions:
        print("passes under native but not", line)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""How often each debug option catches the prefetch pipeline's bugs: every pipeline example under each configuration,
run --runs times, one process each.

    python3 bench/studies/detection_rate.py [--runs 8] [--json OUT] [--markdown OUT] [--require-gpu]

A race shows or hides with timing, so one green test run says little about "every run". Each row here
runs one example (examples/seed_*.py) under one configuration and counts the runs in which the bug
showed the way that option promises: NaN steps for poisoning, missing-wait warnings for check_sync,
wrong-but-finite steps under PyTorch's own allocator. For the fixed pipelines it counts false alarms
instead: any wrong step, NaN step or warning. Each run's summary is the example's last JSON line.

torch_plugin/ must be on PYTHONPATH and STREAMALLOC_LIBRARY_DIR must point at the built libraries when
the package is not installed (`make detection-rate` sets both). Without torch or a CUDA device it says
"skipped" and exits 0 (1 with --require-gpu).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"

# (example, conf or None for native, extra arguments, what counts as "showed", what it is meant to show)
# The broken examples run 300 steps behind a ~10 ms spin, as their tests do, so that the late read
# comes after the free (and its poison) on every run.
SLOW = ["--steps", "300", "--delay-cycles", "20000000"]
ROWS = [
    ("seed_broken_pipeline", None, SLOW, "wrong", "missing wait under PyTorch's allocator: wrong but finite"),
    ("seed_broken_pipeline", "poison:both", SLOW, "nan", "missing wait, poisoned: NaN"),
    ("seed_broken_pipeline", "check_sync:1", ["--steps", "200"], "warnings", "missing wait: named by check_sync"),
    ("seed_missing_record_stream", None, SLOW, "wrong", "missing record_stream under PyTorch's allocator"),
    ("seed_missing_record_stream", "poison:free,quarantine_mb:64", SLOW, "nan",
     "missing record_stream, poisoned: NaN"),
    ("seed_missing_record_stream", "check_sync:1", ["--steps", "200"], "silent",
     "missing record_stream has its wait: check_sync must stay silent"),
    ("seed_fixed_pipeline", "poison:both,check_sync:1", ["--steps", "2000"], "silent", "fixed: no false alarm"),
    ("seed_double_buffered", "poison:both,check_sync:1", ["--steps", "2000"], "silent",
     "double-buffered: no false alarm"),
]


def run_once(example: str, conf: str | None, extra: list[str], timeout: float) -> dict:
    command = [sys.executable] + (["-m", "streamalloc", "--conf", conf] if conf is not None else [])
    command += [str(EXAMPLES / f"{example}.py"), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        return {"error": f"exit code {done.returncode}: " + " | ".join(tail)}
    summary = json.loads(lines[-1])
    return {"wrong": summary["mismatched_steps"], "nan": summary["nan_steps"], "steps": summary["steps"],
            "warnings": summary.get("stream_stats", {}).get("missing_wait_warnings", 0),
            "allocator": summary["allocator"]}


def showed(run: dict, expect: str) -> bool:
    """Whether the run shows what the row expects ("silent": no wrong step, no NaN, no warning)."""
    if expect == "wrong":
        return run["wrong"] > 0 and run["nan"] == 0
    if expect == "nan":
        return run["nan"] > 0
    if expect == "warnings":
        return run["warnings"] > 0
    return run["wrong"] == 0 and run["nan"] == 0 and run["warnings"] == 0


def markdown(report: dict) -> str:
    lines = [f"detection_rate: {report['runs']} runs per row on {report['gpu']}, torch {report['torch']}, one "
             "process per run. \"Showed\" counts the runs that showed what the row expects.", "",
             "| example | configuration | expected | showed | wrong steps (min-max) | NaN steps (min-max) | "
             "missing-wait warnings (min-max) |", "|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        good = [r for r in row["runs"] if "error" not in r]

        def spread(key: str) -> str:
            values = [r[key] for r in good]
            return f"{min(values)}-{max(values)}" if values else "n/a"

        lines.append(f"| {row['example']} | {row['conf'] or 'native'} | {row['meaning']} | "
                     f"**{row['showed']}/{len(row['runs'])}** | {spread('wrong')} | {spread('nan')} | "
                     f"{spread('warnings')} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=8, help="runs per row (default 8)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per run before it counts as failed")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 instead of 0 when no GPU is found")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    try:
        import torch
    except ImportError as error:
        print(f"detection_rate: skipped: needs a CUDA GPU and torch (import torch failed: {error})")
        return 1 if args.require_gpu else 0
    if not torch.cuda.is_available():
        print("detection_rate: skipped: needs a CUDA GPU and torch (torch.cuda.is_available() is False)")
        return 1 if args.require_gpu else 0

    started = time.perf_counter()
    report = {"kind": "detection_rate", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "runs": args.runs, "rows": []}
    for example, conf, extra, expect, meaning in ROWS:
        runs = [run_once(example, conf, extra, args.timeout) for _ in range(args.runs)]
        hits = sum(1 for r in runs if "error" not in r and showed(r, expect))
        report["rows"].append({"example": example, "conf": conf, "args": extra, "expect": expect,
                               "meaning": meaning, "showed": hits, "runs": runs})
        errors = [r["error"] for r in runs if "error" in r]
        print(f"{example:<28} {conf or 'native':<30} {meaning:<62} showed in {hits}/{len(runs)}"
              + (f"; {len(errors)} failed: {errors[0]}" if errors else ""), flush=True)
    report["total_seconds"] = time.perf_counter() - started
    print(f"total {report['total_seconds']:.0f} s")
    for path, text in ((args.json, json.dumps(report, indent=2) + "\n"), (args.markdown, markdown(report))):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
    return 1 if any("error" in r for row in report["rows"] for r in row["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())

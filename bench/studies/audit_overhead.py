#!/usr/bin/env python3
"""What streamalloc's diagnostic modes cost on the copy-overlap training loop (examples/train_with_prefetcher.py).

    python3 bench/studies/audit_overhead.py [--reps 5] [--steps 1000] [--warmup-steps 100] [--samples 8192]
        [--trace] [--config NAME ...] [--cudnn-benchmark] [--json OUT] [--markdown OUT] [--require-gpu]

Every configuration runs the training loop in its own process, since PyTorch picks its CUDA allocator
once per process: `native` under plain `python` (PyTorch's own allocator), the others under
`python -m streamalloc --conf CONF`. The loop times its own steady state (the steps after
--warmup-steps, between two torch.cuda.synchronize() calls) and prints steps/s in its JSON summary;
process start, CUDA init and the first steps are not in the figure. The configurations are interleaved
across --reps repetitions (the order rotates from one repetition to the next) so that drift of the
machine spreads over all of them; each gets the median of its repetitions, and its ratio to streamalloc
with default options and to native. One untimed run first warms the file cache. On an H200 a run takes
about 12.5 s (3 s of them timed; the rest is importing torch, CUDA and cuDNN initialisation and exit),
so the default 6 configurations x 5 repetitions take about 6.5 minutes; --trace adds audit:trace (every
allocation event logged to a temp file), another minute; --reps 3 takes about 4 minutes.

The budget: audit:warn costs at most 5% of the throughput of streamalloc's defaults. The losses of
every run are also compared with native's: in the default deterministic mode the allocator, poisoning
included, must not change a bit.

torch_plugin/ must be on PYTHONPATH (or the package installed) and STREAMALLOC_LIBRARY_DIR must point
at the built libraries when it is not installed (`make audit-overhead` sets both). Without torch or a
CUDA device the script says "skipped" and exits 0 (1 with --require-gpu).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "train_with_prefetcher.py"
AUDIT_WARN_BUDGET = 0.05  # the issue: audit:warn costs <= 5% throughput

# (name, STREAMALLOC_CONF); None = PyTorch's native allocator. "{audit_file}" is a fresh temp file per run.
# audit:trace runs only with --trace (or --config audit:trace).
CONFIGS = [
    ("native", None),
    ("default", ""),
    ("audit:warn", "audit:warn"),
    ("audit:trace", "audit:trace,audit_file:{audit_file}"),
    ("poison:both", "poison:both"),
    ("check_sync:1", "check_sync:1"),
    ("quarantine_mb:256", "quarantine_mb:256"),
]
CONFIG_NAMES = [name for name, _ in CONFIGS]
DESCRIPTIONS = {
    "native": "PyTorch's own caching allocator (no streamalloc)",
    "default": "streamalloc, default options",
    "audit:warn": "warnings on misuse; nothing to say on this (correct) loop",
    "audit:trace": "every allocation event logged to a file",
    "poison:both": "0xFF memsets on the GPU at every allocation and every free",
    "check_sync:1": "happens-before check, fed by PyTorch's GPU trace callbacks",
    "quarantine_mb:256": "256 MB of freed blocks held back (FIFO) before reuse",
}


def skip(reason: str, args: argparse.Namespace, torch_version: str | None) -> int:
    print(f"audit_overhead: skipped: needs a CUDA GPU and torch ({reason})")
    # Overwrite the outputs so that nothing downstream picks up a stale result from an earlier run.
    if args.json:
        write_text(args.json, json.dumps({"kind": "audit_overhead", "skipped": reason, "torch": torch_version},
                                         indent=2) + "\n")
    if args.markdown:
        write_text(args.markdown, f"audit_overhead: skipped: needs a CUDA GPU and torch ({reason})\n")
    return 1 if args.require_gpu else 0


def write_text(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def train_args(args: argparse.Namespace, steps: int) -> list[str]:
    extra = ["--steps", str(steps), "--warmup-steps", str(min(args.warmup_steps, steps - 1)),
             "--samples", str(args.samples), "--batch-size", str(args.batch_size)]
    return extra + (["--benchmark"] if args.cudnn_benchmark else [])


def run_one(name: str, conf: str | None, args: argparse.Namespace, steps: int) -> dict:
    """One process of the training loop; its JSON summary, timing and any error."""
    audit_file = None
    if conf is not None and "{audit_file}" in conf:
        fd, audit_file = tempfile.mkstemp(prefix="streamalloc-audit-", suffix=".log")
        os.close(fd)
        conf = conf.format(audit_file=audit_file)
    if conf is None:
        command = [sys.executable, str(TRAIN)]
    else:
        command = [sys.executable, "-m", "streamalloc", "--conf", conf, str(TRAIN)]
    command += train_args(args, steps)
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # every allocator with its defaults
    env.pop("STREAMALLOC_CONF", None)  # --conf says it all
    env["PYTHONUNBUFFERED"] = "1"
    started = time.perf_counter()
    run = {"config": name, "conf": conf}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        run["error"] = f"timed out after {args.timeout} s"
        return run
    finally:
        if audit_file is not None:
            try:
                run["audit_file_bytes"] = os.path.getsize(audit_file)
                os.unlink(audit_file)
            except OSError:
                pass
    run["wall_s"] = time.perf_counter() - started
    # Anything the allocator said on stderr (audit:warn, check_sync): a correct loop should get nothing.
    run["stderr_lines"] = len([line for line in done.stderr.splitlines() if "[streamalloc" in line])
    summaries = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not summaries:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-5:]
        run["error"] = f"exit code {done.returncode}: " + " | ".join(tail)
        return run
    summary = json.loads(summaries[-1])
    for key in ("allocator", "steps", "timed_steps", "timed_seconds", "steps_per_s", "samples_per_s",
                "final_loss", "max_memory_allocated"):
        run[key] = summary.get(key)
    run["losses"] = summary.get("losses")
    if summary.get("steps_per_s") is None:
        run["error"] = "the training script printed no steps_per_s (too few steps after the warmup?)"
    elif (conf is None) != (summary.get("allocator") == "native"):
        run["error"] = f"ran on the wrong allocator: {summary.get('allocator')}"
    return run


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def paired_interval(ratios: list[float], resamples: int = 10000) -> tuple[float, float, float] | None:
    """Geometric mean of the per-repetition ratios and its 95% bootstrap interval (seeded: the same
    runs give the same interval). The spread between processes is larger than the cost being measured,
    so the interval says what the runs can and cannot rule out."""
    if len(ratios) < 2:
        return None
    logs = [math.log(r) for r in ratios]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return math.exp(statistics.fmean(logs)), math.exp(low), math.exp(high)


def summarize(runs: dict[str, list[dict]], deterministic: bool) -> dict[str, dict]:
    good = {name: [r for r in rs if "error" not in r] for name, rs in runs.items()}
    medians = {name: median_or_none([r["steps_per_s"] for r in rs]) for name, rs in good.items()}
    native_losses = next((r["losses"] for r in good.get("native", [])), None)
    result = {}
    for name, rs in runs.items():
        speeds = [r["steps_per_s"] for r in good[name]]
        med = medians[name]
        entry = {
            "conf": next((r["conf"] for r in rs), None),
            "description": DESCRIPTIONS.get(name, ""),
            "runs": len(rs),
            "errors": [r["error"] for r in rs if "error" in r],
            "steps_per_s": speeds,
            "median_steps_per_s": med,
            "min_steps_per_s": min(speeds) if speeds else None,
            "max_steps_per_s": max(speeds) if speeds else None,
            # run-to-run spread (stdev / mean): differences between configurations below it are noise
            "cv": statistics.stdev(speeds) / statistics.mean(speeds) if len(speeds) > 1 else None,
            "median_samples_per_s": median_or_none([r["samples_per_s"] for r in good[name]]),
            "allocator": next((r.get("allocator") for r in good[name]), None),
            "stderr_lines": max((r.get("stderr_lines", 0) for r in good[name]), default=0),
        }
        if any("audit_file_bytes" in r for r in rs):
            entry["audit_file_bytes"] = median_or_none([r["audit_file_bytes"] for r in rs if "audit_file_bytes" in r])
        for base in ("default", "native"):
            ratio = med / medians[base] if med and medians.get(base) else None
            entry[f"ratio_to_{base}"] = ratio
            # The same ratio taken within each repetition (neighbouring runs), then the median.
            pairs = [a["steps_per_s"] / b["steps_per_s"] for a, b in zip(rs, runs.get(base, []))
                     if "error" not in a and "error" not in b]
            entry[f"paired_ratio_to_{base}"] = median_or_none(pairs)
            interval = paired_interval(pairs)
            if interval is not None:
                entry[f"paired_geomean_to_{base}"], entry[f"paired_ci95_to_{base}"] = interval[0], list(interval[1:])
        if deterministic and native_losses is not None and good[name]:
            entry["losses_match_native"] = all(r["losses"] == native_losses for r in good[name])
        result[name] = entry
    return result


def fmt(value, spec: str, missing: str = "n/a") -> str:
    return format(value, spec) if value is not None else missing


def table_rows(summary: dict[str, dict]) -> list[list[str]]:
    rows = []
    for name, s in summary.items():
        spread = (f"{fmt(s['min_steps_per_s'], '.1f')}-{fmt(s['max_steps_per_s'], '.1f')}"
                  if s["min_steps_per_s"] is not None else "n/a")
        cost = s.get("ratio_to_default")
        rows.append([name, fmt(s["median_steps_per_s"], ".1f"), spread, fmt(s.get("ratio_to_default"), ".3f"),
                     fmt(s.get("ratio_to_native"), ".3f"),
                     f"{(1 - cost) * 100:+.1f}%" if cost is not None else "n/a"])
    return rows


HEADERS = ["configuration", "steps/s (median)", "min-max", "vs default", "vs native", "cost vs default"]


def print_table(summary: dict[str, dict]) -> None:
    rows = table_rows(summary)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(HEADERS, widths))))
    for row in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))


def verdict(summary: dict[str, dict]) -> dict | None:
    warn = summary.get("audit:warn", {}).get("ratio_to_default")
    if warn is None:
        return None
    cost = 1 - warn
    entry = summary["audit:warn"]
    result = {"audit_warn_cost": cost, "budget": AUDIT_WARN_BUDGET, "met": cost <= AUDIT_WARN_BUDGET,
              "paired_audit_warn_cost": (1 - entry["paired_ratio_to_default"])
              if entry.get("paired_ratio_to_default") is not None else None}
    if entry.get("paired_geomean_to_default") is not None:
        low, high = entry["paired_ci95_to_default"]
        # A cost interval is the ratio interval turned around: the lowest ratio is the highest cost.
        result["paired_geomean_cost"] = 1 - entry["paired_geomean_to_default"]
        result["paired_cost_ci95"] = [1 - high, 1 - low]
    return result


def verdict_text(v: dict, cv: float | None) -> str:
    text = (f"`audit:warn` costs {v['audit_warn_cost'] * 100:.1f}% of the default's throughput by medians "
            f"(budget {v['budget'] * 100:.0f}%): {'met' if v['met'] else 'NOT met'}")
    if v.get("paired_geomean_cost") is not None:
        low, high = v["paired_cost_ci95"]
        text += (f"; within each repetition: {v['paired_geomean_cost'] * 100:.1f}% "
                 f"(geometric mean, 95% bootstrap interval {low * 100:.1f}% to {high * 100:.1f}%)")
    if cv is not None:
        text += f"; run-to-run spread (stdev/mean) of the default: {cv * 100:.1f}%"
    return text + "."


def markdown(report: dict) -> str:
    s = report["summary"]
    lines = [
        (f"audit_overhead: examples/train_with_prefetcher.py on {report['gpu']}, torch {report['torch']}, "
         f"{report['steps']} steps per run ({report['warmup_steps']} untimed), batch {report['batch_size']}, "
         f"{'cudnn.benchmark' if report['cudnn_benchmark'] else 'deterministic'}; median of {report['reps']} "
         "interleaved runs, one process each. Cost = 1 - (steps/s) / (steps/s of streamalloc's defaults)."),
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for name, row in zip(s, table_rows(s)):
        row[0] = f"`{name}`" if name not in ("native", "default") else name
        lines.append("| " + " | ".join(row) + " |")
    v = report.get("verdict")
    if v is not None:
        lines += ["", verdict_text(v, s.get("default", {}).get("cv"))]
    mismatched = [name for name, e in s.items() if e.get("losses_match_native") is False]
    if mismatched:
        lines += ["", "Losses differ from native's under: " + ", ".join(mismatched)]
    errors = {name: e["errors"] for name, e in s.items() if e["errors"]}
    if errors:
        lines += ["", "Failed runs: " + "; ".join(f"{n}: {len(e)} ({e[0]})" for n, e in errors.items())]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5, help="repetitions of every configuration (default 5)")
    parser.add_argument("--steps", type=int, default=1000, help="training steps per run (default 1000)")
    parser.add_argument("--warmup-steps", type=int, default=100, help="steps of each run left untimed (default 100)")
    parser.add_argument("--samples", type=int, default=8192, help="synthetic data set size (default 8192)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--config", action="append", choices=CONFIG_NAMES, metavar="NAME",
                        help="run only these configurations (repeatable; 'default' and 'native' are the "
                             f"baselines of the ratios): {', '.join(CONFIG_NAMES)}")
    parser.add_argument("--trace", action="store_true",
                        help="also run audit:trace with audit_file in a temp file (off by default: time)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="train with cudnn.benchmark (autotuned) instead of deterministic algorithms")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run before it counts as failed")
    parser.add_argument("--json", default=None, help="write every run and the summary as JSON")
    parser.add_argument("--markdown", default=None, help="write the summary as a markdown table")
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 instead of 0 when no GPU is found")
    args = parser.parse_args()
    if args.reps < 1 or args.steps < 2 or args.warmup_steps < 0:
        parser.error("--reps must be >= 1, --steps >= 2, --warmup-steps >= 0")
    if args.warmup_steps >= args.steps:
        parser.error("--warmup-steps must be below --steps")

    try:
        import torch
    except ImportError as error:
        return skip(f"import torch failed: {error}", args, None)
    if not torch.cuda.is_available():
        return skip("torch.cuda.is_available() is False", args, torch.__version__)
    try:
        from streamalloc import _native
    except ImportError as error:
        print(f"audit_overhead: cannot import streamalloc ({error}); put torch_plugin/ on PYTHONPATH "
              "or install it", file=sys.stderr)
        return 1
    if _native.find_c_library() is None and _native.find_extension() is None:
        print(f"audit_overhead: {_native.not_found_message('libstreamalloc.so')}", file=sys.stderr)
        return 1

    if args.config:
        selected = [(n, c) for n, c in CONFIGS if n in args.config]
    else:
        selected = [(n, c) for n, c in CONFIGS if n != "audit:trace" or args.trace]
    gpu = torch.cuda.get_device_name(0)
    print(f"audit_overhead: {TRAIN.relative_to(REPO)} on {gpu}, torch {torch.__version__}: "
          f"{len(selected)} configurations x {args.reps} reps, {args.steps} steps per run "
          f"({args.warmup_steps} untimed)", flush=True)

    warm = run_one("warm-up", None, args, min(args.steps, args.warmup_steps + 20))
    if "error" in warm:
        print(f"audit_overhead: the warm-up run failed: {warm['error']}", file=sys.stderr)
        return 1
    started = time.perf_counter()
    runs: dict[str, list[dict]] = {name: [] for name, _ in selected}
    for rep in range(args.reps):
        shift = rep % len(selected)
        for name, conf in selected[shift:] + selected[:shift]:  # rotate the order every repetition
            run = run_one(name, conf, args, args.steps)
            run["rep"] = rep
            runs[name].append(run)
            result = (f"{run['steps_per_s']:8.1f} steps/s over {run['timed_seconds']:.2f} s"
                      if "error" not in run else f"FAILED: {run['error']}")
            print(f"  rep {rep + 1}/{args.reps}  {name:<18} {result}  (process {run.get('wall_s', 0):.1f} s)",
                  flush=True)
    # The per-rep lists in the interleaved order, so that pairs of configurations line up by repetition.
    runs = {name: sorted(rs, key=lambda r: r["rep"]) for name, rs in runs.items()}
    deterministic = not args.cudnn_benchmark
    summary = summarize(runs, deterministic)
    report = {
        "kind": "audit_overhead", "gpu": gpu, "torch": torch.__version__, "script": str(TRAIN.relative_to(REPO)),
        "reps": args.reps, "steps": args.steps, "warmup_steps": args.warmup_steps, "samples": args.samples,
        "batch_size": args.batch_size, "cudnn_benchmark": args.cudnn_benchmark,
        "total_seconds": time.perf_counter() - started, "summary": summary, "verdict": verdict(summary),
        "runs": {name: [{k: v for k, v in r.items() if k != "losses"} for r in rs] for name, rs in runs.items()},
    }

    print()
    print_table(summary)
    v = report["verdict"]
    if v is not None:
        print("\n" + verdict_text(v, summary.get("default", {}).get("cv")).replace("`", ""))
    for name, s in summary.items():
        if s.get("losses_match_native") is False:
            print(f"warning: {name}: the losses differ from native's (the loop is deterministic)")
        if s["stderr_lines"]:
            print(f"note: {name}: streamalloc wrote {s['stderr_lines']} line(s) to stderr in a run")
    print(f"total {report['total_seconds']:.0f} s")
    if args.json:
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    if args.markdown:
        write_text(args.markdown, markdown(report))
    return 1 if any(s["errors"] for s in summary.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

"""torch.compile(mode="reduce-overhead") inference under PyTorch's allocator and under streamalloc.

How to run (a CUDA machine, from the repository root, after building; PYTHONPATH and
STREAMALLOC_LIBRARY_DIR as for the Python tests):

    STREAMALLOC_LIBRARY_DIR=$PWD/build/lib PYTHONPATH=$PWD/torch_plugin \\
        python3 bench/studies/graphs_bench.py [--quick] [--reps 5] [--json results.json] [--markdown table.md]

Each repetition is a separate process, alternating between `python bench/studies/graphs_bench.py --worker`
(PyTorch's allocator) and `python -m streamalloc bench/studies/graphs_bench.py --worker` (streamalloc through
the launcher). A worker compiles a small transformer block (fixed shape, dynamic=False), runs N
warm-up steps, then M timed steps, each beginning with torch.compiler.cudagraph_mark_step_begin().
It reports the mean step time of the timed loop (one synchronize at its end), the median latency of
steps synchronised one by one, and the peak torch.cuda.max_memory_reserved().

The report: per allocator, the median over repetitions of each number, the streamalloc/native ratio,
the GPU (torch.cuda.get_device_name()) and the torch version; as JSON (stdout's last line, and
--json) and as a markdown table (stdout, and --markdown). Timings are measured, not asserted: the
script fails only when a worker fails.

--quick: 2 repetitions per allocator, 20 warm-up and 100 timed steps (default: 5, 50 and 1000).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


# ---- worker: one process, one allocator ----

def worker(args: argparse.Namespace) -> None:
    import torch
    from torch import nn
    from transformer_block import Block

    d, heads, ff = args.d_model, args.heads, 4 * args.d_model


    torch.manual_seed(0)
    model = nn.Sequential(*[Block(d, heads, ff) for _ in range(args.layers)]).cuda().eval().to(torch.bfloat16)
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    x = torch.randn(args.batch, args.seq, d, device="cuda", dtype=torch.bfloat16)

    compile_start = time.perf_counter()
    with torch.no_grad():
        for _ in range(args.warmup):
            torch.compiler.cudagraph_mark_step_begin()
            compiled(x)
        torch.cuda.synchronize()
        warmup_s = time.perf_counter() - compile_start

        start = time.perf_counter()
        for _ in range(args.steps):
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(x)
        torch.cuda.synchronize()
        loop_s = time.perf_counter() - start

        latencies = []
        for _ in range(min(args.steps, 200)):
            t0 = time.perf_counter()
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(x)
            torch.cuda.synchronize()
            latencies.append(time.perf_counter() - t0)
    checksum = float(out.float().sum())

    try:
        peak_reserved = torch.cuda.max_memory_reserved()
        reserved = torch.cuda.memory_reserved()
    except RuntimeError:  # an allocator that serves no memory statistics
        peak_reserved = reserved = None
    try:
        import streamalloc

        allocator = streamalloc.active_path() if streamalloc.is_enabled() else "native"
        allocator = "native" if allocator == "native" else f"streamalloc ({allocator})"
    except ImportError:
        allocator = "native"
    from torch._dynamo.utils import counters

    print(json.dumps({
        "allocator": allocator,
        "step_us": loop_s / args.steps * 1e6,
        "sync_step_median_us": statistics.median(latencies) * 1e6,
        "warmup_s": warmup_s,
        "peak_reserved": peak_reserved,
        "reserved": reserved,
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "checksum": checksum,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }))


# ---- driver ----

def run_worker(kind: str, args: argparse.Namespace) -> dict:
    worker_args = [str(HERE), "--worker", "--warmup", str(args.warmup), "--steps", str(args.steps),
                   "--batch", str(args.batch), "--seq", str(args.seq), "--d-model", str(args.d_model),
                   "--heads", str(args.heads), "--layers", str(args.layers)]
    argv = [sys.executable, *(["-m", "streamalloc"] if kind == "streamalloc" else []), *worker_args]
    env = dict(os.environ)
    plugin = str(REPO / "torch_plugin")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (plugin, env.get("PYTHONPATH", "")) if p)
    if kind == "streamalloc" and not env.get("STREAMALLOC_LIBRARY_DIR"):
        env["STREAMALLOC_LIBRARY_DIR"] = str(REPO / "build" / "lib")
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{' '.join(argv)} exited {result.returncode}\n--- stdout\n{result.stdout[-4000:]}"
                         f"\n--- stderr\n{result.stderr[-8000:]}")
    return json.loads(lines[-1])


def median_of(runs: list[dict], key: str):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def ratio(a, b):
    return a / b if a is not None and b else None


def markdown(report: dict) -> str:
    n, s = report["native"], report["streamalloc"]
    fmt = lambda v, unit="": "n/a" if v is None else f"{v:,.1f}{unit}"  # noqa: E731
    mib = lambda v: None if v is None else v / (1 << 20)  # noqa: E731
    r = {k: None if v is None else f"{v:.3f}" for k, v in report["ratio"].items()}
    rows = [
        "| | native | streamalloc | streamalloc / native |",
        "|---|---:|---:|---:|",
        f"| step time, median of reps (µs) | {fmt(n['step_us'])} | {fmt(s['step_us'])} | {r['step_us'] or 'n/a'} |",
        f"| synchronised step, median (µs) | {fmt(n['sync_step_median_us'])} | {fmt(s['sync_step_median_us'])} "
        f"| {r['sync_step_median_us'] or 'n/a'} |",
        f"| peak memory_reserved (MiB) | {fmt(mib(n['peak_reserved']))} | {fmt(mib(s['peak_reserved']))} "
        f"| {r['peak_reserved'] or 'n/a'} |",
    ]
    cfg = report["config"]
    head = (f"reduce-overhead inference, {cfg['layers']} blocks, d_model {cfg['d_model']}, batch {cfg['batch']}, "
            f"seq {cfg['seq']}, bf16; {cfg['reps']} reps x {cfg['steps']} steps after {cfg['warmup']} warm-up; "
            f"{report['device']}, torch {report['torch']}")
    return head + "\n\n" + "\n".join(rows) + "\n"


def driver(args: argparse.Namespace) -> None:
    runs: dict[str, list[dict]] = {"native": [], "streamalloc": []}
    for rep in range(args.reps):
        order = ("native", "streamalloc") if rep % 2 == 0 else ("streamalloc", "native")
        for kind in order:
            out = run_worker(kind, args)
            runs[kind].append(out)
            print(f"rep {rep + 1}/{args.reps} {kind}: step {out['step_us']:.1f} us, "
                  f"peak reserved {out['peak_reserved']}", file=sys.stderr)
    keys = ("step_us", "sync_step_median_us", "peak_reserved")
    summary = {kind: {key: median_of(rs, key) for key in keys} for kind, rs in runs.items()}
    for kind, rs in runs.items():
        summary[kind]["cudagraph_skips"] = max(r["cudagraph_skips"] for r in rs)
        summary[kind]["allocator"] = rs[0]["allocator"]
    report = {
        **summary,
        "ratio": {key: ratio(summary["streamalloc"][key], summary["native"][key]) for key in keys},
        "device": runs["native"][0]["device"],
        "torch": runs["native"][0]["torch"],
        "config": {k: getattr(args, k) for k in ("reps", "warmup", "steps", "batch", "seq", "d_model", "heads",
                                                   "layers", "quick")},
        "runs": runs,
    }
    table = markdown(report)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="2 reps, 20 warm-up and 100 timed steps")
    parser.add_argument("--reps", type=int, default=None, help="processes per allocator (default 5)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 50)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 1000)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per worker process")
    parser.add_argument("--json", help="also write the JSON report here")
    parser.add_argument("--markdown", help="also write the markdown table here")
    args = parser.parse_args()
    defaults = (2, 20, 100) if args.quick else (5, 50, 1000)
    for key, default in zip(("reps", "warmup", "steps"), defaults):
        if getattr(args, key) is None:
            setattr(args, key, default)
    if args.worker:
        worker(args)
    else:
        driver(args)


if __name__ == "__main__":
    main()

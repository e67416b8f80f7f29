#!/usr/bin/env python3
"""What recording PyTorch's allocation history costs per torch.empty + free, under PyTorch's native
allocator and under streamalloc, each in its own process (PyTorch picks its CUDA allocator once).

    python3 bench/studies/history_cost.py [--iters 20000] [--repeats 7] [--size 4096] [--json OUT]

Modes, each timed as ns per pair (median of --repeats blocks of --iters pairs, after a warm-up block):
  off          no history (the hot path's cost of having the feature: compare with a build without it)
  state        _record_memory_history(context="state", stacks="python"): live blocks keep their stack
  all_python   context="all", stacks="python": every alloc and free gathers a Python stack
  all          context="all", stacks="all": Python and C++ stacks (PyTorch's default)
streamalloc is enabled with `import streamalloc; streamalloc.enable()` (torch_plugin/ on PYTHONPATH and
STREAMALLOC_LIBRARY_DIR at the build's lib/ when the package is not installed). Without a GPU the
script says so and exits 0.
"""

import argparse
import json
import statistics
import subprocess
import sys

MODES = {
    "off": None,
    "state": dict(context="state", stacks="python"),
    "all_python": dict(context="all", stacks="python"),
    "all": dict(context="all", stacks="all"),
}

CHILD = r"""
import json, sys, time
allocator, mode, iters, repeats, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if allocator == "streamalloc":
    import streamalloc
    streamalloc.enable()
import torch
torch.cuda.init()
kwargs = json.loads(sys.argv[6])
if kwargs is not None:
    torch.cuda.memory._record_memory_history(max_entries=100_000, **kwargs)

def block():
    start = time.perf_counter_ns()
    for _ in range(iters):
        torch.empty(size, dtype=torch.uint8, device="cuda")
    return (time.perf_counter_ns() - start) / iters

block()  # warm-up: the cache holds the block
samples = [block() for _ in range(repeats)]
print(json.dumps({"samples": samples}))
"""


def run(allocator: str, mode: str, args) -> dict:
    argv = [sys.executable, "-c", CHILD, allocator, mode, str(args.iters), str(args.repeats), str(args.size),
            json.dumps(MODES[mode])]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{allocator}/{mode} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("history_cost: PyTorch is not installed; nothing measured")
        return
    if not torch.cuda.is_available():
        print("history_cost: no CUDA device; nothing measured")
        return
    rows = []
    for mode in MODES:
        row = {"mode": mode}
        for allocator in ("native", "streamalloc"):
            out = run(allocator, mode, args)
            row[allocator] = statistics.median(out["samples"])
        row["ratio"] = row["streamalloc"] / row["native"]
        rows.append(row)
    print(f"torch.empty({args.size}) + free, ns per pair, median of {args.repeats} x {args.iters} "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__})")
    print("| history | native | streamalloc | streamalloc / native |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['mode']} | {row['native']:.0f} | {row['streamalloc']:.0f} | {row['ratio']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

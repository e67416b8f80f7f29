#!/usr/bin/env python3
"""Run the LibTorch inference server (streamalloc_inference_server) under every allocator and compare.

One process per allocator and round (PyTorch picks its CUDA allocator once per process); each process
runs every model and thread count. The table shows the median requests/s of all repetitions of all
rounds, with the ratio to PyTorch's native allocator (above 1: more requests per second than native),
and the median p99 latency. Without a GPU the server says so and this script reports "skipped".
`streamalloc[K:V;K:V]` in --allocators is streamalloc with those options, a column of its own.

  python3 bench/studies/inference_server.py [--build build] [--allocators native,streamalloc,standin,rmm]
      [--threads 1,2,4,8,16] [--models mlp,conv] [--rounds 1] [--reps 3] [--duration 2] [--warmup 0.5]
      [--quick] [--conf K:V,...] [--json OUT.json] [--markdown OUT.md]
  python3 bench/studies/inference_server.py --from-json RUN.json [--markdown OUT.md]   (the table of a saved run)
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_GPU = "no CUDA GPU here"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory (default: build)")
    p.add_argument("--allocators", help="comma-separated; default: every allocator the binary has; "
                                         "streamalloc[K:V;K:V] is streamalloc with those options")
    p.add_argument("--threads", default="1,2,4,8,16")
    p.add_argument("--models", default="mlp,conv")
    p.add_argument("--rounds", type=int, default=1, help="processes per allocator, interleaved (default 1)")
    p.add_argument("--reps", type=int, default=3, help="repetitions per process (default 3)")
    p.add_argument("--duration", type=float, default=2.0, help="counted seconds per repetition (default 2)")
    p.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per repetition (default 0.5)")
    p.add_argument("--quick", action="store_true", help="--reps 2 --duration 1 --warmup 0.25")
    p.add_argument("--conf", default="", help="streamalloc's options (STREAMALLOC_CONF syntax)")
    p.add_argument("--json", help="write every JSON line of every run here")
    p.add_argument("--markdown", help="write the table here")
    p.add_argument("--from-json", help="run nothing: the table of the JSON lines in this file (--json of a run)")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.duration, args.warmup = 2, 1.0, 0.25
    if args.rounds < 1 or args.reps < 1:
        p.error("--rounds and --reps must be at least 1")
    return args


def binary_path(build):
    path = os.path.join(build, "bench", "streamalloc_inference_server")
    if not os.path.exists(path):
        sys.exit(f"inference_server.py: {path} not found; build it (cmake --build {build} --target "
                 "streamalloc_inference_server; it needs LibTorch, the CUDA toolkit and the PyTorch plugin)")
    return path


def commit():
    def git(*cmd):
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def split_variant(allocator, conf=""):
    """`streamalloc[K:V;K:V]` names streamalloc run with those options (after --conf's), so that settings can
    be compared in one interleaved run: returns (the binary's allocator, its options)."""
    if allocator.startswith("streamalloc[") and allocator.endswith("]"):
        extra = allocator[len("streamalloc["):-1].replace(";", ",")
        return "streamalloc", ",".join(c for c in (conf, extra) if c)
    return allocator, conf if allocator == "streamalloc" else ""


def run_once(binary, allocator, args):
    """One process: its JSON lines, or raises RuntimeError; returns None when there is no GPU."""
    base, conf = split_variant(allocator, args.conf)
    cmd = [binary, f"--allocator={base}", f"--threads={args.threads}", f"--models={args.models}",
           f"--reps={args.reps}", f"--duration={args.duration}", f"--warmup={args.warmup}"]
    if conf:
        cmd.append(f"--conf={conf}")
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode == 2 and NO_GPU in proc.stderr:
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"{allocator}: exit status {proc.returncode}: {proc.stderr.strip()[-400:]}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        line["allocator"] = allocator
    return lines


def summarize(lines):
    """{(allocator, model, threads): {"rps": median over all reps, "p99": median p99, ...}}"""
    groups = {}
    for line in lines:
        groups.setdefault((line["allocator"], line["model"], line["threads"]), []).append(line)
    out = {}
    for key, runs in groups.items():
        reps = [r for run in runs for r in run["requests_per_s_reps"]]
        reserved = [run["peak_reserved_bytes"] for run in runs if run["peak_reserved_bytes"] is not None]
        out[key] = {"rps": statistics.median(reps), "reps": len(reps),
                    "p99": statistics.median(run["p99_us"] for run in runs),
                    "reserved": max(reserved) if reserved else None}
    return out


def markdown(summary, allocators, lines, failures, machine):
    """The table: `machine` is the line that says where and how it ran."""
    first = lines[0]
    models = list(dict.fromkeys(line["model"] for line in lines))
    threads = sorted({line["threads"] for line in lines})
    reps = min(s["reps"] for s in summary.values())
    out = [
        "# Inference server: requests/s by allocator",
        "",
        machine + f" Batches of 1..{first['max_batch']} rows, {first['duration_s']:g} s counted after "
        f"{first['warmup_s']:g} s of warm-up per repetition.",
        "",
        "Median requests/s over all threads (and, in brackets, the ratio to PyTorch's native allocator: above 1 "
        "is more requests per second). `standin` is the ceiling: an allocator with no locks and no stream "
        "bookkeeping, unsafe in general (bench/scenarios/inference_standin_allocator.cpp).",
        "",
        "| model | threads | " + " | ".join(allocators) + " |",
        "|---|---:|" + "---:|" * len(allocators),
    ]
    for model in models:
        for t in threads:
            native = summary.get(("native", model, t))
            cells = []
            for a in allocators:
                s = summary.get((a, model, t))
                if s is None:
                    cells.append("failed" if a in failures else "-")
                elif native is None or a == "native":
                    cells.append(f"{s['rps']:,.0f}")
                else:
                    cells.append(f"{s['rps']:,.0f} ({s['rps'] / native['rps']:.2f}x)")
            out.append(f"| {model} | {t} | " + " | ".join(cells) + " |")
    out += ["", "Median p99 latency per request (us):", "",
            "| model | threads | " + " | ".join(allocators) + " |",
            "|---|---:|" + "---:|" * len(allocators)]
    for model in models:
        for t in threads:
            cells = [f"{summary[(a, model, t)]['p99']:,.0f}" if (a, model, t) in summary else "-" for a in allocators]
            out.append(f"| {model} | {t} | " + " | ".join(cells) + " |")
    for a, reason in failures.items():
        out += ["", f"{a} failed: {reason}"]
    out.append(f"\n(At least {reps} repetitions per cell.)")
    return "\n".join(out) + "\n"


def write_table(lines, allocators, failures, machine, path):
    table = markdown(summarize(lines), allocators, lines, failures, machine)
    print("\n" + table)
    if path:
        with open(path, "w") as f:
            f.write(table)


def main(argv):
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        if not lines:
            sys.exit(f"inference_server.py: no JSON lines in {args.from_json}")
        allocators = list(dict.fromkeys(line["allocator"] for line in lines))
        write_table(lines, allocators, {}, f"{lines[0]['gpu']}, torch {lines[0]['torch']}; from {args.from_json}.",
                    args.markdown)
        return 0
    binary = binary_path(args.build)
    available = subprocess.run([binary, "--list-allocators"], capture_output=True, text=True, check=True).stdout.split()
    allocators = args.allocators.split(",") if args.allocators else available
    missing = [a for a in allocators if split_variant(a)[0] not in available]
    if missing:
        sys.exit(f"inference_server.py: this build has no {', '.join(missing)} allocator"
                 f" (it has {', '.join(available)})")

    lines, failures = [], {}
    for _ in range(args.rounds):
        for allocator in allocators:
            if allocator in failures:
                continue
            try:
                got = run_once(binary, allocator, args)
            except RuntimeError as error:
                failures[allocator] = str(error)
                continue
            if got is None:
                print("inference_server.py: skipped: no CUDA GPU on this machine")
                return 0
            lines += got
    if args.json:
        with open(args.json, "w") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
    if not lines:
        print("inference_server.py: every allocator failed:", failures, file=sys.stderr)
        return 1
    machine = (f"{lines[0]['gpu']} on {socket.gethostname()} ({os.cpu_count()} CPUs), torch {lines[0]['torch']}, "
               f"commit {commit()}, {datetime.date.today().isoformat()}; bench/studies/inference_server.py"
               f"{' --quick' if args.quick else ''}, {args.rounds} round(s) of {args.reps} repetitions.")
    write_table(lines, allocators, failures, machine, args.markdown)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""How streamalloc scales with threads against its peers: the allocator-bound inference server and the
varied-size threads scenarios, JSON and markdown into one folder (`make bench-threads OUT=DIR`).

  1. streamalloc_inference_server, model small_mlp (bench/studies/inference_server.py): every allocator
     of the build (native, streamalloc, standin = the ceiling, rmm), one process per allocator and round,
     rounds interleaved; medians of all repetitions; streamalloc's path counts at each thread count.
     Skipped without a GPU or without the server (it needs LibTorch and the PyTorch plugin).
  2. streamalloc_bench's threads_varied, threads_server (the server's tensor sizes, without the GPU work)
     and threads scenarios: streamalloc, torch_native,
     cudaMallocAsync and rmm_arena where they run (on the simulated device: streamalloc alone),
     repetitions interleaved, medians; streamalloc's path counts per row.

  python3 bench/studies/threads_scaling.py OUT_DIR [--build build] [--threads 1,2,4,8,16] [--rounds 3]
      [--quick] [--conf K:V,...]
Writes OUT_DIR/server.json, server.md, threads.json, threads.md and README.md (both tables).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_PEERS = ["streamalloc", "torch_native", "cudaMallocAsync", "rmm_arena"]
COUNTERS = ["cached_share", "device_locks_per_alloc", "lock_wait_ns", "lock_held_ns", "headroom_gathers",
            "hot_list_flushes", "fences_recorded", "fences_polled"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for the JSON and markdown (created)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--threads", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=3, help="server processes per allocator, interleaved (default 3)")
    p.add_argument("--quick", action="store_true", help="shorter windows (a check that everything runs)")
    p.add_argument("--conf", default="", help="streamalloc's options for every run (STREAMALLOC_CONF syntax)")
    return p.parse_args(argv)


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, text=True).returncode


def server(args):
    """The allocator-bound server; returns its markdown, or a line saying why it did not run."""
    binary = os.path.join(args.build, "bench", "streamalloc_inference_server")
    if not os.path.exists(binary):
        return f"Inference server: not built here ({binary}; it needs LibTorch, CUDA and the PyTorch plugin).\n"
    json_path, md_path = os.path.join(args.out, "server.json"), os.path.join(args.out, "server.md")
    duration, warmup = ("0.3", "0.2") if args.quick else ("1", "0.4")
    cmd = [sys.executable, os.path.join(ROOT, "bench", "studies", "inference_server.py"), "--build", args.build,
           "--models", "small_mlp", "--threads", args.threads, "--rounds", str(args.rounds), "--reps", "1",
           "--duration", duration, "--warmup", warmup, "--json", json_path, "--markdown", md_path]
    if args.conf:
        cmd.append(f"--conf={args.conf}")
    status = run(cmd)
    if not os.path.exists(md_path):
        return f"Inference server: did not run (exit status {status}; no GPU?).\n"
    with open(md_path) as f:
        return f.read()


def bench_peers(binary):
    """The peers of BENCH_PEERS that this build runs here."""
    listed = subprocess.run([binary, "--benchmark_list_tests", "--benchmark_filter=^threads_varied/"],
                            capture_output=True, text=True, check=True).stdout
    present = {m.group(1) for m in re.finditer(r"^threads_varied/([^@/]+)@", listed, re.M)}
    return [p for p in BENCH_PEERS if p in present]


def threads_bench(args):
    """The threads scenarios; returns their markdown."""
    binary = os.path.join(args.build, "bench", "streamalloc_bench")
    json_path = os.path.join(args.out, "threads.json")
    peers = bench_peers(binary)
    cmd = [binary, "--benchmark_filter=^threads(_varied|_server)?/", "--peers=" + ",".join(peers),
           "--benchmark_repetitions=3", "--benchmark_enable_random_interleaving=true",
           "--benchmark_report_aggregates_only=true", f"--min_time={0.05 if args.quick else 0.2}",
           f"--benchmark_out={json_path}", "--benchmark_out_format=json"]
    if args.conf:
        cmd.append(f"--conf={args.conf}")
    if run(cmd) != 0:
        sys.exit("threads_scaling.py: streamalloc_bench failed")
    with open(json_path) as f:
        data = json.load(f)
    return threads_markdown(data, args.threads)


def threads_markdown(data, thread_list):
    rows = {}  # (scenario, peer, device, threads) -> median row
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median" or b.get("error_occurred"):
            continue
        m = re.match(r"(threads(?:_varied|_server)?)/([^@/]+)@([^/]+)/.*threads:(\d+)", b["run_name"])
        if m:
            rows[(m.group(1), m.group(2), m.group(3), int(m.group(4)))] = b
    wanted = [int(t) for t in thread_list.split(",")]
    out = []
    for scenario in ("threads_varied", "threads_server", "threads"):
        peers = list(dict.fromkeys((p, d) for (s, p, d, _) in rows if s == scenario))
        if not peers:
            continue
        ctx = data.get("context", {})
        out += [f"## {scenario}: million alloc+free pairs per second, all threads", "",
                f"{ctx.get('host_name', '')}, {ctx.get('num_cpus', '?')} CPUs; medians of 3 interleaved "
                "repetitions. In brackets: the ratio to torch_native (above 1: faster), and, for streamalloc, "
                "its speed-up over its own one-thread row.", "",
                "| threads | " + " | ".join(f"{p}@{d}" for p, d in peers) + " |",
                "|---:|" + "---:|" * len(peers)]
        for t in wanted:
            cells = []
            native = next((rows.get((scenario, "torch_native", d, t)) for _, d in peers
                           if (scenario, "torch_native", d, t) in rows), None)
            for p, d in peers:
                r = rows.get((scenario, p, d, t))
                if r is None:
                    cells.append("-")
                    continue
                cell = f"{r['items_per_second'] / 1e6:.2f}"
                notes = []
                if native is not None and p != "torch_native":
                    notes.append(f"{r['items_per_second'] / native['items_per_second']:.2f}x")
                one = rows.get((scenario, p, d, 1))
                if p == "streamalloc" and one is not None and t != 1:
                    notes.append(f"{r['items_per_second'] / one['items_per_second']:.1f}x of T=1")
                cells.append(cell + (f" ({', '.join(notes)})" if notes else ""))
            out.append(f"| {t} | " + " | ".join(cells) + " |")
        sa = [(d, t) for (s, p, d, t) in rows if s == scenario and p == "streamalloc"]
        if sa:
            out += ["", f"streamalloc's path counts ({scenario}; per allocation; gathers, flushes and fences "
                    "per 1000):", "",
                    "| threads | " + " | ".join(COUNTERS) + " |", "|---:|" + "---:|" * len(COUNTERS)]
            for d, t in sorted(sa, key=lambda x: x[1]):
                r = rows[(scenario, "streamalloc", d, t)]
                out.append(f"| {t} | " + " | ".join(f"{r.get(c, float('nan')):.3g}" for c in COUNTERS) + " |")
        out.append("")
    return "\n".join(out) + "\n"


def server_counts(path):
    """streamalloc's path counts in the server run, per thread count (medians over the rounds)."""
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    by_t = {}
    for line in lines:
        if line["allocator"] == "streamalloc" and line.get("path_counts"):
            by_t.setdefault(line["threads"], []).append(line["path_counts"])
    if not by_t:
        return ""
    out = ["", "streamalloc's path counts in the server (small_mlp; medians over the rounds):", "",
           "| threads | cached share | device locks / alloc | lock wait ns / alloc | lock held ns / alloc | "
           "headroom gathers | hot-list flushes | fences recorded |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for t in sorted(by_t):
        def med(key, runs=by_t[t]):
            return statistics.median(r[key] for r in runs)
        allocs = med("allocations_cached") + med("allocations_device_locked")
        per = (lambda x: x / allocs) if allocs else (lambda x: float("nan"))
        out.append(f"| {t} | {per(med('allocations_cached')):.3f} | {per(med('device_lock_acquisitions')):.3f} | "
                   f"{per(med('device_lock_wait_ns')):.0f} | {per(med('device_lock_held_ns')):.0f} | "
                   f"{med('headroom_gathers'):.0f} | {med('hot_list_flushes'):.0f} | "
                   f"{med('fences_recorded') if 'fences_recorded' in by_t[t][0] else float('nan'):.0f} |")
    return "\n".join(out) + "\n"


def main(argv):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    server_md = server(args) + server_counts(os.path.join(args.out, "server.json"))
    threads_md = threads_bench(args)
    with open(os.path.join(args.out, "threads.md"), "w") as f:
        f.write(threads_md)
    readme = "# Threads: the allocator-bound server and the varied-size threads scenarios\n\n" + server_md + "\n" + \
        threads_md
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(readme)
    print("\n" + readme)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

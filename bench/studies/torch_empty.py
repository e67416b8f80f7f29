#!/usr/bin/env python3
"""torch.empty + free through PyTorch: PyTorch's native allocator vs streamalloc, each in its own process
(PyTorch picks its CUDA allocator once per process).

    python3 bench/studies/torch_empty.py [--sizes 512,1048576,67108864] [--iters 20000] [--repeats 7]
        [--no-cpp] [--conf STREAMALLOC_CONF] [--json OUT]

Two loops per size, each timed as a block and reported as ns per pair, median of --repeats after one
warm-up run:
  python  `torch.empty(n, dtype=torch.uint8, device="cuda")` whose result is dropped at once, so the
          tensor is freed in the same iteration: what a Python training step pays per tensor;
  cpp     the same through `at::empty` in a C++ loop (torch.utils.cpp_extension.load_inline), without
          the interpreter's share; this is the number the at::empty target is about. Needs a C++
          compiler and ninja; without them it is reported as unavailable and the Python loop remains.
streamalloc is enabled with `import streamalloc; streamalloc.enable(CONF)`: torch_plugin/ must be on
PYTHONPATH (or the package installed) and STREAMALLOC_LIBRARY_DIR must point at the built libraries
when the package is not installed. Without a GPU the script says so and exits 0.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CPP_SOURCE = r"""
#include <torch/extension.h>
#include <chrono>

// ns per at::empty + free pair over `iters` pairs of `nbytes` bytes on the current CUDA device.
double empty_loop(int64_t iters, int64_t nbytes) {
  const auto options = at::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iters; ++i) {
    at::Tensor t = at::empty({nbytes}, options);  // freed at the end of each iteration
  }
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(stop - start).count() / static_cast<double>(iters);
}
"""
PEERS = ("native", "streamalloc")


def measure(fn, repeats):
    fn()  # warm-up: reserves the segment, builds caches
    return statistics.median(fn() for _ in range(repeats))


def child(peer, sizes, iters, repeats, conf, cpp):
    import torch

    result = {"peer": peer}
    if peer == "streamalloc":
        import streamalloc

        streamalloc.enable(conf)
    device = torch.device("cuda", 0)
    torch.empty(1, device=device)  # CUDA init, with the chosen allocator
    result["allocator_backend"] = torch.cuda.get_allocator_backend()
    empty, uint8 = torch.empty, torch.uint8

    def python_loop(nbytes):
        start = time.perf_counter_ns()
        for _ in range(iters):
            empty(nbytes, dtype=uint8, device=device)
        return (time.perf_counter_ns() - start) / iters

    result["python"] = {str(n): measure(lambda n=n: python_loop(n), repeats) for n in sizes}
    if cpp:
        try:
            from torch.utils.cpp_extension import load_inline

            module = load_inline(name="streamalloc_bench_empty", cpp_sources=CPP_SOURCE, functions=["empty_loop"],
                                 extra_cflags=["-O2"], verbose=False)
            cpp_iters = iters * 10
            result["cpp"] = {str(n): measure(lambda n=n: module.empty_loop(cpp_iters, n), repeats) for n in sizes}
        except (ImportError, OSError, RuntimeError, subprocess.CalledProcessError) as error:
            # a missing compiler or ninja: report it, keep the Python numbers
            result["cpp_error"] = f"{type(error).__name__}: {error}".splitlines()[0]
    print(json.dumps(result))


def run_peer(peer, args):
    command = [sys.executable, os.path.abspath(__file__), "--child", peer, "--sizes", args.sizes,
               "--iters", str(args.iters), "--repeats", str(args.repeats), "--conf", args.conf]
    if args.no_cpp:
        command.append("--no-cpp")
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the native allocator with its defaults
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return {"peer": peer, "error": reason}
    return json.loads(lines[-1])


def print_table(results, sizes):
    for loop in ("python", "cpp"):
        if not any(loop in r for r in results.values()):
            continue
        print(f"\n{loop} loop: ns per empty+free pair (median)")
        print(f"{'bytes':>12}" + "".join(f"{peer:>14}" for peer in results) + f"{'ratio':>10}")
        for n in sizes:
            row = [results[p].get(loop, {}).get(str(n)) for p in results]
            cells = "".join(f"{v:14.1f}" if v is not None else f"{'n/a':>14}" for v in row)
            native, ours = results.get("native", {}).get(loop, {}).get(str(n)), \
                results.get("streamalloc", {}).get(loop, {}).get(str(n))
            ratio = f"{ours / native:10.3f}" if native and ours else f"{'n/a':>10}"
            print(f"{n:>12}{cells}{ratio}")
    for peer, r in results.items():
        if "error" in r:
            print(f"{peer}: failed: {r['error']}")
        if "cpp_error" in r:
            print(f"{peer}: C++ loop unavailable: {r['cpp_error']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="512,1048576,67108864", help="bytes, comma-separated")
    parser.add_argument("--iters", type=int, default=20000, help="pairs per timed Python loop (C++: 10x)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-cpp", action="store_true", help="skip the at::empty C++ loop")
    parser.add_argument("--conf", default="", help="streamalloc options (STREAMALLOC_CONF syntax)")
    parser.add_argument("--json", default=None, help="write the results as JSON (bench/report.py reads it)")
    parser.add_argument("--child", choices=PEERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]

    if args.child:
        child(args.child, sizes, args.iters, args.repeats, args.conf, not args.no_cpp)
        return
    import torch

    if not torch.cuda.is_available():
        reason = "no CUDA device (torch.cuda.is_available() is False); this comparison needs a GPU"
        print(f"torch_empty: skipped: {reason}")
        if args.json:  # so that a report never picks up a stale result from an earlier run
            with open(args.json, "w") as f:
                json.dump({"kind": "torch_empty", "skipped": reason, "torch": torch.__version__}, f, indent=2)
        return
    results = {peer: run_peer(peer, args) for peer in PEERS}
    print(f"torch_empty on {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print_table(results, sizes)
    if args.json:
        report = {"kind": "torch_empty", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                  "iters": args.iters, "repeats": args.repeats, "conf": args.conf, "results": results}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if any("error" in r for r in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()

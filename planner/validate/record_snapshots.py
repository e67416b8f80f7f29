#!/usr/bin/env python3
"""Record memory snapshots of real workloads on a GPU, and the peaks of the same workloads under
streamalloc, for planner/validate/compare.py.

    python3 planner/validate/record_snapshots.py --out-dir DIR [--only gpt2,pipeline,gpt2_expandable,multistream]
        [--streamalloc-snapshots] [--repeat N]
    python3 planner/validate/record_snapshots.py --dry-run     # the workloads on the CPU, tiny, no recording

Workloads, each run in a fresh process per allocator so that every allocator starts empty:
  gpt2             GPT-2 small (GPT2Config(), random weights, nothing downloaded), AdamW, batch 4 with a
                   random sequence length per step (64..1024 tokens, seeded)
  pipeline         a multi-stream pipeline: batches copied on a side stream (wait_stream, record_stream)
                   and consumed by a small MLP on the compute stream
  gpt2_expandable  gpt2 under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  multistream, resnet50, gpt2_bench
                   the workloads of bench/replay/traces/multistream.trace, resnet50.trace and gpt2.trace,
                   imported from bench/replay/record_workloads.py (they need CUDA: --dry-run only imports
                   them). The .trace files hold no completion points; these snapshots do.
Allocators: "pytorch" (PyTorch's allocator, with _record_memory_history and _dump_snapshot, plus
torch.cuda.max_memory_reserved()), "streamalloc" and "streamalloc_expandable" (streamalloc.enable(),
peaks from streamalloc.stats()), and with --streamalloc-snapshots also "streamalloc_recorded" and
"streamalloc_expandable_recorded": streamalloc runs that record their own snapshot
(DIR/<workload>.<allocator>.pickle.xz) with their peaks, so that a plan of streamalloc can be compared with
a streamalloc run on that run's own timing. --repeat N runs the plain streamalloc settings N times (each record
then has "run": k), since their peaks vary from run to run. gpt2_expandable is run under PyTorch's allocator only: its
streamalloc counterparts are gpt2's. Writes DIR/<workload>.pickle.xz (the snapshot, xz) and DIR/recorded.json, which
keeps the records of DIR/recorded.json of the workloads not recorded in this run.
"""

import argparse
import json
import lzma
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The bench traces' workloads, by snapshot workload name: (function of record_workloads.py, trace file).
BENCH_WORKLOADS = {"multistream": ("multistream", "multistream.trace"),
                   "resnet50": ("resnet50", "resnet50.trace"),
                   "gpt2_bench": ("gpt2", "gpt2.trace")}
WORKLOADS = ("gpt2", "pipeline", "gpt2_expandable", *BENCH_WORKLOADS)
DEFAULT_WORKLOADS = ("gpt2", "pipeline", "gpt2_expandable", "multistream")
HISTORY_ENTRIES = 400_000
# The settings --repeat runs again: their records carry "run", and compare.py reads their peaks as a spread.
REPEATED = ("streamalloc", "streamalloc_expandable")


def bench_workload(workload):
    """The function of bench/replay/record_workloads.py that records `workload`'s trace."""
    sys.path.insert(0, os.path.join(ROOT, "bench", "replay"))
    try:
        import record_workloads
    finally:
        sys.path.pop(0)
    return record_workloads.WORKLOADS[BENCH_WORKLOADS[workload][0]]


def gpt2(torch, device, dry_run):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    rng = random.Random(0)
    if dry_run:
        config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000, n_positions=128)
        steps, batch, lengths = 3, 2, (8, 64)
    else:
        config = GPT2Config()  # GPT-2 small: 12 layers, 768 wide
        steps, batch, lengths = 12, 4, (64, 1024)
    model = GPT2LMHeadModel(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        seq = rng.randint(*lengths)
        tokens = torch.randint(0, config.vocab_size, (batch, seq), device=device)
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        del tokens, loss
    return {"steps": steps, "batch": batch, "seq_range": list(lengths), "n_layer": config.n_layer}


def pipeline(torch, device, dry_run):
    torch.manual_seed(0)
    rng = random.Random(1)
    width, steps = (64, 4) if dry_run else (2048, 60)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                torch.nn.Linear(4 * width, width)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    cuda = device == "cuda"
    side = torch.cuda.Stream() if cuda else None
    host = [torch.randn(rng.choice((256, 512, 1024, 1536)) * (1 if dry_run else 4), width) for _ in range(6)]
    if cuda:
        host = [h.pin_memory() for h in host]

    def load(k):
        if not cuda:
            return host[k % len(host)].clone()
        with torch.cuda.stream(side):
            return host[k % len(host)].to(device, non_blocking=True)

    nxt = load(0)
    for k in range(steps):
        if cuda:
            torch.cuda.current_stream().wait_stream(side)
            nxt.record_stream(torch.cuda.current_stream())  # made on the side stream, used here
        batch = nxt
        nxt = load(k + 1)  # the next copy overlaps this step
        optimizer.zero_grad(set_to_none=True)
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        del batch, loss
    if cuda:
        torch.cuda.synchronize()
    return {"steps": steps, "width": width}


def run_child(workload, allocator, out_dir, dry_run):
    """One workload under one allocator, in this (fresh) process. Returns the record."""
    if dry_run and workload in BENCH_WORKLOADS:  # they allocate on CUDA: the dry run checks that they import
        fn = bench_workload(workload)
        return {"workload": workload, "allocator": allocator, "skipped": "needs CUDA", "function": fn.__name__}
    if workload == "gpt2_expandable" and allocator == "pytorch":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if allocator.startswith("streamalloc") and not dry_run:
        import streamalloc

        streamalloc.enable(expandable_segments=allocator.startswith("streamalloc_expandable"))
    import torch

    device = "cpu" if dry_run else "cuda"
    if not dry_run and not torch.cuda.is_available():
        sys.exit("record_snapshots: no CUDA device; run on a GPU machine, or pass --dry-run")
    record = (allocator == "pytorch" or allocator.endswith("_recorded")) and not dry_run
    if record:
        torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES, context=None, stacks="python")
    started = time.time()
    if workload in BENCH_WORKLOADS:
        info = {"trace": BENCH_WORKLOADS[workload][1], **bench_workload(workload)(torch)}
    else:
        info = (pipeline if workload == "pipeline" else gpt2)(torch, device, dry_run)
    out = {"workload": workload, "allocator": allocator, "seconds": round(time.time() - started, 2), **info}
    if dry_run:
        return out
    torch.cuda.synchronize()
    if allocator == "pytorch":
        out["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        out["num_device_alloc"] = torch.cuda.memory_stats().get("num_device_alloc", -1)
    else:
        import streamalloc

        stats = streamalloc.stats()["memory_stats"]
        out["max_memory_reserved"] = stats["reserved_bytes.all.peak"]
        out["max_memory_allocated"] = stats["allocated_bytes.all.peak"]
        out["num_device_alloc"] = stats.get("num_device_alloc", -1)
    if record:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        name = workload if allocator == "pytorch" else f"{workload}.{allocator}"
        path = os.path.join(out_dir, f"{name}.pickle.xz")
        import pickle

        with lzma.open(path, "wb", preset=9) as f:
            pickle.dump(snapshot, f)
        out["snapshot"] = os.path.basename(path)
        out["trace_entries"] = sum(len(t) for t in snapshot.get("device_traces", []))
        out["gpu"] = torch.cuda.get_device_name()
        out["torch"] = torch.__version__
    return out


def merge_records(path, records):
    """The records of `path` (an earlier recorded.json) of workloads not recorded now, then `records`."""
    try:
        with open(path) as f:
            earlier = json.load(f)
    except FileNotFoundError:
        earlier = []
    now = {r["workload"] for r in records}
    return [r for r in earlier if r.get("workload") not in now] + records


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", default="planner/validate/data")
    parser.add_argument("--only", default=",".join(DEFAULT_WORKLOADS),
                        help=f"comma-separated, of {', '.join(WORKLOADS)} (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="run the workloads on the CPU, tiny, nothing recorded")
    parser.add_argument("--streamalloc-snapshots", action="store_true",
                        help="also run streamalloc recording its own snapshot (the *_recorded allocators)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of the plain streamalloc settings per workload (peaks only), so that a plan can "
                             "be compared with the spread of real runs (default 1)")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "ALLOCATOR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child[0], args.child[1], args.out_dir, args.dry_run)))
        return 0
    os.makedirs(args.out_dir, exist_ok=True)
    records = []
    for workload in [w for w in args.only.split(",") if w]:
        if workload not in WORKLOADS:
            sys.exit(f"record_snapshots: unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
        allocators = ["pytorch"] if workload == "gpt2_expandable" else ["pytorch", "streamalloc",
                                                                          "streamalloc_expandable"]
        if args.streamalloc_snapshots and workload != "gpt2_expandable":
            allocators += ["streamalloc_recorded", "streamalloc_expandable_recorded"]
        # Later rounds repeat the plain streamalloc runs: their peaks vary from run to run with when fences
        # complete, and compare.py reports a plan against the nearest of them.
        order = [(allocator, k) for k in range(max(args.repeat, 1)) for allocator in allocators
                 if k == 0 or allocator in REPEATED]
        for allocator, k in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--out-dir", args.out_dir, "--child", workload, allocator]
            if args.dry_run:
                cmd.append("--dry-run")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"record_snapshots: {workload} under {allocator} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
                records.append({"workload": workload, "allocator": allocator, "error": proc.stderr[-500:]})
                continue
            record = json.loads(proc.stdout.strip().splitlines()[-1])
            if args.repeat > 1 and allocator in REPEATED:
                record["run"] = k
            print(json.dumps(record), flush=True)
            records.append(record)
    if not args.dry_run:
        path = os.path.join(args.out_dir, "recorded.json")
        merged = merge_records(path, records)  # read before the file is opened for writing
        with open(path, "w") as f:
            json.dump(merged, f, indent=1)
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

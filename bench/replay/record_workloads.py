#!/usr/bin/env python3
"""Record allocation traces of real PyTorch workloads on a GPU, with PyTorch's native allocator, for
streamalloc_replay. Run on the GPU machine (no network needed):

    python3 bench/replay/record_workloads.py [--only resnet50,gpt2,multistream] [--out-dir bench/replay/traces]
        [--max-ops 100000] [--keep-snapshots]

Workloads (each in a fresh process, so the allocator starts empty and its peaks are its own):
  resnet50     torchvision ResNet-50, random init, synthetic ImageNet-sized data, batch 32, 20 training
               steps, fed by a side-stream prefetcher (copy on a side stream, wait_stream,
               record_stream)
  gpt2         transformers GPT-2 (GPT2Config(n_layer=6), random init, nothing downloaded), batch 8 x
               512 tokens, 10 AdamW steps, same prefetcher
  multistream  4 streams running overlapping matmul pipelines: each stream produces activations that
               the next stream consumes (wait_stream + record_stream), 40 rounds of mixed sizes

Each writes bench/replay/traces/<name>.trace (see docs/benchmarking.md for the format) with the native
allocator's peaks in the header, cut to --max-ops and kept under 2 MB. Tensor.record_stream is wrapped
while recording so that the converter knows which stream each recorded block was used on.
"""

import argparse
import os
import pickle
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from convert_snapshot import RecordLog, convert, write_trace  # noqa: E402 (the folder joins the path first)

MAX_TRACE_BYTES = 2 * 1000 * 1000
HISTORY_ENTRIES = 5_000_000  # enough to keep every event of these workloads (the buffer keeps the newest)


# ---- the side-stream prefetcher (copy, wait_stream, record_stream) ----

class Prefetcher:
    def __init__(self, torch, host_batches):
        self.torch = torch
        self.host = host_batches
        self.stream = torch.cuda.Stream()
        self.index = 0
        self._preload()

    def _preload(self):
        torch = self.torch
        host = self.host[self.index % len(self.host)]
        self.index += 1
        with torch.cuda.stream(self.stream):
            self.pending = [t.cuda(non_blocking=True) for t in host]

    def next(self):
        torch = self.torch
        current = torch.cuda.current_stream()
        current.wait_stream(self.stream)
        batch = self.pending
        for t in batch:
            t.record_stream(current)  # allocated on the side stream, used on this one
        self._preload()
        return batch


# ---- workloads ----

def resnet50(torch, steps=20, batch=32):
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(0)
    host = [(torch.randn(batch, 3, 224, 224, generator=generator).pin_memory(),
             torch.randint(0, 1000, (batch,), generator=generator).pin_memory()) for _ in range(4)]
    loader = Prefetcher(torch, host)
    for _ in range(steps):
        images, labels = loader.next()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        del images, labels, loss
    return {"steps": steps, "batch": batch}


def gpt2(torch, steps=10, batch=8, seq=512):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=6)
    model = GPT2LMHeadModel(config).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    host = [(torch.randint(0, config.vocab_size, (batch, seq), generator=generator).pin_memory(),)
            for _ in range(4)]
    loader = Prefetcher(torch, host)
    for _ in range(steps):
        (tokens,) = loader.next()
        optimizer.zero_grad(set_to_none=True)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        del tokens, loss
    return {"steps": steps, "batch": batch, "seq": seq, "n_layer": config.n_layer}


def multistream(torch, rounds=40, nstreams=4):
    generator = torch.Generator().manual_seed(0)
    dims = (1024, 2048, 4096, 1536)
    weights = [torch.randn(d, d, generator=generator).cuda() / d ** 0.5 for d in dims]
    streams = [torch.cuda.Stream() for _ in range(nstreams)]
    sink = torch.zeros(nstreams, device="cuda")
    for r in range(rounds):
        handoff = []
        for i, stream in enumerate(streams):  # producers: a few layers each, on their own stream
            d = dims[(i + r) % len(dims)]
            rows = 256 * (1 + (r + i) % 4)
            with torch.cuda.stream(stream):
                x = torch.randn(rows, d, device="cuda")
                for _ in range(3):
                    x = torch.relu(x @ weights[dims.index(d)])
            handoff.append((stream, x, d))
            del x
        for i, (producer, x, d) in enumerate(handoff):  # consumers: the next stream in the ring
            consumer = streams[(i + 1) % nstreams]
            consumer.wait_stream(producer)
            with torch.cuda.stream(consumer):
                x.record_stream(consumer)
                y = torch.tanh(x @ weights[dims.index(d)])
                sink[i] += y.sum()
            del x, y
        handoff.clear()
    torch.cuda.synchronize()
    return {"rounds": rounds, "streams": nstreams}


WORKLOADS = {"resnet50": resnet50, "gpt2": gpt2, "multistream": multistream}


# ---- recording ----

def record_child(name, out_dir, max_ops, keep_snapshot):
    import torch

    if not torch.cuda.is_available():
        sys.exit("record_workloads: no CUDA device (torch.cuda.is_available() is False); run this on the GPU machine")
    calls = []
    original = torch.Tensor.record_stream

    def logged_record_stream(tensor, stream):
        calls.append({"t_us": time.time_ns() // 1000, "addr": tensor.untyped_storage().data_ptr(),
                      "stream": stream.cuda_stream})
        return original(tensor, stream)

    torch.Tensor.record_stream = logged_record_stream
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=HISTORY_ENTRIES)
    info = WORKLOADS[name](torch)
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.Tensor.record_stream = original
    if keep_snapshot:
        with open(os.path.join(out_dir, name + ".snapshot.pickle"), "wb") as f:
            pickle.dump(snapshot, f)

    extra = {"source": "record_workloads.py", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
             "native_full_run_peak_reserved": torch.cuda.max_memory_reserved(),
             "native_full_run_peak_allocated": torch.cuda.max_memory_allocated()}
    extra.update(info)
    path = os.path.join(out_dir, name + ".trace")
    limit = max_ops
    while True:
        lines, header, summary = convert(snapshot, 0, limit, RecordLog(calls), name, extra)
        write_trace(path, lines, header)
        if os.path.getsize(path) <= MAX_TRACE_BYTES or limit < 1000:
            break
        limit = int(limit * MAX_TRACE_BYTES / os.path.getsize(path) * 0.95)
    truncated = " (truncated)" if summary["truncated"] else ""
    print(f"{name}: {len(lines)} ops{truncated}, {summary['streams']} streams, native peak reserved "
          f"{header['native_peak_reserved'] / 2**20:.1f} MiB, peak allocated "
          f"{header['native_peak_allocated'] / 2**20:.1f} MiB (window); record_stream "
          f"{summary['logged_records']} logged, {summary['inferred_records']} inferred -> {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads")
    parser.add_argument("--out-dir", default=os.path.join(HERE, "traces"))
    parser.add_argument("--max-ops", type=int, default=100000)
    parser.add_argument("--keep-snapshots", action="store_true", help="also keep <name>.snapshot.pickle")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        record_child(args.child, args.out_dir, args.max_ops, args.keep_snapshots)
        return
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"record_workloads: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the native allocator, with its default settings
    failed = []
    for name in names:
        command = [sys.executable, os.path.abspath(__file__), "--child", name, "--out-dir", args.out_dir,
                   "--max-ops", str(args.max_ops)] + (["--keep-snapshots"] if args.keep_snapshots else [])
        if subprocess.run(command, env=env, check=False).returncode != 0:
            failed.append(name)
    if failed:
        sys.exit("record_workloads: failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()

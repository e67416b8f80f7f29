#!/usr/bin/env python3
"""Write a synthetic allocation trace of a training loop fed by a side-stream prefetcher, so that trace replay runs on
any machine (CI, the simulated device) without a recorded workload.

    python3 bench/replay/make_synthetic.py [--steps 40] [--seed 7] [-o bench/replay/traces/synthetic_pipeline.trace]

The workload, per step (trace streams: 0 = compute, 1 = prefetch side stream, 2 = a gradient
communication stream):
  * the prefetcher allocates the next batch (inputs + labels) on stream 1; the compute stream uses it
    (`r ... 0`), and it is freed when the step that consumed it ends: the
    copy / wait_stream / record_stream pattern of the copy-overlap loop, so those frees must wait for a fence;
  * forward: one activation per layer on stream 0 (layer sizes fixed, so steps repeat like a real
    model), plus short-lived temporaries;
  * backward: activations freed in reverse order while gradient temporaries come and go; parameter
    gradients are allocated in the first step and kept;
  * every few layers a gradient bucket is allocated on stream 2, used by stream 0 and freed;
  * the model's parameters are allocated before the first step and never freed.
The header carries no native peaks: nothing was recorded on a GPU (record_workloads.py does that).
"""

import argparse
import math
import random

BATCH_INPUT = 32 * 3 * 224 * 224 * 4  # fp32 images
BATCH_LABELS = 32 * 8                  # int64 labels


def log_uniform(rng, low, high):
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


class Writer:
    def __init__(self):
        self.lines = []
        self.next_id = 0

    def alloc(self, size, stream):
        block = self.next_id
        self.next_id += 1
        self.lines.append(f"a {block} {size} {stream}")
        return block

    def record(self, block, stream):
        self.lines.append(f"r {block} {stream}")

    def free(self, block):
        self.lines.append(f"f {block}")


def generate(steps, seed, layers=48):
    rng = random.Random(seed)
    out = Writer()
    params = [log_uniform(rng, 4 << 10, 9 << 20) for _ in range(layers)]
    activations = [log_uniform(rng, 256 << 10, 24 << 20) for _ in range(layers)]
    for size in params:
        out.alloc(size, 0)
    grads = None
    pending_batch = None
    for _ in range(steps):
        batch = [out.alloc(BATCH_INPUT, 1), out.alloc(BATCH_LABELS, 1)]
        for block in batch:
            out.record(block, 0)
        live = []
        for size in activations:  # forward
            live.append(out.alloc(size, 0))
            tmp = out.alloc(max(512, size // rng.choice((2, 4, 8))), 0)
            out.free(tmp)
        new_grads = grads is None
        if new_grads:
            grads = []
        bucket_bytes = 0
        bucket = []
        for layer in reversed(range(layers)):  # backward
            tmp = out.alloc(activations[layer], 0)
            out.free(live.pop())
            if new_grads:
                grads.append(out.alloc(params[layer], 0))
            out.free(tmp)
            bucket_bytes += params[layer]
            bucket.append(layer)
            if bucket_bytes >= 25 << 20 or layer == 0:
                comm = out.alloc(bucket_bytes, 2)
                out.record(comm, 0)
                out.free(comm)
                bucket_bytes, bucket = 0, []
        for size in params:  # optimizer temporaries
            out.free(out.alloc(size, 0))
        if pending_batch is not None:
            for block in pending_batch:
                out.free(block)
        pending_batch = batch
    for block in pending_batch:
        out.free(block)
    return out.lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("-o", "--output", default="bench/replay/traces/synthetic_pipeline.trace")
    args = parser.parse_args()
    lines = generate(args.steps, args.seed)
    header = (f"#streamalloc-trace v1 workload=synthetic_pipeline source=make_synthetic.py "
              f"steps={args.steps} seed={args.seed}")
    with open(args.output, "w") as f:
        f.write(header + "\n")
        f.write("# streams: 0 compute, 1 prefetch, 2 gradient communication. No native peaks: synthetic.\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.output}: {len(lines)} ops")


if __name__ == "__main__":
    main()

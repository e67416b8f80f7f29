#!/usr/bin/env python3
"""Write a synthetic PyTorch memory snapshot (the dict _dump_snapshot pickles) with a trace of about
EVENTS entries, for the planner's tests and its timing benchmark. No torch needed.

    python3 planner/tools/make_snapshot.py OUT.pickle [--events 100000] [--seed 0]

The trace imitates training with a side-stream prefetcher: each step allocates activations of mixed
sizes on the compute stream (freed in reverse order at the end of the step), a few long-lived
tensors, and a prefetched batch allocated on a side stream and used on the compute stream
(record_stream), whose free_completed comes a few allocations after its free_requested.
"""

import argparse
import pickle
import random

COMPUTE, SIDE = 0x1000, 0x2000


def make_snapshot(events=100_000, seed=0):
    rng = random.Random(seed)
    trace = []
    next_addr = [1 << 32]

    def addr():
        next_addr[0] += 1 << 22
        return next_addr[0]

    def entry(action, a, size, stream):
        trace.append({"action": action, "addr": a, "size": size, "stream": stream, "time_us": len(trace),
                      "frames": [{"filename": "train.py", "line": 10 + len(trace) % 50, "name": "step"}]})

    long_lived = []
    delayed = []  # (countdown, addr, size) of frees waiting for their stream's events
    while len(trace) < events:
        batch = rng.choice((1, 2, 4)) << 20
        b = addr()
        entry("alloc", b, batch, SIDE)
        acts = []
        for _ in range(rng.randint(20, 60)):
            size = rng.choice((512, 4096, 65536, 1 << 20, 3 << 20, 12 << 20, 40 << 20)) + rng.randrange(0, 4096)
            a = addr()
            entry("alloc", a, size, COMPUTE)
            acts.append((a, size))
            for item in list(delayed):
                item[0] -= 1
                if item[0] <= 0:
                    entry("free_completed", item[1], item[2], SIDE)
                    delayed.remove(item)
        for a, size in reversed(acts):
            entry("free_requested", a, size, COMPUTE)
            entry("free_completed", a, size, COMPUTE)
        entry("free_requested", b, batch, SIDE)  # used on the compute stream: completes later
        delayed.append([rng.randint(1, 5), b, batch])
        if rng.random() < 0.1:
            a, size = addr(), rng.choice((8, 16)) << 20
            entry("alloc", a, size, COMPUTE)
            long_lived.append((a, size))
        if len(long_lived) > 4:
            a, size = long_lived.pop(0)
            entry("free_requested", a, size, COMPUTE)
            entry("free_completed", a, size, COMPUTE)
    return {"segments": [], "device_traces": [trace]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    snapshot = make_snapshot(args.events, args.seed)
    with open(args.out, "wb") as f:
        pickle.dump(snapshot, f)
    print(f"{args.out}: {len(snapshot['device_traces'][0])} trace entries")


if __name__ == "__main__":
    main()

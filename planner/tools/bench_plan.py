#!/usr/bin/env python3
"""Time the planner on a synthetic snapshot of at least EVENTS replayed events, every setting.

    STREAMALLOC_LIBRARY_DIR=build/lib PYTHONPATH=torch_plugin python3 planner/tools/bench_plan.py [--events 100000]

Prints the events, the wall time of loading + converting + planning (the whole `python -m
streamalloc.plan` path, all settings: PyTorch default, expandable, max_split_size_mb:128, streamalloc
default, expandable, cross_stream_reuse:never) and of the planning alone.
"""

import argparse
import os
import pickle
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_snapshot import make_snapshot  # noqa: E402
from streamalloc import plan  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    entries = args.events
    while True:  # trace entries -> replayed events is about 3:2; grow until the event list is long enough
        snapshot = make_snapshot(entries, seed=0)
        conversion = plan.convert(snapshot["device_traces"][0])
        if conversion.events >= args.events:
            break
        entries = int(entries * args.events / conversion.events) + 1000
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "synthetic.pickle")
        with open(path, "wb") as f:
            pickle.dump(snapshot, f)
        started = time.perf_counter()
        loaded = plan.load_snapshot(path)
        t_load = time.perf_counter()
        report, conversion = plan.plan_snapshot(loaded, cap_bytes=1 << 30, torch_conf="max_split_size_mb:128",
                                                conf="cross_stream_reuse:never")
        done = time.perf_counter()
    engine = done - t_load
    print(f"{conversion.events} events ({len(snapshot['device_traces'][0])} trace entries), "
          f"{len(report['settings'])} settings, cap 1 GiB")
    print(f"load {t_load - started:.2f} s, convert + plan {engine:.2f} s, total {done - started:.2f} s")
    for s in report["settings"]:
        print(f"  {s['name']:<38} peak reserved {s['peak_reserved'] / (1 << 30):.3f} GiB  fits {s['fits']}")


if __name__ == "__main__":
    main()

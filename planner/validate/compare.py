#!/usr/bin/env python3
"""Validate the planner against the GPU: plan each recorded snapshot and compare.

    python3 planner/validate/compare.py [--data planner/validate/data] [--out planner/validate/results.json]

For each workload of DATA/recorded.json (written by record_snapshots.py on a GPU machine):
  - the model of PyTorch's allocator against what PyTorch did: its peak reserved against
    torch.cuda.max_memory_reserved() of the recorded run, and its sequence of segment events
    (segment_alloc/free/map/unmap, each as (event of the trace, action, bytes)) against the sequence the
    snapshot recorded: the share of recorded segment events the model reproduces in order;
  - the plan's streamalloc peaks against the peaks of real streamalloc runs of the same workload.
And for each streamalloc_replay trace (bench/replay/traces/*.trace, which carry no segment events and no
completion points, only the recorded peak reserved in their header): the model's peak against that peak under
the two completion rules that bracket it, and the snapshot workload that validates the trace's workload
(multistream, resnet50, gpt2_bench for multistream.trace, resnet50.trace, gpt2.trace).
Needs the planner library (STREAMALLOC_LIBRARY_DIR, default build/lib) but neither torch nor a GPU.
"""

import argparse
import difflib
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "torch_plugin"))
os.environ.setdefault("STREAMALLOC_LIBRARY_DIR", os.path.join(ROOT, "build", "lib"))

from streamalloc import plan  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from record_snapshots import BENCH_WORKLOADS  # noqa: E402

# The bench trace whose workload each snapshot workload runs: the .trace files hold no completion points,
# so each is validated through a snapshot of the same workload.
TRACE_OF = {workload: trace for workload, (_, trace) in BENCH_WORKLOADS.items()}

GiB = 1 << 30


def pct(model, real):
    return 100.0 * (model - real) / real if real else float("nan")


def sequence_match(recorded, modelled):
    """Share of the recorded segment events that the model reproduces in the same order (longest common
    subsequence of (event, action, bytes) tuples, over the longer of the two sequences)."""
    if not recorded and not modelled:
        return 100.0
    matcher = difflib.SequenceMatcher(None, recorded, modelled, autojunk=False)
    same = sum(block.size for block in matcher.get_matching_blocks())
    return 100.0 * same / max(len(recorded), len(modelled))


def nearest(planned, runs):
    """The error of `planned` against the real run closest to it (runs: peaks of runs of one workload
    under one setting, which differ from run to run where fences complete at different times)."""
    return min((pct(planned, run) for run in runs), key=abs) if runs else None


def compare_snapshot(record, by_key, runs_of, data_dir):
    workload = record["workload"]
    snapshot = plan.load_snapshot(os.path.join(data_dir, record["snapshot"]))
    torch_conf = "expandable_segments:True" if workload.endswith("_expandable") else ""
    settings = [{"name": "pytorch model", "allocator": "pytorch", "conf": torch_conf},
                {"name": "streamalloc", "allocator": "streamalloc", "conf": ""},
                {"name": "streamalloc expandable", "allocator": "streamalloc", "conf": "expandable_segments:true"}]
    report, conversion = plan.plan_snapshot(snapshot, segment_events=True, settings=settings)
    model = report["settings"][0]
    recorded_seq = [(e, a, s) for e, a, s, _ in conversion.segments]
    model_seq = [(e, a, s) for e, a, s, _ in model["segment_events"]]
    row = {
        "workload": workload,
        "bench_trace": TRACE_OF.get(workload),
        "trace_entries": report["trace_entries"],
        "events": report["events"],
        "truncated": report["truncated"],
        "torch_recorded_peak_reserved": record["max_memory_reserved"],
        "trace_peak_reserved": conversion.recorded_peak_reserved,
        "model_peak_reserved": model["peak_reserved"],
        "model_peak_error_pct": pct(model["peak_reserved"], record["max_memory_reserved"]),
        "recorded_segment_events": len(recorded_seq),
        "model_segment_events": len(model_seq),
        "segment_sequence_match_pct": sequence_match(recorded_seq, model_seq),
    }
    base = workload.replace("_expandable", "")
    pairs = ((report["settings"][1], "streamalloc"), (report["settings"][2], "streamalloc_expandable"))
    for setting, allocator in pairs:
        real = by_key.get((base, allocator))
        row[f"{allocator}_plan_peak_reserved"] = setting["peak_reserved"]
        if real and "max_memory_reserved" in real:
            row[f"{allocator}_real_peak_reserved"] = real["max_memory_reserved"]
            row[f"{allocator}_plan_error_pct"] = pct(setting["peak_reserved"], real["max_memory_reserved"])
        runs = runs_of.get((base, allocator), [])
        row[f"{allocator}_real_runs"] = runs
        row[f"{allocator}_plan_nearest_error_pct"] = nearest(setting["peak_reserved"], runs)
    # A streamalloc run that recorded its own snapshot: the plan of that snapshot runs on that run's timing
    # (its completion points are where streamalloc saw its fences complete), so it is compared with the
    # peak of the same run.
    for setting, allocator in zip(settings[1:], ("streamalloc", "streamalloc_expandable")):
        own = by_key.get((base, f"{allocator}_recorded"))
        if not own or "snapshot" not in own:
            continue
        own_report, _ = plan.plan_snapshot(plan.load_snapshot(os.path.join(data_dir, own["snapshot"])),
                                           settings=[setting])
        planned = own_report["settings"][0]["peak_reserved"]
        row[f"{allocator}_own_snapshot"] = own["snapshot"]
        row[f"{allocator}_own_plan_peak_reserved"] = planned
        row[f"{allocator}_own_real_peak_reserved"] = own["max_memory_reserved"]
        row[f"{allocator}_own_plan_error_pct"] = pct(planned, own["max_memory_reserved"])
        row[f"{allocator}_own_plan_nearest_error_pct"] = nearest(planned, runs_of.get((base, allocator), []))
    return row


def compare_trace(path, validated_by=None):
    with open(path) as f:
        text = f.read()
    header = dict(kv.split("=", 1) for kv in text.splitlines()[0].split()[2:] if "=" in kv)
    recorded = int(header.get("native_peak_reserved", 0))
    out = {"trace": os.path.basename(path), "torch_recorded_peak_reserved": recorded or None,
           "validated_by_snapshot": validated_by}
    # The traces carry no completion points of record_stream events: plan with both rules, which bracket
    # what the GPU did (the same number when the trace has no record_stream).
    for rule, key in (("next_malloc", "model"), ("out_of_memory", "model_oom_rule")):
        request = {"settings": [{"name": "pytorch model", "allocator": "pytorch", "conf": ""}], "series_points": 0,
                   "completion": rule}
        report = plan.run_engine(text, request)
        model = report["settings"][0]["peak_reserved"]
        out["events"] = report["events"]
        out[f"{key}_peak_reserved"] = model
        out[f"{key}_peak_error_pct"] = pct(model, recorded) if recorded else None
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(ROOT, "planner", "validate", "data"))
    traces = os.path.join(ROOT, "bench", "replay", "traces")
    if not os.path.isdir(traces):
        traces = os.path.join(ROOT, "bench", "traces")
    parser.add_argument("--traces", default=traces, help="streamalloc_replay traces (default: bench/replay/traces)")
    parser.add_argument("--out", default=os.path.join(ROOT, "planner", "validate", "results.json"))
    args = parser.parse_args()
    rows, trace_rows = [], []
    recorded_path = os.path.join(args.data, "recorded.json")
    if os.path.exists(recorded_path):
        with open(recorded_path) as f:
            records = json.load(f)
        by_key = {(r["workload"], r["allocator"]): r for r in records if "error" not in r}
        # Every real run's peak by (workload, setting): the plain runs (record_snapshots --repeat) and
        # the runs that recorded their own snapshot.
        runs_of = {}
        for r in records:
            if "error" not in r and "max_memory_reserved" in r and r["allocator"].startswith("streamalloc"):
                key = (r["workload"], r["allocator"].removesuffix("_recorded"))
                runs_of.setdefault(key, []).append(r["max_memory_reserved"])
        for record in records:
            if record.get("allocator") == "pytorch" and "snapshot" in record:
                rows.append(compare_snapshot(record, by_key, runs_of, args.data))
    else:
        print(f"compare: no {recorded_path}: only the bench traces are compared", file=sys.stderr)
    snapshot_of = {r["bench_trace"]: r["workload"] for r in rows if r["bench_trace"]}
    for path in sorted(glob.glob(os.path.join(args.traces, "*.trace"))):
        trace_rows.append(compare_trace(path, snapshot_of.get(os.path.basename(path))))

    print("Snapshots recorded on the GPU: PyTorch's allocator (model vs recorded) and streamalloc (plan vs real)")
    print(f"{'workload':<17} {'entries':>8} {'recorded GiB':>12} {'model GiB':>10} {'err %':>7} {'seg match %':>11}"
          f" {'sa plan/real GiB':>17} {'err %':>7} {'sa exp plan/real GiB':>21} {'err %':>7}")
    for r in rows:
        def pair(key):
            real = r.get(f"{key}_real_peak_reserved")
            if real is None:
                return f"{r[f'{key}_plan_peak_reserved'] / GiB:.3f}/-", "-"
            return (f"{r[f'{key}_plan_peak_reserved'] / GiB:.3f}/{real / GiB:.3f}",
                    f"{r[f'{key}_plan_error_pct']:+.2f}")
        sa, sa_err = pair("streamalloc")
        sx, sx_err = pair("streamalloc_expandable")
        print(f"{r['workload']:<17} {r['trace_entries']:>8} {r['torch_recorded_peak_reserved'] / GiB:>12.3f} "
              f"{r['model_peak_reserved'] / GiB:>10.3f} {r['model_peak_error_pct']:>+7.2f} "
              f"{r['segment_sequence_match_pct']:>11.1f} {sa:>17} {sa_err:>7} {sx:>21} {sx_err:>7}")
    own_rows = [r for r in rows if any(f"{k}_own_snapshot" in r for k in ("streamalloc", "streamalloc_expandable"))]
    if own_rows:
        print()
        print("streamalloc runs that recorded their own snapshot: the plan of that snapshot against the same run,")
        print("and against the nearest of every real run of the workload under the setting (runs: their range)")
        print(f"{'workload':<17} {'sa plan/real GiB':>17} {'err %':>7} {'runs GiB':>17} {'nearest %':>9}"
              f" {'sa exp plan/real GiB':>21} {'err %':>7} {'runs GiB':>17} {'nearest %':>9}")
        for r in own_rows:
            def own(key):
                if f"{key}_own_snapshot" not in r:
                    return "-", "-", "-", "-"
                planned, real = r[f"{key}_own_plan_peak_reserved"], r[f"{key}_own_real_peak_reserved"]
                runs = r.get(f"{key}_real_runs") or [real]
                spread = f"{min(runs) / GiB:.3f}-{max(runs) / GiB:.3f} ({len(runs)})"
                return (f"{planned / GiB:.3f}/{real / GiB:.3f}", f"{r[f'{key}_own_plan_error_pct']:+.2f}", spread,
                        f"{r[f'{key}_own_plan_nearest_error_pct']:+.2f}")
            sa = own("streamalloc")
            sx = own("streamalloc_expandable")
            print(f"{r['workload']:<17} {sa[0]:>17} {sa[1]:>7} {sa[2]:>17} {sa[3]:>9}"
                  f" {sx[0]:>21} {sx[1]:>7} {sx[2]:>17} {sx[3]:>9}")
    print()
    print("bench traces (no segment events, no completion points; peak reserved from their header;"
          " validated through the snapshot named)")
    print(f"{'trace':<26} {'events':>7} {'recorded GiB':>12} {'model GiB':>10} {'err %':>7}"
          f" {'model GiB, pending until OOM':>29} {'err %':>7}  snapshot")
    for r in trace_rows:
        rec = r["torch_recorded_peak_reserved"]
        err = f"{r['model_peak_error_pct']:+.2f}" if rec else "-"
        err2 = f"{r['model_oom_rule_peak_error_pct']:+.2f}" if rec else "-"
        rec_s = f"{rec / GiB:.3f}" if rec else "-"
        print(f"{r['trace']:<26} {r['events']:>7} {rec_s:>12} {r['model_peak_reserved'] / GiB:>10.3f} {err:>7}"
              f" {r['model_oom_rule_peak_reserved'] / GiB:>29.3f} {err2:>7}  {r['validated_by_snapshot'] or '-'}")
    with open(args.out, "w") as f:
        json.dump({"snapshots": rows, "bench_traces": trace_rows}, f, indent=1)
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

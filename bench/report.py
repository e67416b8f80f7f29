#!/usr/bin/env python3
"""Turn benchmark results into docs/benchmarks.md, its plots, and the README's headline table.

    python3 bench/report.py [--note=TEXT] [--readme=README.md] BENCH_JSON [EXTRA_JSON ...] OUT.md
    python3 bench/report.py [--note=TEXT] [--readme=README.md] --from=RUN_DIR [--from=RUN_DIR ...] OUT.md

The first form reads the files of a run that just happened (`make bench`). BENCH_JSON is
streamalloc_bench's Google Benchmark JSON (--benchmark_out=FILE --benchmark_out_format=json).
EXTRA_JSON files are recognised by their "kind": streamalloc_replay --json output (one per trace),
bench/studies/torch_empty.py --json output and bench/studies/fragmentation.py --json output.

The second form regenerates from stored runs without running anything (`make bench-report`). Each
RUN_DIR is a folder of bench/results named DATE-MACHINE-COMMIT; from it the report takes bench.json,
replay-*.json, torch_empty.json, fragmentation.json and inference_server*.md, each kind from the
first folder given that has it, and names that folder, its date and commit beside each table.

The page has the machine, the headline table, the targets (met / missed / not measured, with the
measured ratio), one table per scenario with ratios to PyTorch's native allocator (or to
cudaMallocAsync when native is absent; on the simulated device, absolute numbers only), and PNG plots
in img/ next to OUT.md (when matplotlib is installed). The headline table and its picture
(img/headline.png) also go into the README between the markers <!-- results:begin --> and
<!-- results:end -->: into --readme=PATH, or, when OUT.md is a repository's docs/benchmarks.md, into
that repository's README.md. --note=TEXT adds a paragraph under the machine table.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from collections import defaultdict

# Byte counts are written by the package's report module, as everywhere else in streamalloc's output.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "torch_plugin"))
from streamalloc.report import format_bytes  # noqa: E402  (needs neither torch nor the native library)

STREAMALLOC_PEERS = ("streamalloc", "streamalloc_cabi")
PEER_ORDER = ("streamalloc", "streamalloc_cabi", "torch_native", "cudaMallocAsync", "cudaMalloc")
IGNORED_NAME_PARTS = ("real_time", "manual_time")


# ---- reading ----

class Run:
    """One benchmark (one peer, one argument set), repetitions folded into their median."""

    def __init__(self, scenario, peer, device, args, row):
        self.scenario, self.peer, self.device, self.args, self.row = scenario, peer, device, args, row

    @property
    def peer_id(self):
        return f"{self.peer}@{self.device}"

    @property
    def ns_per_item(self):
        rate = self.row.get("items_per_second")
        return 1e9 / rate if rate else None

    def counter(self, name):
        value = self.row.get(name)
        return None if value is None else float(value)


def parse_name(run_name):
    parts = run_name.split("/")
    scenario, peer_id, args = parts[0], parts[1] if len(parts) > 1 else "?@?", {}
    for part in parts[2:]:
        if part in IGNORED_NAME_PARTS or part.startswith(("min_time:", "iterations:", "repeats:")):
            continue
        key, _, value = part.partition(":")
        args[key] = int(value) if value.lstrip("-").isdigit() else value
    peer, _, device = peer_id.partition("@")
    return scenario, peer, device, args


def load_bench(path):
    with open(path) as f:
        data = json.load(f)
    groups = defaultdict(list)
    medians, errors = {}, []
    for row in data.get("benchmarks", []):
        name = row.get("run_name", row["name"])
        if row.get("error_occurred") or row.get("skipped"):
            errors.append((row["name"], row.get("error_message") or row.get("skip_message") or "skipped"))
            continue
        if row.get("run_type") == "aggregate":
            if row.get("aggregate_name") == "median":
                medians[name] = row
        else:
            groups[name].append(row)
    runs = []
    for name in list(dict.fromkeys(list(groups) + list(medians))):
        row = medians.get(name) or fold(groups[name])
        scenario, peer, device, args = parse_name(name)
        runs.append(Run(scenario, peer, device, args, row))
    return data.get("context", {}), runs, errors


def fold(rows):
    """The median of each numeric field over repetitions reported without aggregates."""
    if len(rows) == 1:
        return rows[0]
    out = dict(rows[0])
    for key, value in rows[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in rows if key in r)
    return out


def load_extra(paths):
    replays, torch_empty, fragmentation = [], None, None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        kind = data.get("kind")
        if kind == "streamalloc_replay":
            replays.append(data)
        elif kind == "torch_empty":
            torch_empty = data
        elif kind == "fragmentation":
            fragmentation = data
        else:
            sys.exit(f"report: {path}: unknown result kind {kind!r} "
                     "(expected streamalloc_replay, torch_empty or fragmentation)")
    return replays, torch_empty, fragmentation


# ---- where each kind of result comes from ----

RUN_DIR_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-([A-Za-z0-9]+)-([0-9a-f]{7,40})$")


class Source:
    """Where one kind of result was read: a stored run folder (its date and commit from its name), or
    this run's build folder (the date from the results, the commit from git)."""

    def __init__(self, path, date, commit, stored):
        self.path, self.date, self.commit, self.stored = path, date, commit, stored

    def describe(self, gpu):
        where = f"`{self.path}`" if self.stored else "this run"
        return f"{gpu or 'unknown machine'}, {self.date or 'date unknown'}, commit {self.commit or 'unknown'} ({where})"


def stored_source(run_dir):
    name = os.path.basename(os.path.normpath(run_dir))
    match = RUN_DIR_NAME.match(name)
    if not match:
        sys.exit(f"report: {run_dir}: a stored run folder is named DATE-MACHINE-COMMIT (e.g. 2026-12-03-h200-c617b95)")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(os.path.abspath(run_dir), repo)
    return Source(rel if not rel.startswith("..") else name, match.group(1), match.group(3), True)


def this_run_source(date):
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except OSError:
        commit = ""
    return Source("", (date or "")[:10], commit, False)


def collect_stored(run_dirs):
    """{kind: (paths, Source)} over the run folders, each kind from the first folder that has it."""
    found = {}
    for run_dir in run_dirs:
        if not os.path.isdir(run_dir):
            sys.exit(f"report: {run_dir}: no such folder")
        source = stored_source(run_dir)
        names = sorted(os.listdir(run_dir))
        kinds = {"bench": [n for n in names if n == "bench.json"],
                 "replay": [n for n in names if n.startswith("replay-") and n.endswith(".json")],
                 "torch_empty": [n for n in names if n == "torch_empty.json"],
                 "fragmentation": [n for n in names if n == "fragmentation.json"],
                 "inference": [n for n in names if n.startswith("inference_server") and n.endswith(".md")],
                 "inference_json": [n for n in names if n.startswith("inference_server") and n.endswith(".json")],
                 "soak": [n for n in names if n.startswith("soak") and n.endswith(".json")],
                 "detection_rate": [n for n in names if n.startswith("detection_rate") and n.endswith(".md")][-1:],
                 "audit_overhead": [n for n in names if n == "audit_overhead.md"],
                 **{f"suite:{name}": [name] for name in SUITE_FILES if name in names}}
        for kind, files in kinds.items():
            if files and kind not in found:
                found[kind] = ([os.path.join(run_dir, n) for n in files], source)
    if "bench" not in found:
        sys.exit("report: none of the --from folders has a bench.json")
    return found


# ---- formatting ----

def fmt_ns(value):
    return "n/a" if value is None else f"{value:,.1f}"


def fmt_bytes(value):
    return "n/a" if value is None or value < 0 else format_bytes(value)


def fmt_ratio(value):
    return "n/a" if value is None else f"{value:.3f}x"


def fmt_arg(key, value):
    return fmt_bytes(value) if key == "bytes" else str(value)


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def ordered_peers(runs):
    ids = {r.peer_id: r.peer for r in runs}
    return sorted(ids, key=lambda i: (PEER_ORDER.index(ids[i]) if ids[i] in PEER_ORDER else 99, i))


def reference_peer(runs):
    """The peer ratios are taken against: PyTorch native, else cudaMallocAsync, else none (sim)."""
    for name in ("torch_native", "cudaMallocAsync"):
        for r in runs:
            if r.peer == name:
                return r.peer_id
    return None


def by_args(runs, scenario):
    """{args tuple: {peer_id: Run}} for one scenario, in argument order."""
    out = defaultdict(dict)
    for r in runs:
        if r.scenario == scenario:
            out[tuple(sorted(r.args.items()))][r.peer_id] = r
    return dict(sorted(out.items()))


# ---- sections ----

def machine_section(context, bench_path):
    keys = [("host", context.get("host_name")), ("date", context.get("date")),
            ("CPUs", f"{context.get('num_cpus')} x {context.get('mhz_per_cpu')} MHz"),
            ("GPU", context.get("gpu_name", "none")), ("GPU memory", fmt_bytes(int(context["gpu_memory_bytes"]))
                                                         if "gpu_memory_bytes" in context else "n/a"),
            ("CUDA runtime / driver", f"{context.get('cuda_runtime', 'n/a')} / {context.get('cuda_driver', 'n/a')}"),
            ("torch (LibTorch peer)", context.get("torch", "n/a")),
            ("peers in this run", context.get("peers", "n/a")),
            ("peers missing", context.get("peers_missing", "n/a")),
            ("streamalloc options", context.get("streamalloc_conf") or "defaults"),
            ("run mode", context.get("mode", "n/a")),
            ("results file", os.path.basename(bench_path))]
    return "## Machine\n\n" + table(["", ""], [(k, v) for k, v in keys]) + "\n"


def scenario_section(runs, scenario, title, what, reference, extra_counters=()):
    """One row per (arguments, peer): time per item, its ratio to the reference peer, counters."""
    groups = by_args(runs, scenario)
    if not groups:
        return ""
    peers = ordered_peers([r for g in groups.values() for r in g.values()])
    arg_keys = [k for k, _ in next(iter(groups))]
    header = arg_keys + ["peer", "ns/op"]
    if reference:
        header.append(f"vs {reference.split('@')[0]}")
    header += [label for _, label, _ in extra_counters]
    rows = []
    for args, row_runs in groups.items():
        ref = row_runs.get(reference) if reference else None
        for p in peers:
            run = row_runs.get(p)
            if run is None:
                continue
            row = [fmt_arg(k, v) for k, v in args] + [p, fmt_ns(run.ns_per_item)]
            if reference:
                ok = ref is not None and ref.ns_per_item and run.ns_per_item
                row.append(fmt_ratio(run.ns_per_item / ref.ns_per_item) if ok else "n/a")
            row += [fmt(run.counter(counter)) for counter, _, fmt in extra_counters]
            rows.append(row)
    return f"## {title}\n\n{what}\n\n" + table(header, rows) + "\n"


def threads_section(runs):
    groups = by_args(runs, "threads")
    if not groups:
        return ""
    peers = ordered_peers([r for g in groups.values() for r in g.values()])
    single = {p: groups.get((("threads", 1),), {}).get(p) for p in peers}
    header = ["threads"] + [f"{p} Mpairs/s" for p in peers] + [f"{p} vs 1 thread" for p in peers]
    rows = []
    for args, row_runs in groups.items():
        row = [dict(args)["threads"]]
        rates = {p: row_runs[p].row.get("items_per_second") if p in row_runs else None for p in peers}
        row += ["n/a" if rates[p] is None else f"{rates[p] / 1e6:.2f}" for p in peers]
        for p in peers:
            base = single.get(p) and single[p].row.get("items_per_second")
            row.append(fmt_ratio(rates[p] / base) if rates[p] and base else "n/a")
        rows.append(row)
    return ("## threads: aggregate throughput\n\nEach thread has its own stream and does alloc+free pairs "
            "(512 B .. 1 MiB) on one shared allocator; throughput is all threads' pairs over wall time.\n\n"
            + table(header, rows) + "\n")


def replay_section(replays):
    if not replays:
        return ""
    out = ["## Trace replay\n",
           ("Each trace replayed from an empty cache; time is the median over repeats, peaks are the first "
            "replay's. `native (recorded)` is PyTorch's native allocator in the recorded run (trace header).\n")]
    for rep in replays:
        header = rep.get("header", {})
        native = int(header["native_peak_reserved"]) if "native_peak_reserved" in header else None
        native_alloc = int(header["native_peak_allocated"]) if "native_peak_allocated" in header else None
        out.append(f"### {header.get('workload', rep['trace'])}\n")
        out.append(f"`{rep['trace']}`: {rep['ops']} ops ({rep['allocs']} allocs, {rep['frees']} frees, "
                   f"{rep['record_streams']} record_stream), {rep['streams']} streams"
                   + (f", {rep['live_at_end']} blocks never freed" if rep.get("live_at_end") else "")
                   + (f"; recorded on {header['gpu'].replace('_', ' ')}" if "gpu" in header else "") + ".\n")
        rows = []
        if native is not None:
            rows.append(["native (recorded)", "", "n/a", fmt_bytes(native), fmt_bytes(native_alloc), "1.000x"])
        for r in rep["results"]:
            if "error" in r:
                rows.append([r["peer"], r["device"], "failed: " + r["error"], "", "", ""])
                continue
            if "skipped" in r:  # a peer this build cannot run (streamalloc_replay says why)
                rows.append([r["peer"], r["device"], "not run: " + r["skipped"], "", "", ""])
                continue
            vs = fmt_ratio(r["peak_reserved"] / native) if native else "n/a"
            rows.append([r["peer"], r["device"], fmt_ns(r["ns_per_op_median"]), fmt_bytes(r["peak_reserved"]),
                         fmt_bytes(r["peak_allocated"]), vs])
        out.append(table(["peer", "device", "ns/op", "peak reserved", "peak allocated", "reserved vs native"], rows)
                   + "\n")
    return "\n".join(out)


def torch_empty_section(data):
    if not data:
        return ""
    if "skipped" in data:
        return f"## torch.empty + free through PyTorch\n\nSkipped: {data['skipped']}.\n"
    results = data["results"]
    out = [(f"## torch.empty + free through PyTorch\n\nOn {data['gpu']}, torch {data['torch']}; each allocator in "
            f"its own process; ns per pair, median of {data['repeats']} runs (bench/studies/torch_empty.py).\n")]
    for loop in ("cpp", "python"):
        sizes = sorted({int(n) for r in results.values() for n in r.get(loop, {})})
        if not sizes:
            continue
        rows = []
        for n in sizes:
            native = results.get("native", {}).get(loop, {}).get(str(n))
            ours = results.get("streamalloc", {}).get(loop, {}).get(str(n))
            rows.append([fmt_bytes(n), fmt_ns(native), fmt_ns(ours),
                         fmt_ratio(ours / native) if native and ours else "n/a"])
        name = "at::empty C++ loop" if loop == "cpp" else "torch.empty Python loop"
        out.append(f"{name}:\n\n"
                   + table(["bytes", "native ns", "streamalloc ns", "streamalloc / native"], rows) + "\n")
    for peer, r in results.items():
        if "error" in r:
            out.append(f"- {peer}: failed: {r['error']}")
        if "cpp_error" in r:
            out.append(f"- {peer}: C++ loop unavailable: {r['cpp_error']}")
    return "\n".join(out) + "\n"


# ---- targets ----

def worst_ratio(runs, scenario, mine, ref):
    groups = by_args(runs, scenario)
    ratios = []
    for row_runs in groups.values():
        a, b = row_runs.get(mine), row_runs.get(ref)
        if a and b and a.ns_per_item and b.ns_per_item:
            ratios.append((a.ns_per_item / b.ns_per_item, a.args))
    return max(ratios, key=lambda x: x[0]) if ratios else None


def pick(runs, names):
    present = {r.peer_id for r in runs}
    for name in names:
        for pid in sorted(present):
            if pid.split("@")[0] == name:
                return pid
    return None


def targets_section(context, runs, replays, torch_empty):
    native = pick(runs, ["torch_native"])
    ours = pick(runs, ["streamalloc_cabi", "streamalloc"])
    device = ours.split("@")[1] if ours else "?"
    note = "" if device == "cuda" else " (simulated device: the targets are defined for an H200)"
    rows = []

    def verdict(value, goal, lower_is_better):
        if value is None:
            return "not measured"
        ok = value <= goal if lower_is_better else value >= goal
        return ("met" if ok else "**missed**") + note

    def ratio_target(label, scenario, goal):
        if not (native and ours):
            reason = "needs torch_native (LibTorch build + GPU) in the same run"
            rows.append([label, f"<= {goal}x native", "n/a", "not measured: " + reason])
            return
        worst = worst_ratio(runs, scenario, ours, native)
        if worst is None:
            rows.append([label, f"<= {goal}x native", "n/a", "not measured: scenario missing"])
            return
        ratio, args = worst
        where = ", ".join(f"{k} {fmt_arg(k, v)}" for k, v in args.items())
        rows.append([label, f"<= {goal}x native", f"{ratio:.3f}x (worst case: {where}; {ours})",
                     verdict(ratio, goal, True)])

    ratio_target("same-stream cached alloc+free pair, C ABI", "same_stream", 0.15)

    label = "at::empty + free through PyTorch"
    if torch_empty and "skipped" in torch_empty:
        rows.append([label, "<= 0.85x native", "n/a", "not measured: " + torch_empty["skipped"]])
    elif torch_empty:
        res = torch_empty["results"]
        loop = "cpp" if "cpp" in res.get("native", {}) and "cpp" in res.get("streamalloc", {}) else "python"
        ratios = [(res["streamalloc"][loop][n] / res["native"][loop][n], n)
                  for n in res.get("native", {}).get(loop, {}) if n in res.get("streamalloc", {}).get(loop, {})]
        if ratios:
            ratio, n = max(ratios)
            loop_name = "C++ at::empty loop" if loop == "cpp" else "Python torch.empty loop (C++ loop unavailable)"
            rows.append([label, "<= 0.85x native", f"{ratio:.3f}x (worst: {fmt_bytes(int(n))}; {loop_name})",
                         "met" if ratio <= 0.85 else "**missed**"])
        else:
            rows.append([label, "<= 0.85x native", "n/a", "not measured: torch_empty.py failed (see below)"])
    else:
        rows.append([label, "<= 0.85x native", "n/a",
                     "not measured: run bench/studies/torch_empty.py --json (needs a GPU)"])

    ratio_target("cross-stream pair with record_stream, C ABI", "cross_stream", 0.5)

    label = "8 threads on 8 streams vs 1 thread"
    groups = by_args(runs, "threads")
    one, eight = groups.get((("threads", 1),), {}).get(ours), groups.get((("threads", 8),), {}).get(ours)
    cores = int(context.get("hardware_threads") or context.get("num_cpus") or 0)
    if one and eight and one.row.get("items_per_second") and eight.row.get("items_per_second"):
        scale = eight.row["items_per_second"] / one.row["items_per_second"]
        status = (verdict(scale, 4.0, False) if cores >= 8 else
                  f"not measured: this machine has {cores} hardware threads, 8 threads cannot run at once")
        rows.append([label, ">= 4x", f"{scale:.2f}x ({ours})", status])
    else:
        rows.append([label, ">= 4x", "n/a", "not measured: threads scenario missing"])

    label = "32-stream cycling peak reserved vs single stream"
    run32 = by_args(runs, "many_streams").get((("streams", 32),), {}).get(ours)
    value = run32.counter("reserved_vs_single_stream") if run32 else None
    rows.append([label, "<= 2x", "n/a" if value is None else f"{value:.2f}x ({ours})", verdict(value, 2.0, True)])

    label = "replayed trace peak reserved vs native"
    checked, failed, unrecorded = [], [], []
    for rep in replays:
        name = rep.get("header", {}).get("workload", rep["trace"])
        native_peak = rep.get("header", {}).get("native_peak_reserved")
        mine = [r for r in rep["results"] if r["peer"] in STREAMALLOC_PEERS and "error" not in r and "skipped" not in r]
        if native_peak is None or not mine:
            unrecorded.append(name)
            continue
        ratio = max(r["peak_reserved"] for r in mine) / int(native_peak)
        checked.append(f"{name} {ratio:.3f}x")
        if ratio > 1:
            failed.append(name)
    if checked:
        status = ("met" if not failed else "**missed** (" + ", ".join(failed) + ")")
        status += "" if all(r["results"][0]["device"] == "cuda" for r in replays if r["results"]) else note
        rows.append([label, "<= 1x", "; ".join(checked), status])
    else:
        why = "no trace with a native recording was replayed" + (f" ({', '.join(unrecorded)} has none)"
                                                                  if unrecorded else "")
        rows.append([label, "<= 1x", "n/a", "not measured: " + why])
    return ("## Targets\n\n" + table(["target", "goal", "measured", "status"], rows)
            + "\n\nWhat each target means and what was tried against the missed ones: "
              "[decisions.md](decisions.md).\n")


# ---- plots ----

def make_plots(runs, replays, img_dir):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots not generated: matplotlib is not installed (pip install matplotlib)"
    os.makedirs(img_dir, exist_ok=True)
    written = []

    def save(fig, name, title):
        path = os.path.join(img_dir, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append((name, title))

    def line_plot(scenario, key, xlabel, ylabel, value, name, title, logy=True):
        groups = by_args(runs, scenario)
        if not groups:
            return
        fig, ax = plt.subplots(figsize=(9, 4))
        for peer in ordered_peers([r for g in groups.values() for r in g.values()]):
            points = [(dict(a)[key], value(g[peer])) for a, g in groups.items() if peer in g and value(g[peer])]
            if points:
                ax.plot(*zip(*points), marker="o", label=peer)
        ax.set_xscale("log", base=2)
        xs = sorted({dict(a)[key] for a in groups})
        ax.set_xticks(xs)
        ax.set_xticklabels([fmt_arg(key, x).replace(".00 ", " ") for x in xs], fontsize=8)
        ax.minorticks_off()
        values = [v for line in ax.get_lines() for v in line.get_ydata() if v > 0]
        if logy and values and max(values) / min(values) > 20:  # peers orders of magnitude apart
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        save(fig, name, title)

    line_plot("same_stream", "bytes", "bytes", "ns per alloc+free pair", lambda r: r.ns_per_item,
              "bench_same_stream.png", "same stream, cached alloc+free")
    line_plot("threads", "threads", "threads (one stream each)", "million pairs / s",
              lambda r: (r.row.get("items_per_second") or 0) / 1e6, "bench_threads.png",
              "aggregate throughput", logy=False)

    def bar_plot(categories, series, ylabel, name, title):
        """One group of bars per category, one bar per series (label -> a value per category)."""
        fig, ax = plt.subplots(figsize=(9, 4))
        width = 0.8 / max(1, len(series))
        for i, (label, ys) in enumerate(series.items()):
            ax.bar([j + i * width for j in range(len(categories))], ys, width, label=label)
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(categories))])
        ax.set_xticklabels(categories, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        save(fig, name, title)

    for scenario, title, key in (("cross_stream", "alloc + record_stream + free", "bytes"),
                                 ("mixed_sizes", "random alloc/free, many live blocks", "max_live")):
        groups = by_args(runs, scenario)
        if groups:
            peers = ordered_peers([r for g in groups.values() for r in g.values()])
            bar_plot([f"{key} {fmt_arg(key, dict(a)[key])}" for a in groups],
                     {peer: [g[peer].ns_per_item if peer in g else 0 for g in groups.values()] for peer in peers},
                     "ns per op", f"bench_{scenario}.png", title)

    groups = by_args(runs, "many_streams")
    if groups:
        peers = ordered_peers([r for g in groups.values() for r in g.values()])
        bar_plot(peers,
                 {f"{dict(a)['streams']} stream(s)": [(g[p].counter("peak_reserved") or 0) / 2**20 if p in g else 0
                                                      for p in peers] for a, g in groups.items()},
                 "peak reserved (MiB)", "bench_many_streams.png", "streams taking turns: peak reserved")

    if replays:
        names = [r.get("header", {}).get("workload", os.path.basename(r["trace"])) for r in replays]
        series = defaultdict(list)
        for rep in replays:
            native = rep.get("header", {}).get("native_peak_reserved")
            series["native (recorded)"].append(int(native) / 2**20 if native is not None else 0)
            peaks = {f"{r['peer']}@{r['device']}": r.get("peak_reserved", 0) / 2**20 for r in rep["results"]}
            for key in {f"{r['peer']}@{r['device']}" for rp in replays for r in rp["results"]}:
                series[key].append(peaks.get(key, 0))
        bar_plot(names, dict(sorted(series.items())), "peak reserved (MiB)", "bench_replay.png",
                 "trace replay: peak reserved")
    return written, None


# ---- the headline (the README's table and picture) ----

HEADLINE_PEERS = (("streamalloc (C ABI)", "streamalloc_cabi"), ("PyTorch native", "torch_native"),
                  ("cudaMallocAsync", "cudaMallocAsync"), ("RMM pool", "rmm_pool"))
README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"
HEADLINE_IMG = "headline.png"
TRACE_ORDER = ("gpt2", "resnet50", "multistream", "synthetic_pipeline")


class HeadlineRow:
    """One measured quantity for each headline peer. values: peer -> number or None (not measured).
    lower_is_better says which way the ratio to native goes; cost(value) turns a value into what the
    picture draws relative to native (a time or an amount of memory: lower is better)."""

    def __init__(self, label, values, fmt, lower_is_better=True, source=""):
        self.label, self.values, self.fmt = label, values, fmt
        self.lower_is_better, self.source = lower_is_better, source

    def cost_vs_native(self, peer):
        mine, native = self.values.get(peer), self.values.get("torch_native")
        if mine is None or not native:
            return None
        return mine / native if self.lower_is_better else native / mine


def load_inference(paths):
    """bench/studies/inference_server.py --json output: one JSON object per line (model, threads, allocator)."""
    results = []
    for path in paths:
        with open(path) as f:
            results += [json.loads(line) for line in f if line.strip()]
    return results


# The program row of the headline: the LibTorch server at its most threads, where a contended allocator shows.
HEADLINE_SERVER = ("conv", 16)


def headline_rows(runs, replays, fragmentation, sources, inference=()):
    rows = []

    def bench_value(scenario, args, peer, value):
        for r in runs:
            if r.scenario == scenario and r.peer == peer and r.device == "cuda" and r.args == args:
                return value(r)
        return None

    def bench_row(label, scenario, args, value, fmt, lower_is_better=True):
        values = {p: bench_value(scenario, args, p, value) for _, p in HEADLINE_PEERS}
        if any(v is not None for v in values.values()):
            rows.append(HeadlineRow(label, values, fmt, lower_is_better, "bench"))

    ns = lambda r: r.ns_per_item  # noqa: E731
    bench_row("cached alloc+free on one stream, 4 KiB (ns)", "same_stream", {"bytes": 4096}, ns, fmt_int)
    bench_row("alloc + record_stream + free, 1 MiB (ns)", "cross_stream", {"bytes": 1 << 20}, ns, fmt_int)
    bench_row("8 threads, a stream each: alloc+free pairs (M/s)", "threads", {"threads": 8},
              lambda r: (r.row.get("items_per_second") or 0) / 1e6 or None, fmt_mrate, lower_is_better=False)

    by_name = {rep.get("header", {}).get("workload", os.path.basename(rep["trace"])): rep for rep in replays}
    for name in sorted(by_name, key=lambda n: (TRACE_ORDER.index(n) if n in TRACE_ORDER else 99, n)):
        rep = by_name[name]
        values = {}
        for _, peer in HEADLINE_PEERS:
            hits = [r for r in rep["results"] if r["peer"] == peer and r.get("device") == "cuda"
                    and "error" not in r and "skipped" not in r and r.get("peak_reserved", -1) >= 0]
            values[peer] = hits[0]["peak_reserved"] if hits else None
        if any(v is not None for v in values.values()):
            rows.append(HeadlineRow(f"peak reserved, replayed {name} trace", values, fmt_bytes, True, "replay"))

    model, threads = HEADLINE_SERVER
    # Where several runs measured the cell, the longest (repetitions x seconds) counts.
    cells = sorted((r for r in inference if r.get("model") == model and r.get("threads") == threads),
                   key=lambda r: r.get("reps", 1) * r.get("duration_s", 0))
    served = {r["allocator"]: r["requests_per_s"] for r in cells}
    if served:
        # The server runs streamalloc through its LibTorch plugin; its column is streamalloc's.
        values = {"streamalloc_cabi": served.get("streamalloc"), "torch_native": served.get("native")}
        rows.append(HeadlineRow(f"LibTorch inference server ({model}), {threads} threads, a stream each (requests/s)",
                                values, fmt_int, False, "inference"))

    if fragmentation:
        peaks = fragmentation.get("peaks", {})
        names = {"streamalloc_cabi": "streamalloc", "torch_native": "native"}
        values = {p: (peaks.get(names.get(p, ""), {}).get("ms_per_step_median")
                      if not peaks.get(names.get(p, ""), {}).get("oom") else None) for _, p in HEADLINE_PEERS}
        if any(v is not None for v in values.values()):
            rows.append(HeadlineRow("GPT-2 training, random sequence lengths (ms/step)", values, fmt_ms, True,
                                    "fragmentation"))
    return rows


def fmt_int(value):
    return f"{value:,.0f}"


def fmt_mrate(value):
    return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


def fmt_ms(value):
    return f"{value:,.1f}"


def headline_table(rows):
    header = ["H200"] + [name for name, _ in HEADLINE_PEERS]
    out = []
    for row in rows:
        cells = [row.label]
        for _, peer in HEADLINE_PEERS:
            value = row.values.get(peer)
            if value is None:
                cells.append("—")
                continue
            text = row.fmt(value)
            native = row.values.get("torch_native")
            if peer != "torch_native" and native:
                ratio = value / native
                text += f" ({ratio:.2f}x)" if ratio < 10 else f" ({ratio:.0f}x)"
            cells.append(text)
        out.append(cells)
    return table(header, out)


def headline_sources(rows, sources, gpus):
    what = {"bench": "pairs and threads (medians of the interleaved repetitions)",
            "replay": "replayed traces (peak reserved of the first replay)",
            "fragmentation": "training (bench/studies/fragmentation.py, median ms/step of one run)",
            "inference": "inference server (bench/studies/inference_server.py, medians of the repetitions)"}
    lines = []
    for kind in ("bench", "replay", "inference", "fragmentation"):
        if any(r.source == kind for r in rows) and kind in sources:
            lines.append(f"{what[kind]}: {sources[kind].describe(gpus.get(kind))}")
    return lines


def headline_block(rows, sources, gpus, page_link, img_link):
    """The README's block: the table, where each row comes from, the picture. A pure function of the
    results, so that a test can regenerate it from stored runs and compare."""
    if not rows:
        return ("No GPU results in this run: the headline needs streamalloc_bench on a GPU with its peers "
                "(`make bench`).")
    note = ("In brackets: the ratio to PyTorch's native allocator in the same run (time and memory: lower is "
            "better; pairs per second: higher is better). — : not measured for that allocator. Sources: "
            + "; ".join(headline_sources(rows, sources, gpus)) + f". Every table: [{page_link}]({page_link}).")
    return ("\n".join([
        headline_table(rows),
        "",
        textwrap.fill(note, width=110, break_long_words=False, break_on_hyphens=False),
        "",
        f"![streamalloc, cudaMallocAsync and RMM relative to PyTorch's native allocator]({img_link})",
    ]))


def headline_plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    peers = [(name, p) for name, p in HEADLINE_PEERS if p != "torch_native"]
    labels = [r.label for r in rows]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.4))
    height = 0.8 / len(peers)
    for i, (name, peer) in enumerate(peers):
        ys = [j + (i - (len(peers) - 1) / 2) * height for j in range(len(rows))]
        xs = [r.cost_vs_native(peer) for r in rows]
        ax.barh([y for y, x in zip(ys, xs) if x is not None], [x for x in xs if x is not None], height,
                label=name)
    ax.axvline(1.0, color="black", linewidth=1, label="PyTorch native = 1")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time or memory relative to PyTorch's native allocator (log scale; left of 1 is better)")
    ax.set_title("H200, relative to PyTorch's native allocator (rates drawn as time per pair or request)", fontsize=10)
    ax.grid(True, axis="x", which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return True


def replace_block(text, block):
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"no {README_BEGIN} ... {README_END} markers")
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return head + README_BEGIN + "\n" + block + "\n" + README_END + tail


def readme_block(text):
    """The generated block between the markers, as replace_block writes it."""
    head, rest = text.split(README_BEGIN, 1)
    return rest.split(README_END, 1)[0].strip("\n")


# Test logs a stored run may hold, and the line of each that says how it ended.
SUITE_FILES = {
    "gpu_tests.txt": ("the GPU suite (streamalloc_gpu_tests)", re.compile(r"\[  PASSED  \] (\d+ tests?)")),
    "ctest_gpu_summary.txt": ("ctest, GPU and benchmark tests",
                              re.compile(r"(\d+% tests passed(?:, \d+ tests? failed)? out of \d+)")),
    "memcheck_summary.txt": ("compute-sanitizer memcheck", re.compile(r"(ERROR SUMMARY: \d+ errors?)")),
}


def soak_section(paths, source):
    """streamalloc_soak --json summaries: every byte a consumer read checked, then a leak check."""
    if not paths:
        return ""
    rows = []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        conf = "expandable_segments:true" if "expandable_segments:true" in d.get("options", "") else "defaults"
        end = d.get("end", {})
        left = [fmt_bytes(end.get(k, 0)) for k in ("allocated_bytes", "pending_bytes",
                                                   "reserved_bytes_after_empty_cache")]
        rows.append([os.path.basename(path), d.get("backend"), conf, f"{d.get('seconds', 0):.0f} s",
                     d.get("stream_pairs"), f"{d.get('iterations', 0):,}", f"{d.get('allocations', 0):,}",
                     f"{d.get('checks', 0):,}", f"{d.get('checks_wrong', 0):,}", " / ".join(left),
                     "pass" if d.get("pass") else "**FAIL**"])
    return (f"## Soak\n\n{source}. The prefetch pipeline with random sizes (512 B to 64 MiB) on several "
            "stream pairs, every byte a consumer reads checked, then everything freed and `empty_cache()` "
            "(`make gpu-soak`).\n\n"
            + table(["file", "backend", "options", "time", "stream pairs", "iterations", "allocations",
                     "checks", "wrong", "left: allocated / pending / reserved", "result"], rows) + "\n")


def suites_section(entries):
    """entries: (path, source text) of the test logs, each the newest of its name among the runs."""
    if not entries:
        return ""
    rows = []
    for path, source in entries:
        what, pattern = SUITE_FILES[os.path.basename(path)]
        with open(path, errors="replace") as f:
            found = pattern.findall(f.read())
        result = "; then ".join(("passed: " + x if x[0].isdigit() and "%" not in x else x) for x in found)
        rows.append([what, result or "no summary line", source])
    return ("## Test runs on the GPU\n\nThe summary lines of each suite's log in the stored runs, in order "
            "(a rerun follows its run).\n\n"
            + table(["suite", "result", "run"], rows) + "\n")


def fragmentation_section(data, source):
    if not data:
        return ""
    setup = data.get("setup", {})
    out = [f"## Training: GPT-2 with random sequence lengths\n\n{source}. bench/studies/fragmentation.py: "
           f"{setup.get('layers')} layers, {setup.get('precision')}, sequence length uniform in "
           f"[{setup.get('seq_min')}, {setup.get('seq_max')}] per step; one process per allocator.\n"]
    rows = []
    for name, r in data.get("peaks", {}).items():
        if r.get("oom"):
            rows.append([name, "OOM", "", "", ""])
            continue
        ratio = r["peak_reserved"] / r["peak_allocated"] if r.get("peak_allocated") else None
        rows.append([name, fmt_bytes(r["peak_reserved"]), fmt_bytes(r["peak_allocated"]),
                     "n/a" if ratio is None else f"{ratio:.3f}", fmt_ms(r["ms_per_step_median"])])
    out.append(f"Batch {setup.get('batch')}, {setup.get('steps')} steps ({setup.get('warmup')} untimed):\n\n"
               + table(["allocator", "peak reserved", "peak allocated", "reserved / allocated", "ms/step (median)"],
                       rows) + "\n")
    rows = [[name, r.get("largest"), "yes" if r.get("at_least") else ""]
            for name, r in data.get("max_batch", {}).items()]
    if rows:
        out.append(f"Largest batch that trains under a cap of {setup.get('cap_gib')} GiB "
                   f"({setup.get('cap_steps')} steps per trial, bisection):\n\n"
                   + table(["allocator", "largest batch", "at least (bracket end reached)"], rows) + "\n")
    return "\n".join(out)


def inference_section(paths, source, title="Inference server"):
    """A study's own markdown (its --markdown output: inference_server.py, detection_rate.py,
    audit_overhead.py), under a heading of the page, its own headings demoted."""
    if not paths:
        return ""
    out = [f"## {title}\n\n{source}.\n"]
    for path in paths:
        with open(path) as f:
            lines = f.read().strip().splitlines()
        body = [("##" + line if line.startswith("#") else line) for line in lines]
        if body and body[0].startswith("###"):
            body[0] = "### " + os.path.basename(path)[:-3] + ": " + body[0].lstrip("# ")
        out.append("\n".join(body) + "\n")
    return "\n".join(out)


# ---- main ----

def default_readme(out_path):
    """README.md of the repository whose docs/benchmarks.md is written, else None."""
    out_abs = os.path.abspath(out_path)
    docs = os.path.dirname(out_abs)
    if os.path.basename(out_abs) != "benchmarks.md" or os.path.basename(docs) != "docs":
        return None
    readme = os.path.join(os.path.dirname(docs), "README.md")
    return readme if os.path.isfile(readme) else None


def main(argv):
    notes = [a[len("--note="):] for a in argv[1:] if a.startswith("--note=")]
    run_dirs = [a[len("--from="):] for a in argv[1:] if a.startswith("--from=")]
    readmes = [a[len("--readme="):] for a in argv[1:] if a.startswith("--readme=")]
    args = [a for a in argv[1:] if not a.startswith(("--note=", "--from=", "--readme="))]
    if not args or args[0] in ("-h", "--help") or (not run_dirs and len(args) < 2):
        print(__doc__)
        return 0 if args and args[0] in ("-h", "--help") else 2
    out_path = args[-1]
    if not out_path.endswith(".md"):
        sys.exit(f"report: the last argument must be the markdown file to write (got {out_path!r})")
    if run_dirs:
        if len(args) != 1:
            sys.exit("report: with --from, the only other argument is the markdown file to write")
        found = collect_stored(run_dirs)
        bench_path = found["bench"][0][0]
        extra_paths = [p for kind in ("replay", "torch_empty", "fragmentation") for p in found.get(kind, ([], None))[0]]
        sources = {kind: src for kind, (_, src) in found.items()}
        inference_paths, inference_src = found.get("inference", ([], None))
    else:
        bench_path, extra_paths = args[0], args[1:-1]
        inference_paths, inference_src, sources = [], None, {}
    context, runs, errors = load_bench(bench_path)
    replays, torch_empty, fragmentation = load_extra(extra_paths)
    if not run_dirs:
        here = this_run_source(context.get("date"))
        sources = {"bench": here, "replay": here, "torch_empty": here, "fragmentation": here}
    gpus = {"bench": context.get("gpu_name") or f"no GPU (host {context.get('host_name', 'unknown')})",
            "replay": next((r.get("context", {}).get("gpu_name") for r in replays if r.get("context")), None),
            "torch_empty": (torch_empty or {}).get("gpu"), "fragmentation": (fragmentation or {}).get("gpu")}
    reference = reference_peer(runs)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    img_dir = os.path.join(out_dir, "img")
    plots, plot_note = make_plots(runs, replays, img_dir)
    inference = load_inference(found.get("inference_json", ([], None))[0]) if run_dirs else []
    gpus["inference"] = next((r.get("gpu") for r in inference if r.get("gpu")), None)
    rows = headline_rows(runs, replays, fragmentation, sources, inference)
    headline_drawn = bool(rows) and headline_plot(rows, os.path.join(img_dir, HEADLINE_IMG))

    def stored(kind):
        paths, source = found.get(kind, ([], None)) if run_dirs else ([], None)
        return paths, (source.describe(gpus["bench"]) if source else "")

    def src(kind):
        return (sources[kind].describe(gpus.get(kind, gpus["bench"])) if kind in sources
                else "source unknown")

    ref_note = (f"Ratios are to `{reference}` measured in the same run (below 1 is better for time)."
                if reference else "No GPU peer in this run (simulated device): absolute numbers only; "
                                  "the simulated device measures streamalloc's own bookkeeping, not a GPU.")
    regenerate = ("`make bench-report` (from the stored runs named below)" if run_dirs
                  else "`make bench` (runs the benchmarks)")
    sections = [
        "# Benchmarks\n",
        "Generated by `bench/report.py`; do not edit by hand. Regenerate with " + regenerate
        + "; docs/benchmarking.md says what each scenario measures and how to reproduce each number. "
        + ref_note + "\n",
        f"Scenarios and threads: {src('bench')}.\n",
        machine_section(context, bench_path),
        "".join(f"**Note.** {note}\n\n" for note in notes),
        "## Headline\n\n" + (headline_table(rows) if rows else "No GPU results in this run.")
        + ("\n\n![headline](img/" + HEADLINE_IMG + ")" if headline_drawn or (rows and run_dirs) else "") + "\n",
        targets_section(context, runs, replays, torch_empty),
        scenario_section(runs, "same_stream", "same_stream: cached alloc+free pair",
                         "ns per alloc+free pair on one stream, after a warm-up pair.", reference),
        scenario_section(runs, "cross_stream", "cross_stream: alloc, record_stream, free",
                         "ns per alloc + record_stream(other stream) + free: the prefetch pipeline's pattern.",
                         reference,
                         (("peak_reserved", "peak reserved", fmt_bytes),)),
        scenario_section(runs, "mixed_sizes", "mixed_sizes: random alloc/free, many live blocks",
                         "ns per alloc or free; sizes log-uniform 1 KiB .. 4 MiB, up to `max_live` live blocks.",
                         reference, (("peak_reserved", "peak reserved", fmt_bytes),
                                     ("reserved_per_allocated", "reserved/allocated", fmt_ratio))),
        scenario_section(runs, "many_streams", "many_streams: streams taking turns",
                         "ns per alloc+free pair; each turn one stream allocates a ~48 MiB working set and "
                         "frees it. Peak reserved of this run, of the same turns on one stream, and their ratio.",
                         reference, (("peak_reserved", "peak reserved", fmt_bytes),
                                     ("single_stream_peak_reserved", "1-stream peak reserved", fmt_bytes),
                                     ("reserved_vs_single_stream", "vs 1 stream", fmt_ratio))),
        threads_section(runs),
        (replay_section(replays).replace("## Trace replay\n", f"## Trace replay\n\n{src('replay')}.\n", 1)
         if replays else ""),
        (torch_empty_section(torch_empty).replace("\n\n", f"\n\n{src('torch_empty')}. ", 1) if torch_empty else ""),
        fragmentation_section(fragmentation, src("fragmentation")),
        inference_section(inference_paths, inference_src.describe(gpus["bench"]) if inference_src else ""),
        inference_section(*stored("detection_rate"), title="Debugging options: how often they catch the bugs"),
        inference_section(*stored("audit_overhead"), title="Debugging options: what they cost on the training loop"),
        soak_section(*stored("soak")),
        suites_section([(paths[0], src(kind)) for kind, (paths, _) in (found.items() if run_dirs else [])
                        if kind.startswith("suite:")]),
    ]
    if plots:
        sections.append("## Plots\n\n" + "\n\n".join(f"![{title}](img/{name})" for name, title in plots) + "\n")
    elif plot_note:
        sections.append(f"## Plots\n\n{plot_note}.\n")
    if errors:
        sections.append("## Skipped benchmarks\n\n" + "\n".join(f"- `{n}`: {m}" for n, m in errors) + "\n")
    with open(out_path, "w") as f:
        f.write("\n".join(s for s in sections if s))
    print(f"report: wrote {out_path}" + (f" and {len(plots)} plot(s) in {img_dir}" if plots else ""))

    readme = readmes[-1] if readmes else default_readme(out_path)
    if readme:
        readme_dir = os.path.dirname(os.path.abspath(readme))
        page_link = os.path.relpath(os.path.abspath(out_path), readme_dir)
        img_link = os.path.relpath(os.path.join(img_dir, HEADLINE_IMG), readme_dir)
        with open(readme) as f:
            text = f.read()
        try:
            text = replace_block(text, headline_block(rows, sources, gpus, page_link, img_link))
        except ValueError as e:
            sys.exit(f"report: {readme}: {e}")
        with open(readme, "w") as f:
            f.write(text)
        print(f"report: wrote the headline table into {readme}"
              + ("" if headline_drawn else " (its picture was not redrawn: matplotlib is not installed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

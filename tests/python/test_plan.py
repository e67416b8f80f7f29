"""`python -m streamalloc.plan`: the planner's command line on CPU, on generated and recorded snapshots,
and its answers to bad input (one line on stderr, a non-zero exit)."""

import gzip
import json
import lzma
import pickle
import sys
from pathlib import Path

import pytest
from streamalloc import plan
from support import run_python

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "planner" / "tools"))
from make_snapshot import make_snapshot  # noqa: E402

DATA = REPO / "planner" / "validate" / "data"

pytestmark = pytest.mark.skipif(
    plan.find_planner_library() is None,
    reason="libstreamalloc_planner.so not found: build the repository (target streamalloc_planner) and set "
           "STREAMALLOC_LIBRARY_DIR")


@pytest.fixture(scope="module")
def small_snapshot(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "small.pickle"
    path.write_bytes(pickle.dumps(make_snapshot(events=3000, seed=1)))
    return path


def plan_cli(*args):
    return run_python(["-m", "streamalloc.plan", *map(str, args)], timeout=120)


def test_table_has_every_setting_and_a_recommendation(small_snapshot):
    result = plan_cli(small_snapshot, "--torch-conf", "max_split_size_mb:64", "--conf", "cross_stream_reuse:never")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    names = ["pytorch ", "pytorch expandable", "pytorch max_split_size_mb:64", "streamalloc ",
             "streamalloc expandable", "streamalloc cross_stream_reuse:never"]
    for name in names:
        assert any(line.startswith(name) for line in lines), (name, result.stdout)
    assert lines[-1].startswith("recommendation: use ")


def test_json_report_and_cap_failure_point(small_snapshot):
    result = plan_cli(small_snapshot, "--json", "--cap", "0.05")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cap_bytes"] == int(0.05 * (1 << 30))
    snapshot = pickle.loads(small_snapshot.read_bytes())
    entries = snapshot["device_traces"][0]
    for setting in report["settings"]:
        assert setting["peak_reserved"] >= setting["peak_allocated"] > 0
        assert setting["fits"] is False  # the trace needs hundreds of MiB
        failure = setting["first_failure"]
        assert entries[failure["trace_entry"]]["action"] == "alloc"
        assert failure["frame"].startswith("train.py:")
    assert report["recommendation"].startswith("no setting fits")
    roomy = json.loads(plan_cli(small_snapshot, "--json", "--cap", "64").stdout)
    assert all(s["fits"] and s["first_failure"] is None for s in roomy["settings"])


def test_write_events_feeds_the_same_engine(small_snapshot, tmp_path):
    events = tmp_path / "small.events"
    result = plan_cli(small_snapshot, "--write-events", events)
    assert result.returncode == 0, result.stderr
    assert events.read_text().startswith("#streamalloc-plan v1 completions=1")


def test_conversion_carries_the_jobs_clock():
    entries = [{"action": "alloc", "addr": 1 << 20, "size": 512, "stream": 0, "time_us": 1000},
               {"action": "alloc", "addr": 2 << 20, "size": 512, "stream": 0, "time_us": 1000},
               {"action": "alloc", "addr": 3 << 20, "size": 512, "stream": 0, "time_us": 1250},
               {"action": "free_requested", "addr": 1 << 20, "size": 512, "stream": 0, "time_us": 1200},
               {"action": "free_completed", "addr": 1 << 20, "size": 512, "stream": 0, "time_us": 1300}]
    lines = plan.convert(entries).lines[1:]
    # Microseconds from the first entry, a `t` line where the clock moves on, never back.
    assert lines == ["t 0", "a 0 512 0", "a 1 512 0", "t 250", "a 2 512 0", "f 0", "t 300"]


def test_plot(small_snapshot, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    png = tmp_path / "plan.png"
    result = plan_cli(small_snapshot, "--plot", png)
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("workload", ["gpt2", "pipeline", "gpt2_expandable", "resnet50", "gpt2_bench", "multistream"])
def test_model_reproduces_recorded_snapshots(workload):
    records = {(r["workload"], r["allocator"]): r for r in json.loads((DATA / "recorded.json").read_text())}
    record = records[(workload, "pytorch")]
    snapshot = plan.load_snapshot(DATA / record["snapshot"])
    conf = "expandable_segments:True" if workload.endswith("_expandable") else ""
    report, conversion = plan.plan_snapshot(
        snapshot, segment_events=True, settings=[{"name": "model", "allocator": "pytorch", "conf": conf}])
    model = report["settings"][0]
    assert abs(model["peak_reserved"] - record["max_memory_reserved"]) <= 0.02 * record["max_memory_reserved"]
    recorded = [(e, a, s) for e, a, s, _ in conversion.segments]
    modelled = [(e, a, s) for e, a, s, _ in model["segment_events"]]
    same = sum(1 for x, y in zip(recorded, modelled) if x == y)
    assert same >= 0.95 * max(len(recorded), len(modelled))


# ---- bad input: one clear line on stderr, exit 1 ----

def bad(path):
    result = plan_cli(path)
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("streamalloc.plan: ")
    return lines[0]


def test_not_a_snapshot(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a pickle\n")
    assert "is not a memory snapshot" in bad(text)
    listing = tmp_path / "list.pickle"
    listing.write_bytes(pickle.dumps([1, 2, 3]))
    assert "not a PyTorch memory snapshot" in bad(listing)
    assert "cannot read" in bad(tmp_path / "missing.pickle")
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    assert "is empty" in bad(empty)


def test_snapshot_without_trace_entries(tmp_path):
    path = tmp_path / "no_trace.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"address": 0, "total_size": 2 << 20}], "device_traces": [[]]}))
    assert "no trace entries" in bad(path)
    frees_only = tmp_path / "frees_only.pickle"
    frees_only.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "free_requested", "addr": 1, "size": 512, "stream": 0}]]}))
    assert "no allocations" in bad(frees_only)


def test_truncated_file(small_snapshot, tmp_path):
    data = small_snapshot.read_bytes()
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(data[: len(data) // 2])
    assert "truncated" in bad(cut)
    cut_gz = tmp_path / "cut.pickle.gz"
    cut_gz.write_bytes(gzip.compress(data)[:2000])
    assert "truncated" in bad(cut_gz)
    cut_xz = tmp_path / "cut.pickle.xz"
    cut_xz.write_bytes(lzma.compress(data)[:200])
    assert "truncated" in bad(cut_xz)


def test_xz_snapshot_plans_as_the_pickle(small_snapshot, tmp_path):
    packed = tmp_path / "small.pickle.xz"
    packed.write_bytes(lzma.compress(small_snapshot.read_bytes()))
    results = [plan_cli(path, "--json") for path in (packed, small_snapshot)]
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert json.loads(results[0].stdout)["settings"] == json.loads(results[1].stdout)["settings"]


def test_pickle_with_classes_is_refused(tmp_path):
    path = tmp_path / "classes.pickle"
    path.write_bytes(pickle.dumps({"device_traces": [[]], "when": Path("/")}))
    assert "refers to the Python class" in bad(path)


def test_bad_setting_names_the_key(small_snapshot):
    result = plan_cli(small_snapshot, "--torch-conf", "garbage_collection_threshold:0.5")
    assert result.returncode == 1
    assert "garbage_collection_threshold" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# ---- the C++ front end on the same engine ----

def _plan_tool():
    import os

    for entry in os.environ.get("STREAMALLOC_LIBRARY_DIR", "").split(os.pathsep):
        if entry:
            candidate = Path(entry).parent / "planner" / "streamalloc_plan"
            if candidate.is_file():
                return candidate
    return None


def test_cpp_tool_agrees_with_the_python_command(small_snapshot, tmp_path):
    tool = _plan_tool()
    if tool is None:
        pytest.skip("streamalloc_plan was not built beside the library directory (target streamalloc_plan)")
    import subprocess

    events = tmp_path / "small.events"
    python_report = json.loads(plan_cli(small_snapshot, "--json", "--write-events", events).stdout)
    result = subprocess.run([str(tool), str(events), "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    cpp_report = json.loads(result.stdout)
    # The PyTorch model is deterministic (streamalloc's replay follows its clock-paced fence polls).
    def torch_peaks(report):
        return [s["peak_reserved"] for s in report["settings"] if s["allocator"] == "pytorch"]

    assert torch_peaks(cpp_report) == torch_peaks(python_report)
    not_events = tmp_path / "not.events"
    not_events.write_text("hello\n")
    bad_run = subprocess.run([str(tool), str(not_events)], capture_output=True, text=True, timeout=60)
    assert bad_run.returncode == 1
    assert bad_run.stderr.strip().splitlines() == [
        "streamalloc_plan: events:1: not a planner event list (the first line must start with '#streamalloc-plan v1')"]


# ---- planner/validate: the bench traces' workloads, validated through snapshots ----

def test_compare_names_the_snapshot_that_validates_each_bench_trace(tmp_path):
    data, traces = tmp_path / "data", tmp_path / "traces"
    data.mkdir()
    traces.mkdir()
    (traces / "multistream.trace").write_text((REPO / "bench/replay/traces/multistream.trace").read_text())
    (traces / "resnet50.trace").write_text("#streamalloc-trace v1 workload=resnet50 native_peak_reserved=2097152\n"
                                           "a 0 4096 0\nf 0\n")
    with gzip.open(data / "multistream.pickle.gz", "wb") as f:
        pickle.dump(make_snapshot(events=500, seed=3), f)
    peak = 1 << 30
    records = [{"workload": "multistream", "allocator": "pytorch", "snapshot": "multistream.pickle.gz",
                "max_memory_reserved": peak},
               {"workload": "multistream", "allocator": "streamalloc", "max_memory_reserved": peak, "run": 0},
               {"workload": "multistream", "allocator": "streamalloc", "max_memory_reserved": 2 * peak, "run": 1},
               {"workload": "multistream", "allocator": "streamalloc_expandable", "max_memory_reserved": peak}]
    (data / "recorded.json").write_text(json.dumps(records))
    out = tmp_path / "results.json"
    result = run_python([str(REPO / "planner/validate/compare.py"), "--data", data, "--traces", traces, "--out", out],
                        timeout=120)
    assert result.returncode == 0, result.stderr
    results = json.loads(out.read_text())
    (row,) = results["snapshots"]
    assert row["workload"] == "multistream" and row["bench_trace"] == "multistream.trace"
    assert row["streamalloc_real_peak_reserved"] == 2 * peak and "streamalloc_expandable_plan_error_pct" in row
    # Against the nearest of the repeated runs: the run whose peak is closer to the plan.
    assert row["streamalloc_real_runs"] == [peak, 2 * peak]
    planned = row["streamalloc_plan_peak_reserved"]
    nearest = min((peak, 2 * peak), key=lambda run: abs(planned - run))
    assert row["streamalloc_plan_nearest_error_pct"] == pytest.approx(100.0 * (planned - nearest) / nearest)
    by_trace = {r["trace"]: r for r in results["bench_traces"]}
    assert by_trace["multistream.trace"]["validated_by_snapshot"] == "multistream"
    assert by_trace["resnet50.trace"]["validated_by_snapshot"] is None  # no resnet50 snapshot in the data
    assert by_trace["resnet50.trace"]["model_peak_reserved"] == 2097152


def test_record_snapshots_keeps_the_records_of_workloads_not_recorded_again(tmp_path):
    sys.path.insert(0, str(REPO / "planner" / "validate"))
    from record_snapshots import BENCH_WORKLOADS, bench_workload, merge_records

    path = tmp_path / "recorded.json"
    assert merge_records(path, [{"workload": "multistream", "allocator": "pytorch"}]) == [
        {"workload": "multistream", "allocator": "pytorch"}]
    path.write_text(json.dumps([{"workload": "gpt2", "allocator": "pytorch", "n": 1},
                                {"workload": "multistream", "allocator": "pytorch", "n": 1}]))
    merged = merge_records(path, [{"workload": "multistream", "allocator": "pytorch", "n": 2}])
    assert merged == [{"workload": "gpt2", "allocator": "pytorch", "n": 1},
                      {"workload": "multistream", "allocator": "pytorch", "n": 2}]
    # Each bench workload is the function that recorded its trace, and that trace is in the repository.
    for workload, (function, trace) in BENCH_WORKLOADS.items():
        assert bench_workload(workload).__name__ == function
        assert (REPO / "bench/replay/traces" / trace).is_file()


def test_record_snapshots_dry_run_parses_every_workload():
    only = "multistream,resnet50,gpt2_bench"
    result = run_python([str(REPO / "planner/validate/record_snapshots.py"), "--dry-run", "--only", only],
                        timeout=120)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["workload"] for r in records] == [w for w in only.split(",") for _ in range(3)]
    assert {r["skipped"] for r in records} == {"needs CUDA"}
    refused = run_python([str(REPO / "planner/validate/record_snapshots.py"), "--dry-run", "--only", "nope"])
    assert refused.returncode == 1 and "unknown workload 'nope'" in refused.stderr

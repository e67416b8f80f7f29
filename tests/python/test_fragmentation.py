"""bench/studies/fragmentation.py: its arguments, the bisection of the max-batch mode, the tables and the
environment of each allocator's process (no GPU needed); its training step on the CPU with a tiny GPT-2
(needs transformers); and a short run of both modes on a GPU."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest
from support import CUDA_DEVICES, HAS_C_LIBRARY, REPO, requires_cuda, requires_torch, run_python

SCRIPT = REPO / "bench" / "studies" / "fragmentation.py"
_spec = importlib.util.spec_from_file_location("fragmentation", SCRIPT)
frag = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(frag)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
requires_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="transformers is not installed (python3 -m pip install transformers)")


def test_defaults_run_every_allocator_in_both_modes():
    args = frag.parse_args([])
    assert args.modes == ["peaks", "max-batch"]
    assert args.allocators == ["native", "native_expandable", "streamalloc", "streamalloc_expandable"]
    assert (args.layers, args.n_embd, args.precision) == (12, 768, "bf16")
    assert args.bracket == (4, 34)
    assert frag.trials_needed(*args.bracket) == 5


@pytest.mark.parametrize("argv, message", [
    (["--bracket", "8"], "--bracket takes LO:HI"),
    (["--bracket", "9:3"], "need 1 <= LO <= HI"),
    (["--bracket", "0:3"], "need 1 <= LO <= HI"),
    (["--allocators", "native,tcmalloc"], "unknown tcmalloc"),
    (["--modes", ""], "(empty list)"),
    (["--seq-min", "600", "--seq-max", "500"], "is above --seq-max"),
    (["--n-embd", "100", "--n-head", "12"], "not a multiple of --n-head"),
    (["--steps", "5", "--warmup", "5"], "--warmup must be below --steps"),
    (["--cap-gib", "0"], "--cap-gib must be positive"),
    (["--batch", "0"], "must be at least 1"),
])
def test_bad_arguments_are_refused_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        frag.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("low, high", [(4, 34), (1, 1), (3, 10), (1, 2)])
def test_bisection_finds_the_largest_fitting_batch_for_every_threshold(low, high):
    for threshold in range(low - 1, high + 3):  # below the bracket, inside it and above it
        tried = []

        def fits(batch):
            tried.append(batch)
            return batch <= threshold

        search = frag.largest_passing(fits, low, high)
        assert len(tried) == len(set(tried)), f"a size was tried twice: {tried}"
        assert all(low <= size <= high for size in tried)
        assert len(tried) <= frag.trials_needed(low, high)
        assert search["trials"] == [(size, size <= threshold) for size in tried]
        if threshold < low:
            assert (search["largest"], search["below_bracket"], search["at_least"]) == (None, True, False)
        elif threshold >= high:
            assert (search["largest"], search["below_bracket"], search["at_least"]) == (high, False, True)
        else:
            assert (search["largest"], search["below_bracket"], search["at_least"]) == (threshold, False, False)


def test_bisection_refuses_an_empty_bracket_and_lets_failures_through():
    with pytest.raises(ValueError, match="need 1 <= low <= high"):
        frag.largest_passing(lambda batch: True, 5, 4)

    def broken(batch):
        raise RuntimeError(f"trial {batch} failed")

    with pytest.raises(RuntimeError, match="trial 19 failed"):
        frag.largest_passing(broken, 4, 34)


def test_sequence_lengths_are_seeded_and_shared_by_every_run_length():
    lengths = frag.sequence_lengths(7, 30, 128, 1024)
    assert lengths == frag.sequence_lengths(7, 30, 128, 1024)
    assert lengths[:10] == frag.sequence_lengths(7, 10, 128, 1024)  # max-batch trials see the same first steps
    assert all(128 <= n <= 1024 for n in lengths)
    assert len(set(lengths)) > 20, "lengths should change from step to step"
    assert lengths != frag.sequence_lengths(8, 30, 128, 1024)


def test_each_allocator_gets_its_own_environment():
    base = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", "STREAMALLOC_CONF": "audit:warn",
            "PYTORCH_ALLOC_CONF": "max_split_size_mb:64", "PATH": "/bin"}
    native = frag.child_env("native", base)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in native and "PYTORCH_ALLOC_CONF" not in native
    assert "STREAMALLOC_CONF" not in native and native["PATH"] == "/bin"
    assert frag.child_env("native_expandable", base)["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    for name in ("streamalloc", "streamalloc_expandable"):
        env = frag.child_env(name, base)
        assert "STREAMALLOC_CONF" not in env and "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert base["STREAMALLOC_CONF"] == "audit:warn", "the caller's mapping must not change"


def test_tables_show_numbers_and_say_why_a_row_has_none():
    gib = frag.GIB
    result = {
        "gpu": "GPU", "torch": "2.11", "transformers": "5.0", "wall_s": 250.4,
        "setup": {"batch": 8, "steps": 30, "warmup": 5, "seq_min": 128, "seq_max": 1024, "layers": 12,
                  "n_embd": 768, "n_head": 12, "precision": "bf16", "seed": 0, "cap_gib": 24.0,
                  "bracket": [4, 34], "cap_steps": 10, "conf": ""},
        "peaks": {
            "native": {"oom": False, "peak_reserved": 15 * gib, "peak_allocated": 12 * gib,
                       "ms_per_step_median": 81.25},
            "native_expandable": {"error": "exit code 1: boom"},
            "streamalloc": {"oom": True, "oom_step": 3},
            "streamalloc_expandable": {"unavailable": frag.OPTION_NOT_AVAILABLE},
        },
        "max_batch": {
            "native": {"largest": 12, "below_bracket": False, "at_least": False,
                       "trials": [[19, False], [11, True], [15, False], [13, False], [12, True]],
                       "best_run": {"peak_reserved": 23 * gib, "peak_allocated": 20 * gib}},
            "native_expandable": {"largest": 34, "below_bracket": False, "at_least": True, "trials": [[19, True]]},
            "streamalloc": {"largest": None, "below_bracket": True, "at_least": False, "trials": [[4, False]]},
            "streamalloc_expandable": {"unavailable": frag.OPTION_NOT_AVAILABLE, "trials": []},
        },
    }
    text = frag.render_markdown(json.loads(json.dumps(result)))  # as read back from --json
    assert "| native | 15.00 GiB | 12.00 GiB | 1.250 | 81.2 |" in text
    assert "| native_expandable | failed: exit code 1: boom |" in text
    assert "| streamalloc | out of memory at step 3 |" in text
    assert "| streamalloc_expandable | option not available in this build |" in text
    assert "| native | 12 | 23.00 GiB | 1.150 | 19 OOM, 11, 15 OOM, 13 OOM, 12 |" in text
    assert "| native_expandable | >= 34 | n/a | n/a | 19 |" in text
    assert "| streamalloc | < 4 | n/a | n/a | 4 OOM |" in text
    assert "## Largest batch under a cap of 24 GiB (10 steps, bracket 4:34)" in text


def test_missing_transformers_is_named_with_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` fail
    with pytest.raises(SystemExit) as exit_info:
        frag.require_transformers()
    assert "python3 -m pip install transformers" in str(exit_info.value.code)


@requires_torch
def test_a_capped_trial_on_the_c_abi_path_is_unavailable_with_the_reason(monkeypatch):
    # Through PyTorch's Python CUDAPluggableAllocator an allocation that does not fit is a null pointer,
    # not torch.OutOfMemoryError: a max-batch trial there must not count as run.
    enabled = []
    fake = type(sys)("streamalloc")
    fake.enable = lambda conf, **options: enabled.append((conf, options))
    fake.active_path = lambda: "c-abi"
    fake.ConfigError = RuntimeError
    monkeypatch.setitem(sys.modules, "streamalloc", fake)
    out = frag.run_child({"allocator": "streamalloc_expandable", "conf": "", "cap_gib": 24})
    assert enabled == [("", {"expandable_segments": True})]
    assert "torch extension" in out["unavailable"] and "null pointer" in out["unavailable"]


@requires_torch
@pytest.mark.skipif(CUDA_DEVICES > 0, reason="a CUDA device is present: test_both_modes_on_the_gpu runs instead")
def test_without_a_gpu_it_says_skipped_and_succeeds(tmp_path):
    out = tmp_path / "frag.json"
    result = run_python([str(SCRIPT), "--json", str(out), "--markdown", str(tmp_path / "frag.md")])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("fragmentation: skipped: no CUDA device")
    assert json.loads(out.read_text())["skipped"]
    assert run_python([str(SCRIPT), "--require-gpu"]).returncode == 1


@requires_torch
@requires_transformers
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_step_runs_on_the_cpu(precision):
    spec = {"allocator": "native", "conf": "", "layers": 2, "n_embd": 32, "n_head": 2, "seq_min": 8,
            "seq_max": 24, "precision": precision, "seed": 3, "batch": 2, "steps": 3}
    out = frag.train(spec, device="cpu")
    assert out["oom"] is False
    assert out["lengths"] == frag.sequence_lengths(3, 3, 8, 24)
    assert len(out["losses"]) == 3 and all(math.isfinite(loss) for loss in out["losses"])
    assert len(out["step_ms"]) == 3


@requires_cuda
@requires_transformers
@pytest.mark.skipif(not HAS_C_LIBRARY, reason="libstreamalloc.so not found: build and set STREAMALLOC_LIBRARY_DIR")
def test_both_modes_on_the_gpu(tmp_path):
    out = tmp_path / "frag.json"
    result = run_python([str(SCRIPT), "--layers", "2", "--n-embd", "256", "--n-head", "4", "--seq-min", "64",
                         "--seq-max", "512", "--batch", "4", "--steps", "6", "--warmup", "2", "--cap-gib", "2",
                         "--bracket", "1:7", "--cap-steps", "4", "--json", str(out)], timeout=900)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    data = json.loads(out.read_text())
    for name, run in data["peaks"].items():
        if name == "streamalloc_expandable" and run.get("unavailable"):
            assert run["unavailable"] == frag.OPTION_NOT_AVAILABLE
            continue
        assert not run["oom"], name
        assert 0 < run["peak_allocated"] <= run["peak_reserved"], name
        assert run["ms_per_step_median"] > 0, name
    assert data["peaks"]["native_expandable"]["expandable_segments"] > 0
    for name, search in data["max_batch"].items():
        if name == "streamalloc_expandable" and search.get("unavailable"):
            continue
        assert "error" not in search, (name, search)
        assert 1 <= len(search["trials"]) <= 3, (name, search["trials"])

#!/usr/bin/env python3
"""Fragmentation under a training loop whose shapes change every step: GPT-2 with random sequence lengths.

    python3 bench/studies/fragmentation.py [--modes peaks,max-batch] [--allocators native,...] [--batch 8]
        [--steps 30] [--warmup 5] [--seq-min 128] [--seq-max 1024] [--layers 12] [--n-embd 768]
        [--precision bf16|fp32] [--seed 0] [--cap-gib 24] [--bracket 4:34] [--cap-steps 10]
        [--conf CONF] [--json OUT] [--markdown OUT] [--require-gpu]

The workload: transformers' GPT2LMHeadModel built from a GPT2Config (random weights, nothing
downloaded; 12 layers, n_embd 768, 12 heads: GPT-2 small), AdamW, and per step a batch of random tokens
whose sequence length is drawn uniformly from [--seq-min, --seq-max] (seeded: every allocator and every
trial sees the same lengths in the same order). Every activation, gradient and logit buffer changes
size from one step to the next, which is what leaves a caching allocator with free blocks of the wrong
sizes. Precision: bf16 autocast by default (what GPT-2-sized models are trained with on an H100/H200;
weights, gradients and AdamW's state stay fp32, activations are bf16); --precision fp32 runs without
autocast.

Allocators, each in a process of its own (PyTorch picks and configures its allocator once per process):
  native                  PyTorch's caching allocator
  native_expandable       the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  streamalloc             streamalloc.enable(CONF)
  streamalloc_expandable  streamalloc.enable(CONF, expandable_segments=True); "option not available in
                          this build" where streamalloc has no such option

Two modes:
  peaks      --steps steps at batch --batch: peak reserved, peak allocated, their ratio (how much of
             what the allocator held was in use at its worst) and the median time of the steps after
             --warmup (each step synchronised).
  max-batch  the largest batch that trains --cap-steps steps without torch.OutOfMemoryError when the
             allocator may hold at most --cap-gib GiB (torch.cuda.set_per_process_memory_fraction), found
             by bisection over the batch sizes of --bracket LO:HI, one process per trial. With 2^k - 1
             sizes in the bracket each allocator takes k trials (4:34 is 31 sizes: 5 trials). The answer
             assumes that a batch that fits implies every smaller one fits; "< LO" and ">= HI" say that
             the bracket missed.

Time on an H200 with the defaults (estimated): a process costs about 10 s (importing torch and
transformers, CUDA init, building the model) before its steps, so the whole run (4 + 4 x 5 processes)
takes about 4-5 minutes.

torch_plugin/ must be on PYTHONPATH (or the package installed) and STREAMALLOC_LIBRARY_DIR must point at
the built libraries when it is not installed (`make fragmentation` sets both). Without a CUDA device the
script says "skipped: no CUDA device" and exits 0 (1 with --require-gpu). transformers must be
installed (`python3 -m pip install transformers`); the script says so when it is not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ALLOCATORS = ("native", "native_expandable", "streamalloc", "streamalloc_expandable")
MODES = ("peaks", "max-batch")
DESCRIPTIONS = {
    "native": "PyTorch's caching allocator",
    "native_expandable": "PyTorch's caching allocator, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "streamalloc": "streamalloc.enable(CONF)",
    "streamalloc_expandable": "streamalloc.enable(CONF, expandable_segments=True)",
}
# What a row says where streamalloc has no expandable_segments option yet.
OPTION_NOT_AVAILABLE = "option not available in this build"
TRANSFORMERS_MISSING = ("fragmentation: this benchmark needs Hugging Face transformers (GPT2LMHeadModel): "
                        "install it with `python3 -m pip install transformers`")
SKIPPED_NO_CUDA = "fragmentation: skipped: no CUDA device"
GIB = 1 << 30


# ---------------------------------------------------------------------------------------------------
# The parts that need neither torch nor a GPU: arguments, the bisection, the tables.

def parse_bracket(text: str) -> tuple[int, int]:
    try:
        low_text, high_text = text.split(":")
        low, high = int(low_text), int(high_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bracket takes LO:HI (two batch sizes), not {text!r}") from None
    if not 1 <= low <= high:
        raise argparse.ArgumentTypeError(f"--bracket {text}: need 1 <= LO <= HI")
    return low, high


def comma_list(choices: tuple[str, ...], flag: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in choices]
        if unknown or not items:
            raise argparse.ArgumentTypeError(
                f"{flag}: unknown {', '.join(unknown) or '(empty list)'}; choose from {', '.join(choices)}")
        return items
    return parse


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", type=comma_list(MODES, "--modes"), default=list(MODES))
    parser.add_argument("--allocators", type=comma_list(ALLOCATORS, "--allocators"), default=list(ALLOCATORS))
    parser.add_argument("--batch", type=positive, default=8, help="batch size of the peaks mode (default 8)")
    parser.add_argument("--steps", type=positive, default=30, help="steps of the peaks mode (default 30)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed first steps of the peaks mode (default 5)")
    parser.add_argument("--seq-min", type=positive, default=128)
    parser.add_argument("--seq-max", type=positive, default=1024)
    parser.add_argument("--layers", type=positive, default=12)
    parser.add_argument("--n-embd", type=positive, default=768)
    parser.add_argument("--n-head", type=positive, default=12)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                        help="bf16: autocast to bfloat16 (default); fp32: no autocast")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sequence lengths, tokens and weights")
    parser.add_argument("--cap-gib", type=float, default=24.0,
                        help="max-batch mode: GiB the allocator may hold (default 24)")
    parser.add_argument("--bracket", type=parse_bracket, default=(4, 34),
                        help="max-batch mode: batch sizes LO:HI searched (default 4:34, 5 trials)")
    parser.add_argument("--cap-steps", type=positive, default=10,
                        help="max-batch mode: steps a batch must train (default 10)")
    parser.add_argument("--conf", default="", help="streamalloc options for both streamalloc rows")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process (default 300)")
    parser.add_argument("--json", help="write the results as JSON")
    parser.add_argument("--markdown", help="write the tables as markdown")
    parser.add_argument("--require-gpu", action="store_true", help="exit 1 instead of 0 without a CUDA device")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one run, as JSON: what a process of ours does
    args = parser.parse_args(argv)
    if args.seq_min > args.seq_max:
        parser.error(f"--seq-min {args.seq_min} is above --seq-max {args.seq_max}")
    if args.n_embd % args.n_head != 0:
        parser.error(f"--n-embd {args.n_embd} is not a multiple of --n-head {args.n_head}")
    if not 0 <= args.warmup < args.steps:
        parser.error(f"--warmup must be below --steps ({args.steps})")
    if args.cap_gib <= 0:
        parser.error("--cap-gib must be positive")
    return args


def sequence_lengths(seed: int, steps: int, seq_min: int, seq_max: int) -> list[int]:
    """The sequence length of each step: the same for every allocator, batch size and trial."""
    rng = random.Random(seed)
    return [rng.randint(seq_min, seq_max) for _ in range(steps)]


def largest_passing(fits: Callable[[int], bool], low: int, high: int) -> dict:
    """The largest batch size in low..high for which fits(batch) is true, by bisection, assuming that
    fits is monotone (true up to some size, false above). Each size is tried at most once.

    Returns {"largest": size or None, "below_bracket": low failed, "at_least": high fitted (the answer
    may be larger), "trials": [(size, fits), ...] in the order tried}. fits may raise; the exception
    propagates with the trials so far lost, so callers that want them record them in fits.
    Sizes low..high plus "none fits" are high - low + 2 outcomes: ceil(log2) of that many trials.
    """
    if not 1 <= low <= high:
        raise ValueError(f"bracket {low}:{high}: need 1 <= low <= high")
    known_fit, known_fail = low - 1, high + 1  # outside the bracket: assumed, never tried
    trials = []
    while known_fail - known_fit > 1:
        size = (known_fit + known_fail) // 2
        ok = bool(fits(size))
        trials.append((size, ok))
        if ok:
            known_fit = size
        else:
            known_fail = size
    return {"largest": known_fit if known_fit >= low else None, "below_bracket": known_fit < low,
            "at_least": known_fit == high, "trials": trials}


def trials_needed(low: int, high: int) -> int:
    return math.ceil(math.log2(high - low + 2))


def format_gib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f} GiB"


def format_ratio(reserved: int | None, allocated: int | None) -> str:
    return "n/a" if not reserved or not allocated else f"{reserved / allocated:.3f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def row_problem(run: dict) -> str | None:
    """What a run that produced no numbers says instead."""
    if run.get("unavailable"):
        return run["unavailable"]
    if run.get("error"):
        return "failed: " + run["error"]
    return None


def peaks_table(runs: dict[str, dict]) -> str:
    rows = []
    for name, run in runs.items():
        problem = row_problem(run)
        if problem:
            rows.append([name, problem, "", "", ""])
            continue
        if run.get("oom"):
            rows.append([name, f"out of memory at step {run['oom_step']}", "", "", ""])
            continue
        rows.append([name, format_gib(run["peak_reserved"]), format_gib(run["peak_allocated"]),
                     format_ratio(run["peak_reserved"], run["peak_allocated"]), f"{run['ms_per_step_median']:.1f}"])
    return markdown_table(["allocator", "peak reserved", "peak allocated", "reserved / allocated",
                           "ms/step (median)"], rows)


def describe_largest(search: dict, low: int, high: int) -> str:
    if search.get("error"):
        return "failed: " + search["error"]
    if search.get("unavailable"):
        return search["unavailable"]
    if search["below_bracket"]:
        return f"< {low}"
    if search["at_least"]:
        return f">= {high}"
    return str(search["largest"])


def max_batch_table(searches: dict[str, dict], low: int, high: int) -> str:
    rows = []
    for name, search in searches.items():
        trials = ", ".join(f"{size}{'' if ok else ' OOM'}" for size, ok in search.get("trials", []))
        best = search.get("best_run") or {}
        rows.append([name, describe_largest(search, low, high), format_gib(best.get("peak_reserved")),
                     format_ratio(best.get("peak_reserved"), best.get("peak_allocated")), trials])
    return markdown_table(["allocator", "largest batch", "peak reserved there", "reserved / allocated there",
                           "trials (batch, in order)"], rows)


def render_markdown(result: dict) -> str:
    setup = result["setup"]
    out = ["# Fragmentation: GPT-2 with random sequence lengths\n",
           (f"{setup['layers']} layers, n_embd {setup['n_embd']}, {setup['precision']}, AdamW; sequence length "
            f"uniform in [{setup['seq_min']}, {setup['seq_max']}] per step, seed {setup['seed']}. "
            f"{result.get('gpu', '?')}, torch {result.get('torch', '?')}, transformers "
            f"{result.get('transformers', '?')}, streamalloc conf '{setup['conf']}'.\n")]
    if "peaks" in result:
        out.append(f"## Peaks: batch {setup['batch']}, {setup['steps']} steps ({setup['warmup']} untimed)\n")
        out.append(peaks_table(result["peaks"]))
    if "max_batch" in result:
        low, high = setup["bracket"]
        out.append(f"## Largest batch under a cap of {setup['cap_gib']:g} GiB ({setup['cap_steps']} steps, "
                   f"bracket {low}:{high})\n")
        out.append(max_batch_table(result["max_batch"], low, high))
    out.append(f"Wall time: {result.get('wall_s', 0):.0f} s.\n")
    return "\n".join(out)


def child_env(allocator: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process that runs `allocator`: every allocator with its defaults, except
    the setting that makes it what it is."""
    env = dict(os.environ if environ is None else environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("STREAMALLOC_CONF", None)
    if allocator == "native_expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def require_transformers():
    try:
        import transformers
    except ImportError:
        sys.exit(TRANSFORMERS_MISSING)
    return transformers


# ---------------------------------------------------------------------------------------------------
# One run (a process of its own): set up the allocator, train, report as one JSON line.

def enable_allocator(allocator: str, conf: str) -> str | None:
    """Install the allocator before any CUDA work; returns why it cannot run here, or None."""
    if not allocator.startswith("streamalloc"):
        return None
    import streamalloc

    try:
        if allocator == "streamalloc_expandable":
            streamalloc.enable(conf, expandable_segments=True)
        else:
            streamalloc.enable(conf)
    except streamalloc.ConfigError as error:
        if allocator == "streamalloc_expandable" and "unknown option 'expandable_segments'" in str(error):
            return OPTION_NOT_AVAILABLE
        raise
    return None


def memory_peaks(allocator: str) -> tuple[int, int, dict]:
    import torch

    if allocator.startswith("streamalloc"):
        import streamalloc

        stats = streamalloc.stats()["memory_stats"]
    else:
        stats = torch.cuda.memory_stats()
    return int(stats["reserved_bytes.all.peak"]), int(stats["allocated_bytes.all.peak"]), stats


def build_model(spec: dict, device: str):
    import torch

    transformers = require_transformers()
    config = transformers.GPT2Config(n_layer=spec["layers"], n_embd=spec["n_embd"], n_head=spec["n_head"],
                                     n_positions=max(1024, spec["seq_max"]))
    torch.manual_seed(spec["seed"])
    with torch.device(device):  # initialised where it trains: no 0.5 GB copy from the host
        model = transformers.GPT2LMHeadModel(config)
    model.train()
    return model, config


def train(spec: dict, device: str = "cuda") -> dict:
    """spec["steps"] steps at spec["batch"]; what happened, with the time of each step (synchronised)."""
    import torch

    model, config = build_model(spec, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = sequence_lengths(spec["seed"], spec["steps"], spec["seq_min"], spec["seq_max"])
    generator = torch.Generator(device=device).manual_seed(spec["seed"])
    autocast = spec["precision"] == "bf16"
    step_ms, losses = [], []
    for step, length in enumerate(lengths):
        started = time.perf_counter()
        try:
            tokens = torch.randint(0, config.vocab_size, (spec["batch"], length), device=device, generator=generator)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))  # synchronises: the step's time is its GPU time too
        except torch.OutOfMemoryError as error:
            return {"oom": True, "oom_step": step, "oom_message": str(error).splitlines()[0], "step_ms": step_ms}
        step_ms.append((time.perf_counter() - started) * 1e3)
    return {"oom": False, "step_ms": step_ms, "losses": losses, "lengths": lengths}


def run_child(spec: dict) -> dict:
    import torch

    allocator = spec["allocator"]
    unavailable = enable_allocator(allocator, spec["conf"])
    if unavailable:
        return {"unavailable": unavailable}
    if allocator.startswith("streamalloc") and spec.get("cap_gib"):
        import streamalloc

        if streamalloc.active_path() != "extension":
            # Through PyTorch's Python CUDAPluggableAllocator an allocation that does not fit is a null
            # pointer, not torch.OutOfMemoryError (docs/pytorch.md): a trial there cannot tell "does
            # not fit" from a crash later on.
            return {"unavailable": "max-batch needs streamalloc's torch extension (the C ABI path reports "
                                   "out of memory as a null pointer); build the _torch_ext target"}
    if spec.get("cap_gib"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["cap_gib"] * GIB / total), 0)
    out = train(spec)
    torch.cuda.synchronize()
    if allocator.startswith("streamalloc"):
        import streamalloc

        out["streamalloc_path"] = streamalloc.active_path()  # "extension" or "c-abi"
        out["streamalloc_conf"] = streamalloc.enabled_conf()
    out["peak_reserved"], out["peak_allocated"], stats = memory_peaks(allocator)
    out["num_alloc_retries"] = stats.get("num_alloc_retries")
    if spec.get("check_expandable"):
        # PyTorch ignores settings it does not take: count the segments that really are expandable.
        segments = torch.cuda.memory_snapshot()
        out["expandable_segments"] = sum(1 for s in segments if s.get("is_expandable"))
    if not out["oom"]:
        timed = out["step_ms"][spec.get("warmup", 0):]
        out["ms_per_step_median"] = statistics.median(timed) if timed else None
    return out


# ---------------------------------------------------------------------------------------------------
# The driver: one process per run, then the tables.

def run_process(spec: dict, timeout: float) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    try:
        done = subprocess.run(command, env=child_env(spec["allocator"]), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        return {"error": f"exit code {done.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def base_spec(args: argparse.Namespace, allocator: str) -> dict:
    return {"allocator": allocator, "conf": args.conf, "layers": args.layers, "n_embd": args.n_embd,
            "n_head": args.n_head, "seq_min": args.seq_min, "seq_max": args.seq_max,
            "precision": args.precision, "seed": args.seed}


def peaks_mode(args: argparse.Namespace) -> dict[str, dict]:
    runs = {}
    for allocator in args.allocators:
        spec = base_spec(args, allocator) | {"batch": args.batch, "steps": args.steps, "warmup": args.warmup,
                                             "check_expandable": allocator == "native_expandable"}
        run = run_process(spec, args.timeout)
        if allocator == "native_expandable" and not row_problem(run) and not run.get("expandable_segments"):
            run["error"] = "PyTorch made no expandable segment (is expandable_segments supported here?)"
        runs[allocator] = run
        print(f"peaks {allocator}: {row_problem(run) or summary_line(run)}", flush=True)
    return runs


def summary_line(run: dict) -> str:
    if run.get("oom"):
        return f"out of memory at step {run['oom_step']}"
    return (f"peak reserved {format_gib(run['peak_reserved'])}, allocated {format_gib(run['peak_allocated'])}, "
            f"ratio {format_ratio(run['peak_reserved'], run['peak_allocated'])}, "
            f"{run['ms_per_step_median']:.1f} ms/step")


class TrialFailed(Exception):
    """A trial that neither trained nor ran out of memory: the search for that allocator stops."""

    def __init__(self, outcome: dict):
        super().__init__(row_problem(outcome) or "no result")
        self.outcome = outcome


def max_batch_mode(args: argparse.Namespace) -> dict[str, dict]:
    low, high = args.bracket
    searches = {}
    for allocator in args.allocators:
        runs: dict[int, dict] = {}

        def fits(batch: int) -> bool:
            spec = base_spec(args, allocator) | {"batch": batch, "steps": args.cap_steps, "cap_gib": args.cap_gib}
            run = run_process(spec, args.timeout)
            runs[batch] = run
            if row_problem(run):
                raise TrialFailed(run)
            print(f"max-batch {allocator}: batch {batch}: {'OOM' if run['oom'] else 'trains'}", flush=True)
            return not run["oom"]

        try:
            search = largest_passing(fits, low, high)
        except TrialFailed as failed:
            search = {"trials": [(b, not r.get("oom")) for b, r in runs.items() if not row_problem(r)]}
            key = "unavailable" if failed.outcome.get("unavailable") else "error"
            search[key] = failed.outcome.get("unavailable") or failed.outcome.get("error")
        search["runs"] = {str(b): {k: v for k, v in r.items() if k not in ("losses", "step_ms")}
                          for b, r in runs.items()}
        if search.get("largest") is not None:
            search["best_run"] = search["runs"][str(search["largest"])]
        searches[allocator] = search
        print(f"max-batch {allocator}: {describe_largest(search, low, high)}", flush=True)
    return searches


def write_text(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def skip(args: argparse.Namespace, reason: str) -> int:
    print(f"{SKIPPED_NO_CUDA} ({reason})" if reason else SKIPPED_NO_CUDA)
    # Outputs are overwritten, so that nothing downstream picks up a stale result of an earlier run.
    if args.json:
        write_text(args.json, json.dumps({"kind": "fragmentation", "skipped": reason or "no CUDA device"}) + "\n")
    if args.markdown:
        write_text(args.markdown, SKIPPED_NO_CUDA + "\n")
    return 1 if args.require_gpu else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0
    try:
        import torch
    except ImportError as error:
        return skip(args, f"torch is not importable: {error}")
    if not torch.cuda.is_available():
        return skip(args, "")
    transformers = require_transformers()
    started = time.perf_counter()
    result = {"kind": "fragmentation", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "transformers": transformers.__version__, "host": platform.node(),
              "setup": {key: getattr(args, key) for key in ("batch", "steps", "warmup", "seq_min", "seq_max",
                                                            "layers", "n_embd", "n_head", "precision", "seed",
                                                            "cap_gib", "bracket", "cap_steps", "conf")},
              "allocators": {name: DESCRIPTIONS[name] for name in args.allocators}}
    if "max-batch" in args.modes:
        low, high = args.bracket
        print(f"fragmentation: max-batch takes {trials_needed(low, high)} trials per allocator", flush=True)
    if "peaks" in args.modes:
        result["peaks"] = peaks_mode(args)
    if "max-batch" in args.modes:
        result["max_batch"] = max_batch_mode(args)
    result["wall_s"] = time.perf_counter() - started
    text = render_markdown(result)
    print("\n" + text)
    if args.json:
        write_text(args.json, json.dumps(result, indent=2) + "\n")
    if args.markdown:
        write_text(args.markdown, text)
    failed = [name for name, run in result.get("peaks", {}).items() if run.get("error")]
    failed += [name for name, search in result.get("max_batch", {}).items() if search.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

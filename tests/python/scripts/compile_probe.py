"""torch.compile(mode="reduce-overhead") on a small transformer block, under any allocator.

    python compile_probe.py [--steps N]
    python -m streamalloc compile_probe.py [--steps N]

Inference, then training, each for N steps (default 24) that begin with
torch.compiler.cudagraph_mark_step_begin(). Every step calls the compiled function twice: once on a
fixed shape and once on a shape that changes every few steps, so that new graphs are recorded after
the tree has replayed others (CUDA graph trees then restore the memory pool's checkpointed state in
the allocator before recording). Inductor runs with its default settings (which include its checks of
each pool's live allocations). The outputs, losses and parameters are compared with an eager copy of
the model; the last stdout line is one JSON object.
"""

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch
from _common import emit
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench" / "studies"))
from transformer_block import Block  # noqa: E402  (the benchmark's block)

D_MODEL, HEADS, FF, BATCH = 128, 4, 256, 8
FIXED_T = 16
# The changing shape's sequence length for each step: new shapes appear after replays, and earlier
# shapes come back (replayed, not recorded again).
SCHEDULE = [32] * 5 + [48] * 5 + [32] * 3 + [64] * 4 + [48] * 3 + [32] * 2 + [64] * 2


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(Block(D_MODEL, HEADS, FF), Block(D_MODEL, HEADS, FF)).cuda()


def tree_counters() -> dict:
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    return {
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "recordings": getattr(manager, "debug_fail_counter", None) if manager else None,
        "checkpoint_restores": getattr(manager, "debug_checkpointing_counter", None) if manager else None,
    }


def compare(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> dict:
    diff = (actual.double() - expected.double()).abs()
    ok = bool(torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol))
    return {"ok": ok, "max_abs_diff": float(diff.max()) if diff.numel() else 0.0}


def inputs(step: int, t: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(1000 + step * 7 + t)
    return torch.randn(BATCH, t, D_MODEL, device="cuda", generator=g)


def run_inference(steps: int) -> dict:
    model = make_model(1).eval()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    mismatches, worst = [], 0.0
    start = time.perf_counter()
    with torch.no_grad():
        for step in range(steps):
            torch.compiler.cudagraph_mark_step_begin()
            xa, xb = inputs(step, FIXED_T), inputs(step, SCHEDULE[step % len(SCHEDULE)])
            ya = compiled(xa).clone()  # cloned: the next replay overwrites a graph's outputs
            yb = compiled(xb).clone()
            for name, y, x in (("fixed", ya, xa), ("changing", yb, xb)):
                result = compare(y, model(x), rtol=1e-3, atol=1e-3)
                worst = max(worst, result["max_abs_diff"])
                if not result["ok"]:
                    mismatches.append({"step": step, "call": name, **result})
    torch.cuda.synchronize()
    return {"steps": steps, "mismatches": mismatches[:5], "mismatch_count": len(mismatches),
            "max_abs_diff": worst, "seconds": time.perf_counter() - start, **tree_counters()}


def run_training(steps: int) -> dict:
    compiled_model = make_model(2).train()
    eager_model = make_model(2).train()

    def loss_of(model, x):
        return model(x).float().square().mean()

    compiled_loss = torch.compile(lambda x: loss_of(compiled_model, x), mode="reduce-overhead", dynamic=False)
    opt_c = torch.optim.SGD(compiled_model.parameters(), lr=0.05)
    opt_e = torch.optim.SGD(eager_model.parameters(), lr=0.05)
    losses_c, losses_e = [], []
    start = time.perf_counter()
    for step in range(steps):
        torch.compiler.cudagraph_mark_step_begin()
        xa, xb = inputs(step, FIXED_T), inputs(step, SCHEDULE[step % len(SCHEDULE)])
        opt_c.zero_grad(set_to_none=True)
        loss = compiled_loss(xa) + compiled_loss(xb)
        loss.backward()
        opt_c.step()
        losses_c.append(loss.item())
        opt_e.zero_grad(set_to_none=True)
        loss = loss_of(eager_model, xa) + loss_of(eager_model, xb)
        loss.backward()
        opt_e.step()
        losses_e.append(loss.item())
    torch.cuda.synchronize()
    params = [compare(pc.detach(), pe.detach(), rtol=1e-3, atol=1e-3)
              for pc, pe in zip(compiled_model.parameters(), eager_model.parameters())]
    loss_diffs = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses_c, losses_e)]
    return {"steps": steps, "losses_compiled": losses_c, "losses_eager": losses_e,
            "max_loss_rel_diff": max(loss_diffs), "params_ok": all(p["ok"] for p in params),
            "params_max_abs_diff": max(p["max_abs_diff"] for p in params),
            "loss_decreased": losses_e[-1] < losses_e[0],
            "seconds": time.perf_counter() - start, **tree_counters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    result = {"device": torch.cuda.get_device_name()}
    before = {"cudagraph_skips": 0, "recordings": 0, "checkpoint_restores": 0}
    for name, fn in (("inference", run_inference), ("training", run_training)):
        try:
            phase = fn(args.steps)
            # The counters are the process's; each phase reports its own share.
            for key, value in before.items():
                total = phase[key]
                phase[key] = None if total is None else total - value
                before[key] = value if total is None else total
            result[name] = phase
        except Exception:  # noqa: BLE001  (reported to the test, which shows it)
            result[name] = {"error": traceback.format_exc()}
    result["memory_reserved"] = torch.cuda.memory_reserved()
    emit(result)


if __name__ == "__main__":
    main()

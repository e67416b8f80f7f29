"""What the prefetch pipeline examples share: synthetic batches, the consumer's computation, a reference
to check every step against, and the summary they print.

The examples run under plain `python` (PyTorch's own allocator) or under `python -m streamalloc`;
the last stdout line is a JSON summary, so the two can be compared (tests/python does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

# cuBLAS picks reproducible kernels only with a fixed workspace configuration, which must be set
# before CUDA initialises; it makes the outputs comparable bit for bit across allocators.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

UNIQUE_BATCHES = 8  # the host "loader" cycles through this many distinct batches
DELAY_CYCLES = 100_000  # ~50 us of GPU spin: long next to the copies and kernels of one step


def parse_args(description: str, delay_cycles: int = DELAY_CYCLES) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64, help="rows per batch")
    parser.add_argument("--dim", type=int, default=512, help="columns per batch (and the weight's size)")
    parser.add_argument("--delay-cycles", type=int, default=delay_cycles,
                        help="GPU spin (torch.cuda._sleep) that stands in for a slow copy or a long kernel, so "
                             "that a missing synchronisation shows up on every run; 0 = none")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dump", metavar="FILE", default=None,
                        help="under streamalloc: write streamalloc.dump(FILE) at the end, for python -m "
                             "streamalloc.report FILE (with pending_history:N in the conf, add --timeline OUT.png)")
    parser.add_argument("--memory-history", metavar="FILE", default=None,
                        help="record PyTorch's allocation history (torch.cuda.memory._record_memory_history) and "
                             "write the snapshot to FILE at the end (torch.cuda.memory._dump_snapshot), for "
                             "memory_viz or python examples/memory_viz.py FILE")
    return parser.parse_args()


class Pipeline:
    """Host batches in pinned memory, a weight on the GPU, the per-step results and their reference."""

    def __init__(self, args: argparse.Namespace):
        if not torch.cuda.is_available():
            sys.exit("this example needs a CUDA device")
        self.args = args
        if args.memory_history:
            # Before the first allocation, so that the trace holds every block the pipeline uses.
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        generator = torch.Generator().manual_seed(args.seed)
        self.host = [torch.randn(args.batch, args.dim, generator=generator).pin_memory()
                     for _ in range(UNIQUE_BATCHES)]
        self.weight = torch.randn(args.dim, args.dim, generator=generator).cuda() / args.dim ** 0.5
        # The answer for each distinct batch, computed on one stream with nothing to race against.
        self.reference = torch.stack([self.consume(h.cuda()) for h in self.host])
        self.results = torch.zeros(args.steps, args.batch, device="cuda")
        torch.cuda.synchronize()

    def host_batch(self, step: int) -> torch.Tensor:
        return self.host[step % UNIQUE_BATCHES]

    def consume(self, batch: torch.Tensor) -> torch.Tensor:
        """The model: one layer, reduced to a vector per batch."""
        return torch.relu(batch @ self.weight).sum(dim=1)

    def slow_copy(self, step: int) -> torch.Tensor:
        """`host_batch(step).cuda(non_blocking=True)` on the current stream, made slow: the memory
        is taken first, then the stream spins before the copy, as behind a long transfer."""
        data = torch.empty(self.args.batch, self.args.dim, device="cuda")
        self._spin()
        data.copy_(self.host_batch(step), non_blocking=True)
        return data

    def slow_kernel(self) -> None:
        """A long kernel on the current stream, ahead of whatever reads the batch next."""
        self._spin()

    def _spin(self) -> None:
        if self.args.delay_cycles:
            torch.cuda._sleep(self.args.delay_cycles)

    def summarize(self, name: str) -> dict:
        """Check every step against the reference, print a summary, return it."""
        torch.cuda.synchronize()
        steps = self.args.steps
        expected = self.reference[torch.arange(steps, device="cuda") % UNIQUE_BATCHES]
        wrong = (self.results != expected).any(dim=1)
        nan = self.results.isnan().any(dim=1)
        summary = {
            "example": name,
            "allocator": allocator_name(),
            "steps": steps,
            "mismatched_steps": int(wrong.sum()),
            "nan_steps": int(nan.sum()),
            "digest": hashlib.sha256(self.results.cpu().numpy().tobytes()).hexdigest(),
        }
        print(f"{name}: {steps} steps on {summary['allocator']}: {summary['mismatched_steps']} steps read wrong "
              f"data ({summary['nan_steps']} of them NaN, the poisoned bytes of streamalloc's poison option)")
        if self.args.memory_history:
            torch.cuda.memory._dump_snapshot(self.args.memory_history)
            torch.cuda.memory._record_memory_history(enabled=None)
            summary["memory_history"] = self.args.memory_history
        stream_stats = print_streamalloc_stats()
        if stream_stats is not None:
            summary["stream_stats"] = stream_stats
            if self.args.dump:
                import streamalloc

                streamalloc.dump(self.args.dump)
                summary["dump"] = self.args.dump
        print(json.dumps(summary))
        return summary


def allocator_name() -> str:
    try:
        import streamalloc
    except ImportError:
        return "native"
    return f"streamalloc ({streamalloc.active_path()})" if streamalloc.is_enabled() else "native"


def print_streamalloc_stats() -> dict | None:
    """Print streamalloc's statistics when it is the allocator; return its stream stats."""
    try:
        import streamalloc
        from streamalloc import report
    except ImportError:
        return None
    if not streamalloc.is_enabled():
        return None
    stats = streamalloc.stats()
    print(report.format_stats(stats, torch.cuda.current_device()))
    return stats.get("stream_stats")

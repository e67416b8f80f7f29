"""The prefetch pipeline, broken: the batch is copied on a prefetch stream and consumed on a compute
stream that never waits for the copy. record_stream is there, which keeps the memory from early
reuse, but it orders nothing: the consumer reads the batch before it has landed.

    python examples/seed_broken_pipeline.py                                   # silently wrong
    python -m streamalloc --conf poison:both examples/seed_broken_pipeline.py  # loudly NaN
    python -m streamalloc --conf check_sync:1,audit:warn examples/seed_broken_pipeline.py  # named

Under PyTorch's allocator the early reads see stale bytes, plausible and wrong. streamalloc's
poison:both fills memory with 0xFF (NaN) as it is handed out and once it is free, so the same bug
shows up as NaN; check_sync:1 reports every record_stream'ed batch whose consumer stream never waited
for the producer (missing_wait_warnings in the stats). The fix is seed_fixed_pipeline.py.

The host waits for each step (as a loop that logs its loss every step does), so every step starts
on an idle GPU and the race goes the same way each time: the copy waits ~1 ms behind its spin, the
consumer reads at once.
"""

import torch
from _pipeline import Pipeline, parse_args


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0], delay_cycles=2_000_000)
    p = Pipeline(args)
    prefetch_stream = torch.cuda.Stream()
    compute_stream = torch.cuda.Stream()
    compute_stream.wait_stream(torch.cuda.current_stream())  # the weight and results come from there

    def prefetch_next(step: int) -> torch.Tensor:
        with torch.cuda.stream(prefetch_stream):
            return p.slow_copy(step)

    for step in range(args.steps):
        batch = prefetch_next(step)
        # BUG: missing compute_stream.wait_event(<event recorded after the copy>)
        with torch.cuda.stream(compute_stream):
            p.results[step].copy_(p.consume(batch))
            batch.record_stream(compute_stream)  # protects the memory; does not order the streams
        torch.cuda.synchronize()
    torch.cuda.current_stream().wait_stream(compute_stream)
    p.summarize("seed_broken_pipeline")


if __name__ == "__main__":
    main()

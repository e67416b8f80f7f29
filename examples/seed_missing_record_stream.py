"""The prefetch pipeline without record_stream: the compute stream waits for the copy, but nobody
tells the allocator that the batch is used on the compute stream. When the loop drops its reference,
the memory goes back to the prefetch stream's pool and the next copy overwrites it while the compute
stream, behind a long kernel, has not read it yet.

    python examples/seed_missing_record_stream.py        # silently wrong
    python -m streamalloc --conf poison:free,quarantine_mb:64 examples/seed_missing_record_stream.py

With poison:free, streamalloc fills a freed block with 0xFF in its stream's order at once, and
quarantine_mb keeps the last 64 MB of freed blocks from being handed out again, so the late reader
sees NaN instead of a later batch copied into the same memory. The fix is seed_fixed_pipeline.py.
"""

import torch
from _pipeline import Pipeline, parse_args


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0])
    p = Pipeline(args)
    prefetch_stream = torch.cuda.Stream()
    compute_stream = torch.cuda.Stream()
    compute_stream.wait_stream(torch.cuda.current_stream())
    prefetch_done = torch.cuda.Event()

    def prefetch_next(step: int) -> torch.Tensor:
        with torch.cuda.stream(prefetch_stream):
            data = p.host_batch(step).cuda(non_blocking=True)
            prefetch_done.record(prefetch_stream)
        return data

    for step in range(args.steps):
        batch = prefetch_next(step)
        compute_stream.wait_event(prefetch_done)  # the read is ordered after the copy
        with torch.cuda.stream(compute_stream):
            p.slow_kernel()
            p.results[step].copy_(p.consume(batch))
            # BUG: missing batch.record_stream(compute_stream)
    torch.cuda.current_stream().wait_stream(compute_stream)
    p.summarize("seed_missing_record_stream")


if __name__ == "__main__":
    main()

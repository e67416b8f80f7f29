"""The prefetch pipeline, fixed: the compute stream waits on an event recorded after the copy
(execution order), and the batch is record_stream'ed on the compute stream (memory lifetime). The
slow copy and the long kernel of the broken examples are kept, and every step is still right.

    python examples/seed_fixed_pipeline.py
    python -m streamalloc --conf poison:both,audit:warn examples/seed_fixed_pipeline.py

Under streamalloc, the stats at the end show one record_stream per step and the fences that covered
them: a fence is one event per stream and batch of frees, not one per block.
"""

import torch
from _pipeline import Pipeline, parse_args


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0])
    p = Pipeline(args)
    prefetch_stream = torch.cuda.Stream()
    compute_stream = torch.cuda.Stream()
    compute_stream.wait_stream(torch.cuda.current_stream())
    prefetch_done = torch.cuda.Event()  # one event, reused every step

    def prefetch_next(step: int) -> torch.Tensor:
        with torch.cuda.stream(prefetch_stream):
            data = p.slow_copy(step)
            prefetch_done.record(prefetch_stream)  # after the copy, not before it
        return data

    for step in range(args.steps):
        batch = prefetch_next(step)
        compute_stream.wait_event(prefetch_done)  # fix 1: the consumer waits for the producer
        with torch.cuda.stream(compute_stream):
            p.slow_kernel()
            p.results[step].copy_(p.consume(batch))
            batch.record_stream(compute_stream)  # fix 2: the memory stays reserved for the consumer
    torch.cuda.current_stream().wait_stream(compute_stream)
    p.summarize("seed_fixed_pipeline")


if __name__ == "__main__":
    main()

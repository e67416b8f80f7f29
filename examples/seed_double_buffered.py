"""The prefetch pipeline, double-buffered and correct: while the compute stream works on one buffer,
the prefetch stream fills the other. Each buffer has its own "filled" event, so the consumer of a
buffer waits for that buffer's copy and for nothing else, and every batch is record_stream'ed on the
compute stream.

    python examples/seed_double_buffered.py
    python -m streamalloc --conf poison:both examples/seed_double_buffered.py
"""

import torch
from _pipeline import Pipeline, parse_args


def main() -> None:
    args = parse_args(__doc__.split("\n\n")[0])
    p = Pipeline(args)
    prefetch_stream = torch.cuda.Stream()
    compute_stream = torch.cuda.Stream()
    compute_stream.wait_stream(torch.cuda.current_stream())
    filled = [torch.cuda.Event(), torch.cuda.Event()]
    buffers: list[torch.Tensor | None] = [None, None]

    def produce(slot: int, step: int) -> None:
        with torch.cuda.stream(prefetch_stream):
            buffers[slot] = p.slow_copy(step)
            filled[slot].record(prefetch_stream)

    produce(0, 0)
    for step in range(args.steps):
        current, following = step % 2, (step + 1) % 2
        if step + 1 < args.steps:
            produce(following, step + 1)  # overlaps with this step's compute
        compute_stream.wait_event(filled[current])
        with torch.cuda.stream(compute_stream):
            p.slow_kernel()
            p.results[step].copy_(p.consume(buffers[current]))
            buffers[current].record_stream(compute_stream)
    torch.cuda.current_stream().wait_stream(compute_stream)
    p.summarize("seed_double_buffered")


if __name__ == "__main__":
    main()

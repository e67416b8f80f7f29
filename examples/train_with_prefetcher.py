"""The copy-overlap training loop: a small conv net on synthetic data (nothing is downloaded), whose
side-stream prefetcher copies the next batch from pinned memory (non_blocking) while the current one
trains.

The default stream orders itself after each copy with wait_stream, and each batch is
record_stream'ed on the default stream, so its memory is not handed to the next copy while the
default stream still trains on it (a loop without that record_stream has exactly that race).

    python examples/train_with_prefetcher.py
    python -m streamalloc examples/train_with_prefetcher.py
    python -m streamalloc examples/train_with_prefetcher.py --benchmark   # cudnn.benchmark = True
    python -m streamalloc examples/train_with_prefetcher.py --steps 3000  # a fixed number of steps

With the default (deterministic) settings the losses match PyTorch's allocator bit for bit; the last
stdout line is a JSON summary. It includes the steady-state throughput ("steps_per_s", "samples_per_s"
over "timed_steps"): the steps after the first --warmup-steps (CUDA init, the first kernels, cudnn
autotuning), timed between two torch.cuda.synchronize() calls (bench/studies/audit_overhead.py uses it).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises

import torch  # noqa: E402
from _pipeline import allocator_name, print_streamalloc_stats  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Prefetcher:
    """Yields (images, labels) already on the GPU; the next batch is copied on a side stream."""

    def __init__(self, loader: DataLoader, device: torch.device):
        self.loader = loader
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def _preload(self, iterator):
        try:
            images, labels = next(iterator)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream):
            return (images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True))

    def __iter__(self):
        iterator = iter(self.loader)
        upcoming = self._preload(iterator)
        while upcoming is not None:
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(self.stream)  # the copy is done before the step reads the batch
            images, labels = upcoming
            # The batch was allocated on the side stream but is used on the consumer's: without this
            # the allocator may hand its memory to the next copy while the step still reads it.
            images.record_stream(consumer)
            labels.record_stream(consumer)
            upcoming = self._preload(iterator)
            yield images, labels


class GlobalAvgPool(nn.Module):
    """Mean over height and width. (nn.AdaptiveAvgPool2d's CUDA backward has no deterministic
    implementation, which torch.use_deterministic_algorithms(True) refuses.)"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, stride=2), nn.BatchNorm2d(64), nn.ReLU(),
        GlobalAvgPool(), nn.Linear(64, 10),
    )


def synthetic_dataset(samples: int, seed: int) -> TensorDataset:
    """Images whose class is encoded in their mean colour, so the loss really falls."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    images = torch.randn(samples, 3, 32, 32, generator=generator) * 0.5
    images += (labels.float() / 10.0 - 0.45).view(-1, 1, 1, 1)
    return TensorDataset(images, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--benchmark", action="store_true",
                        help="cudnn.benchmark = True (autotuned, not bit-reproducible) instead of deterministic")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="run exactly N training steps, as many epochs as that takes (the last one partial); "
                             "--epochs is then ignored")
    parser.add_argument("--warmup-steps", type=int, default=5, metavar="W",
                        help="steps left out of the steady-state timing (default: 5)")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must not be negative")
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA device")

    torch.manual_seed(args.seed)
    if args.benchmark:
        torch.backends.cudnn.benchmark = True
    else:
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True)

    device = torch.device("cuda", 0)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    loader = DataLoader(synthetic_dataset(args.samples, args.seed), batch_size=args.batch_size, shuffle=True,
                        pin_memory=True, generator=torch.Generator().manual_seed(args.seed))

    losses = []
    step = 0  # steps done so far, over all epochs
    timed_from = None  # perf_counter() when step `args.warmup_steps` began
    epoch = 0
    while (step < args.steps) if args.steps is not None else (epoch < args.epochs):
        total = torch.zeros((), device=device)
        batches = 0
        for images, labels in Prefetcher(loader, device):
            if step == args.warmup_steps:  # steady state from here: drain the warmup's work first
                torch.cuda.synchronize(device)
                timed_from = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            batches += 1
            step += 1
            if args.steps is not None and step >= args.steps:
                break
        if batches == 0 and args.steps is not None:  # would loop forever
            sys.exit("the data loader yielded no batches: raise --samples")
        losses.append((total / batches).item())  # one host sync per epoch
        print(f"epoch {epoch}: mean loss {losses[-1]:.6f}")
        epoch += 1
    torch.cuda.synchronize(device)
    timed_steps = step - args.warmup_steps if timed_from is not None else 0
    seconds = time.perf_counter() - timed_from if timed_from is not None else None
    steps_per_s = timed_steps / seconds if timed_steps and seconds else None
    if steps_per_s is not None:
        print(f"steady state: {timed_steps} steps in {seconds:.3f} s, {steps_per_s:.1f} steps/s "
              f"({steps_per_s * args.batch_size:.0f} samples/s; the first {args.warmup_steps} steps not timed)")

    try:
        peak = torch.cuda.max_memory_allocated(device)
    except RuntimeError:  # streamalloc's C-ABI path: PyTorch's pluggable base class serves no stats
        peak = None
    summary = {"example": "train_with_prefetcher", "allocator": allocator_name(), "losses": losses,
               "final_loss": losses[-1], "benchmark": args.benchmark, "max_memory_allocated": peak,
               "steps": step, "batch_size": args.batch_size, "warmup_steps": args.warmup_steps,
               "timed_steps": timed_steps, "timed_seconds": seconds, "steps_per_s": steps_per_s,
               "samples_per_s": steps_per_s * args.batch_size if steps_per_s is not None else None}
    stream_stats = print_streamalloc_stats()
    if stream_stats is not None:
        summary["stream_stats"] = stream_stats
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

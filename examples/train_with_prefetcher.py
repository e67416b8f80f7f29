"""The seed's training loop with a side-stream prefetcher (shared/seeds/004_*.txt), on a small conv net
and synthetic data (nothing is downloaded).

The prefetcher copies the next batch on its own stream while the current one trains. The seed's loop
orders the copy with wait_stream but never calls record_stream, so a batch's memory can be reused by
the next copy while the default stream still trains on it; this version adds the record_stream.

    python examples/train_with_prefetcher.py
    python -m streamalloc examples/train_with_prefetcher.py
    python -m streamalloc examples/train_with_prefetcher.py --benchmark   # cudnn.benchmark = True

With the default (deterministic) settings the losses match PyTorch's allocator bit for bit; the last
stdout line is a JSON summary.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA initialises

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from _pipeline import allocator_name, print_streamalloc_stats  # noqa: E402


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--benchmark", action="store_true",
                        help="cudnn.benchmark = True (autotuned, not bit-reproducible) instead of deterministic")
    args = parser.parse_args()
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
    for epoch in range(args.epochs):
        total = torch.zeros((), device=device)
        batches = 0
        for images, labels in Prefetcher(loader, device):
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(images), labels)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            batches += 1
        losses.append((total / batches).item())  # one host sync per epoch
        print(f"epoch {epoch}: mean loss {losses[-1]:.6f}")

    try:
        peak = torch.cuda.max_memory_allocated(device)
    except RuntimeError:  # streamalloc's C-ABI path: PyTorch's pluggable base class serves no stats
        peak = None
    summary = {"example": "train_with_prefetcher", "allocator": allocator_name(), "losses": losses,
               "final_loss": losses[-1], "benchmark": args.benchmark, "max_memory_allocated": peak}
    stream_stats = print_streamalloc_stats()
    if stream_stats is not None:
        summary["stream_stats"] = stream_stats
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

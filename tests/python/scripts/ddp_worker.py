"""A DDP training worker for `torchrun --nproc_per_node 2 [-m streamalloc] ddp_worker.py`.

Each rank trains a small conv net on its own synthetic batches, fed by a side-stream prefetcher
(record_stream on every batch); gradients are all-reduced by ProcessGroupNCCL. Each step's loss is
also all-reduced from a side "metrics" stream, the way training loops overlap metric reductions:
the metrics stream waits for the compute stream, the loss copy is record_stream'ed on it, and the
collective runs there. Every cross-stream use is ordered correctly, so check_sync:1 must stay
silent. Rank 0 prints the final mean loss and, under streamalloc, its stream statistics."""

import os

import torch
import torch.distributed as dist
from _common import emit, streamalloc_enabled
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 30


def main() -> None:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    device = torch.device("cuda", local_rank)
    model = DistributedDataParallel(nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.AvgPool2d(16), nn.Flatten(), nn.Linear(32, 10)).to(device), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(1000 + rank)
    host = [(torch.randn(32, 3, 32, 32, generator=generator).pin_memory(),
             torch.randint(0, 10, (32,), generator=generator).pin_memory()) for _ in range(STEPS)]

    copy_stream = torch.cuda.Stream(device)
    metrics_stream = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)
    mean_losses = torch.zeros(STEPS, device=device)

    def prefetch(step):
        with torch.cuda.stream(copy_stream):
            return tuple(t.to(device, non_blocking=True) for t in host[step])

    upcoming = prefetch(0)
    losses = torch.zeros(STEPS, device=device)
    for step in range(STEPS):
        compute.wait_stream(copy_stream)
        images, labels = upcoming
        images.record_stream(compute)
        labels.record_stream(compute)
        if step + 1 < STEPS:
            upcoming = prefetch(step + 1)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses[step] = loss.detach()
        loss_copy = loss.detach().clone()  # allocated on the compute stream
        metrics_stream.wait_stream(compute)
        with torch.cuda.stream(metrics_stream):
            loss_copy.record_stream(metrics_stream)
            dist.all_reduce(loss_copy)
            mean_losses[step] = loss_copy / dist.get_world_size()
    compute.wait_stream(metrics_stream)
    dist.all_reduce(losses)
    losses /= dist.get_world_size()
    result = {"losses": losses.tolist(), "world_size": dist.get_world_size(),
              "metrics_match": bool(torch.allclose(mean_losses, losses, rtol=1e-5, atol=0.0))}
    if streamalloc_enabled():
        import streamalloc

        result["stream_stats"] = streamalloc.stats()["stream_stats"]
    if rank == 0:
        emit(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

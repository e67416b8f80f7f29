"""Out of memory under streamalloc: torch.cuda.OutOfMemoryError with streamalloc's report, the OOM
observers PyTorch attaches are called, and training goes on once memory is freed. Run it with a
memory_fraction cap so that the cap, not the whole GPU, is what runs out."""

import torch
from torch import nn

from _common import emit

GiB = 1 << 30


def main() -> None:
    result = {}
    observed = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: observed.append(list(args)))
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: larger than any device
    except torch.cuda.OutOfMemoryError as error:
        result["huge"] = str(error)
    hog = []
    try:
        while len(hog) < 1000:
            hog.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as error:
        result["capped"] = str(error)
    result["gib_held_at_oom"] = len(hog)
    del hog

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data, target = torch.randn(256, 1024, device="cuda"), torch.randint(0, 10, (256,), device="cuda")
    for _ in range(20):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
    result["loss_after"] = loss.item()
    result["num_ooms"] = torch.cuda.memory_stats()["num_ooms"]
    result["observer_calls"] = observed
    emit(result)


if __name__ == "__main__":
    main()

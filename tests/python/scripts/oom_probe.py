"""Out of memory, probed the same way under any allocator: torch.cuda.OutOfMemoryError with PyTorch's
sentences (and, under streamalloc, its report after them), the OOM observers PyTorch attaches are
called, and training goes on once memory is freed. A memory fraction of 0.05 makes the cap, not the
whole GPU, what runs out; a fraction of 0 refuses every new segment."""

import torch
from _common import emit
from torch import nn

GiB = 1 << 30


def main() -> None:
    result = {}
    observed = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: observed.append(list(args)))
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: larger than any device
    except torch.cuda.OutOfMemoryError as error:
        result["huge"] = str(error)
    # PyTorch's own test_out_of_memory sizes: below 1 EiB the usual sentences, from 1 EiB "more than 1EB".
    try:
        torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8, device="cuda")
    except torch.cuda.OutOfMemoryError as error:
        result["huge_pytorch_test"] = str(error)
    try:
        torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8, device="cuda")
    except torch.cuda.OutOfMemoryError as error:
        result["exa"] = str(error)
    torch.cuda.set_per_process_memory_fraction(0.05)
    hog = []
    try:
        while len(hog) < 1000:
            hog.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as error:
        result["capped"] = str(error)
    result["gib_held_at_oom"] = len(hog)
    del hog
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.0)
    result["fraction_zero"] = torch.cuda.get_per_process_memory_fraction()
    try:
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        result["zero_cap"] = None
    except torch.cuda.OutOfMemoryError as error:
        result["zero_cap"] = str(error)
    torch.cuda.set_per_process_memory_fraction(1.0)

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

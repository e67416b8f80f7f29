"""Behaviours of PyTorch's own CUDA allocator tests (test/test_cuda.py), probed in one process after
CUDA graph work, as a test suite would run them, under any allocator:

    python contract_probe.py                  # PyTorch's allocator: the contract
    python -m streamalloc contract_probe.py   # the same behaviours under streamalloc

The process first captures and replays a CUDA graph with a forked side stream, uses and deletes a
torch.cuda.MemPool and trains a small MLP through torch.cuda.make_graphed_callables, so that every
behaviour after it runs on an allocator that has served (and released) private pools. The
allocation-history behaviours of history_probe.py (memory snapshots, memory_viz's plots, the
profiler's memory) run last, in the same process. Each behaviour reports the facts it observed, or the
traceback of what it raised, under its own key; the last stdout line is one JSON object:
{"allocator": ..., "behaviours": {name: facts}}. The checks are this project's own, of the behaviour
each upstream test observes; test_gpu_contract.py and test_gpu_history.py hold the bar.
"""

import gc
import statistics

import history_probe
import torch
from _common import behaviour as run_behaviour
from _common import emit
from torch import nn

MiB = 1 << 20
GiB = 1 << 30


# ---- helpers ----

def behaviour(results: dict, name: str, fn) -> None:
    """One behaviour (_common.behaviour), then the cache emptied."""
    run_behaviour(results, name, fn, after=lambda: (gc.collect(), torch.cuda.empty_cache()))


def measure_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep, the median of a few timed spins."""
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        end.synchronize()
        samples.append(1_000_000 / start.elapsed_time(end))
    return statistics.median(samples)


def spin(ms: float) -> None:
    torch.cuda._sleep(int(ms * CYCLES_PER_MS))


def error_facts(error: BaseException) -> dict:
    return {"type": type(error).__name__, "is_oom": isinstance(error, torch.cuda.OutOfMemoryError),
            "is_runtime_error": isinstance(error, RuntimeError), "message": str(error)[:400]}


def raised(fn) -> dict | None:
    """What fn raised (type, message), or None if it returned."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001
        return error_facts(error)
    return None


# ---- graph work that runs first ----

def graph_capture_with_side_stream() -> dict:
    static_in = torch.zeros(1 << 16, device="cuda")
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    # Warm up on a side stream, as PyTorch asks before a capture.
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        (static_in * 2 + 1).sum()
    torch.cuda.current_stream().wait_stream(warm)
    with torch.cuda.graph(graph):
        doubled = static_in * 2
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            shifted = doubled + 1
        torch.cuda.current_stream().wait_stream(side)
        shifted.record_stream(torch.cuda.current_stream())
        static_out = shifted.sum()
        del doubled, shifted
    sums, expected = [], []
    for value in (1.0, 2.5, -3.0):
        static_in.fill_(value)
        graph.replay()
        sums.append(static_out.item())
        expected.append((value * 2 + 1) * static_in.numel())
    del graph, static_out
    return {"sums": sums, "expected": expected}


def mempool_used_and_deleted() -> dict:
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        inside = torch.full((MiB,), 3.0, device="cuda")
    outside = torch.ones(MiB, device="cuda")
    total = (inside + outside).sum().item()
    segments_in_pool = len(pool.snapshot())
    del inside
    del pool
    gc.collect()
    return {"total": total, "expected": 4.0 * MiB, "segments_in_pool": segments_in_pool}


def graphed_mlp() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    eager = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)).cuda()
    eager.load_state_dict(model.state_dict())
    sample = torch.randn(16, 32, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    matches = []
    for _step in range(3):
        # Each step's gradients alone: a graphed backward writes its parameter gradients into the graph's
        # static buffers, which .grad then aliases, so accumulating across replays is not eager's sum.
        for p in (*model.parameters(), *eager.parameters()):
            p.grad = None
        x = torch.randn(16, 32, device="cuda", requires_grad=True)
        out_graphed, out_eager = graphed(x), eager(x)
        out_graphed.sum().backward()
        out_eager.sum().backward()
        matches.append(torch.allclose(out_graphed, out_eager, atol=1e-5)
                       and all(torch.allclose(a.grad, b.grad, atol=1e-5)
                               for a, b in zip(model.parameters(), eager.parameters())))
    del graphed, model, eager
    return {"steps_matching_eager": matches}


# ---- the upstream behaviours ----

def record_stream() -> dict:
    """A copy made on a side stream, recorded on the current stream, which is kept busy before it
    reads the copy: the side stream must not get the block back until the current stream is done
    with it, and gets it back once the host has synchronised with the current stream."""
    host = torch.tensor([1.0, 2.0, 3.0, 4.0]).pin_memory()
    result = torch.empty(4, device="cuda")
    side = torch.cuda.Stream()
    current = torch.cuda.current_stream()
    with torch.cuda.stream(side):
        copy = host.cuda(non_blocking=True)
    ptr = copy.data_ptr()
    current.wait_stream(side)
    copy.record_stream(current)
    spin(50)  # the read below waits behind this
    result.copy_(copy)
    del copy
    with torch.cuda.stream(side):
        early = torch.empty(4, device="cuda")
        early.zero_()
    facts = {"reused_too_soon": early.data_ptr() == ptr, "current_was_busy": not current.query()}
    facts["result"] = result.tolist()
    current.synchronize()
    with torch.cuda.stream(side):
        again = torch.empty(4, device="cuda")
    facts["reused_after_sync"] = again.data_ptr() == ptr
    del early, again
    return facts


def record_stream_on_shifted_view() -> dict:
    """record_stream on a view that starts inside its block protects the whole block."""
    alloc_stream, record_stream_ = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(alloc_stream):
        base = torch.full((100,), 10.0, device="cuda")
    view = base[50:]
    with torch.cuda.stream(record_stream_):
        spin(50)
    view.record_stream(record_stream_)
    facts = {"storage_offset": view.storage_offset()}
    ptr = base.data_ptr()
    del base, view
    alloc_stream.synchronize()  # not the recorded stream: the block stays protected
    with torch.cuda.stream(alloc_stream):
        retry = torch.empty(100, device="cuda")
    facts["reused_while_recorded_busy"] = retry.data_ptr() == ptr
    facts["recorded_was_busy"] = not record_stream_.query()
    record_stream_.synchronize()
    with torch.cuda.stream(alloc_stream):
        after = torch.empty(100, device="cuda")
    facts["reused_after_recorded_sync"] = after.data_ptr() == ptr
    del retry, after
    return facts


def memory_stats() -> dict:
    """A 1 KiB tensor counted in active bytes while it lives and in freed bytes after; resetting
    the peaks after empty_cache() brings them back to where they were."""
    acc = torch.accelerator
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    facts = {"allocated": acc.memory_allocated(), "max_allocated": acc.max_memory_allocated(),
             "reserved": acc.memory_reserved(), "max_reserved": acc.max_memory_reserved()}
    active_before = acc.memory_stats()["active_bytes.all.current"]
    tmp = torch.randn(256, device="cuda")
    stats = acc.memory_stats()
    facts["active_delta_live"] = stats["active_bytes.all.current"] - active_before
    facts["active_freed_live"] = stats["active_bytes.all.freed"]
    del tmp
    gc.collect()
    acc.empty_cache()
    stats = acc.memory_stats()
    facts["active_delta_after"] = stats["active_bytes.all.current"] - active_before
    facts["active_freed_after"] = stats["active_bytes.all.freed"]
    acc.reset_peak_memory_stats()
    facts["max_allocated_after_reset"] = acc.max_memory_allocated()
    facts["max_reserved_after_reset"] = acc.max_memory_reserved()
    # The same numbers through torch.cuda, which the accelerator API forwards to.
    facts["cuda_matches_accelerator"] = (torch.cuda.memory_stats() == acc.memory_stats()
                                         and torch.cuda.memory_allocated() == acc.memory_allocated())
    return facts


def memory_allocation() -> dict:
    """caching_allocator_alloc counts in memory_allocated() until caching_allocator_delete."""
    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    ptr = torch.cuda.caching_allocator_alloc(1)
    facts = {"ptr_type": type(ptr).__name__, "during": torch.cuda.memory_allocated() - before}
    torch.cuda.caching_allocator_delete(ptr)
    facts["after"] = torch.cuda.memory_allocated() - before
    # With an explicit device and stream, as collective libraries call it.
    side = torch.cuda.Stream()
    ptr = torch.cuda.caching_allocator_alloc(MiB, device=0, stream=side)
    facts["during_on_stream"] = torch.cuda.memory_allocated() - before
    torch.cuda.caching_allocator_delete(ptr)
    facts["after_on_stream"] = torch.cuda.memory_allocated() - before
    return facts


def out_of_memory() -> dict:
    """Requests no device can serve raise; the next kernel runs as if nothing happened."""
    tensor = torch.zeros(1024, device="cuda")
    facts = {
        "huge": raised(lambda: torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8, device="cuda")),
        "exa": raised(lambda: torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8, device="cuda")),
    }
    tensor.fill_(1)
    facts["kernel_after"] = bool((tensor == 1).all())
    return facts


def out_of_memory_retry() -> dict:
    """Half the device twice does not fit; once the first half is freed, it does."""
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    size = int(total * 0.5)
    first = torch.empty(size, dtype=torch.int8, device="cuda")
    facts = {"second_while_first_lives": raised(lambda: torch.empty(size, dtype=torch.int8, device="cuda"))}
    del first
    second = torch.empty(size, dtype=torch.int8, device="cuda")
    facts["second_after_free"] = second.numel() == size
    del second
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return facts


def set_per_process_memory_fraction() -> dict:
    """Bad fractions are refused before the allocator sees them; at 0.5 an allocation just under
    half the device fits and one of half the device does not."""
    original = torch.cuda.get_per_process_memory_fraction(0)
    torch.cuda.reset_peak_memory_stats(0)
    facts = {"original": original,
             "int_one": raised(lambda: torch.cuda.set_per_process_memory_fraction(1)),
             "negative": raised(lambda: torch.cuda.set_per_process_memory_fraction(-0.1)),
             "two": raised(lambda: torch.cuda.set_per_process_memory_fraction(2.0))}
    try:
        tensor = torch.zeros(1024, device="cuda")
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(0.5, 0)
        facts["get_after_half"] = torch.cuda.get_per_process_memory_fraction(0)

        def just_under_half():
            held = torch.empty(int(total * 0.499) - torch.cuda.max_memory_reserved(), dtype=torch.int8,
                               device="cuda")
            del held

        facts["just_under_half"] = raised(just_under_half)
        torch.cuda.empty_cache()
        facts["half"] = raised(lambda: torch.empty(int(total * 0.5), dtype=torch.int8, device="cuda"))
        tensor.fill_(1)
        facts["kernel_after"] = bool((tensor == 1).all())
    finally:
        torch.cuda.set_per_process_memory_fraction(original, 0)
    facts["restored"] = torch.cuda.get_per_process_memory_fraction(0)
    return facts


def get_per_process_memory_fraction() -> dict:
    """Every fraction set in [0, 1] is read back exactly."""
    initial = torch.cuda.get_per_process_memory_fraction()
    generator = torch.Generator().manual_seed(0)
    values = [1.0, 0.0] + [float(v) for v in torch.rand(3, generator=generator)]
    pairs = []
    for value in values:
        torch.cuda.set_per_process_memory_fraction(value)
        pairs.append([value, torch.cuda.get_per_process_memory_fraction()])
    torch.cuda.set_per_process_memory_fraction(initial)
    return {"initial": initial, "set_and_got": pairs,
            "restored": torch.cuda.get_per_process_memory_fraction()}


def caching_allocator_record_stream_oom() -> dict:
    """Blocks whose reuse waits on record_stream are still given back when memory runs out.

    PyTorch's test allocates 100 x 160 MiB; on a device that large that never runs out, so a memory
    fraction caps the process 2 GiB above what it holds, and a spin per step keeps the recorded
    stream far behind the host: without reclaiming recorded blocks at the cap, the loop fails.
    Each step's tensor holds its step number, so a block handed out before the side stream read it
    shows up in the sum."""
    n = 40 * MiB  # floats: 160 MiB
    steps = 100
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        acc = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(0).total_memory
    original = torch.cuda.get_per_process_memory_fraction()
    torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved() + 2 * GiB) / total))
    facts = {"steps_done": 0, "error": None}
    try:
        for step in range(steps):
            x = torch.full((n,), float(step), device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                spin(2)
                acc += x
            x.record_stream(side)  # x's block waits for the side stream's add
            del x
            facts["steps_done"] = step + 1
    except Exception as error:  # noqa: BLE001
        facts["error"] = error_facts(error)
    finally:
        torch.cuda.set_per_process_memory_fraction(original)
    torch.cuda.synchronize()
    facts["sum_ok"] = bool((acc == float(sum(range(steps)))).all())
    facts["max_reserved_gib"] = torch.cuda.max_memory_reserved() / GiB
    del acc
    torch.cuda.empty_cache()
    return facts


def matmul_memory_use() -> dict:
    """matmul of a broadcast (expanded) batch uses no more memory than of the batch itself, or bmm."""
    def peak_since_last() -> int:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return peak

    a = torch.rand(1, 32, 32, device="cuda")
    b = torch.rand(24, 32, 1, device="cuda")
    peak_since_last()
    torch.matmul(a, b)
    matmul = peak_since_last()
    a = a.expand(24, 32, 32)
    torch.matmul(a, b)
    matmul_expanded = peak_since_last()
    torch.bmm(a, b)
    bmm = peak_since_last()
    return {"matmul": matmul, "matmul_expanded": matmul_expanded, "bmm": bmm}


def multiply_in_stream():
    """An autograd function whose backward checks it runs on its forward's stream and lags there."""
    class MultiplyInStream(torch.autograd.Function):
        wrong_streams = 0

        @staticmethod
        def forward(ctx, x, factor):
            ctx.factor = factor
            ctx.stream = torch.cuda.current_stream()
            return x * factor

        @staticmethod
        def backward(ctx, grad):
            if torch.cuda.current_stream() != ctx.stream:
                MultiplyInStream.wrong_streams += 1
            torch.cuda._sleep(5_000_000)
            return grad * ctx.factor, None

    return MultiplyInStream


def streaming_backwards_sync() -> dict:
    """Backward ops run on their forward's stream; grads are safe to use after waiting for that
    stream, or at once in the stream that called backward()."""
    default = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    multiply = multiply_in_stream()
    x = torch.randn(5, 5, device="cuda", requires_grad=True)
    with torch.cuda.stream(stream):
        stream.wait_stream(default)
        multiply.apply(x, 2).sum().backward()
    default.wait_stream(stream)
    facts = {"grad_outside_ok": bool(torch.equal(x.grad, torch.full_like(x, 2))),
             "stream_restored": torch.cuda.current_stream() == default}
    ambient = torch.cuda.Stream()
    x = torch.randn(5, 5, device="cuda", requires_grad=True)
    with torch.cuda.stream(stream):
        stream.wait_stream(default)
        output = multiply.apply(x, 3)
    with torch.cuda.stream(ambient):
        ambient.wait_stream(stream)
        output.sum().backward()
        facts["grad_in_ambient_ok"] = bool(torch.equal(x.grad, torch.full_like(x, 3)))
        facts["ambient_current"] = torch.cuda.current_stream() == ambient
    facts["backward_on_wrong_stream"] = multiply.wrong_streams
    return facts


def streaming_backwards_multiple_streams() -> dict:
    """A model that forks its forward over two streams joined by an event: accumulated and
    out-of-place grads are right, and each leaf's grad hook runs on the stream of its first use."""
    multiply = multiply_in_stream()

    class TwoStreams(nn.Module):
        def __init__(self):
            super().__init__()
            self.event = torch.cuda.Event()
            self.stream0, self.stream1 = torch.cuda.Stream(), torch.cuda.Stream()

        def forward(self, x, first_use_on_ambient):
            if first_use_on_ambient:
                x0 = x.clone()
            self.stream0.wait_stream(torch.cuda.current_stream())
            self.stream1.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream0):
                if not first_use_on_ambient:
                    x0 = x.clone()
                y0 = multiply.apply(x0, 2)
                self.event.record(stream=torch.cuda.current_stream())
            with torch.cuda.stream(self.stream1):
                y1 = multiply.apply(x, 3)
                self.stream1.wait_event(self.event)
                return y0 + y1

    stream = torch.cuda.Stream()
    cases = []
    for first_use_on_ambient in (True, False):
        for out_of_place, iters in ((True, 1), (False, 1), (False, 5)):
            hook_streams_ok = []
            with torch.cuda.stream(stream):
                x = torch.randn(5, 5, device="cuda", requires_grad=True)
                model = TwoStreams().cuda()
                expected_hook_stream = stream if first_use_on_ambient else model.stream0
                x.register_hook(lambda grad, s=expected_hook_stream: hook_streams_ok.append(
                    torch.cuda.current_stream() == s))
                for _ in range(iters):
                    loss = model(x, first_use_on_ambient).sum()
                    if out_of_place:
                        grad = torch.autograd.grad((loss,), (x,))[0]
                    else:
                        loss.backward()
            torch.cuda.current_stream().wait_stream(stream)
            got = grad if out_of_place else x.grad
            cases.append({"first_use_on_ambient": first_use_on_ambient, "out_of_place": out_of_place,
                          "iters": iters, "grad_ok": bool(torch.equal(got, torch.full_like(x, 5.0 * iters))),
                          "hook_streams_ok": all(hook_streams_ok) and len(hook_streams_ok) == iters})
    return {"cases": cases, "backward_on_wrong_stream": multiply.wrong_streams}


def to_non_blocking() -> dict:
    """.to(non_blocking=True) returns before the copy runs (the stream is still busy) and, to the
    host, into pinned memory; a blocking copy waits for the stream."""
    stream = torch.cuda.current_stream()
    cases = []
    for dst in ("cuda", "cpu"):
        for non_blocking in (True, False):
            src = torch.randn(1_000_000, device="cuda" if dst == "cpu" else "cpu", pin_memory=dst == "cuda")
            torch.cuda.synchronize()
            spin(100)
            copy = src.to(device=dst, non_blocking=non_blocking)
            stream_done = stream.query()
            stream.synchronize()
            cases.append({"dst": dst, "non_blocking": non_blocking, "stream_done_at_return": stream_done,
                          "equal": bool(torch.equal(src.cpu(), copy.cpu())), "pinned": copy.is_pinned()})
    return {"cases": cases}


def autocast_cache_leak() -> dict:
    """Under autocast and no_grad, repeated calls do not cache another cast of the weights."""
    linear = nn.Linear(10, 10).cuda()
    data = torch.randn(1, 10, device="cuda")
    with torch.autocast("cuda"), torch.no_grad():
        out = linear(data)
        first = torch.cuda.memory_allocated()
        after = []
        for _ in range(3):
            out = linear(data)
            after.append(torch.cuda.memory_allocated())
    del out
    return {"first": first, "after": after}


GRAPH_WORK = {
    "graph_capture_with_side_stream": graph_capture_with_side_stream,
    "mempool_used_and_deleted": mempool_used_and_deleted,
    "graphed_mlp": graphed_mlp,
}

BEHAVIOURS = {
    "record_stream": record_stream,
    "record_stream_on_shifted_view": record_stream_on_shifted_view,
    "memory_stats": memory_stats,
    "memory_allocation": memory_allocation,
    "out_of_memory": out_of_memory,
    "out_of_memory_retry": out_of_memory_retry,
    "set_per_process_memory_fraction": set_per_process_memory_fraction,
    "get_per_process_memory_fraction": get_per_process_memory_fraction,
    "caching_allocator_record_stream_oom": caching_allocator_record_stream_oom,
    "matmul_memory_use": matmul_memory_use,
    "streaming_backwards_sync": streaming_backwards_sync,
    "streaming_backwards_multiple_streams": streaming_backwards_multiple_streams,
    "to_non_blocking": to_non_blocking,
    "autocast_cache_leak": autocast_cache_leak,
}

CYCLES_PER_MS = 0.0


def main() -> None:
    global CYCLES_PER_MS
    torch.cuda.init()
    CYCLES_PER_MS = measure_cycles_per_ms()
    results = {}
    for name, fn in GRAPH_WORK.items():
        behaviour(results, name, fn)
    for name, fn in BEHAVIOURS.items():
        behaviour(results, name, fn)
    assert not set(history_probe.BEHAVIOURS) & set(results), "behaviour names must be unique"
    history_probe.run_all(results)
    emit({"behaviours": results, "cycles_per_ms": CYCLES_PER_MS, "graph_work": sorted(GRAPH_WORK),
          "upstream": sorted(BEHAVIOURS), "history": sorted(history_probe.BEHAVIOURS)})


if __name__ == "__main__":
    main()

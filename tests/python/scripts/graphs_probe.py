"""CUDA graphs and memory pools, probed the same way under any allocator.

    python graphs_probe.py CASE            # PyTorch's allocator
    python -m streamalloc graphs_probe.py CASE
    python graphs_probe.py CASE --stock    # PyTorch's stock Python CUDAPluggableAllocator over
                                           # libstreamalloc.so, with no memory pool hooks

CASE is one of: capture, isolation, mempool, rng, recovery, training. Each case runs several
behaviours; each behaviour reports the facts it observed (or the traceback of what it raised) under
its own key, so that one failure does not hide the others. The last stdout line is one JSON object:
{"case": ..., "allocator": ..., "behaviours": {name: facts}}.

The facts are what PyTorch's graph capture promises: replays compute what eager execution computes,
memory a graph's replays write into is never handed to anything else, graph-safe RNG, capturable
optimizers. The test (test_gpu_graphs.py) asserts them for each allocator and compares allocators.
"""

import argparse
import gc
import os
import sys
import tempfile
import threading

import torch
from _common import behaviour, emit
from torch import nn

MiB = 1 << 20


# ---- helpers ----


def close(actual: torch.Tensor, expected: torch.Tensor, **tolerances) -> dict:
    """Whether two tensors match within torch.testing's tolerances (defaults unless given), with the
    largest difference, for the test's messages."""
    try:
        torch.testing.assert_close(actual, expected, **tolerances)
        ok, message = True, ""
    except AssertionError as error:
        ok, message = False, str(error)[:600]
    diff = (actual.double() - expected.double()).abs()
    finite = diff[torch.isfinite(diff)]
    return {"ok": ok, "max_abs_diff": float(finite.max()) if finite.numel() else 0.0,
            "nonfinite": int((~torch.isfinite(diff)).sum()), "message": message}


def all_close(pairs, **tolerances) -> dict:
    results = [close(a, b, **tolerances) for a, b in pairs]
    return {"ok": all(r["ok"] for r in results), "max_abs_diff": max((r["max_abs_diff"] for r in results), default=0.0),
            "messages": [r["message"] for r in results if not r["ok"]][:3]}


def reserved() -> int:
    return torch.cuda.memory_reserved()


def settle() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def install_stock_pluggable() -> None:
    """PyTorch's own Python CUDAPluggableAllocator over libstreamalloc.so's C ABI: malloc, free, init,
    record_stream and empty_cache, and none of the memory pool hooks (begin/end allocate to pool,
    release pool), so graph capture allocates from the ordinary cache."""
    from streamalloc import _native

    path = _native.find_c_library()
    if path is None:
        raise SystemExit("libstreamalloc.so not found: set STREAMALLOC_LIBRARY_DIR")
    library = _native.CLibrary(path)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(str(path), "streamalloc_malloc", "streamalloc_free")
    hooks = allocator.allocator()
    hooks.set_init_fn(library.address("streamalloc_init"))
    hooks.set_record_stream_fn(library.address("streamalloc_record_stream"))
    hooks.set_reset_fn(library.address("streamalloc_empty_cache"))
    torch.cuda.memory.change_current_allocator(allocator)
    install_stock_pluggable.keep = (allocator, library)  # alive for the whole process


# ---- case: capture ----

def capture_simple():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.full((4096,), 2.0, device="cuda")
        g = torch.cuda.CUDAGraph()
        torch.cuda.empty_cache()
        g.capture_begin()
        b = a
        for _ in range(12):
            b = b + 0.5  # twelve temporaries, eleven of them freed during the capture
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    sums = []
    for value in (2.0, -1.0):
        a.fill_(value)
        g.replay()
        sums.append(b.sum().item())
    return {"sums": sums, "expected": [4096 * 8.0, 4096 * 5.0]}


def _forked_body(x, side):
    """Allocations and frees on the capturing stream and on a side stream forked from it and joined
    back; the side stream's use of `b` is told to the allocator with record_stream."""
    main = torch.cuda.current_stream()
    a = x * 2
    b = torch.sin(a)
    del a
    side.wait_stream(main)
    with torch.cuda.stream(side):
        c = b * 3
        d = c + 1
        b.record_stream(side)
        e = torch.empty_like(d)
        torch.mul(d, 0.25, out=e)
        del c
    main.wait_stream(side)
    e.record_stream(main)
    f = e + b
    del b, d, e
    return torch.cos(f) * 2


def capture_alloc_free_side_stream():
    torch.manual_seed(0)
    n = 1 << 20
    side = torch.cuda.Stream()
    s = torch.cuda.Stream()
    static_x = torch.randn(n, device="cuda")
    # Warm up on the capture stream (kernels loaded, caches set up), as PyTorch recommends.
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            _forked_body(static_x, side)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        static_out = _forked_body(static_x, side)
    inputs = [torch.randn(n, device="cuda") for _ in range(3)]
    results = []
    for x in inputs:
        static_x.copy_(x)
        g.replay()
        expected = _forked_body(x, side)
        torch.cuda.current_stream().wait_stream(side)
        results.append(close(static_out, expected))
        # Eager allocations between replays must not disturb the graph's memory.
        junk = [torch.full((n,), float("nan"), device="cuda") for _ in range(4)]
        del junk
    return {"replays": results, "ok": all(r["ok"] for r in results)}


def capture_record_stream_deferred():
    """An allocation made before capture and recorded on a busy stream is still pending while a graph
    is captured; the allocator must not query its event during capture (that would invalidate it), and
    a record_stream inside the capture must be handled once the capture ends."""
    torch.cuda.empty_cache()
    early = torch.zeros(7, device="cuda")
    a = torch.arange(7, device="cuda", dtype=torch.float32)
    s0, s1, s2 = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(s0):
        early.record_stream(s0)
        torch.cuda._sleep(100_000_000)
        early.fill_(3.0)
    del early  # pending on s0 while the capture below runs
    with torch.cuda.stream(s1):
        g.capture_begin()
        b = a.clone()
        s2.wait_stream(s1)
        with torch.cuda.stream(s2):
            b.mul_(2)
            b.record_stream(s2)
            kept = b + 1
        s1.wait_stream(s2)
        kept.record_stream(s1)
        out = kept * 1
        del b, kept
        g.capture_end()
    torch.cuda.synchronize()
    after = torch.zeros(7, device="cuda")  # processes the pending frees
    g.replay()
    torch.cuda.synchronize()
    return {"out": out.tolist(), "expected": [2.0 * i + 1 for i in range(7)], "after_ok": after.sum().item() == 0.0}


def capture_reset_recapture():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = torch.full((2048,), 1.0, device="cuda")
        g = torch.cuda.CUDAGraph()
        g.capture_begin()
        b = a
        for _ in range(5):
            b = b * 2
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    first = b.sum().item()
    g.reset()
    with torch.cuda.stream(s):
        g.capture_begin()
        b.fill_(3.0)
        c = b
        for _ in range(4):
            c = c + 1.5
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    second = c.sum().item()
    g.reset()
    del g
    return {"first": first, "first_expected": 2048 * 32.0, "second": second, "second_expected": 2048 * 9.0}


def capture_raw_graph_reset_recapture():
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    x = torch.zeros(3000, device="cuda")
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        x += 1.0
    values = []
    graph.instantiate()
    graph.replay()
    values.append(x.mean().item())
    graph.instantiate()  # instantiated twice: the second replaces the first
    graph.replay()
    values.append(x.mean().item())
    graph.replay()
    values.append(x.mean().item())
    graph.reset()
    y = torch.zeros(3000, device="cuda")  # a new address, so a stale graph would show
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        y += 2.0
    graph.instantiate()
    graph.replay()
    values.append(y.mean().item())
    graph.instantiate()
    graph.replay()
    values.append(y.mean().item())
    graph.replay()
    values.append(y.mean().item())
    return {"values": values, "expected": [1.0, 2.0, 3.0, 2.0, 4.0, 6.0], "x_after": x.mean().item()}


def capture_timing():
    torch.cuda.empty_cache()
    x = torch.randn(8_000_000, device="cuda")
    y = torch.rand_like(x)
    g = torch.cuda.CUDAGraph()
    start = torch.cuda.Event(enable_timing=True, external=True)
    end = torch.cuda.Event(enable_timing=True, external=True)
    with torch.cuda.graph(g):
        start.record()
        z = x * y + x
        end.record()
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    return {"elapsed_ms": start.elapsed_time(end), "ok": close(z, x * y + x)["ok"]}


def _temps(t, v):
    u = t.clone() + v
    w = t.clone() * 0.5
    return u + w


def capture_shared_pools():
    """Two graphs sharing a pool (pool=g1.pool()) and two sharing a graph_pool_handle(); replays in
    capture order with eager work in between; outputs stay valid after the graphs are deleted; once
    graphs and outputs are gone, empty_cache() returns reserved memory to its baseline."""
    n = 1 << 18  # 1 MiB of float32
    s = torch.cuda.Stream()
    a = torch.ones(n, device="cuda")
    # Warm-up outside the graphs, then the baseline: only `a` and whatever the process keeps.
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _temps(a, 1.0)
    torch.cuda.current_stream().wait_stream(s)
    settle()
    baseline = reserved()

    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    g3, g4 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    handle = torch.cuda.graph_pool_handle()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g1.capture_begin()
        o1 = a.clone()
        for _ in range(3):
            o1 = _temps(o1, 1.0)
        g1.capture_end()
        g2.capture_begin(g1.pool())
        o2 = o1
        for _ in range(3):
            o2 = _temps(o2, 2.0)
        g2.capture_end()
        g3.capture_begin(handle)
        o3 = a * 4
        g3.capture_end()
        g4.capture_begin(handle)
        o4 = _temps(o3, 3.0)
        g4.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    reserved_with_graphs = reserved()

    def expected_o2(x0):
        x = x0
        for v in (1.0, 1.0, 1.0, 2.0, 2.0, 2.0):
            x = 1.5 * x + v
        return x

    c = a.clone()
    c = _temps(c, 5.0)
    g1.replay()
    c = _temps(c, 5.0)
    g2.replay()
    c = _temps(c, 5.0)
    g3.replay()
    g4.replay()
    torch.cuda.synchronize()
    facts = {
        "o2": o2[:4].tolist(), "o2_expected": expected_o2(1.0),
        "o4": o4[:4].tolist(), "o4_expected": 1.5 * 4.0 + 3.0,
        "eager": c[:4].tolist(), "eager_expected": 1.5 * (1.5 * (1.5 * 1.0 + 5) + 5) + 5,
        "baseline": baseline, "reserved_with_graphs": reserved_with_graphs,
    }
    del g1, g2, g3, g4
    gc.collect()
    # The deleted graphs' memory may be reused now, except the blocks the outputs still hold.
    junk = [torch.full((n,), -7.0, device="cuda") for _ in range(16)]
    torch.cuda.synchronize()
    facts["o2_after_delete"] = o2[:4].tolist() + [o2.min().item(), o2.max().item()]
    facts["o4_after_delete"] = o4[:4].tolist() + [o4.min().item(), o4.max().item()]
    del junk, o1, o2, o3, o4, c
    settle()
    facts["reserved_after"] = reserved()
    return facts


def capture_error_options():
    """A capture in "thread_local" or "relaxed" mode tolerates another thread allocating and freeing
    (through the caching allocator's raw API) on its own stream meanwhile."""

    def fn(x):
        return x + x * x

    x = torch.ones(2048, device="cuda")
    outcome = {}
    for mode in ("thread_local", "relaxed"):
        thread_result = {}

        def other_thread():
            try:
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    ptr = torch.cuda.caching_allocator_alloc(1 << 16, stream=stream)
                    torch.cuda.caching_allocator_delete(ptr)
                thread_result["ok"] = True
            except Exception as error:  # noqa: BLE001
                thread_result["error"] = repr(error)

        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(x)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(graph, stream=stream, capture_error_mode=mode):
                out = fn(x)
                worker = threading.Thread(target=other_thread)
                worker.start()
                worker.join()
            graph.replay()
            torch.cuda.synchronize()
            outcome[mode] = {"raised": None, "thread": thread_result, "out": out[:2].tolist()}
        except Exception as error:  # noqa: BLE001
            outcome[mode] = {"raised": repr(error)[:500], "thread": thread_result}
    return outcome


def capture_debug_dump():
    torch.cuda.empty_cache()
    x = torch.randn(1_000_000, device="cuda")
    y = torch.rand_like(x)
    g = torch.cuda.CUDAGraph()
    g.enable_debug_mode()  # process-wide: keeps captured graphs around, so it runs last in its case
    s0, s1 = torch.cuda.Stream(), torch.cuda.Stream()
    s0.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s0):
        g.capture_begin()
        z = x + y
        with torch.cuda.stream(s1):
            s1.wait_stream(s0)
            w = z * y
        s0.wait_stream(s1)
        g.capture_end()
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tempdir:
        path = os.path.join(tempdir, "graph.dot")
        g.debug_dump(path)
        text = open(path).read() if os.path.exists(path) else ""
    g.replay()
    torch.cuda.synchronize()
    return {"dot_bytes": len(text), "is_digraph": text.lstrip().startswith("digraph"),
            "ok": close(w, (x + y) * y)["ok"]}


def case_capture(results):
    behaviour(results, "simple", capture_simple)
    behaviour(results, "alloc_free_side_stream", capture_alloc_free_side_stream)
    behaviour(results, "record_stream_deferred", capture_record_stream_deferred)
    behaviour(results, "reset_recapture", capture_reset_recapture)
    behaviour(results, "raw_graph_reset_recapture", capture_raw_graph_reset_recapture)
    behaviour(results, "timing", capture_timing)
    behaviour(results, "shared_pools", capture_shared_pools)
    behaviour(results, "error_options", capture_error_options)
    behaviour(results, "debug_dump", capture_debug_dump)


# ---- case: isolation ----

def isolation_scenario(numel: int) -> dict:
    """A temporary freed during capture, then an eager tensor of the same size on the same stream
    after capture. With graph pools the eager tensor gets other memory and replays leave it alone;
    without them the cache hands the captured temporary's block to the eager tensor, and every replay
    writes into it."""
    s = torch.cuda.Stream()
    x = torch.ones(numel, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        warm = (x * 2) + 1  # loads the kernels outside the capture
        del warm
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    captured = []
    with torch.cuda.graph(g, stream=s):
        tmp = x * 2
        captured.append(tmp.data_ptr())
        out = tmp + 1
        captured.append(out.data_ptr())
        del tmp
    with torch.cuda.stream(s):
        eager = torch.full((numel,), 7.0, device="cuda")
        for _ in range(3):
            g.replay()
    torch.cuda.synchronize()
    return {
        "eager_got_captured_block": eager.data_ptr() in captured,
        "eager_intact": bool((eager == 7.0).all().item()),
        "eager_values": sorted(set(eager.unique().tolist()))[:4],
        "out_ok": bool((out == 3.0).all().item()),
    }


def case_isolation(results):
    behaviour(results, "large", lambda: isolation_scenario(2 * MiB))  # 8 MiB
    behaviour(results, "small", lambda: isolation_scenario(64 * 1024))  # 256 KiB


# ---- case: mempool ----

def segment_pool_of(ptr: int, segments) -> list | None:
    for seg in segments:
        if seg["address"] <= ptr < seg["address"] + seg["total_size"]:
            return list(seg.get("segment_pool_id", (None, None)))
    return None


def mempool_routing():
    n = 2 * MiB  # 8 MiB of float32
    settle()
    before = reserved()
    pool = torch.cuda.MemPool()
    counts = {"created": pool.use_count()}
    with torch.cuda.use_mem_pool(pool):
        counts["inside"] = pool.use_count()
        inside_big = torch.randn(n, device="cuda")
        inside_small = torch.ones(1000, device="cuda")
    counts["after"] = pool.use_count()
    outside = torch.randn(n, device="cuda")
    segments = torch.cuda.memory._snapshot()["segments"]
    pool_segments = pool.snapshot()
    pool_addresses = [seg["address"] for seg in pool_segments]
    facts = {
        "pool_id": list(pool.id),
        "use_counts": counts,
        "inside_pools": [segment_pool_of(t.data_ptr(), segments) for t in (inside_big, inside_small)],
        "outside_pool": segment_pool_of(outside.data_ptr(), segments),
        "inside_in_pool_snapshot": [segment_pool_of(t.data_ptr(), pool_segments) is not None
                                    for t in (inside_big, inside_small)],
        "outside_in_pool_snapshot": segment_pool_of(outside.data_ptr(), pool_segments) is not None,
        "pool_segments": len(pool_addresses),
        "values_ok": bool(inside_small.sum().item() == 1000.0),
    }
    # A block freed in the pool serves the pool again, never an allocation outside it.
    freed_ptr = inside_big.data_ptr()
    del inside_big
    torch.cuda.synchronize()
    outside_again = torch.empty(n, device="cuda")
    facts["outside_took_pool_block"] = outside_again.data_ptr() == freed_ptr
    with torch.cuda.use_mem_pool(pool):
        again = torch.empty(n, device="cuda")
    facts["pool_reused_its_block"] = again.data_ptr() == freed_ptr
    torch.cuda.synchronize()
    facts["reserved_with_pool"] = reserved()
    del again, inside_small
    gc.collect()
    counts["before_delete"] = pool.use_count()
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    facts["reserved_after_delete"] = reserved()
    facts["reserved_before"] = before
    facts["outside_ok"] = bool(torch.isfinite(outside).all().item())
    del outside, outside_again
    return facts


def mempool_graph_capture():
    """A graph captured into a user MemPool: the graph's allocations land in that pool."""
    pool = torch.cuda.MemPool()
    source = torch.ones(4096, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (source * 3).sum()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id, stream=s):
        result = source * 3
    count_with_graph = pool.use_count()
    g.replay()
    torch.cuda.synchronize()
    in_pool = segment_pool_of(result.data_ptr(), pool.snapshot()) is not None
    g.reset()
    count_after_reset = pool.use_count()
    ok = bool((result == 3).all().item())
    del g, result
    gc.collect()
    del pool
    gc.collect()
    torch.cuda.empty_cache()
    return {"ok": ok, "result_in_pool": in_pool, "use_count_with_graph": count_with_graph,
            "use_count_after_reset": count_after_reset}


def case_mempool(results):
    behaviour(results, "routing", mempool_routing)
    behaviour(results, "graph_capture", mempool_graph_capture)


# ---- case: rng ----

def rng_functional():
    ops = {"dropout": (torch.nn.functional.dropout, {"p": 0.15}),
           "rrelu": (torch.nn.functional.rrelu, {"training": True})}
    n = 20000
    outcome = {}
    for name, (op, kwargs) in ops.items():
        torch.cuda.manual_seed(11)
        a = torch.randn(n, device="cuda")
        torch.cuda.manual_seed(3)
        eager = a
        for _ in range(5):
            eager = op(eager, **kwargs)
        graph_in = a.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda.manual_seed(3)
            g = torch.cuda.CUDAGraph()
            g.capture_begin()
            graph_out = op(op(graph_in, **kwargs), **kwargs)  # two draws per replay
            g.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        # graph (2 draws), eager (1 draw), graph (2 draws): the same five draws as the eager chain.
        g.replay()
        mid = op(graph_out, **kwargs)
        graph_in.copy_(mid)
        g.replay()
        same_seed = close(graph_out, eager)
        reseeded, seeded_results = [], []
        for seed in (17, 4242):
            # Re-seeded: four draws through the graph (two replays, the first's output fed back)...
            torch.cuda.manual_seed(seed)
            graph_in.copy_(a)
            g.replay()
            graph_in.copy_(graph_out)
            g.replay()
            graph_result = graph_out.clone()
            # ...and the same four eagerly.
            torch.cuda.manual_seed(seed)
            e = a
            for _ in range(4):
                e = op(e, **kwargs)
            reseeded.append({"seed": seed, "matches_eager": close(graph_result, e)})
            seeded_results.append(graph_result)
        torch.cuda.synchronize()
        outcome[name] = {"same_seed": same_seed, "reseeded": reseeded,
                         "seeds_differ": not torch.equal(seeded_results[0], seeded_results[1])}
    return outcome


def rng_distributions():
    n = 10000
    probs = torch.rand(n, device="cuda")
    template = torch.empty(n, device="cuda")
    functional = {
        "bernoulli": lambda: torch.bernoulli(probs),
        "normal": lambda: torch.normal(probs + 1, 1.0),
        "poisson": lambda: torch.poisson(probs * 4),
        "rand": lambda: torch.rand(n, device="cuda"),
        "randint": lambda: torch.randint(0, 7, (n,), device="cuda", dtype=torch.float32),
        "randn": lambda: torch.randn(n, device="cuda"),
    }
    methods = {
        "bernoulli_": (probs,), "cauchy_": (), "exponential_": (), "geometric_": (0.3,),
        "log_normal_": (), "normal_": (), "random_": (), "uniform_": (),
    }
    outcome = {}

    def check(name, draw_eager, capture_draws):
        torch.cuda.manual_seed(5)
        draw_eager()  # a dummy draw moves the offset before the controls, as below for the replay
        c1, c2 = draw_eager(), draw_eager()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda.manual_seed(5)
            g = torch.cuda.CUDAGraph()
            t1, t2 = capture_draws(g)
        torch.cuda.current_stream().wait_stream(stream)
        matches = []
        for seed in (6, 314):
            torch.cuda.manual_seed(seed)
            draw_eager()
            c1, c2 = draw_eager(), draw_eager()
            torch.cuda.manual_seed(seed)
            draw_eager()
            g.replay()
            matches.append(bool(torch.equal(c1, t1) and torch.equal(c2, t2)))
        torch.cuda.synchronize()
        outcome[name] = matches

    for name, fn in functional.items():
        def capture_functional(g, fn=fn):
            g.capture_begin()
            t1, t2 = fn(), fn()
            g.capture_end()
            return t1, t2

        check(name, fn, capture_functional)
    for name, args in methods.items():
        def eager_method(name=name, args=args):
            t = template.clone()
            getattr(t, name)(*args)
            return t

        def capture_method(g, name=name, args=args):
            t1, t2 = template.clone(), template.clone()
            g.capture_begin()
            getattr(t1, name)(*args)
            getattr(t2, name)(*args)
            g.capture_end()
            return t1, t2

        check(name, eager_method, capture_method)
    return outcome


def rng_graphsafe_state():
    """Generator states registered with a graph and switched inside the capture with
    graphsafe_set_state: replays draw what eager draws from a separate generator put through the same
    sequence, and leave the same offsets behind."""

    def states(generator):
        torch.rand(1, device="cuda")
        generator.manual_seed(21)
        return generator, generator.graphsafe_get_state(), generator.clone_state()

    def draws(bundle):
        generator, first, second = bundle
        out = []
        generator.graphsafe_set_state(second)
        out.append(torch.rand(6, device="cuda", generator=generator))
        generator.graphsafe_set_state(first)
        out.append(torch.randn(6, device="cuda", generator=generator))
        out.append(torch.rand(6, device="cuda", generator=generator))
        return out

    def offsets(bundle):
        return bundle[1].get_offset(), bundle[2].get_offset()

    eager_bundle = states(torch.Generator(device="cuda"))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    graph_bundle = states(torch.cuda.default_generators[torch.cuda.current_device()])
    g.register_generator_state(graph_bundle[1])
    g.register_generator_state(graph_bundle[2])
    with torch.cuda.stream(s):
        g.capture_begin()
        graphed = draws(graph_bundle)
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    rounds = []
    for _ in range(3):
        eager = draws(eager_bundle)
        g.replay()
        torch.cuda.synchronize()
        rounds.append({"values_equal": all(torch.equal(a, b) for a, b in zip(eager, graphed)),
                       "offsets": [list(offsets(eager_bundle)), list(offsets(graph_bundle))]})
    return {"rounds": rounds}


def rng_cudnn_dropout():
    if not torch.backends.cudnn.is_available():
        return {"skipped": "cuDNN is not available"}
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    model = torch.nn.LSTM(128, 128, 2, dropout=0.5).cuda()
    x = torch.ones(20, 32, 128, device="cuda")
    first = model(x)[0]
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin()
        graphed = model(x)[0]
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    after = model(x)[0]
    torch.cuda.synchronize()
    return {"finite": bool(torch.isfinite(graphed).all() and torch.isfinite(after).all()
                           and torch.isfinite(first).all()),
            "shape": list(graphed.shape)}


def case_rng(results):
    behaviour(results, "functional", rng_functional)
    behaviour(results, "distributions", rng_distributions)
    behaviour(results, "graphsafe_state", rng_graphsafe_state)
    behaviour(results, "cudnn_dropout", rng_cudnn_dropout)


# ---- case: recovery ----

def still_works() -> dict:
    """RNG, dropout, allocation and a fresh capture, after whatever failed before."""
    torch.cuda.manual_seed(99)
    a = torch.randn(100_000, device="cuda")
    torch.cuda.manual_seed(99)
    b = torch.randn(100_000, device="cuda")
    c = torch.randn(100_000, device="cuda")
    d = torch.nn.functional.dropout(torch.ones(100_000, device="cuda"), p=0.5)
    kept = (d != 0).float().mean().item()
    big = [torch.full((4 * MiB,), float(i), device="cuda") for i in range(4)]  # 16 MiB each
    big_ok = all(t[::4099].eq(float(i)).all().item() for i, t in enumerate(big))
    del big
    s = torch.cuda.Stream()
    x = torch.full((4096,), 2.0, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (x * x + 1).sum()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y = x * x + 1
    x.fill_(3.0)
    g.replay()
    torch.cuda.synchronize()
    return {
        "rng_reproducible": bool(torch.equal(a, b)),
        "rng_advances": not bool(torch.equal(b, c)),
        "rng_finite": bool(torch.isfinite(a).all().item()),
        "dropout_kept": kept,
        "alloc_ok": bool(big_ok),
        "capture_ok": bool((y == 10.0).all().item()),
    }


def failing(fn) -> dict:
    try:
        fn()
        raised = None
    except Exception as error:  # noqa: BLE001
        raised = f"{type(error).__name__}: {error}"[:800]
    return {"raised": raised, "after": still_works()}


def recovery_raise_inside():
    x = torch.ones(1024, device="cuda")

    def fn():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
            z = torch.randn(1024, device="cuda")  # RNG state registered with the failed capture
            del y, z
            raise ValueError("raised inside the capture")

    return failing(fn)


def recovery_illegal_item():
    x = torch.ones(1024, device="cuda")

    def fn():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
            y.sum().item()  # synchronises: not allowed while capturing

    return failing(fn)


def recovery_illegal_synchronize():
    x = torch.ones(1024, device="cuda")

    def fn():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = torch.nn.functional.dropout(x, p=0.5)
            torch.cuda.synchronize()
            del y

    return failing(fn)


def recovery_capture_oom():
    def fn():
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.zeros(2**40, device="cuda")  # 4 TiB

    return failing(fn)


def recovery_default_stream():
    def fn():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(torch.cuda.default_stream()):
            g.capture_begin()

    return failing(fn)


def case_recovery(results):
    behaviour(results, "baseline", lambda: {"after": still_works()})
    behaviour(results, "raise_inside", recovery_raise_inside)
    behaviour(results, "illegal_item", recovery_illegal_item)
    behaviour(results, "illegal_synchronize", recovery_illegal_synchronize)
    behaviour(results, "capture_oom", recovery_capture_oom)
    behaviour(results, "default_stream", recovery_default_stream)


# ---- case: training ----

class DropoutMLP(nn.Module):
    def __init__(self, d_in, hidden, d_out, p):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, d_out),
                                 nn.Dropout(p / 2))

    def forward(self, x):
        return self.net(x)


def training_graphed_mlp_dropout():
    """make_graphed_callables over two dropout MLP sections and a loss function: ten SGD steps with the
    same seeds give the same losses and parameters as the eager model."""
    torch.manual_seed(5)
    torch.cuda.manual_seed(5)
    n, d_in, hidden, d_out = 256, 512, 1024, 128
    graphed = nn.Sequential(DropoutMLP(d_in, hidden, hidden, 0.2), DropoutMLP(hidden, hidden, d_out, 0.1)).cuda()
    control = nn.Sequential(DropoutMLP(d_in, hidden, hidden, 0.2), DropoutMLP(hidden, hidden, d_out, 0.1)).cuda()
    graphed.load_state_dict(control.state_dict())
    opt_graphed = torch.optim.SGD(graphed.parameters(), lr=0.05)
    opt_control = torch.optim.SGD(control.parameters(), lr=0.05)
    x = torch.randn(n, d_in, device="cuda")
    h = torch.randn(n, hidden, device="cuda", requires_grad=True)
    pred = torch.randn(n, d_out, device="cuda", requires_grad=True)
    target = torch.randn(n, d_out, device="cuda")
    loss_control = torch.nn.functional.mse_loss
    graphed[0], graphed[1], loss_graphed = torch.cuda.make_graphed_callables(
        (graphed[0], graphed[1], loss_control), ((x,), (h,), (pred, target)))
    inputs = [torch.rand_like(x) for _ in range(10)]
    targets = [torch.rand_like(target) for _ in range(10)]
    losses = {}
    for name, model, opt, loss_fn in (("graphed", graphed, opt_graphed, loss_graphed),
                                      ("control", control, opt_control, loss_control)):
        torch.manual_seed(5)  # the same RNG stream for both, so the dropout masks are the same
        torch.cuda.manual_seed(5)
        losses[name] = []
        for data, tgt in zip(inputs, targets):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(data), tgt)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    params = all_close(list(zip(graphed.parameters(), control.parameters())))
    graphed.eval()
    control.eval()
    with torch.no_grad():
        eval_outputs = close(graphed(inputs[0]), control(inputs[0]))
    return {"losses": losses, "losses_equal": losses["graphed"] == losses["control"], "params": params,
            "eval": eval_outputs, "loss_decreased": losses["control"][-1] < losses["control"][0]}


def training_graphed_same_pool():
    torch.manual_seed(5)
    torch.cuda.manual_seed(5)
    models = [nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 64)).cuda() for _ in range(3)]
    handle = torch.cuda.graph_pool_handle()
    graphed_models = []
    for model in models:
        copy = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 64)).cuda()
        copy.load_state_dict(model.state_dict())
        graphed_models.append(torch.cuda.make_graphed_callables(copy, (torch.randn(64, 32, device="cuda"),),
                                                                pool=handle))
    results = []
    for model, graphed in zip(models, graphed_models):
        x = torch.randn(64, 32, device="cuda")
        y, yg = model(x), graphed(x)
        y.norm().backward()
        yg.norm().backward()
        pairs = [(yg, y)] + [(pg.grad, p.grad) for p, pg in zip(model.parameters(), graphed.parameters())]
        distinct = all(p.data_ptr() != pg.data_ptr() and p.grad.data_ptr() != pg.grad.data_ptr()
                       for p, pg in zip(model.parameters(), graphed.parameters()))
        results.append({"match": all_close(pairs)["ok"], "distinct_storage": distinct})
    return {"models": results}


class Parameterless(nn.Module):
    def forward(self, x):
        idx = torch.arange(x.size(0), device=x.device).flip(0).view(-1, 1).expand(-1, x.size(1))
        return torch.gather(x, 0, idx) * 2


def training_graphed_parameterless():
    torch.manual_seed(5)
    x = torch.randn(128, 256, device="cuda")
    graphed = torch.cuda.make_graphed_callables(Parameterless(), (x,))
    control = Parameterless()
    pairs = []
    for _ in range(5):
        data = torch.rand_like(x)
        pairs.append((graphed(data).clone(), control(data)))
    return all_close(pairs, rtol=0, atol=0)


def _graphed_optimizer(ctor, kwargs, capturable_arg=True, steps_warmup=3, steps_train=3):
    torch.manual_seed(7)
    params = [torch.randn(i + 5, i + 5, device="cuda") for i in range(2)] + [torch.randn((), device="cuda")]
    grads = [[torch.randn_like(p) for p in params] for _ in range(steps_warmup + steps_train)]
    control = [p.clone().requires_grad_() for p in params]
    graphed = [p.clone().requires_grad_() for p in params]
    extra = {"capturable": False} if capturable_arg else {}
    opt = ctor(control, **extra, **kwargs)
    for i in range(steps_warmup + steps_train):
        for j, p in enumerate(control):
            p.grad = grads[i][j].clone()
        opt.step()
    extra = {"capturable": True} if capturable_arg else {}
    opt = ctor(graphed, **extra, **kwargs)
    for i in range(steps_warmup):
        for j, p in enumerate(graphed):
            p.grad = grads[i][j].clone()
        opt.step()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        opt.step()
    for i in range(steps_train):
        for j, p in enumerate(graphed):
            p.grad.copy_(grads[steps_warmup + i][j])
        g.replay()
    return all_close(list(zip(graphed, control)))


def training_optimizers():
    return {
        "adam_capturable": _graphed_optimizer(torch.optim.Adam, {"lr": 0.1}),
        "adam_capturable_foreach": _graphed_optimizer(torch.optim.Adam, {"lr": 0.1, "foreach": True}),
        "adamw_capturable_amsgrad": _graphed_optimizer(torch.optim.AdamW, {"lr": 0.1, "amsgrad": True}),
        "sgd_momentum": _graphed_optimizer(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, capturable_arg=False),
    }


def training_scaled_fused_optimizers():
    """A fused optimizer stepped through a GradScaler, captured (step and update) and replayed, against
    the same optimizer run eagerly without capturable."""
    outcome = {}
    for name, ctor, kwargs in (("adam_fused", torch.optim.Adam, {"lr": 0.1}),
                               ("adamw_fused", torch.optim.AdamW, {"lr": 0.1}),
                               ("sgd_fused", torch.optim.SGD, {"lr": 0.1, "momentum": 0.5})):
        torch.manual_seed(9)
        capturable_arg = ctor is not torch.optim.SGD
        params = [torch.randn(i + 5, i + 5, device="cuda") for i in range(2)]
        grads = [[torch.randn_like(p) for p in params] for _ in range(5)]
        control = [p.clone().requires_grad_() for p in params]
        graphed = [p.clone().requires_grad_() for p in params]
        scaler_control = torch.amp.GradScaler("cuda", init_scale=128.0)
        scaler_control._lazy_init_scale_growth_tracker(torch.device("cuda"))
        scaler_graphed = torch.amp.GradScaler("cuda")
        scaler_graphed.load_state_dict(scaler_control.state_dict())
        scaler_graphed._lazy_init_scale_growth_tracker(torch.device("cuda"))
        extra = {"capturable": False} if capturable_arg else {}
        opt = ctor(control, fused=True, **extra, **kwargs)
        for i in range(5):
            for j, p in enumerate(control):
                p.grad = grads[i][j].clone()
            scaler_control.step(opt)
            scaler_control.update()
        extra = {"capturable": True} if capturable_arg else {}
        opt = ctor(graphed, fused=True, **extra, **kwargs)
        for i in range(3):
            for j, p in enumerate(graphed):
                p.grad = grads[i][j].clone()
            scaler_graphed.step(opt)
            scaler_graphed.update()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            scaler_graphed.step(opt)
            scaler_graphed.update()
        for i in range(3, 5):
            for j, p in enumerate(graphed):
                p.grad.copy_(grads[i][j])
            g.replay()
        outcome[name] = all_close(list(zip(graphed, control)))
    return outcome


def training_grad_scaling():
    """A captured scaled backward whose gradients overflow on some replays: the scale, the growth
    tracker and the gradients follow the same path as eager execution of the same steps."""
    values = [5.0, 30000.0, 5.0, 60000.0, 2.0]

    def setup():
        weight = torch.ones(100, device="cuda", requires_grad=True)
        opt = torch.optim.SGD([weight], lr=0.1)
        scaler = torch.amp.GradScaler("cuda", init_scale=4.0, growth_interval=1)
        return weight, opt, scaler

    # Eager control.
    weight, opt, scaler = setup()
    static_input = torch.ones_like(weight)
    control = []
    for v in values:
        static_input.fill_(v)
        opt.zero_grad(set_to_none=True)
        loss = (weight.half() * static_input).sum()
        scaler.scale(loss).backward()
        grad = weight.grad[0].item()
        scaler.step(opt)
        scaler.update()
        control.append([grad, scaler.get_scale(), scaler._growth_tracker.item(), weight[0].item()])
    # Captured forward and backward.
    weight, opt, scaler = setup()
    static_input = torch.ones_like(weight)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        loss = (weight.half() * static_input).sum()
        scaler.scale(loss).backward()
    torch.cuda.current_stream().wait_stream(s)
    opt.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loss = (weight.half() * static_input).sum()
        scaler.scale(loss).backward()
    graphed = []
    for v in values:
        static_input.fill_(v)
        g.replay()
        grad = weight.grad[0].item()
        scaler.step(opt)
        scaler.update()
        graphed.append([grad, scaler.get_scale(), scaler._growth_tracker.item(), weight[0].item()])
    return {"control": control, "graphed": graphed, "overflowed": [c[0] == float("inf") for c in control]}


def training_cublas_workspace():
    """Capturing and replaying a matmul a hundred times (each capture a new graph, the previous one
    dropped) does not grow the memory in use."""
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublas")
    try:
        a = torch.rand(1024, 512, device="cuda")
        b = torch.rand(512, 64, device="cuda")
        torch.mm(a, b)
        torch.cuda.synchronize()
        free_before, total = torch.cuda.mem_get_info()
        reserved_before = reserved()
        for _ in range(100):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = torch.mm(a, b)
            graph.replay()
        torch.cuda.synchronize()
        ok = close(out, a @ b, rtol=1e-3, atol=1e-3)["ok"]
        free_after, _ = torch.cuda.mem_get_info()
        return {"used_growth_bytes": free_before - free_after, "reserved_growth_bytes": reserved() - reserved_before,
                "ok": ok}
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def case_training(results):
    behaviour(results, "graphed_mlp_dropout", training_graphed_mlp_dropout)
    behaviour(results, "graphed_same_pool", training_graphed_same_pool)
    behaviour(results, "graphed_parameterless", training_graphed_parameterless)
    behaviour(results, "optimizers", training_optimizers)
    behaviour(results, "scaled_fused_optimizers", training_scaled_fused_optimizers)
    behaviour(results, "grad_scaling", training_grad_scaling)
    behaviour(results, "cublas_workspace", training_cublas_workspace)


CASES = {
    "capture": case_capture,
    "isolation": case_isolation,
    "mempool": case_mempool,
    "rng": case_rng,
    "recovery": case_recovery,
    "training": case_training,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--stock", action="store_true",
                        help="install PyTorch's stock CUDAPluggableAllocator over libstreamalloc.so (no pool hooks)")
    args = parser.parse_args()
    if args.stock:
        install_stock_pluggable()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = {}
    CASES[args.case](results)
    out = {"case": args.case, "behaviours": results, "device": torch.cuda.get_device_name()}
    if args.stock:
        out["allocator"] = "stock-pluggable"
    emit(out)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

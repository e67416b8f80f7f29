"""Two-GPU DistributedDataParallel under the launcher: `torchrun --nproc_per_node 2 -m streamalloc`.

In PyTorch 2.11 ProcessGroupNCCL no longer calls record_stream (TORCH_NCCL_AVOID_RECORD_STREAMS is
the default and the variable is deprecated: libtorch_cuda says so; it keeps tensors alive until the
collective is done instead), so the record_stream calls seen here come from the worker: its
side-stream prefetcher and its all-reduce of each loss from a metrics stream. The collectives
exercise frees of tensors NCCL's streams used and ProcessGroupNCCL's own event waits."""

import math

from support import SCRIPTS, last_json, requires_native, requires_two_gpus, run_python

pytestmark = [requires_two_gpus, requires_native]


def torchrun_result(*args):
    argv = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *map(str, args)]
    result = run_python(argv, timeout=300)
    assert result.returncode == 0, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    return result


def torchrun(*args):
    return last_json(torchrun_result(*args))


def test_ddp_under_the_launcher_matches_native():
    native = torchrun(SCRIPTS / "ddp_worker.py")
    ours = torchrun("-m", "streamalloc", SCRIPTS / "ddp_worker.py")
    assert native["allocator"] == "native" and ours["allocator"] in ("extension", "c-abi")
    assert ours["world_size"] == 2
    # NCCL's reductions do not depend on where buffers live; a premature reuse would change the
    # losses by far more than rounding.
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(ours["losses"], native["losses"]))
    assert ours["metrics_match"] and native["metrics_match"]
    stream_stats = ours["stream_stats"]
    assert stream_stats["record_stream_calls"] >= 3 * 30  # images, labels and the loss copy, every step
    assert stream_stats["invalid_frees"] == 0


def test_ddp_with_the_happens_before_check_gives_no_false_warning():
    """Every cross-stream use in the worker (prefetch -> compute, compute -> metrics, NCCL's own
    streams) is ordered by a wait, so check_sync:1 and the audit must stay silent."""
    result = torchrun_result("-m", "streamalloc", "--conf", "check_sync:1,audit:warn", SCRIPTS / "ddp_worker.py")
    stream_stats = last_json(result)["stream_stats"]
    assert stream_stats["record_stream_calls"] >= 3 * 30
    assert stream_stats["missing_wait_warnings"] == 0, stream_stats
    assert "missing wait" not in result.stderr, result.stderr

"""Two-GPU DistributedDataParallel under the launcher: `torchrun --nproc_per_node 2 -m streamalloc`.

In PyTorch 2.11 ProcessGroupNCCL no longer calls record_stream (TORCH_NCCL_AVOID_RECORD_STREAMS is
the default: it keeps tensors alive until the collective is done, and frees them from its watchdog
thread), so the record_stream calls seen here come from the worker's side-stream prefetcher; the
collectives exercise frees from other threads and NCCL's own streams."""

import math

from support import SCRIPTS, last_json, requires_native, requires_two_gpus, run_python

pytestmark = [requires_two_gpus, requires_native]


def torchrun(*args):
    argv = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *map(str, args)]
    result = run_python(argv, timeout=300)
    assert result.returncode == 0, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    return last_json(result)


def test_ddp_under_the_launcher_matches_native():
    native = torchrun(SCRIPTS / "ddp_worker.py")
    ours = torchrun("-m", "streamalloc", SCRIPTS / "ddp_worker.py")
    assert native["allocator"] == "native" and ours["allocator"] in ("extension", "c-abi")
    assert ours["world_size"] == 2
    # NCCL's reductions do not depend on where buffers live; a premature reuse would change the
    # losses by far more than rounding.
    assert all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(ours["losses"], native["losses"]))
    stream_stats = ours["stream_stats"]
    assert stream_stats["record_stream_calls"] >= 2 * 30  # images and labels, every step
    assert stream_stats["invalid_frees"] == 0

"""CUDA tensors across processes (docs/pytorch.md, "CUDA tensors across processes"): a producer and a
spawned consumer, each under PyTorch's allocator or streamalloc, with fixed and expandable segments.
Values are checked both ways (the consumer reads the producer's tensor, writes into it, and sends a
tensor of its own back); 1000 tensors round-trip with no growth of reserved memory; a consumer that dies
holding a tensor leaves the producer working. Expandable segments share as PyTorch's do ('e' handles: the
pieces under a block as file descriptors), from either allocator's producer to either consumer
(streamalloc's with expandable_ipc). What is not supported (streamalloc's expandable segments without
that option, the C ABI path) raises at the call, within a second, naming what is unsupported.

Run on a CUDA machine after building:
    STREAMALLOC_LIBRARY_DIR=$PWD/build/lib PYTHONPATH=$PWD/torch_plugin \\
        python3 -m pytest -v -rs tests/python/test_gpu_ipc.py
"""

from __future__ import annotations

import functools

import pytest
from support import SCRIPTS, ProbeRun, requires_cuda, requires_extension, requires_native, run_python

pytestmark = [requires_cuda, requires_native, requires_extension]

MiB = 1 << 20
EXPANDABLE_NATIVE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC": "1"}


@functools.lru_cache(maxsize=None)
def probe(producer: str, consumer: str, producer_conf: str = "", native_expandable: bool = False) -> ProbeRun:
    argv = [str(SCRIPTS / "ipc_probe.py"), "--producer", producer, "--consumer", consumer]
    if producer_conf:
        argv += ["--producer-conf", producer_conf]
    env = dict(EXPANDABLE_NATIVE) if native_expandable else {}
    return ProbeRun(argv, run_python(argv, env=env, timeout=600))


MIXES = [("native", "native"), ("native", "streamalloc"), ("streamalloc", "native"), ("streamalloc", "streamalloc")]


def check_working(run: ProbeRun) -> None:
    share = run.facts("share")
    assert share["shared"], run.tails()
    for row in run.facts("roundtrip")["rows"]:
        assert row == {**row, "consumer_saw_values": True, "consumer_write_seen": True, "head_untouched": True,
                       "sent_back_values": True}, row
    many = run.facts("many")
    assert many["all_seen"]
    assert many["reserved_at_end"] <= many["reserved_after_100"], many
    dies = run.facts("child_dies")
    assert dies["exitcode"] == 3 and dies["held_value"] == 5.0 and dies["producer_works"], dies
    assert run.result()["behaviours"]["consumer_exit"] == 0, run.tails()


@pytest.mark.parametrize("producer,consumer", MIXES, ids=[f"{p}-to-{c}" for p, c in MIXES])
def test_fixed_segments_every_mix(producer, consumer):
    run = probe(producer, consumer)
    check_working(run)
    assert run.facts("share")["handle_type"] == "c", run.facts("share")


@pytest.mark.parametrize("consumer", ["native", "streamalloc"])
def test_pytorch_expandable_segments_producer(consumer):
    """PyTorch's producer shares expandable segments as file descriptors ('e' handles): a streamalloc
    consumer maps them as PyTorch's would."""
    run = probe("native", consumer, native_expandable=True)
    check_working(run)
    assert run.facts("share")["handle_type"] == "e", run.facts("share")


@pytest.mark.parametrize("consumer", ["native", "streamalloc"])
def test_streamalloc_expandable_segments_producer(consumer):
    """With expandable_ipc, streamalloc's producer shares a block of its expandable segments as PyTorch's
    'e' handle (one page per piece): PyTorch's consumer and streamalloc's map it; a MemPool's fixed
    segments in the same process still share as 'c' handles."""
    run = probe("streamalloc", consumer, "expandable_segments:true,expandable_ipc:true")
    check_working(run)
    assert run.facts("share")["handle_type"] == "e", run.facts("share")
    for row in run.facts("roundtrip_mempool")["rows"]:
        assert row["consumer_saw_values"] and row["consumer_write_seen"] and row["sent_back_values"], row


def test_streamalloc_expandable_segments_without_expandable_ipc_refuse_at_the_call():
    """Without expandable_ipc a growth is one physical allocation, which PyTorch's format cannot describe:
    sharing raises at the call, naming the option, and the MemPool's fixed segments still share."""
    run = probe("streamalloc", "native", "expandable_segments:true")
    share = run.facts("share")
    assert not share["shared"] and share["seconds"] < 1.0, share
    assert "expandable_ipc:true" in share["message"], share
    for row in run.facts("roundtrip_mempool")["rows"]:
        assert row["consumer_saw_values"] and row["consumer_write_seen"] and row["sent_back_values"], row
    assert run.result()["behaviours"]["consumer_exit"] == 0, run.tails()


def test_c_abi_producer_refuses_at_the_call():
    run = probe("c-abi", "native")
    share = run.facts("share")
    assert not share["shared"] and share["seconds"] < 1.0, share
    assert "shareIPcHandle" in share["message"] or "shareIpcHandle" in share["message"], share


def test_c_abi_consumer_refuses_at_the_call():
    run = probe("native", "c-abi")
    error = run.result()["behaviours"]["roundtrip"].get("error", "")
    assert "getIpcDevPtr" in error, run.tails()

"""CUDA tensors across processes (torch.multiprocessing, spawn) with a producer (this process) and a
consumer (a spawned child) each under PyTorch's allocator ("native"), streamalloc's extension path
("streamalloc") or its C ABI path ("c-abi"). Prints one JSON line: each behaviour's facts, or the
traceback it raised.

    ipc_probe.py --producer streamalloc --consumer native [--producer-conf expandable_segments:true]

Every wait on the other process has a timeout, so a hang shows as an error, never as a stuck run.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time
import traceback

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import behaviour, emit  # noqa: E402

WAIT = 90  # seconds any one message may take


def enable(mode: str, conf: str) -> None:
    if mode == "native":
        return
    os.environ["STREAMALLOC_TORCH_PATH"] = "extension" if mode == "streamalloc" else "c-abi"
    import streamalloc

    streamalloc.enable(conf)
    assert streamalloc.active_path() == ("extension" if mode == "streamalloc" else "c-abi")


def consumer(mode: str, conf: str, inbox, outbox) -> None:
    """The child: answers the parent's messages until "stop"; any exception goes back as ("error", text)."""
    try:
        enable(mode, conf)
        torch.cuda.init()
        outbox.put(("ready",))
        while True:
            try:
                message = inbox.get(timeout=WAIT)
            except queue.Empty:
                break  # the parent is gone or done
            except Exception:  # noqa: BLE001  (a message that cannot be opened here: the parent hears why)
                outbox.put(("error", traceback.format_exc()))
                continue
            kind = message[0]
            if kind == "stop":
                break
            if kind == "check":  # values seen, a write through the mapping, a tensor of ours sent back
                _, tensor, value = message
                seen = bool((tensor == value).all().item())
                tensor.add_(1)
                back = torch.full((tensor.numel(),), value * 2, device="cuda")
                torch.cuda.synchronize()
                outbox.put(("checked", seen, back))
                inbox.get(timeout=WAIT)  # the parent's ack: it has read `back`
                del back, tensor
            elif kind == "many":
                _, tensor, value = message
                seen = bool(tensor[0].item() == value and tensor[-1].item() == value)
                del tensor
                outbox.put(("ok", seen))
            elif kind == "die":  # hold the tensor and die without letting go of it
                _, tensor = message
                outbox.put(("holding", float(tensor[0].item())))
                outbox.close()
                outbox.join_thread()  # the queue's feeder thread has sent it: os._exit skips that
                os._exit(3)
        outbox.put(("done",))
    except BaseException:  # noqa: BLE001
        outbox.put(("error", traceback.format_exc()))


class Child:
    def __init__(self, ctx, mode: str, conf: str):
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        # A daemon: a consumer left waiting never keeps this process from exiting.
        self.process = ctx.Process(target=consumer, args=(mode, conf, self.inbox, self.outbox), daemon=True)
        self.process.start()
        self.get()  # ("ready",)

    def get(self):
        message = self.outbox.get(timeout=WAIT)
        if message[0] == "error":
            raise RuntimeError("in the consumer:\n" + message[1])
        return message

    def stop(self) -> int | None:
        if self.process.is_alive():
            self.inbox.put(("stop",))
            try:
                self.get()
            finally:
                self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
        return self.process.exitcode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--producer", choices=("native", "streamalloc", "c-abi"), required=True)
    parser.add_argument("--consumer", choices=("native", "streamalloc", "c-abi"), required=True)
    parser.add_argument("--producer-conf", default="")
    parser.add_argument("--consumer-conf", default="")
    parser.add_argument("--many", type=int, default=1000)
    args = parser.parse_args()
    enable(args.producer, args.producer_conf)
    torch.cuda.init()
    ctx = mp.get_context("spawn")
    results: dict = {"producer": args.producer, "consumer": args.consumer, "behaviours": {}}
    facts = results["behaviours"]

    def time_share():
        """Sharing a tensor's memory (what pickling it for another process does), timed. 16 MiB: a
        large block, which expandable segments serve."""
        tensor = torch.ones(1 << 22, device="cuda")
        start = time.monotonic()
        try:
            _, args = torch.multiprocessing.reductions.reduce_tensor(tensor)
            seconds = time.monotonic() - start
            handle = args[7]  # the storage's handle: a version byte, then 'c' (cudaMalloc) or 'e' (expandable)
            kind = chr(handle[1]) if isinstance(handle, bytes) and len(handle) >= 2 else None
            return {"shared": True, "seconds": seconds, "handle_type": kind}
        except Exception as error:  # noqa: BLE001
            return {"shared": False, "seconds": time.monotonic() - start, "type": type(error).__name__,
                    "message": str(error)[:600]}

    behaviour(facts, "share", time_share)
    if args.consumer != "native":
        # PyTorch's allocator settings configure the producer's allocator. A streamalloc consumer would follow
        # them too (docs/pytorch.md, "PyTorch's allocator settings"); its own segments are set by
        # --consumer-conf alone.
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    child = Child(ctx, args.consumer, args.consumer_conf)

    def roundtrip(pool=None):
        rows = []
        for numel in (256, (3 << 20) // 4 + 5, 16 << 20):
            if pool is not None:
                with torch.cuda.use_mem_pool(pool):
                    tensor = torch.full((numel,), 7.0, device="cuda")
            else:
                tensor = torch.full((numel,), 7.0, device="cuda")
            view = tensor[3:]  # a view: the storage's offset travels too
            view.fill_(7.0)
            torch.cuda.synchronize()
            child.inbox.put(("check", view, 7.0))
            _, seen, back = child.get()
            torch.cuda.synchronize()
            rows.append({"numel": numel, "consumer_saw_values": seen,
                         "consumer_write_seen": bool((view == 8.0).all().item()),
                         "head_untouched": bool((tensor[:3] == 7.0).all().item()),
                         "sent_back_values": bool((back == 14.0).all().item())})
            del back
            child.inbox.put(("ack",))
        return {"rows": rows}

    def roundtrip_mempool():
        pool = torch.cuda.MemPool()
        return roundtrip(pool)

    if args.producer == "streamalloc" and "expandable" in args.producer_conf:
        # A MemPool's fixed segments beside the default pool's expandable ones: both kinds of handle.
        behaviour(facts, "roundtrip_mempool", roundtrip_mempool)
    if not facts["share"].get("shared"):
        # A multiprocessing queue pickles in a background thread: a message that cannot be pickled never
        # arrives, so nothing more is sent.
        facts["consumer_exit"] = child.stop()
        emit(results)
        return
    behaviour(facts, "roundtrip", roundtrip)

    def many():
        ok = True
        reserved = {}
        for i in range(args.many):
            tensor = torch.full((1 << 16,), float(i), device="cuda")
            child.inbox.put(("many", tensor, float(i)))
            ok = child.get()[1] and ok
            del tensor
            if i + 1 in (100, args.many):
                torch.cuda.ipc_collect()
                torch.cuda.synchronize()
                reserved[i + 1] = torch.cuda.memory_reserved()
        return {"all_seen": ok, "reserved_after_100": reserved.get(100), "reserved_at_end": reserved[args.many]}

    behaviour(facts, "many", many)
    facts["consumer_exit"] = child.stop()

    def child_dies():
        dying = Child(ctx, args.consumer, args.consumer_conf)
        tensor = torch.full((1 << 20,), 5.0, device="cuda")
        dying.inbox.put(("die", tensor))
        held = dying.get()[1]
        dying.process.join(60)
        del tensor
        torch.cuda.ipc_collect()
        x = torch.randn(2048, 2048, device="cuda")
        y = x @ x
        for _ in range(100):
            z = torch.empty(1 << 20, device="cuda")
            del z
        torch.cuda.synchronize()
        return {"held_value": held, "exitcode": dying.process.exitcode,
                "producer_works": bool(torch.isfinite(y).all().item())}

    behaviour(facts, "child_dies", child_dies)
    emit(results)


if __name__ == "__main__":
    main()

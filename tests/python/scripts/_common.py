"""What the GPU probe scripts share: which allocator runs them, and printing one JSON result line."""

import json

import torch


def streamalloc_enabled() -> bool:
    try:
        import streamalloc
    except ImportError:
        return False
    return streamalloc.is_enabled()


def allocator() -> str:
    if not streamalloc_enabled():
        return "native"
    import streamalloc

    return streamalloc.active_path()


def emit(result: dict) -> None:
    result.setdefault("allocator", allocator())
    result.setdefault("torch", torch.__version__)
    print(json.dumps(result))


def behaviour(results: dict, name: str, fn, after=None) -> None:
    """Run one behaviour of a probe; its facts, or the traceback it raised, go under results[name].
    Afterwards the device is synchronised and `after` (the probe's own cleanup, so that one behaviour's
    leftovers do not become the next one's state) runs; a failure there stays out of the results."""
    import traceback

    try:
        facts = fn()
    except Exception:  # noqa: BLE001  (reported to the test, which shows it)
        facts = {"error": traceback.format_exc()}
    finally:
        try:
            torch.cuda.synchronize()
            if after is not None:
                after()
        except Exception:  # noqa: BLE001
            pass
    results[name] = facts

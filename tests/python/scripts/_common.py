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

"""streamalloc: a stream-aware caching CUDA allocator for PyTorch.

    import streamalloc
    streamalloc.enable(audit="warn")      # before the first CUDA operation
    ...
    print(streamalloc.stats()["stream_stats"])

or, without touching the program: `python -m streamalloc [--conf CONF] script.py [args]`.

Importing this package needs neither torch nor CUDA; enable() imports torch, and the allocator itself
is created by PyTorch's lazy CUDA initialisation.
"""

from ._conf import CONF_VARIABLE, merge_conf
from ._enable import active_path, enable, enabled_conf, is_enabled
from ._inspect import blocks, dump, pending_history, reset_peak_stats, snapshot, stats
from ._native import ConfigError, StreamallocError

__version__ = "0.1.0"

__all__ = [
    "CONF_VARIABLE",
    "ConfigError",
    "StreamallocError",
    "active_path",
    "blocks",
    "dump",
    "enable",
    "enabled_conf",
    "is_enabled",
    "merge_conf",
    "pending_history",
    "reset_peak_stats",
    "snapshot",
    "stats",
]

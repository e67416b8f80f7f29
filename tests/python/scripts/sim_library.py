"""Drive libstreamalloc.so on the simulated device through the package's ctypes binding (no torch,
no GPU) and print its stats and snapshot as one JSON line."""

import json

from streamalloc import _native

ALLOC_STREAM, SIDE_STREAM = 0x11, 0x22

lib = _native.CLibrary(_native.find_c_library())
lib.configure("backend:sim,sim_memory_mb:256,pending_history:1000")
small = lib.malloc(1000, 0, ALLOC_STREAM)
large = lib.malloc(3 << 20, 0, ALLOC_STREAM)
lib.record_stream(small, SIDE_STREAM)
lib.record_stream(small, SIDE_STREAM)    # duplicate
lib.record_stream(small, ALLOC_STREAM)   # on the allocation stream: a no-op, counted
lib.free(small, 1000, 0, ALLOC_STREAM)   # pending until a fence on SIDE_STREAM completes
try:
    lib.free(small, 1000, 0, ALLOC_STREAM)
    double_free = "accepted"
except _native.StreamallocError as error:
    double_free = str(error)
lib.validate()
stats, snapshot = json.loads(lib.stats_json(0)), json.loads(lib.snapshot_json())
history = json.loads(lib.pending_history_json(0))
lib.empty_cache()  # waits for the fence on SIDE_STREAM: the small block is no longer pending
lib.validate()
print(json.dumps({
    "small": small, "large": large, "double_free": double_free, "stats": stats, "snapshot": snapshot,
    "history": history, "history_after_empty_cache": json.loads(lib.pending_history_json(0)),
}))

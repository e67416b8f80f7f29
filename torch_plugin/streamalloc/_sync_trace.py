"""check_sync under PyTorch: forward PyTorch's GPU trace callbacks to streamalloc's happens-before check.

streamalloc sees its own fences, but a consumer stream becomes ordered after a producer through
synchronization the program makes: event records and waits (wait_event, wait_stream), stream and
device synchronize. PyTorch reports those through its GPU trace hooks (the mechanism behind
TORCH_CUDA_SANITIZER); with check_sync:1, enable() registers forwarding callbacks so that a
record_stream'ed block read on a stream that never waited for its producer is reported.

Activating the trace makes every CUDA event record and wait call into Python, so it happens only
with check_sync:1. Host waits on a single event (Event.synchronize) are not forwarded: the checker
has no such input, so the host is taken to be ordered only by stream and device synchronizes.
"""

from __future__ import annotations


def forward_to(path) -> None:
    """Register `path`'s note_* methods as PyTorch GPU trace callbacks and activate the trace."""
    import torch
    from torch.cuda import _gpu_trace

    _gpu_trace.register_callback_for_event_record(path.note_event_record)
    _gpu_trace.register_callback_for_event_wait(path.note_event_wait)
    _gpu_trace.register_callback_for_stream_synchronization(path.note_stream_synchronize)
    _gpu_trace.register_callback_for_device_synchronization(path.note_device_synchronize)
    torch._C._activate_gpu_trace()

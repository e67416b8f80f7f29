// The trace entries a DeviceCache sends to its TraceSink, built from its blocks and segments. The
// history aid (history_aid.cpp) calls each under the cache's lock, so none of this runs while the history
// is off (docs/design.md, "Allocation history"). Out of line: the cache's hot path keeps only the test.
#pragma once

#include <cstddef>

#include "block.hpp"
#include "fence_queue.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc::trace_events {

[[gnu::cold]] void alloc(TraceSink& sink, int device, const Block& block);
// free_requested with the streams the block waits for; free_completed with it when it waits for none.
[[gnu::cold]] void free_requested(TraceSink& sink, int device, const Block& block);
// A pending block's last fence completed (`fence` nullptr: its remaining uses were dropped, as a
// capture's are); `fence_stream` is the stream of that fence.
[[gnu::cold]] void fenced_free_completed(TraceSink& sink, int device, const Block& block, Stream fence_stream,
                                         const Fence* fence);
[[gnu::cold]] void segment(TraceSink& sink, TraceAction action, int device, const Segment& segment);
// kSegmentMap / kSegmentUnmap: `bytes` of pages at `address` of an expandable segment.
[[gnu::cold]] void segment_pages(TraceSink& sink, TraceAction action, int device, const Segment& segment,
                                 std::uintptr_t address, std::size_t bytes);
[[gnu::cold]] void record_stream(TraceSink& sink, int device, const Block& block, Stream stream);
[[gnu::cold]] void out_of_memory(TraceSink& sink, int device, std::size_t device_free, std::size_t size, Stream stream,
                                 PoolId pool);
[[gnu::cold]] void snapshot(TraceSink& sink, int device, std::size_t active_bytes);

}  // namespace streamalloc::trace_events

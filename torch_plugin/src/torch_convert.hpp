// Translation of streamalloc's statistics and block table into PyTorch's structs, so that
// torch.cuda.memory_stats(), memory_allocated(), _snapshot() and torch.cuda._memory_viz read
// streamalloc's numbers with PyTorch's own key names and shapes.
#pragma once

#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "streamalloc/allocator.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/stats.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc::torch {

c10::CachingDeviceAllocator::DeviceStats to_torch_stats(const DeviceStats& stats);

// Segments as Allocator::segments() lists them (each with the id of its pool), their blocks' and their
// own context_when_allocated from `contexts` (one per device; none when null); one empty trace list per
// device, which the history fills (torch_history.hpp).
c10::cuda::CUDACachingAllocator::SnapshotInfo to_torch_snapshot(const std::vector<SegmentInfo>& segments,
                                                                int device_count, const Options& options,
                                                                const std::vector<LiveContexts>* contexts = nullptr);

}  // namespace streamalloc::torch

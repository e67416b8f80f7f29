// streamalloc for LibTorch programs: make streamalloc the CUDA allocator of this process.
//
//   #include <streamalloc/torch.hpp>
//   int main() {
//     streamalloc::torch::install("audit:warn");  // before the first CUDA tensor
//     auto x = torch::randn({1024}, torch::kCUDA); // served by streamalloc
//   }
//
// After install(), every CUDA allocation PyTorch makes goes through streamalloc, and PyTorch's own
// memory APIs keep working from streamalloc's numbers: c10::cuda::CUDACachingAllocator::
// getDeviceStats() (torch.cuda.memory_stats()), resetPeakStats(), snapshot(), cacheInfo() (used by
// cuDNN benchmarking), get/setMemoryFraction(), emptyCache(), recordStream(), and the private-pool
// calls of CUDA graph capture, MemPool and torch.compile's cudagraph trees (beginAllocateToPool,
// releasePool, getCheckpointState, setCheckpointPoolState, ...); an allocation that does not fit
// throws c10::OutOfMemoryError with streamalloc's report. docs/pytorch.md lists what stays
// unsupported (IPC, allocation history, MemPools with an allocator of their own).
#pragma once

#include <string>

#include "streamalloc/allocator.hpp"
#include "streamalloc/options.hpp"

namespace streamalloc::torch {

// Install streamalloc as PyTorch's CUDA allocator. Must run before CUDA is initialised in this
// process (before the first CUDA tensor, stream or torch::cuda call): PyTorch cannot swap an
// allocator that is in use. Installing again with the same options is a no-op.
// Throws streamalloc::Error(kConfig) when CUDA is already initialised, when streamalloc was installed
// before with other options, when options.backend is kSim (host memory cannot back CUDA tensors), or
// when this build has no CUDA backend. No CUDA work happens here: the allocator is created by
// PyTorch's lazy CUDA initialisation.
void install(const Options& options);
// The same, from a "key:value,..." string (the STREAMALLOC_CONF syntax; "" = defaults). Bad keys or
// values throw Error(kConfig) naming the key and the accepted values, before anything is installed.
void install(const std::string& conf);
// The same, from the STREAMALLOC_CONF environment variable (defaults when unset).
void install_from_env();

// True once install() succeeded in this process.
bool is_installed();

// The allocator serving PyTorch, or nullptr before install() or before PyTorch initialised CUDA.
// Use it for streamalloc's own views: stats(device).per_stream, blocks(), snapshot_json(), validate().
Allocator* allocator();

}  // namespace streamalloc::torch

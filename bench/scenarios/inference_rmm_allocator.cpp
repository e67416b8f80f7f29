// RMM's arena_memory_resource as the inference server's allocator, in the shape CUDAPluggableAllocator
// takes (alloc and free functions with size, device and stream), which is how RMM plugs itself into
// PyTorch (rmm.allocators.torch). The arena keeps one small arena per stream, so worker threads on
// their own streams share no lock on the common path; CUDAPluggableAllocator itself still keeps its
// pointer -> (size, stream) map behind one mutex, as it does for any allocator plugged in this way.
// No torch headers here: RMM's headers are C++20 and only this file is compiled that way.
#include <rmm/aligned.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/version_config.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace streamalloc::bench {
namespace {

// Created on the first allocation (PyTorch's CUDA init has set the device by then), never destroyed:
// PyTorch frees tensors during static destruction. The global arena is RMM's default size, half of
// the free device memory, taken up front.
rmm::mr::arena_memory_resource& arena() {
  static auto* resource = new rmm::mr::arena_memory_resource(rmm::mr::cuda_memory_resource{});
  return *resource;
}

}  // namespace

void* rmm_arena_alloc(std::size_t size, int, cudaStream_t stream) {
  return arena().allocate(cuda::stream_ref{stream}, size, rmm::CUDA_ALLOCATION_ALIGNMENT);
}

void rmm_arena_free(void* ptr, std::size_t size, int, cudaStream_t stream) {
  arena().deallocate(cuda::stream_ref{stream}, ptr, size, rmm::CUDA_ALLOCATION_ALIGNMENT);
}

std::string rmm_arena_version() { return RMM_VERSION; }

}  // namespace streamalloc::bench

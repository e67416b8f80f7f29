// The CUDA allocators the inference server can run under, chosen by name once per process (PyTorch
// keeps one CUDA allocator for the life of a process): install before the first CUDA operation.
//
//   native       PyTorch's CUDACachingAllocator (nothing to install)
//   streamalloc  streamalloc through its LibTorch plugin (streamalloc::torch::install)
//   standin      a contention-free stand-in: per-thread free lists keyed by exact size, the ceiling an
//                allocator could reach on this loop (inference_standin_allocator.cpp; unsafe in general)
//   rmm          RMM's arena_memory_resource through CUDAPluggableAllocator, as RMM's own PyTorch
//                integration plugs it in (only in builds with RMM)
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>

#include "streamalloc/stats.hpp"

namespace streamalloc::bench {

// The names this build offers, in a fixed order.
std::vector<std::string> inference_allocator_names();

// Make `name` PyTorch's CUDA allocator; `streamalloc_conf` are streamalloc's options ("key:value,...")
// for name == "streamalloc". Throws std::invalid_argument for an unknown name (naming the known ones),
// and std::runtime_error when the allocator cannot be installed (CUDA already in use, ...).
void install_inference_allocator(const std::string& name, const std::string& streamalloc_conf);

// streamalloc's stats of `device` now; nullopt when streamalloc is not PyTorch's allocator.
std::optional<DeviceStats> streamalloc_stats(int device);

// The stand-in (inference_standin_allocator.cpp).
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> make_standin_allocator();

#ifdef STREAMALLOC_INFERENCE_RMM
// RMM's arena (inference_rmm_allocator.cpp): plain functions in CUDAPluggableAllocator's shape, in a
// file of their own because RMM's headers need C++20.
void* rmm_arena_alloc(std::size_t size, int device, cudaStream_t stream);
void rmm_arena_free(void* ptr, std::size_t size, int device, cudaStream_t stream);
std::string rmm_arena_version();
#endif

}  // namespace streamalloc::bench

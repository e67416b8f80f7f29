// install_inference_allocator(): one of the allocators of inference_allocators.hpp becomes PyTorch's.
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "inference_allocators.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/torch.hpp"

namespace streamalloc::bench {

std::vector<std::string> inference_allocator_names() {
  std::vector<std::string> names = {"native", "streamalloc", "standin"};
#ifdef STREAMALLOC_INFERENCE_RMM
  names.emplace_back("rmm");
#endif
  return names;
}

void install_inference_allocator(const std::string& name, const std::string& streamalloc_conf) {
  namespace pluggable = ::torch::cuda::CUDAPluggableAllocator;
  if (name == "native") return;
  try {
    if (name == "streamalloc") {
      streamalloc::torch::install(streamalloc_conf);
      return;
    }
    if (name == "standin") {
      pluggable::changeCurrentAllocator(make_standin_allocator());
      return;
    }
#ifdef STREAMALLOC_INFERENCE_RMM
    if (name == "rmm") {
      pluggable::changeCurrentAllocator(pluggable::createCustomAllocator(rmm_arena_alloc, rmm_arena_free));
      return;
    }
#endif
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot install the " + name + " allocator: " + e.what());
  }
  std::string known;
  for (const std::string& n : inference_allocator_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown allocator '" + name + "': this build has " + known);
}

std::optional<DeviceStats> streamalloc_stats(int device) {
  Allocator* allocator = streamalloc::torch::allocator();
  if (allocator == nullptr) return std::nullopt;
  return allocator->stats(device);
}

}  // namespace streamalloc::bench

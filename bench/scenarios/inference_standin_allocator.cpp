// The stand-in allocator: the inference server's ceiling, an allocator that costs close to nothing.
//
// Every thread keeps its own free lists, keyed by exact size: an allocation pops a block of that size
// from the calling thread's list (cudaMalloc on a miss), a free pushes the block onto the freeing
// thread's list. Nothing is shared, so there is no lock and no contention, and there is no stream
// bookkeeping at all.
//
// UNSAFE IN GENERAL. A block goes back into circulation the moment it is freed, with no regard for the
// stream that used it: this is only correct when every thread allocates, uses and frees its memory on
// one stream of its own and never hands memory to another thread or stream, which is exactly what the
// inference server's worker threads do (and nothing else is promised). It never gives memory back
// (emptyCache does nothing), rounds nothing (a new batch size is a new cudaMalloc), and keeps no
// statistics. It exists to measure how much of the loop's time the allocator is, not to be used.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <unordered_map>
#include <vector>

#include <c10/core/Device.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "inference_allocators.hpp"

namespace streamalloc::bench {
namespace {

// The DataPtr context: the memory and its size, which the deleter needs and PyTorch does not pass.
// A Block travels with its memory through the free lists, so steady state allocates no host memory.
struct Block {
  void* ptr;
  std::size_t size;
};

struct ThreadCache {
  std::unordered_map<std::size_t, std::vector<Block*>> free_by_size;
  ~ThreadCache();
};

// Set once this thread's cache is destroyed (thread exit; for the main thread, before the static
// destructors that still free tensors): later frees on this thread go straight to cudaFree.
thread_local bool t_cache_destroyed = false;

ThreadCache& thread_cache() {
  thread_local ThreadCache cache;
  return cache;
}

void release(Block* block) {
  cudaFree(block->ptr);  // errors ignored: this runs at thread or process exit
  delete block;
}

ThreadCache::~ThreadCache() {
  t_cache_destroyed = true;
  // The worker synchronized its stream before exiting; nothing can still use these blocks.
  for (auto& [size, blocks] : free_by_size) {
    for (Block* block : blocks) release(block);
  }
}

void delete_block(void* context) {
  auto* block = static_cast<Block*>(context);
  if (block == nullptr) return;
  if (t_cache_destroyed) {
    release(block);
    return;
  }
  thread_cache().free_by_size[block->size].push_back(block);
}

class StandinAllocator final : public ::torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
  using Base = ::torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

 public:
  // The base class's functions serve only raw_alloc/raw_delete (rare: none in the server's loop), with
  // plain cudaMalloc/cudaFree behind the base class's own map.
  StandinAllocator()
      : Base(
            [](std::size_t size, int, cudaStream_t) {
              void* ptr = nullptr;
              C10_CUDA_CHECK(cudaMalloc(&ptr, size));
              return ptr;
            },
            [](void* ptr, std::size_t, int, cudaStream_t) { C10_CUDA_CHECK(cudaFree(ptr)); }) {}

  c10::DataPtr allocate(std::size_t size) override {
    const c10::Device device(c10::DeviceType::CUDA, c10::cuda::current_device());
    if (size == 0) return {nullptr, nullptr, &delete_block, device};
    Block* block = nullptr;
    auto& blocks = thread_cache().free_by_size[size];
    if (!blocks.empty()) {
      block = blocks.back();
      blocks.pop_back();
    } else {
      void* ptr = nullptr;
      C10_CUDA_CHECK(cudaMalloc(&ptr, size));
      block = new Block{ptr, size};
    }
    return {block->ptr, block, &delete_block, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }
  // One stream per thread and no sharing: nothing to record.
  void recordStream(const c10::DataPtr&, c10::cuda::CUDAStream) override {}
  void emptyCache(c10::cuda::MempoolId_t) override {}
  std::string name() override { return "standin"; }
};

}  // namespace

std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> make_standin_allocator() {
  return std::make_shared<StandinAllocator>();
}

}  // namespace streamalloc::bench

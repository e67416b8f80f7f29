// PyTorch's native CUDACachingAllocator as a peer, called through LibTorch the way PyTorch calls it:
// raw_alloc_with_stream / raw_delete, and recordStream on a DataPtr. Built only when CMake found Torch;
// registered only when a GPU is present. Everything else in bench/ builds without torch.
// torch_expandable is the same peer in a child process started with expandable segments on: PyTorch
// reads PYTORCH_CUDA_ALLOC_CONF once, at its allocator's first use, so one process cannot host both.
#include <ATen/Context.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>  // TORCH_VERSION since 2.9
#else
#include <torch/version.h>
#endif

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "peer_kinds.hpp"

namespace streamalloc::bench {
namespace {

constexpr c10::DeviceIndex kDevice = 0;

class TorchNativePeer final : public Peer {
 public:
  TorchNativePeer() {
    // The allocator is set up by CUDA's lazy init, as in any PyTorch program (no tensor needed).
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    allocator_ = c10::cuda::CUDACachingAllocator::get();
    if (allocator_ == nullptr) throw std::runtime_error("torch_native: no CUDA caching allocator after CUDA init");
    // PyTorch can run with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; then this is not the peer we mean.
    if (allocator_->name() != "native") {
      throw std::runtime_error("torch_native: PyTorch's CUDA allocator is '" + allocator_->name() +
                               "', not 'native' (unset PYTORCH_CUDA_ALLOC_CONF's backend key)");
    }
    deleter_ = allocator_->raw_deleter();
    reset_memory();
  }

  ~TorchNativePeer() override {
    try {
      reset_memory();
    } catch (...) {
    }
  }

  void* alloc(std::size_t size, Stream stream) override {
    return allocator_->raw_alloc_with_stream(size, reinterpret_cast<cudaStream_t>(stream));
  }

  void free(void* ptr, std::size_t, Stream) override { allocator_->raw_delete(ptr); }

  void record_stream(void* ptr, Stream stream) override {
    // recordStream takes the DataPtr a tensor's storage holds; for a raw block that is a DataPtr with
    // the allocator's own deleter (recordStream ignores any other). It is a view: released, not deleted.
    c10::DataPtr view(ptr, ptr, deleter_, c10::Device(c10::DeviceType::CUDA, kDevice));
    allocator_->recordStream(view, c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(stream), kDevice));
    view.release_context();
  }

  Stream stream(int k) override { return cuda_pool_stream(k); }
  void synchronize() override { cuda_synchronize_device(); }

  void reset_memory() override {
    synchronize();
    allocator_->emptyCache();
    allocator_->resetPeakStats(kDevice);
  }

  MemoryPeaks peaks() override {
    const auto stats = allocator_->getDeviceStats(kDevice);
    const auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return {stats.reserved_bytes[all].peak, stats.allocated_bytes[all].peak};
  }

 private:
  c10::cuda::CUDACachingAllocator::CUDAAllocator* allocator_ = nullptr;
  c10::DeleterFnPtr deleter_ = nullptr;
};

}  // namespace

PeerKind torch_native_peer_kind() {
  return {"torch_native", "cuda", [] { return std::make_unique<TorchNativePeer>(); }};
}

PeerKind torch_expandable_peer_kind() {
  PeerKind kind{"torch_expandable", "cuda", {}};
  kind.child = ChildRun{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "torch_native"};
  return kind;
}

std::string torch_version() { return TORCH_VERSION; }

bool torch_expandable_segments() {
  return c10::CachingAllocator::AcceleratorAllocatorConfig::use_expandable_segments();
}

}  // namespace streamalloc::bench

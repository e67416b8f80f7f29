#include "torch_allocator.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "torch_convert.hpp"

namespace streamalloc::torch {
namespace {

// The allocator the DataPtr deleter frees into. install() sets it once and keeps the allocator alive
// for the rest of the process, so the deleter never sees a dangling pointer, even for tensors freed
// during static destruction at exit.
std::atomic<TorchAllocator*> g_current{nullptr};

Stream to_stream(cudaStream_t stream) { return reinterpret_cast<Stream>(stream); }

// The one translation of streamalloc's errors for PyTorch: `body`'s streamalloc::Error becomes a
// c10::Error (RuntimeError in Python) with streamalloc's message. Other exceptions (c10's own, such
// as OutOfMemoryError) pass through.
template <typename F>
decltype(auto) torch_errors(F&& body) {
  try {
    return std::forward<F>(body)();
  } catch (const Error& error) {
    C10_THROW_ERROR(Error, error.what());
  }
}

c10::DeviceIndex current_device() {
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return device;
}

}  // namespace

// The base class insists on an alloc and a free function. Every path that would call them is
// overridden below; they route to streamalloc anyway so that a base-class path added in a later
// PyTorch still allocates from the same place.
TorchAllocator::TorchAllocator(Options options)
    : Base([this](size_t size, int device, cudaStream_t stream) {
             return allocate_on(size, static_cast<c10::DeviceIndex>(device), stream);
           },
           [](void* ptr, size_t, int, cudaStream_t) { delete_block(ptr); }),
      options_(std::move(options)) {}

void TorchAllocator::set_current(TorchAllocator* allocator) {
  g_current.store(allocator, std::memory_order_release);
}

streamalloc::Allocator& TorchAllocator::core_or_create() {
  if (streamalloc::Allocator* core = core_.load(std::memory_order_acquire)) return *core;
  std::lock_guard<std::mutex> lock(create_mutex_);
  if (streamalloc::Allocator* core = core_.load(std::memory_order_relaxed)) return *core;
  Options options = options_;
  // Under PyTorch the memory must be device memory: "auto" may not fall back to the simulator.
  if (options.backend == BackendKind::kAuto) options.backend = BackendKind::kCuda;
  torch_errors([&] { owned_core_ = std::make_unique<streamalloc::Allocator>(options, make_backend(options)); });
  core_.store(owned_core_.get(), std::memory_order_release);
  return *owned_core_;
}

// ---- the hot path ----

void* TorchAllocator::allocate_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  streamalloc::Allocator& core = core_or_create();
  return torch_errors([&] {
    try {
      return core.allocate(size, device, to_stream(stream));
    } catch (const Error& error) {
      // An allocation that does not fit is PyTorch's OutOfMemoryError, with the observers told.
      if (error.code() == ErrorCode::kOutOfMemory) throw_out_of_memory(error, size, device);
      throw;
    }
  });
}

c10::DataPtr TorchAllocator::allocate(size_t size) {
  const c10::DeviceIndex device = current_device();
  void* ptr = allocate_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  return {ptr, ptr, &delete_block, c10::Device(c10::DeviceType::CUDA, device)};
}

c10::DeleterFnPtr TorchAllocator::raw_deleter() const { return &delete_block; }

void* TorchAllocator::raw_alloc(size_t nbytes) {
  const c10::DeviceIndex device = current_device();
  return allocate_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* TorchAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  return allocate_on(nbytes, current_device(), stream);
}

void TorchAllocator::raw_delete(void* ptr) {
  if (ptr == nullptr) return;
  streamalloc::Allocator* core = this->core();
  TORCH_CHECK(core != nullptr, "streamalloc: raw_delete of a pointer streamalloc never handed out");
  torch_errors([&] { core->deallocate(ptr); });
}

// A deleter runs inside destructors, so it must not throw: a rejected free (which changes nothing in
// the allocator) becomes a warning.
void TorchAllocator::delete_block(void* ptr) {
  if (ptr == nullptr) return;
  TorchAllocator* self = g_current.load(std::memory_order_acquire);
  streamalloc::Allocator* core = self != nullptr ? self->core() : nullptr;
  if (core == nullptr) {
    TORCH_WARN("streamalloc: asked to free ", ptr, " but no streamalloc allocator is running; ignored");
    return;
  }
  try {
    core->deallocate(ptr);
  } catch (const std::exception& error) {
    TORCH_WARN("streamalloc: could not free a tensor's memory: ", error.what());
  }
}

void TorchAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  // As PyTorch's own allocator: empty tensors and memory that another allocator owns (from_blob,
  // other deleters) have nothing for this allocator to protect. A view's DataPtr is its storage's, so
  // recording a shifted view protects the whole block.
  if (ptr.get() == nullptr || ptr.get_deleter() != &delete_block) return;
  torch_errors([&] { core_or_create().record_stream(ptr.get(), to_stream(stream.stream())); });
}

[[noreturn]] void TorchAllocator::throw_out_of_memory(const Error& error, size_t size, c10::DeviceIndex device) {
  std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(observers_mutex_);
    observers = oom_observers_;
  }
  if (!observers.empty()) {
    DeviceMemoryInfo info;
    try {
      info = core_or_create().backend().memory_info(device);
    } catch (const Error&) {
      // The observers still hear about the OOM, with zeros where the device could not say.
    }
    for (const auto& observer : observers) {
      observer(device, static_cast<int64_t>(size), static_cast<int64_t>(info.total_bytes),
               static_cast<int64_t>(info.free_bytes));
    }
  }
  // The core's text starts with PyTorch's own sentences ("CUDA out of memory. Tried to allocate ...");
  // tools that retry with smaller batches, and people, look for them. Under PyTorch the allocator is
  // PyTorch's, so its sentences say so, as PyTorch's do.
  static const std::pair<std::string, std::string> kPyTorchWords[] = {
      {" is allocated by streamalloc, and ", " is allocated by PyTorch, and "},
      {" is reserved by streamalloc but unallocated.", " is reserved by PyTorch but unallocated."}};
  std::string message = error.what();
  for (const auto& [ours, theirs] : kPyTorchWords) {
    const std::size_t at = message.find(ours);
    if (at != std::string::npos) message.replace(at, ours.size(), theirs);
  }
  const std::string headline = "CUDA out of memory.";
  if (message.compare(0, headline.size(), headline) != 0) message = headline + " " + message;
  C10_THROW_ERROR(OutOfMemoryError, message);
}

// ---- life cycle and policy ----

void TorchAllocator::init(int device_count) {
  streamalloc::Allocator& core = core_or_create();
  TORCH_CHECK(device_count <= core.device_count(), "streamalloc: PyTorch sees ", device_count,
              " CUDA devices but streamalloc's CUDA backend sees ", core.device_count());
  initialized_ = true;
}

void TorchAllocator::emptyCache(MempoolId mempool_id) {
  TORCH_CHECK((mempool_id == MempoolId{0, 0}),
              "streamalloc has no private memory pools; empty_cache() of a MemPool is not supported");
  if (streamalloc::Allocator* core = this->core()) core->empty_cache();
}

double TorchAllocator::getMemoryFraction(c10::DeviceIndex device) {
  return torch_errors([&] { return core_or_create().memory_fraction(device); });
}

void TorchAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  torch_errors([&] { core_or_create().set_memory_fraction(fraction, device); });
}

// PyTorch's contract (used to size cuDNN benchmark workspaces): a zero *largest_block asks for an
// initial guess of what could still be allocated; the answer is the larger of that and the largest
// cached free block. The guess respects streamalloc's memory-fraction cap.
void TorchAllocator::cacheInfo(c10::DeviceIndex device, size_t* largest_block) {
  streamalloc::Allocator& core = core_or_create();
  torch_errors([&] {
    std::size_t largest_cached = 0;
    core.cache_info(device, &largest_cached, nullptr);
    if (*largest_block == 0) {
      const DeviceMemoryInfo info = core.backend().memory_info(device);
      const auto cap = static_cast<std::size_t>(core.memory_fraction(device) * static_cast<double>(info.total_bytes));
      const auto reserved = static_cast<std::size_t>(core.stats(device).reserved_bytes[0].current);
      *largest_block = std::min(info.free_bytes, cap > reserved ? cap - reserved : 0);
    }
    *largest_block = std::max(*largest_block, largest_cached);
  });
}

void* TorchAllocator::getBaseAllocation(void* ptr, size_t* size) {
  streamalloc::Allocator* core = this->core();
  void* base = core != nullptr ? core->segment_base(ptr, size) : nullptr;
  TORCH_CHECK(base != nullptr, "streamalloc: ", ptr, " is not inside memory streamalloc reserved");
  return base;
}

// ---- statistics and snapshots ----

c10::CachingDeviceAllocator::DeviceStats TorchAllocator::getDeviceStats(c10::DeviceIndex device) {
  return torch_errors([&] { return to_torch_stats(core_or_create().stats(device)); });
}

void TorchAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  torch_errors([&] { core_or_create().reset_accumulated_stats(device); });
}

void TorchAllocator::resetPeakStats(c10::DeviceIndex device) {
  torch_errors([&] { core_or_create().reset_peak_stats(device); });
}

c10::cuda::CUDACachingAllocator::SnapshotInfo TorchAllocator::snapshot(MempoolId mempool_id, bool) {
  TORCH_CHECK((mempool_id == MempoolId{0, 0}), "streamalloc has no private memory pools to snapshot");
  const streamalloc::Allocator* core = this->core();
  if (core == nullptr) return to_torch_snapshot({}, 0, options_);
  return to_torch_snapshot(core->segments(-1), core->device_count(), core->options());
}

void TorchAllocator::recordHistory(bool enabled, c10::cuda::CUDACachingAllocator::CreateContextFn, size_t,
                                   c10::cuda::CUDACachingAllocator::RecordContext, bool,
                                   const std::vector<std::string>&) {
  TORCH_CHECK(!enabled,
              "streamalloc does not record allocation history (torch.cuda.memory._record_memory_history). "
              "Its snapshot carries each block's streams, pending fences and age instead "
              "(torch.cuda.memory._snapshot() or streamalloc.snapshot()); for an event log run with "
              "STREAMALLOC_CONF=audit:trace.");
}

void TorchAllocator::attachOutOfMemoryObserver(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

void TorchAllocator::attachAllocatorTraceTracker(c10::cuda::CUDACachingAllocator::AllocatorTraceTracker) {
  TORCH_WARN_ONCE("streamalloc does not emit allocator trace events; an attached tracker (for example "
                  "ProcessGroupNCCL's buffer-registration hook) will not be called");
}

// ---- CUDA graph pools ----

// Graph capture allocates into a private pool that the graph owns between replays. streamalloc has
// no such pools: memory freed after capture would be handed to other tensors while replays still
// write into it. Refusing here, before the capture starts, turns that silent corruption into an error.
void TorchAllocator::beginAllocateToPool(c10::DeviceIndex, MempoolId, std::function<bool(cudaStream_t)>) {
  TORCH_CHECK(false,
              "streamalloc does not support CUDA graph memory pools, so torch.cuda.graph capture (and "
              "torch.compile's cudagraphs) cannot run under it; run that part without streamalloc");
}

// Nothing was ever allocated to a pool (beginAllocateToPool refuses), so ending or releasing one has
// nothing to do; these stay silent because PyTorch also calls them while tearing a graph down.
void TorchAllocator::endAllocateToPool(c10::DeviceIndex, MempoolId) {}
void TorchAllocator::releasePool(c10::DeviceIndex, MempoolId) {}

}  // namespace streamalloc::torch

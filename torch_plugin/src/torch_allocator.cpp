#include "torch_allocator.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include "torch_convert.hpp"
#include "torch_settings.hpp"

namespace streamalloc::torch {
namespace {

// The allocator the DataPtr deleter frees into. install() sets it once and keeps the allocator alive
// for the rest of the process, so the deleter never sees a dangling pointer, even for tensors freed
// during static destruction at exit.
std::atomic<TorchAllocator*> g_current{nullptr};

Stream to_stream(cudaStream_t stream) { return reinterpret_cast<Stream>(stream); }

PoolId to_pool(c10::MempoolId_t id) {
  return {static_cast<std::uint64_t>(id.first), static_cast<std::uint64_t>(id.second)};
}

// PyTorch's opaque checkpoint of a private pool (getCheckpointState), handed back unchanged to
// setCheckpointPoolState by torch.compile's cudagraph trees.
struct PoolState final : c10::cuda::CUDACachingAllocator::AllocatorState {
  explicit PoolState(PoolCheckpoint saved) : checkpoint(std::move(saved)) {}
  const PoolCheckpoint checkpoint;
};

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
// PyTorch still allocates from the same place. The base class's free names the block's size, device
// and allocation stream (kept in its own table), which take the free straight to its shard.
TorchAllocator::TorchAllocator(Options options)
    : Base([this](size_t size, int device,
                  cudaStream_t stream) { return allocate_on(size, static_cast<c10::DeviceIndex>(device), stream); },
           [this](void* ptr, size_t size, int device, cudaStream_t stream) {
             if (ptr == nullptr) return;
             streamalloc::Allocator* core = this->core();
             TORCH_CHECK(core != nullptr, "streamalloc: free of a pointer streamalloc never handed out");
             torch_errors([&] { free_block(*core, ptr, size, device, stream); });
           }),
      options_(std::move(options)) {}

void TorchAllocator::set_current(TorchAllocator* allocator) { g_current.store(allocator, std::memory_order_release); }
TorchAllocator* TorchAllocator::current() { return g_current.load(std::memory_order_acquire); }

streamalloc::Allocator& TorchAllocator::core_or_create() {
  if (streamalloc::Allocator* core = core_.load(std::memory_order_acquire)) return *core;
  std::lock_guard<std::mutex> lock(create_mutex_);
  if (streamalloc::Allocator* core = core_.load(std::memory_order_relaxed)) return *core;
  Options options = options_;
  // Under PyTorch the memory must be device memory: "auto" may not fall back to the simulator.
  if (options.backend == BackendKind::kAuto) options.backend = BackendKind::kCuda;
  torch_errors([&] {
    auto core = std::make_unique<streamalloc::Allocator>(options, make_backend(options));
    // PyTorch's own settings (PYTORCH_ALLOC_CONF, or the last _set_allocator_settings) over the options.
    apply(*core, current_pytorch_settings());
    owned_core_ = std::move(core);
  });
  core_.store(owned_core_.get(), std::memory_order_release);
  return *owned_core_;
}

// ---- the hot path ----

// With the history on, the calling thread's stack is gathered here, before the core takes its lock
// (gathering a Python stack needs the GIL, which a thread waiting for that lock may hold). The OOM
// entry is recorded inside the core, before throw_out_of_memory tells the observers, as PyTorch's.
void* TorchAllocator::allocate_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
  streamalloc::Allocator& core = core_or_create();
  std::optional<TraceContextScope> context;
  if (history_.enabled()) context.emplace(history_.context_for(RecordContext::STATE));
  void* ptr = torch_errors([&] {
    try {
      return core.allocate(size, device, to_stream(stream));
    } catch (const Error& error) {
      // An allocation that does not fit is PyTorch's OutOfMemoryError, with the observers told.
      if (error.code() == ErrorCode::kOutOfMemory) throw_out_of_memory(error, size, device);
      throw;
    }
  });
  // As PyTorch's allocator: one test of the profiler's thread-local state when it is off.
  if (c10::memoryProfilingEnabled()) report_to_profiler(core, ptr, static_cast<std::int64_t>(size), device);
  return ptr;
}

// A DataPtr's deleter gets the pointer alone (its context must stay the pointer: c10's raw_allocate
// and simple-DataPtr checks compare them, and cudagraph trees compare deleters with raw_deleter()), so
// the deleter's frees name no device or stream and the core looks them up.
void TorchAllocator::free_block(streamalloc::Allocator& core, void* ptr, size_t size, int device, cudaStream_t stream) {
  std::optional<TraceContextScope> context;
  if (history_.enabled()) context.emplace(history_.context_for(RecordContext::ALL));
  if (!c10::memoryProfilingEnabled()) {
    core.deallocate(ptr, size, device, to_stream(stream));
    return;
  }
  const std::int64_t requested = static_cast<std::int64_t>(core.requested_size_of(ptr));
  const int owner = device >= 0 ? device : core.device_of(ptr);
  core.deallocate(ptr, size, device, to_stream(stream));
  if (owner >= 0) report_to_profiler(core, ptr, -requested, owner);
}

// The bytes are the requested sizes, at allocation and at free alike, so that the profiler's running
// sum of them returns to zero.
void TorchAllocator::report_to_profiler(streamalloc::Allocator& core, void* ptr, std::int64_t bytes, int device) {
  const DeviceStats stats = core.stats(device);
  c10::reportMemoryUsageToProfiler(ptr, bytes, static_cast<std::size_t>(stats.allocated_bytes[0].current),
                                   static_cast<std::size_t>(stats.reserved_bytes[0].current),
                                   c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
}

void* TorchAllocator::uncached_alloc(size_t size, c10::DeviceIndex device) {
  c10::cuda::CUDAGuard guard(device);
  void* ptr = nullptr;
  if (size != 0) C10_CUDA_CHECK(cudaMalloc(&ptr, size));
  return ptr;
}

void TorchAllocator::uncached_delete(void* ptr) {
  if (ptr != nullptr) C10_CUDA_CHECK_WARN(cudaFree(ptr));
}

c10::DataPtr TorchAllocator::allocate(size_t size) {
  const c10::DeviceIndex device = current_device();
  if (!isEnabled()) {
    void* ptr = uncached_alloc(size, device);
    return {ptr, ptr, &uncached_delete, c10::Device(c10::DeviceType::CUDA, device)};
  }
  void* ptr = allocate_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
  return {ptr, ptr, &delete_block, c10::Device(c10::DeviceType::CUDA, device)};
}

c10::DeleterFnPtr TorchAllocator::raw_deleter() const { return &delete_block; }

void* TorchAllocator::raw_alloc(size_t nbytes) {
  const c10::DeviceIndex device = current_device();
  return raw_alloc_with_stream(nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* TorchAllocator::raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) {
  const c10::DeviceIndex device = current_device();
  if (!isEnabled()) {
    void* ptr = uncached_alloc(nbytes, device);
    std::lock_guard<std::mutex> lock(uncached_mutex_);
    uncached_.insert(ptr);
    return ptr;
  }
  return allocate_on(nbytes, device, stream);
}

void TorchAllocator::raw_delete(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(uncached_mutex_);
    if (uncached_.erase(ptr) != 0) {
      C10_CUDA_CHECK(cudaFree(ptr));
      return;
    }
  }
  streamalloc::Allocator* core = this->core();
  TORCH_CHECK(core != nullptr, "streamalloc: raw_delete of a pointer streamalloc never handed out");
  torch_errors([&] { free_block(*core, ptr); });
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
    self->free_block(*core, ptr);
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

// Without a core nothing is cached yet. ~MemPool calls this with its pool's id right after releasing
// the pool.
void TorchAllocator::emptyCache(MempoolId mempool_id) {
  streamalloc::Allocator* core = this->core();
  if (core == nullptr) return;
  const PoolId pool = to_pool(mempool_id);
  std::optional<TraceContextScope> context;  // segment_free entries carry it, as PyTorch's
  if (history_.enabled()) context.emplace(history_.context_for(RecordContext::ALL));
  torch_errors([&] {
    if (pool.is_default()) {
      core->empty_cache();
    } else {
      core->empty_cache(pool);
    }
  });
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

// ---- CUDA IPC ----

// As PyTorch's allocator: a block of a fixed segment is shared as its cudaMalloc allocation ('c'), a
// block of an expandable segment as the pieces under it ('e', descriptors this process keeps open while
// the block is live; PyTorch's producer-side reference counting keeps it live while a consumer uses it).
c10::cuda::CUDACachingAllocator::ShareableHandle TorchAllocator::shareIpcHandle(void* ptr) {
  streamalloc::Allocator* core = this->core();
  TORCH_CHECK(core != nullptr, "streamalloc: cannot share ", ptr,
              " with another process: streamalloc has not "
              "allocated anything yet");
  const int device = core->device_of(ptr);
  TORCH_CHECK(device >= 0, "streamalloc: cannot share ", ptr,
              " with another process: it is not the start of a block streamalloc allocated");
  const SharedPieces shared = torch_errors([&] { return core->share_pieces(ptr); });
  if (!shared.pieces.empty()) return share_expandable_pieces(shared);
  std::size_t size = 0;
  void* base = core->segment_base(ptr, &size);
  TORCH_CHECK(base != nullptr, "streamalloc: cannot share ", ptr,
              " with another process: it is not inside memory "
              "streamalloc reserved");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return share_cuda_malloc_segment(base, static_cast<const char*>(ptr) - static_cast<const char*>(base));
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

// As PyTorch's own allocator: the default id asks for every segment, private pools' included; a pool's
// id for that pool's segments only (none for a pool that does not exist).
c10::cuda::CUDACachingAllocator::SnapshotInfo TorchAllocator::snapshot(MempoolId mempool_id, bool include_traces) {
  const streamalloc::Allocator* core = this->core();
  if (core == nullptr) return to_torch_snapshot({}, 0, options_);
  // As PyTorch's allocator: the traces are taken before the segments, whose listing records this
  // snapshot's own `snapshot` entry, so that entry shows in the next snapshot, not in this one.
  std::vector<std::vector<TraceEntry>> histories;
  if (include_traces) {
    for (int d = 0; d < core->device_count(); ++d) histories.push_back(core->history(d));
  }
  std::vector<SegmentInfo> segments = core->segments(-1);
  const PoolId pool = to_pool(mempool_id);
  if (!pool.is_default()) {
    segments.erase(std::remove_if(segments.begin(), segments.end(),
                                  [&](const SegmentInfo& segment) { return segment.pool != pool; }),
                   segments.end());
  }
  std::vector<LiveContexts> contexts;
  for (int d = 0; d < core->device_count(); ++d) contexts.push_back(core->live_contexts(d));
  auto out = to_torch_snapshot(segments, core->device_count(), core->options(), &contexts);
  if (include_traces) {
    const bool with_stacks = history_.trace_stacks();
    const auto metadata_at = [this](std::int64_t time_us) { return history_.user_metadata_at(time_us); };
    for (std::size_t d = 0; d < histories.size(); ++d) {
      out.device_traces[d] = to_torch_trace(histories[d], with_stacks, metadata_at);
    }
  }
  return out;
}

// PyTorch's semantics (c10/cuda/CUDACachingAllocator.cpp): `when` decides which calls gather a stack
// (STATE and up at allocation, ALL at a free too), `alloc_trace_max_entries` bounds the ring, turning
// the history off or `clear_history` drops it, and `skip_actions` leaves actions out of the trace.
void TorchAllocator::recordHistory(bool enabled, c10::cuda::CUDACachingAllocator::CreateContextFn context_recorder,
                                   size_t alloc_trace_max_entries, c10::cuda::CUDACachingAllocator::RecordContext when,
                                   bool clear_history, const std::vector<std::string>& skip_actions) {
  streamalloc::Allocator& core = core_or_create();
  torch_errors([&] {
    history_.configure(core, enabled, std::move(context_recorder), alloc_trace_max_entries, when, clear_history,
                       skip_actions);
  });
}

void TorchAllocator::attachOutOfMemoryObserver(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

void TorchAllocator::attachAllocatorTraceTracker(c10::cuda::CUDACachingAllocator::AllocatorTraceTracker) {
  TORCH_WARN_ONCE(
      "streamalloc does not emit allocator trace events; an attached tracker (for example "
      "ProcessGroupNCCL's buffer-registration hook) will not be called");
}

// ---- memory pools ----
//
// PyTorch drives private pools from three places; each of its calls maps onto one core call:
//  - CUDA graph capture (CUDAGraph::capture_begin / capture_end / reset): beginAllocateToPool with a
//    filter that accepts the capturing streams, endAllocateToPool once the capture ends, releasePool
//    when the graph is reset or destroyed.
//  - torch.cuda.MemPool: createOrIncrefPool (and setUseOnOOM / setNoSplit) when it is made;
//    use_mem_pool() opens a route that accepts the current thread (begin, end, release); ~MemPool
//    releases the pool and empties its cache.
//  - torch.compile's cudagraph trees: the routes above, plus getCheckpointState after each recording,
//    setCheckpointPoolState before recording the next graph of the tree, and then
//    checkPoolLiveAllocations (inductor's slow_path_cudagraph_asserts, on by default).
// The use counts are the core's: begin_allocate_to_pool adds one, as createOrIncrefPool does, and
// each is dropped by one releasePool, which is how PyTorch pairs them.

void TorchAllocator::beginAllocateToPool(c10::DeviceIndex device, MempoolId mempool_id,
                                         std::function<bool(cudaStream_t)> filter) {
  TORCH_CHECK(filter != nullptr, "streamalloc: beginAllocateToPool needs a stream filter");
  streamalloc::Allocator& core = core_or_create();
  // The core hands the filter its opaque Stream, which is the cudaStream_t it was given.
  PoolFilter accepts = [filter = std::move(filter)](Stream stream) {
    return filter(reinterpret_cast<cudaStream_t>(stream));
  };
  torch_errors([&] { core.begin_allocate_to_pool(device, to_pool(mempool_id), std::move(accepts)); });
}

void TorchAllocator::endAllocateToPool(c10::DeviceIndex device, MempoolId mempool_id) {
  streamalloc::Allocator& core = core_or_create();
  torch_errors([&] { core.end_allocate_to_pool(device, to_pool(mempool_id)); });
}

void TorchAllocator::releasePool(c10::DeviceIndex device, MempoolId mempool_id) {
  streamalloc::Allocator& core = core_or_create();
  torch_errors([&] { core.release_pool(device, to_pool(mempool_id)); });
}

void TorchAllocator::createOrIncrefPool(c10::DeviceIndex device, MempoolId mempool_id,
                                        std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator) {
  streamalloc::Allocator& core = core_or_create();
  const PoolId pool = to_pool(mempool_id);
  torch_errors([&] { core.create_or_incref_pool(device, pool); });
  if (allocator == nullptr || allocator.get() == this) return;
  // As PyTorch's allocator: the pool's segments come from the other allocator's raw_alloc (on the
  // pool's device and the current stream) and go back through its raw_delete. Its out-of-memory error
  // is the core's out of memory (nullptr), so the pool's own OOM path and message apply.
  SegmentAllocator segments;
  segments.reserve = [allocator](int on_device, std::size_t bytes) -> void* {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(on_device));
    try {
      return allocator->raw_alloc(bytes);
    } catch (const c10::OutOfMemoryError&) {
      return nullptr;
    } catch (const std::exception& error) {
      throw Error(ErrorCode::kBackend, std::string("streamalloc: the MemPool's allocator (") + allocator->name() +
                                           ") failed to allocate " + std::to_string(bytes) + " bytes: " + error.what());
    }
  };
  segments.release = [allocator](int on_device, void* ptr, std::size_t) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(on_device));
    allocator->raw_delete(ptr);
  };
  try {
    torch_errors([&] { core.set_pool_segment_allocator(device, pool, std::move(segments)); });
  } catch (...) {
    torch_errors([&] { core.release_pool(device, pool); });  // the refused call leaves the pool as it was
    throw;
  }
}

int TorchAllocator::getPoolUseCount(c10::DeviceIndex device, MempoolId mempool_id) {
  streamalloc::Allocator* core = this->core();
  if (core == nullptr) return 0;
  return torch_errors([&] { return core->pool_use_count(device, to_pool(mempool_id)); });
}

void TorchAllocator::setUseOnOOM(c10::DeviceIndex device, MempoolId mempool_id, bool use_on_oom) {
  streamalloc::Allocator& core = core_or_create();
  torch_errors([&] { core.set_pool_use_on_oom(device, to_pool(mempool_id), use_on_oom); });
}

void TorchAllocator::setNoSplit(c10::DeviceIndex device, MempoolId mempool_id) {
  streamalloc::Allocator& core = core_or_create();
  torch_errors([&] { core.set_pool_no_split(device, to_pool(mempool_id)); });
}

bool TorchAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId mempool_id,
                                              const std::unordered_set<void*>& expected_live_allocations) {
  streamalloc::Allocator& core = core_or_create();
  const std::vector<const void*> expected(expected_live_allocations.begin(), expected_live_allocations.end());
  return torch_errors([&] { return core.pool_live_blocks_are(device, to_pool(mempool_id), expected); });
}

std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> TorchAllocator::getCheckpointState(
    c10::DeviceIndex device, MempoolId id) {
  streamalloc::Allocator& core = core_or_create();
  return torch_errors([&] { return std::make_shared<PoolState>(core.checkpoint_pool(device, to_pool(id))); });
}

// Everything that can refuse runs before restore_pool, and nothing after it can fail: once the core
// has freed and re-created the pool's blocks, PyTorch must receive every one of them (a block left
// out would stay live with no owner).
c10::cuda::CUDACachingAllocator::CheckpointDelta TorchAllocator::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> state) {
  const std::shared_ptr<PoolState> saved = std::dynamic_pointer_cast<PoolState>(state);
  TORCH_CHECK(saved != nullptr,
              "streamalloc: setCheckpointPoolState was given a state that streamalloc's getCheckpointState did "
              "not make (a checkpoint of another allocator cannot be restored into streamalloc's pools)");
  const PoolCheckpoint& checkpoint = saved->checkpoint;
  TORCH_CHECK(checkpoint.device == device, "streamalloc: the checkpoint of pool (", checkpoint.pool.first, ", ",
              checkpoint.pool.second, ") was taken on device ", checkpoint.device, ", not on device ",
              static_cast<int>(device));
  streamalloc::Allocator& core = core_or_create();

  std::size_t allocated = 0;
  for (const SegmentLayout& segment : checkpoint.segments) {
    for (const BlockLayout& block : segment.blocks) allocated += block.allocated ? 1 : 0;
  }
  c10::cuda::CUDACachingAllocator::CheckpointDelta delta;
  delta.dataptrs_allocd.reserve(allocated);

  PoolRestore restore = torch_errors([&] { return core.restore_pool(checkpoint); });
  delta.ptrs_freed = std::move(restore.freed);
  const c10::Device cuda_device(c10::DeviceType::CUDA, device);
  for (void* ptr : restore.allocated) delta.dataptrs_allocd.emplace_back(ptr, ptr, &delete_block, cuda_device);
  return delta;
}

}  // namespace streamalloc::torch

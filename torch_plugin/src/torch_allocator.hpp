// TorchAllocator: streamalloc behind PyTorch's CUDAAllocator interface.
//
// It derives from CUDAPluggableAllocator because that is the class PyTorch lets a process install
// (changeCurrentAllocator), but it bypasses the base class wherever the base would cost or fail:
//  - allocate()/raw_alloc*/raw_delete and the DataPtr deleter call streamalloc's Allocator directly.
//    The base class keeps its own pointer -> (size, device, stream) map behind one global mutex on
//    every malloc and free; streamalloc already keeps a pointer table per device, so that map would be
//    pure overhead and a point of contention between threads.
//  - getDeviceStats, resetPeakStats, snapshot, cacheInfo, getMemoryFraction, which the base class
//    rejects, are served from streamalloc's own stats and block table.
//  - an allocation that does not fit throws c10::OutOfMemoryError (torch.cuda.OutOfMemoryError in
//    Python) with streamalloc's report, where the base class would hand PyTorch a null pointer.
//  - the pool hooks (CUDA graph capture, torch.cuda.MemPool, torch.compile's cudagraph trees), which
//    the base class ignores or rejects, map onto the core's private pools (streamalloc/pools.hpp).
// The translation of stats and snapshots lives in torch_convert.hpp; the policy lives in the core.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include "streamalloc/allocator.hpp"
#include "streamalloc/options.hpp"
#include "torch_history.hpp"
#include "torch_ipc.hpp"

namespace streamalloc::torch {

class TorchAllocator final : public ::torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator {
  using Base = ::torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;
  using MempoolId = c10::MempoolId_t;

 public:
  // `options.backend` must not be kSim; install() checks. No CUDA work happens until init().
  explicit TorchAllocator(Options options);

  const Options& options() const { return options_; }
  // nullptr until PyTorch's CUDA init (or the first allocation) created it.
  streamalloc::Allocator* core() const { return core_.load(std::memory_order_acquire); }

  // ---- the hot path ----
  c10::DataPtr allocate(size_t size) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void* raw_alloc(size_t nbytes) override;
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;

  // ---- torch.cuda.caching_allocator_enable(False): as PyTorch's allocator, memory then comes straight
  // from cudaMalloc and goes straight back to cudaFree, uncached and outside streamalloc's numbers ----
  void enable(bool value) override { caching_.store(value, std::memory_order_relaxed); }
  bool isEnabled() const override { return caching_.load(std::memory_order_relaxed); }

  // ---- life cycle and policy ----
  void init(int device_count) override;
  // {0, 0}: every cached segment that is free (Allocator::empty_cache()); a private pool's id: that
  // pool's free segments, which go back only once no graph, MemPool or route uses the pool.
  void emptyCache(MempoolId mempool_id = {0, 0}) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override;
  void* getBaseAllocation(void* ptr, size_t* size) override;

  // ---- statistics and snapshots, from streamalloc's own numbers ----
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  // {0, 0}: every segment; a pool's id (MemPool.snapshot()): that pool's segments only. Each segment
  // names its pool (segment_pool_id), which cudagraph trees read to find their pool's blocks.
  c10::cuda::CUDACachingAllocator::SnapshotInfo snapshot(MempoolId mempool_id = {0, 0},
                                                         bool include_traces = true) override;
  void recordHistory(bool enabled, c10::cuda::CUDACachingAllocator::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, c10::cuda::CUDACachingAllocator::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override;
  bool isHistoryEnabled() override { return history_.enabled(); }
  void setUserMetadata(const std::string& metadata) override { history_.set_user_metadata(metadata); }
  // torch.compile's regions ("Torch-Compiled Region: 0/0"), named in the trace entries made inside them.
  void pushCompileContext(std::string& md) override { history_.push_compile_context(md); }
  void popCompileContext() override { history_.pop_compile_context(); }
  std::string getUserMetadata() override { return history_.user_metadata(); }
  void attachOutOfMemoryObserver(c10::cuda::CUDACachingAllocator::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(c10::cuda::CUDACachingAllocator::AllocatorTraceTracker tracker) override;

  // ---- memory pools: CUDA graph capture, torch.cuda.MemPool, torch.compile's cudagraph trees ----
  // Each forwards to the core's pool of the same id (MempoolId_t and PoolId number pools alike); the
  // core's refusals become c10 errors and change nothing.
  void beginAllocateToPool(c10::DeviceIndex device, MempoolId mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, MempoolId mempool_id) override;
  void releasePool(c10::DeviceIndex device, MempoolId mempool_id) override;
  // `allocator` is what torch.cuda.MemPool(allocator=...) was given: the pool's segments then come from
  // its raw_alloc and go back through its raw_delete (the core's SegmentAllocator); its blocks are the
  // pool's alone, as every private pool's.
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId mempool_id,
                          std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator = nullptr) override;
  int getPoolUseCount(c10::DeviceIndex device, MempoolId mempool_id) override;
  void setUseOnOOM(c10::DeviceIndex device, MempoolId mempool_id, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, MempoolId mempool_id) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, MempoolId mempool_id,
                                const std::unordered_set<void*>& expected_live_allocations) override;
  // A private pool's block layout (a streamalloc::PoolCheckpoint inside PyTorch's opaque state), and
  // its restore: the delta's DataPtrs carry raw_deleter(), as PyTorch's storages expect.
  std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                                                      MempoolId id) override;
  c10::cuda::CUDACachingAllocator::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> state) override;

  // ---- CUDA IPC (torch.multiprocessing), in PyTorch's handle format (torch_ipc.hpp) ----
  // The producer: a 'c' handle of the block's segment and the block's offset in it. A fixed segment is
  // one cudaMalloc, which cudaIpcGetMemHandle shares whole. It stays reserved while a consumer may use
  // it because the shared block does: PyTorch keeps the block allocated (CudaIPCSentData) until every
  // consumer dropped it, and the core never gives back a segment holding a live block. Memory in
  // streamalloc's expandable segments is refused (its pieces vary in size; PyTorch's 'e' format
  // describes equal pieces).
  c10::cuda::CUDACachingAllocator::ShareableHandle shareIpcHandle(void* ptr) override;
  // The consumer: opens a 'c' handle (PyTorch's or streamalloc's producer) or an 'e' handle (PyTorch's
  // expandable segments), once per process, closed when the last storage on it dies.
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override { return ipc_imports_.open(handle); }

  std::string name() override { return "streamalloc"; }

  // The allocator the process-wide deleter frees into (the installed one).
  static void set_current(TorchAllocator* allocator);
  static TorchAllocator* current();

 private:
  streamalloc::Allocator& core_or_create();
  void* allocate_on(size_t size, c10::DeviceIndex device, cudaStream_t stream);
  [[noreturn]] void throw_out_of_memory(const Error& error, size_t size, c10::DeviceIndex device);
  static void delete_block(void* ptr);
  static void uncached_delete(void* ptr);
  void* uncached_alloc(size_t size, c10::DeviceIndex device);
  // A free with the history's context set and the profiler told; throws what the core throws.
  // `size`, `device`, `stream`: 0, -1, nullptr where the caller does not know them (the DataPtr deleter).
  void free_block(streamalloc::Allocator& core, void* ptr, size_t size = 0, int device = -1,
                  cudaStream_t stream = nullptr);
  // torch.profiler(profile_memory=True): `bytes` (negative for a free) and the device's totals after it.
  static void report_to_profiler(streamalloc::Allocator& core, void* ptr, std::int64_t bytes, int device);

  const Options options_;
  std::atomic<streamalloc::Allocator*> core_{nullptr};
  std::unique_ptr<streamalloc::Allocator> owned_core_;  // created once, by init() or the first allocation
  std::mutex create_mutex_;
  std::mutex observers_mutex_;
  std::vector<c10::cuda::CUDACachingAllocator::OutOfMemoryObserver> oom_observers_;
  TorchHistory history_;  // torch.cuda.memory._record_memory_history's settings
  IpcImports ipc_imports_;
  std::atomic<bool> caching_{true};
  std::mutex uncached_mutex_;
  std::unordered_set<void*> uncached_;  // raw_alloc's pointers while caching was off
};

}  // namespace streamalloc::torch

// TorchAllocator's pool hooks, called in the order PyTorch calls them (CUDAGraph capture, MemPool and
// use_mem_pool, the checkpoints of torch.compile's cudagraph trees), over the simulated device: what
// the plugin hands PyTorch (use counts, snapshots, checkpoint deltas, errors) without a GPU. The GPU
// tests run PyTorch's own capture and torch.compile on top of these hooks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include "streamalloc/sim_backend.hpp"
#include "torch_allocator.hpp"

namespace streamalloc::torch {
namespace {

using c10::cuda::CUDACachingAllocator::AllocatorState;
using c10::cuda::CUDACachingAllocator::CheckpointDelta;
using c10::cuda::CUDACachingAllocator::SnapshotInfo;

// PyTorch's numbering: a graph's own pool is (n, 0), graph_pool_handle() and MemPool give (0, n).
const c10::MempoolId_t kGraphPool{1, 0};
const c10::MempoolId_t kUserPool{0, 7};
const c10::MempoolId_t kDefaultPool{0, 0};

class TorchPools : public ::testing::Test {
 protected:
  void SetUp() override {
    allocator_ = std::make_shared<TorchAllocator>(Options::parse("backend:sim,sim_devices:2"));
    TorchAllocator::set_current(allocator_.get());  // where the DataPtrs' deleter frees
    allocator_->init(2);
    sim_ = dynamic_cast<SimBackend*>(&core().backend());
    ASSERT_NE(sim_, nullptr);
    capture_ = sim_->create_stream(0);
    other_ = sim_->create_stream(0);
  }
  void TearDown() override { TorchAllocator::set_current(nullptr); }

  TorchAllocator& a() { return *allocator_; }
  Allocator& core() { return *allocator_->core(); }

  // As CUDAGraph::capture_begin's filter: the capturing stream only.
  static std::function<bool(cudaStream_t)> only(Stream stream) {
    return [stream](cudaStream_t s) { return reinterpret_cast<Stream>(s) == stream; };
  }
  // As use_mem_pool's and cudagraph trees' filter (the current thread): every stream here.
  static std::function<bool(cudaStream_t)> any_stream() {
    return [](cudaStream_t) { return true; };
  }

  // The pool that owns the segment holding `ptr`, as PyTorch's snapshot reports it.
  static c10::MempoolId_t owner_of(const SnapshotInfo& snapshot, const void* ptr) {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    for (const auto& segment : snapshot.segments) {
      if (address >= static_cast<std::uintptr_t>(segment.address) &&
          address < static_cast<std::uintptr_t>(segment.address) + segment.total_size) {
        return segment.owner_private_pool_id;
      }
    }
    ADD_FAILURE() << ptr << " is in no segment of the snapshot";
    return {~0ull, ~0ull};
  }

  static std::size_t segments_of(const SnapshotInfo& snapshot, c10::MempoolId_t pool) {
    return static_cast<std::size_t>(std::count_if(snapshot.segments.begin(), snapshot.segments.end(),
                                                  [&](const auto& s) { return s.owner_private_pool_id == pool; }));
  }

  const PoolInfo* info(int device, c10::MempoolId_t pool) {
    pools_ = core().pools(device);
    for (const PoolInfo& p : pools_) {
      if (p.id.first == pool.first && p.id.second == pool.second) return &p;
    }
    return nullptr;
  }

  // A recording step of cudagraph trees: allocations on the current thread go to the pool
  // (_use_cuda_memory_pool_manager: begin, end, release).
  template <typename F>
  void in_pool(c10::MempoolId_t pool, F&& body) {
    a().beginAllocateToPool(0, pool, any_stream());
    body();
    a().endAllocateToPool(0, pool);
    a().releasePool(0, pool);
  }

  std::shared_ptr<TorchAllocator> allocator_;
  SimBackend* sim_ = nullptr;
  Stream capture_ = 0;
  Stream other_ = 0;
  std::vector<PoolInfo> pools_;
};

bool message_has(const c10::Error& error, const std::string& text) {
  return std::string(error.what()).find(text) != std::string::npos;
}

TEST_F(TorchPools, CaptureRoutesOnlyTheFilteredStreamToTheGraphsPool) {
  a().beginAllocateToPool(0, kGraphPool, only(capture_));  // capture_begin
  void* captured = core().allocate(64 * KiB, 0, capture_);
  void* elsewhere = core().allocate(64 * KiB, 0, other_);
  a().endAllocateToPool(0, kGraphPool);  // capture_end
  void* after = core().allocate(64 * KiB, 0, capture_);
  EXPECT_EQ(a().getPoolUseCount(0, kGraphPool), 1);

  const SnapshotInfo all = a().snapshot(kDefaultPool, false);
  EXPECT_EQ(owner_of(all, captured), kGraphPool);
  EXPECT_EQ(owner_of(all, elsewhere), kDefaultPool);
  EXPECT_EQ(owner_of(all, after), kDefaultPool);
  EXPECT_EQ(segments_of(all, kGraphPool), 1u);

  // MemPool.snapshot() / memory_snapshot(pool_id): that pool's segments only.
  const SnapshotInfo mine = a().snapshot(kGraphPool, false);
  ASSERT_EQ(mine.segments.size(), 1u);
  EXPECT_EQ(mine.segments[0].owner_private_pool_id, kGraphPool);
  EXPECT_EQ(owner_of(mine, captured), kGraphPool);
  EXPECT_TRUE(a().snapshot(kUserPool, false).segments.empty());

  // The graph is reset: its pool has no use left, and only then its free segments can go back.
  core().deallocate(captured);
  core().deallocate(elsewhere);
  const std::size_t default_segments = segments_of(a().snapshot(kDefaultPool, false), kDefaultPool);
  a().emptyCache(kGraphPool);
  EXPECT_EQ(a().snapshot(kGraphPool, false).segments.size(), 1u) << "a pool still in use kept its segment";
  a().releasePool(0, kGraphPool);  // reset
  EXPECT_EQ(a().getPoolUseCount(0, kGraphPool), 0);
  a().emptyCache(kGraphPool);
  EXPECT_TRUE(a().snapshot(kGraphPool, false).segments.empty());
  EXPECT_EQ(segments_of(a().snapshot(kDefaultPool, false), kDefaultPool), default_segments)
      << "emptying one pool's cache released default-pool segments";
  core().deallocate(after);
}

TEST_F(TorchPools, MemPoolUsesPairAsPyTorchPairsThem) {
  a().createOrIncrefPool(0, kUserPool, nullptr);  // MemPool(use_on_oom=True, no_split=True)
  a().setUseOnOOM(0, kUserPool, true);
  a().setNoSplit(0, kUserPool);
  ASSERT_NE(info(0, kUserPool), nullptr);
  EXPECT_TRUE(info(0, kUserPool)->use_on_oom);
  EXPECT_TRUE(info(0, kUserPool)->no_split);
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 1);

  a().beginAllocateToPool(0, kUserPool, any_stream());  // use_mem_pool(pool)
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 2);
  EXPECT_TRUE(info(0, kUserPool)->routed);
  EXPECT_THROW(a().beginAllocateToPool(0, kUserPool, any_stream()), c10::Error);
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 2) << "a refused route changed the use count";
  void* x = core().allocate(4 * KiB, 0, capture_);
  a().endAllocateToPool(0, kUserPool);
  a().releasePool(0, kUserPool);
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 1);
  EXPECT_THROW(a().endAllocateToPool(0, kUserPool), c10::Error);  // no route open
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 1);
  EXPECT_TRUE(a().checkPoolLiveAllocations(0, kUserPool, {x}));

  core().deallocate(x);
  a().setUseOnOOM(0, kUserPool, false);  // ~MemPool
  a().releasePool(0, kUserPool);
  a().emptyCache(kUserPool);
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 0);
  EXPECT_TRUE(a().snapshot(kUserPool, false).segments.empty());
  EXPECT_THROW(a().releasePool(0, kUserPool), c10::Error);  // a release without a use
}

// MemPool(allocator=...): the pool is created as any MemPool, and its segments will come from that
// allocator (reserving one needs a device: tests/python/test_gpu_mempool_allocator.py covers it).
TEST_F(TorchPools, MemPoolWithAnAllocatorOfItsOwnIsCreatedAsAnyMemPool) {
  auto foreign = std::make_shared<TorchAllocator>(Options::parse("backend:sim"));
  a().createOrIncrefPool(0, kUserPool, foreign);
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 1);
  ASSERT_NE(info(0, kUserPool), nullptr);
  EXPECT_EQ(info(0, kUserPool)->segments, 0u) << "nothing is reserved before the pool serves an allocation";
  a().releasePool(0, kUserPool);
  a().emptyCache(kUserPool);
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 0);

  a().createOrIncrefPool(0, kUserPool, allocator_);  // this allocator itself: an ordinary MemPool
  EXPECT_EQ(a().getPoolUseCount(0, kUserPool), 1);
  a().releasePool(0, kUserPool);
}

// cudagraph trees: record a graph, checkpoint the pool, move on along another branch, then restore.
TEST_F(TorchPools, CheckpointRestoreHandsBackEveryLiveBlockWithTheAllocatorsDeleter) {
  a().beginAllocateToPool(0, kGraphPool, only(capture_));  // the recording's capture holds a use
  void* output = core().allocate(4 * KiB, 0, capture_);
  void* scratch = core().allocate(4 * KiB, 0, capture_);
  core().deallocate(scratch);
  a().endAllocateToPool(0, kGraphPool);
  const std::shared_ptr<AllocatorState> state = a().getCheckpointState(0, kGraphPool);
  ASSERT_NE(state, nullptr);

  void* next = nullptr;
  in_pool(kGraphPool, [&] { next = core().allocate(8 * KiB, 0, capture_); });
  core().deallocate(output);
  EXPECT_TRUE(a().checkPoolLiveAllocations(0, kGraphPool, {next}));
  EXPECT_FALSE(a().checkPoolLiveAllocations(0, kGraphPool, {output}));
  EXPECT_FALSE(a().checkPoolLiveAllocations(0, kGraphPool, {}));

  CheckpointDelta delta = a().setCheckpointPoolState(0, state);
  EXPECT_EQ(delta.ptrs_freed, std::vector<void*>{next});
  ASSERT_EQ(delta.dataptrs_allocd.size(), 1u);
  const c10::DataPtr& revived = delta.dataptrs_allocd[0];
  EXPECT_EQ(revived.get(), output);
  EXPECT_EQ(revived.get_context(), output);
  // PyTorch's _has_Standard_Deleter and _free_And_Remove_DeleterFn compare with raw_deleter().
  EXPECT_EQ(revived.get_deleter(), a().raw_deleter());
  EXPECT_EQ(revived.device(), c10::Device(c10::DeviceType::CUDA, 0));
  EXPECT_TRUE(a().checkPoolLiveAllocations(0, kGraphPool, {output}));
  EXPECT_EQ(core().requested_size_of(output), 4 * KiB);

  delta.dataptrs_allocd.clear();  // the storage that took the DataPtr dies: its deleter frees the block
  EXPECT_TRUE(a().checkPoolLiveAllocations(0, kGraphPool, {}));
  EXPECT_EQ(core().device_of(output), -1);
  a().releasePool(0, kGraphPool);
}

TEST_F(TorchPools, RestoreRefusesWhatItCannotRestoreBeforeAnythingChanges) {
  a().createOrIncrefPool(0, kGraphPool);
  void* first = nullptr;
  in_pool(kGraphPool, [&] { first = core().allocate(4 * KiB, 0, capture_); });
  const std::shared_ptr<AllocatorState> state = a().getCheckpointState(0, kGraphPool);
  void* second = nullptr;
  in_pool(kGraphPool, [&] { second = core().allocate(4 * KiB, 0, capture_); });
  const std::unordered_set<void*> live{first, second};

  try {
    a().setCheckpointPoolState(0, std::make_shared<AllocatorState>());  // another allocator's state
    ADD_FAILURE() << "a foreign state was restored";
  } catch (const c10::Error& error) {
    EXPECT_TRUE(message_has(error, "getCheckpointState")) << error.what();
  }
  EXPECT_THROW(a().setCheckpointPoolState(0, nullptr), c10::Error);
  EXPECT_THROW(a().setCheckpointPoolState(1, state), c10::Error);  // taken on device 0
  sim_->set_capturing(0, capture_, true);
  EXPECT_THROW(a().setCheckpointPoolState(0, state), c10::Error);  // the core's refusal, as a c10 error
  sim_->set_capturing(0, capture_, false);
  EXPECT_TRUE(a().checkPoolLiveAllocations(0, kGraphPool, live)) << "a refused restore changed the pool";
  EXPECT_THROW(a().getCheckpointState(0, kUserPool), c10::Error);  // no such pool

  core().deallocate(first);
  core().deallocate(second);
  a().releasePool(0, kGraphPool);
}

}  // namespace
}  // namespace streamalloc::torch

// ShardSet on its own (shard_set.hpp): shards are created once per stream, published for the lock-free
// fast path, locked by the device-locked call and released together; a stream of another device is
// refused with nothing added; the index of shard blocks finds live blocks only.
#include <gtest/gtest.h>

#include <mutex>

#include "shard_set.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

// The device lock of one call, as DeviceCache::DeviceLock takes and releases it.
class Call {
 public:
  explicit Call(ShardSet& set) : set_(set), lock_(set.device_mutex()) { set_.note_device_lock_taken(); }
  ~Call() { set_.note_device_lock_released(); }

 private:
  ShardSet& set_;
  std::unique_lock<std::mutex> lock_;
};

// One allocated 512-byte block of `stream` at 0x200000, alone in its segment.
struct AllocatedBlock {
  explicit AllocatedBlock(Stream stream) {
    block.segment = &segment;
    segment.head = &block;
    block.address = 0x200000;
    block.size = 512;
    block.stream = stream;
    block.state = BlockState::kAllocated;
  }
  Segment segment;
  Block block;
};

SimBackend::Config two_devices() {
  SimBackend::Config config;
  config.device_count = 2;
  return config;
}

TEST(ShardSet, AStreamGetsOneShardPublishedAndLockedForTheCall) {
  SimBackend sim(two_devices());
  ShardSet set(sim, 0);
  const Stream s = sim.create_stream(0);
  EXPECT_EQ(set.find_published(s), nullptr);
  Shard* first = nullptr;
  {
    Call call(set);
    first = &set.get(s);
    EXPECT_TRUE(first->locked_by_device);
    EXPECT_EQ(&set.get(s), first) << "one shard per stream";
  }
  EXPECT_FALSE(first->locked_by_device) << "the call's end releases its shard locks";
  EXPECT_EQ(set.find_published(s), first);
  EXPECT_EQ(set.find(s), first);
  int shards = 0;
  for (const auto& [stream, shard] : set) shards += stream == s ? 1 : 0;
  EXPECT_EQ(shards, 1);
}

TEST(ShardSet, AStreamOfAnotherDeviceIsRefusedAndNothingIsAdded) {
  SimBackend sim(two_devices());
  ShardSet set(sim, 0);
  const Stream other = sim.create_stream(1);
  Call call(set);
  EXPECT_THROW(set.get(other), Error);
  EXPECT_EQ(set.find(other), nullptr);
  EXPECT_EQ(set.find_published(other), nullptr);
}

TEST(ShardSet, TheIndexOfShardBlocksFindsLiveBlocksOnly) {
  SimBackend sim;
  ShardSet set(sim, 0);
  const Stream s = sim.create_stream(0);
  AllocatedBlock allocated(s);
  Block& block = allocated.block;
  Call call(set);
  Shard& shard = set.get(s);
  shard.live.insert(block.address, &block);
  set.enter(&block);
  EXPECT_TRUE(block.in_shard);
  EXPECT_EQ(set.indexed(block.address), &block);
  EXPECT_EQ(set.find_live(block.address), &block);
  EXPECT_EQ(set.live_count(), 1u);
  block.state = BlockState::kFree;  // hot: in the shard, not live
  EXPECT_EQ(set.find_live(block.address), nullptr);
  set.leave(&block);
  shard.live.erase(block.address);
  EXPECT_FALSE(block.in_shard);
  EXPECT_EQ(set.indexed_count(), 0u);
  EXPECT_EQ(set.find_live(block.address), nullptr);
}

}  // namespace
}  // namespace streamalloc

namespace streamalloc {
namespace {

// The ledger's donors, in stream order, locked as each is asked: every shard gives all it has, the
// device what it lacks and the shared headroom the rest.
TEST(ShardSet, GatherHeadroomTakesAllFromEveryShardAndSharesWhatTheDeviceDoesNotNeed) {
  SimBackend sim;
  ShardSet set(sim, 0);
  const Stream idle = sim.create_stream(0);
  const Stream busy = sim.create_stream(0);
  Call call(set);
  ASSERT_LT(idle, busy) << "asked in stream order";
  AllocatedBlock allocated(busy);
  Block& block = allocated.block;
  set.get(busy).live.insert(block.address, &block);
  for (Stream s : {idle, busy}) set.get(s).stats.headroom[kAllocation][0] = 5;
  SharedHeadroom shared;
  std::int64_t device = 0;
  set.gather_headroom(kAllocation, 0, 3, device, shared, nullptr);
  EXPECT_EQ(device, 3);
  EXPECT_EQ(shared.held(kAllocation, 0), 7);
  EXPECT_EQ(set.get(idle).stats.headroom[kAllocation][0], 0);
  EXPECT_EQ(set.get(busy).stats.headroom[kAllocation][0], 0);
  EXPECT_EQ(set.get(busy).counts.headroom_given, 1);
  set.gather_headroom(kAllocation, 0, 20, device, shared, nullptr);
  EXPECT_EQ(device, 3) << "nothing left to give";
  set.get(busy).live.erase(block.address);
}

}  // namespace
}  // namespace streamalloc

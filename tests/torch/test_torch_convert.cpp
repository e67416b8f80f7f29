// The plugin's translation of streamalloc's stats into c10's DeviceStats, which torch.cuda.memory_stats()
// turns into its keys (one key set, whatever the allocator: PyTorch builds the dict from the struct). Every
// field must carry streamalloc's number, none a default zero. Needs LibTorch, not a GPU.
#include <gtest/gtest.h>

#include <cstdint>

#include "torch_convert.hpp"

namespace streamalloc::torch {
namespace {

// Distinct values everywhere, so that a field copied from the wrong place, or not at all, shows.
class Numbers {
 public:
  void fill(Stat& stat) {
    stat.current = next();
    stat.peak = next();
    stat.allocated = next();
    stat.freed = next();
  }
  void fill(StatArray& stats) {
    for (Stat& stat : stats) fill(stat);
  }
  std::int64_t next() { return ++value_ * 7; }

 private:
  std::int64_t value_ = 0;
};

void expect_same(const Stat& ours, const c10::CachingAllocator::Stat& theirs, const char* what) {
  EXPECT_EQ(theirs.current, ours.current) << what;
  EXPECT_EQ(theirs.peak, ours.peak) << what;
  EXPECT_EQ(theirs.allocated, ours.allocated) << what;
  EXPECT_EQ(theirs.freed, ours.freed) << what;
}

void expect_same(const StatArray& ours, const c10::CachingAllocator::StatArray& theirs, const char* what) {
  for (std::size_t pool = 0; pool < ours.size(); ++pool) expect_same(ours[pool], theirs[pool], what);
}

TEST(TorchConvert, EveryDeviceStatsFieldCarriesStreamallocsNumber) {
  DeviceStats ours;
  Numbers n;
  for (StatArray* stats :
       {&ours.allocation, &ours.segment, &ours.active, &ours.inactive_split, &ours.allocated_bytes,
        &ours.reserved_bytes, &ours.active_bytes, &ours.inactive_split_bytes, &ours.requested_bytes}) {
    n.fill(*stats);
  }
  n.fill(ours.oversize_allocations);
  n.fill(ours.oversize_segments);
  ours.num_alloc_retries = n.next();
  ours.num_ooms = n.next();
  ours.num_sync_all_streams = n.next();
  ours.num_device_alloc = n.next();
  ours.num_device_free = n.next();
  ours.max_split_size = -1;  // unlimited, PyTorch's convention

  const c10::CachingDeviceAllocator::DeviceStats theirs = to_torch_stats(ours);
  // c10's fields by name, one by one (the conversion itself is generated from streamalloc's lists).
  expect_same(ours.allocation, theirs.allocation, "allocation");
  expect_same(ours.segment, theirs.segment, "segment");
  expect_same(ours.active, theirs.active, "active");
  expect_same(ours.inactive_split, theirs.inactive_split, "inactive_split");
  expect_same(ours.allocated_bytes, theirs.allocated_bytes, "allocated_bytes");
  expect_same(ours.reserved_bytes, theirs.reserved_bytes, "reserved_bytes");
  expect_same(ours.active_bytes, theirs.active_bytes, "active_bytes");
  expect_same(ours.inactive_split_bytes, theirs.inactive_split_bytes, "inactive_split_bytes");
  expect_same(ours.requested_bytes, theirs.requested_bytes, "requested_bytes");
  expect_same(ours.oversize_allocations, theirs.oversize_allocations, "oversize_allocations");
  expect_same(ours.oversize_segments, theirs.oversize_segments, "oversize_segments");
  EXPECT_EQ(theirs.num_alloc_retries, ours.num_alloc_retries);
  EXPECT_EQ(theirs.num_ooms, ours.num_ooms);
  EXPECT_EQ(theirs.num_sync_all_streams, ours.num_sync_all_streams);
  EXPECT_EQ(theirs.num_device_alloc, ours.num_device_alloc);
  EXPECT_EQ(theirs.num_device_free, ours.num_device_free);
  EXPECT_EQ(theirs.max_split_size, -1);
}

}  // namespace
}  // namespace streamalloc::torch

namespace streamalloc::torch {
namespace {

// An expandable segment is marked as PyTorch marks its own (is_expandable), fixed ones are not, and the
// configuration says which the allocator runs with.
TEST(TorchConvert, SnapshotMarksExpandableSegments) {
  SegmentInfo fixed;
  fixed.address = 0x100000;
  fixed.total_size = 2 * MiB;
  fixed.blocks.push_back(BlockInfo{});
  fixed.blocks.back().size = 2 * MiB;
  SegmentInfo expandable = fixed;
  expandable.address = 0x10000000;
  expandable.expandable = true;
  expandable.reserved_address_bytes = 64 * MiB;
  const Options options = Options::parse("expandable_segments:true");
  const auto snapshot = to_torch_snapshot({fixed, expandable}, 1, options);
  ASSERT_EQ(snapshot.segments.size(), 2u);
  EXPECT_FALSE(snapshot.segments[0].is_expandable);
  EXPECT_TRUE(snapshot.segments[1].is_expandable);
  EXPECT_EQ(snapshot.segments[1].total_size, 2 * MiB);
  EXPECT_TRUE(snapshot.config_metadata.expandable_segments);
  EXPECT_FALSE(to_torch_snapshot({fixed}, 1, Options{}).config_metadata.expandable_segments);
}

}  // namespace
}  // namespace streamalloc::torch

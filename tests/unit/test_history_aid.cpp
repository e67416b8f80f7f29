// The allocation history as a debugging aid (history_aid.cpp, debug_aid.hpp): it comes and goes with
// its sink, runs after the aids the options turn on, and turns the hooks it hears into trace entries.
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "debug_aid.hpp"
#include "memory_pool.hpp"

namespace streamalloc {
namespace {

struct Collect : TraceSink {
  std::vector<TraceEntry> entries;
  void record(TraceEntry&& entry, bool /*caller_context*/) override { entries.push_back(std::move(entry)); }
};

// An aid that notes the order in which aids hear of an allocation.
struct Order : DebugAid {
  explicit Order(std::vector<int>* seen, Collect* sink) : seen_(seen), sink_(sink) {}
  void on_allocate(Block& /*block*/) override { seen_->push_back(static_cast<int>(sink_->entries.size())); }
  std::vector<int>* seen_;
  Collect* sink_;
};

TEST(HistoryAid, ComesAndGoesWithItsSinkAndRecordsAfterTheOtherAids) {
  Collect sink;
  std::vector<int> seen;
  std::vector<std::unique_ptr<DebugAid>> list;
  list.push_back(std::make_unique<Order>(&seen, &sink));
  DebugAids aids(std::move(list));
  EXPECT_FALSE(aids.empty());
  EXPECT_TRUE(aids.beyond_history());

  MemoryPool pool(PoolId{}, CrossStreamReuse::kSettled);
  Segment segment;
  segment.owner = &pool;
  Block block;
  block.segment = &segment;
  segment.head = &block;
  block.address = 0x400000;
  block.size = 4096;
  block.stream = 0x10;

  aids.set_history(make_history_aid(3, sink));
  aids.on_allocate(block);
  ASSERT_EQ(sink.entries.size(), 1u);
  EXPECT_EQ(seen, std::vector<int>{0}) << "the other aid heard of it before the history recorded it";
  EXPECT_EQ(sink.entries[0].action, TraceAction::kAlloc);
  EXPECT_EQ(sink.entries[0].device, 3);
  EXPECT_EQ(sink.entries[0].address, block.address);
  aids.on_snapshot(4096);
  aids.on_out_of_memory_request(1 << 20, 8192, 0x10, PoolId{});
  ASSERT_EQ(sink.entries.size(), 3u);
  EXPECT_EQ(sink.entries[1].action, TraceAction::kSnapshot);
  EXPECT_EQ(sink.entries[2].action, TraceAction::kOom);

  aids.set_history(nullptr);
  aids.on_allocate(block);
  EXPECT_EQ(sink.entries.size(), 3u) << "no history, nothing recorded";
  EXPECT_FALSE(aids.empty()) << "the other aid stays";
}

TEST(HistoryAid, AloneItIsNotBeyondHistory) {
  Collect sink;
  DebugAids aids({});
  EXPECT_TRUE(aids.empty());
  aids.set_history(make_history_aid(0, sink));
  EXPECT_FALSE(aids.empty());
  EXPECT_FALSE(aids.beyond_history()) << "the history alone leaves the release path as it is";
  aids.set_history(make_history_aid(0, sink));
  aids.set_history(nullptr);
  EXPECT_TRUE(aids.empty()) << "a replaced history leaves nothing behind";
}

}  // namespace
}  // namespace streamalloc

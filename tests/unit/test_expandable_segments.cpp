// ExpandableSegments on its own (expandable_segments.hpp), over the parts of a cache
// (tests/support/cache_parts.hpp): on only where the option is and the device maps virtual memory; one
// growing segment per (stream, size class), forgotten when released; a growth extends the stream's free
// last block by what it lacks, and a trim gives whole pieces back. SegmentPieces finds the pieces that
// hold a range's bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "cache_parts.hpp"
#include "expandable_segments.hpp"
#include "segment_pieces.hpp"
#include "segment_source.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

using test::CacheParts;
using test::DeviceCall;

struct ExpandableParts : CacheParts {
  explicit ExpandableParts(SimBackend::Config config = SimBackend::Config{})
      : CacheParts(config, Options{}), segments(sim, 0), device_total(sim.memory_info(0).total_bytes) {}
  ExpandableSegments::Parts parts() {
    return ExpandableSegments::Parts{segments, pool, shards, ledger, free, aids, options, device_total};
  }
  SegmentSource segments;
  std::atomic<std::size_t> device_total;
};

TEST(ExpandableSegments, OnOnlyWithTheOptionAndVirtualMemory) {
  ExpandableParts parts;
  ExpandableSegments off(parts.parts());
  off.set_up(false, parts.sim, 0);
  EXPECT_FALSE(off.on());
  EXPECT_FALSE(off.grows(parts.pool));
  ExpandableSegments on(parts.parts());
  on.set_up(true, parts.sim, 0);
  EXPECT_TRUE(on.on());
  EXPECT_TRUE(on.grows(parts.pool));
  MemoryPool other(PoolId{1, 1}, CrossStreamReuse::kSettled);
  EXPECT_FALSE(on.grows(other)) << "private pools keep fixed segments";
  EXPECT_EQ(on.page_bytes(), parts.sim.vm_granularity(0));
  SimBackend::Config config;
  config.virtual_memory = false;
  ExpandableParts fixed(config);
  ExpandableSegments without(fixed.parts());
  without.set_up(true, fixed.sim, 0);
  EXPECT_FALSE(without.on());
  EXPECT_EQ(without.page_bytes(), 0u);
}

TEST(ExpandableSegments, EachStreamAndSizeClassGrowsOneSegmentUntilItIsReleased) {
  ExpandableParts parts;
  ExpandableSegments segments(parts.parts());
  Segment small;
  Segment large;
  segments.set_growing(1, SizeClass::kSmall, &small);
  segments.set_growing(1, SizeClass::kLarge, &large);
  EXPECT_EQ(segments.growing(1, SizeClass::kSmall), &small);
  EXPECT_EQ(segments.growing(1, SizeClass::kLarge), &large);
  EXPECT_EQ(segments.growing(2, SizeClass::kSmall), nullptr);
  segments.forget(&small);
  EXPECT_EQ(segments.growing(1, SizeClass::kSmall), nullptr);
  EXPECT_EQ(segments.all_growing().size(), 1u);
}

TEST(ExpandableSegments, AGrowthExtendsTheFreeLastBlockAndATrimGivesTheSegmentBack) {
  ExpandableParts parts;
  ExpandableSegments expandable(parts.parts());
  expandable.set_up(true, parts.sim, 0);
  const std::size_t page = expandable.page_bytes();
  const Stream s = parts.sim.create_stream(0);
  DeviceCall call(parts.shards);
  bool no_address_space = false;
  EXPECT_EQ(expandable.grow(SizeClass::kLarge, 4 * page, s, page, &no_address_space), nullptr)
      << "past the memory cap nothing is mapped";
  EXPECT_EQ(parts.segments.reserved_bytes(), 0u);
  const std::size_t cap = parts.device_total;
  Block* first = expandable.grow(SizeClass::kLarge, 2 * page, s, cap, &no_address_space);
  ASSERT_NE(first, nullptr);
  EXPECT_FALSE(no_address_space);
  Segment* segment = expandable.growing(s, SizeClass::kLarge);
  ASSERT_EQ(first->segment, segment);
  EXPECT_EQ(first->size, 2 * page);
  EXPECT_TRUE(parts.pool.free.contains_settled(first)) << "fresh memory is settled, in the free lists";
  Block* grown = expandable.grow(SizeClass::kLarge, 3 * page, s, cap, &no_address_space);
  EXPECT_EQ(grown, first) << "the free last block grows by what it lacks";
  EXPECT_EQ(grown->size, 3 * page);
  EXPECT_EQ(segment->head->next, nullptr);
  EXPECT_EQ(parts.segments.reserved_bytes(), 3 * page);
  EXPECT_EQ(parts.ledger.stats().reserved_bytes[0].current, static_cast<std::int64_t>(3 * page));
  expandable.validate(segment, 0);
  EXPECT_EQ(expandable.trim(segment), 3 * page) << "one settled free block: the whole segment goes";
  EXPECT_EQ(expandable.growing(s, SizeClass::kLarge), nullptr);
  EXPECT_EQ(parts.segments.reserved_bytes(), 0u);
  EXPECT_EQ(parts.ledger.stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(parts.pool.free.settled_count(), 0u);
}

TEST(SegmentPieces, ThePiecesHoldingARangeInAddressOrder) {
  SegmentPieces pieces;
  for (std::uintptr_t at : {0x10000u, 0x12000u, 0x14000u, 0x18000u}) pieces.add(at, 0x2000);  // a hole at 0x16000
  std::vector<std::uintptr_t> seen;
  auto holding = [&](std::uintptr_t begin, std::uintptr_t end) {
    seen.clear();
    pieces.for_each_holding(begin, end, [&](std::uintptr_t address, std::size_t) { seen.push_back(address); });
    return seen;
  };
  EXPECT_EQ(holding(0x11000, 0x13000), (std::vector<std::uintptr_t>{0x10000, 0x12000})) << "straddling a boundary";
  EXPECT_EQ(holding(0x12000, 0x14000), (std::vector<std::uintptr_t>{0x12000})) << "exactly one piece";
  EXPECT_EQ(holding(0x12800, 0x12900), (std::vector<std::uintptr_t>{0x12000})) << "inside one piece";
  EXPECT_EQ(holding(0x10000, 0x1a000), (std::vector<std::uintptr_t>{0x10000, 0x12000, 0x14000, 0x18000}));
  EXPECT_TRUE(holding(0x16000, 0x18000).empty()) << "the hole";
  EXPECT_TRUE(holding(0x1a000, 0x1b000).empty()) << "past the end";
}

}  // namespace
}  // namespace streamalloc

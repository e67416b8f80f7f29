// Expandable segments (docs/design.md, "Expandable segments", "Packing"), the stream rules and packing
// on blocks inside a growing segment: pending blocks wait for their fences, settled blocks serve other
// streams, and a carving fit prefers this stream's holes to another stream's growing end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "expandable_support.hpp"
#include "fault_backend.hpp"
#include "sim_fixture.hpp"
#include "streamalloc/report.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc::testing {
namespace {

TEST(Expandable, PendingBlockIsNeitherReusedNorUnmappedBeforeItsFence) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);  // the end of a's segment
  // The consumer stream writes p when it runs: on unmapped pages that write would fault.
  s.sim->enqueue(0, u, [p] { std::memset(p, 0x5a, 3 * MiB); });
  s.a().record_stream(p, u);
  s.a().deallocate(p, 0, 0, a);
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  check(s);
  void* q = s.a().allocate(3 * MiB, 0, a);
  EXPECT_NE(q, p) << "handed out while the consumer stream had not passed its fence";
  EXPECT_EQ(addr(q), addr(p) + 3 * MiB) << "the segment grew past the pending block";
  check(s);
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  EXPECT_TRUE(s.sim->accessible(0, p, 3 * MiB));
  // empty_cache waits for the consumer (its write runs on mapped pages) and only then unmaps.
  s.a().deallocate(q, 0, 0, a);
  s.a().empty_cache();
  EXPECT_EQ(s.sim->queued_items(0, u), 0u) << "the consumer ran before the pages went";
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
  EXPECT_FALSE(s.sim->accessible(0, p, 3 * MiB));
}

TEST(Expandable, SettledBlockOfOneStreamServesAnotherWithoutGrowing) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(6 * MiB, 0, a);
  void* keep = s.a().allocate(1 * MiB + 512, 0, a);  // p is not the free end
  s.a().deallocate(p, 0, 0, a);
  s.a().process_fences();  // closes a's batch
  s.sim->synchronize_stream(0, a);
  s.a().process_fences();  // its fence completed: p is settled
  const DeviceStats before = s.stats();
  void* q = s.a().allocate(6 * MiB, 0, b);
  EXPECT_EQ(q, p);
  check(s);
  const DeviceStats after = s.stats();
  EXPECT_EQ(after.cross_stream_reuse_settled, before.cross_stream_reuse_settled + 1);
  EXPECT_EQ(after.num_device_alloc, before.num_device_alloc) << "no new mapping";
  s.a().deallocate(q, 0, 0, b);
  s.a().deallocate(keep, 0, 0, a);
  check(s);
}

// Packing: a best fit that would carve a larger block while blocks are pending polls the fences first
// (no event recorded), so a pending block of the exact size whose consumer has passed its fence comes
// back, and the larger block stays whole for the sizes that need it. The per-tick poll has just run (the
// small allocation), so only this policy can see that the fence completed.
TEST(Expandable, ACompletedPendingBlockOfTheSizeIsTakenBeforeALargerBlockIsCarved) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  void* p = s.a().allocate(4 * MiB, 0, a);
  void* between = s.a().allocate(2 * MiB, 0, a);
  void* larger = s.a().allocate(8 * MiB, 0, a);
  void* end = s.a().allocate(2 * MiB, 0, a);  // so that the larger block is not the free end
  s.a().deallocate(larger, 0, 0, a);
  s.a().record_stream(p, u);
  s.a().deallocate(p, 0, 0, a);
  s.a().process_fences();                    // u's batch is fenced; u has not run
  void* small = s.a().allocate(4096, 0, a);  // polls, at most once per tick: the fence is still in flight
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  s.sim->synchronize_stream(0, u);  // the consumer passes its fence; the cache has not looked since
  const std::uint64_t records = s.sim->counters().event_records;
  const std::int64_t maps = s.stats().num_device_alloc;
  void* q = s.a().allocate(4 * MiB, 0, a);
  EXPECT_EQ(q, p) << "the larger free block was carved while the block of the size was reusable";
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  EXPECT_EQ(s.sim->counters().event_records, records) << "the poll records no fence";
  EXPECT_EQ(s.stats().num_device_alloc, maps);
  check(s);
  void* r = s.a().allocate(8 * MiB, 0, a);
  EXPECT_EQ(r, larger) << "the larger block stayed whole";
  EXPECT_EQ(s.stats().num_device_alloc, maps) << "no growth";
  check(s);
  for (void* ptr : {q, between, r, end, small}) s.a().deallocate(ptr, 0, 0, a);
  check(s);
}

// Packing: blocks kept in a stream's hot list are left out of the best fit, so in an expandable
// segment, where one segment holds all of a stream's small blocks, a small size the list cannot serve
// flushes it first (as the large class always does): the hot neighbours merge into a block of the
// size, and the best fit takes it instead of carving a larger free block.
TEST(Expandable, ASmallSizeTheHotListCannotServeSeesTheHotBlocksMerged) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  std::vector<void*> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(s.a().allocate(512 * KiB, 0, a));   // the first page
  void* halves[2] = {s.a().allocate(1 * MiB, 0, a), s.a().allocate(1 * MiB, 0, a)};  // the second page
  s.a().deallocate(halves[0], 0, 0, a);
  s.a().deallocate(halves[1], 0, 0, a);
  void* large = s.a().allocate(4 * MiB, 0, a);  // a large-pool miss flushes: the second page is one free block
  s.a().deallocate(quarters[0], 0, 0, a);       // both kept in a's hot list, unmerged
  s.a().deallocate(quarters[1], 0, 0, a);
  const std::int64_t maps = s.stats().num_device_alloc;
  void* p = s.a().allocate(1 * MiB, 0, a);
  EXPECT_EQ(p, quarters[0]) << "the free page was carved while the hot neighbours make a block of the size";
  EXPECT_EQ(s.stats().num_device_alloc, maps);
  check(s);
  void* q = s.a().allocate(1 * MiB, 0, a);
  EXPECT_EQ(q, halves[0]);
  for (void* ptr : {p, q, quarters[2], quarters[3], large}) s.a().deallocate(ptr, 0, 0, a);
  check(s);
}

// Packing: a large fit that would carve keeps off the free end of another stream's segment (where that
// stream grows next) and takes a hole this stream left, even a larger one; that end is still taken when
// nothing else fits, rather than growing.
TEST(Expandable, ACarvingFitTakesThisStreamsHoleBeforeAnotherStreamsGrowingEnd) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* hole = s.a().allocate(8 * MiB, 0, b);
  void* keep = s.a().allocate(2 * MiB, 0, b);  // so that the hole is not b's free end
  s.a().deallocate(hole, 0, 0, b);
  void* a_end = s.a().allocate(6 * MiB, 0, a);  // a's segment: this block alone, then its free end
  s.a().deallocate(a_end, 0, 0, a);
  s.a().process_fences();
  s.sim->synchronize_stream(0, a);
  s.sim->synchronize_stream(0, b);
  s.a().process_fences();  // both free blocks settled, out of the hot lists
  check(s);
  const std::int64_t maps = s.stats().num_device_alloc;
  void* p = s.a().allocate(5 * MiB, 0, b);
  EXPECT_EQ(p, hole) << "a's free end (the smaller fit) was carved while b's own hole fits";
  check(s);
  void* q = s.a().allocate(5 * MiB, 0, b);  // b's hole has 3 MiB left: only a's end fits
  EXPECT_EQ(q, a_end);
  EXPECT_EQ(s.stats().num_device_alloc, maps) << "no growth while a fit was free";
  check(s);
  for (void* ptr : {p, q, keep}) s.a().deallocate(ptr, 0, 0, b);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
}

// The free end of a's segment is owned by b (b took it settled and freed it): a's growth must not
// merge new pages into b's block, so the new pages are a block of their own.
TEST(Expandable, AnotherStreamsFreeEndIsNotGrownForThisStream) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  s.a().deallocate(p, 0, 0, a);
  s.a().process_fences();
  s.sim->synchronize_stream(0, a);
  s.a().process_fences();  // settled
  void* taken = s.a().allocate(3 * MiB, 0, b);
  ASSERT_EQ(taken, p);
  s.a().deallocate(taken, 0, 0, b);
  s.a().process_fences();  // out of b's hot list: the free end is owned by b until b's fence completes
  check(s);
  void* q = s.a().allocate(5 * MiB, 0, a);
  EXPECT_EQ(addr(q), addr(p) + 4 * MiB) << "after b's block, not merged into it";
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(10 * MiB));
  EXPECT_EQ(expandable_segments(s.a()).size(), 1u) << "b took no segment of its own";
  s.a().deallocate(q, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
}

}  // namespace
}  // namespace streamalloc::testing

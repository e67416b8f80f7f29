// Expandable segments (docs/design.md, "Expandable segments"), growth: each (stream, size class)
// grows its own segment in place, freed space is reused without new mappings, and a growth maps one
// physical allocation until half the cap, pieces after.
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

TEST(Expandable, SecondAllocationGrowsTheSegmentRightAfterTheFirst) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(4 * MiB)) << "two pages for 3 MiB";
  void* q = s.a().allocate(3 * MiB, 0, a);
  EXPECT_EQ(addr(q), addr(p) + 3 * MiB) << "the free end grew in place";
  check(s);
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.reserved_bytes[0].current, static_cast<std::int64_t>(6 * MiB)) << "one more page, not a new segment";
  EXPECT_EQ(st.segment[0].current, 1);
  EXPECT_EQ(st.num_device_alloc, 2) << "one map per growth";
  EXPECT_EQ(s.sim->counters().address_range_reserves, 1u);

  const std::vector<SegmentInfo> segments = expandable_segments(s.a());
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].address, addr(p));
  EXPECT_EQ(segments[0].total_size, 6 * MiB);
  EXPECT_EQ(segments[0].reserved_address_bytes, 256 * MiB) << "a large range maps the whole device";
  EXPECT_TRUE(segments[0].is_large);
  EXPECT_EQ(segments[0].stream, a);

  // Small requests grow a segment of their own size class.
  void* small = s.a().allocate(1000, 0, a);
  check(s);
  EXPECT_EQ(s.stats().segment[0].current, 2);
  EXPECT_EQ(s.stats().reserved_bytes[static_cast<int>(SizeClass::kSmall)].current, static_cast<std::int64_t>(kPage));
  for (void* ptr : {p, q, small}) s.a().deallocate(ptr, 0, 0, a);
  check(s);
}

TEST(Expandable, EachStreamGrowsItsOwnSegment) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  void* q = s.a().allocate(3 * MiB, 0, b);
  check(s);
  const std::vector<SegmentInfo> segments = expandable_segments(s.a());
  ASSERT_EQ(segments.size(), 2u);
  EXPECT_NE(segments[0].stream, segments[1].stream);
  // a's next allocation grows a's segment, not b's.
  void* r = s.a().allocate(3 * MiB, 0, a);
  EXPECT_EQ(addr(r), addr(p) + 3 * MiB);
  check(s);
  for (auto [ptr, stream] : {std::pair{p, a}, std::pair{q, b}, std::pair{r, a}}) s.a().deallocate(ptr, 0, 0, stream);
  check(s);
}

// The batch size that grows by a little: fixed segments strand the end of each old segment and reserve
// new ones; an expandable segment reuses the merged free space and maps only the difference.
TEST(Expandable, FreedSpaceOfOtherSizesIsReusedWithoutNewMappings) {
  auto run = [](const char* conf) {
    SimSetup s(conf);
    const Stream a = s.sim->create_stream();
    for (const std::vector<std::size_t>& round :
         {std::vector<std::size_t>{12, 24, 36, 48}, {11, 22, 33, 44}, {13, 26, 39, 52}}) {
      std::vector<void*> live;
      for (std::size_t mb : round) {
        live.push_back(s.a().allocate(mb * MiB, 0, a));
        s.a().validate();
      }
      for (void* p : live) s.a().deallocate(p, 0, 0, a);
      s.a().validate();
    }
    return s.stats().reserved_bytes[0].current;
  };
  const std::int64_t fixed = run("");
  const std::int64_t expandable = run(kOn);
  EXPECT_EQ(expandable, static_cast<std::int64_t>(130 * MiB)) << "the largest round, to the page";
  EXPECT_GT(fixed, expandable);

  // Many sizes, freed and asked for again in another order: no new mapping at all.
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  std::mt19937 random(7);
  std::vector<std::size_t> sizes;
  for (int i = 0; i < 60; ++i) sizes.push_back(512 + random() % (4 * MiB));
  std::vector<void*> live;
  for (std::size_t size : sizes) live.push_back(s.a().allocate(size, 0, a));
  check(s);
  for (void* p : live) s.a().deallocate(p, 0, 0, a);
  const DeviceStats before = s.stats();
  std::shuffle(sizes.begin(), sizes.end(), random);
  live.clear();
  for (std::size_t size : sizes) live.push_back(s.a().allocate(size, 0, a));
  check(s);
  EXPECT_EQ(s.stats().num_device_alloc, before.num_device_alloc) << "the same sizes fit the pages already mapped";
  EXPECT_EQ(s.stats().reserved_bytes[0].current, before.reserved_bytes[0].current);
  for (void* p : live) s.a().deallocate(p, 0, 0, a);
  check(s);
}

// A growth is one physical allocation while the mapped bytes stay within half of the memory cap; past
// that, pieces of up to 20 MiB in the large class (PyTorch's kLargeBuffer handles), the last one what
// remains, which the OOM path can give back one by one. Either way the mapped end stays within a page
// of the need.
TEST(Expandable, AGrowthIsOnePhysicalAllocationUntilHalfTheCapThen20MiBPieces) {
  SimSetup s(kOn, SimBackend::Mode::kManual, 1 * GiB);
  s.a().set_memory_fraction(0.5, 0);  // a cap of 512 MiB: growths past 256 MiB mapped come in pieces
  const Stream a = s.sim->create_stream();
  std::vector<void*> live;
  std::uintptr_t end = 0;  // of the last block: each request below is whole pages but the last
  for (std::size_t request :
       {2 * MiB, 4 * MiB, 18 * MiB, 20 * MiB, 22 * MiB, 46 * MiB, 100 * MiB, 200 * MiB, 7 * MiB + 4096}) {
    const std::size_t creates = s.sim->counters().physical_allocations_created;
    const std::size_t mapped = s.sim->mapped_bytes(0);
    const std::int64_t device_allocs = s.stats().num_device_alloc;
    void* p = s.a().allocate(request, 0, a);
    if (end != 0) {
      EXPECT_EQ(addr(p), end) << "grew in place";
    }
    end = addr(p) + request;
    live.push_back(p);
    check(s);
    const std::size_t grown = s.sim->mapped_bytes(0) - mapped;
    EXPECT_EQ(grown, (request + kPage - 1) / kPage * kPage) << request << " bytes: mapped to the page, no more";
    const bool near_cap = mapped + grown > 256 * MiB;
    EXPECT_EQ(s.sim->counters().physical_allocations_created - creates,
              near_cap ? (grown + 20 * MiB - 1) / (20 * MiB) : 1u)
        << request << " bytes: one create, or one per 20 MiB past half the cap; never one per page";
    EXPECT_EQ(s.stats().num_device_alloc, device_allocs + 1) << "one growth, however many pieces";
  }
  // 2 .. 100 MiB one each (212 MiB mapped), then 200 MiB in 10 pieces and the last growth in one.
  EXPECT_EQ(s.sim->mappings(0), 7u + 10 + 1) << "not 210 of 2 MiB";
  // Reused, not grown: no create at all.
  for (void* p : live) s.a().deallocate(p, 0, 0, a);
  const std::uint64_t creates = s.sim->counters().physical_allocations_created;
  void* big = s.a().allocate(400 * MiB, 0, a);
  EXPECT_EQ(s.sim->counters().physical_allocations_created, creates);
  check(s);
  s.a().deallocate(big, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.sim->mappings(0), 0u);
  EXPECT_EQ(s.sim->counters().physical_allocations_released, s.sim->counters().physical_allocations_created);

  // The small class maps a page at a time.
  void* small = s.a().allocate(1000, 0, a);
  EXPECT_EQ(s.sim->mappings(0), 1u);
  EXPECT_EQ(s.sim->mapped_bytes(0), kPage);
  s.a().deallocate(small, 0, 0, a);
  check(s);
}

TEST(Expandable, ABlockAloneInItsSegmentBecomesSplitAndWholeAgain) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(2 * MiB, 0, a);  // exactly one page: the whole segment
  void* q = s.a().allocate(2 * MiB, 0, a);  // appended after the live p
  check(s);
  s.a().deallocate(q, 0, 0, a);
  s.a().empty_cache();  // q's page goes: p is whole again, and live
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(2 * MiB));
  s.a().deallocate(p, 0, 0, a);  // freed by the fast path, whole: no inactive split
  EXPECT_EQ(s.stats().inactive_split[0].current, 0);
  check(s);
  void* again = s.a().allocate(2 * MiB, 0, a);  // from the hot list
  EXPECT_EQ(again, p);
  void* r = s.a().allocate(4 * MiB, 0, a);  // appended: p is split again
  check(s);
  s.a().deallocate(again, 0, 0, a);  // hot, and split: an inactive split
  EXPECT_EQ(s.stats().inactive_split[0].current, 1);
  check(s);
  s.a().deallocate(r, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(s.stats().inactive_split[0].current, 0);
}

}  // namespace
}  // namespace streamalloc::testing

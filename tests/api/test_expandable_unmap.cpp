// Expandable segments (docs/design.md, "Expandable segments"), giving memory back: empty_cache() and
// the memory cap unmap whole free pieces only, wherever they are, and the pages serve other streams.
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

TEST(Expandable, EmptyCacheUnmapsTheFreePagesAtTheEnd) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  void* q = s.a().allocate(3 * MiB, 0, a);
  void* r = s.a().allocate(3 * MiB, 0, a);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(10 * MiB));
  s.a().deallocate(r, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(6 * MiB)) << "r's pages went back";
  EXPECT_FALSE(s.sim->accessible(0, r, 3 * MiB));
  EXPECT_EQ(s.stats().num_device_free, 1);

  s.a().deallocate(q, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(4 * MiB))
      << "the page q shares with p stays";
  EXPECT_TRUE(s.sim->accessible(0, p, 3 * MiB));

  // Growing again maps the end again, at the same addresses.
  void* again = s.a().allocate(6 * MiB, 0, a);
  EXPECT_EQ(again, q);
  check(s);
  s.a().deallocate(again, 0, 0, a);
  s.a().deallocate(p, 0, 0, a);
  s.a().empty_cache();
  check(s);
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.reserved_bytes[0].current, 0);
  EXPECT_EQ(st.segment[0].current, 0) << "a segment with nothing mapped gives its range back";
  EXPECT_EQ(s.sim->mapped_bytes(0), 0u);
  EXPECT_EQ(s.sim->counters().address_range_releases, s.sim->counters().address_range_reserves);
  EXPECT_TRUE(s.a().segments(0).empty());

  // The stream starts a new segment afterwards.
  void* fresh = s.a().allocate(3 * MiB, 0, a);
  check(s);
  EXPECT_EQ(s.stats().segment[0].current, 1);
  s.a().deallocate(fresh, 0, 0, a);
}

// A block that fills its segment is whole; growing past it makes it split, and unmapping what came
// after makes it whole again, while it is live, kept in its stream's hot list or free. The fast
// path's view of it and the inactive_split count follow (validate() checks both).
// Under cross_stream_reuse:never b may not take a's free block, but its pages: the OOM path unmaps
// them and b's segment maps them (under `settled`, b takes the settled block itself).
TEST(Expandable, FreePagesInTheMiddleGoBackAndServeAnotherStream) {
  SimSetup s(std::string(kOn) + ",cross_stream_reuse:never", SimBackend::Mode::kManual, 64 * MiB);
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(20 * MiB, 0, a);
  void* q = s.a().allocate(20 * MiB, 0, a);
  void* r = s.a().allocate(20 * MiB, 0, a);
  s.a().deallocate(q, 0, 0, a);
  check(s);
  // b's segment does not fit beside a's 60 MiB: the OOM path unmaps q's pages, then b maps them.
  void* t = s.a().allocate(20 * MiB, 0, b);
  check(s);
  EXPECT_EQ(s.stats().num_alloc_retries, 1);
  EXPECT_FALSE(s.sim->accessible(0, q, 20 * MiB));
  EXPECT_TRUE(s.sim->accessible(0, p, 20 * MiB));
  EXPECT_TRUE(s.sim->accessible(0, r, 20 * MiB));
  // As PyTorch's snapshots do, each run of mapped pages is a segment of its own.
  std::vector<SegmentInfo> of_a;
  for (const SegmentInfo& seg : expandable_segments(s.a())) {
    if (seg.stream == a) of_a.push_back(seg);
  }
  ASSERT_EQ(of_a.size(), 2u);
  EXPECT_EQ(of_a[0].address, addr(p));
  EXPECT_EQ(of_a[0].total_size, 20 * MiB);
  EXPECT_EQ(of_a[1].address, addr(r));
  EXPECT_EQ(of_a[1].reserved_address_bytes, 64 * MiB);
  EXPECT_EQ(s.stats().segment[0].current, 2) << "two expandable segments, one with a hole";
  s.a().deallocate(t, 0, 0, b);
  // A stream grows at the end of its segment; the hole stays unmapped.
  s.a().empty_cache();
  void* u = s.a().allocate(4 * MiB, 0, a);
  EXPECT_EQ(addr(u), addr(r) + 20 * MiB);
  check(s);
  for (void* ptr : {p, r, u}) s.a().deallocate(ptr, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.sim->mapped_bytes(0), 0u);
  EXPECT_EQ(s.sim->counters().address_range_releases, s.sim->counters().address_range_reserves);
}

// A piece goes back only whole: empty_cache unmaps the pieces that lie entirely inside free blocks and
// keeps every piece that holds any byte of a live block, even where most of it is free.
TEST(Expandable, TrimmingUnmapsWholePiecesOnlyAndKeepsAPieceWithALiveBlock) {
  SimSetup s(kOn);
  s.a().set_memory_fraction(160.0 / 256, 0);  // a cap of 160 MiB: the 100 MiB growth comes in pieces
  const Stream a = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* x = s.a().allocate(100 * MiB, 0, a);  // pieces [0, 20) [20, 40) [40, 60) [60, 80) [80, 100) MiB
  const std::uintptr_t base = addr(x);
  EXPECT_EQ(s.sim->mappings(0), 5u);
  s.a().deallocate(x, 0, 0, a);
  void* y = s.a().allocate(30 * MiB, 0, a);  // [0, 30): reuses the free block
  void* z = s.a().allocate(4 * MiB, 0, a);   // [30, 34)
  ASSERT_EQ(addr(y), base);
  ASSERT_EQ(addr(z), base + 30 * MiB);
  check(s);
  s.a().empty_cache();  // the free [34, 100): only [40, 100) is whole pieces
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(s.sim->mappings(0), 2u);
  EXPECT_TRUE(s.sim->accessible(0, reinterpret_cast<void*>(base + 34 * MiB), 6 * MiB))
      << "the free end of the piece z lies in stays mapped";
  EXPECT_FALSE(s.sim->accessible(0, reinterpret_cast<void*>(base + 40 * MiB), 1));

  s.a().deallocate(y, 0, 0, a);  // free [0, 30): the piece [0, 20) goes, [20, 40) holds z
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(s.sim->mappings(0), 1u);
  EXPECT_FALSE(s.sim->accessible(0, y, 1));
  EXPECT_TRUE(s.sim->accessible(0, reinterpret_cast<void*>(base + 20 * MiB), 20 * MiB)) << "z's piece, whole";
  const std::vector<SegmentInfo> segments = expandable_segments(s.a());
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].address, base + 20 * MiB);
  EXPECT_EQ(segments[0].total_size, 20 * MiB);

  s.a().deallocate(z, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(s.stats().segment[0].current, 0);
  EXPECT_EQ(s.sim->counters().address_range_releases, s.sim->counters().address_range_reserves);
  // The history: one map of the growth, one unmap per run of whole pieces.
  std::vector<std::pair<std::string, std::pair<std::uintptr_t, std::size_t>>> pages;
  for (const TraceEntry& e : s.a().history(0)) {
    if (e.action == TraceAction::kSegmentMap || e.action == TraceAction::kSegmentUnmap) {
      pages.push_back({to_string(e.action), {e.address - base, e.size}});
    }
  }
  const std::vector<std::pair<std::string, std::pair<std::uintptr_t, std::size_t>>> expected = {
      {"segment_map", {0, 100 * MiB}},
      {"segment_unmap", {40 * MiB, 60 * MiB}},
      {"segment_unmap", {0, 20 * MiB}},
      {"segment_unmap", {20 * MiB, 20 * MiB}}};
  EXPECT_EQ(pages, expected);
}

TEST(Expandable, MemoryFractionCapsMappedBytes) {
  SimSetup s(std::string(kOn) + ",memory_fraction:0.25");  // 64 MiB of 256
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(40 * MiB, 0, a);
  EXPECT_THROW(s.a().allocate(30 * MiB, 0, a), Error);
  check(s);
  EXPECT_LE(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(64 * MiB));
  void* q = s.a().allocate(24 * MiB, 0, a);
  EXPECT_EQ(addr(q), addr(p) + 40 * MiB);
  check(s);
  s.a().deallocate(q, 0, 0, a);
  s.a().deallocate(p, 0, 0, a);
  s.a().set_memory_fraction(0.1, 0);  // lowering the cap unmaps what is over it
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
}

}  // namespace
}  // namespace streamalloc::testing

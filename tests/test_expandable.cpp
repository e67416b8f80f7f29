// Expandable segments (docs/design.md, "Expandable segments") on the simulated device in manual mode:
// growth in place, reuse without new mappings, unmapping, the out-of-memory path, the stream rules on
// blocks inside a growing segment, private pools and captures, reports. Every step is checked against
// the block table (validate()) and against the simulated device's own bookkeeping.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fault_backend.hpp"
#include "sim_fixture.hpp"
#include "streamalloc/report.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc::testing {
namespace {

constexpr const char* kOn = "expandable_segments:true";
constexpr std::size_t kPage = 2 * MiB;  // the simulated device's granularity

std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

std::vector<SegmentInfo> expandable_segments(Allocator& a) {
  std::vector<SegmentInfo> out;
  for (const SegmentInfo& s : a.segments(0)) {
    if (s.expandable) out.push_back(s);
  }
  return out;
}

// The invariants, and that the cache and the device agree on every byte: reserved bytes are the
// device's reserved memory plus its mapped pages, and each expandable segment's reported size is
// mapped on the device.
void check(SimSetup& s) {
  s.a().validate();
  s.sim->validate();
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.reserved_bytes[0].current, static_cast<std::int64_t>(s.sim->reserved_bytes(0) + s.sim->mapped_bytes(0)));
  for (const SegmentInfo& seg : expandable_segments(s.a())) {
    EXPECT_TRUE(s.sim->accessible(0, reinterpret_cast<void*>(seg.address), seg.total_size));
    EXPECT_EQ(seg.total_size % kPage, 0u);
    EXPECT_GE(seg.reserved_address_bytes, seg.total_size);
  }
}

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
  EXPECT_EQ(s.stats().reserved_bytes[static_cast<int>(PoolKind::kSmall)].current, static_cast<std::int64_t>(kPage));
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
    for (const std::vector<std::size_t>& round : {std::vector<std::size_t>{12, 24, 36, 48}, {11, 22, 33, 44},
                                                  {13, 26, 39, 52}}) {
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
// after makes it whole again, while it is live, parked in its stream's hot list or free. The fast
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
  for (std::size_t request : {2 * MiB, 4 * MiB, 18 * MiB, 20 * MiB, 22 * MiB, 46 * MiB, 100 * MiB, 200 * MiB,
                              7 * MiB + 4096}) {
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

// A simulated device (manual mode) behind a FaultBackend that can refuse or fail virtual-memory calls,
// and an allocator with expandable segments on it.
struct FaultySetup {
  explicit FaultySetup(std::size_t memory) {
    SimBackend::Config config;
    config.mode = SimBackend::Mode::kManual;
    config.memory_per_device = memory;
    sim = std::make_shared<SimBackend>(config);
    faults = std::make_shared<FaultBackend>(sim);
    allocator = std::make_unique<Allocator>(Options::parse(std::string(kOn) + ",log_level:off"), faults);
  }
  std::shared_ptr<SimBackend> sim;
  std::shared_ptr<FaultBackend> faults;
  std::unique_ptr<Allocator> allocator;
};

// Near the cap, where a growth maps pieces: a growth that the device fills part way (some pieces mapped,
// the next refused) takes back what it mapped before the OOM path runs, and so does one whose next map fails with an error; neither leaves
// a byte mapped nor a range reserved. While another stream captures a graph the take-back needs no
// device sync, so the capture is not disturbed.
TEST(Expandable, OutOfMemoryPartWayThroughAGrowthLeavesNothingMapped) {
  using VmOp = FaultBackend::VmOp;
  FaultySetup setup(128 * MiB);
  const std::shared_ptr<SimBackend>& sim = setup.sim;
  const std::shared_ptr<FaultBackend>& faults = setup.faults;
  Allocator& allocator = *setup.allocator;
  const Stream a = sim->create_stream();
  const Stream b = sim->create_stream();
  const Stream graph = sim->create_stream();
  auto consistent = [&] {
    allocator.validate();
    sim->validate();
    // Every segment here is expandable: the cache's memory is the mapped memory.
    EXPECT_EQ(allocator.stats(0).reserved_bytes[0].current, static_cast<std::int64_t>(sim->mapped_bytes(0)));
  };
  // Memory the cache does not hold (another process's), so the cap lets growths try: 88 MiB stay free.
  void* elsewhere = sim->reserve(0, 40 * MiB);
  ASSERT_NE(elsewhere, nullptr);
  const SimBackend::Counters before = sim->counters();
  // 100 MiB on a new segment of a: four pieces of 20 MiB map, the fifth does not fit. Twice: the OOM
  // path has nothing to give back.
  try {
    allocator.allocate(100 * MiB, 0, a);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  }
  consistent();
  SimBackend::Counters after = sim->counters();
  EXPECT_EQ(after.physical_allocations_created - before.physical_allocations_created, 8u);
  EXPECT_EQ(after.physical_allocations_released - before.physical_allocations_released, 8u);
  EXPECT_EQ(after.unused_page_unmaps - before.unused_page_unmaps, 2u);
  EXPECT_EQ(sim->mapped_bytes(0), 0u);
  EXPECT_EQ(sim->mappings(0), 0u);
  EXPECT_EQ(after.address_range_reserves, after.address_range_releases) << "a's range went back";

  // The same while another stream captures: no unmap_pages, no capture violation.
  sim->set_capturing(0, graph, true);
  void* grown = allocator.allocate(4 * MiB, 0, b);  // b's segment grows a piece during the capture
  EXPECT_THROW(allocator.allocate(100 * MiB, 0, b), Error);
  consistent();
  EXPECT_EQ(sim->counters().capture_violations, 0u);
  EXPECT_EQ(sim->counters().page_unmaps, after.page_unmaps);
  EXPECT_EQ(sim->mapped_bytes(0), 4 * MiB);
  sim->set_capturing(0, graph, false);

  // A device error on the third piece of a growth: the two before it go back, the error is the caller's.
  after = sim->counters();
  faults->fail(VmOp::kMapPages, 3);
  EXPECT_THROW(allocator.allocate(62 * MiB, 0, a), Error);  // 4 + 62 MiB pass half the 128 MiB: pieces
  consistent();
  EXPECT_EQ(sim->counters().physical_allocations_created - after.physical_allocations_created, 2u);
  EXPECT_EQ(sim->mapped_bytes(0), 4 * MiB);
  EXPECT_EQ(sim->counters().address_range_reserves - sim->counters().address_range_releases, 1u);

  // What fits still maps.
  void* fits = allocator.allocate(62 * MiB, 0, a);
  consistent();
  EXPECT_EQ(sim->mappings(0), 1u + 4u) << "b's 4 MiB, and 20 + 20 + 20 + 2 MiB";
  for (auto [ptr, stream] : {std::pair{grown, b}, std::pair{fits, a}}) allocator.deallocate(ptr, 0, 0, stream);
  allocator.empty_cache();
  consistent();
  EXPECT_EQ(sim->mapped_bytes(0), 0u);
  EXPECT_EQ(sim->counters().physical_allocations_released, sim->counters().physical_allocations_created);
  sim->release(0, elsewhere, 40 * MiB);
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
  s.a().deallocate(again, 0, 0, a);  // parked, and split: an inactive split
  EXPECT_EQ(s.stats().inactive_split[0].current, 1);
  check(s);
  s.a().deallocate(r, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(s.stats().inactive_split[0].current, 0);
}

TEST(Expandable, OutOfMemoryAfterARefusedGrowthLeavesNothingMapped) {
  SimSetup s(kOn, SimBackend::Mode::kManual, 64 * MiB);
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(40 * MiB, 0, a);
  check(s);

  // A refused map is retried after the OOM path's release; one refusal costs a retry, not the allocation.
  s.sim->fail_next_maps(0, 1);
  void* q = s.a().allocate(3 * MiB, 0, a);
  check(s);
  EXPECT_EQ(s.stats().num_alloc_retries, 1);
  s.a().deallocate(q, 0, 0, a);

  const DeviceStats before = s.stats();
  // Growing a's segment: the device has 20 MiB left, and the OOM path unmaps the free end (q's pages).
  try {
    s.a().allocate(30 * MiB, 0, a);
    ADD_FAILURE() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_EQ(std::string(e.what()).rfind("Simulated device out of memory. Tried to allocate 30.00 MiB.", 0), 0u)
        << e.what();
  }
  check(s);
  // A new segment for b: its range is reserved, the map refused, and the range given back.
  s.sim->fail_next_maps(0, 2);
  EXPECT_THROW(s.a().allocate(3 * MiB, 0, b), Error);
  check(s);
  const DeviceStats after = s.stats();
  EXPECT_EQ(after.num_ooms, before.num_ooms + 2);
  EXPECT_EQ(s.sim->mapped_bytes(0), 40 * MiB) << "the failed allocations mapped nothing";
  EXPECT_EQ(after.reserved_bytes[0].current, static_cast<std::int64_t>(40 * MiB));
  EXPECT_EQ(s.sim->counters().address_range_reserves - s.sim->counters().address_range_releases, 1u)
      << "only a's range is still reserved";
  EXPECT_EQ(after.allocated_bytes[0].current, static_cast<std::int64_t>(40 * MiB));

  // The memory is still there for what fits.
  void* r = s.a().allocate(20 * MiB, 0, b);
  check(s);
  s.a().deallocate(r, 0, 0, b);
  s.a().deallocate(p, 0, 0, a);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.sim->mapped_bytes(0), 0u);
}

// A device error from any virtual-memory call is the caller's error, and the cache and the device
// stay as they were: nothing mapped for the failed growth, nothing lost by the failed unmap.
TEST(Expandable, BackendErrorsChangeNothing) {
  using VmOp = FaultBackend::VmOp;
  FaultySetup setup(256 * MiB);
  const std::shared_ptr<SimBackend>& sim = setup.sim;
  const std::shared_ptr<FaultBackend>& faults = setup.faults;
  Allocator& allocator = *setup.allocator;
  const Stream a = sim->create_stream();
  auto consistent = [&] {
    allocator.validate();
    sim->validate();
    EXPECT_EQ(allocator.stats(0).reserved_bytes[0].current,
              static_cast<std::int64_t>(sim->reserved_bytes(0) + sim->mapped_bytes(0)));
  };
  for (VmOp op : {VmOp::kReserveAddressRange, VmOp::kMapPages}) {
    faults->fail(op);
    EXPECT_THROW(allocator.allocate(3 * MiB, 0, a), Error);
    consistent();
    EXPECT_EQ(sim->mapped_bytes(0), 0u);
  }
  void* p = allocator.allocate(3 * MiB, 0, a);
  void* q = allocator.allocate(3 * MiB, 0, a);
  faults->fail(VmOp::kMapPages);  // growing the segment
  EXPECT_THROW(allocator.allocate(3 * MiB, 0, a), Error);
  consistent();
  allocator.deallocate(q, 0, 0, a);
  faults->fail(VmOp::kUnmapPages);  // q's pages
  EXPECT_THROW(allocator.empty_cache(), Error);
  consistent();
  EXPECT_EQ(sim->mapped_bytes(0), 6 * MiB);
  allocator.deallocate(p, 0, 0, a);
  // The pages go back, then the range cannot: the memory is back, so the segment goes, and only its
  // addresses stay reserved (logged).
  faults->fail(VmOp::kReleaseAddressRange);
  EXPECT_NO_THROW(allocator.empty_cache());
  consistent();
  EXPECT_EQ(sim->mapped_bytes(0), 0u);
  EXPECT_EQ(allocator.stats(0).reserved_bytes[0].current, 0);
  EXPECT_EQ(allocator.stats(0).segment[0].current, 0);
  EXPECT_EQ(sim->counters().address_range_reserves - sim->counters().address_range_releases, 1u);
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
  s.a().process_fences();  // u's batch is fenced; u has not run
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

// Packing: blocks parked in a stream's hot list are left out of the best fit, so in an expandable
// segment, where one segment holds all of a stream's small blocks, a small size the list cannot serve
// flushes it first (as the large pool always does): the parked neighbours merge into a block of the
// size, and the best fit takes it instead of carving a larger free block.
TEST(Expandable, ASmallSizeTheHotListCannotServeSeesTheParkedBlocksMerged) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  std::vector<void*> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(s.a().allocate(512 * KiB, 0, a));  // the first page
  void* halves[2] = {s.a().allocate(1 * MiB, 0, a), s.a().allocate(1 * MiB, 0, a)};  // the second page
  s.a().deallocate(halves[0], 0, 0, a);
  s.a().deallocate(halves[1], 0, 0, a);
  void* large = s.a().allocate(4 * MiB, 0, a);  // a large-pool miss flushes: the second page is one free block
  s.a().deallocate(quarters[0], 0, 0, a);  // both parked in a's hot list, unmerged
  s.a().deallocate(quarters[1], 0, 0, a);
  const std::int64_t maps = s.stats().num_device_alloc;
  void* p = s.a().allocate(1 * MiB, 0, a);
  EXPECT_EQ(p, quarters[0]) << "the free page was carved while the parked neighbours make a block of the size";
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

// A graph's pool keeps fixed segments (as PyTorch's private pools do); the default pool grows while
// another stream captures (PyTorch's does too), and gives pages back only once the capture has ended.
TEST(Expandable, PrivatePoolsUseFixedSegmentsAndCapturesDeferUnmapping) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  const Stream graph = s.sim->create_stream();
  const PoolId pool{1, 0};
  s.a().begin_allocate_to_pool(0, pool, [graph](Stream stream) { return stream == graph; });
  s.sim->set_capturing(0, graph, true);
  void* g = s.a().allocate(3 * MiB, 0, graph);
  void* e = s.a().allocate(3 * MiB, 0, a);
  void* f = s.a().allocate(3 * MiB, 0, a);
  check(s);
  EXPECT_EQ(addr(f), addr(e) + 3 * MiB) << "the default pool grew during the capture";
  for (const SegmentInfo& seg : s.a().segments(0)) {
    EXPECT_EQ(seg.expandable, seg.pool.is_default()) << "only the default pool's segments are expandable";
  }
  s.a().deallocate(f, 0, 0, a);
  s.a().empty_cache();  // nothing goes back during a capture
  EXPECT_TRUE(s.sim->accessible(0, f, 3 * MiB));
  EXPECT_EQ(s.sim->counters().page_unmaps, 0u);
  check(s);
  s.sim->set_capturing(0, graph, false);
  s.a().end_allocate_to_pool(0, pool);
  s.a().empty_cache();
  EXPECT_FALSE(s.sim->accessible(0, f, 3 * MiB));
  check(s);
  s.a().deallocate(g, 0, 0, graph);
  s.a().deallocate(e, 0, 0, a);
  s.a().release_pool(0, pool);
  s.a().empty_cache();
  check(s);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(s.sim->counters().capture_violations, 0u);
}

TEST(Expandable, DeviceWithoutVirtualMemoryUsesFixedSegments) {
  SimBackend::Config config;
  config.mode = SimBackend::Mode::kManual;
  config.memory_per_device = 256 * MiB;
  config.virtual_memory = false;
  auto sim = std::make_shared<SimBackend>(config);
  Allocator allocator(Options::parse(std::string(kOn) + ",log_level:off"), sim);
  const Stream a = sim->create_stream();
  void* p = allocator.allocate(3 * MiB, 0, a);
  void* q = allocator.allocate(3 * MiB, 0, a);
  allocator.validate();
  EXPECT_EQ(allocator.stats(0).reserved_bytes[0].current, static_cast<std::int64_t>(20 * MiB)) << "a fixed 20 MiB segment";
  for (const SegmentInfo& seg : allocator.segments(0)) EXPECT_FALSE(seg.expandable);
  allocator.deallocate(p, 0, 0, a);
  allocator.deallocate(q, 0, 0, a);
}

// As PyTorch's history: an expandable segment's pages are traced as segment_map and segment_unmap, with
// the pages' address and size, never as segment_alloc/segment_free.
TEST(Expandable, HistoryTracesMapsAndUnmaps) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* p = s.a().allocate(3 * MiB, 0, a);
  void* q = s.a().allocate(3 * MiB, 0, a);
  s.a().deallocate(q, 0, 0, a);
  s.a().deallocate(p, 0, 0, a);
  s.a().empty_cache();
  std::vector<std::pair<std::string, std::pair<std::uintptr_t, std::size_t>>> pages;
  for (const TraceEntry& e : s.a().history(0)) {
    EXPECT_NE(e.action, TraceAction::kSegmentAlloc);
    EXPECT_NE(e.action, TraceAction::kSegmentFree);
    if (e.action == TraceAction::kSegmentMap || e.action == TraceAction::kSegmentUnmap) {
      pages.push_back({to_string(e.action), {e.address, e.size}});
    }
  }
  const std::vector<std::pair<std::string, std::pair<std::uintptr_t, std::size_t>>> expected = {
      {"segment_map", {addr(p), 4 * MiB}}, {"segment_map", {addr(p) + 4 * MiB, 2 * MiB}},
      {"segment_unmap", {addr(p), 6 * MiB}}};
  EXPECT_EQ(pages, expected);
}

TEST(Expandable, SnapshotsMarkExpandableSegmentsAndTheirRange) {
  SimSetup s(kOn);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  const std::string json = s.a().snapshot_json();
  EXPECT_NE(json.find("\"is_expandable\":true"), std::string::npos);
  const std::vector<SegmentInfo> read = segments_from_snapshot_json(json);
  ASSERT_EQ(read.size(), 1u);
  EXPECT_TRUE(read[0].expandable);
  EXPECT_EQ(read[0].total_size, 4 * MiB);
  EXPECT_EQ(read[0].reserved_address_bytes, 256 * MiB);
  EXPECT_THROW(s.a().segment_base(p, nullptr), Error) << "mapped pages cannot be shared between processes";
  s.a().deallocate(p, 0, 0, a);
}

}  // namespace
}  // namespace streamalloc::testing

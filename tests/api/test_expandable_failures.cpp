// Expandable segments (docs/design.md, "Expandable segments"), failures: a growth the device refuses
// or fails part way leaves nothing mapped, and backend errors change nothing.
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

// Near the cap, where a growth maps pieces: a growth that the device fills part way (some pieces mapped,
// the next refused) takes back what it mapped before the OOM path runs, and so does one whose next map fails with an
// error; neither leaves a byte mapped nor a range reserved. While another stream captures a graph the take-back needs
// no device sync, so the capture is not disturbed.
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

}  // namespace
}  // namespace streamalloc::testing

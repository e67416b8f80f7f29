// Virtual memory on the simulated device: the Backend calls segments that grow in place stand on
// (reserve an address range, map and unmap memory in it, release it), against the contract in
// backend.hpp: whole pages of the granularity, one physical allocation (mapping) per map and mappings
// unmapped only whole, mapped memory counted against the device's memory, a map that does not fit
// refused with nothing left behind, misuse an error that changes nothing, unmapped pages inaccessible.
// Also the defaults of a backend without virtual memory, and FaultBackend's injection of map failures.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "fault_backend.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

constexpr std::size_t kPage = 2 * MiB;  // the default granularity

SimBackend::Config vm_config(std::size_t memory = 64 * MiB, SimBackend::Mode mode = SimBackend::Mode::kEager) {
  SimBackend::Config config;
  config.memory_per_device = memory;
  config.mode = mode;
  return config;
}

char* at(void* base, std::size_t offset) { return static_cast<char*>(base) + offset; }

using testing::expect_backend_error;

// What a map or unmap may change, to check that a failed or refused one changed nothing.
struct MemoryView {
  std::size_t mapped = 0;
  std::size_t free = 0;
  std::size_t mappings = 0;
  bool operator==(const MemoryView& other) const {
    return mapped == other.mapped && free == other.free && mappings == other.mappings;
  }
};
MemoryView view(SimBackend& sim, int device = 0) {
  return {sim.mapped_bytes(device), sim.memory_info(device).free_bytes, sim.mappings(device)};
}

TEST(SimVmm, GranularityDefaultsToTwoMiBAndIsConfigurable) {
  SimBackend sim(vm_config());
  EXPECT_TRUE(sim.supports_virtual_memory(0));
  EXPECT_EQ(sim.vm_granularity(0), 2 * MiB);

  SimBackend::Config small = vm_config();
  small.vm_granularity = 64 * KiB;
  SimBackend fine(small);
  EXPECT_EQ(fine.vm_granularity(0), 64 * KiB);
  void* base = fine.reserve_address_range(0, 4 * 64 * KiB);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % (64 * KiB), 0u);
  EXPECT_TRUE(fine.map_pages(0, at(base, 64 * KiB), 64 * KiB));
  EXPECT_EQ(fine.mapped_bytes(0), 64 * KiB);
  fine.unmap_pages(0, at(base, 64 * KiB), 64 * KiB);
  fine.release_address_range(0, base, 4 * 64 * KiB);

  for (std::size_t bad : {std::size_t{0}, 3 * MiB, std::size_t{1024}}) {
    SimBackend::Config config = vm_config();
    config.vm_granularity = bad;
    try {
      SimBackend refused(config);
      ADD_FAILURE() << "granularity " << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kConfig) << e.what();
      EXPECT_NE(std::string(e.what()).find("vm_granularity"), std::string::npos) << e.what();
    }
  }
}

TEST(SimVmm, ReserveMapUnmapReleaseRoundTrip) {
  SimBackend sim(vm_config());
  const std::size_t range_bytes = 16 * MiB;
  void* base = sim.reserve_address_range(0, range_bytes);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(base) % kPage, 0u) << "ranges are aligned to the granularity";
  EXPECT_EQ(sim.mapped_bytes(0), 0u);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 64 * MiB) << "address space costs no memory";
  EXPECT_FALSE(sim.accessible(0, base, 1));

  // Two maps side by side: two physical allocations, one usable run.
  ASSERT_TRUE(sim.map_pages(0, at(base, 2 * kPage), 2 * kPage));
  ASSERT_TRUE(sim.map_pages(0, at(base, 4 * kPage), kPage));
  sim.validate();
  EXPECT_EQ(sim.mapped_bytes(0), 3 * kPage);
  EXPECT_EQ(sim.mappings(0), 2u) << "one physical allocation per map, whatever its size";
  EXPECT_EQ(sim.memory_info(0).free_bytes, 64 * MiB - 3 * kPage);
  EXPECT_TRUE(sim.accessible(0, at(base, 2 * kPage), 3 * kPage)) << "adjacent mappings form one usable run";
  EXPECT_FALSE(sim.accessible(0, at(base, kPage), kPage + 1)) << "the page before them is not mapped";

  sim.memset_async(0, at(base, 2 * kPage), 0x5A, 3 * kPage, 0);  // eager: runs now
  EXPECT_EQ(static_cast<unsigned char>(*at(base, 2 * kPage)), 0x5A);
  EXPECT_EQ(static_cast<unsigned char>(*at(base, 5 * kPage - 1)), 0x5A);

  sim.unmap_pages(0, at(base, 4 * kPage), kPage);  // the second mapping, whole
  sim.validate();
  EXPECT_EQ(sim.mapped_bytes(0), 2 * kPage);
  EXPECT_EQ(sim.mappings(0), 1u);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 64 * MiB - 2 * kPage);
  EXPECT_TRUE(sim.accessible(0, at(base, 2 * kPage), 2 * kPage));
  EXPECT_FALSE(sim.accessible(0, at(base, 4 * kPage), 1));
  EXPECT_EQ(static_cast<unsigned char>(*at(base, 4 * kPage - 1)), 0x5A) << "the mapping left keeps its bytes";

  ASSERT_TRUE(sim.map_pages(0, at(base, 4 * kPage), kPage)) << "unmapped pages can be mapped again";
  sim.unmap_pages(0, at(base, 2 * kPage), 3 * kPage);  // both mappings in one call
  EXPECT_EQ(sim.mappings(0), 0u);
  sim.release_address_range(0, base, range_bytes);
  sim.validate();
  EXPECT_EQ(sim.mapped_bytes(0), 0u);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 64 * MiB);

  const SimBackend::Counters c = sim.counters();
  EXPECT_EQ(c.address_range_reserves, 1u);
  EXPECT_EQ(c.address_range_releases, 1u);
  EXPECT_EQ(c.physical_allocations_created, 3u);
  EXPECT_EQ(c.physical_allocations_released, 3u);
  EXPECT_EQ(c.page_unmaps, 2u);
  EXPECT_EQ(c.map_refusals, 0u);
}

// The contract's new misuse: a mapping is one physical allocation and goes back whole. Unmapping part
// of one (its start, its end, its middle, or a span that ends inside the next one) is an error naming
// the mapping, and changes nothing: the memory stays mapped, accessible, counted and intact.
TEST(SimVmm, UnmappingPartOfAMappingIsAnErrorAndChangesNothing) {
  SimBackend sim(vm_config());
  void* base = sim.reserve_address_range(0, 16 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, base, 3 * kPage));
  ASSERT_TRUE(sim.map_pages(0, at(base, 3 * kPage), 2 * kPage));
  sim.memset_async(0, base, 0x3C, 5 * kPage, 0);
  const MemoryView before = view(sim);
  const SimBackend::Counters counters = sim.counters();
  char first[32];
  std::snprintf(first, sizeof first, "0x%jx", static_cast<std::uintmax_t>(reinterpret_cast<std::uintptr_t>(base)));
  for (const auto& [offset, bytes] : {std::pair{std::size_t{0}, kPage},      // the first page of the first mapping
                                      std::pair{kPage, 2 * kPage},           // its last two
                                      std::pair{kPage, kPage},               // its middle
                                      std::pair{std::size_t{0}, 4 * kPage},  // it, and half of the next
                                      std::pair{3 * kPage, kPage}}) {        // the first half of the second
    expect_backend_error([&] { sim.unmap_pages(0, at(base, offset), bytes); }, {"unmap_pages", "cut the mapping at"});
    expect_backend_error([&] { sim.unmap_unused_pages(0, at(base, offset), bytes); },
                         {"unmap_unused_pages", "cut the mapping at", "unmapped whole"});
    EXPECT_TRUE(view(sim) == before) << "offset " << offset << ", " << bytes << " bytes";
  }
  expect_backend_error([&] { sim.unmap_pages(0, at(base, kPage), kPage); }, {std::string("the mapping at ") + first});
  EXPECT_TRUE(sim.accessible(0, base, 5 * kPage));
  EXPECT_EQ(static_cast<unsigned char>(*at(base, kPage)), 0x3C) << "the refused unmaps dropped no page";
  EXPECT_EQ(static_cast<unsigned char>(*at(base, 5 * kPage - 1)), 0x3C);
  EXPECT_EQ(sim.counters().physical_allocations_released, counters.physical_allocations_released);
  EXPECT_EQ(sim.counters().page_unmaps, counters.page_unmaps);
  sim.validate();
  sim.unmap_pages(0, base, 5 * kPage);
  sim.release_address_range(0, base, 16 * MiB);
  sim.validate();
}

// unmap_unused_pages takes back fresh mappings without waiting for any stream, also during a capture,
// where unmap_pages is refused; it counts its mappings as released like unmap_pages.
TEST(SimVmm, UnmapUnusedPagesNeitherWaitsNorIsRefusedDuringACapture) {
  SimBackend sim(vm_config(64 * MiB, SimBackend::Mode::kManual));
  const Stream busy = sim.create_stream();
  const Stream capturing = sim.create_stream();
  void* base = sim.reserve_address_range(0, 16 * MiB);
  ASSERT_NE(base, nullptr);
  sim.enqueue(0, busy, [] {});
  sim.set_capturing(0, capturing, true);
  ASSERT_TRUE(sim.map_pages(0, base, kPage));
  ASSERT_TRUE(sim.map_pages(0, at(base, kPage), 3 * kPage));
  sim.unmap_unused_pages(0, base, 4 * kPage);
  EXPECT_EQ(sim.queued_items(0, busy), 1u) << "nothing waited for the busy stream";
  EXPECT_EQ(sim.mapped_bytes(0), 0u);
  EXPECT_EQ(sim.mappings(0), 0u);
  EXPECT_EQ(sim.counters().capture_violations, 0u);
  EXPECT_EQ(sim.counters().unused_page_unmaps, 1u);
  EXPECT_EQ(sim.counters().physical_allocations_released, 2u);
  expect_backend_error([&] { sim.unmap_unused_pages(0, base, kPage); }, {"unmap_unused_pages", "is not mapped"});
  sim.set_capturing(0, capturing, false);
  sim.release_address_range(0, base, 16 * MiB);
  sim.synchronize_all();
  sim.validate();
}

TEST(SimVmm, RangesAndReservationsNeverOverlapAndDoNotMix) {
  SimBackend sim(vm_config(256 * MiB));
  std::vector<std::pair<void*, std::size_t>> ranges;
  std::vector<std::pair<void*, std::size_t>> reservations;
  for (int i = 0; i < 4; ++i) {
    ranges.emplace_back(sim.reserve_address_range(0, 8 * MiB), 8 * MiB);
    reservations.emplace_back(sim.reserve(0, 3 * MiB + 512), 3 * MiB + 512);
    ASSERT_NE(ranges.back().first, nullptr);
    ASSERT_NE(reservations.back().first, nullptr);
  }
  sim.validate();  // checks that no range overlaps a reservation
  for (const auto& [range, range_bytes] : ranges) {
    for (const auto& [memory, memory_bytes] : reservations) {
      const auto r = reinterpret_cast<std::uintptr_t>(range);
      const auto m = reinterpret_cast<std::uintptr_t>(memory);
      EXPECT_TRUE(m + memory_bytes <= r || r + range_bytes <= m);
    }
  }
  void* range = ranges[0].first;
  void* memory = reservations[0].first;
  expect_backend_error([&] { sim.release(0, range, 8 * MiB); }, {"release", "not returned by reserve()"});
  expect_backend_error([&] { sim.map_pages(0, memory, kPage); }, {"map_pages", "not inside one range"});
  expect_backend_error([&] { sim.release_address_range(0, memory, 3 * MiB + 512); },
                       {"release_address_range", "not the base of a range"});
  EXPECT_FALSE(sim.accessible(0, range, 1));
  EXPECT_TRUE(sim.accessible(0, memory, 3 * MiB + 512));
  for (const auto& [r, bytes] : ranges) sim.release_address_range(0, r, bytes);
  for (const auto& [m, bytes] : reservations) sim.release(0, m, bytes);
  sim.validate();
}

TEST(SimVmm, MappedPagesAndReservationsShareTheDeviceMemory) {
  SimBackend sim(vm_config(64 * MiB));
  void* memory = sim.reserve(0, 40 * MiB);
  ASSERT_NE(memory, nullptr);
  void* base = sim.reserve_address_range(0, 64 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, base, 16 * MiB));
  ASSERT_TRUE(sim.map_pages(0, at(base, 16 * MiB), 8 * MiB))
      << "40 MiB reserved + 24 MiB mapped fill the 64 MiB device";
  EXPECT_EQ(sim.memory_info(0).free_bytes, 0u);
  EXPECT_EQ(sim.memory_info(0).total_bytes, 64 * MiB);
  EXPECT_FALSE(sim.map_pages(0, at(base, 24 * MiB), kPage)) << "no room for one more page";
  EXPECT_EQ(sim.reserve(0, 512), nullptr) << "nor for a reservation";

  sim.unmap_pages(0, at(base, 16 * MiB), 8 * MiB);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 8 * MiB);
  void* more = sim.reserve(0, 8 * MiB);
  EXPECT_NE(more, nullptr) << "unmapped pages are memory reserve() can have";
  EXPECT_FALSE(sim.map_pages(0, at(base, 16 * MiB), kPage));
  sim.release(0, more, 8 * MiB);
  sim.release(0, memory, 40 * MiB);
  ASSERT_TRUE(sim.map_pages(0, at(base, 16 * MiB), 48 * MiB)) << "released memory is mappable";
  EXPECT_EQ(sim.memory_info(0).free_bytes, 0u);
  sim.unmap_pages(0, base, 64 * MiB);  // both mappings
  sim.release_address_range(0, base, 64 * MiB);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 64 * MiB);
  sim.validate();
}

TEST(SimVmm, MapThatDoesNotFitLeavesNothingBehind) {
  SimBackend sim(vm_config(16 * MiB));
  void* base = sim.reserve_address_range(0, 32 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, base, 12 * MiB));
  const MemoryView before = view(sim);
  // 3 pages where 2 fit: all or nothing, none of the pages that would fit is mapped.
  EXPECT_FALSE(sim.map_pages(0, at(base, 12 * MiB), 3 * kPage));
  EXPECT_TRUE(view(sim) == before);
  EXPECT_FALSE(sim.accessible(0, at(base, 12 * MiB), 1));
  expect_backend_error([&] { sim.memset_async(0, at(base, 12 * MiB), 0, kPage, 0); }, {"not mapped"});
  sim.validate();
  EXPECT_EQ(sim.counters().map_refusals, 1u);
  EXPECT_EQ(sim.counters().physical_allocations_created, 1u);
  EXPECT_EQ(sim.mappings(0), 1u);
  // The same pages map once they fit, and nothing half-mapped is in the way.
  ASSERT_TRUE(sim.map_pages(0, at(base, 12 * MiB), 2 * kPage));
  sim.unmap_pages(0, base, 16 * MiB);
  sim.release_address_range(0, base, 32 * MiB);
  sim.validate();
}

TEST(SimVmm, LoweredLimitRefusesMaps) {
  SimBackend sim(vm_config(64 * MiB));
  void* base = sim.reserve_address_range(0, 8 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, base, 4 * MiB));
  sim.set_memory_limit(0, 2 * MiB);  // below what is mapped already
  EXPECT_EQ(sim.memory_info(0).free_bytes, 0u);
  EXPECT_FALSE(sim.map_pages(0, at(base, 4 * MiB), kPage));
  sim.unmap_pages(0, base, 4 * MiB);
  EXPECT_TRUE(sim.map_pages(0, base, kPage));
  sim.unmap_pages(0, base, kPage);
  sim.release_address_range(0, base, 8 * MiB);
}

TEST(SimVmm, AddressSpaceIsBoundedAndComesBack) {
  SimBackend::Config config = vm_config();
  config.address_space_per_device = 64 * MiB;
  SimBackend sim(config);
  void* a = sim.reserve_address_range(0, 48 * MiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(sim.reserve_address_range(0, 32 * MiB), nullptr) << "48 + 32 MiB exceed the 64 MiB of address space";
  void* b = sim.reserve_address_range(0, 16 * MiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(sim.reserve_address_range(0, kPage), nullptr);
  sim.release_address_range(0, a, 48 * MiB);
  void* c = sim.reserve_address_range(0, 32 * MiB);
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(sim.counters().address_range_reserves, 3u);
  sim.release_address_range(0, b, 16 * MiB);
  sim.release_address_range(0, c, 32 * MiB);

  SimBackend unbounded(vm_config());
  const std::size_t huge = (SIZE_MAX / kPage) * kPage;  // more than any address space
  EXPECT_EQ(unbounded.reserve_address_range(0, huge), nullptr);
  unbounded.validate();
}

TEST(SimVmm, MisuseIsAnErrorAndChangesNothing) {
  SimBackend sim(vm_config());
  void* base = sim.reserve_address_range(0, 8 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, at(base, kPage), kPage));
  const MemoryView before = view(sim);
  const std::size_t ranges_before = sim.counters().address_range_reserves;

  expect_backend_error([&] { sim.reserve_address_range(0, 0); },
                       {"reserve_address_range", "multiple of the granularity"});
  expect_backend_error([&] { sim.reserve_address_range(0, kPage + 4096); }, {"multiple of the granularity"});
  expect_backend_error([&] { sim.map_pages(0, at(base, 4096), kPage); }, {"map_pages", "not aligned"});
  expect_backend_error([&] { sim.map_pages(0, at(base, 2 * kPage), kPage / 2); }, {"multiple of the granularity"});
  expect_backend_error([&] { sim.map_pages(0, at(base, 2 * kPage), 0); }, {"multiple of the granularity"});
  expect_backend_error([&] { sim.map_pages(0, at(base, 3 * kPage), 2 * kPage); }, {"not inside one range"});
  void* below = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(base) - kPage);
  expect_backend_error([&] { sim.map_pages(0, below, kPage); }, {"not inside one range"});
  expect_backend_error([&] { sim.map_pages(0, base, 2 * kPage); }, {"is already mapped", "0x"});
  expect_backend_error([&] { sim.map_pages(0, at(base, kPage), kPage); }, {"is already mapped"});
  expect_backend_error([&] { sim.unmap_pages(0, base, kPage); }, {"unmap_pages", "is not mapped"});
  expect_backend_error([&] { sim.unmap_pages(0, at(base, kPage), 2 * kPage); }, {"is not mapped"});
  expect_backend_error([&] { sim.unmap_pages(0, at(base, kPage + 4096), kPage); }, {"not aligned"});
  expect_backend_error([&] { sim.release_address_range(0, base, 8 * MiB); },
                       {"release_address_range", "still mapped", "unmap_pages them first"});
  expect_backend_error([&] { sim.release_address_range(0, base, 4 * MiB); }, {"pass the reserved size"});
  expect_backend_error([&] { sim.release_address_range(0, at(base, kPage), kPage); }, {"not the base of a range"});
  expect_backend_error([&] { sim.map_pages(1, base, kPage); }, {"map_pages", "device 1 does not exist"});
  expect_backend_error([&] { sim.vm_granularity(-1); }, {"vm_granularity", "device -1 does not exist"});

  EXPECT_TRUE(view(sim) == before);
  EXPECT_EQ(sim.counters().address_range_reserves, ranges_before);
  EXPECT_TRUE(sim.accessible(0, at(base, kPage), kPage));
  sim.validate();

  sim.unmap_pages(0, at(base, kPage), kPage);
  expect_backend_error([&] { sim.unmap_pages(0, at(base, kPage), kPage); }, {"is not mapped"});  // twice
  sim.release_address_range(0, base, 8 * MiB);
  expect_backend_error([&] { sim.release_address_range(0, base, 8 * MiB); }, {"double release"});
  expect_backend_error([&] { sim.map_pages(0, base, kPage); }, {"not inside one range"});  // after release
  sim.validate();
}

TEST(SimVmm, UnmappedPagesAreNotAccessible) {
  SimBackend sim(vm_config());
  void* base = sim.reserve_address_range(0, 8 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, base, kPage));
  EXPECT_TRUE(sim.accessible(0, base, kPage));
  EXPECT_TRUE(sim.accessible(0, at(base, 100), 1000));
  EXPECT_FALSE(sim.accessible(0, at(base, kPage - 1), 2)) << "one byte of the range is past the mapped page";
  EXPECT_FALSE(sim.accessible(0, at(base, 3 * kPage), 1));
  expect_backend_error([&] { sim.memset_async(0, at(base, kPage - 8), 0, 16, 0); },
                       {"memset_async", "reserved address range that are not mapped"});
  expect_backend_error([&] { sim.memset_async(0, at(base, 3 * kPage), 0, 1, 0); }, {"not mapped"});
  expect_backend_error([&] { sim.memset_async(0, at(base, 8 * MiB), 0, 1, 0); }, {"not inside memory reserved"});
  EXPECT_EQ(sim.counters().memsets, 0u);
  sim.memset_async(0, at(base, kPage - 8), 0x11, 8, 0);
  EXPECT_EQ(sim.counters().memsets, 1u);
  sim.unmap_pages(0, base, kPage);
  EXPECT_FALSE(sim.accessible(0, base, 1)) << "unmapped again";
  expect_backend_error([&] { sim.memset_async(0, base, 0, 1, 0); }, {"not mapped"});
  sim.release_address_range(0, base, 8 * MiB);
  EXPECT_FALSE(sim.accessible(0, base, 1));
}

TEST(SimVmm, UnmapWaitsForQueuedWorkLikeRelease) {
  SimBackend sim(vm_config(64 * MiB, SimBackend::Mode::kManual));
  const Stream stream = sim.create_stream();
  void* base = sim.reserve_address_range(0, 4 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, base, kPage));
  std::atomic<bool> wrote{false};
  sim.memset_async(0, base, 0x7F, kPage, stream);
  sim.enqueue(0, stream, [&] {
    // Still mapped when the stream gets here: the unmap below waits for this work.
    wrote = static_cast<unsigned char>(*at(base, kPage - 1)) == 0x7F;
  });
  EXPECT_EQ(sim.queued_items(0, stream), 2u);
  sim.unmap_pages(0, base, kPage);
  EXPECT_EQ(sim.queued_items(0, stream), 0u) << "unmap synchronizes the device, as cudaFree does";
  EXPECT_TRUE(wrote);
  sim.release_address_range(0, base, 4 * MiB);
}

TEST(SimVmm, DuringACaptureMapsWorkAndUnmapsAreRefused) {
  SimBackend sim(vm_config(64 * MiB, SimBackend::Mode::kManual));
  const Stream capturing = sim.create_stream();
  void* before = sim.reserve_address_range(0, 4 * MiB);
  ASSERT_NE(before, nullptr);
  ASSERT_TRUE(sim.map_pages(0, before, kPage));
  sim.set_capturing(0, capturing, true);

  void* during = sim.reserve_address_range(0, 4 * MiB);
  ASSERT_NE(during, nullptr) << "reserving address space is no stream work";
  EXPECT_TRUE(sim.map_pages(0, during, kPage)) << "mapping is no stream work";
  sim.memset_async(0, during, 0, kPage, capturing);
  const MemoryView mapped = view(sim);
  expect_backend_error([&] { sim.unmap_pages(0, before, kPage); }, {"unmap_pages", "captures a graph"});
  EXPECT_TRUE(view(sim) == mapped);
  EXPECT_EQ(sim.counters().capture_violations, 1u);
  void* empty = sim.reserve_address_range(0, 4 * MiB);
  ASSERT_NE(empty, nullptr);
  sim.release_address_range(0, empty, 4 * MiB);  // nothing mapped, nothing to wait for

  sim.set_capturing(0, capturing, false);
  sim.unmap_pages(0, before, kPage);
  sim.unmap_pages(0, during, kPage);
  sim.release_address_range(0, before, 4 * MiB);
  sim.release_address_range(0, during, 4 * MiB);
  EXPECT_EQ(sim.counters().capture_violations, 1u);
  sim.validate();
}

TEST(SimVmm, DevicesHaveTheirOwnRangesAndMemory) {
  SimBackend::Config config = vm_config(16 * MiB);
  config.device_count = 2;
  SimBackend sim(config);
  void* range0 = sim.reserve_address_range(0, 8 * MiB);
  void* range1 = sim.reserve_address_range(1, 8 * MiB);
  ASSERT_NE(range0, nullptr);
  ASSERT_NE(range1, nullptr);
  expect_backend_error([&] { sim.map_pages(1, range0, kPage); }, {"device 1", "not inside one range"});
  ASSERT_TRUE(sim.map_pages(1, range1, 8 * MiB));
  EXPECT_EQ(sim.memory_info(1).free_bytes, 8 * MiB);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 16 * MiB);
  EXPECT_FALSE(sim.accessible(0, range1, 1)) << "device 1's pages are not device 0's";
  EXPECT_TRUE(sim.accessible(1, range1, 8 * MiB));
  expect_backend_error([&] { sim.release_address_range(0, range1, 8 * MiB); }, {"not the base of a range"});
  sim.unmap_pages(1, range1, 8 * MiB);
  sim.release_address_range(1, range1, 8 * MiB);
  sim.release_address_range(0, range0, 8 * MiB);
  sim.validate();
}

TEST(SimVmm, InjectedMapFailuresRefuseExactlyTheNextN) {
  SimBackend sim(vm_config());
  void* base = sim.reserve_address_range(0, 8 * MiB);
  ASSERT_NE(base, nullptr);
  sim.fail_next_maps(0, 2);
  EXPECT_FALSE(sim.map_pages(0, base, kPage));
  EXPECT_FALSE(sim.map_pages(0, base, kPage));
  EXPECT_EQ(sim.mapped_bytes(0), 0u);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 64 * MiB);
  EXPECT_TRUE(sim.map_pages(0, base, kPage)) << "the third map is not refused";
  EXPECT_EQ(sim.counters().map_refusals, 2u);
  EXPECT_EQ(sim.counters().physical_allocations_created, 1u);
  sim.unmap_pages(0, base, kPage);
  sim.release_address_range(0, base, 8 * MiB);
}

TEST(SimVmm, DeviceWithoutVirtualMemorySaysSo) {
  SimBackend::Config config = vm_config();
  config.virtual_memory = false;
  SimBackend sim(config);
  EXPECT_FALSE(sim.supports_virtual_memory(0));
  expect_backend_error([&] { sim.vm_granularity(0); }, {"vm_granularity", "not supported"});
  expect_backend_error([&] { sim.reserve_address_range(0, kPage); }, {"reserve_address_range", "not supported"});
  int local = 0;
  expect_backend_error([&] { sim.map_pages(0, &local, kPage); }, {"map_pages", "not supported"});
  expect_backend_error([&] { sim.unmap_pages(0, &local, kPage); }, {"unmap_pages", "not supported"});
  expect_backend_error([&] { sim.unmap_unused_pages(0, &local, kPage); }, {"unmap_unused_pages", "not supported"});
  expect_backend_error([&] { sim.release_address_range(0, &local, kPage); },
                       {"release_address_range", "not supported"});
  expect_backend_error([&] { sim.export_piece(0, &local); }, {"export_piece", "not supported"});
}

// A backend that implements only the required calls: it gets the seam's defaults for virtual memory.
class MinimalBackend final : public Backend {
 public:
  std::string name() const override { return "minimal"; }
  int device_count() const override { return 1; }
  void* reserve(int, std::size_t) override { return nullptr; }
  void release(int, void*, std::size_t) override {}
  Event create_event(int) override { return nullptr; }
  void destroy_event(int, Event) override {}
  void record_event(int, Event, Stream) override {}
  bool query_event(int, Event) override { return true; }
  void synchronize_event(int, Event) override {}
  bool query_stream(int, Stream) override { return true; }
  void stream_wait_event(int, Stream, Event) override {}
  bool is_capturing(int, Stream) override { return false; }
  void memset_async(int, void*, int, std::size_t, Stream) override {}
  DeviceMemoryInfo memory_info(int) override { return {}; }
  int stream_device(Stream) override { return -1; }
};

TEST(SimVmm, BackendDefaultsSayNotSupported) {
  MinimalBackend backend;
  EXPECT_FALSE(backend.supports_virtual_memory(0));
  int local = 0;
  expect_backend_error([&] { backend.vm_granularity(0); },
                       {"minimal backend", "vm_granularity(device 0)", "not supported"});
  expect_backend_error([&] { backend.reserve_address_range(0, kPage); }, {"reserve_address_range", "not supported"});
  expect_backend_error([&] { backend.map_pages(0, &local, kPage); }, {"map_pages", "not supported"});
  expect_backend_error([&] { backend.unmap_pages(0, &local, kPage); }, {"unmap_pages", "not supported"});
  expect_backend_error([&] { backend.unmap_unused_pages(0, &local, kPage); }, {"unmap_unused_pages", "not supported"});
  expect_backend_error([&] { backend.release_address_range(0, &local, kPage); }, {"release_address_range"});
  expect_backend_error([&] { backend.map_pieces(0, &local, 2 * kPage, kPage); }, {"map_pages", "not supported"});
  expect_backend_error([&] { backend.export_piece(0, &local); },
                       {"minimal backend", "export_piece(device 0)", "cannot export"});
}

// map_pieces: a run of equal mappings, each unmapped alone if need be; all or nothing.
TEST(SimVmm, MapPiecesMapsEqualMappingsAllOrNothing) {
  SimBackend sim(vm_config(16 * MiB));
  void* base = sim.reserve_address_range(0, 32 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pieces(0, base, 8 * MiB, kPage));
  EXPECT_EQ(sim.mappings(0), 4u);
  EXPECT_EQ(sim.counters().physical_allocations_created, 4u);
  sim.unmap_pages(0, at(base, kPage), kPage);  // one piece alone
  EXPECT_EQ(sim.mappings(0), 3u);
  EXPECT_TRUE(sim.accessible(0, base, kPage));
  EXPECT_FALSE(sim.accessible(0, at(base, kPage), 1));
  // 6 MiB mapped of 16: 10 MiB fit, 12 do not; the five pieces that fit go back.
  const MemoryView before = view(sim);
  const SimBackend::Counters counters = sim.counters();
  EXPECT_FALSE(sim.map_pieces(0, at(base, 8 * MiB), 12 * MiB, kPage));
  EXPECT_EQ(view(sim), before);
  EXPECT_EQ(sim.counters().unused_page_unmaps, counters.unused_page_unmaps + 1);
  expect_backend_error([&] { sim.map_pieces(0, at(base, 8 * MiB), 3 * kPage, 2 * kPage); },
                       {"map_pieces", "not a whole number of pieces"});
  EXPECT_EQ(view(sim), before);
  ASSERT_TRUE(sim.map_pieces(0, at(base, 8 * MiB), 10 * MiB, kPage));
  EXPECT_EQ(sim.mapped_bytes(0), 16 * MiB);
  sim.unmap_pages(0, base, kPage);
  sim.unmap_pages(0, at(base, 2 * kPage), 14 * MiB);  // seven pieces side by side, one call
  sim.release_address_range(0, base, 32 * MiB);
  sim.validate();
}

// export_piece: one descriptor-like number per mapping, the same on every call, forgotten (closed)
// when its mapping is unmapped; anything but a mapping's first address is an error.
TEST(SimVmm, ExportPieceIsOneDescriptorPerMappingClosedAtUnmap) {
  SimBackend sim(vm_config());
  void* base = sim.reserve_address_range(0, 16 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pieces(0, base, 3 * kPage, kPage));
  const int first = sim.export_piece(0, base);
  const int second = sim.export_piece(0, at(base, kPage));
  const int third = sim.export_piece(0, at(base, 2 * kPage));
  EXPECT_GE(first, 0);
  EXPECT_NE(first, second);
  EXPECT_NE(second, third);
  EXPECT_NE(first, third);
  EXPECT_EQ(sim.export_piece(0, at(base, kPage)), second) << "the same descriptor on every call";
  EXPECT_EQ(sim.counters().pieces_exported, 3u);
  expect_backend_error([&] { sim.export_piece(0, at(base, MiB)); }, {"export_piece", "no mapping starts there"});
  expect_backend_error([&] { sim.export_piece(0, at(base, 4 * kPage)); }, {"export_piece", "no mapping starts there"});
  sim.unmap_pages(0, base, kPage);
  EXPECT_EQ(sim.counters().exports_closed, 1u);
  expect_backend_error([&] { sim.export_piece(0, base); }, {"no mapping starts there"});
  sim.unmap_pages(0, at(base, kPage), 2 * kPage);
  EXPECT_EQ(sim.counters().exports_closed, 3u);
  ASSERT_TRUE(sim.map_pages(0, base, kPage));
  EXPECT_NE(sim.export_piece(0, base), first) << "a new mapping, a new descriptor";
  sim.unmap_pages(0, base, kPage);
  sim.release_address_range(0, base, 16 * MiB);
}

TEST(SimVmm, ExportPieceSaysSoWhereTheDriverRefusesExportableMemory) {
  SimBackend::Config config = vm_config();
  config.exportable_pieces = false;
  SimBackend sim(config);
  void* base = sim.reserve_address_range(0, 4 * MiB);
  ASSERT_NE(base, nullptr);
  ASSERT_TRUE(sim.map_pages(0, base, kPage));
  expect_backend_error([&] { sim.export_piece(0, base); }, {"export_piece", "cannot be exported"});
  EXPECT_EQ(sim.counters().pieces_exported, 0u);
  sim.unmap_pages(0, base, kPage);
  EXPECT_EQ(sim.counters().exports_closed, 0u);
  sim.release_address_range(0, base, 4 * MiB);
}

TEST(SimVmm, FaultBackendInjectsMapRefusalsAndErrors) {
  auto sim = std::make_shared<SimBackend>(vm_config());
  testing::FaultBackend faults(sim);
  using Op = testing::FaultBackend::VmOp;
  EXPECT_TRUE(faults.supports_virtual_memory(0));
  EXPECT_EQ(faults.vm_granularity(0), kPage);
  void* base = faults.reserve_address_range(0, 8 * MiB);
  ASSERT_NE(base, nullptr);

  faults.refuse_maps(1);
  EXPECT_FALSE(faults.map_pages(0, base, kPage)) << "refused as a full device would";
  EXPECT_EQ(sim->mapped_bytes(0), 0u);
  EXPECT_EQ(sim->counters().physical_allocations_created, 0u) << "a refused map never reaches the device";
  ASSERT_TRUE(faults.map_pages(0, base, kPage));

  faults.fail(Op::kMapPages);
  expect_backend_error([&] { faults.map_pages(0, at(base, kPage), kPage); }, {"injected map_pages failure"});
  EXPECT_EQ(sim->mapped_bytes(0), kPage);
  faults.fail(Op::kUnmapPages);
  expect_backend_error([&] { faults.unmap_pages(0, base, kPage); }, {"injected unmap_pages failure"});
  EXPECT_TRUE(sim->accessible(0, base, kPage)) << "the failed unmap left the page mapped";
  faults.unmap_pages(0, base, kPage);
  faults.fail(Op::kReleaseAddressRange);
  expect_backend_error([&] { faults.release_address_range(0, base, 8 * MiB); }, {"injected release_address_range"});
  faults.release_address_range(0, base, 8 * MiB);
  faults.fail(Op::kReserveAddressRange, 2);
  void* first = faults.reserve_address_range(0, 8 * MiB);
  ASSERT_NE(first, nullptr) << "the second call is the one chosen to fail";
  expect_backend_error([&] { faults.reserve_address_range(0, 8 * MiB); }, {"injected reserve_address_range"});
  faults.release_address_range(0, first, 8 * MiB);
  EXPECT_EQ(faults.injected(), 5);
  sim->validate();
}

// Threads each map and unmap memory of their own range, with a device too small for what they want
// (even for one thread's whole range), so maps are refused while memory is held. Each unmap takes one
// whole mapping or two side by side. Each thread fills what it maps and checks its bytes; at the end
// every mapping is back and the model validates.
TEST(SimVmm, ThreadsMapAndUnmapTheirOwnRanges) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 400;
  constexpr std::size_t kRangePages = 8;
  constexpr std::size_t kSmallPage = 64 * KiB;  // small pages keep the fills cheap
  SimBackend::Config config = vm_config(6 * kSmallPage);
  config.vm_granularity = kSmallPage;
  SimBackend sim(config);
  std::atomic<int> refused{0};
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      void* base = sim.reserve_address_range(0, kRangePages * kSmallPage);
      if (base == nullptr) {
        ++corrupted;
        return;
      }
      // mapping[p]: the pages of the mapping that starts at page p, 0 where none does.
      std::vector<std::size_t> mapping(kRangePages, 0);
      auto covered = [&](std::size_t page) {
        for (std::size_t p = 0; p <= page; ++p) {
          if (mapping[p] != 0 && p + mapping[p] > page) return true;
        }
        return false;
      };
      for (int round = 0; round < kRounds; ++round) {
        const std::size_t page = rng() % kRangePages;
        char* first = at(base, page * kSmallPage);
        if (mapping[page] != 0) {  // unmap it, and the next mapping too when it follows right after
          if (first[0] != t + 1) ++corrupted;
          std::size_t pages = mapping[page];
          mapping[page] = 0;
          if (rng() % 2 == 0 && page + pages < kRangePages && mapping[page + pages] != 0) {
            const std::size_t next = page + pages;
            pages += mapping[next];
            mapping[next] = 0;
          }
          sim.unmap_pages(0, first, pages * kSmallPage);
          continue;
        }
        const std::size_t count = 1 + rng() % 2;
        bool free = page + count <= kRangePages;
        for (std::size_t p = page; free && p < page + count; ++p) free = !covered(p);
        if (!free) continue;
        if (!sim.map_pages(0, first, count * kSmallPage)) {
          ++refused;
          continue;
        }
        mapping[page] = count;
        sim.memset_async(0, first, t + 1, count * kSmallPage, 0);  // eager: done when it returns
        if (first[0] != t + 1 || first[count * kSmallPage - 1] != t + 1) ++corrupted;
      }
      for (std::size_t p = 0; p < kRangePages; ++p) {
        if (mapping[p] != 0) sim.unmap_pages(0, at(base, p * kSmallPage), mapping[p] * kSmallPage);
      }
      sim.release_address_range(0, base, kRangePages * kSmallPage);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_GT(refused.load(), 0) << "the device was meant to be too small for what the threads map";
  EXPECT_EQ(sim.mapped_bytes(0), 0u);
  EXPECT_EQ(sim.mappings(0), 0u);
  EXPECT_EQ(sim.memory_info(0).free_bytes, 6 * kSmallPage);
  const SimBackend::Counters c = sim.counters();
  EXPECT_EQ(c.map_refusals, static_cast<std::uint64_t>(refused.load()));
  EXPECT_EQ(c.physical_allocations_released, c.physical_allocations_created);
  EXPECT_EQ(c.address_range_reserves, static_cast<std::uint64_t>(kThreads));
  EXPECT_EQ(c.address_range_releases, static_cast<std::uint64_t>(kThreads));
  sim.validate();
}

}  // namespace
}  // namespace streamalloc

// Expandable segments (docs/design.md, "Expandable segments") with the rest of the allocator: private
// pools and captures, a device without virtual memory, the allocation history and snapshots.
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
  SimBackend::Config config = SimSetup::device();
  config.virtual_memory = false;
  SimSetup s(std::string(kOn) + ",log_level:off", config);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(3 * MiB, 0, a);
  void* q = s.a().allocate(3 * MiB, 0, a);
  s.a().validate();
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(20 * MiB)) << "a fixed 20 MiB segment";
  for (const SegmentInfo& seg : s.a().segments(0)) EXPECT_FALSE(seg.expandable);
  s.a().deallocate(p, 0, 0, a);
  s.a().deallocate(q, 0, 0, a);
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
      {"segment_map", {addr(p), 4 * MiB}},
      {"segment_map", {addr(p) + 4 * MiB, 2 * MiB}},
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
  EXPECT_THROW(s.a().segment_base(p, nullptr), Error) << "not one allocation with a base: share_pieces";
  s.a().deallocate(p, 0, 0, a);
}

}  // namespace
}  // namespace streamalloc::testing

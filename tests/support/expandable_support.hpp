// Shared by the expandable-segments tests (tests/api/test_expandable_*.cpp): the option, the simulated
// device's page, the checks every step runs, and a simulated device behind a FaultBackend.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fault_backend.hpp"
#include "sim_fixture.hpp"

namespace streamalloc::testing {

inline constexpr const char* kOn = "expandable_segments:true";
// Expandable segments whose blocks can be sent to another process: one page per piece.
inline constexpr const char* kShareable = "expandable_segments:true,expandable_ipc:true";
inline constexpr std::size_t kPage = 2 * MiB;  // the simulated device's granularity

inline std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

inline std::vector<SegmentInfo> expandable_segments(Allocator& a) {
  std::vector<SegmentInfo> out;
  for (const SegmentInfo& s : a.segments(0)) {
    if (s.expandable) out.push_back(s);
  }
  return out;
}

// The invariants, and that the cache and the device agree on every byte: reserved bytes are the
// device's reserved memory plus its mapped pages, and each expandable segment's reported size is
// mapped on the device.
inline void check(SimSetup& s) {
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

}  // namespace streamalloc::testing

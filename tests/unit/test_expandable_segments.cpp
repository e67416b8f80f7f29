// ExpandableSegments on its own (expandable_segments.hpp): on only where the option is and the device
// maps virtual memory, and one growing segment per (stream, size class), forgotten when released.
#include <gtest/gtest.h>

#include "expandable_segments.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc {
namespace {

TEST(ExpandableSegments, OnOnlyWithTheOptionAndVirtualMemory) {
  SimBackend sim;
  ExpandableSegments off;
  off.set_up(false, sim, 0);
  EXPECT_FALSE(off.on());
  ExpandableSegments on;
  on.set_up(true, sim, 0);
  EXPECT_TRUE(on.on());
  EXPECT_EQ(on.page_bytes(), sim.vm_granularity(0));
  SimBackend::Config config;
  config.virtual_memory = false;
  SimBackend fixed(config);
  ExpandableSegments without;
  without.set_up(true, fixed, 0);
  EXPECT_FALSE(without.on());
  EXPECT_EQ(without.page_bytes(), 0u);
}

TEST(ExpandableSegments, EachStreamAndSizeClassGrowsOneSegmentUntilItIsReleased) {
  ExpandableSegments segments;
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

}  // namespace
}  // namespace streamalloc

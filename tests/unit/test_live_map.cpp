// LiveMap against std::unordered_map: random inserts and erases, with addresses chosen so that many
// share a home slot and probe runs wrap around the end of the table (where backward-shift deletion is
// easiest to get wrong).
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include <gtest/gtest.h>

#include "live_map.hpp"

namespace streamalloc {
namespace {

Block* fake_block(std::uintptr_t address) { return reinterpret_cast<Block*>(address ^ 0x5a5a); }

void expect_same(const LiveMap& map, const std::unordered_map<std::uintptr_t, Block*>& model,
                 const std::vector<std::uintptr_t>& universe) {
  ASSERT_EQ(map.size(), model.size());
  for (std::uintptr_t address : universe) {
    auto it = model.find(address);
    ASSERT_EQ(map.find(address), it == model.end() ? nullptr : it->second) << std::hex << address;
  }
}

TEST(LiveMap, MatchesUnorderedMapUnderRandomInsertAndErase) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    // Few distinct addresses (heavy reuse, as a cache hands the same blocks out again) in a small and
    // a wide range, 512-byte aligned like every block.
    const std::size_t distinct = seed % 2 ? 40 : 3000;
    std::vector<std::uintptr_t> universe;
    for (std::size_t i = 0; i < distinct; ++i) universe.push_back(0x7f0000000000ull + (rng() % (distinct * 4)) * 512);
    LiveMap map;
    std::unordered_map<std::uintptr_t, Block*> model;
    for (int step = 0; step < 20000; ++step) {
      const std::uintptr_t address = universe[rng() % universe.size()];
      if (model.count(address) != 0) {
        ASSERT_TRUE(map.erase(address));
        model.erase(address);
      } else if (rng() % 3 != 0) {
        map.insert(address, fake_block(address));
        model.emplace(address, fake_block(address));
      } else {
        ASSERT_FALSE(map.erase(address));  // not live: nothing changes
      }
      if (step % 997 == 0) expect_same(map, model, universe);
    }
    expect_same(map, model, universe);
    for (const auto& [address, block] : model) ASSERT_TRUE(map.erase(address));
    EXPECT_TRUE(map.empty());
  }
}

TEST(LiveMap, GrowsPastItsInitialCapacityAndKeepsEveryEntry) {
  LiveMap map;
  std::vector<std::uintptr_t> addresses;
  for (std::uintptr_t i = 1; i <= 100000; ++i) {
    addresses.push_back(i * 512);
    map.insert(i * 512, fake_block(i * 512));
  }
  for (std::uintptr_t address : addresses) ASSERT_EQ(map.find(address), fake_block(address));
  EXPECT_EQ(map.size(), addresses.size());
  EXPECT_EQ(map.find(512 * 100001), nullptr);
}

}  // namespace
}  // namespace streamalloc

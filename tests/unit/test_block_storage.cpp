// Block memory (block_storage.cpp): a thread's deleted Blocks are its next ones, up to its spares;
// past them, and once the thread has ended, Blocks go to the heap and come back from it.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <unordered_set>
#include <vector>

#include "block.hpp"

namespace streamalloc {
namespace {

TEST(BlockStorage, AThreadsDeletedBlocksAreItsNextOnes) {
  if (block_spares_per_thread() == 0) GTEST_SKIP() << "no spares under AddressSanitizer: every Block is the heap's";
  std::vector<Block*> made;
  for (int i = 0; i < 8; ++i) {
    made.push_back(new Block);
    made.back()->address = 0x1000 * static_cast<std::uintptr_t>(i + 1);  // state the next Block must not see
    made.back()->recorded_streams.push_back(7);
  }
  const std::unordered_set<Block*> deleted(made.begin(), made.end());
  for (Block* b : made) delete b;
  for (int i = 0; i < 8; ++i) {
    Block* again = new Block;
    EXPECT_EQ(deleted.count(again), 1u) << "block " << i << " is not one this thread deleted";
    EXPECT_EQ(again->address, 0u) << "a recycled Block is constructed afresh";
    EXPECT_TRUE(again->recorded_streams.empty());
    made[static_cast<std::size_t>(i)] = again;
  }
  for (Block* b : made) delete b;
}

TEST(BlockStorage, BlocksAreCacheLineAlignedAndOutliveTheThreadThatMadeThem) {
  const std::size_t many = block_spares_per_thread() + 64;  // past the spares: some go to the heap
  std::vector<Block*> made;
  std::thread maker([&] {
    for (std::size_t i = 0; i < many; ++i) made.push_back(new Block);
    for (std::size_t i = 0; i < many / 2; ++i) {  // half back to this thread's spares, and out again
      delete made.back();
      made.pop_back();
    }
    for (std::size_t i = 0; i < many / 2; ++i) made.push_back(new Block);
  });
  maker.join();  // the maker's spares went back to the heap when it ended
  ASSERT_EQ(made.size(), many);
  const std::unordered_set<Block*> distinct(made.begin(), made.end());
  EXPECT_EQ(distinct.size(), many);
  for (Block* b : made) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % alignof(Block), 0u);
    b->size = 1;  // writable here, after its thread ended
    delete b;     // into this thread's spares, the rest to the heap
  }
}

}  // namespace
}  // namespace streamalloc

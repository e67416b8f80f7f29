// Which hot lists a miss flushes (docs/design.md, "The allocation path", step 2). A miss makes the hot
// lists of its own thread's streams join the free lists; those of streams another thread uses stay,
// unless nothing else serves: a small block takes a new 2 MiB segment first, a large one their hot
// blocks (before the device is asked for more), and under the memory cap both take their hot blocks
// rather than fail. Each thread here is a worker that lives through the test, so that its identity
// (this_thread_token) stays its own.
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"
#include "threads.hpp"
#include "streamalloc/allocator.hpp"

namespace streamalloc {
namespace {

using testing_support::Worker;

class MissHotLists : public ::testing::Test {
 protected:
  // Stream `b` makes hot `count` blocks of `size` bytes, allocated together so that they fill their
  // segment, in its hot list; from `worker` when given, else from this thread.
  std::vector<void*> hot_on_b(std::size_t size, int count, Worker* worker = nullptr) {
    std::vector<void*> blocks;
    auto make_hot = [&] {
      for (int i = 0; i < count; ++i) blocks.push_back(a().allocate(size, 0, b_));
      for (void* p : blocks) a().deallocate(p, size, 0, b_);
    };
    if (worker != nullptr) {
      worker->run(make_hot);
    } else {
      make_hot();
    }
    return blocks;
  }
  Allocator& a() { return setup_->a(); }
  std::int64_t reserved() { return setup_->stats().reserved_bytes[0].current; }
  void use_device_of(std::size_t bytes) {
    setup_ = std::make_unique<testing::SimSetup>("backend:sim,log_level:error", SimBackend::Mode::kEager, bytes);
    a_ = setup_->sim->create_stream(0);
    b_ = setup_->sim->create_stream(0);
  }
  void SetUp() override { use_device_of(256 * MiB); }

  std::unique_ptr<testing::SimSetup> setup_;
  Stream a_ = 0, b_ = 0;
};

TEST_F(MissHotLists, ASmallMissTakesANewSegmentBeforeAnotherThreadsHotBlocks) {
  Worker other;
  const std::vector<void*> hot = hot_on_b(1 * MiB, 2, &other);
  ASSERT_EQ(reserved(), 2 * MiB);
  // Nothing in the free lists fits 1 MiB: the blocks are kept in the other thread's hot list.
  void* mine = a().allocate(1 * MiB, 0, a_);
  EXPECT_EQ(reserved(), 4 * MiB) << "the miss grew a segment rather than flush the other thread's hot list";
  EXPECT_NE(mine, hot[0]);
  EXPECT_NE(mine, hot[1]);
  // The other thread's hot list is as it left it: its next allocation takes its newest hot block.
  void* again = nullptr;
  other.run([&] { again = a().allocate(1 * MiB, 0, b_); });
  EXPECT_EQ(again, hot[1]);
  ASSERT_NO_THROW(a().validate());
  other.run([&] { a().deallocate(again, 1 * MiB, 0, b_); });
  a().deallocate(mine, 1 * MiB, 0, a_);
  ASSERT_NO_THROW(a().validate());
}

TEST_F(MissHotLists, OneThreadFlushesEveryHotListBeforeGrowing) {
  const std::vector<void*> hot = hot_on_b(1 * MiB, 2);
  void* mine = a().allocate(1 * MiB, 0, a_);
  EXPECT_EQ(reserved(), 2 * MiB) << "one thread's miss takes its other stream's hot memory";
  EXPECT_TRUE(mine == hot[0] || mine == hot[1]);
  a().deallocate(mine, 1 * MiB, 0, a_);
  ASSERT_NO_THROW(a().validate());
}

TEST_F(MissHotLists, UnderTheCapASmallMissTakesAnotherThreadsHotBlock) {
  use_device_of(2 * MiB);  // room for one small segment
  Worker other;
  const std::vector<void*> hot = hot_on_b(1 * MiB, 2, &other);
  void* mine = nullptr;
  ASSERT_NO_THROW(mine = a().allocate(1 * MiB, 0, a_));
  EXPECT_EQ(reserved(), 2 * MiB);
  EXPECT_TRUE(mine == hot[0] || mine == hot[1]);
  a().deallocate(mine, 1 * MiB, 0, a_);
  ASSERT_NO_THROW(a().validate());
}

TEST_F(MissHotLists, ALargeMissTakesAnotherThreadsHotBlocksBeforeGrowing) {
  Worker other;
  hot_on_b(4 * MiB, 5, &other);  // five 4 MiB blocks fill one 20 MiB segment of the large pool
  ASSERT_EQ(reserved(), 20 * MiB);
  void* mine = a().allocate(4 * MiB, 0, a_);
  EXPECT_EQ(reserved(), 20 * MiB) << "a large miss uses hot memory of any thread before the device's";
  a().deallocate(mine, 4 * MiB, 0, a_);
  ASSERT_NO_THROW(a().validate());
}

// hot_list_mb: while the stream's hot list holds less, a small miss takes a new segment and the hot
// blocks stay; from that much on, they merge back first, as without the option.
TEST_F(MissHotLists, UnderHotListMbASmallMissKeepsTheStreamsHotBlocks) {
  for (const int mb : {3, 2}) {
    SCOPED_TRACE("hot_list_mb:" + std::to_string(mb));
    setup_ = std::make_unique<testing::SimSetup>("backend:sim,log_level:error,hot_list_mb:" + std::to_string(mb),
                                                 SimBackend::Mode::kEager, 256 * MiB);
    a_ = setup_->sim->create_stream(0);
    std::vector<void*> hot;
    for (int i = 0; i < 4; ++i) hot.push_back(a().allocate(512 * KiB, 0, a_));  // one 2 MiB segment
    for (void* p : hot) a().deallocate(p, 512 * KiB, 0, a_);
    ASSERT_EQ(reserved(), 2 * MiB);
    void* other_size = a().allocate(600 * KiB, 0, a_);  // no hot block of this size, 2 MiB hot
    void* again = a().allocate(512 * KiB, 0, a_);
    if (mb == 3) {
      EXPECT_EQ(reserved(), 4 * MiB) << "a new segment";
      EXPECT_EQ(again, hot[3]) << "the hot blocks stayed: the newest serves";
    } else {
      EXPECT_EQ(reserved(), 2 * MiB) << "the oldest hot blocks merged back before the cache grew";
    }
    a().deallocate(again, 512 * KiB, 0, a_);
    a().deallocate(other_size, 600 * KiB, 0, a_);
    ASSERT_NO_THROW(a().validate());
  }
}

}  // namespace
}  // namespace streamalloc

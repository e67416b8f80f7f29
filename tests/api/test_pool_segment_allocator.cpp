// A private pool whose segments come from a SegmentAllocator (PyTorch's MemPool(allocator=...)), on the
// simulated device: the pool's segments are reserved and released through it, other pools never touch
// it, and the refusals change nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include <string>
#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

constexpr PoolId kPool{0, 11};

// Host memory stands in for the other allocator's device memory; the blocks carved from it are never
// touched by the simulated device in these tests.
struct CountingSource {
  int reserves = 0;
  int releases = 0;
  std::map<void*, std::size_t> live;
  bool refuse = false;

  SegmentAllocator functions() {
    return {[this](int, std::size_t bytes) -> void* {
              if (refuse) return nullptr;
              ++reserves;
              void* memory = std::aligned_alloc(4096, bytes);
              live[memory] = bytes;
              return memory;
            },
            [this](int, void* ptr, std::size_t bytes) {
              ++releases;
              EXPECT_EQ(live.at(ptr), bytes) << "released with the size it was reserved with";
              live.erase(ptr);
              std::free(ptr);
            }};
  }
};

// `body` throws streamalloc::Error with `code` and `fragment` in its message.
#define EXPECT_STREAMALLOC_ERROR(body, expected_code, fragment)                       \
  do {                                                                                \
    try {                                                                             \
      body;                                                                           \
      ADD_FAILURE() << #body " did not throw";                                        \
    } catch (const Error& e) {                                                        \
      EXPECT_EQ(e.code(), expected_code) << e.what();                                 \
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what(); \
    }                                                                                 \
  } while (false)

PoolFilter any() {
  return [](Stream) { return true; };
}

TEST(PoolSegmentAllocator, ThePoolsSegmentsComeFromItAndGoBackThroughIt) {
  SimSetup s("");
  CountingSource source;
  s.a().create_or_incref_pool(0, kPool);
  s.a().set_pool_segment_allocator(0, kPool, source.functions());
  const Stream stream = s.sim->create_stream();

  s.a().begin_allocate_to_pool(0, kPool, any());
  void* first = s.a().allocate(1 * MiB, 0, stream);
  void* second = s.a().allocate(64 * MiB, 0, stream);
  s.a().end_allocate_to_pool(0, kPool);
  s.a().validate();
  EXPECT_EQ(source.reserves, 2);
  for (void* p : {first, second}) {
    std::size_t size = 0;
    void* base = s.a().segment_base(p, &size);
    ASSERT_TRUE(source.live.count(base)) << "the block's segment is the source's memory";
    EXPECT_EQ(source.live.at(base), size);
  }

  // Outside the route the default pool serves, from the backend.
  void* other = s.a().allocate(1 * MiB, 0, stream);
  EXPECT_EQ(source.reserves, 2);
  s.a().deallocate(other);

  s.a().deallocate(first);
  s.a().deallocate(second);
  s.a().empty_cache();
  EXPECT_EQ(source.releases, 0) << "a pool in use keeps its segments";
  s.a().release_pool(0, kPool);  // the route's use
  s.a().release_pool(0, kPool);  // the creator's use
  s.a().empty_cache(kPool);
  s.a().validate();
  EXPECT_EQ(source.releases, 2);
  EXPECT_TRUE(source.live.empty());
}

TEST(PoolSegmentAllocator, ASourceWithoutMemoryIsOutOfMemory) {
  SimSetup s("");
  CountingSource source;
  source.refuse = true;
  s.a().create_or_incref_pool(0, kPool);
  s.a().set_pool_segment_allocator(0, kPool, source.functions());
  s.a().begin_allocate_to_pool(0, kPool, any());
  EXPECT_STREAMALLOC_ERROR(s.a().allocate(1 * MiB, 0, s.sim->create_stream()), ErrorCode::kOutOfMemory, "");
  s.a().end_allocate_to_pool(0, kPool);
  s.a().validate();
  EXPECT_EQ(source.reserves, 0);
}

TEST(PoolSegmentAllocator, RefusedForTheDefaultPoolUnknownPoolsAndPoolsWithSegments) {
  SimSetup s("");
  CountingSource source;
  EXPECT_STREAMALLOC_ERROR(s.a().set_pool_segment_allocator(0, PoolId{}, source.functions()),
                           ErrorCode::kInvalidArgument, "");
  EXPECT_STREAMALLOC_ERROR(s.a().set_pool_segment_allocator(0, kPool, source.functions()), ErrorCode::kInvalidArgument,
                           "");
  s.a().create_or_incref_pool(0, kPool);
  EXPECT_STREAMALLOC_ERROR(s.a().set_pool_segment_allocator(0, kPool, SegmentAllocator{}), ErrorCode::kInvalidArgument,
                           "both");
  s.a().begin_allocate_to_pool(0, kPool, any());
  void* p = s.a().allocate(4096, 0, s.sim->create_stream());
  s.a().end_allocate_to_pool(0, kPool);
  EXPECT_STREAMALLOC_ERROR(s.a().set_pool_segment_allocator(0, kPool, source.functions()), ErrorCode::kInvalidArgument,
                           "already holds");
  s.a().deallocate(p);
  s.a().validate();
  EXPECT_EQ(source.reserves, 0);
}

}  // namespace
}  // namespace streamalloc::testing

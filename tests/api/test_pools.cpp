// Memory pools on the simulated device (docs/design.md, "Pools"): routing, isolation, the pool life
// cycle, use_on_oom and no_split, the capture rule for uses recorded during a capture, and checkpoints.
// validate() runs after every step that changes the cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "sim_fixture.hpp"
#include "streamalloc/report.hpp"

namespace streamalloc::testing {
namespace {

constexpr std::size_t kBig = 64 * MiB;  // own segment: deterministic addresses
constexpr PoolId kGraphPool{7, 0};
constexpr PoolId kOtherPool{0, 3};

PoolId pool_of(Allocator& a, const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  for (const SegmentInfo& s : a.segments(0)) {
    if (address >= s.address && address < s.address + s.total_size) return s.pool;
  }
  ADD_FAILURE() << "no segment holds " << ptr;
  return PoolId{};
}

const PoolInfo* find_info(const std::vector<PoolInfo>& pools, PoolId id) {
  for (const PoolInfo& p : pools) {
    if (p.id == id) return &p;
  }
  return nullptr;
}

PoolFilter only(Stream wanted) {
  return [wanted](Stream s) { return s == wanted; };
}

TEST(Pools, RoutedAllocationsComeFromThePoolAndOthersFromTheDefault) {
  SimSetup s("");
  const Stream graph = s.sim->create_stream();
  const Stream eager = s.sim->create_stream();
  s.a().begin_allocate_to_pool(0, kGraphPool, only(graph));
  void* in_pool = s.a().allocate(4096, 0, graph);
  void* outside = s.a().allocate(4096, 0, eager);
  s.a().validate();
  EXPECT_EQ(pool_of(s.a(), in_pool), kGraphPool);
  EXPECT_TRUE(pool_of(s.a(), outside).is_default());
  EXPECT_EQ(s.a().pool_use_count(0, kGraphPool), 1) << "the route holds a use";
  const auto pools = s.a().pools(0);
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_TRUE(pools[0].id.is_default());
  const PoolInfo* info = find_info(pools, kGraphPool);
  ASSERT_NE(info, nullptr);
  EXPECT_TRUE(info->routed);
  EXPECT_EQ(info->segments, 1u);
  EXPECT_EQ(info->live_blocks, 1u);
  EXPECT_EQ(info->allocated_bytes, 4096u);
  s.a().deallocate(in_pool);
  s.a().deallocate(outside);
  s.a().end_allocate_to_pool(0, kGraphPool);
  s.a().validate();
}

TEST(Pools, RoutesAreConsultedNewestFirstAndTheFilterRunsOnTheAllocatingThread) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  std::atomic<std::thread::id> filter_thread{};
  s.a().begin_allocate_to_pool(0, kGraphPool, [](Stream) { return true; });
  s.a().begin_allocate_to_pool(0, kOtherPool, [&](Stream) {
    filter_thread = std::this_thread::get_id();
    return true;
  });
  void* p = nullptr;
  std::thread worker([&] { p = s.a().allocate(512, 0, st); });
  const std::thread::id worker_id = worker.get_id();
  worker.join();
  EXPECT_EQ(filter_thread.load(), worker_id);
  EXPECT_EQ(pool_of(s.a(), p), kOtherPool) << "the newest route wins";
  s.a().end_allocate_to_pool(0, kOtherPool);
  void* q = s.a().allocate(512, 0, st);
  EXPECT_EQ(pool_of(s.a(), q), kGraphPool);
  s.a().end_allocate_to_pool(0, kGraphPool);
  void* r = s.a().allocate(512, 0, st);
  EXPECT_TRUE(pool_of(s.a(), r).is_default());
  for (void* x : {p, q, r}) s.a().deallocate(x);
  s.a().validate();
}

TEST(Pools, ABlockFreedInAPoolIsNeverHandedToAnAllocationOutsideIt) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  s.a().begin_allocate_to_pool(0, kGraphPool, only(st));
  void* captured = s.a().allocate(kBig, 0, st);
  s.a().deallocate(captured);
  s.a().end_allocate_to_pool(0, kGraphPool);
  void* eager = s.a().allocate(kBig, 0, st);
  EXPECT_NE(eager, captured) << "same size, same stream, but the pool's block stays in the pool";
  EXPECT_TRUE(pool_of(s.a(), eager).is_default());
  s.a().empty_cache();
  EXPECT_EQ(s.a().pools(0).at(1).segments, 1u) << "a pool with uses keeps its free segments";
  s.a().begin_allocate_to_pool(0, kGraphPool, only(st));
  EXPECT_EQ(s.a().allocate(kBig, 0, st), captured) << "the pool's next allocation reuses it";
  s.a().validate();
}

TEST(Pools, AReleasedPoolIsFreeableAndEmptyCacheErasesIt) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  s.a().create_or_incref_pool(0, kOtherPool);
  s.a().begin_allocate_to_pool(0, kOtherPool, only(st));
  EXPECT_EQ(s.a().pool_use_count(0, kOtherPool), 2);
  void* live = s.a().allocate(kBig, 0, st);
  void* freed = s.a().allocate(kBig, 0, st);
  s.a().deallocate(freed);
  s.a().end_allocate_to_pool(0, kOtherPool);
  s.a().release_pool(0, kOtherPool);
  s.a().empty_cache(kOtherPool);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(2 * kBig)) << "the pool has a use left";
  s.a().release_pool(0, kOtherPool);
  EXPECT_EQ(s.a().pool_use_count(0, kOtherPool), 0);
  s.a().empty_cache(kOtherPool);
  s.a().validate();
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(kBig)) << "the live block's segment stays";
  ASSERT_NE(find_info(s.a().pools(0), kOtherPool), nullptr) << "a pool with a segment is not erased";
  s.a().deallocate(live);
  s.a().empty_cache();  // the default pool's empty_cache covers freeable pools too
  s.a().validate();
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
  EXPECT_EQ(find_info(s.a().pools(0), kOtherPool), nullptr);
  EXPECT_EQ(s.sim->reserved_bytes(0), 0u);
}

TEST(Pools, MisuseIsRefusedAndChangesNothing) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  EXPECT_THROW(s.a().create_or_incref_pool(0, PoolId{}), Error);
  EXPECT_THROW(s.a().begin_allocate_to_pool(0, PoolId{}, only(st)), Error);
  EXPECT_THROW(s.a().begin_allocate_to_pool(0, kGraphPool, nullptr), Error);
  EXPECT_THROW(s.a().release_pool(0, kGraphPool), Error) << "no such pool";
  EXPECT_THROW(s.a().end_allocate_to_pool(0, kGraphPool), Error) << "no route";
  EXPECT_THROW(s.a().set_pool_no_split(0, kGraphPool), Error);
  EXPECT_THROW(s.a().begin_allocate_to_pool(1, kGraphPool, only(st)), Error) << "no device 1";
  EXPECT_EQ(s.a().pools(0).size(), 1u);
  s.a().begin_allocate_to_pool(0, kGraphPool, only(st));
  EXPECT_THROW(s.a().begin_allocate_to_pool(0, kGraphPool, only(st)), Error) << "already routed";
  EXPECT_EQ(s.a().pool_use_count(0, kGraphPool), 1);
  s.a().end_allocate_to_pool(0, kGraphPool);
  s.a().release_pool(0, kGraphPool);
  EXPECT_THROW(s.a().release_pool(0, kGraphPool), Error) << "no use left";
  EXPECT_EQ(s.a().pool_use_count(0, kGraphPool), 0);
  // A filter that throws: the allocation fails before anything changes.
  s.a().begin_allocate_to_pool(0, kOtherPool, [](Stream) -> bool { throw Error(ErrorCode::kBackend, "filter"); });
  EXPECT_THROW(s.a().allocate(512, 0, st), Error);
  EXPECT_EQ(s.stats().allocation[0].current, 0);
  s.a().validate();
}

TEST(Pools, NoSplitHandsOutWholeBlocks) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  s.a().create_or_incref_pool(0, kGraphPool);
  s.a().set_pool_no_split(0, kGraphPool);
  s.a().begin_allocate_to_pool(0, kGraphPool, only(st));
  void* a = s.a().allocate(512, 0, st);
  void* b = s.a().allocate(512, 0, st);
  for (const BlockInfo& info : s.a().blocks(0)) {
    if (info.address == reinterpret_cast<std::uintptr_t>(a)) {
      EXPECT_EQ(info.size, 2 * MiB);
    }
  }
  EXPECT_EQ(s.a().pools(0).at(1).segments, 2u);
  s.a().deallocate(a);
  s.a().deallocate(b);
  s.a().validate();
}

TEST(Pools, UseOnOomLetsTheDefaultPoolTakeAPoolsFreeBlock) {
  for (bool use_on_oom : {false, true}) {
    SimSetup s("", SimBackend::Mode::kManual, 256 * MiB);
    const Stream st = s.sim->create_stream();
    s.a().create_or_incref_pool(0, kOtherPool);
    s.a().set_pool_use_on_oom(0, kOtherPool, use_on_oom);
    s.a().begin_allocate_to_pool(0, kOtherPool, only(st));
    void* pooled = s.a().allocate(192 * MiB, 0, st);
    s.a().deallocate(pooled);
    s.a().end_allocate_to_pool(0, kOtherPool);
    if (!use_on_oom) {
      EXPECT_THROW(s.a().allocate(100 * MiB, 0, st), Error);
    } else {
      void* p = s.a().allocate(100 * MiB, 0, st);
      EXPECT_EQ(pool_of(s.a(), p), kOtherPool) << "served from the pool's free block";
      s.a().deallocate(p);
    }
    s.a().validate();
  }
}

// The capture rule: during a capture nothing is recorded on or asked of a capturing stream, and nothing
// is freed; a free with a use on a side stream that joined the capture stays pending until the capture
// ends, and the use recorded during the capture is then dropped (the graph orders it), while a use on a
// stream that does not capture is fenced as usual, during the capture too.
TEST(Pools, UsesRecordedDuringACaptureAreDroppedWhenItEnds) {
  SimSetup s("");
  const Stream capture = s.sim->create_stream();
  const Stream side = s.sim->create_stream();
  const Stream before = s.sim->create_stream();
  void* eager = s.a().allocate(kBig, 0, capture);  // default pool, used on `before` ahead of the capture
  s.a().record_stream(eager, before);
  s.sim->enqueue(0, before, [] {});  // `before` is busy
  s.a().begin_allocate_to_pool(0, kGraphPool, [&](Stream st) { return s.sim->is_capturing(0, st); });
  s.sim->set_capturing(0, capture, true);
  s.sim->set_capturing(0, side, true);
  void* captured = s.a().allocate(kBig, 0, capture);
  s.a().record_stream(captured, side);
  s.a().record_stream(eager, side);
  s.a().deallocate(captured);
  s.a().deallocate(eager);
  void* again = s.a().allocate(kBig, 0, capture);  // a miss during capture: grows the pool
  s.a().process_fences();
  s.a().empty_cache();
  s.a().validate();
  EXPECT_NE(again, captured) << "pending until the capture ends";
  EXPECT_EQ(s.stats().pending_blocks.current, 2);
  EXPECT_EQ(s.sim->counters().event_records, 1u) << "a fence on `before` alone: it does not capture";
  EXPECT_EQ(s.sim->counters().capture_violations, 0u);

  s.sim->set_capturing(0, capture, false);
  s.sim->set_capturing(0, side, false);
  s.a().end_allocate_to_pool(0, kGraphPool);
  s.a().validate();
  EXPECT_EQ(s.stats().pending_blocks.current, 1) << "the captured block waited only on its capture use";
  for (const BlockInfo& info : s.a().blocks(0)) {
    if (info.address == reinterpret_cast<std::uintptr_t>(eager)) {
      EXPECT_EQ(info.state, BlockInfo::State::kPendingFree);
      EXPECT_EQ(info.recorded_streams, std::vector<Stream>{before}) << "the capture use was dropped";
    }
  }
  s.sim->synchronize_all();
  s.a().process_fences();
  s.sim->synchronize_all();
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  s.a().deallocate(again);
  s.a().validate();
}

TEST(Pools, CheckpointRestoreRecreatesTheLayoutAndItsLiveBlocks) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  s.a().begin_allocate_to_pool(0, kGraphPool, only(st));
  void* a = s.a().allocate(1 * MiB, 0, st);
  void* b = s.a().allocate(3 * MiB, 0, st);
  void* c = s.a().allocate(2 * MiB, 0, st);
  s.a().deallocate(b);
  const PoolCheckpoint saved = s.a().checkpoint_pool(0, kGraphPool);
  ASSERT_FALSE(saved.segments.empty());
  EXPECT_TRUE(s.a().pool_live_blocks_are(0, kGraphPool, {a, c}));
  s.a().deallocate(a);
  void* d = s.a().allocate(4 * MiB, 0, st);
  EXPECT_FALSE(s.a().pool_live_blocks_are(0, kGraphPool, {a, c}));
  s.a().validate();

  const PoolRestore restored = s.a().restore_pool(saved);
  s.a().validate();
  std::vector<void*> freed = restored.freed;
  std::sort(freed.begin(), freed.end());
  std::vector<void*> live_before{c, d};
  std::sort(live_before.begin(), live_before.end());
  EXPECT_EQ(freed, live_before) << "every block live before the restore is freed";
  std::vector<void*> allocated = restored.allocated;
  std::sort(allocated.begin(), allocated.end());
  std::vector<void*> saved_live{a, c};
  std::sort(saved_live.begin(), saved_live.end());
  EXPECT_EQ(allocated, saved_live) << "the checkpoint's live blocks are live again, at the same addresses";
  EXPECT_TRUE(s.a().pool_live_blocks_are(0, kGraphPool, {a, c}));
  EXPECT_EQ(s.a().requested_size_of(a), 1 * MiB);
  EXPECT_EQ(s.stats().allocation[0].current, 2);

  // The same layout again: a second restore is idempotent.
  s.a().restore_pool(saved);
  s.a().validate();
  EXPECT_TRUE(s.a().pool_live_blocks_are(0, kGraphPool, {a, c}));
  s.a().deallocate(a);
  s.a().deallocate(c);
  s.a().end_allocate_to_pool(0, kGraphPool);
  s.a().release_pool(0, kGraphPool);
  s.a().empty_cache();
  s.a().validate();
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
}

TEST(Pools, ARestoreThatCannotApplyIsRefusedBeforeAnythingChanges) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  s.a().begin_allocate_to_pool(0, kGraphPool, only(st));
  void* a = s.a().allocate(kBig, 0, st);
  PoolCheckpoint saved = s.a().checkpoint_pool(0, kGraphPool);

  PoolCheckpoint wrong_segment = saved;
  wrong_segment.segments[0].address += 512;
  EXPECT_THROW(s.a().restore_pool(wrong_segment), Error);
  PoolCheckpoint gap = saved;
  gap.segments[0].blocks[0].size -= 512;
  EXPECT_THROW(s.a().restore_pool(gap), Error);
  PoolCheckpoint other_pool = saved;
  other_pool.pool = kOtherPool;
  EXPECT_THROW(s.a().restore_pool(other_pool), Error);
  s.sim->set_capturing(0, st, true);
  EXPECT_THROW(s.a().restore_pool(saved), Error) << "not during a capture";
  s.sim->set_capturing(0, st, false);
  EXPECT_EQ(s.a().blocks(0).size(), 1u);
  EXPECT_TRUE(s.a().pool_live_blocks_are(0, kGraphPool, {a}));
  EXPECT_EQ(s.stats().allocation[0].current, 1);
  s.a().validate();
}

TEST(Pools, SnapshotsCarryEachSegmentsPool) {
  SimSetup s("");
  const Stream st = s.sim->create_stream();
  s.a().begin_allocate_to_pool(0, kGraphPool, only(st));
  void* p = s.a().allocate(4096, 0, st);
  s.a().end_allocate_to_pool(0, kGraphPool);
  void* q = s.a().allocate(4096, 0, st);
  const std::vector<SegmentInfo> read = segments_from_snapshot_json(s.a().snapshot_json());
  ASSERT_EQ(read.size(), 2u);
  std::vector<PoolId> pools{read[0].pool, read[1].pool};
  EXPECT_NE(std::find(pools.begin(), pools.end(), kGraphPool), pools.end());
  EXPECT_NE(std::find(pools.begin(), pools.end(), PoolId{}), pools.end());
  const std::string stats = s.a().stats_json(0);
  EXPECT_NE(stats.find("\"pools\""), std::string::npos);
  s.a().deallocate(p);
  s.a().deallocate(q);
}

}  // namespace
}  // namespace streamalloc::testing

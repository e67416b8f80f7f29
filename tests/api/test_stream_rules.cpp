// The stream rules of docs/design.md ("Stream rules"; a RuleN_ test checks rule N), on the simulated
// device in manual mode, where the test decides when each stream's work runs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "sim_fixture.hpp"

namespace streamalloc::testing {
namespace {

constexpr std::size_t kBig = 64 * MiB;  // own segment: deterministic addresses

TEST(StreamRules, Rule1_MallocIsSafeForItsStreamAndAligned) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(1000, 0, a);
  void* q = s.a().allocate(1000, 0, a);
  ASSERT_NE(p, nullptr);
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
  EXPECT_NE(p, q);
  EXPECT_EQ(s.a().allocate(0, 0, a), nullptr) << "size 0 returns nullptr";
  EXPECT_EQ(s.a().requested_size_of(p), 1000u);
  s.a().validate();
}

TEST(StreamRules, Rule2_RecordStreamCountsMisuseWithoutFailing) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(4096, 0, a);
  s.a().record_stream(p, a);  // the allocation stream: no-op
  s.a().record_stream(p, b);
  s.a().record_stream(p, b);  // duplicate
  int on_stack = 0;
  s.a().record_stream(&on_stack, b);  // not ours
  EXPECT_EQ(s.sim->counters().event_records, 0u) << "record_stream records no event by itself";
  s.a().deallocate(p, 4096, 0, a);
  s.a().record_stream(p, b);  // too late
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.record_stream_calls, 5);
  EXPECT_EQ(st.record_stream_on_alloc_stream, 1);
  EXPECT_EQ(st.record_stream_duplicate, 1);
  EXPECT_EQ(st.record_stream_unknown_ptr, 2);
  s.a().validate();
}

TEST(StreamRules, Rule3_FreeWithoutUsesIsReusedAtOnceOnItsStream) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.sim->enqueue(0, a, [] {});  // the stream is busy: still fine for its own later work
  s.a().deallocate(p, kBig, 0, a);
  EXPECT_EQ(s.a().allocate(kBig, 0, a), p);
  EXPECT_EQ(s.sim->counters().event_records, 0u);
  s.a().validate();
}

TEST(StreamRules, Rule3_PendingBlockIsNotReusedBeforeItsFence) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.sim->enqueue(0, u, [] {});  // consumer work that still uses the block
  s.a().record_stream(p, u);
  s.a().deallocate(p, kBig, 0, a);
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  void* q = s.a().allocate(kBig, 0, a);
  EXPECT_NE(q, p) << "handed out while the consumer stream had not passed its fence";
  s.a().validate();
  s.sim->synchronize_stream(0, u);
  s.a().deallocate(q, kBig, 0, a);
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  void* r = s.a().allocate(kBig, 0, a);
  void* r2 = s.a().allocate(kBig, 0, a);
  EXPECT_TRUE(r == p || r2 == p) << "released after the fence";
  s.a().validate();
}

// PyTorch's record_stream contract: a block recorded on a busy stream is not handed out again on its
// allocation stream while that stream works, and the allocation after a host sync gets it back.
TEST(StreamRules, Rule3_RecordedBlockComesBackAfterTheBusyStreamIsSynchronized) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.a().record_stream(p, b);
  s.sim->enqueue(0, b, [] {});  // b is busy with work that uses the block
  s.a().deallocate(p, kBig, 0, a);
  void* q = s.a().allocate(kBig, 0, a);
  EXPECT_NE(q, p) << "handed out while b still works";
  s.sim->synchronize_stream(0, b);  // stream.synchronize()
  void* r = s.a().allocate(kBig, 0, a);
  EXPECT_EQ(r, p) << "not handed back by the first allocation after the sync";
  EXPECT_EQ(s.stats().segment[0].current, 2);
  s.a().validate();
}

// As PyTorch's allocator with small tensors: the block pending on b sits next to free space of its
// segment, so after the sync a cached block could serve the allocation; the pending block, now safe, is
// still the one handed back (the allocation polls pending blocks once per coarse clock tick).
TEST(StreamRules, Rule3_ASmallRecordedBlockComesBackAfterTheSyncThoughCachedSpaceCouldServe) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(16, 0, a);
  s.a().record_stream(p, b);
  s.sim->enqueue(0, b, [] {});  // b is busy with work that uses the block
  s.a().deallocate(p, 16, 0, a);
  void* q = s.a().allocate(16, 0, a);
  EXPECT_NE(q, p) << "handed out while b still works";
  s.sim->synchronize_stream(0, b);
  std::this_thread::sleep_for(std::chrono::milliseconds(25));  // past a tick of the coarse clock
  void* r = s.a().allocate(16, 0, a);
  EXPECT_EQ(r, p) << "a larger cached block was carved instead of the pending block made safe by the sync";
  EXPECT_EQ(s.stats().segment[0].current, 1);
  s.a().validate();
}

// As PyTorch's allocator, whose every allocation polls its events: after the sync, an allocation that
// the stream's hot list serves on the fast path still releases the pending block first, so that the
// stats count it inactive (the fast path leaves one allocation per coarse clock tick to the
// device-locked path while blocks are pending).
TEST(StreamRules, Rule3_AnAllocationServedHotAfterTheSyncReleasesThePendingBlock) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* hot = s.a().allocate(1024, 0, a);
  s.a().deallocate(hot, 1024, 0, a);  // kept in a's hot list
  void* p = s.a().allocate(kBig, 0, a);
  for (int i = 0; i < 3; ++i) s.a().deallocate(s.a().allocate(1024, 0, a), 1024, 0, a);  // on the fast path
  s.a().record_stream(p, b);
  s.sim->enqueue(0, b, [] {});  // b is busy with work that uses the block
  s.a().deallocate(p, kBig, 0, a);
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  s.sim->synchronize_stream(0, b);
  std::this_thread::sleep_for(std::chrono::milliseconds(25));  // past a tick of the coarse clock
  const DeviceStats before = s.stats();
  EXPECT_EQ(s.a().allocate(1024, 0, a), hot) << "served from the hot list";
  const DeviceStats after = s.stats();
  EXPECT_EQ(after.allocations_device_locked, before.allocations_device_locked + 1) << "the poll was due";
  EXPECT_EQ(after.pending_blocks.current, 0) << "the pending block was not released by the allocation";
  EXPECT_EQ(after.active_bytes[0].current, 1024);
  s.a().deallocate(hot, 1024, 0, a);
  s.a().validate();
}

// The same when the free's batch is still open at the host sync (a fence of b was in flight when the
// block was freed, so the free recorded no event): the allocation that misses after the sync finds b
// idle and releases the batch without recording an event that the sync would not have covered.
TEST(StreamRules, Rule4_ABatchOpenAtAHostSyncIsReleasedByTheNextMiss) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p0 = s.a().allocate(kBig, 0, a);
  void* p = s.a().allocate(kBig, 0, a);
  void* spare = s.a().allocate(kBig, 0, a);
  s.a().record_stream(p0, b);
  s.a().record_stream(p, b);
  s.sim->enqueue(0, b, [] {});  // b is busy
  s.a().deallocate(spare, kBig, 0, a);
  s.a().deallocate(p0, kBig, 0, a);  // fences at once: b's fence goes in flight behind the work
  s.a().deallocate(p, kBig, 0, a);   // joins b's open batch: a fence is in flight
  EXPECT_EQ(s.sim->counters().event_records, 1u);
  void* q = s.a().allocate(kBig, 0, a);  // served by the spare block, without a miss
  EXPECT_EQ(q, spare);
  s.sim->synchronize_stream(0, b);  // runs the work and b's fence; the open batch has no event
  void* r1 = s.a().allocate(kBig, 0, a);
  void* r2 = s.a().allocate(kBig, 0, a);
  EXPECT_TRUE((r1 == p0 && r2 == p) || (r1 == p && r2 == p0)) << "both pending blocks come back";
  EXPECT_EQ(s.stats().segment[0].current, 3) << "no new segment";
  EXPECT_EQ(s.stats().fences_skipped_idle, 1);
  EXPECT_EQ(s.sim->queued_items(0, b), 0u) << "no event recorded on b for its batch";
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  s.a().validate();
}

// A busy stream is asked, found busy, and fenced as before.
TEST(StreamRules, Rule4_ABusyStreamsBatchIsFencedNotReleased) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p0 = s.a().allocate(kBig, 0, a);
  void* p = s.a().allocate(kBig, 0, a);
  s.a().record_stream(p0, b);
  s.a().record_stream(p, b);
  s.sim->enqueue(0, b, [] {});
  s.a().deallocate(p0, kBig, 0, a);
  s.a().deallocate(p, kBig, 0, a);       // open batch behind the fence in flight
  s.sim->advance(0, b, 2);               // the work and the first fence run; b is idle...
  s.sim->enqueue(0, b, [] {});           // ...and busy again, so the batch needs a fence of its own
  void* q = s.a().allocate(kBig, 0, a);  // a miss: p0 comes back, p must not
  EXPECT_EQ(q, p0);
  EXPECT_EQ(s.stats().fences_skipped_idle, 0);
  EXPECT_EQ(s.stats().pending_blocks.current, 1);
  EXPECT_GE(s.sim->counters().stream_queries, 1u);
  s.a().validate();
}

TEST(StreamRules, Rule4_OneEventCoversABatchOfFrees) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  std::vector<void*> blocks;
  for (int i = 0; i < 50; ++i) {
    void* p = s.a().allocate(4096, 0, a);
    s.a().record_stream(p, u);
    blocks.push_back(p);
  }
  for (void* p : blocks) s.a().deallocate(p, 4096, 0, a);
  EXPECT_EQ(s.stats().pending_blocks.current, 50);
  // The first free fences at once (no fence of u was in flight); the other 49 share the next event.
  EXPECT_EQ(s.sim->counters().event_records, 1u);
  s.a().process_fences();
  // One more fence on u for the 49, and one on the allocation stream to settle them all: 3 events for
  // 50 frees, where PyTorch's native allocator records 50.
  EXPECT_EQ(s.sim->counters().event_records, 3u);
  EXPECT_EQ(s.stats().fences_recorded, 3);
  s.sim->synchronize_all();
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  s.a().validate();
}

TEST(StreamRules, Rule4_ASlowStreamDoesNotHoldUpAnother) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream slow = s.sim->create_stream();
  const Stream fast = s.sim->create_stream();
  void* p_slow = s.a().allocate(kBig, 0, a);
  void* p_fast = s.a().allocate(kBig, 0, a);
  s.sim->enqueue(0, slow, [] {});
  s.a().record_stream(p_slow, slow);
  s.a().record_stream(p_fast, fast);
  s.a().deallocate(p_slow, kBig, 0, a);
  s.a().deallocate(p_fast, kBig, 0, a);
  s.a().process_fences();  // records fences; `fast` is idle but manual: advance it
  s.sim->synchronize_stream(0, fast);
  s.a().process_fences();
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.pending_blocks.current, 1);
  EXPECT_EQ(st.per_stream.at(slow).pending_blocks.current, 1);
  EXPECT_EQ(st.per_stream.at(fast).pending_blocks.current, 0);
  EXPECT_EQ(s.a().allocate(kBig, 0, a), p_fast);
  s.a().validate();
}

TEST(StreamRules, Rule5_SettledBlocksMoveAcrossStreamsWithoutHostSync) {
  SimSetup s("cross_stream_reuse:settled");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.a().deallocate(p, kBig, 0, a);
  s.a().process_fences();           // closes a's batch
  s.sim->synchronize_stream(0, a);  // the device passes the fence
  void* q = s.a().allocate(kBig, 0, b);
  EXPECT_EQ(q, p) << "a settled block serves another stream";
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.cross_stream_reuse_settled, 1);
  EXPECT_EQ(st.segment[0].current, 1) << "no new segment";
  EXPECT_EQ(s.sim->counters().event_synchronizes, 0u) << "no host sync";
  EXPECT_EQ(s.sim->counters().stream_waits, 0u) << "no new dependency between streams";
  s.a().validate();
}

TEST(StreamRules, Rule5_UnsettledBlocksStayWithTheirStream) {
  SimSetup s("cross_stream_reuse:settled");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.sim->enqueue(0, a, [] {});  // a is busy: its fence cannot complete
  s.a().deallocate(p, kBig, 0, a);
  void* q = s.a().allocate(kBig, 0, b);
  EXPECT_NE(q, p);
  EXPECT_EQ(s.stats().cross_stream_reuse_settled, 0);
  s.a().validate();
}

TEST(StreamRules, Rule5_NeverPolicyKeepsSettledBlocksWithTheirStream) {
  SimSetup s("cross_stream_reuse:never");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.a().deallocate(p, kBig, 0, a);
  s.a().process_fences();
  s.sim->synchronize_all();
  s.a().process_fences();
  EXPECT_NE(s.a().allocate(kBig, 0, b), p);
  EXPECT_EQ(s.stats().segment[0].current, 2) << "native behaviour: a new segment per stream";
  s.a().validate();
}

TEST(StreamRules, Rule5_WaitPolicyOrdersTheNewStreamOnTheGpu) {
  // The device fits exactly one 64 MiB segment, so the second stream must reuse the first's block.
  SimSetup s("cross_stream_reuse:wait", SimBackend::Mode::kManual, kBig + 8 * MiB);
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  auto* p = static_cast<unsigned char*>(s.a().allocate(kBig, 0, a));
  enqueue_fill(*s.sim, a, p, 16, 0xAA);  // the old owner's last write, not yet run
  s.a().deallocate(p, kBig, 0, a);
  auto* q = static_cast<unsigned char*>(s.a().allocate(kBig, 0, b));
  ASSERT_EQ(q, p);
  EXPECT_EQ(s.stats().cross_stream_reuse_waited, 1);
  EXPECT_EQ(s.sim->counters().stream_waits, 1u);
  EXPECT_EQ(s.sim->counters().event_synchronizes, 0u) << "no host sync";
  enqueue_fill(*s.sim, b, q, 16, 0xBB);  // the new owner's first write
  EXPECT_EQ(s.sim->advance(0, b, 10), 0u) << "b waits for a's fence";
  s.sim->synchronize_stream(0, b);
  EXPECT_EQ(q[0], 0xBB) << "the new owner's write landed after the old owner's";
  s.a().validate();
}

TEST(StreamRules, Rule5_OomPathSynchronizesFencesAndRetries) {
  SimSetup s("cross_stream_reuse:settled", SimBackend::Mode::kManual, kBig + 8 * MiB);
  const Stream a = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.sim->enqueue(0, u, [] {});
  s.a().record_stream(p, u);
  s.a().deallocate(p, kBig, 0, a);
  void* q = s.a().allocate(kBig, 0, a);  // only possible after a host sync on u's fence
  EXPECT_EQ(q, p);
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_sync_all_streams, 1);
  EXPECT_GE(st.fences_synced_host, 1);
  EXPECT_EQ(s.sim->queued_items(0, u), 0u) << "the host wait let the device finish u's work";
  s.a().validate();
}

TEST(StreamRules, Rule5_OomPathReleasesCachedSegmentsOfOtherSizes) {
  SimSetup s("", SimBackend::Mode::kManual, 100 * MiB);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  s.a().deallocate(p, kBig, 0, a);
  void* q = s.a().allocate(80 * MiB, 0, a);  // needs the 64 MiB segment back from the cache
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(s.stats().num_device_free, 1);
  EXPECT_EQ(s.stats().reserved_bytes[0].current, static_cast<std::int64_t>(80 * MiB));
  s.a().validate();
}

TEST(StreamRules, Rule5_OutOfMemoryReportsTheNumbersAndLosesNothing) {
  SimSetup s("", SimBackend::Mode::kManual, 100 * MiB);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(kBig, 0, a);
  try {
    s.a().allocate(kBig, 0, a);
    FAIL() << "expected out of memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("64.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
    EXPECT_NE(msg.find("What to do"), std::string::npos) << msg;
  }
  EXPECT_EQ(s.stats().num_ooms, 1);
  s.a().validate();
  s.a().deallocate(p, kBig, 0, a);
  EXPECT_NE(s.a().allocate(kBig, 0, a), nullptr) << "works again after freeing";
  s.a().validate();
}

// A capturing stream gets no fence and is never queried; a free that waits on it stays pending until
// the capture has ended. The host waits and releases of empty_cache wait for that end too.
TEST(StreamRules, Rule6_NothingIsRecordedOnOrAskedOfACapturingStream) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  s.sim->set_capturing(0, a, true);
  void* p = s.a().allocate(kBig, 0, b);
  s.a().record_stream(p, a);
  s.a().deallocate(p, kBig, 0, b);
  void* q = s.a().allocate(kBig, 0, b);  // a miss: polls, records nothing on `a`
  s.a().process_fences();
  s.a().empty_cache();
  EXPECT_NE(q, p);
  // The simulated device refuses, and counts, a record on or a query of a capturing stream.
  EXPECT_EQ(s.sim->counters().capture_violations, 0u);
  EXPECT_EQ(s.stats().frees_deferred_capture, 1);
  EXPECT_EQ(s.stats().pending_blocks.current, 1) << "the free waits for the capture to end";
  s.sim->set_capturing(0, a, false);
  s.a().process_fences();
  s.sim->synchronize_all();
  s.a().process_fences();
  EXPECT_EQ(s.stats().pending_blocks.current, 0);
  s.a().deallocate(q, kBig, 0, b);
  s.a().validate();
}

// A capture on one stream does not hold up the fences of the others: they are recorded and queried in
// relaxed capture mode, which the capture allows (global mode would break it: the simulated device
// refuses those queries and counts a violation). The calling thread's mode is restored afterwards.
TEST(StreamRules, Rule6_OtherStreamsAreFencedWhileAStreamCaptures) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream b = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  s.sim->set_capturing(0, a, true);
  void* p = s.a().allocate(kBig, 0, b);
  s.a().record_stream(p, u);
  s.sim->enqueue(0, u, [] {});  // `u` is busy
  s.a().deallocate(p, kBig, 0, b);
  EXPECT_EQ(s.sim->counters().event_records, 1u) << "the free fenced `u`, which does not capture";
  void* q = s.a().allocate(kBig, 0, b);
  EXPECT_NE(q, p) << "u has not passed its fence";
  s.sim->synchronize_all();
  void* r = s.a().allocate(kBig, 0, b);
  EXPECT_EQ(r, p) << "u passed its fence: the block is back while `a` still captures";
  EXPECT_EQ(s.stats().frees_deferred_capture, 0);
  EXPECT_EQ(s.sim->counters().capture_violations, 0u);
  EXPECT_THROW(s.sim->query_stream(0, u), Error) << "this thread is back in global capture mode";
  EXPECT_EQ(s.sim->counters().capture_violations, 1u);
  s.sim->set_capturing(0, a, false);
  s.a().deallocate(q, kBig, 0, b);
  s.a().deallocate(r, kBig, 0, b);
  s.a().validate();
}

TEST(StreamRules, SplitAndMergeKeepSegmentsTiled) {
  SimSetup s("", SimBackend::Mode::kEager);
  const Stream a = s.sim->create_stream();
  void* x = s.a().allocate(1000, 0, a);
  void* y = s.a().allocate(1000, 0, a);
  void* z = s.a().allocate(1000, 0, a);
  EXPECT_EQ(s.stats().segment[0].current, 1);
  EXPECT_EQ(s.a().segments(0).at(0).blocks.size(), 4u);  // x, y, z and the rest
  s.a().deallocate(y, 1000, 0, a);
  EXPECT_EQ(s.stats().inactive_split[0].current, 2);
  s.a().validate();
  s.a().deallocate(x, 1000, 0, a);
  s.a().deallocate(z, 1000, 0, a);
  s.a().validate();
  // Freed blocks are owned by `a` until its fence settles them; then they merge with the settled rest.
  s.a().process_fences();
  s.a().validate();
  EXPECT_EQ(s.a().segments(0).at(0).blocks.size(), 1u) << "free neighbours merged back";
  EXPECT_EQ(s.stats().inactive_split[0].current, 0);
}

TEST(StreamRules, EmptyCacheReleasesEverythingFree) {
  SimSetup s("", SimBackend::Mode::kManual);
  const Stream a = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  void* keep = s.a().allocate(4096, 0, a);
  void* p = s.a().allocate(kBig, 0, a);
  void* r = s.a().allocate(12 * MiB, 0, a);
  s.sim->enqueue(0, u, [] {});
  s.a().record_stream(r, u);
  s.a().deallocate(p, kBig, 0, a);
  s.a().deallocate(r, 12 * MiB, 0, a);
  s.a().empty_cache();
  const DeviceStats st = s.stats();
  EXPECT_EQ(st.reserved_bytes[0].current, static_cast<std::int64_t>(2 * MiB)) << "only the live block's segment";
  EXPECT_EQ(st.pending_blocks.current, 0);
  EXPECT_EQ(s.sim->reserved_bytes(0), 2 * MiB);
  s.a().deallocate(keep, 4096, 0, a);
  s.a().validate();
}

TEST(StreamRules, MemoryFractionCapsReservation) {
  SimSetup s("memory_fraction:0.5", SimBackend::Mode::kEager, 128 * MiB);
  const Stream a = s.sim->create_stream();
  EXPECT_THROW(s.a().allocate(80 * MiB, 0, a), Error);
  s.a().set_memory_fraction(1.0, 0);
  void* p = s.a().allocate(80 * MiB, 0, a);
  EXPECT_NE(p, nullptr);
  s.a().deallocate(p, 0, 0, a);
  s.a().set_memory_fraction(0.25, 0);  // lowering the cap releases cached segments
  EXPECT_EQ(s.stats().reserved_bytes[0].current, 0);
  EXPECT_DOUBLE_EQ(s.a().memory_fraction(0), 0.25);
  EXPECT_THROW(s.a().set_memory_fraction(-0.1, 0), Error);  // PyTorch's range is [0, 1]
  EXPECT_THROW(s.a().set_memory_fraction(1.5, 0), Error);
  s.a().validate();
}

TEST(StreamRules, MaxSplitSizeKeepsOversizeBlocksWhole) {
  SimSetup s("max_split_size_mb:40", SimBackend::Mode::kEager);
  const Stream a = s.sim->create_stream();
  void* big = s.a().allocate(kBig, 0, a);
  s.a().deallocate(big, 0, 0, a);
  void* small = s.a().allocate(12 * MiB, 0, a);
  EXPECT_NE(small, big) << "a small request does not split an oversize block";
  EXPECT_EQ(s.stats().oversize_segments.current, 1);
  EXPECT_EQ(s.stats().max_split_size, static_cast<std::int64_t>(40 * MiB));
  s.a().validate();
}

TEST(StreamRules, RoundupPower2DivisionsRoundsRequests) {
  SimSetup s("roundup_power2_divisions:4", SimBackend::Mode::kEager);
  const Stream a = s.sim->create_stream();
  void* p = s.a().allocate(1200 * 1024, 0, a);  // between 1 MiB and 2 MiB: steps of 256 KiB
  EXPECT_EQ(s.stats().allocated_bytes[0].current, static_cast<std::int64_t>(1280 * 1024));
  s.a().deallocate(p, 0, 0, a);
  s.a().validate();
}

TEST(StreamRules, RequestLargerThanTheDeviceFailsAtOnce) {
  SimSetup s("", SimBackend::Mode::kEager, 64 * MiB);
  try {
    s.a().allocate(std::size_t{1} << 40, 0, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("larger than the device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.a().allocate(SIZE_MAX, 0, 0), Error);
  EXPECT_EQ(s.stats().num_device_alloc, 0) << "no flush, no device call";
}

TEST(StreamRules, StatsTrackPendingPerStreamAndLatency) {
  SimSetup s("");
  const Stream a = s.sim->create_stream();
  const Stream u = s.sim->create_stream();
  void* p = s.a().allocate(4096, 0, a);
  s.a().record_stream(p, u);
  s.a().deallocate(p, 4096, 0, a);
  DeviceStats st = s.stats();
  EXPECT_EQ(st.pending_bytes.current, 4096);
  EXPECT_EQ(st.per_stream.at(u).pending_bytes.current, 4096);
  s.a().process_fences();
  s.sim->synchronize_all();
  s.a().process_fences();
  st = s.stats();
  EXPECT_EQ(st.pending_bytes.current, 0);
  EXPECT_EQ(st.pending_bytes.peak, 4096);
  std::int64_t settled = 0;
  for (auto c : st.free_to_reusable_us) settled += c;
  EXPECT_GE(settled, 1);
  s.a().reset_peak_stats(0);
  EXPECT_EQ(s.stats().pending_bytes.peak, 0);
  s.a().validate();
}

}  // namespace
}  // namespace streamalloc::testing

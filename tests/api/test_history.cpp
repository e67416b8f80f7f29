// The allocation history (streamalloc/trace.hpp): PyTorch's trace actions with streamalloc's stream
// facts, a ring of the newest entries, contexts picked up from the calling thread, and nothing recorded
// while it is off.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "sim_fixture.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc {
namespace {

using testing::SimSetup;

std::vector<TraceAction> actions_of(const std::vector<TraceEntry>& entries) {
  std::vector<TraceAction> out;
  for (const TraceEntry& e : entries) out.push_back(e.action);
  return out;
}

std::vector<TraceEntry> only(const std::vector<TraceEntry>& entries, TraceAction action) {
  std::vector<TraceEntry> out;
  std::copy_if(entries.begin(), entries.end(), std::back_inserter(out),
               [&](const TraceEntry& e) { return e.action == action; });
  return out;
}

struct NamedContext final : TraceContext {
  explicit NamedContext(std::string n) : name(std::move(n)) {}
  std::string name;
};

std::string name_of(const TraceContextPtr& context) {
  const auto* named = dynamic_cast<const NamedContext*>(context.get());
  return named != nullptr ? named->name : std::string();
}

TEST(History, OffRecordsNothing) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  void* p = s.a().allocate(4 * KiB, 0, stream);
  s.a().deallocate(p, 4 * KiB, 0, stream);
  s.a().empty_cache();
  EXPECT_FALSE(s.a().history_enabled());
  EXPECT_TRUE(s.a().history(0).empty());
  s.a().validate();
}

TEST(History, AllocAndFreeOnOneStreamCompleteAtOnce) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* p = s.a().allocate(4 * KiB, 0, stream);
  s.a().deallocate(p, 4 * KiB, 0, stream);
  const std::vector<TraceEntry> h = s.a().history(0);
  ASSERT_EQ(actions_of(h), (std::vector<TraceAction>{TraceAction::kSegmentAlloc, TraceAction::kAlloc,
                                                     TraceAction::kFreeRequested, TraceAction::kFreeCompleted}));
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  for (std::size_t i = 1; i < h.size(); ++i) {
    EXPECT_EQ(h[i].address, address);
    EXPECT_EQ(h[i].size, 4 * KiB);  // the block's rounded size
    EXPECT_EQ(h[i].stream, stream);
    EXPECT_TRUE(h[i].pool.is_default());
    EXPECT_GE(h[i].time_us, h[i - 1].time_us);
  }
  EXPECT_EQ(h[0].size, 2 * MiB);  // a small-pool segment
  EXPECT_TRUE(h[2].pending_streams.empty());
  EXPECT_FALSE(h[3].fenced);
  EXPECT_GT(h[0].time_us, 1600000000LL * 1000000);  // on the Unix clock
  s.a().validate();
}

TEST(History, CrossStreamFreeCompletesWhenTheFenceCompletes) {
  SimSetup s("");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* p = s.a().allocate(4 * KiB, 0, producer);
  s.a().record_stream(p, consumer);
  s.sim->enqueue(0, consumer, [] {});  // the consumer is busy: its fence cannot complete yet
  s.a().deallocate(p, 4 * KiB, 0, producer);
  s.a().process_fences();
  {
    const std::vector<TraceEntry> h = s.a().history(0);
    const auto recorded = only(h, TraceAction::kRecordStream);
    ASSERT_EQ(recorded.size(), 1u);
    EXPECT_EQ(recorded[0].stream, producer);
    EXPECT_EQ(recorded[0].pending_streams, std::vector<Stream>{consumer});
    const auto requested = only(h, TraceAction::kFreeRequested);
    ASSERT_EQ(requested.size(), 1u);
    EXPECT_EQ(requested[0].pending_streams, std::vector<Stream>{consumer});
    EXPECT_TRUE(only(h, TraceAction::kFreeCompleted).empty()) << "the fence has not completed";
  }
  s.sim->synchronize_stream(0, consumer);
  s.a().process_fences();
  const std::vector<TraceEntry> h = s.a().history(0);
  const auto completed = only(h, TraceAction::kFreeCompleted);
  ASSERT_EQ(completed.size(), 1u);
  const TraceEntry& done = completed[0];
  EXPECT_EQ(done.address, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(done.stream, producer);
  EXPECT_TRUE(done.fenced);
  EXPECT_EQ(done.fence_stream, consumer);
  EXPECT_GT(done.fence_recorded_us, 0) << "an event was recorded on the busy consumer";
  EXPECT_LE(done.fence_recorded_us, done.time_us);
  EXPECT_GE(done.held_us, 0);
  EXPECT_EQ(h.back().action, TraceAction::kFreeCompleted);
  s.a().validate();
}

TEST(History, FreeOnAnIdleStreamCompletesWithoutAnEvent) {
  SimSetup s("");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* p = s.a().allocate(4 * KiB, 0, producer);
  s.a().deallocate(p, 4 * KiB, 0, consumer);  // a free on another stream is one more use
  s.a().synchronize_fences();
  const auto completed = only(s.a().history(0), TraceAction::kFreeCompleted);
  ASSERT_EQ(completed.size(), 1u);
  EXPECT_TRUE(completed[0].fenced);
  EXPECT_EQ(completed[0].fence_stream, consumer);
  const auto requested = only(s.a().history(0), TraceAction::kFreeRequested);
  ASSERT_EQ(requested.size(), 1u);
  EXPECT_EQ(requested[0].pending_streams, std::vector<Stream>{consumer});
}

TEST(History, SegmentsComeAndGoWithGrowthAndEmptyCache) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* small = s.a().allocate(4 * KiB, 0, stream);
  void* large = s.a().allocate(30 * MiB, 0, stream);
  s.a().deallocate(small, 4 * KiB, 0, stream);
  s.a().deallocate(large, 30 * MiB, 0, stream);
  s.a().empty_cache();
  const std::vector<TraceEntry> h = s.a().history(0);
  const auto allocs = only(h, TraceAction::kSegmentAlloc);
  const auto frees = only(h, TraceAction::kSegmentFree);
  ASSERT_EQ(allocs.size(), 2u);
  ASSERT_EQ(frees.size(), 2u);
  std::vector<std::uintptr_t> reserved{allocs[0].address, allocs[1].address};
  std::vector<std::uintptr_t> released{frees[0].address, frees[1].address};
  std::sort(reserved.begin(), reserved.end());
  std::sort(released.begin(), released.end());
  EXPECT_EQ(reserved, released);
  EXPECT_EQ(allocs[0].size + allocs[1].size, frees[0].size + frees[1].size);
  EXPECT_EQ(h.back().action, TraceAction::kSegmentFree);
}

TEST(History, AFailedAllocationIsAnOomEntryWithTheDeviceFreeBytes) {
  SimSetup s("", SimBackend::Mode::kManual, 64 * MiB);
  const Stream stream = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* held = s.a().allocate(40 * MiB, 0, stream);
  EXPECT_THROW(s.a().allocate(40 * MiB, 0, stream), Error);
  const auto ooms = only(s.a().history(0), TraceAction::kOom);
  ASSERT_EQ(ooms.size(), 1u);
  EXPECT_EQ(ooms[0].address, s.sim->memory_info(0).free_bytes);
  EXPECT_EQ(ooms[0].size, 40 * MiB);
  EXPECT_EQ(ooms[0].stream, stream);
  // Larger than the device: refused before anything else, and still an OOM entry.
  EXPECT_THROW(s.a().allocate(1 * GiB, 0, stream), Error);
  EXPECT_EQ(only(s.a().history(0), TraceAction::kOom).size(), 2u);
  s.a().deallocate(held, 40 * MiB, 0, stream);
}

TEST(History, TheRingKeepsTheNewestEntries) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  s.a().record_history(true, 5);
  std::vector<void*> ptrs;
  for (int i = 0; i < 6; ++i) ptrs.push_back(s.a().allocate(512 * (i + 1), 0, stream));
  const std::vector<TraceEntry> h = s.a().history(0);
  ASSERT_EQ(h.size(), 5u);
  for (std::size_t i = 0; i < h.size(); ++i) {
    EXPECT_EQ(h[i].action, TraceAction::kAlloc);
    EXPECT_EQ(h[i].address, reinterpret_cast<std::uintptr_t>(ptrs[i + 1])) << "entry " << i;
  }
  s.a().validate();
  // A smaller ring keeps the newest of what it had.
  s.a().record_history(true, 2);
  const std::vector<TraceEntry> shrunk = s.a().history(0);
  ASSERT_EQ(shrunk.size(), 2u);
  EXPECT_EQ(shrunk[1].address, reinterpret_cast<std::uintptr_t>(ptrs[5]));
  s.a().validate();
  for (void* p : ptrs) s.a().deallocate(p, 0, 0, stream);
  s.a().validate();
}

TEST(History, ClearAndOffDropTheHistory) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* p = s.a().allocate(4 * KiB, 0, stream);
  ASSERT_FALSE(s.a().history(0).empty());
  s.a().record_history(true, 100, /*clear=*/true);
  EXPECT_TRUE(s.a().history(0).empty());
  s.a().deallocate(p, 4 * KiB, 0, stream);
  EXPECT_EQ(s.a().history(0).size(), 2u);
  s.a().record_history(false, 100);
  EXPECT_TRUE(s.a().history(0).empty());
  p = s.a().allocate(4 * KiB, 0, stream);
  s.a().deallocate(p, 4 * KiB, 0, stream);
  EXPECT_TRUE(s.a().history(0).empty());
}

TEST(History, SkippedActionsAreLeftOut) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  HistorySettings settings;
  settings.enabled = true;
  settings.max_entries = 100;
  settings.skip = {TraceAction::kAlloc, TraceAction::kFreeRequested};
  s.a().record_history(settings);
  void* p = s.a().allocate(4 * KiB, 0, stream);
  s.a().deallocate(p, 4 * KiB, 0, stream);
  EXPECT_EQ(actions_of(s.a().history(0)),
            (std::vector<TraceAction>{TraceAction::kSegmentAlloc, TraceAction::kFreeCompleted}));
}

TEST(History, EntriesAndLiveBlocksCarryTheCallersContext) {
  SimSetup s("");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* p = nullptr;
  {
    TraceContextScope scope(std::make_shared<NamedContext>("alloc here"));
    p = s.a().allocate(4 * KiB, 0, producer);
  }
  const LiveContexts live = s.a().live_contexts(0);
  ASSERT_EQ(live.blocks.count(reinterpret_cast<std::uintptr_t>(p)), 1u);
  EXPECT_EQ(name_of(live.blocks.at(reinterpret_cast<std::uintptr_t>(p))), "alloc here");
  EXPECT_TRUE(live.segments.empty()) << "the allocation split the new segment's first block: its context went";
  s.a().record_stream(p, consumer);
  {
    TraceContextScope scope(std::make_shared<NamedContext>("free here"));
    s.a().deallocate(p, 4 * KiB, 0, producer);
  }
  // Pending, the block keeps its allocation stack (a snapshot shows where it came from).
  EXPECT_EQ(name_of(s.a().live_contexts(0).blocks.at(reinterpret_cast<std::uintptr_t>(p))), "alloc here");
  {
    // A fence completing during another thread's call is no part of that call: the completed free
    // shows the block's allocation stack, as PyTorch's entries do.
    TraceContextScope scope(std::make_shared<NamedContext>("someone else"));
    s.a().synchronize_fences();
  }
  EXPECT_TRUE(s.a().live_contexts(0).blocks.empty());
  const std::vector<TraceEntry> h = s.a().history(0);
  EXPECT_EQ(name_of(only(h, TraceAction::kAlloc)[0].context), "alloc here");
  EXPECT_EQ(name_of(only(h, TraceAction::kSegmentAlloc)[0].context), "alloc here");
  EXPECT_EQ(name_of(only(h, TraceAction::kFreeRequested)[0].context), "free here");
  EXPECT_EQ(name_of(only(h, TraceAction::kFreeCompleted)[0].context), "alloc here");
  EXPECT_EQ(current_trace_context(), nullptr) << "scopes restore the previous context";
}

TEST(History, AFreeWithoutItsOwnStackShowsTheAllocationStack) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* p = nullptr;
  {
    TraceContextScope scope(std::make_shared<NamedContext>("alloc here"));
    p = s.a().allocate(4 * KiB, 0, stream);
  }
  s.a().deallocate(p, 4 * KiB, 0, stream);  // no stack gathered for the free (PyTorch's context "alloc")
  const std::vector<TraceEntry> h = s.a().history(0);
  EXPECT_EQ(name_of(only(h, TraceAction::kFreeRequested)[0].context), "alloc here");
  EXPECT_EQ(name_of(only(h, TraceAction::kFreeCompleted)[0].context), "alloc here");
  EXPECT_TRUE(s.a().live_contexts(0).blocks.empty());
}

TEST(History, StateLevelKeepsBlockContextsOutOfTheTrace) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  HistorySettings settings;
  settings.enabled = true;
  settings.max_entries = 100;
  settings.contexts_in_trace = false;
  s.a().record_history(settings);
  TraceContextScope scope(std::make_shared<NamedContext>("state"));
  void* p = s.a().allocate(4 * KiB, 0, stream);
  EXPECT_EQ(name_of(s.a().live_contexts(0).blocks.at(reinterpret_cast<std::uintptr_t>(p))), "state");
  for (const TraceEntry& e : s.a().history(0)) EXPECT_EQ(e.context, nullptr);
  s.a().deallocate(p, 4 * KiB, 0, stream);
}

TEST(History, SnapshotJsonCarriesTheTracesInPyTorchsShape) {
  SimSetup s("", SimBackend::Mode::kManual, 256 * MiB, 2);
  const Stream producer = s.sim->create_stream(1);
  const Stream consumer = s.sim->create_stream(1);
  s.a().record_history(true, 100);
  void* p = s.a().allocate(4 * KiB, 1, producer);
  s.a().record_stream(p, consumer);
  s.a().deallocate(p, 4 * KiB, 1, producer);
  s.a().synchronize_fences();
  const nlohmann::json snapshot = nlohmann::json::parse(s.a().snapshot_json());
  const nlohmann::json& traces = snapshot.at("device_traces");
  ASSERT_EQ(traces.size(), 2u);
  const nlohmann::json& trace = traces[1];
  // segments() inside snapshot_json() reads the block table of every device: one snapshot entry each.
  ASSERT_EQ(traces[0].size(), 1u);
  EXPECT_EQ(traces[0][0].at("action"), "snapshot");
  std::vector<std::string> actions;
  for (const auto& e : trace) {
    actions.push_back(e.at("action").get<std::string>());
    for (const char* key : {"size", "stream", "time_us", "frames"}) EXPECT_TRUE(e.contains(key)) << key;
  }
  EXPECT_EQ(actions, (std::vector<std::string>{"segment_alloc", "alloc", "record_stream", "free_requested",
                                               "free_completed", "snapshot"}));
  EXPECT_EQ(trace[1].at("addr").get<std::uintptr_t>(), reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(trace[3].at("pending_streams"), nlohmann::json::array({consumer}));
  EXPECT_EQ(trace[4].at("fence_stream").get<Stream>(), consumer);
  EXPECT_TRUE(trace[4].contains("held_us"));
}

}  // namespace
// Not history, but the same cross-stream story seen in the stats: PyTorch counts a freed block's
// requested bytes until its events complete (requested_bytes follows active blocks), and so does
// streamalloc.
TEST(PendingStats, RequestedBytesStayCountedUntilTheFenceCompletes) {
  SimSetup s("");
  const Stream producer = s.sim->create_stream();
  const Stream consumer = s.sim->create_stream();
  void* p = s.a().allocate(3000, 0, producer);
  s.a().record_stream(p, consumer);
  s.sim->enqueue(0, consumer, [] {});  // busy: the fence cannot complete yet
  s.a().deallocate(p, 3000, 0, producer);
  s.a().process_fences();
  DeviceStats stats = s.a().stats(0);
  EXPECT_EQ(stats.allocated_bytes[0].current, 0);
  EXPECT_EQ(stats.requested_bytes[0].current, 3000);
  EXPECT_EQ(stats.active_bytes[0].current, 3072);
  s.a().validate();
  s.sim->synchronize_stream(0, consumer);
  s.a().process_fences();
  stats = s.a().stats(0);
  EXPECT_EQ(stats.requested_bytes[0].current, 0);
  EXPECT_EQ(stats.requested_bytes[0].freed, 3000);
  EXPECT_EQ(stats.active_bytes[0].current, 0);
  s.a().validate();
}

}  // namespace streamalloc

namespace streamalloc::testing {
namespace {

// As PyTorch's allocator, which keeps a segment's context on its head block: a segment keeps the
// context it was allocated under while allocations take it whole, and loses it once one splits its
// first block.
TEST(History, ASegmentKeepsItsContextUntilItsFirstBlockIsSplit) {
  SimSetup s("");
  const Stream stream = s.sim->create_stream();
  s.a().record_history(true, 100);
  void* whole = nullptr;
  {
    TraceContextScope scope(std::make_shared<NamedContext>("whole"));
    whole = s.a().allocate(64 * MiB, 0, stream);
  }
  LiveContexts live = s.a().live_contexts(0);
  ASSERT_EQ(live.segments.size(), 1u);
  EXPECT_EQ(name_of(live.segments.begin()->second), "whole");
  s.a().deallocate(whole);
  EXPECT_EQ(s.a().live_contexts(0).segments.size(), 1u) << "free, the segment still has its context";
  void* part = nullptr;
  {
    TraceContextScope scope(std::make_shared<NamedContext>("part"));
    part = s.a().allocate(32 * MiB, 0, stream);
  }
  ASSERT_EQ(part, whole) << "the allocation reuses the segment's first block";
  EXPECT_TRUE(s.a().live_contexts(0).segments.empty());
  s.a().deallocate(part);
  s.a().validate();
}

}  // namespace
}  // namespace streamalloc::testing

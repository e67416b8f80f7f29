// TorchAllocator's allocation history (torch.cuda.memory._record_memory_history) over the simulated
// device: recordHistory's levels, ring size, clearing and skip_actions, and the snapshot's
// device_traces and context_when_allocated as PyTorch's memory_viz reads them. The GPU tests
// (tests/python/test_gpu_history.py) run the same through PyTorch's own Python API.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include "streamalloc/sim_backend.hpp"
#include "torch_allocator.hpp"
#include "torch_history.hpp"

namespace streamalloc::torch {
namespace {

using c10::CachingDeviceAllocator::TraceEntry;
using c10::cuda::CUDACachingAllocator::SnapshotInfo;

// A stack as the context recorder returns it; tests tell stacks apart by address.
std::shared_ptr<c10::GatheredContext> make_stack() { return std::make_shared<c10::GatheredContext>(); }

std::shared_ptr<const TorchTraceContext> call_context(std::shared_ptr<c10::GatheredContext> stack,
                                                      std::string metadata = "") {
  auto context = std::make_shared<TorchTraceContext>();
  context->stack = std::move(stack);
  context->user_metadata = std::move(metadata);
  return context;
}

class TorchHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    allocator_ = std::make_shared<TorchAllocator>(Options::parse("backend:sim"));
    TorchAllocator::set_current(allocator_.get());
    allocator_->init(1);
    sim_ = dynamic_cast<SimBackend*>(&core().backend());
    ASSERT_NE(sim_, nullptr);
    producer_ = sim_->create_stream(0);
    consumer_ = sim_->create_stream(0);
  }
  void TearDown() override { TorchAllocator::set_current(nullptr); }

  TorchAllocator& a() { return *allocator_; }
  Allocator& core() { return *allocator_->core(); }
  void record(RecordContext when, std::size_t max_entries = 1000, bool clear = false,
              const std::vector<std::string>& skip = {}) {
    a().recordHistory(true, &make_stack, max_entries, when, clear, skip);
  }
  std::vector<TraceEntry> trace() { return a().snapshot().device_traces.at(0); }

  std::shared_ptr<TorchAllocator> allocator_;
  SimBackend* sim_ = nullptr;
  Stream producer_ = 0;
  Stream consumer_ = 0;
};

TEST_F(TorchHistoryTest, OffUntilRecordHistoryAndOffAgainDropsTheTrace) {
  EXPECT_FALSE(a().isHistoryEnabled());
  EXPECT_TRUE(trace().empty());
  record(RecordContext::ALL);
  EXPECT_TRUE(a().isHistoryEnabled());
  EXPECT_TRUE(core().history_enabled());
  core().deallocate(core().allocate(4 * KiB, 0, producer_));
  EXPECT_FALSE(trace().empty());
  a().recordHistory(false, nullptr, 0, RecordContext::NEVER, false, {});
  EXPECT_FALSE(a().isHistoryEnabled());
  EXPECT_TRUE(trace().empty());
}

TEST_F(TorchHistoryTest, ContextsWithoutARecorderAndUnknownSkipActionsAreRefused) {
  EXPECT_THROW(a().recordHistory(true, nullptr, 100, RecordContext::STATE, false, {}), c10::Error);
  EXPECT_FALSE(a().isHistoryEnabled());
  EXPECT_THROW(record(RecordContext::ALL, 100, false, {"alloc", "no_such_action"}), c10::Error);
  EXPECT_FALSE(a().isHistoryEnabled());
  // NEVER needs no recorder.
  a().recordHistory(true, nullptr, 100, RecordContext::NEVER, false, {});
  EXPECT_TRUE(a().isHistoryEnabled());
}

TEST_F(TorchHistoryTest, TheLevelDecidesWhichCallsGatherAStack) {
  TorchHistory history;
  history.configure(core(), true, &make_stack, 100, RecordContext::STATE, false, {});
  ASSERT_NE(history.context_for(RecordContext::STATE), nullptr);
  EXPECT_NE(history.context_for(RecordContext::STATE)->stack, nullptr) << "allocations gather at STATE";
  EXPECT_EQ(history.context_for(RecordContext::ALL), nullptr) << "frees gather only at ALL";
  EXPECT_FALSE(history.trace_stacks());
  history.configure(core(), true, &make_stack, 100, RecordContext::ALL, false, {});
  EXPECT_NE(history.context_for(RecordContext::ALL)->stack, nullptr);
  EXPECT_TRUE(history.trace_stacks());
  history.configure(core(), true, nullptr, 100, RecordContext::NEVER, false, {});
  EXPECT_EQ(history.context_for(RecordContext::STATE), nullptr);
  history.set_user_metadata("phase 1");  // the metadata alone still makes a context, without a stack
  const auto context = history.context_for(RecordContext::ALL);
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->stack, nullptr);
  EXPECT_EQ(context->user_metadata, "phase 1");
  history.configure(core(), false, nullptr, 100, RecordContext::NEVER, false, {});
  EXPECT_EQ(history.context_for(RecordContext::STATE), nullptr) << "off: nothing is gathered";
}

TEST_F(TorchHistoryTest, SnapshotTracesCarryContextsStreamsPoolsAndTheStreamFacts) {
  record(RecordContext::ALL);
  const auto alloc_stack = make_stack();
  const auto free_stack = make_stack();
  void* p = nullptr;
  {
    TraceContextScope scope(call_context(alloc_stack, "forward"));
    p = core().allocate(4 * KiB, 0, producer_);
  }
  void* kept = core().allocate(8 * KiB, 0, producer_);  // no context: no stack on its block
  core().record_stream(p, consumer_);
  sim_->enqueue(0, consumer_, [] {});
  {
    TraceContextScope scope(call_context(free_stack, "backward"));
    core().deallocate(p);
  }
  sim_->synchronize_stream(0, consumer_);
  core().process_fences();

  const SnapshotInfo snapshot = a().snapshot();
  ASSERT_EQ(snapshot.device_traces.size(), 1u);
  const std::vector<TraceEntry>& t = snapshot.device_traces[0];
  std::vector<TraceEntry::Action> actions;
  for (const TraceEntry& e : t) actions.push_back(e.action_);
  // record_stream has no PyTorch action: its stream shows in the free_requested.
  // This snapshot's own entry is recorded after its traces were taken, as PyTorch's: none yet.
  ASSERT_EQ(actions, (std::vector<TraceEntry::Action>{TraceEntry::SEGMENT_ALLOC, TraceEntry::ALLOC, TraceEntry::ALLOC,
                                                      TraceEntry::FREE_REQUESTED, TraceEntry::FREE_COMPLETED}));
  const auto address = reinterpret_cast<std::size_t>(p);
  EXPECT_EQ(t[0].context_, alloc_stack);
  EXPECT_EQ(t[1].addr_, address);
  EXPECT_EQ(t[1].context_, alloc_stack);
  EXPECT_EQ(t[1].user_metadata_, "forward");
  EXPECT_EQ(t[1].stream_, reinterpret_cast<void*>(producer_));
  EXPECT_EQ(t[1].mempool_, (c10::MempoolId_t{0, 0}));
  EXPECT_GT(t[1].time_.t_, 1600000000LL * 1000000) << "microseconds since the epoch";
  EXPECT_EQ(t[2].context_, nullptr);
  EXPECT_EQ(t[3].context_, free_stack);
  EXPECT_EQ(t[3].user_metadata_, "backward") << "the user's metadata alone, as PyTorch's entries carry it";
  EXPECT_EQ(t[4].addr_, address);
  EXPECT_EQ(t[4].context_, alloc_stack) << "a fence completing belongs to no call: the allocation's stack shows";
  EXPECT_EQ(t[4].user_metadata_.rfind("streamalloc: fence on stream 0x", 0), 0u)
      << "no user metadata was set when the fence completed: the stream facts fill the field: " << t[4].user_metadata_;
  EXPECT_NE(t[4].user_metadata_.find(" held "), std::string::npos);
  EXPECT_EQ(a().snapshot().device_traces[0].back().action_, TraceEntry::SNAPSHOT) << "the first snapshot's entry";

  // Blocks: the context they were allocated under. The segment's went when its first block was split
  // (PyTorch's allocator keeps a segment's context on its head block, and loses it there).
  ASSERT_EQ(snapshot.segments.size(), 1u);
  EXPECT_EQ(snapshot.segments[0].context_when_allocated, nullptr);
  int allocated = 0;
  for (const auto& block : snapshot.segments[0].blocks) {
    if (!block.allocated) continue;
    ++allocated;
    EXPECT_EQ(block.context_when_allocated, nullptr) << "the block allocated without a context";
  }
  EXPECT_EQ(allocated, 1);
  EXPECT_TRUE(a().snapshot({0, 0}, /*include_traces=*/false).device_traces.at(0).empty());
  core().deallocate(kept);
}

TEST_F(TorchHistoryTest, StateKeepsStacksOnBlocksButNotInTheTrace) {
  record(RecordContext::STATE);
  const auto stack = make_stack();
  void* p = nullptr;
  {
    TraceContextScope scope(call_context(stack));
    p = core().allocate(4 * KiB, 0, producer_);
  }
  const SnapshotInfo snapshot = a().snapshot();
  for (const TraceEntry& e : snapshot.device_traces[0]) EXPECT_EQ(e.context_, nullptr);
  ASSERT_EQ(snapshot.segments.size(), 1u);
  bool found = false;
  for (const auto& block : snapshot.segments[0].blocks) found = found || block.context_when_allocated == stack;
  EXPECT_TRUE(found);
  core().deallocate(p);
}

TEST_F(TorchHistoryTest, MaxEntriesClearAndSkipActions) {
  record(RecordContext::NEVER, 3);
  for (int i = 0; i < 4; ++i) core().deallocate(core().allocate(4 * KiB, 0, producer_));
  std::vector<TraceEntry> t = trace();
  // The newest three; this snapshot's own entry comes after its traces were taken.
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].action_, TraceEntry::ALLOC);
  EXPECT_EQ(t[1].action_, TraceEntry::FREE_REQUESTED);
  EXPECT_EQ(t[2].action_, TraceEntry::FREE_COMPLETED);
  t = trace();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].action_, TraceEntry::SNAPSHOT) << "the previous snapshot's entry";
  record(RecordContext::NEVER, 100, /*clear=*/true, {"snapshot", "segment_alloc"});
  EXPECT_TRUE(trace().empty());
  core().deallocate(core().allocate(4 * KiB, 0, producer_));
  t = trace();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].action_, TraceEntry::ALLOC);
}

// PyTorch's upstream test_memory_compile_regions: entries made inside a torch.compile region name it,
// the others say "N/A"; regions are kept only while the history is on.
TEST_F(TorchHistoryTest, EntriesNameTheTorchCompileRegionTheyWereMadeIn) {
  TorchHistory history;
  history.push_compile_context("ignored: the history is off");
  history.configure(core(), true, nullptr, 100, RecordContext::NEVER, false, {});
  EXPECT_EQ(history.context_for(RecordContext::STATE), nullptr) << "no region, no metadata: nothing to gather";
  history.push_compile_context("Torch-Compiled Region: 0/0");
  history.push_compile_context("Torch-Compiled Region: 1/0");
  const auto inner = history.context_for(RecordContext::STATE);
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(inner->compile_context, "Torch-Compiled Region: 1/0");
  history.pop_compile_context();
  const auto outer = history.context_for(RecordContext::STATE);
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(outer->compile_context, "Torch-Compiled Region: 0/0");
  history.pop_compile_context();
  history.pop_compile_context();  // one pop too many changes nothing
  EXPECT_EQ(history.context_for(RecordContext::STATE), nullptr);

  streamalloc::TraceEntry made_inside;
  made_inside.context = outer;
  streamalloc::TraceEntry made_outside;
  const auto t = to_torch_trace({made_inside, made_outside}, false);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].compile_context_, "Torch-Compiled Region: 0/0");
  EXPECT_EQ(t[1].compile_context_, "N/A");
}

// PyTorch's upstream test_cpp_memory_snapshot_pickle: an allocation's (and a free's) entry has the size the
// caller asked for; segment entries have the segment's.
TEST_F(TorchHistoryTest, BlockEntriesHaveTheRequestedSize) {
  record(RecordContext::NEVER);
  core().deallocate(core().allocate(311 * 411 * 4, 0, producer_));
  bool saw_alloc = false;
  for (const TraceEntry& e : trace()) {
    if (e.action_ == TraceEntry::ALLOC || e.action_ == TraceEntry::FREE_REQUESTED) {
      EXPECT_EQ(e.size_, 311u * 411u * 4u) << "action " << static_cast<int>(e.action_);
      saw_alloc = saw_alloc || e.action_ == TraceEntry::ALLOC;
    }
    if (e.action_ == TraceEntry::SEGMENT_ALLOC) {
      EXPECT_GT(e.size_, 311u * 411u * 4u);
    }
  }
  EXPECT_TRUE(saw_alloc);
}

TEST_F(TorchHistoryTest, UserMetadataRoundTrips) {
  EXPECT_EQ(a().getUserMetadata(), "");
  a().setUserMetadata("step 3");
  EXPECT_EQ(a().getUserMetadata(), "step 3");
}

// PyTorch's upstream test_memory_plots_metadata: every entry made while metadata is set carries exactly
// that metadata, also the entries no call of the user made (a fence completing while another call
// runs, whose context is the block's allocation's) and those of blocks allocated before it was set.
TEST_F(TorchHistoryTest, EveryEntryCarriesTheMetadataInEffectWhenItWasRecorded) {
  record(RecordContext::STATE);
  void* early = core().allocate(4 * KiB, 0, producer_);  // before the metadata
  core().record_stream(early, consumer_);
  sim_->enqueue(0, consumer_, [] {});
  a().setUserMetadata("metadata test");
  {
    TraceContextScope scope(call_context(make_stack(), "metadata test"));
    core().deallocate(early);  // pending on the consumer stream: streamalloc facts exist for it
  }
  sim_->synchronize_stream(0, consumer_);
  core().process_fences();  // the free completes outside any call of the user
  a().setUserMetadata("");
  bool completed = false;
  for (const TraceEntry& e : trace()) {
    if (e.action_ == TraceEntry::ALLOC || e.action_ == TraceEntry::SEGMENT_ALLOC) {
      EXPECT_EQ(e.user_metadata_, "") << "allocated before the metadata was set";
      continue;
    }
    EXPECT_EQ(e.user_metadata_, "metadata test") << "action " << static_cast<int>(e.action_);
    completed = completed || e.action_ == TraceEntry::FREE_COMPLETED;
  }
  EXPECT_TRUE(completed);
}

// PyTorch's upstream test_memory_snapshot: after empty_cache() gives segments back, the newest entry of
// the next snapshot is the segment_free (a snapshot's own entry is not in its own traces).
TEST_F(TorchHistoryTest, TheLastEntryAfterEmptyCacheIsTheSegmentFree) {
  record(RecordContext::STATE);
  core().deallocate(core().allocate(4 * KiB, 0, producer_));
  (void)a().snapshot();
  a().emptyCache();
  const std::vector<TraceEntry> t = trace();
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t.back().action_, TraceEntry::SEGMENT_FREE);
}

// PyTorch's upstream test_memory_plots_free_stack, context "state": a block allocated and freed leaves
// its allocation stack nowhere in the snapshot, also when its allocation made a new segment (whose
// context goes when its first block is split, as in PyTorch's allocator). A segment that one
// allocation takes whole keeps the context it was allocated under.
TEST_F(TorchHistoryTest, StateModeForgetsTheStackOfAFreedBlockAndOfTheSegmentItSplit) {
  record(RecordContext::STATE);
  const auto small_stack = make_stack();
  {
    TraceContextScope scope(call_context(small_stack));
    core().deallocate(core().allocate(4 * KiB, 0, producer_));
  }
  const auto whole_stack = make_stack();
  void* whole = nullptr;
  {
    TraceContextScope scope(call_context(whole_stack));
    whole = core().allocate(64 * MiB, 0, producer_);
  }
  const SnapshotInfo snapshot = a().snapshot();
  bool whole_segment_seen = false;
  for (const auto& segment : snapshot.segments) {
    EXPECT_NE(segment.context_when_allocated, small_stack);
    for (const auto& block : segment.blocks) EXPECT_NE(block.context_when_allocated, small_stack);
    whole_segment_seen = whole_segment_seen || segment.context_when_allocated == whole_stack;
  }
  EXPECT_TRUE(whole_segment_seen);
  for (const TraceEntry& e : snapshot.device_traces[0]) EXPECT_EQ(e.context_, nullptr);
  core().deallocate(whole);
}

}  // namespace
}  // namespace streamalloc::torch

namespace streamalloc::torch {
namespace {

// With expandable segments the trace shows PyTorch's SEGMENT_MAP and SEGMENT_UNMAP, which memory_viz
// draws as a segment growing and shrinking, and the snapshot marks the segment expandable.
TEST(TorchHistoryExpandable, MapsAndUnmapsAreSegmentMapAndSegmentUnmap) {
  auto allocator = std::make_shared<TorchAllocator>(Options::parse("backend:sim,expandable_segments:true"));
  TorchAllocator::set_current(allocator.get());
  allocator->init(1);
  Allocator& core = *allocator->core();
  allocator->recordHistory(true, nullptr, 100, RecordContext::NEVER, false, {});
  void* p = core.allocate(3 * MiB, 0, 0);
  const SnapshotInfo grown = allocator->snapshot();
  ASSERT_EQ(grown.segments.size(), 1u);
  EXPECT_TRUE(grown.segments[0].is_expandable);
  core.deallocate(p);
  core.empty_cache();
  std::vector<TraceEntry::Action> actions;
  const SnapshotInfo emptied = allocator->snapshot();
  for (const TraceEntry& e : emptied.device_traces.at(0)) {
    if (e.action_ != TraceEntry::ALLOC && e.action_ != TraceEntry::FREE_REQUESTED &&
        e.action_ != TraceEntry::FREE_COMPLETED && e.action_ != TraceEntry::SNAPSHOT) {
      actions.push_back(e.action_);
    }
  }
  EXPECT_EQ(actions, (std::vector<TraceEntry::Action>{TraceEntry::SEGMENT_MAP, TraceEntry::SEGMENT_UNMAP}));
  TorchAllocator::set_current(nullptr);
}

}  // namespace
}  // namespace streamalloc::torch

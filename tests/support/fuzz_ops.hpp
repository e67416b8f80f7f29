// Random operation sequences against Allocator on a manual SimBackend, checked against the reference
// model after every step. Shared by the fixed-seed test (test_model_fuzz.cpp, numbers from
// std::mt19937_64) and the libFuzzer target (fuzz/fuzz_allocator.cpp, numbers from the input bytes),
// so a crash input found by the fuzzer replays through exactly the same decoding.
//
// How "no reuse before fences" is made observable: every block gets a 1-byte tag, written to its first
// and last byte by user work on its allocation stream right after allocate(). Every use of the block
// (record_stream on another stream, and the owner's last use just before the free) enqueues a read on
// that stream that checks the tag is still there. Streams only advance when the sequence says so, so
// if the allocator hands the memory to a new owner before those reads ran, and the new owner's tag
// write runs first, the read sees the wrong tag. Like a correct program, a consumer stream waits on an
// event recorded on the producer stream before its read is enqueued.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "reference_model.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc::testing {

// ---- where the numbers come from ----

class OpSource {
 public:
  virtual ~OpSource() = default;
  // A number in [0, bound); 0 when bound <= 1.
  virtual std::uint64_t below(std::uint64_t bound) = 0;
};

class RandomSource final : public OpSource {
 public:
  explicit RandomSource(std::uint64_t seed) : rng_(seed) {}
  // Plain modulo rather than std::uniform_int_distribution, whose output differs between standard
  // libraries: a seed must replay the same sequence everywhere. The bias is negligible for our bounds.
  std::uint64_t below(std::uint64_t bound) override { return bound <= 1 ? 0 : rng_() % bound; }

 private:
  std::mt19937_64 rng_;
};

// Consumes fuzzer input: as many bytes as `bound` needs, little-endian. Reads 0 once exhausted.
class ByteSource final : public OpSource {
 public:
  ByteSource(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint64_t below(std::uint64_t bound) override {
    if (bound <= 1) return 0;
    std::uint64_t value = 0;
    int shift = 0;
    for (std::uint64_t range = bound - 1; range != 0 && shift < 64; range >>= 8, shift += 8) {
      if (pos_ < size_) value |= std::uint64_t{data_[pos_++]} << shift;
    }
    return value % bound;
  }
  bool exhausted() const { return pos_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// ---- operations ----

struct FuzzConfig {
  CrossStreamReuse policy = CrossStreamReuse::kSettled;
  int streams = 3;                         // 2..4
  std::size_t memory_limit = 128 * MiB;    // small, so OOM paths run
  std::size_t largest_request = 64 * MiB;  // sizes above the device come on top of this
  bool expandable_segments = false;        // the default pool grows expandable segments
  bool expandable_ipc = false;             // ... mapped one page per piece (shareable)
};

struct Op {
  enum class Kind {
    kAllocate,      // size on stream
    kFree,          // live block `pick`; size hint exact or 0; extra stream when `flag`
    kRecordStream,  // live block `pick` used on stream
    kAdvance,       // run up to `count` items of stream
    kSyncStream,    // host-synchronize stream
    kProcessFences,
    kEmptyCache,
    kSetFraction,    // memory_fraction = `count` / 4
    kCapture,        // toggle graph capture on stream (with a route to the stream's pool)
    kCheckpoint,     // the stream's pool: save a checkpoint (count 0), restore it (1), drop the graph's use (2)
    kRecordDead,     // record_stream on a freed pointer: counted, never fatal
    kDoubleFree,     // deallocate a freed pointer: kInvalidArgument, nothing changes
    kWrongSizeFree,  // deallocate live block `pick` with a wrong size: kInvalidArgument
  };
  Kind kind = Kind::kProcessFences;
  std::size_t size = 0;
  std::uint64_t pick = 0;
  int stream = 0;  // index into the runner's streams
  unsigned count = 0;
  bool flag = false;
};

inline const char* to_string(Op::Kind kind) {
  switch (kind) {
    case Op::Kind::kAllocate: return "allocate";
    case Op::Kind::kFree: return "free";
    case Op::Kind::kRecordStream: return "record_stream";
    case Op::Kind::kAdvance: return "advance";
    case Op::Kind::kSyncStream: return "synchronize_stream";
    case Op::Kind::kProcessFences: return "process_fences";
    case Op::Kind::kEmptyCache: return "empty_cache";
    case Op::Kind::kSetFraction: return "set_memory_fraction";
    case Op::Kind::kCapture: return "toggle_capture";
    case Op::Kind::kCheckpoint: return "checkpoint_pool";
    case Op::Kind::kRecordDead: return "record_stream(dead pointer)";
    case Op::Kind::kDoubleFree: return "double_free";
    case Op::Kind::kWrongSizeFree: return "free(wrong size)";
  }
  return "?";
}

// Request sizes across PyTorch's classes, log-uniform within the small class so tiny sizes (and
// their 512-byte rounding) are as common as large ones.
inline std::size_t decode_size(OpSource& src, const FuzzConfig& config) {
  const std::uint64_t kind = src.below(100);
  if (kind < 2) return 0;
  if (kind < 3) {  // more than the device has; now and then absurd, to catch rounding overflow
    if (src.below(8) == 0) return SIZE_MAX - src.below(4096);
    return config.memory_limit + 1 + src.below(config.memory_limit);
  }
  if (kind < 23) {
    // Sizes that recur, as a server's do, so that the hot lists serve sizes freed before.
    constexpr std::size_t kRecurring[] = {512, 4096, 65536, 1 * MiB, 2 * MiB, 2359296, 3211264, 4 * MiB};
    return kRecurring[src.below(sizeof kRecurring / sizeof kRecurring[0])];
  }
  if (kind < 73) {
    const unsigned bits = 1 + static_cast<unsigned>(src.below(20));  // sizes 1 B .. 1 MiB
    const std::size_t low = std::size_t{1} << (bits - 1);
    return low + src.below(low + 1);
  }
  if (kind < 93) return MiB + 1 + src.below(9 * MiB);                  // 1 .. 10 MiB
  return 10 * MiB + src.below(config.largest_request - 10 * MiB + 1);  // 10 .. 64 MiB
}

inline Op decode_op(OpSource& src, const FuzzConfig& config) {
  Op op;
  const auto streams = static_cast<std::uint64_t>(config.streams);
  const std::uint64_t r = src.below(1000);
  // Weights per mille. Allocations slightly outnumber frees so the device fills up and the OOM path
  // runs; advances outnumber enqueues so streams keep draining and fences keep completing.
  if (r < 270) {
    op.kind = Op::Kind::kAllocate;
    op.size = decode_size(src, config);
  } else if (r < 520) {
    op.kind = Op::Kind::kFree;
    op.flag = src.below(10) == 0;
    op.count = static_cast<unsigned>(src.below(2));  // 1: pass the exact size
  } else if (r < 670) {
    op.kind = Op::Kind::kRecordStream;
  } else if (r < 880) {
    op.kind = Op::Kind::kAdvance;
    op.count = 1 + static_cast<unsigned>(src.below(16));
  } else if (r < 905) {
    op.kind = Op::Kind::kSyncStream;
  } else if (r < 950) {
    op.kind = Op::Kind::kProcessFences;
  } else if (r < 956) {
    op.kind = Op::Kind::kEmptyCache;
  } else if (r < 962) {
    op.kind = Op::Kind::kSetFraction;
    op.count = 1 + static_cast<unsigned>(src.below(4));
  } else if (r < 970) {
    op.kind = Op::Kind::kCapture;
    op.flag = src.below(4) == 0;  // starts a capture only when set, so that captures stay short
  } else if (r < 976) {
    op.kind = Op::Kind::kCheckpoint;
    op.count = static_cast<unsigned>(src.below(3));
  } else if (r < 985) {
    op.kind = Op::Kind::kRecordDead;
  } else if (r < 993) {
    op.kind = Op::Kind::kDoubleFree;
  } else {
    op.kind = Op::Kind::kWrongSizeFree;
  }
  op.pick = src.below(UINT32_MAX);
  op.stream = static_cast<int>(src.below(streams));
  return op;
}

// ---- the runner ----

// validate() and the full block-table comparison run after every op for the first
// `validate_every_op_until` ops, then every `validate_interval` ops: both walk the whole block table,
// and at 10^6 ops per run doing that every step would dominate the run time. The cheap checks
// (stats against the model, alignment, overlap, tags) run after every op regardless.
struct FuzzSchedule {
  std::uint64_t validate_every_op_until = 20000;
  std::uint64_t validate_interval = 1000;
};

class OpRunner {
 public:
  explicit OpRunner(FuzzConfig config, FuzzSchedule schedule = FuzzSchedule{})
      : config_(config),
        schedule_(schedule),
        model_(config.largest_request, config.expandable_segments ? SimBackend::Config{}.vm_granularity : 0,
               config.expandable_ipc ? SimBackend::Config{}.vm_granularity
                                     : 20 * MiB) {  // the cache's largest piece of a large-class growth
    SimBackend::Config sim;
    sim.mode = SimBackend::Mode::kManual;
    sim.memory_per_device = config.memory_limit;
    sim_ = std::make_shared<SimBackend>(sim);
    for (int i = 0; i < config.streams; ++i) {
      streams_.push_back(sim_->create_stream(0));
      handoff_.push_back(sim_->create_event(0));
      capturing_.push_back(false);
      allocated_on_.push_back(false);
    }
    Options options;
    options.backend = BackendKind::kSim;
    options.cross_stream_reuse = config.policy;
    options.expandable_segments = config.expandable_segments;
    options.expandable_ipc = config.expandable_ipc;
    options.log_level = "error";    // OOM warnings would flood the output of a 10^6-op run
    options.pending_history = 256;  // a small ring that wraps, so validate() checks it against every change
    allocator_ = std::make_unique<Allocator>(options, sim_);
  }

  ~OpRunner() {
    allocator_.reset();  // before the events and streams it may still reference
    for (Event event : handoff_) sim_->destroy_event(0, event);
  }

  OpRunner(const OpRunner&) = delete;
  OpRunner& operator=(const OpRunner&) = delete;

  // Applies one operation and checks every invariant the schedule asks for. False once any check
  // failed; failure() then says what, and trace() what led there.
  bool step(const Op& op) {
    if (!failure_.empty()) return false;
    note(op);
    try {
      apply(op);
      check_after();
    } catch (const std::exception& e) {
      fail(std::string("unexpected exception: ") + e.what());
    }
    ++ops_;
    return failure_.empty();
  }

  // Ends capture, lets every stream finish, frees everything and checks the allocator returns to
  // an empty, consistent state.
  bool finish() {
    if (!failure_.empty()) return false;
    try {
      for (std::size_t i = 0; i < capturing_.size(); ++i) {
        if (capturing_[i]) set_capture(static_cast<int>(i), false);
      }
      for (std::size_t i = 0; i < capturing_.size(); ++i) checkpoint(static_cast<int>(i), 2);  // graphs go away
      sim_->synchronize_all();
      pull_tag_failures();
      while (!model_.empty()) free_block(model_.live_count() - 1, false, true);
      sim_->synchronize_all();
      allocator_->synchronize_fences();
      pull_tag_failures();
      allocator_->validate();
      const DeviceStats after_free = allocator_->stats(0);
      expect(after_free.allocation[0].current == 0, "allocation.current is not 0 after freeing all");
      expect(after_free.requested_bytes[0].current == 0, "requested_bytes.current is not 0 after freeing all");
      expect(after_free.active[0].current == 0, "active.current is not 0 after synchronize_fences");
      expect(after_free.pending_blocks.current == 0, "pending_blocks.current is not 0 after synchronize_fences");
      allocator_->empty_cache();
      allocator_->validate();
      const DeviceStats empty = allocator_->stats(0);
      expect(empty.reserved_bytes[0].current == 0, "empty_cache kept " +
                                                       std::to_string(empty.reserved_bytes[0].current) +
                                                       " bytes reserved with no live or pending block");
      expect(device_bytes() == 0,
             "the simulated device still has " + std::to_string(device_bytes()) + " bytes reserved or mapped");
      sim_->validate();
      expect(sim_->counters().capture_violations == 0,
             "events were queried or synchronized while a stream was capturing (" +
                 std::to_string(sim_->counters().capture_violations) + " times)");
      if (config_.policy != CrossStreamReuse::kWait) {
        expect(empty.fences_waited_gpu == 0 && empty.cross_stream_reuse_waited == 0,
               "GPU-side fence waits happened under a policy other than wait");
      }
      if (config_.policy == CrossStreamReuse::kNever) {
        expect(empty.cross_stream_reuse_settled == 0, "cross_stream_reuse:never served a block of another stream");
      }
    } catch (const std::exception& e) {
      fail(std::string("unexpected exception while finishing: ") + e.what());
    }
    return failure_.empty();
  }

  const std::string& failure() const { return failure_; }
  std::uint64_t ops() const { return ops_; }
  std::uint64_t tag_checks() const { return tags_->checks; }
  std::uint64_t ooms() const { return ooms_; }
  std::uint64_t pool_allocations() const { return pool_allocations_; }  // routed to a capture's pool
  std::uint64_t restores() const { return restores_; }                  // checkpoint restores applied
  std::uint64_t allocations() const { return allocations_; }
  // Allocations the OOM oracle said must succeed (how much the "no spurious OOM" check covered).
  std::uint64_t must_fit_allocations() const { return must_fit_allocations_; }

  // The last operations, oldest first, as "#index description".
  std::string trace() const {
    std::string text;
    const std::size_t n = recent_.size();
    for (std::size_t i = 0; i < n; ++i) text += recent_[(recent_next_ + i) % n] + "\n";
    return text;
  }

 private:
  // Filled by work items on the simulated streams; shared so a work item never outlives it.
  struct TagChecks {
    std::uint64_t checks = 0;
    std::uint64_t failures = 0;
    std::string first;
  };

  static constexpr std::size_t kTraceLength = 40;

  void apply(const Op& op) {
    switch (op.kind) {
      case Op::Kind::kAllocate: allocate(op.size, op.stream); break;
      case Op::Kind::kFree:
        if (!model_.empty()) free_block(op.pick % model_.live_count(), op.flag, op.count == 1, op.stream);
        break;
      case Op::Kind::kRecordStream:
        if (!model_.empty()) record(op.pick % model_.live_count(), op.stream);
        break;
      case Op::Kind::kAdvance: sim_->advance(0, streams_[op.stream], op.count); break;
      case Op::Kind::kSyncStream: sim_->synchronize_stream(0, streams_[op.stream]); break;
      case Op::Kind::kProcessFences: allocator_->process_fences(); break;
      case Op::Kind::kEmptyCache: allocator_->empty_cache(); break;
      case Op::Kind::kSetFraction: set_fraction(op.count / 4.0); break;
      case Op::Kind::kCapture:
        // Only streams that already allocated: the Backend answers "is this stream capturing" per
        // stream, so a capture on a stream the allocator has never seen is invisible to it, and its
        // event queries on other streams would break that capture. docs/design.md, "Stream rules", rule 6.
        if (capturing_[op.stream]) {
          set_capture(op.stream, false);
        } else if (allocated_on_[op.stream] && op.flag) {
          set_capture(op.stream, true);
        }
        break;
      case Op::Kind::kCheckpoint: checkpoint(op.stream, op.count); break;
      case Op::Kind::kRecordDead: record_dead(op.pick, op.stream); break;
      case Op::Kind::kDoubleFree: double_free(op.pick); break;
      case Op::Kind::kWrongSizeFree:
        if (!model_.empty()) wrong_size_free(op.pick % model_.live_count());
        break;
    }
    pull_tag_failures();
  }

  void allocate(std::size_t size, int stream_index) {
    const Stream stream = streams_[stream_index];
    // Conservative: a small request must succeed when, even if every live block pinned a whole
    // segment of its own, a fresh small segment (plus slack for the cap's rounding) still fits under
    // the cap. During capture fences cannot be polled, so pending memory may legitimately be stuck.
    // Private pools keep their free segments while they have uses, so their reserved bytes are spoken for.
    const bool must_fit = size > 0 && size < ReferenceModel::kSmallRequest && !any_capturing() &&
                          model_.pinned_bound() + private_reserved() + 2 * ReferenceModel::kSmallSegment <= cap();
    const bool cannot_fit = size > config_.memory_limit;
    if (must_fit) ++must_fit_allocations_;
    void* ptr = nullptr;
    try {
      ptr = allocator_->allocate(size, 0, stream);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kOutOfMemory) throw;
      ++ooms_;
      expect(!must_fit, "out of memory for " + std::to_string(size) + " bytes although live blocks pin at most " +
                            std::to_string(model_.pinned_bound()) + " of a " + std::to_string(cap()) +
                            "-byte cap: " + e.what());
      return;
    }
    if (size == 0) {
      expect(ptr == nullptr, "allocate(0) did not return nullptr");
      return;
    }
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    if (!expect(!cannot_fit, "allocate(" + std::to_string(size) + ") succeeded on a device of " +
                                 std::to_string(config_.memory_limit) + " bytes")) {
      return;
    }
    if (!expect(ptr != nullptr, "allocate returned nullptr for a non-zero size")) return;
    expect(address % 512 == 0, "pointer " + hex(address) + " is not 512-byte aligned");
    if (const ModelBlock* other = model_.overlapping(address, size)) {
      fail("new block " + hex(address) + "+" + std::to_string(size) + " overlaps live block #" +
           std::to_string(other->id) + " " + hex(other->address) + "+" + std::to_string(other->size));
      return;
    }
    ModelBlock block;
    block.address = address;
    block.size = size;
    block.stream = stream;
    block.tag = static_cast<std::uint8_t>(1 + allocations_ % 254);  // never 0x00 or the 0xFF poison
    block.id = allocations_++;
    // During a capture the stream's work goes into the graph and runs only at replays, which this
    // model does not run: such blocks carry no tag. They must come from the stream's pool.
    block.tagged = !capturing_[stream_index];
    if (capturing_[stream_index]) {
      block.pool = pool_of_stream(stream_index);
      ++pool_allocations_;
    }
    if (block.tagged) {
      auto* bytes = static_cast<std::uint8_t*>(ptr);
      const std::uint8_t tag = block.tag;
      sim_->enqueue(0, stream, [bytes, size, tag] {
        bytes[0] = tag;
        bytes[size - 1] = tag;
      });
    }
    model_.add(std::move(block));
    allocated_on_[stream_index] = true;
  }

  // Enqueues on `stream` a read that checks the block still carries its tag when the stream runs it.
  void enqueue_tag_check(const ModelBlock& block, Stream stream, const char* use) {
    if (!block.tagged || capturing_[index_of(stream)]) return;
    auto* bytes = reinterpret_cast<const std::uint8_t*>(block.address);
    const std::size_t size = block.size;
    const std::uint8_t tag = block.tag;
    std::string what = std::string(use) + " of block #" + std::to_string(block.id) + " " + hex(block.address) + "+" +
                       std::to_string(size) + " on stream " + std::to_string(index_of(stream)) + " (enqueued at op " +
                       std::to_string(ops_) + ")";
    sim_->enqueue(0, stream, [tags = tags_, bytes, size, tag, what = std::move(what)] {
      ++tags->checks;
      const std::uint8_t first = bytes[0];
      const std::uint8_t last = bytes[size - 1];
      if (first == tag && last == tag) return;
      if (tags->failures++ == 0) {
        tags->first = "memory reused before its last use: " + what + " expected tag " + std::to_string(tag) +
                      " but read " + std::to_string(first) + "/" + std::to_string(last);
      }
    });
  }

  void free_block(std::size_t index, bool extra_stream, bool exact_size, int stream_index = 0) {
    const ModelBlock& block = model_.at(index);
    enqueue_tag_check(block, block.stream, "owner's last use");
    // An extra stream passed to deallocate counts as one more use of the block.
    const Stream stream = extra_stream ? streams_[stream_index] : block.stream;
    allocator_->deallocate(reinterpret_cast<void*>(block.address), exact_size ? block.size : 0, 0, stream);
    model_.remove(index);
  }

  void record(std::size_t index, int stream_index) {
    const ModelBlock& block = model_.at(index);
    const Stream stream = streams_[stream_index];
    // While either stream captures, the hand-off and the read would be nodes of a graph that this model
    // never replays: only the record_stream call itself is made then.
    const bool in_graph = capturing_[index_of(block.stream)] || capturing_[stream_index];
    if (stream != block.stream && !in_graph) {
      // The consumer waits for the producer, as correct user code would (the tag write comes first).
      const Event event = handoff_[index_of(block.stream)];
      sim_->record_event(0, event, block.stream);
      sim_->stream_wait_event(0, stream, event);
    }
    if (!in_graph) enqueue_tag_check(block, stream, "read");
    allocator_->record_stream(reinterpret_cast<void*>(block.address), stream);
    // A use recorded while its stream captures lasts until that capture ends (the capture rule).
    if (model_.record(index, stream) && capturing_[stream_index])
      model_.at_mutable(index).capture_recorded.push_back(stream);
  }

  void set_fraction(double fraction) {
    allocator_->set_memory_fraction(fraction, 0);
    fraction_ = fraction;
    expect(allocator_->memory_fraction(0) == fraction, "memory_fraction(0) does not return what was set");
  }

  // A capture opens a route to the stream's own pool, as PyTorch does for a graph (the route adds a
  // use, which the graph keeps after the capture until kCheckpoint drops it); its end closes the route.
  void set_capture(int stream_index, bool capturing) {
    const Stream stream = streams_[stream_index];
    sim_->set_capturing(0, stream, capturing);
    capturing_[stream_index] = capturing;
    if (capturing) {
      allocator_->begin_allocate_to_pool(0, pool_of_stream(stream_index), [stream](Stream s) { return s == stream; });
      pools_used_ = true;
      return;
    }
    allocator_->end_allocate_to_pool(0, pool_of_stream(stream_index));
    for (std::size_t i = 0; i < model_.live_count(); ++i) {
      ModelBlock& block = model_.at_mutable(i);
      auto dropped = std::find(block.capture_recorded.begin(), block.capture_recorded.end(), stream);
      if (dropped == block.capture_recorded.end()) continue;
      block.capture_recorded.erase(dropped);
      block.recorded.erase(std::find(block.recorded.begin(), block.recorded.end(), stream));
    }
  }

  static PoolId pool_of_stream(int stream_index) { return PoolId{static_cast<std::uint64_t>(stream_index) + 1, 0}; }

  std::size_t private_reserved() const {
    if (!pools_used_) return 0;
    std::size_t bytes = 0;
    for (const PoolInfo& pool : allocator_->pools(0)) {
      if (!pool.id.is_default()) bytes += pool.reserved_bytes;
    }
    return bytes;
  }

  // Save the pool's layout (0), or restore the saved one (1): the pool's live blocks are freed and the
  // saved live blocks are live again; a restore whose segments were given back since is refused
  // unchanged. Or (2) drop the graph's uses of the pool, so that empty_cache may free its memory.
  void checkpoint(int stream_index, unsigned what) {
    const PoolId pool = pool_of_stream(stream_index);
    if (allocator_->pool_use_count(0, pool) == 0 || any_capturing()) return;  // no such pool, or it is freeable
    if (what == 2) {
      while (allocator_->pool_use_count(0, pool) > 0) allocator_->release_pool(0, pool);
      return;
    }
    if (what == 0) {
      checkpoints_[stream_index] = allocator_->checkpoint_pool(0, pool);
      return;
    }
    auto saved = checkpoints_.find(stream_index);
    if (saved == checkpoints_.end()) return;
    PoolRestore restored;
    try {
      restored = allocator_->restore_pool(saved->second);
      ++restores_;
    } catch (const Error& e) {
      expect(e.code() == ErrorCode::kInvalidArgument, std::string("restore failed with ") + e.what());
      checkpoints_.erase(saved);
      return;
    }
    for (void* ptr : restored.freed) {
      const ModelBlock* block = model_.find(reinterpret_cast<std::uintptr_t>(ptr));
      if (!expect(block != nullptr, "restore freed " + hex(reinterpret_cast<std::uintptr_t>(ptr)) + ", not live"))
        return;
      expect(block->pool == pool, "restore freed a block of another pool");
      model_.remove(static_cast<std::size_t>(block - &model_.at(0)));
    }
    for (const SegmentLayout& segment : saved->second.segments) {
      for (const BlockLayout& layout : segment.blocks) {
        if (!layout.allocated) continue;
        ModelBlock block;
        block.address = layout.address;
        block.size = layout.requested;
        block.stream = layout.stream;
        block.tagged = false;
        block.pool = pool;
        block.id = allocations_++;
        expect(std::find(restored.allocated.begin(), restored.allocated.end(),
                         reinterpret_cast<void*>(layout.address)) != restored.allocated.end(),
               "restore did not hand back saved live block " + hex(layout.address));
        model_.add(std::move(block));
      }
    }
  }

  void record_dead(std::uint64_t pick, int stream_index) {
    const std::uintptr_t address = model_.dead_address(pick);
    if (address == 0) return;
    const std::int64_t before = allocator_->stats(0).record_stream_unknown_ptr;
    allocator_->record_stream(reinterpret_cast<void*>(address), streams_[stream_index]);
    expect(allocator_->stats(0).record_stream_unknown_ptr == before + 1,
           "record_stream on dead pointer " + hex(address) + " was not counted as record_stream_unknown_ptr");
  }

  void double_free(std::uint64_t pick) {
    const std::uintptr_t address = model_.dead_address(pick);
    if (address == 0) return;
    expect_invalid_free(reinterpret_cast<void*>(address), 0, "double free of " + hex(address));
  }

  void wrong_size_free(std::size_t index) {
    const ModelBlock& block = model_.at(index);
    void* ptr = reinterpret_cast<void*>(block.address);
    expect_invalid_free(ptr, block.size + 1, "free of " + hex(block.address) + " with a wrong size");
    expect(allocator_->requested_size_of(ptr) == block.size, "a rejected free changed block " + hex(block.address));
  }

  void expect_invalid_free(void* ptr, std::size_t size, const std::string& what) {
    const DeviceStats before = allocator_->stats(0);
    try {
      allocator_->deallocate(ptr, size, -1, streams_[0]);
    } catch (const Error& e) {
      expect(e.code() == ErrorCode::kInvalidArgument, what + " threw " + to_string(e.code()) + ": " + e.what());
      const DeviceStats after = allocator_->stats(0);
      expect(after.allocation[0].current == before.allocation[0].current &&
                 after.active_bytes[0].current == before.active_bytes[0].current,
             what + " was rejected but changed the stats");
      return;
    }
    fail(what + " was accepted");
  }

  void check_after() {
    if (!failure_.empty()) return;
    const DeviceStats stats = allocator_->stats(0);
    expect(stats.allocation[0].current == static_cast<std::int64_t>(model_.live_count()),
           "allocation.current " + std::to_string(stats.allocation[0].current) + " != model's " +
               std::to_string(model_.live_count()) + " live blocks");
    // Requested bytes count live blocks and pending ones (as PyTorch's do, until their events complete):
    // the model's live bytes, plus at most the pending blocks' rounded bytes.
    const auto live_requested = static_cast<std::int64_t>(model_.live_bytes());
    const std::int64_t pending_requested = stats.requested_bytes[0].current - live_requested;
    expect(pending_requested >= 0 && pending_requested <= stats.pending_bytes.current &&
               (stats.pending_blocks.current > 0 || pending_requested == 0),
           "requested_bytes.current " + std::to_string(stats.requested_bytes[0].current) + " != model's " +
               std::to_string(live_requested) + " live bytes plus at most the " +
               std::to_string(stats.pending_bytes.current) + " pending bytes");
    expect(stats.reserved_bytes[0].current == static_cast<std::int64_t>(device_bytes()),
           "reserved_bytes.current " + std::to_string(stats.reserved_bytes[0].current) +
               " != bytes reserved or mapped on the simulated device " + std::to_string(device_bytes()));
    // Lowering the fraction may leave more reserved than the cap (live blocks stay), but a new
    // reservation must never go past it.
    if (stats.num_device_alloc != last_device_allocs_) {
      expect(stats.reserved_bytes[0].current <= static_cast<std::int64_t>(cap()),
             "reserved " + std::to_string(stats.reserved_bytes[0].current) +
                 " bytes, over the memory_fraction cap of " + std::to_string(cap()));
      last_device_allocs_ = stats.num_device_alloc;
    }
    const bool full_check = ops_ < schedule_.validate_every_op_until || ops_ % schedule_.validate_interval == 0;
    if (!full_check || !failure_.empty()) return;
    try {
      allocator_->validate();
    } catch (const std::exception& e) {
      fail(std::string("validate() failed: ") + e.what());
      return;
    }
    compare_block_table();
  }

  // The allocator's view of every live block equals the model's.
  void compare_block_table() {
    std::size_t live = 0;
    std::size_t allocated_bytes = 0;
    std::map<std::uintptr_t, PoolId> pool_of_segment;
    for (const SegmentInfo& segment : allocator_->segments(0)) pool_of_segment[segment.address] = segment.pool;
    for (const BlockInfo& info : allocator_->blocks(0)) {
      if (info.state != BlockInfo::State::kAllocated) continue;
      ++live;
      allocated_bytes += info.size;
      const ModelBlock* block = model_.find(info.address);
      if (!expect(block != nullptr, "allocator reports live block " + hex(info.address) + " the model does not have")) {
        return;
      }
      const std::string name = "block #" + std::to_string(block->id) + " " + hex(block->address);
      expect(info.requested_size == block->size,
             name + ": requested_size " + std::to_string(info.requested_size) + " != " + std::to_string(block->size));
      expect(
          info.size >= block->size && info.size % 512 == 0,
          name + ": occupies " + std::to_string(info.size) + " bytes for a request of " + std::to_string(block->size));
      expect(info.allocation_stream == block->stream, name + ": wrong allocation stream");
      expect(pool_of_segment[info.segment_address] == block->pool, name + ": in another memory pool than its route's");
      std::vector<Stream> recorded = info.recorded_streams;
      std::sort(recorded.begin(), recorded.end());
      expect(recorded == block->recorded, name + ": recorded streams differ from the record_stream calls");
    }
    expect(live == model_.live_count(), "allocator reports " + std::to_string(live) + " live blocks, model has " +
                                            std::to_string(model_.live_count()));
    const auto stat_bytes = allocator_->stats(0).allocated_bytes[0].current;
    expect(stat_bytes == static_cast<std::int64_t>(allocated_bytes),
           "allocated_bytes.current " + std::to_string(stat_bytes) + " != sum of live block sizes " +
               std::to_string(allocated_bytes));
  }

  std::size_t index_of(Stream stream) const {
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i] == stream) return i;
    }
    return 0;
  }

  std::size_t cap() const { return static_cast<std::size_t>(fraction_ * static_cast<double>(config_.memory_limit)); }

  // Device memory behind the cache's segments: reserved memory and mapped pages.
  std::size_t device_bytes() const { return sim_->reserved_bytes(0) + sim_->mapped_bytes(0); }

  bool any_capturing() const {
    for (bool c : capturing_) {
      if (c) return true;
    }
    return false;
  }

  void pull_tag_failures() {
    if (tags_->failures != 0) fail(tags_->first);
  }

  bool expect(bool condition, const std::string& message) {
    if (!condition) fail(message);
    return condition;
  }

  void fail(const std::string& message) {
    if (failure_.empty()) failure_ = "op " + std::to_string(ops_) + ": " + message;
  }

  void note(const Op& op) {
    std::ostringstream text;
    text << '#' << ops_ << ' ' << to_string(op.kind);
    switch (op.kind) {
      case Op::Kind::kAllocate: text << ' ' << op.size << " B on stream " << op.stream; break;
      case Op::Kind::kFree:
        if (!model_.empty()) {
          const ModelBlock& b = model_.at(op.pick % model_.live_count());
          text << " block #" << b.id << ' ' << hex(b.address) << '+' << b.size
               << (op.count == 1 ? " (exact size)" : " (size 0)");
          if (op.flag) text << " with extra stream " << op.stream;
        }
        break;
      case Op::Kind::kRecordStream:
      case Op::Kind::kWrongSizeFree:
        if (!model_.empty()) {
          const ModelBlock& b = model_.at(op.pick % model_.live_count());
          text << " block #" << b.id << ' ' << hex(b.address);
        }
        if (op.kind == Op::Kind::kRecordStream) text << " on stream " << op.stream;
        break;
      case Op::Kind::kAdvance: text << " stream " << op.stream << " by " << op.count; break;
      case Op::Kind::kSyncStream:
      case Op::Kind::kCapture:
      case Op::Kind::kRecordDead: text << " stream " << op.stream; break;
      case Op::Kind::kCheckpoint:
        text << (op.count == 0 ? " save" : op.count == 1 ? " restore" : " release") << " pool of stream " << op.stream;
        break;
      case Op::Kind::kSetFraction: text << ' ' << op.count / 4.0; break;
      default: break;
    }
    if (recent_.size() < kTraceLength) {
      recent_.push_back(text.str());
    } else {
      recent_[recent_next_] = text.str();
      recent_next_ = (recent_next_ + 1) % kTraceLength;
    }
  }

  static std::string hex(std::uintptr_t value) {
    char buf[2 + 2 * sizeof value + 1];
    std::snprintf(buf, sizeof buf, "0x%jx", static_cast<std::uintmax_t>(value));
    return buf;
  }

  FuzzConfig config_;
  FuzzSchedule schedule_;
  std::shared_ptr<TagChecks> tags_ = std::make_shared<TagChecks>();
  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<Allocator> allocator_;
  ReferenceModel model_;
  std::vector<Stream> streams_;  // stream i of the ops is streams_[i]
  std::vector<Event> handoff_;   // per producer stream: the consumer's wait before a read
  std::vector<bool> capturing_;
  std::vector<bool> allocated_on_;  // streams the allocator has served an allocation on
  double fraction_ = 1.0;
  bool pools_used_ = false;
  std::uint64_t pool_allocations_ = 0;
  std::uint64_t restores_ = 0;
  std::map<int, PoolCheckpoint> checkpoints_;  // per stream's pool
  std::uint64_t ops_ = 0;
  std::uint64_t allocations_ = 0;
  std::uint64_t ooms_ = 0;
  std::uint64_t must_fit_allocations_ = 0;
  std::int64_t last_device_allocs_ = 0;
  std::string failure_;
  std::vector<std::string> recent_;
  std::size_t recent_next_ = 0;
};

}  // namespace streamalloc::testing

// Debugging aids: optional features that watch the cache (audit, check_sync, pending_history, the
// allocation history) or change what it does with a block (quarantine holds freed blocks back from
// reuse; poison fills blocks). Each aid is a DebugAid in its own file; make_debug_aids() builds those
// the options turn on, and the allocation history (history_aid.cpp) comes and goes with its sink.
//
// The cache holds the aids behind one pointer, null when every aid is off: the policy code reads on
// its own, and with the aids off each hook costs one inline null check. Hooks run under the cache's
// lock. The cache still counts every event in its stats; aids only report, record or act on them.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "block.hpp"
#include "fence_queue.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/stats.hpp"
#include "streamalloc/trace.hpp"

namespace streamalloc {

class Audit;
class SyncChecker;

// How a stream came to use a block.
enum class NewUse { kRecordStream, kFreeOnStream };
// Why a record_stream call changed nothing.
enum class IgnoredRecordStream { kAllocationStream, kDuplicate, kAlreadyFreed, kForeignPointer };

// What validate() hands each aid to check its own state against the block table.
struct AidCheck {
  int device = 0;
  std::size_t held_blocks = 0;  // blocks marked held, and their bytes
  std::size_t held_bytes = 0;
  std::function<const StreamPending*(Stream)> pending_of;  // nullptr for a stream the cache has not seen
  [[noreturn]] void broken(const std::string& what) const;
};

class DebugAid {
 public:
  virtual ~DebugAid() = default;

  // ---- blocks
  // `block` was handed out on block.stream.
  virtual void on_allocate(Block& /*block*/) {}
  // A caller freed `block` (before it becomes free or pending).
  virtual void on_free(const Block& /*block*/) {}
  // `stream` now uses `block`. True when the aid found `stream` not ordered after the allocation
  // (check_sync), which the cache counts as a missing wait.
  virtual bool on_new_use(const Block& /*block*/, Stream /*stream*/, NewUse /*how*/) { return false; }
  virtual void on_ignored_record_stream(IgnoredRecordStream /*why*/, const void* /*ptr*/, Stream /*stream*/) {}
  // No stream uses `block` any more: it is free for its allocation stream. True when the aid enqueued
  // work on the block on that stream (poison): the block then needs a fence behind that work before
  // another stream may take it.
  virtual bool on_reusable(const Block& /*block*/) { return false; }

  // ---- holding freed blocks back from reuse
  virtual bool holds_blocks() const { return false; }
  // Take `block` (marked held by the cache). Blocks the aid lets go of are appended to `released`,
  // oldest first, still marked held: the cache lets them go one at a time.
  virtual void hold(Block* /*block*/, std::vector<Block*>* /*released*/) {}
  // Let go of every held block (the OOM path, empty_cache, a lower memory fraction, teardown).
  virtual void release_all(std::vector<Block*>* /*released*/) {}

  // ---- fences
  virtual void on_fence_recorded(Event /*event*/, Stream /*stream*/) {}
  virtual void on_gpu_wait(Event /*event*/, Stream /*waiter*/) {}
  // A stream's pending stats changed: a free made blocks wait for its next fence, or a fence completed.
  virtual void on_pending_changed(Clock::time_point /*when*/, Stream /*stream*/, const StreamPending& /*now*/) {}
  // A poll left `oldest` in flight on `stream`.
  virtual void on_fence_in_flight(Stream /*stream*/, const Fence& /*oldest*/, Clock::time_point /*now*/) {}
  virtual void on_host_sync_for_memory(std::size_t /*fences*/, std::size_t /*bytes_released*/) {}
  virtual void on_out_of_memory(const std::string& /*report*/) {}

  // ---- the allocation history's own events (streamalloc/trace.hpp; the history also hears on_allocate
  // and on_free)
  virtual void on_record_stream(const Block& /*block*/, Stream /*stream*/) {}
  // A pending block's last fence completed (`fence` nullptr: its remaining uses were dropped, as a
  // capture's are); `fence_stream` is the stream of that fence.
  virtual void on_fenced_free_completed(const Block& /*block*/, Stream /*fence_stream*/, const Fence* /*fence*/) {}
  virtual void on_segment(TraceAction /*action*/, const Segment& /*segment*/) {}
  // kSegmentMap / kSegmentUnmap: `bytes` of pages at `address` of an expandable segment.
  virtual void on_segment_pages(TraceAction /*action*/, const Segment& /*segment*/, std::uintptr_t /*address*/,
                                std::size_t /*bytes*/) {}
  // An allocation of `size` bytes on `stream` from `pool` failed with `device_free` bytes free.
  virtual void on_out_of_memory_request(std::size_t /*device_free*/, std::size_t /*size*/, Stream /*stream*/,
                                        PoolId /*pool*/) {}
  virtual void on_snapshot(std::size_t /*active_bytes*/) {}

  // ---- reports and validate()
  // True (and `out` filled) for the aid that keeps the pending history.
  virtual bool pending_history(PendingHistory* /*out*/) const { return false; }
  // Throw through check.broken() when the aid's own state disagrees with the block table.
  virtual void validate(const AidCheck& /*check*/) const {}
};

// The aids one device cache runs, called in turn. Out of line: the hot path holds only the null check
// and the call.
class DebugAids {
 public:
  explicit DebugAids(std::vector<std::unique_ptr<DebugAid>> aids);
  ~DebugAids();

  bool holds_blocks() const { return holder_ != nullptr; }
  // The allocation history, an aid like the others that comes and goes with its sink: `history` replaces
  // the one there is (nullptr removes it). It runs after the aids the options turn on.
  void set_history(std::unique_ptr<DebugAid> history);
  bool empty() const { return aids_.empty(); }
  // Whether an aid other than the allocation history is on (the history only records).
  bool beyond_history() const { return aids_.size() > (history_ != nullptr ? 1u : 0u); }

  void on_allocate(Block& block);
  void on_free(const Block& block);
  bool on_new_use(const Block& block, Stream stream, NewUse how);
  void on_ignored_record_stream(IgnoredRecordStream why, const void* ptr, Stream stream);
  bool on_reusable(const Block& block);
  void hold(Block* block, std::vector<Block*>* released) { holder_->hold(block, released); }
  void release_all(std::vector<Block*>* released);
  void on_fence_recorded(Event event, Stream stream);
  void on_gpu_wait(Event event, Stream waiter);
  void on_pending_changed(Clock::time_point when, Stream stream, const StreamPending& now);
  void on_fence_in_flight(Stream stream, const Fence& oldest, Clock::time_point now);
  void on_host_sync_for_memory(std::size_t fences, std::size_t bytes_released);
  void on_out_of_memory(const std::string& report);
  void on_record_stream(const Block& block, Stream stream);
  void on_fenced_free_completed(const Block& block, Stream fence_stream, const Fence* fence);
  void on_segment(TraceAction action, const Segment& segment);
  void on_segment_pages(TraceAction action, const Segment& segment, std::uintptr_t address, std::size_t bytes);
  void on_out_of_memory_request(std::size_t device_free, std::size_t size, Stream stream, PoolId pool);
  void on_snapshot(std::size_t active_bytes);
  bool pending_history(PendingHistory* out) const;
  void validate(const AidCheck& check) const;

 private:
  std::vector<std::unique_ptr<DebugAid>> aids_;
  DebugAid* holder_ = nullptr;   // the aid that holds blocks back, if any
  DebugAid* history_ = nullptr;  // the allocation history, if on (last in aids_)
};

// The aids `options` turn on for `device`, or nullptr when none is. `audit` is the process's audit
// sink and `sync` the shared happens-before checker (nullptr when check_sync is off).
std::unique_ptr<DebugAids> make_debug_aids(int device, const Options& options, Backend& backend, Audit& audit,
                                           SyncChecker* sync);

// One factory per aid, each in its own file; nullptr when the option is off.
std::unique_ptr<DebugAid> make_audit_aid(int device, const Options& options, Audit& audit);
std::unique_ptr<DebugAid> make_sync_check_aid(int device, Audit& audit, SyncChecker* sync);
std::unique_ptr<DebugAid> make_pending_history_aid(const Options& options);
std::unique_ptr<DebugAid> make_quarantine_aid(const Options& options);
std::unique_ptr<DebugAid> make_poison_aid(int device, const Options& options, Backend& backend);
// The allocation history of `device`: its events go to `sink`.
std::unique_ptr<DebugAid> make_history_aid(int device, TraceSink& sink);

}  // namespace streamalloc

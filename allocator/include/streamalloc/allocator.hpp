// Allocator: streamalloc's C++ entry point. One DeviceCache per device, each with its own locks, so
// calls are thread-safe and devices do not contend with each other; within a device, threads that
// allocate and free on their own streams mostly take only their stream's lock (docs/design.md,
// "Locking").
//
// The stream rules, in short (docs/design.md, "Stream rules", has all six):
//  - allocate(size, device, stream) returns memory safe for work enqueued on `stream` from now on.
//  - record_stream(ptr, s) adds s to the streams the block is used on; it records nothing yet.
//  - deallocate(ptr): with no other streams recorded the block is reusable on its allocation stream at
//    once; otherwise it is *pending* until a fence (an event recorded after the free) has completed on
//    every recorded stream. Fences are batched: one event per stream covers many frees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "streamalloc/backend.hpp"
#include "streamalloc/backend_factory.hpp"
#include "streamalloc/blocks.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/pools.hpp"
#include "streamalloc/stats.hpp"
#include "streamalloc/trace.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc {

class DeviceCache;

class Allocator {
 public:
  // The backend is shared so tests can keep driving a SimBackend they also hand to the allocator.
  Allocator(Options options, std::shared_ptr<Backend> backend);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns nullptr for size 0. Throws Error(kOutOfMemory) with a report that explains the numbers,
  // Error(kInvalidArgument) for a bad device, Error(kShutdown) after shutdown().
  void* allocate(std::size_t size, int device, Stream stream);
  // `size` must be the requested size or 0 (unknown); `device` must be the block's device or -1
  // (unknown: looked up, first on the device whose cache has seen `stream`, or without a stream on the
  // device and stream this thread allocated on last, then on each other device). Naming the device
  // and the allocation stream lets the free go straight to that stream's shard and take its lock
  // alone. Throws Error(kInvalidArgument) for a double free, a foreign pointer, or a wrong size or
  // device, and then changes nothing. A `stream` other than the allocation stream is treated as one
  // more stream the block was used on; 0 adds no use. nullptr is a no-op.
  void deallocate(void* ptr, std::size_t size = 0, int device = -1, Stream stream = 0);
  // The common cases alone, for callers that turn exceptions into error codes (the C ABI) and so pay
  // for a frame around allocate and deallocate: a block from `stream`'s own cache of recently freed
  // blocks, a block freed back to it (the device named). nullptr / false when the call needs allocate
  // / deallocate, which then decide and report any error; nothing changes then. Never throws.
  void* allocate_cached(std::size_t size, int device, Stream stream) noexcept;
  bool deallocate_cached(void* ptr, std::size_t size, int device, Stream stream) noexcept;
  // allocate / deallocate for a caller whose allocate_cached / deallocate_cached with the same
  // arguments has just returned nullptr / false: the same call, without trying the common case again.
  void* allocate_after_miss(std::size_t size, int device, Stream stream);
  void deallocate_after_miss(void* ptr, std::size_t size, int device, Stream stream);
  // Never throws for misuse: calls on the allocation stream, repeated calls and calls on pointers that
  // are not live are counted in the stream stats (and reported by the audit). Throws only when the
  // stream belongs to another device than the block (kInvalidArgument).
  void record_stream(void* ptr, Stream stream);

  // Release every cached segment that is entirely free and settled (after closing and polling fences).
  void empty_cache();
  // Cap reserved bytes of `device` at fraction * device memory (0 <= fraction <= 1, PyTorch's range;
  // anything else is kInvalidArgument). At 0 no allocation gets new device memory: only free memory
  // already in segments serves. Lowering the cap below what is reserved releases cached segments; it
  // never frees live blocks.
  void set_memory_fraction(double fraction, int device);
  double memory_fraction(int device) const;
  // ---- settings PyTorch changes at runtime (torch.cuda.memory._set_allocator_settings) ----
  // Each applies to every device from the next call on; a refused value (kInvalidArgument) changes
  // nothing. The options give their first values (roundup_power2_divisions, expandable_segments).
  // Request rounding per power-of-two interval: every entry 0 or a power of two.
  void set_roundup_power2_divisions(const RoundupDivisions& divisions);
  RoundupDivisions roundup_power2_divisions() const;
  // Whether new segments of the default pool are expandable (where the backend maps virtual memory);
  // segments already made keep their kind.
  void set_expandable_segments(bool on);
  bool expandable_segments() const;  // device 0's, which every device shares
  // PyTorch's graph_capture_record_stream_reuse: during a graph capture, a block freed while other
  // streams of the capture used it is given back to its allocation stream once that stream's captured
  // work follows every use in the graph (a join), instead of at the capture's end. Needs a backend
  // that reads the capture's graph (Backend::capture_info); off by default, as in PyTorch.
  void set_graph_capture_record_stream_reuse(bool on);
  bool graph_capture_record_stream_reuse() const;
  // ---- memory pools (streamalloc/pools.hpp; docs/design.md, "Pools") ----
  // Create private pool `pool` on `device` with one use, or add a use to it. Refused for the default
  // pool (kInvalidArgument).
  void create_or_incref_pool(int device, PoolId pool);
  // Drop one use of `pool`; at none it is freeable: empty_cache() returns its free segments and erases
  // it once it holds none. Refused (nothing changes) for a pool without uses.
  void release_pool(int device, PoolId pool);
  // Open a route: until end_allocate_to_pool, allocations on `device` whose stream `filter` accepts (the
  // filter runs on the allocating thread) come from `pool`, which gets one more use (created if new).
  // Routes are consulted newest first. Refused when a route to `pool` is already open.
  void begin_allocate_to_pool(int device, PoolId pool, PoolFilter filter);
  // Close the route to `pool` (the pool keeps its use until release_pool). Refused when none is open.
  void end_allocate_to_pool(int device, PoolId pool);
  int pool_use_count(int device, PoolId pool) const;  // 0 when `pool` does not exist
  // use_on_oom: an allocation of the default pool that would fail takes a free block of this pool.
  void set_pool_use_on_oom(int device, PoolId pool, bool use_on_oom);
  // no_split: the pool's blocks are never split (each allocation takes a whole block).
  void set_pool_no_split(int device, PoolId pool);
  // The pool's segments come from `segments` from now on (both functions set). Refused (nothing
  // changes) for the default pool, an unknown pool, or a pool that already holds segments.
  void set_pool_segment_allocator(int device, PoolId pool, SegmentAllocator segments);
  std::vector<PoolInfo> pools(int device) const;  // the default pool first
  // empty_cache() of one pool, on every device: the default pool's is empty_cache(); a private pool's
  // free segments go back only once it is freeable.
  void empty_cache(PoolId pool);
  // Save the block layout of a private pool; restore it: every live block of the pool is freed, the
  // checkpoint's segments are split as saved, and its allocated blocks are live again. Refused before
  // anything changes when the pool or one of the checkpoint's segments no longer exists, or when a
  // graph capture is under way on the device.
  PoolCheckpoint checkpoint_pool(int device, PoolId pool) const;
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);
  // True when the live blocks of `pool` are exactly `expected` (PyTorch's checkPoolLiveAllocations).
  bool pool_live_blocks_are(int device, PoolId pool, const std::vector<const void*>& expected) const;

  // Record fences for open batches and poll completed ones on every device (normally done lazily).
  void process_fences();
  // Wait on the host for every fence; afterwards no block is pending.
  void synchronize_fences();

  DeviceStats stats(int device) const;
  void reset_peak_stats(int device);
  void reset_accumulated_stats(int device);
  std::vector<SegmentInfo> segments(int device) const;  // all devices when device < 0
  std::vector<BlockInfo> blocks(int device) const;      // flattened segments(), live and free
  // torch.cuda.memory._snapshot()-shaped JSON plus streamalloc's per-block stream fields.
  std::string snapshot_json() const;
  std::string stats_json(int device) const;
  // The last changes of pending bytes per stream (option pending_history:N; empty when 0).
  PendingHistory pending_history(int device) const;
  std::string pending_history_json(int device) const;
  // ---- allocation history (streamalloc/trace.hpp; docs/design.md, "Allocation history") ----
  // Turn the history of every device on or off. On: events are kept in a ring of the newest
  // `max_entries` per device (0 keeps one); `clear` drops what was kept. Off: nothing is recorded and
  // what was kept is dropped, as PyTorch's recordHistory(false) does.
  void record_history(bool enabled, std::size_t max_entries, bool clear = false);
  void record_history(const HistorySettings& settings);
  bool history_enabled() const;
  std::vector<TraceEntry> history(int device) const;  // oldest first; empty while off
  // The contexts (TraceContextScope) that live blocks and segments were allocated under while the
  // history was on, by address.
  LiveContexts live_contexts(int device) const;

  // Check every invariant of docs/design.md ("Invariants"); throws std::logic_error naming the first
  // one broken. Expensive: for tests and debugging.
  void validate() const;

  // Synchronization the allocator did not make itself, for check_sync (no-ops when it is off): the
  // torch plugin forwards PyTorch's GPU trace callbacks here.
  void note_event_record(std::uintptr_t event, Stream stream);
  void note_event_wait(std::uintptr_t event, Stream stream);
  void note_stream_synchronize(Stream stream);
  void note_device_synchronize();

  // The device a live pointer belongs to, or -1.
  int device_of(const void* ptr) const;
  // Size requested for a live pointer, or 0.
  std::size_t requested_size_of(const void* ptr) const;
  // Base address and size of the fixed segment holding `ptr` (live or not), or nullptr; an address in
  // an expandable segment is refused (kInvalidArgument): share_pieces describes those.
  void* segment_base(const void* ptr, std::size_t* size) const;
  // The pieces of physical memory under the live block at `ptr` (its first byte), exported for another
  // process (streamalloc/blocks.hpp, SharedPieces; empty `pieces` for a block of a fixed segment). The
  // block stays live while another process uses it, so its pieces stay mapped: the caller keeps it
  // allocated until then (PyTorch's producer-side reference counting does). Throws kInvalidArgument,
  // changing nothing, when `ptr` is not the start of a live block; the backend's kBackend when it cannot
  // export the pieces (the backend keeps the descriptors it made for pieces before the refused one).
  SharedPieces share_pieces(const void* ptr);
  // Largest free block and total cached free bytes (PyTorch's cacheInfo), per device.
  void cache_info(int device, std::size_t* largest_free_block, std::size_t* total_cached) const;

  // Release all cached memory and refuse further calls (kShutdown). Live blocks stay valid until the
  // backend goes away; their later frees are refused with a clear error, never a crash. Like the
  // destructor, it makes no call on any stream (streams may already be destroyed): memory whose
  // fences were never recorded stays reserved until the process exits.
  //
  // Stream lifetime: while the allocator runs, a stream that blocks were allocated or recorded on
  // must stay alive until those blocks are freed and their fences done (process_fences() or
  // synchronize_fences() before destroying it). PyTorch's pooled streams are never destroyed.
  void shutdown();
  bool is_shut_down() const;

  const Options& options() const { return options_; }
  Backend& backend() { return *backend_; }
  int device_count() const;

 private:
  DeviceCache& cache(int device) const;
  bool serves(int device) const;                                                // not shut down, and `device` exists
  [[noreturn, gnu::noinline, gnu::cold]] void refuse_device(int device) const;  // shut down, or no such device
  int find_device(const void* ptr, int hint) const;
  // A free on the device the caller named; `tried_cached`: deallocate_cached was tried already.
  void deallocate_on_named(void* ptr, std::size_t size, int device, Stream stream, bool tried_cached);
  int stream_device_hint(Stream stream) const;  // record_stream's first guess at the stream's device

  Options options_;
  std::shared_ptr<Backend> backend_;
  std::vector<std::unique_ptr<DeviceCache>> caches_;
  struct Internals;  // audit sink, happens-before checker, shutdown flag
  std::unique_ptr<Internals> internals_;
};

}  // namespace streamalloc

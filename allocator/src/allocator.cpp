// Allocator: routes calls to the DeviceCache of each device and refuses them after shutdown.
#include "streamalloc/allocator.hpp"

#include <atomic>
#include <spdlog/fmt/fmt.h>

#include "audit.hpp"
#include "debug_aid.hpp"
#include "device_cache.hpp"
#include "history_recorder.hpp"
#include "logging.hpp"
#include "size_policy.hpp"
#include "sync_checker.hpp"

namespace streamalloc {

struct Allocator::Internals {
  explicit Internals(const Options& options)
      : audit(options), sync(options.check_sync ? std::make_unique<SyncChecker>() : nullptr) {}
  Audit audit;
  std::unique_ptr<SyncChecker> sync;
  std::atomic<bool> shut_down{false};
  // One per device; a cache holds a pointer to its recorder while the history is on.
  std::vector<std::unique_ptr<HistoryRecorder>> recorders;
  std::atomic<bool> history_enabled{false};
};

namespace {

std::string hex(std::uintptr_t value) { return fmt::format("{:#x}", value); }

// Where this thread allocated last: a free that names no device (PyTorch's DataPtr deleter gets only
// the pointer) looks there first, since a thread mostly frees what it allocated, on the stream it
// allocated it on. Only a first guess: the caches check it with one lookup each. Initial-exec TLS,
// as mimalloc's and tcmalloc's shared libraries use for their per-thread state: a plain %fs-relative
// store on every allocation instead of a __tls_get_addr call (these 24 bytes come from the static TLS
// surplus the C library keeps for libraries loaded later, such as this one under Python).
struct LastAllocation {
  const Allocator* allocator = nullptr;
  int device = -1;
  Stream stream = 0;
};
__attribute__((tls_model("initial-exec"))) thread_local LastAllocation t_last_allocation;

}  // namespace

Allocator::Allocator(Options options, std::shared_ptr<Backend> backend)
    : options_(std::move(options)), backend_(std::move(backend)) {
  if (!backend_) throw Error(ErrorCode::kConfig, "streamalloc: Allocator needs a backend (got null)");
  set_log_level(options_.log_level);
  internals_ = std::make_unique<Internals>(options_);
  const int devices = backend_->device_count();
  for (int d = 0; d < devices; ++d) {
    caches_.push_back(std::make_unique<DeviceCache>(
        d, options_, *backend_, make_debug_aids(d, options_, *backend_, internals_->audit, internals_->sync.get())));
    internals_->recorders.push_back(std::make_unique<HistoryRecorder>());
  }
  log().info("allocator on the {} backend, {} device(s); options: {}", backend_->name(), devices,
             options_.to_conf_string());
}

// The caches release memory and report through the audit sink, so they go first.
Allocator::~Allocator() { caches_.clear(); }

int Allocator::device_count() const { return static_cast<int>(caches_.size()); }

// Every call passes here: the checks are two tests, the errors out of line.
bool Allocator::serves(int device) const {
  return !internals_->shut_down.load(std::memory_order_relaxed) && static_cast<std::size_t>(device) < caches_.size();
}

DeviceCache& Allocator::cache(int device) const {
  if (__builtin_expect(!serves(device), 0)) refuse_device(device);
  return *caches_[static_cast<std::size_t>(device)];
}

void Allocator::refuse_device(int device) const {
  if (internals_->shut_down.load(std::memory_order_relaxed)) {
    throw Error(ErrorCode::kShutdown,
                "streamalloc: called after shutdown(); the allocator no longer hands out or takes back memory. "
                "Make all allocations and frees before shutting it down.");
  }
  throw Error(ErrorCode::kInvalidArgument, "streamalloc: device " + std::to_string(device) +
                                               " does not exist; this allocator manages devices 0.." +
                                               std::to_string(device_count() - 1));
}

int Allocator::find_device(const void* ptr, int hint) const {
  if (hint >= 0 && hint < device_count() && caches_[static_cast<std::size_t>(hint)]->owns_live(ptr)) return hint;
  for (int d = 0; d < device_count(); ++d) {
    if (d != hint && caches_[static_cast<std::size_t>(d)]->owns_live(ptr)) return d;
  }
  return -1;
}

void* Allocator::allocate(std::size_t size, int device, Stream stream) {
  DeviceCache& c = cache(device);
  if (size == 0) return nullptr;
  void* ptr = c.allocate(size, stream);
  t_last_allocation = LastAllocation{this, device, stream};
  return ptr;
}

void* Allocator::allocate_cached(std::size_t size, int device, Stream stream) noexcept {
  if (!serves(device) || size == 0) return nullptr;
  void* ptr = caches_[static_cast<std::size_t>(device)]->allocate_cached(size, stream);
  if (ptr != nullptr) t_last_allocation = LastAllocation{this, device, stream};
  return ptr;
}

bool Allocator::deallocate_cached(void* ptr, std::size_t size, int device, Stream stream) noexcept {
  return ptr != nullptr && device >= 0 && serves(device) &&
         caches_[static_cast<std::size_t>(device)]->deallocate_cached(ptr, size, stream);
}

void* Allocator::allocate_after_miss(std::size_t size, int device, Stream stream) {
  DeviceCache& c = cache(device);
  if (size == 0) return nullptr;
  void* ptr = c.allocate_locked(size, stream);
  t_last_allocation = LastAllocation{this, device, stream};
  return ptr;
}

void Allocator::deallocate_after_miss(void* ptr, std::size_t size, int device, Stream stream) {
  // deallocate_cached tries the common case only for a named device that this allocator serves.
  if (ptr != nullptr && device >= 0 && serves(device)) return deallocate_on_named(ptr, size, device, stream, true);
  deallocate(ptr, size, device, stream);
}

void Allocator::deallocate_on_named(void* ptr, std::size_t size, int device, Stream stream, bool tried_cached) {
  // The named device's cache, with one lookup (the stream's shard, else its index of blocks).
  DeviceCache& named = cache(device);
  const bool freed = tried_cached ? named.deallocate_locked(reinterpret_cast<std::uintptr_t>(ptr), size, stream)
                                  : named.deallocate(ptr, size, stream);
  if (freed) return;
  const int actual = find_device(ptr, -1);
  if (actual >= 0) {
    throw Error(ErrorCode::kInvalidArgument, "streamalloc: free(" + hex(reinterpret_cast<std::uintptr_t>(ptr)) +
                                                 ") names device " + std::to_string(device) +
                                                 " but the block lives on device " + std::to_string(actual) +
                                                 "; nothing was freed. Pass the device it was allocated on.");
  }
  named.reject_free(ptr);
}

void Allocator::deallocate(void* ptr, std::size_t size, int device, Stream stream) {
  if (ptr == nullptr) return;
  if (device >= 0) return deallocate_on_named(ptr, size, device, stream, false);
  // No device: first the device (and, without a stream, the stream) this thread allocated on last, or
  // the device whose cache has seen `stream` (a lock-free look at each cache's stream table); then the
  // others in turn, one lookup each.
  const LastAllocation& last = t_last_allocation;
  const bool guessed = last.allocator == this && last.device < device_count();
  int first = guessed ? last.device : 0;
  if (device_count() > 1 && (stream != 0 || !guessed)) {
    for (int d = 0; d < device_count(); ++d) {
      if (caches_[static_cast<std::size_t>(d)]->knows_stream(stream)) {
        first = d;
        break;
      }
    }
  }
  const Stream look_first = stream == 0 && guessed && first == last.device ? last.stream : stream;
  if (cache(first).deallocate(ptr, size, stream, look_first)) return;
  for (int d = 0; d < device_count(); ++d) {
    if (d != first && cache(d).deallocate(ptr, size, stream)) return;
  }
  // Live nowhere: the device whose memory holds the address says which mistake it was.
  for (int d = 0; d < device_count(); ++d) {
    cache(d).reject_free(ptr, /*only_if_inside=*/true);
  }
  cache(first).reject_free(ptr);
}

// A cache that has used a stream checked on first sight that the stream is its device's
// (DeviceCache::find_or_add_shard), so a lock-free look at each cache's stream table names the
// device without asking the backend (cudaStreamGetDevice; on the simulated device, its one mutex, at
// every call). Only a stream no cache has used yet, and the default stream (every device's), ask.
int Allocator::stream_device_hint(Stream stream) const {
  if (device_count() == 1) return 0;
  if (stream != 0) {
    for (int d = 0; d < device_count(); ++d) {
      if (caches_[static_cast<std::size_t>(d)]->knows_stream(stream)) return d;
    }
  }
  return backend_->stream_device(stream);
}

void Allocator::record_stream(void* ptr, Stream stream) {
  // A stream's device as the backend or a table names it, or device 0 for none (the default stream).
  const auto cache_of = [&](int device) -> DeviceCache& {
    return cache(device >= 0 && device < device_count() ? device : 0);
  };
  // The common case costs one lookup: the block lives on the stream's device.
  DeviceCache& home = cache_of(stream_device_hint(stream));
  if (home.record_stream(ptr, stream)) return;
  // Off the common path the backend says where the stream belongs (a hint from a cache's table may be
  // a destroyed stream's handle, reused on another device).
  const int stream_device = device_count() == 1 ? 0 : backend_->stream_device(stream);
  const int device = find_device(ptr, -1);
  if (device < 0) {
    // Not live anywhere: counted (and audited) by the device the stream belongs to.
    cache_of(stream_device).record_stream_not_live(ptr, stream);
    return;
  }
  if (stream_device >= 0 && stream_device != device) {
    throw Error(ErrorCode::kInvalidArgument,
                "streamalloc: record_stream(" + hex(reinterpret_cast<std::uintptr_t>(ptr)) + ", stream " + hex(stream) +
                    "): the stream belongs to device " + std::to_string(stream_device) +
                    " but the block lives on device " + std::to_string(device) +
                    ". Only streams of the block's device can use it; copy the tensor to the other device instead.");
  }
  cache(device).record_stream(ptr, stream);
}

void Allocator::empty_cache() {
  for (int d = 0; d < device_count(); ++d) cache(d).empty_cache();
}

void Allocator::empty_cache(PoolId pool) {
  for (int d = 0; d < device_count(); ++d) cache(d).empty_cache(pool);
}

// ---- memory pools: each is one device's; the cache checks the pool, the facade the device.

void Allocator::create_or_incref_pool(int device, PoolId pool) { cache(device).create_or_incref_pool(pool); }
void Allocator::release_pool(int device, PoolId pool) { cache(device).release_pool(pool); }
void Allocator::begin_allocate_to_pool(int device, PoolId pool, PoolFilter filter) {
  cache(device).begin_allocate_to_pool(pool, std::move(filter));
}
void Allocator::end_allocate_to_pool(int device, PoolId pool) { cache(device).end_allocate_to_pool(pool); }
int Allocator::pool_use_count(int device, PoolId pool) const { return cache(device).pool_use_count(pool); }
void Allocator::set_pool_use_on_oom(int device, PoolId pool, bool use_on_oom) {
  cache(device).set_pool_use_on_oom(pool, use_on_oom);
}
void Allocator::set_pool_no_split(int device, PoolId pool) { cache(device).set_pool_no_split(pool); }

void Allocator::set_pool_segment_allocator(int device, PoolId pool, SegmentAllocator segments) {
  cache(device).set_pool_segment_allocator(pool, std::move(segments));
}
std::vector<PoolInfo> Allocator::pools(int device) const { return cache(device).pools(); }
PoolCheckpoint Allocator::checkpoint_pool(int device, PoolId pool) const { return cache(device).checkpoint_pool(pool); }
PoolRestore Allocator::restore_pool(const PoolCheckpoint& checkpoint) {
  return cache(checkpoint.device).restore_pool(checkpoint);
}
bool Allocator::pool_live_blocks_are(int device, PoolId pool, const std::vector<const void*>& expected) const {
  return cache(device).pool_live_blocks_are(pool, expected);
}

void Allocator::set_memory_fraction(double fraction, int device) {
  // PyTorch's range and words: 0 is a valid cap (no new device memory at all), NaN is not.
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: invalid fraction:{}. Please set within [0, 1].", fraction));
  }
  cache(device).set_memory_fraction(fraction);
}

void Allocator::set_roundup_power2_divisions(const RoundupDivisions& divisions) {
  if (!size_policy::Rounding::valid(divisions)) {
    std::string table;
    for (const std::size_t d : divisions) table += (table.empty() ? "" : ",") + std::to_string(d);
    throw Error(ErrorCode::kInvalidArgument, "streamalloc: roundup_power2_divisions [" + table +
                                                 "]: every entry has to be 0 or a power of two; nothing changed");
  }
  for (int d = 0; d < device_count(); ++d) cache(d).set_roundup_power2_divisions(divisions);
}

RoundupDivisions Allocator::roundup_power2_divisions() const {
  if (caches_.empty()) return size_policy::Rounding::filled(options_.roundup_power2_divisions);
  return cache(0).roundup_power2_divisions();
}

void Allocator::set_expandable_segments(bool on) {
  for (int d = 0; d < device_count(); ++d) cache(d).set_expandable_segments(on);
}

bool Allocator::expandable_segments() const { return !caches_.empty() && cache(0).expandable_segments(); }

void Allocator::set_graph_capture_record_stream_reuse(bool on) {
  for (int d = 0; d < device_count(); ++d) cache(d).set_graph_capture_record_stream_reuse(on);
}

bool Allocator::graph_capture_record_stream_reuse() const {
  return !caches_.empty() && cache(0).graph_capture_record_stream_reuse();
}

double Allocator::memory_fraction(int device) const { return cache(device).memory_fraction(); }

void Allocator::process_fences() {
  for (int d = 0; d < device_count(); ++d) cache(d).process_fences();
}

void Allocator::synchronize_fences() {
  for (int d = 0; d < device_count(); ++d) cache(d).synchronize_fences();
}

// Reports keep working after shutdown, so a post-mortem can still look at the numbers.
DeviceStats Allocator::stats(int device) const {
  if (device < 0 || device >= device_count()) cache(device);  // throws the range error
  return caches_[static_cast<std::size_t>(device)]->stats();
}

void Allocator::reset_peak_stats(int device) { cache(device).reset_peak_stats(); }
void Allocator::reset_accumulated_stats(int device) { cache(device).reset_accumulated_stats(); }

std::vector<SegmentInfo> Allocator::segments(int device) const {
  std::vector<SegmentInfo> out;
  for (int d = 0; d < device_count(); ++d) {
    if (device >= 0 && d != device) continue;
    auto part = caches_[static_cast<std::size_t>(d)]->segments();
    out.insert(out.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return out;
}

std::vector<BlockInfo> Allocator::blocks(int device) const {
  std::vector<BlockInfo> out;
  for (SegmentInfo& segment : segments(device)) {
    out.insert(out.end(), std::make_move_iterator(segment.blocks.begin()),
               std::make_move_iterator(segment.blocks.end()));
  }
  return out;
}

std::string Allocator::stats_json(int device) const { return stats(device).to_json(pools(device)); }

PendingHistory Allocator::pending_history(int device) const { return cache(device).pending_history(); }

std::string Allocator::pending_history_json(int device) const { return pending_history(device).to_json(device); }

void Allocator::validate() const {
  for (const auto& c : caches_) c->validate();
  for (const auto& r : internals_->recorders) r->validate();
}

void Allocator::note_event_record(std::uintptr_t event, Stream stream) {
  if (internals_->sync) internals_->sync->on_event_record(event, stream);
}

void Allocator::note_event_wait(std::uintptr_t event, Stream stream) {
  if (internals_->sync) internals_->sync->on_event_wait(event, stream);
}

void Allocator::note_stream_synchronize(Stream stream) {
  if (internals_->sync) internals_->sync->on_stream_synchronize(stream);
}

void Allocator::note_device_synchronize() {
  if (internals_->sync) internals_->sync->on_device_synchronize();
}

int Allocator::device_of(const void* ptr) const { return find_device(ptr, -1); }

std::size_t Allocator::requested_size_of(const void* ptr) const {
  const int device = find_device(ptr, -1);
  return device < 0 ? 0 : caches_[static_cast<std::size_t>(device)]->requested_size_of(ptr);
}

void* Allocator::segment_base(const void* ptr, std::size_t* size) const {
  for (const auto& c : caches_) {
    if (void* base = c->segment_base(ptr, size)) return base;
  }
  return nullptr;
}

SharedPieces Allocator::share_pieces(const void* ptr) {
  SharedPieces shared;
  for (const auto& c : caches_) {
    if (c->share_pieces(ptr, &shared)) return shared;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "streamalloc: share_pieces(" + hex(reinterpret_cast<std::uintptr_t>(ptr)) +
                  "): not the start of a live block of this allocator; share memory it allocated, while it is "
                  "allocated");
}

void Allocator::cache_info(int device, std::size_t* largest_free_block, std::size_t* total_cached) const {
  cache(device).cache_info(largest_free_block, total_cached);
}

void Allocator::shutdown() {
  if (internals_->shut_down.exchange(true)) return;
  for (const auto& c : caches_) c->release_all();
  internals_->audit.flush();
}

bool Allocator::is_shut_down() const { return internals_->shut_down.load(); }

}  // namespace streamalloc

namespace streamalloc {

void Allocator::record_history(bool enabled, std::size_t max_entries, bool clear) {
  HistorySettings settings;
  settings.enabled = enabled;
  settings.max_entries = max_entries;
  settings.clear = clear;
  record_history(settings);
}

// A cache sends events only while it points at its recorder: detached before the recorder stops,
// attached after it starts, so that no event is lost or recorded against the settings.
void Allocator::record_history(const HistorySettings& settings) {
  for (int d = 0; d < device_count(); ++d) {
    HistoryRecorder& recorder = *internals_->recorders[static_cast<std::size_t>(d)];
    DeviceCache& c = cache(d);
    if (!settings.enabled) c.set_trace_sink(nullptr);
    recorder.configure(settings);
    if (settings.enabled) c.set_trace_sink(&recorder);
  }
  internals_->history_enabled.store(settings.enabled, std::memory_order_relaxed);
}

bool Allocator::history_enabled() const { return internals_->history_enabled.load(std::memory_order_relaxed); }

// Like the reports, the history stays readable after shutdown.
std::vector<TraceEntry> Allocator::history(int device) const {
  if (device < 0 || device >= device_count()) {
    throw Error(ErrorCode::kInvalidArgument, "streamalloc: history of device " + std::to_string(device) +
                                                 ", which does not exist; this allocator manages devices 0.." +
                                                 std::to_string(device_count() - 1));
  }
  return internals_->recorders[static_cast<std::size_t>(device)]->entries();
}

LiveContexts Allocator::live_contexts(int device) const {
  if (device < 0 || device >= device_count()) return {};
  return internals_->recorders[static_cast<std::size_t>(device)]->live_contexts();
}

}  // namespace streamalloc

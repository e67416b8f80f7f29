#include "soak_workload.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace streamalloc {
namespace {

// Each consume gets its own flag byte, so a wrong check is counted per consume, not per read-back.
constexpr std::size_t kFlagSlots = 4096;
// Kept blocks: at most this many, and at most kKeptSizes largest batches' worth of bytes, so the
// memory the soak holds stays bounded whatever the random walk does.
constexpr std::size_t kMaxKept = 8;
constexpr std::size_t kKeptSizes = 4;
// Periods in iterations. Reading the flags synchronizes the device, so it is rare enough that the GPU
// keeps a queue of work between reads; validate() walks every block, so it is rarer still.
constexpr std::uint64_t kStepAllEvery = 16;
constexpr std::uint64_t kProcessFencesEvery = 100;
constexpr std::uint64_t kReadChecksEvery = 256;
constexpr std::uint64_t kValidateEvery = 1000;
constexpr unsigned kEmptyCacheOneIn = 512;
constexpr unsigned kKeepOneIn = 4;
constexpr unsigned kThirdStreamOneIn = 8;
constexpr unsigned kFreeElsewhereOneIn = 3;
constexpr unsigned kNewKeptTargetOneIn = 64;

// Consecutive iterations differ, so a batch overwritten by the next iteration's fill reads wrong; never
// 0 (fresh memory) or 0xFF (poison).
unsigned char batch_value(std::uint64_t i) { return static_cast<unsigned char>(1 + i % 254); }
unsigned char kept_value(std::uint64_t i) { return static_cast<unsigned char>(1 + (i + 127) % 254); }

std::uintptr_t id(Event event) { return reinterpret_cast<std::uintptr_t>(event); }

}  // namespace

SoakWorkload::SoakWorkload(const SoakConfig& config, Allocator& allocator, DemoDevice& device)
    : config_(config), allocator_(allocator), device_(device), rng_(config.seed) {
  if (config_.pairs < 1) throw std::invalid_argument("SoakWorkload: at least one stream pair is needed");
  if (config_.min_size == 0 || config_.max_size < config_.min_size) {
    throw std::invalid_argument("SoakWorkload: sizes must satisfy 0 < min_size <= max_size");
  }
  for (int i = 0; i < 2 * config_.pairs; ++i) {
    streams_.push_back(device_.create_stream());
    ready_.push_back(device_.backend()->create_event(0));
  }
  flags_ = static_cast<unsigned char*>(allocator_.allocate(kFlagSlots, 0, streams_[0]));
  device_.fill(flags_, kFlagSlots, 0, streams_[0]);
  // Every stream writes flags: they start cleared before any stream runs a consume.
  device_.synchronize();
}

std::size_t SoakWorkload::random_size() {
  std::uniform_real_distribution<double> log_size(std::log(static_cast<double>(config_.min_size)),
                                                  std::log(static_cast<double>(config_.max_size)));
  const auto bytes = static_cast<std::size_t>(std::exp(log_size(rng_)));
  return std::clamp(bytes, config_.min_size, config_.max_size);
}

std::size_t SoakWorkload::random_stream() {
  return std::uniform_int_distribution<std::size_t>(0, streams_.size() - 1)(rng_);
}

bool SoakWorkload::chance(unsigned one_in) { return std::uniform_int_distribution<unsigned>(1, one_in)(rng_) == 1; }

void* SoakWorkload::allocate(std::size_t bytes, std::size_t stream) {
  void* ptr = allocator_.allocate(bytes, 0, streams_[stream]);
  ++counts_.allocations;
  counts_.bytes_requested += bytes;
  return ptr;
}

// The host-to-device copy of the prefetch pipeline, then the event its consumers wait on.
void SoakWorkload::produce(void* ptr, std::size_t bytes, unsigned char value, std::size_t stream) {
  device_.fill(ptr, bytes, value, streams_[stream]);
  device_.backend()->record_event(0, ready_[stream], streams_[stream]);
  allocator_.note_event_record(id(ready_[stream]), streams_[stream]);
}

// The wait_event that record_stream does not replace. The stream's latest record is at or after the
// fill being waited for, so waiting on it is enough.
void SoakWorkload::order_after(std::size_t producer, std::size_t consumer) {
  if (producer == consumer) return;
  device_.backend()->stream_wait_event(0, streams_[consumer], ready_[producer]);
  allocator_.note_event_wait(id(ready_[producer]), streams_[consumer]);
}

void SoakWorkload::consume(const void* ptr, std::size_t bytes, unsigned char value, std::size_t producer,
                           std::size_t consumer) {
  order_after(producer, consumer);
  if (flags_used_ == kFlagSlots) read_checks();
  device_.consume(ptr, bytes, value, flags_ + flags_used_++, streams_[consumer]);
}

void SoakWorkload::iterate() {
  const std::uint64_t i = counts_.iterations++;
  const std::size_t pair = std::uniform_int_distribution<std::size_t>(0, streams_.size() / 2 - 1)(rng_);
  const std::size_t prefetch = 2 * pair;
  const std::size_t compute = 2 * pair + 1;

  // The prefetch pipeline: fill on prefetch, read on compute, record_stream, free at once on prefetch.
  const std::size_t bytes = random_size();
  void* batch = allocate(bytes, prefetch);
  produce(batch, bytes, batch_value(i), prefetch);
  consume(batch, bytes, batch_value(i), prefetch, compute);
  allocator_.record_stream(batch, streams_[compute]);
  if (streams_.size() > 2 && chance(kThirdStreamOneIn)) {
    std::size_t third = random_stream();
    while (third == prefetch || third == compute) third = random_stream();
    consume(batch, bytes, batch_value(i), prefetch, third);
    allocator_.record_stream(batch, streams_[third]);
    ++counts_.third_stream_consumers;
  }
  allocator_.deallocate(batch, bytes, 0, streams_[prefetch]);

  if (chance(kKeepOneIn)) keep_one();
  if (chance(kNewKeptTargetOneIn)) kept_target_ = std::uniform_int_distribution<std::size_t>(0, kMaxKept)(rng_);
  while (!kept_.empty() && (kept_.size() > kept_target_ || kept_bytes_ > kKeptSizes * config_.max_size)) {
    retire(std::uniform_int_distribution<std::size_t>(0, kept_.size() - 1)(rng_));
  }

  device_.step(streams_[prefetch], streams_[compute]);
  const std::uint64_t n = i + 1;
  if (n % kStepAllEvery == 0) step_all();
  if (n % kProcessFencesEvery == 0) allocator_.process_fences();
  if (n % kReadChecksEvery == 0) read_checks();
  if (n % kValidateEvery == 0) {
    allocator_.validate();
    ++counts_.validate_calls;
  }
  if (chance(kEmptyCacheOneIn)) {
    allocator_.empty_cache();
    ++counts_.empty_cache_calls;
  }
}

// A block that outlives its iteration (an activation kept for the backward pass, a cached batch).
void SoakWorkload::keep_one() {
  const std::size_t stream = random_stream();
  const std::size_t bytes = random_size();
  void* ptr = allocate(bytes, stream);
  const unsigned char value = kept_value(counts_.iterations);
  produce(ptr, bytes, value, stream);
  kept_.push_back({ptr, bytes, value, stream});
  kept_bytes_ += bytes;
  ++counts_.kept_blocks;
}

// Read the kept block once more on a random stream (its bytes must have survived every allocation made
// since), then free it, sometimes on a stream other than its allocation stream.
void SoakWorkload::retire(std::size_t index) {
  const Kept k = kept_[index];
  kept_[index] = kept_.back();
  kept_.pop_back();
  kept_bytes_ -= k.bytes;
  const std::size_t reader = random_stream();
  consume(k.ptr, k.bytes, k.value, k.stream, reader);
  if (reader != k.stream) allocator_.record_stream(k.ptr, streams_[reader]);
  std::size_t free_on = k.stream;
  if (chance(kFreeElsewhereOneIn)) {
    while (free_on == k.stream) free_on = random_stream();
    // A stream that frees a block is one that used it, so it is ordered after the fill too.
    order_after(k.stream, free_on);
    ++counts_.kept_freed_on_other_stream;
  }
  allocator_.deallocate(k.ptr, k.bytes, 0, streams_[free_on]);
}

// The simulated device runs a stream only when told; the chosen pair is stepped every iteration, the
// others (third-stream readers, kept blocks' readers) here. No-op on the GPU.
void SoakWorkload::step_all() {
  for (std::size_t s = 0; s + 1 < streams_.size(); s += 2) device_.step(streams_[s], streams_[s + 1]);
}

void SoakWorkload::read_checks() {
  device_.synchronize();
  allocator_.note_device_synchronize();
  counts_.checks += flags_used_;
  counts_.checks_wrong += device_.take_mismatches(flags_, flags_used_);
  flags_used_ = 0;
  ++counts_.syncs;
}

SoakEndState SoakWorkload::finish() {
  while (!kept_.empty()) retire(kept_.size() - 1);
  read_checks();
  // The device is idle after read_checks(), so the flags, used on every stream, are free to go.
  allocator_.deallocate(flags_, kFlagSlots, 0, streams_[0]);
  flags_ = nullptr;
  allocator_.synchronize_fences();
  allocator_.process_fences();
  device_.synchronize();  // poisoning of the blocks the fences released runs in stream order
  SoakEndState end;
  DeviceStats stats = allocator_.stats(0);
  end.allocated_bytes = stats.allocated_bytes[0].current;
  end.pending_bytes = stats.pending_bytes.current;
  allocator_.empty_cache();
  ++counts_.empty_cache_calls;
  device_.synchronize();
  end.reserved_bytes = allocator_.stats(0).reserved_bytes[0].current;
  try {
    allocator_.validate();
    ++counts_.validate_calls;
  } catch (const std::logic_error& e) {
    end.validate_error = e.what();
  }
  for (Event event : ready_) device_.backend()->destroy_event(0, event);
  ready_.clear();
  return end;
}

}  // namespace streamalloc

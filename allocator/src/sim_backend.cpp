// SimBackend mechanics. The model (what a stream, an event and a wait mean) is documented in
// sim_backend.hpp; this file explains how it is kept consistent under threads.
//
// Locking: one mutex guards all state. Host functions (user work, memsets) run with the mutex released,
// so a slow "kernel" never stalls other streams. A per-stream `running` flag is set while one of its
// host functions runs: only that thread may pop the stream's next item, which keeps each stream
// strictly in order when several threads advance it. A thread that finds a stream running waits on
// `stream_idle` and re-checks.
//
// Events: each record takes the event's next generation number. An event keeps the generations that
// are enqueued but have not run yet (`outstanding`, with the stream holding each). A record, or a wait
// that captured a generation, is complete when that generation is no longer outstanding. Tracking
// generations one by one, rather than "highest completed", keeps waits exact when one event is
// re-recorded on a different stream whose record runs first.
//
// Host waits (synchronize_event/stream/all, release, eager enqueues) may run other streams: a wait at
// the front of a stream refers to a record enqueued before it, so the recursion over the wait graph
// always reaches streams with runnable fronts and terminates.
//
// Virtual memory: each device keeps an AddressRanges (the ranges and their mappings) over real host
// address space: a range is an inaccessible anonymous mapping reserved with MAP_NORESERVE, mapping
// makes pages readable and writable (the host commits them on first touch), and unmapping maps fresh
// inaccessible pages over them, which drops their memory. Host memory is only a stand-in; the
// device limit is what decides whether a map fits.
#include "streamalloc/sim_backend.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "address_ranges.hpp"

namespace streamalloc {
namespace {

constexpr std::size_t kAlignment = 512;  // what cudaMalloc guarantees (and more)

// The calling thread's capture mode: relaxed, or the default (global). CUDA keeps it per thread, for
// every device, and so does the model, for every SimBackend of the process.
thread_local bool t_relaxed_capture = false;

std::string hex(std::uintptr_t value) {
  char buf[2 + 2 * sizeof value + 1];
  std::snprintf(buf, sizeof buf, "0x%jx", static_cast<std::uintmax_t>(value));
  return buf;
}
std::string hex(const void* ptr) { return hex(reinterpret_cast<std::uintptr_t>(ptr)); }

struct StreamQueue;

struct SimEvent {
  int device = 0;
  std::uint64_t last_recorded = 0;  // generation of the last record; 0 = never recorded
  // Enqueued records that have not run, with their stream. Usually empty or one entry; a vector so
  // that a pooled event keeps its capacity and steady-state records allocate nothing.
  std::vector<std::pair<std::uint64_t, StreamQueue*>> outstanding;

  bool completed(std::uint64_t generation) const {
    for (const auto& [gen, queue] : outstanding) {
      if (gen == generation) return false;
    }
    return true;
  }
};

struct Item {
  enum class Kind { kWork, kRecord, kWait };
  Kind kind = Kind::kWork;
  std::function<void()> work;       // kWork (user work and memsets)
  std::shared_ptr<SimEvent> event;  // kRecord, kWait: keeps a destroyed event alive until run
  std::uint64_t generation = 0;     // kRecord: this record's; kWait: the awaited record's
};

struct StreamQueue {
  int device = 0;
  std::deque<Item> items;
  // Items ever enqueued / ever finished. Runs are in FIFO order, so "everything enqueued before
  // time t has run" is `finished >= enqueued at t`: host waits never chase work enqueued later.
  std::uint64_t enqueued = 0;
  std::uint64_t finished = 0;
  bool running = false;             // a thread is running this stream's host function right now
  bool capturing = false;           // set_capturing()
  std::uint64_t capture = 0;        // the capture's id while capturing
  std::vector<GraphNode> frontier;  // what its next captured node depends on
};

// Config::fixed_addresses: the device's addresses are numbers from one fixed range per device, the
// lowest free ones that fit first (as a device hands out its own address space), with no host memory
// behind them: the same addresses on every run whatever the host did before, so a replay whose choices
// read the addresses' order (best fit, coalescing) is the same on every run. Nothing may read or write
// that memory (memset_async refuses).
class AddressArena {
 public:
  AddressArena(std::uintptr_t base, std::size_t bytes) { free_.emplace(base, bytes); }

  // The lowest `alignment`-aligned address with `bytes` free after it, taken; 0 when none.
  std::uintptr_t take(std::size_t bytes, std::size_t alignment) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const std::uintptr_t start = (it->first + alignment - 1) / alignment * alignment;
      const std::uintptr_t end = it->first + it->second;
      if (start > end || end - start < bytes) continue;
      const std::uintptr_t head = it->first;
      free_.erase(it);
      if (start > head) free_.emplace(head, start - head);
      if (end > start + bytes) free_.emplace(start + bytes, end - (start + bytes));
      return start;
    }
    return 0;
  }

  // Gives [address, address + bytes) back, merged with its free neighbours.
  void give(std::uintptr_t address, std::size_t bytes) {
    auto next = free_.lower_bound(address);
    if (next != free_.end() && address + bytes == next->first) {
      bytes += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == address) {
        prev->second += bytes;
        return;
      }
    }
    free_.emplace(address, bytes);
  }

 private:
  std::map<std::uintptr_t, std::size_t> free_;  // address -> bytes, disjoint, not adjacent
};

struct DeviceState {
  std::size_t limit = 0;
  std::size_t reserved = 0;
  std::map<std::uintptr_t, std::size_t> allocations;  // address -> bytes; ordered for range checks
  AddressRanges ranges{2 * MiB};                      // the page size is set from the Config
  int maps_to_refuse = 0;                             // fail_next_maps()
  StreamQueue default_stream;
  int capturing_streams = 0;
  std::unique_ptr<AddressArena> arena;  // Config::fixed_addresses
  // The graphs of captures: every node made on a capturing stream, with the nodes it depends on.
  std::unordered_map<GraphNode, std::vector<GraphNode>> graph;
  GraphNode next_node = 0;
  std::uint64_t next_capture = 0;
  // A node of `q`'s capture, after its frontier.
  void capture_node(StreamQueue& q) {
    if (!q.capturing) return;
    const GraphNode node = ++next_node;
    graph[node] = q.frontier;
    q.frontier.assign(1, node);
  }

  // Device memory in use: reservations and mapped pages draw on the same limit.
  std::size_t used() const { return reserved + ranges.mapped_bytes(); }
  bool fits(std::size_t bytes) const { return used() <= limit && bytes <= limit - used(); }

  // True when [address, address + bytes) lies inside one reservation from reserve().
  bool in_allocation(std::uintptr_t address, std::size_t bytes) const {
    auto it = allocations.upper_bound(address);  // the first reservation above `address`
    if (it == allocations.begin()) return false;
    --it;
    return bytes <= it->second && address - it->first <= it->second - bytes;
  }
  bool accessible(std::uintptr_t address, std::size_t bytes) const {
    return in_allocation(address, bytes) || ranges.mapped(address, bytes == 0 ? 1 : bytes);
  }
};

std::string vm_call(const char* call, int device, const void* ptr, std::size_t bytes) {
  return std::string("SimBackend::") + call + "(device " + std::to_string(device) + ", " + hex(ptr) + ", " +
         std::to_string(bytes) + " bytes)";
}

// Host address space for a range: `bytes` of inaccessible, uncommitted addresses aligned to
// `alignment` (a multiple of the host page size). nullptr when the host has no such space.
void* reserve_host_range(std::size_t bytes, std::size_t alignment) {
  if (bytes > SIZE_MAX - alignment) return nullptr;
  const std::size_t padded = bytes + alignment;
  void* raw = mmap(nullptr, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t base = (start + alignment - 1) / alignment * alignment;
  // Trim the padding on both sides; munmap of whole host pages of our own mapping cannot fail.
  if (base > start) munmap(raw, base - start);
  const std::size_t tail = start + padded - (base + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(base + bytes), tail);
  return reinterpret_cast<void*>(base);
}

// Unmapping pages: fresh inaccessible pages replace them, and the host drops their memory.
void drop_host_pages(void* at, std::size_t bytes, const std::string& call) {
  if (mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED) {
    throw Error(ErrorCode::kBackend,
                call + ": the host could not unmap the pages (errno " + std::to_string(errno) + ")");
  }
}

// Unmaps the whole mappings [at, at + bytes) (check_unmap passed): drops their host pages and forgets
// them, closing their exported descriptors (counted in *closed). Returns how many there were.
std::size_t unmap_mappings(DeviceState& dev, std::uintptr_t at, std::size_t bytes, const std::string& call,
                           std::uint64_t* closed) {
  if (!dev.arena) drop_host_pages(reinterpret_cast<void*>(at), bytes, call);
  std::vector<std::uintptr_t> unmapped;
  dev.ranges.for_each_mapping_in(
      at, bytes, [&](std::uintptr_t mapping, std::size_t, AddressRanges::Handle) { unmapped.push_back(mapping); });
  for (std::uintptr_t mapping : unmapped) {
    if (dev.ranges.remove_mapping(mapping).exported >= 0) ++*closed;
  }
  return unmapped.size();
}

}  // namespace

struct SimBackend::State {
  using Lock = std::unique_lock<std::mutex>;

  Config config;
  std::mutex mutex;
  std::condition_variable stream_idle;  // a stream's host function finished
  std::vector<DeviceState> devices;
  std::unordered_map<Stream, StreamQueue> streams;  // non-default streams; nodes never move
  std::unordered_map<Event, std::shared_ptr<SimEvent>> events;
  Stream next_stream = 1;
  Counters counters;
  std::atomic<std::int64_t> time_ns{0};  // Config::replay_clock

  bool eager() const { return config.mode == Mode::kEager; }

  DeviceState& device(int index, const char* call) {
    if (index < 0 || index >= static_cast<int>(devices.size())) {
      throw Error(ErrorCode::kBackend, std::string("SimBackend::") + call + ": device " + std::to_string(index) +
                                           " does not exist (the simulated device has " +
                                           std::to_string(devices.size()) + " device(s))");
    }
    return devices[static_cast<std::size_t>(index)];
  }

  // The queue of (device, stream); a stream value never seen before is adopted as a stream of `index`.
  StreamQueue& queue(int index, Stream stream, const char* call) {
    DeviceState& dev = device(index, call);
    if (stream == 0) return dev.default_stream;
    auto [it, adopted] = streams.try_emplace(stream);
    if (adopted) it->second.device = index;
    check_owner(it->second, index, stream, call);
    return it->second;
  }

  // As queue(), without adopting: nullptr for a stream value never seen.
  const StreamQueue* find_queue(int index, Stream stream, const char* call) {
    DeviceState& dev = device(index, call);
    if (stream == 0) return &dev.default_stream;
    auto it = streams.find(stream);
    if (it == streams.end()) return nullptr;
    check_owner(it->second, index, stream, call);
    return &it->second;
  }

  static void check_owner(const StreamQueue& q, int index, Stream stream, const char* call) {
    if (q.device == index) return;
    throw Error(ErrorCode::kBackend, std::string("SimBackend::") + call + ": stream " + hex(stream) +
                                         " belongs to device " + std::to_string(q.device) + ", not device " +
                                         std::to_string(index) + " (pass the device the stream was created on)");
  }

  const std::shared_ptr<SimEvent>& event(int index, Event handle, const char* call, bool check_device) {
    device(index, call);
    auto it = events.find(handle);
    if (it == events.end()) {
      throw Error(ErrorCode::kBackend, std::string("SimBackend::") + call + ": unknown event " + hex(handle) +
                                           " (never created by this backend, or already destroyed)");
    }
    if (check_device && it->second->device != index) {
      throw Error(ErrorCode::kBackend, std::string("SimBackend::") + call + ": event " + hex(handle) +
                                           " was created on device " + std::to_string(it->second->device) +
                                           ", not device " + std::to_string(index));
    }
    return it->second;
  }

  // As CUDA: while a stream of the device captures, freeing device memory fails in every capture mode,
  // and event queries and waits and stream queries fail in global mode (cudaErrorStreamCaptureUnsupported);
  // counted too, for tests.
  void refuse_during_capture(int index, const char* call) {
    if (devices[static_cast<std::size_t>(index)].capturing_streams == 0) return;
    ++counters.capture_violations;
    throw Error(ErrorCode::kBackend, std::string("SimBackend::") + call + "(device " + std::to_string(index) +
                                         "): operation not permitted while a stream of the device captures a graph "
                                         "(cudaErrorStreamCaptureUnsupported)");
  }
  void refuse_during_capture_unless_relaxed(int index, const char* call) {
    if (!t_relaxed_capture) refuse_during_capture(index, call);
  }

  // Runs `fn` as the host function of `q` with the lock released; `q` must be idle.
  void run_host(Lock& lock, StreamQueue& q, const std::function<void()>& fn) {
    q.running = true;
    lock.unlock();
    try {
      fn();
    } catch (...) {
      lock.lock();
      q.running = false;
      ++q.finished;
      stream_idle.notify_all();
      throw;
    }
    lock.lock();
    q.running = false;
    ++q.finished;
    stream_idle.notify_all();
  }

  // Pops and runs the front item of `q`, which must be idle, non-empty and not blocked.
  void run_front(Lock& lock, StreamQueue& q) {
    Item item = std::move(q.items.front());
    q.items.pop_front();
    switch (item.kind) {
      case Item::Kind::kWork: run_host(lock, q, item.work); return;
      case Item::Kind::kRecord: {
        auto& pending = item.event->outstanding;
        for (auto it = pending.begin(); it != pending.end(); ++it) {
          if (it->first == item.generation) {
            pending.erase(it);
            break;
          }
        }
        break;
      }
      case Item::Kind::kWait: break;
    }
    ++q.finished;
  }

  // Runs items of `q` until `done()` holds, `limit` items ran here, the queue is empty, or (without
  // `cross`) an unsatisfied wait is at the front. With `cross`, the awaited streams are run too.
  template <typename Done>
  std::size_t drain(Lock& lock, StreamQueue& q, std::size_t limit, bool cross, Done done) {
    std::size_t ran = 0;
    while (ran < limit && !done()) {
      if (q.running) {  // another thread is inside this stream's host function; keep order
        stream_idle.wait(lock);
        continue;
      }
      if (q.items.empty()) break;
      const Item& front = q.items.front();
      if (front.kind == Item::Kind::kWait && !front.event->completed(front.generation)) {
        if (!cross) break;
        complete(lock, front.event, front.generation);  // copies: `front` may go while unlocked
        continue;
      }
      run_front(lock, q);
      ++ran;
    }
    return ran;
  }

  // Host wait: runs whatever streams are needed until record `generation` of `event` has run.
  void complete(Lock& lock, std::shared_ptr<SimEvent> event, std::uint64_t generation) {
    while (!event->completed(generation)) {
      StreamQueue* holder = nullptr;
      for (const auto& [gen, q] : event->outstanding) {
        if (gen == generation) holder = q;
      }
      drain(lock, *holder, SIZE_MAX, true, [&] { return event->completed(generation); });
    }
  }

  // Host wait: runs `q` (and what it waits on) until everything enqueued on it so far has run.
  void finish(Lock& lock, StreamQueue& q) {
    const std::uint64_t target = q.enqueued;
    drain(lock, q, SIZE_MAX, true, [&] { return q.finished >= target; });
  }

  void push(Lock& lock, StreamQueue& q, Item item) {
    q.items.push_back(std::move(item));
    ++q.enqueued;
    if (eager()) finish(lock, q);
  }

  // Eager mode on an idle stream: the item would run at once anyway, so skip the queue.
  bool idle_eager(const StreamQueue& q) const { return eager() && q.items.empty() && !q.running; }

  void enqueue_host(Lock& lock, StreamQueue& q, std::function<void()> fn) {
    if (idle_eager(q)) {
      ++q.enqueued;  // counted, so a concurrent synchronize_stream waits for it
      run_host(lock, q, fn);
      return;
    }
    Item item;
    item.kind = Item::Kind::kWork;
    item.work = std::move(fn);
    push(lock, q, std::move(item));
  }

  std::vector<StreamQueue*> queues_of(int index) {  // index < 0: every device
    std::vector<StreamQueue*> out;
    for (std::size_t d = 0; d < devices.size(); ++d) {
      if (index < 0 || static_cast<int>(d) == index) out.push_back(&devices[d].default_stream);
    }
    for (auto& [value, q] : streams) {
      if (index < 0 || q.device == index) out.push_back(&q);
    }
    return out;
  }

  // Like cudaDeviceSynchronize: everything enqueued so far on the device(s) runs.
  void finish_all(Lock& lock, int index) {
    std::vector<std::pair<StreamQueue*, std::uint64_t>> targets;
    for (StreamQueue* q : queues_of(index)) targets.emplace_back(q, q->enqueued);
    for (auto& [q, target] : targets) {
      StreamQueue& queue = *q;
      drain(lock, queue, SIZE_MAX, true, [&, target = target] { return queue.finished >= target; });
    }
  }
};

SimBackend::SimBackend() : SimBackend(Config{}) {}

SimBackend::SimBackend(Config config) : state_(std::make_unique<State>()) {
  if (config.device_count < 1) {
    throw Error(ErrorCode::kConfig,
                "SimBackend: device_count must be at least 1, got " + std::to_string(config.device_count));
  }
  const auto host_page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t granularity = config.vm_granularity;
  if (granularity == 0 || (granularity & (granularity - 1)) != 0 || granularity % host_page != 0) {
    throw Error(ErrorCode::kConfig,
                "SimBackend: vm_granularity must be a power of two and a multiple of the host "
                "page size (" +
                    std::to_string(host_page) + " bytes), got " + std::to_string(granularity));
  }
  state_->config = config;
  state_->devices.resize(static_cast<std::size_t>(config.device_count));
  for (std::size_t d = 0; d < state_->devices.size(); ++d) {
    state_->devices[d].limit = config.memory_per_device;
    state_->devices[d].ranges = AddressRanges(granularity);
    state_->devices[d].default_stream.device = static_cast<int>(d);
    if (!config.fixed_addresses) continue;
    // Room for the device's memory twice over (reservations of every size can leave gaps between them)
    // and, with virtual memory, its address space.
    std::size_t bytes = config.memory_per_device;
    if (bytes > (std::size_t{1} << 44)) {
      throw Error(ErrorCode::kConfig, "SimBackend: memory_per_device is too large for fixed_addresses");
    }
    bytes = 2 * ((bytes + granularity - 1) / granularity * granularity);
    if (config.virtual_memory) {
      const std::size_t space = config.address_space_per_device / granularity * granularity;
      if (space > (std::size_t{1} << 47) - bytes) {
        throw Error(ErrorCode::kConfig, "SimBackend: address_space_per_device is too large for fixed_addresses");
      }
      bytes += space;
    }
    // Device d's range starts at (d + 1) * 2^48: below 2^64 for every device count the host can hold.
    state_->devices[d].arena = std::make_unique<AddressArena>((std::uintptr_t{d} + 1) << 48, bytes);
  }
}

SimBackend::~SimBackend() {
  // Queued work is dropped unrun; memory the caller never released (leak tests) is freed here.
  for (DeviceState& dev : state_->devices) {
    if (dev.arena) continue;  // fixed addresses: no host memory behind them
    for (const auto& [address, bytes] : dev.allocations) std::free(reinterpret_cast<void*>(address));
    dev.ranges.for_each_range(
        [](std::uintptr_t base, std::size_t bytes) { munmap(reinterpret_cast<void*>(base), bytes); });
  }
}

std::string SimBackend::name() const { return "sim"; }

int SimBackend::device_count() const { return state_->config.device_count; }

void* SimBackend::reserve(int device, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "reserve");
  if (bytes == 0) {
    throw Error(ErrorCode::kBackend,
                "SimBackend::reserve(device " + std::to_string(device) + "): zero-byte reservation requested");
  }
  ++state_->counters.reserve_calls;
  if (!dev.fits(bytes)) return nullptr;
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < bytes) return nullptr;  // overflow: cannot exist
  void* ptr = nullptr;
  if (dev.arena) {
    ptr = reinterpret_cast<void*>(dev.arena->take(rounded, kAlignment));
    if (ptr == nullptr) return nullptr;  // the range is too fragmented: as a device out of address space
  } else {
    ptr = std::aligned_alloc(kAlignment, rounded);
    if (ptr == nullptr) return nullptr;  // the host itself is out of memory: the same outcome
  }
  dev.allocations.emplace(reinterpret_cast<std::uintptr_t>(ptr), bytes);
  dev.reserved += bytes;
  return ptr;
}

void SimBackend::release(int device, void* ptr, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "release");
  state_->refuse_during_capture(device, "release");
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto check = [&](std::map<std::uintptr_t, std::size_t>::iterator it) {
    const std::string call =
        "SimBackend::release(device " + std::to_string(device) + ", " + hex(ptr) + ", " + std::to_string(bytes) + ")";
    if (it == dev.allocations.end()) {
      throw Error(ErrorCode::kBackend,
                  call + ": pointer was not returned by reserve() on this device (double release or foreign pointer)");
    }
    if (it->second != bytes) {
      throw Error(ErrorCode::kBackend,
                  call + ": the reservation has " + std::to_string(it->second) + " bytes; pass the reserved size");
    }
  };
  check(dev.allocations.find(address));
  ++state_->counters.release_calls;
  // cudaFree synchronizes the device: work still queued for this memory runs before it goes.
  state_->finish_all(lock, device);
  auto it = dev.allocations.find(address);
  check(it);  // again: another thread may have released it while the streams ran unlocked
  dev.allocations.erase(it);
  dev.reserved -= bytes;
  if (dev.arena) {
    dev.arena->give(address, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  } else {
    std::free(ptr);
  }
}

Event SimBackend::create_event(int device) {
  auto event = std::make_shared<SimEvent>();
  event->device = device;
  State::Lock lock(state_->mutex);
  state_->device(device, "create_event");
  ++state_->counters.events_created;
  Event handle = event.get();
  state_->events.emplace(handle, std::move(event));
  return handle;
}

void SimBackend::destroy_event(int device, Event event) {
  State::Lock lock(state_->mutex);
  state_->event(device, event, "destroy_event", true);
  ++state_->counters.events_destroyed;
  state_->events.erase(event);  // queued records/waits still hold it (CUDA allows destroying early)
}

void SimBackend::record_event(int device, Event event, Stream stream) {
  State::Lock lock(state_->mutex);
  const std::shared_ptr<SimEvent>& ev = state_->event(device, event, "record_event", true);
  StreamQueue& q = state_->queue(device, stream, "record_event");
  if (q.capturing) {
    // On CUDA the record would become a node of the graph, never a fence the host can query.
    ++state_->counters.capture_violations;
    throw Error(ErrorCode::kBackend, "SimBackend::record_event(device " + std::to_string(device) + ", stream " +
                                         hex(stream) +
                                         "): the stream captures a graph; the event would be part of "
                                         "the graph, not a fence");
  }
  ++state_->counters.event_records;
  const std::uint64_t generation = ++ev->last_recorded;
  if (state_->idle_eager(q)) return;  // nothing ahead of it: complete now, no queue item
  ev->outstanding.emplace_back(generation, &q);
  Item item;
  item.kind = Item::Kind::kRecord;
  item.event = ev;
  item.generation = generation;
  state_->push(lock, q, std::move(item));
}

bool SimBackend::query_event(int device, Event event) {
  State::Lock lock(state_->mutex);
  const std::shared_ptr<SimEvent>& ev = state_->event(device, event, "query_event", true);
  state_->refuse_during_capture_unless_relaxed(device, "query_event");
  ++state_->counters.event_queries;
  return ev->completed(ev->last_recorded);
}

bool SimBackend::query_stream(int device, Stream stream) {
  State::Lock lock(state_->mutex);
  const StreamQueue& q = state_->queue(device, stream, "query_stream");
  if (q.capturing) {
    ++state_->counters.capture_violations;
    throw Error(ErrorCode::kBackend, "SimBackend::query_stream(device " + std::to_string(device) + ", stream " +
                                         hex(stream) +
                                         "): the stream captures a graph (cudaErrorStreamCaptureUnsupported)");
  }
  state_->refuse_during_capture_unless_relaxed(device, "query_stream");
  ++state_->counters.stream_queries;
  return q.finished == q.enqueued;
}

void SimBackend::synchronize_event(int device, Event event) {
  State::Lock lock(state_->mutex);
  std::shared_ptr<SimEvent> ev = state_->event(device, event, "synchronize_event", true);
  state_->refuse_during_capture_unless_relaxed(device, "synchronize_event");
  ++state_->counters.event_synchronizes;
  const std::uint64_t generation = ev->last_recorded;
  state_->complete(lock, std::move(ev), generation);
}

void SimBackend::stream_wait_event(int device, Stream stream, Event event) {
  State::Lock lock(state_->mutex);
  // No device check on the event: a stream may wait on an event of another device, as in CUDA.
  const std::shared_ptr<SimEvent>& ev = state_->event(device, event, "stream_wait_event", false);
  StreamQueue& q = state_->queue(device, stream, "stream_wait_event");
  ++state_->counters.stream_waits;
  if (ev->completed(ev->last_recorded)) return;  // nothing to wait for: a no-op, as on a device
  Item item;
  item.kind = Item::Kind::kWait;
  item.event = ev;
  item.generation = ev->last_recorded;
  state_->push(lock, q, std::move(item));
}

bool SimBackend::is_capturing(int device, Stream stream) {
  State::Lock lock(state_->mutex);
  return state_->queue(device, stream, "is_capturing").capturing;
}

int SimBackend::relax_capture_mode() {
  const int previous = t_relaxed_capture ? 1 : 0;
  t_relaxed_capture = true;
  return previous;
}

void SimBackend::restore_capture_mode(int previous) { t_relaxed_capture = previous != 0; }

void SimBackend::memset_async(int device, void* ptr, int value, std::size_t bytes, Stream stream) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "memset_async");
  StreamQueue& q = state_->queue(device, stream, "memset_async");
  // The range must lie inside one reservation or in mapped pages of one range, as a kernel would
  // otherwise fault.
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  if (!dev.accessible(address, bytes)) {
    const std::string call = "SimBackend::memset_async(device " + std::to_string(device) + ", " + hex(ptr) + ", " +
                             std::to_string(bytes) + " bytes)";
    if (dev.ranges.reserved(address, bytes == 0 ? 1 : bytes)) {
      throw Error(ErrorCode::kBackend, call +
                                           ": range touches pages of a reserved address range that are not "
                                           "mapped (a device access there faults)");
    }
    throw Error(ErrorCode::kBackend, call + ": range is not inside memory reserved on this device");
  }
  if (dev.arena) {
    throw Error(ErrorCode::kBackend, "SimBackend::memset_async(device " + std::to_string(device) +
                                         "): the device's memory has fixed addresses (Config::fixed_addresses) "
                                         "and no host memory behind them");
  }
  ++state_->counters.memsets;
  dev.capture_node(q);
  state_->enqueue_host(lock, q, [ptr, value, bytes] { std::memset(ptr, value, bytes); });
}

DeviceMemoryInfo SimBackend::memory_info(int device) {
  State::Lock lock(state_->mutex);
  const DeviceState& dev = state_->device(device, "memory_info");
  DeviceMemoryInfo info;
  info.total_bytes = dev.limit;
  info.free_bytes = dev.limit > dev.used() ? dev.limit - dev.used() : 0;
  return info;
}

int SimBackend::stream_device(Stream stream) {
  if (stream == 0) return -1;  // the default stream exists on every device
  State::Lock lock(state_->mutex);
  ++state_->counters.stream_device_queries;
  auto it = state_->streams.find(stream);
  return it == state_->streams.end() ? -1 : it->second.device;
}

bool SimBackend::supports_virtual_memory(int device) {
  State::Lock lock(state_->mutex);
  state_->device(device, "supports_virtual_memory");
  return state_->config.virtual_memory;
}

std::size_t SimBackend::vm_granularity(int device) {
  State::Lock lock(state_->mutex);
  const DeviceState& dev = state_->device(device, "vm_granularity");
  if (!state_->config.virtual_memory) unsupported("vm_granularity", device);
  return dev.ranges.page_bytes();
}

void* SimBackend::reserve_address_range(int device, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "reserve_address_range");
  if (!state_->config.virtual_memory) unsupported("reserve_address_range", device);
  dev.ranges.check_size(bytes, "SimBackend::reserve_address_range(device " + std::to_string(device) + ", " +
                                   std::to_string(bytes) + " bytes)");
  const std::size_t space = state_->config.address_space_per_device;
  const std::size_t taken = dev.ranges.reserved_bytes();
  if (taken > space || bytes > space - taken) return nullptr;
  void* base = dev.arena ? reinterpret_cast<void*>(dev.arena->take(bytes, dev.ranges.page_bytes()))
                         : reserve_host_range(bytes, dev.ranges.page_bytes());
  if (base == nullptr) return nullptr;  // the host's address space is exhausted: the same outcome
  dev.ranges.add_range(reinterpret_cast<std::uintptr_t>(base), bytes);
  ++state_->counters.address_range_reserves;
  return base;
}

bool SimBackend::map_pages(int device, void* at, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "map_pages");
  if (!state_->config.virtual_memory) unsupported("map_pages", device);
  const auto address = reinterpret_cast<std::uintptr_t>(at);
  const std::string call = vm_call("map_pages", device, at, bytes);
  dev.ranges.check_map(address, bytes, call);
  const bool refused = dev.maps_to_refuse > 0 || !dev.fits(bytes);
  if (refused || (!dev.arena && mprotect(at, bytes, PROT_READ | PROT_WRITE) != 0)) {
    if (dev.maps_to_refuse > 0) --dev.maps_to_refuse;
    if (!refused) drop_host_pages(at, bytes, call);  // the host ran out part way: undo the pages it changed
    ++state_->counters.map_refusals;
    return false;
  }
  dev.ranges.add_mapping(address, bytes, 0);
  ++state_->counters.physical_allocations_created;
  return true;
}

void SimBackend::unmap_pages(int device, void* at, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "unmap_pages");
  if (!state_->config.virtual_memory) unsupported("unmap_pages", device);
  state_->refuse_during_capture(device, "unmap_pages");
  const std::string call = vm_call("unmap_pages", device, at, bytes);
  const auto address = reinterpret_cast<std::uintptr_t>(at);
  dev.ranges.check_unmap(address, bytes, call);
  // As the CUDA backend does before cuMemUnmap: work queued for this memory runs before it goes.
  state_->finish_all(lock, device);
  dev.ranges.check_unmap(address, bytes, call);  // again: another thread may have unmapped it meanwhile
  state_->counters.physical_allocations_released +=
      unmap_mappings(dev, address, bytes, call, &state_->counters.exports_closed);
  ++state_->counters.page_unmaps;
}

void SimBackend::unmap_unused_pages(int device, void* at, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "unmap_unused_pages");
  if (!state_->config.virtual_memory) unsupported("unmap_unused_pages", device);
  const std::string call = vm_call("unmap_unused_pages", device, at, bytes);
  const auto address = reinterpret_cast<std::uintptr_t>(at);
  dev.ranges.check_unmap(address, bytes, call);
  // Nothing to wait for: no work has used this memory.
  state_->counters.physical_allocations_released +=
      unmap_mappings(dev, address, bytes, call, &state_->counters.exports_closed);
  ++state_->counters.unused_page_unmaps;
}

void SimBackend::release_address_range(int device, void* base, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "release_address_range");
  if (!state_->config.virtual_memory) unsupported("release_address_range", device);
  const auto address = reinterpret_cast<std::uintptr_t>(base);
  dev.ranges.check_release(address, bytes, vm_call("release_address_range", device, base, bytes));
  if (dev.arena) {
    dev.arena->give(address, bytes);
  } else {
    munmap(base, bytes);  // whole pages of our own mapping: cannot fail
  }
  dev.ranges.remove_range(address);
  ++state_->counters.address_range_releases;
}

int SimBackend::export_piece(int device, void* piece) {
  State::Lock lock(state_->mutex);
  DeviceState& dev = state_->device(device, "export_piece");
  if (!state_->config.virtual_memory) unsupported("export_piece", device);
  const std::string call = "SimBackend::export_piece(device " + std::to_string(device) + ", " + hex(piece) + ")";
  AddressRanges::Mapping* mapping = dev.ranges.mapping_at(reinterpret_cast<std::uintptr_t>(piece));
  if (mapping == nullptr) {
    throw Error(ErrorCode::kBackend, call + ": no mapping starts there (pass a piece's first address)");
  }
  if (mapping->exported >= 0) return mapping->exported;
  if (!state_->config.exportable_pieces) {
    throw Error(ErrorCode::kBackend,
                call +
                    ": mapped memory of this device cannot be exported (the simulated driver refuses it: "
                    "Config::exportable_pieces)");
  }
  // Descriptor-like numbers, never reused, above those a process has open at its start.
  mapping->exported = static_cast<int>(1000 + state_->counters.pieces_exported++);
  return mapping->exported;
}

Stream SimBackend::create_stream(int device) {
  State::Lock lock(state_->mutex);
  state_->device(device, "create_stream");
  while (state_->streams.count(state_->next_stream) != 0) ++state_->next_stream;  // skip adopted values
  const Stream stream = state_->next_stream++;
  state_->streams[stream].device = device;
  return stream;
}

void SimBackend::enqueue(int device, Stream stream, std::function<void()> work) {
  State::Lock lock(state_->mutex);
  StreamQueue& q = state_->queue(device, stream, "enqueue");
  state_->devices[static_cast<std::size_t>(device)].capture_node(q);
  state_->enqueue_host(lock, q, std::move(work));
}

std::size_t SimBackend::advance(int device, Stream stream, std::size_t items) {
  State::Lock lock(state_->mutex);
  StreamQueue& q = state_->queue(device, stream, "advance");
  return state_->drain(lock, q, items, false, [] { return false; });
}

void SimBackend::synchronize_stream(int device, Stream stream) {
  State::Lock lock(state_->mutex);
  state_->finish(lock, state_->queue(device, stream, "synchronize_stream"));
}

void SimBackend::synchronize_all() {
  State::Lock lock(state_->mutex);
  state_->finish_all(lock, -1);
}

std::size_t SimBackend::queued_items(int device, Stream stream) const {
  State::Lock lock(state_->mutex);
  const StreamQueue* q = state_->find_queue(device, stream, "queued_items");
  return q == nullptr ? 0 : static_cast<std::size_t>(q->enqueued - q->finished);
}

void SimBackend::set_capturing(int device, Stream stream, bool capturing) {
  State::Lock lock(state_->mutex);
  StreamQueue& q = state_->queue(device, stream, "set_capturing");
  if (q.capturing == capturing) return;
  DeviceState& dev = state_->devices[static_cast<std::size_t>(device)];
  q.capturing = capturing;
  q.capture = capturing ? ++dev.next_capture : 0;
  q.frontier.clear();
  dev.capturing_streams += capturing ? 1 : -1;
}

void SimBackend::join_capture(int device, Stream waiting, Stream source) {
  State::Lock lock(state_->mutex);
  StreamQueue& from = state_->queue(device, source, "join_capture");
  StreamQueue& q = state_->queue(device, waiting, "join_capture");
  if (!from.capturing) {
    throw Error(ErrorCode::kInvalidArgument, "SimBackend::join_capture(device " + std::to_string(device) +
                                                 "): stream " + hex(source) + " does not capture");
  }
  if (!q.capturing) {
    q.capturing = true;
    q.frontier.clear();
    ++state_->devices[static_cast<std::size_t>(device)].capturing_streams;
  }
  q.capture = from.capture;
  for (const GraphNode node : from.frontier) {
    if (std::find(q.frontier.begin(), q.frontier.end(), node) == q.frontier.end()) q.frontier.push_back(node);
  }
}

bool SimBackend::capture_info(int device, Stream stream, CaptureInfo* info) {
  State::Lock lock(state_->mutex);
  const StreamQueue& q = state_->queue(device, stream, "capture_info");
  if (!q.capturing) return false;
  info->id = q.capture;
  info->frontier = q.frontier;
  return true;
}

std::vector<GraphNode> SimBackend::graph_node_dependencies(int device, GraphNode node) {
  State::Lock lock(state_->mutex);
  const DeviceState& dev = state_->device(device, "graph_node_dependencies");
  const auto found = dev.graph.find(node);
  if (found == dev.graph.end()) {
    throw Error(ErrorCode::kInvalidArgument, "SimBackend::graph_node_dependencies(device " + std::to_string(device) +
                                                 "): no node " + std::to_string(node));
  }
  return found->second;
}

void SimBackend::set_memory_limit(int device, std::size_t bytes) {
  State::Lock lock(state_->mutex);
  state_->device(device, "set_memory_limit").limit = bytes;
}

std::size_t SimBackend::reserved_bytes(int device) const {
  State::Lock lock(state_->mutex);
  return state_->device(device, "reserved_bytes").reserved;
}

std::size_t SimBackend::mapped_bytes(int device) const {
  State::Lock lock(state_->mutex);
  return state_->device(device, "mapped_bytes").ranges.mapped_bytes();
}

std::size_t SimBackend::mappings(int device) const {
  State::Lock lock(state_->mutex);
  return state_->device(device, "mappings").ranges.mapping_count();
}

bool SimBackend::accessible(int device, const void* ptr, std::size_t bytes) const {
  State::Lock lock(state_->mutex);
  return state_->device(device, "accessible").accessible(reinterpret_cast<std::uintptr_t>(ptr), bytes);
}

void SimBackend::fail_next_maps(int device, int count) {
  State::Lock lock(state_->mutex);
  state_->device(device, "fail_next_maps").maps_to_refuse = count;
}

void SimBackend::validate() const {
  State::Lock lock(state_->mutex);
  for (std::size_t d = 0; d < state_->devices.size(); ++d) {
    const DeviceState& dev = state_->devices[d];
    auto fail = [d](const std::string& why) {
      throw Error(ErrorCode::kBackend, "SimBackend::validate: device " + std::to_string(d) + ": " + why);
    };
    std::size_t reserved = 0;
    for (const auto& [address, bytes] : dev.allocations) reserved += bytes;
    if (reserved != dev.reserved) {
      fail("reserved bytes are " + std::to_string(dev.reserved) + ", the reservations sum to " +
           std::to_string(reserved));
    }
    const std::string ranges = dev.ranges.validate();
    if (!ranges.empty()) fail(ranges);
    dev.ranges.for_each_range([&](std::uintptr_t base, std::size_t bytes) {
      auto it = dev.allocations.lower_bound(base);
      if (it != dev.allocations.end() && it->first - base < bytes) fail("a reservation lies inside range " + hex(base));
      if (it != dev.allocations.begin() && base - std::prev(it)->first < std::prev(it)->second) {
        fail("range " + hex(base) + " starts inside a reservation");
      }
    });
  }
}

SimBackend::Counters SimBackend::counters() const {
  State::Lock lock(state_->mutex);
  return state_->counters;
}

SimBackend::Mode SimBackend::mode() const { return state_->config.mode; }

const std::atomic<std::int64_t>* SimBackend::replay_clock() const {
  return state_->config.replay_clock ? &state_->time_ns : nullptr;
}

void SimBackend::set_time(std::int64_t ns) {
  if (!state_->config.replay_clock) {
    throw Error(ErrorCode::kInvalidArgument,
                "SimBackend::set_time: the backend has no replay clock (Config::replay_clock)");
  }
  const std::int64_t now = state_->time_ns.load(std::memory_order_relaxed);
  if (ns < now) {
    throw Error(ErrorCode::kInvalidArgument, "SimBackend::set_time(" + std::to_string(ns) +
                                                 "): the replay clock is at " + std::to_string(now) +
                                                 " ns and never runs back");
  }
  state_->time_ns.store(ns, std::memory_order_relaxed);
}

}  // namespace streamalloc

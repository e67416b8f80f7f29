// SimBackend: a faithful model of a CUDA device, for CPU-only tests, the CPU demo and trace replay.
//
// - Memory is real host memory (aligned to 512 B) under a per-device limit, so poisoning and data
//   races can be observed and OOM paths run.
// - A stream is a FIFO queue of work items: user work (a host function standing in for a kernel or a
//   copy), event records, waits on events, memsets. Items run only when the stream is advanced, in
//   queue order. In Mode::kEager every enqueue drains the stream at once (a device that is always
//   idle); in Mode::kManual tests advance streams explicitly, so they can put a consumer ahead of a
//   producer and watch the wrong bytes being read.
// - An event completes when its stream runs the record item. query_event is true when the *last*
//   record has run (or the event was never recorded), as in CUDA.
// - stream_wait_event makes the waiting stream stop at that point until the event's record (the one
//   that was last when wait was called) has run; advancing a stream never runs work of another stream.
//   Host-side synchronize_event (and synchronize_stream) run whatever is needed, on any stream, for the
//   awaited point to be reached, as a real host wait would let the device do.
// - Streams are identified by the Stream values create_stream() hands out, plus the default stream 0
//   on every device. A stream value the backend has never seen is adopted on first use as a stream of
//   the device it is used with, so handles coming through the C ABI work too.
// - query_stream is true when every item enqueued on the stream so far has run (a host function still
//   running counts as not run), as cudaStreamQuery.
// - set_capturing() marks a stream as capturing a graph. While any stream of the device captures,
//   query_event, query_stream and synchronize_event fail as CUDA's do in the calling thread's default
//   (global) capture mode, and release fails in every mode; in relaxed mode (relax_capture_mode(), kept
//   per thread as CUDA keeps it) the queries and waits work, except query_stream on the capturing
//   stream itself. record_event on a capturing stream fails (on CUDA it would become a graph node, not
//   a fence). Each failure is also counted as a capture violation. reserve() works (relaxed-mode
//   cudaMalloc). A capture has a graph: set_capturing(true) starts one on the stream (an empty
//   frontier), join_capture() is a wait of one stream for another inside a capture (the waiting stream
//   joins the capture, and its frontier takes in the other's), and each enqueue or memset on a
//   capturing stream adds a node that depends on the stream's frontier and becomes its frontier
//   (the work is still queued and runs as outside a capture). capture_info and
//   graph_node_dependencies read that graph.
// - Virtual memory (Backend's contract) is modelled with host virtual memory: a reserved range is an
//   inaccessible host mapping (so it never overlaps reserve()'s memory, and a stray host access to it
//   faults as a device access would), map_pages makes whole pages of it readable and writable as one
//   mapping (one physical allocation, counted), and unmap_pages drops whole mappings again. Mapped
//   memory counts against the same device limit as reserve() (memory_info's free bytes drop as it
//   maps), so map_pages returns false when it does not fit. Address space per device is bounded too
//   (Config), so reserve_address_range can return nullptr. memset_async checks that every byte it
//   fills is reserved or mapped memory, and accessible() is the same check for tests. unmap_pages
//   synchronizes the device and is refused during a capture, as release is; unmap_unused_pages,
//   reserving, mapping and releasing a range work during one, as on CUDA. Mapped pages read as zero
//   here; on a device their contents are undefined. export_piece hands out a descriptor-like number per
//   mapping (unique in the backend, the same on every call for that mapping), closed, that is
//   forgotten and counted, when the mapping is unmapped; Config::exportable_pieces false models a
//   driver that refuses exportable memory (export_piece throws, nothing changes).
//
// Work functions run on the thread that advances the stream, with no backend lock held; they must
// not call back into the backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "streamalloc/backend.hpp"

namespace streamalloc {

class SimBackend final : public Backend {
 public:
  enum class Mode { kEager, kManual };

  struct Config {
    int device_count = 1;
    std::size_t memory_per_device = 1 * GiB;  // the device "total"; reserve fails beyond it
    Mode mode = Mode::kEager;
    bool virtual_memory = true;                         // supports_virtual_memory(); false models a device without
    std::size_t vm_granularity = 2 * MiB;               // a power of two, a multiple of the host page size
    std::size_t address_space_per_device = 1024 * GiB;  // reserve_address_range fails beyond it
    // The allocator reads its fence pacing time from set_time() (Backend::replay_clock) instead of the
    // host's clock: a replay gives it the recorded job's time.
    bool replay_clock = false;
    // Device addresses come from one host range per device, lowest first, so that their order is the same
    // on every run (a replay's outcome can depend on it: best fit and coalescing order by address).
    // Otherwise reservations come from the host's heap and mappings where the host puts them.
    bool fixed_addresses = false;
    bool exportable_pieces = true;  // export_piece works; false: it throws, as without driver support
  };

  struct Counters {  // COUNT of backend calls, for tests that check batching and host syncs
    std::uint64_t reserve_calls = 0;
    std::uint64_t release_calls = 0;
    std::uint64_t events_created = 0;
    std::uint64_t events_destroyed = 0;
    std::uint64_t event_records = 0;
    std::uint64_t event_queries = 0;
    std::uint64_t stream_queries = 0;
    std::uint64_t stream_device_queries = 0;  // stream_device calls on a stream other than the default
    std::uint64_t event_synchronizes = 0;
    std::uint64_t stream_waits = 0;
    std::uint64_t memsets = 0;
    std::uint64_t capture_violations = 0;      // a query or event sync while a stream of the device captures
    std::uint64_t address_range_reserves = 0;  // reserve_address_range calls that returned a range
    std::uint64_t address_range_releases = 0;
    // map_pages calls that mapped: each created one physical allocation (what a growth costs on a device)
    std::uint64_t physical_allocations_created = 0;
    std::uint64_t physical_allocations_released = 0;  // mappings unmapped, by either unmap call
    std::uint64_t map_refusals = 0;                   // map_pages calls that returned false (device full, or injected)
    std::uint64_t page_unmaps = 0;                    // unmap_pages calls
    std::uint64_t unused_page_unmaps = 0;             // unmap_unused_pages calls
    std::uint64_t pieces_exported = 0;                // descriptors export_piece made (one per mapping)
    std::uint64_t exports_closed = 0;                 // of those, closed because their mapping was unmapped
  };

  SimBackend();
  explicit SimBackend(Config config);
  ~SimBackend() override;

  // ---- Backend ----
  std::string name() const override;
  int device_count() const override;
  void* reserve(int device, std::size_t bytes) override;
  void release(int device, void* ptr, std::size_t bytes) override;
  Event create_event(int device) override;
  void destroy_event(int device, Event event) override;
  void record_event(int device, Event event, Stream stream) override;
  bool query_event(int device, Event event) override;
  bool query_stream(int device, Stream stream) override;
  void synchronize_event(int device, Event event) override;
  void stream_wait_event(int device, Stream stream, Event event) override;
  bool is_capturing(int device, Stream stream) override;
  bool capture_info(int device, Stream stream, CaptureInfo* info) override;
  std::vector<GraphNode> graph_node_dependencies(int device, GraphNode node) override;
  int relax_capture_mode() override;
  void restore_capture_mode(int previous) override;
  void memset_async(int device, void* ptr, int value, std::size_t bytes, Stream stream) override;
  DeviceMemoryInfo memory_info(int device) override;
  int stream_device(Stream stream) override;
  bool supports_virtual_memory(int device) override;
  std::size_t vm_granularity(int device) override;
  const std::atomic<std::int64_t>* replay_clock() const override;
  void* reserve_address_range(int device, std::size_t bytes) override;
  bool map_pages(int device, void* at, std::size_t bytes) override;
  void unmap_pages(int device, void* at, std::size_t bytes) override;
  void unmap_unused_pages(int device, void* at, std::size_t bytes) override;
  void release_address_range(int device, void* base, std::size_t bytes) override;
  int export_piece(int device, void* piece) override;

  // ---- simulation control (tests, demo, replay) ----
  Stream create_stream(int device = 0);
  // Enqueue user work (a "kernel") on a stream.
  void enqueue(int device, Stream stream, std::function<void()> work);
  // Run up to `items` items of `stream` in order; stops early at an unsatisfied wait or an empty
  // queue. Returns the number of items run.
  std::size_t advance(int device, Stream stream, std::size_t items = 1);
  // Run `stream` until it is empty, running other streams as needed to satisfy its waits.
  void synchronize_stream(int device, Stream stream);
  // Run every stream of every device until all are empty.
  void synchronize_all();
  std::size_t queued_items(int device, Stream stream) const;

  void set_capturing(int device, Stream stream, bool capturing);
  // `waiting` waits for `source` inside `source`'s capture (an event recorded on `source` and waited
  // for on `waiting`, captured): `waiting` captures from now on, in the same capture, and its next
  // node depends on both frontiers. Throws Error(kInvalidArgument) when `source` does not capture.
  void join_capture(int device, Stream waiting, Stream source);
  // The replay clock's time, in nanoseconds (Config::replay_clock; it starts at 0). Throws
  // Error(kInvalidArgument), and changes nothing, without a replay clock or when `ns` is less than the
  // time it has: the clock never runs back.
  void set_time(std::int64_t ns);
  // Change the device memory limit (OOM tests).
  void set_memory_limit(int device, std::size_t bytes);
  std::size_t reserved_bytes(int device) const;  // from reserve()
  std::size_t mapped_bytes(int device) const;    // memory mapped by map_pages()
  std::size_t mappings(int device) const;        // COUNT of physical allocations mapped now
  // True when the device may touch every byte of [ptr, ptr + bytes): they lie inside one reservation
  // from reserve(), or in mapped pages of one reserved address range. An address in a reserved range
  // whose page is not mapped is not accessible (on a device, touching it faults).
  bool accessible(int device, const void* ptr, std::size_t bytes) const;
  // The next `count` map_pages calls on `device` return false as if the device were full.
  void fail_next_maps(int device, int count);
  // Throws Error(kBackend) naming the first broken invariant of the memory model: the sum of the
  // reservations, the address ranges' bookkeeping (AddressRanges::validate), no range overlapping a
  // reservation.
  void validate() const;
  Counters counters() const;
  Mode mode() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace streamalloc

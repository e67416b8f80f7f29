// The device seam: the only way the allocator touches a device.
//
// Two implementations: CudaBackend (CUDA runtime and driver; the only file that includes CUDA headers) and
// SimBackend (a simulated device for CPU-only tests, the demo and trace replay). Everything above this
// seam is plain C++ and is tested on the simulated device.
//
// Contracts every implementation keeps:
//  - Calls may come from any thread; the implementation is thread-safe.
//  - Device-scoped calls take the device explicitly and leave the caller's current device unchanged.
//  - Failures other than "out of memory" are reported by throwing streamalloc::Error(kBackend, ...)
//    with a message that names the call and the runtime's error string.
//  - Virtual memory (the calls after memory_info) is optional: a backend without it keeps the
//    defaults below, which say so (supports_virtual_memory() is false, the rest throw).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "streamalloc/types.hpp"

namespace streamalloc {

struct DeviceMemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

// A node of a graph being captured (cudaGraphNode_t), as an integer.
using GraphNode = std::uintptr_t;

// Where a capturing stream stands in its graph.
struct CaptureInfo {
  std::uint64_t id = 0;             // the capture's id, the same on every stream the capture spans
  std::vector<GraphNode> frontier;  // the nodes the stream's next captured work will depend on
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cuda" or "sim"; shown in reports so every output says where it ran.
  virtual std::string name() const = 0;
  virtual int device_count() const = 0;

  // Reserve `bytes` of device memory on `device`. Returns nullptr when the device has not enough free
  // memory (that is an expected outcome, not an error). Returned memory is 512-byte aligned.
  virtual void* reserve(int device, std::size_t bytes) = 0;
  // Give back memory from reserve(). May synchronize the device (cudaFree does).
  virtual void release(int device, void* ptr, std::size_t bytes) = 0;

  // Events. create_event never times; events are reused by the caller's pool.
  virtual Event create_event(int device) = 0;
  virtual void destroy_event(int device, Event event) = 0;
  // Enqueue `event` on `stream`: it completes when all work enqueued on `stream` before it has.
  virtual void record_event(int device, Event event, Stream stream) = 0;
  // True when the last record of `event` has completed (or it was never recorded). Never blocks.
  virtual bool query_event(int device, Event event) = 0;
  // Block the calling host thread until the last record of `event` has completed.
  virtual void synchronize_event(int device, Event event) = 0;
  // True when all work enqueued on `stream` so far has completed (cudaStreamQuery). Never blocks. Never
  // allowed on a stream that captures; otherwise as an event query (below, capture modes).
  virtual bool query_stream(int device, Stream stream) = 0;
  // Make all work enqueued on `stream` after this call wait for the last record of `event`.
  // The host does not wait.
  virtual void stream_wait_event(int device, Stream stream, Event event) = 0;

  // True while `stream` is capturing a CUDA graph: nothing may be recorded on it or asked of it then.
  virtual bool is_capturing(int device, Stream stream) = 0;
  // The calling thread's capture mode, as CUDA's (cudaThreadExchangeStreamCaptureMode). In the default
  // (global) mode, while any stream of the device captures a graph in global mode, event queries and
  // waits and stream queries are refused and break that capture. In relaxed mode the thread may query
  // and wait for events recorded outside a capture, and record events on and query streams that do
  // not capture, while other streams capture. Freeing memory stays refused during a capture in every
  // mode. relax_capture_mode() switches the thread to relaxed and returns its previous mode, for
  // restore_capture_mode(); a backend whose calls never break a capture keeps these no-ops.
  virtual int relax_capture_mode() { return 0; }
  virtual void restore_capture_mode(int previous) { (void)previous; }
  // The topology of a capture, for reusing inside it memory that other streams of the capture used
  // (PyTorch's graph_capture_record_stream_reuse): true, with `info` filled, while `stream` captures;
  // false when it does not or the backend cannot tell (such memory then waits for the capture's end).
  // Neither call breaks a capture; graph_node_dependencies asks about a node of a capture under way.
  virtual bool capture_info(int device, Stream stream, CaptureInfo* info) {
    (void)device;
    (void)stream;
    (void)info;
    return false;
  }
  virtual std::vector<GraphNode> graph_node_dependencies(int device, GraphNode node) {
    (void)device;
    (void)node;
    return {};
  }
  // Fill `bytes` at `ptr` with `value` in stream order on `stream` (used for poisoning).
  virtual void memset_async(int device, void* ptr, int value, std::size_t bytes, Stream stream) = 0;

  // The clock the allocator paces its fence passes and polls by and dates freed blocks with, on its
  // device-locked paths (never its per-stream fast path): nullptr, the default, for the host's steady
  // clock; a simulated device that replays a recorded job gives the job's time (nanoseconds on the
  // steady clock's scale), which it alone advances. Asked once, when a device's cache is made.
  virtual const std::atomic<std::int64_t>* replay_clock() const { return nullptr; }

  // Free and total memory of the device; memory from reserve() and from map_pages() both count.
  virtual DeviceMemoryInfo memory_info(int device) = 0;
  // The device `stream` belongs to, or -1 when the backend cannot tell (e.g. the legacy default
  // stream, which belongs to whichever device is current, or a stream capturing a graph, which CUDA
  // will not be asked about without invalidating the capture).
  virtual int stream_device(Stream stream) = 0;

  // ---- Virtual memory: address ranges with physical memory mapped into them ----
  // The groundwork of segments that grow in place (PyTorch's expandable segments). A range of device
  // addresses is reserved with no memory behind it; physical memory is then mapped into it and unmapped
  // from it. Each map_pages() call creates ONE physical allocation (a mapping), of any whole number of
  // pages of vm_granularity() bytes; map_pieces() creates a run of equal ones; a mapping is only ever
  // unmapped whole (the driver cannot give back part of a physical allocation) and is what
  // export_piece() hands to another process. Misuse (a size or address that is not whole pages, pages
  // outside a reserved range, mapping over a mapping, unmapping bytes that are not exactly whole
  // mappings, releasing a range with anything still mapped) throws Error(kBackend) and changes nothing.
  // docs/design.md, "Virtual memory seam", says what the calls are for.

  // True when `device` can reserve address ranges and map memory into them. The other calls below
  // throw Error(kBackend) on a device where this is false.
  virtual bool supports_virtual_memory(int device) {
    (void)device;
    return false;
  }
  // The page size of mapping on `device` (2 MiB on current NVIDIA GPUs): a power of two; every size
  // and address passed to the calls below is a multiple of it.
  virtual std::size_t vm_granularity(int device) { unsupported("vm_granularity", device); }
  // Reserve `bytes` (a positive multiple of the granularity) of device addresses, with no memory behind
  // them, never overlapping memory from reserve() or another range. The base is aligned to the
  // granularity. Returns nullptr when the address space cannot be had (an expected outcome, like
  // reserve() returning nullptr). Works while a stream captures a graph.
  virtual void* reserve_address_range(int device, std::size_t bytes) {
    (void)bytes;
    unsupported("reserve_address_range", device);
  }
  // Create one physical allocation of `bytes` (a positive multiple of the granularity) on `device`, map
  // it at `at` (unmapped pages inside one reserved range) and give the device read/write access to it:
  // one mapping, unmapped only whole. Its contents are undefined. Returns false, with nothing created
  // or mapped, when the device has not enough free memory (an expected outcome, like reserve()
  // returning nullptr). Works while a stream captures a graph.
  virtual bool map_pages(int device, void* at, std::size_t bytes) {
    (void)at;
    (void)bytes;
    unsupported("map_pages", device);
  }
  // map_pages for a run of equal mappings: [at, at + bytes) mapped as bytes / piece_bytes physical
  // allocations of `piece_bytes` each (`bytes` a positive multiple of it, both whole pages), side by side,
  // each unmapped only whole and exportable on its own (export_piece). All or nothing: false, with
  // nothing left created or mapped, when the device has not enough free memory; an error likewise
  // leaves nothing. The default maps them one map_pages call at a time and takes back what it mapped
  // (unmap_unused_pages) when one is refused or fails; a backend may make them with fewer calls (the
  // CUDA backend grants access to the whole run at once). Works while a stream captures a graph.
  virtual bool map_pieces(int device, void* at, std::size_t bytes, std::size_t piece_bytes);
  // Unmap [at, at + bytes), which must be exactly one or more whole mappings side by side (cutting a
  // mapping is misuse), and give their memory back to the device. Like release(), it may synchronize
  // the device first (the CUDA backend does: unmapping does not wait for work still using the memory),
  // so it is not allowed while a stream of the device captures a graph.
  virtual void unmap_pages(int device, void* at, std::size_t bytes) {
    (void)at;
    (void)bytes;
    unsupported("unmap_pages", device);
  }
  // As unmap_pages, for mappings no work has used since map_pages made them (a growth that could map
  // only part of what it needed takes back what it mapped): nothing to wait for, so it never
  // synchronizes and works while a stream captures a graph. On memory that work may still touch it is
  // a use-after-free on a device.
  virtual void unmap_unused_pages(int device, void* at, std::size_t bytes) {
    (void)at;
    (void)bytes;
    unsupported("unmap_unused_pages", device);
  }
  // The mapping that starts at `piece` (one physical allocation, from map_pages or map_pieces) as a
  // POSIX file descriptor another process can import (CUDA's CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
  // PyTorch's expandable-segment IPC handles). The descriptor is the backend's: made on the first call
  // for a mapping, the same number on every later call, closed when the mapping is unmapped; the caller
  // never closes it. Throws Error(kBackend), changing nothing, where mappings cannot be exported (the
  // default: no backend support; the CUDA backend: a driver or device that refused exportable memory)
  // or when `piece` is not the start of a mapping.
  virtual int export_piece(int device, void* piece) {
    (void)piece;
    throw Error(ErrorCode::kBackend, name() + " backend: export_piece(device " + std::to_string(device) +
                                         "): this backend cannot export mapped memory to another process");
  }
  // Give back a range from reserve_address_range(): its base and size exactly, nothing mapped in it.
  virtual void release_address_range(int device, void* base, std::size_t bytes) {
    (void)base;
    (void)bytes;
    unsupported("release_address_range", device);
  }

 protected:
  [[noreturn]] void unsupported(const char* call, int device) const {
    throw Error(ErrorCode::kBackend, name() + " backend: " + call + "(device " + std::to_string(device) +
                                         "): virtual memory is not supported (ask supports_virtual_memory() first)");
  }
};

inline bool Backend::map_pieces(int device, void* at, std::size_t bytes, std::size_t piece_bytes) {
  if (piece_bytes == 0 || bytes == 0 || bytes % piece_bytes != 0) {
    throw Error(ErrorCode::kBackend, name() + " backend: map_pieces(device " + std::to_string(device) + ", " +
                                         std::to_string(bytes) + " bytes in pieces of " + std::to_string(piece_bytes) +
                                         "): not a whole number of pieces");
  }
  const auto base = reinterpret_cast<std::uintptr_t>(at);
  std::size_t mapped = 0;
  try {
    for (; mapped < bytes; mapped += piece_bytes) {
      if (!map_pages(device, reinterpret_cast<void*>(base + mapped), piece_bytes)) break;
    }
  } catch (...) {
    // Fresh memory, no work used it. Should taking it back fail too, the first error is the one that
    // counts: those mappings stay mapped, as a failed unmap leaves them.
    try {
      if (mapped > 0) unmap_unused_pages(device, at, mapped);
    } catch (const Error&) {
    }
    throw;
  }
  if (mapped == bytes) return true;
  if (mapped > 0) unmap_unused_pages(device, at, mapped);
  return false;
}

// The calling thread in relaxed capture mode for a scope (Backend::relax_capture_mode), then back in
// the mode it had.
class RelaxedCaptureScope {
 public:
  explicit RelaxedCaptureScope(Backend& backend) : backend_(backend), previous_(backend.relax_capture_mode()) {}
  ~RelaxedCaptureScope() { backend_.restore_capture_mode(previous_); }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  Backend& backend_;
  int previous_;
};

}  // namespace streamalloc

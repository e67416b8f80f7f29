// The device seam: the only way the allocator touches a device.
//
// Two implementations: CudaBackend (CUDA runtime; the only file that includes CUDA headers) and
// SimBackend (a simulated device for CPU-only tests, the demo and trace replay). Everything above this
// seam is plain C++ and is tested on the simulated device.
//
// Contracts every implementation keeps:
//  - Calls may come from any thread; the implementation is thread-safe.
//  - Device-scoped calls take the device explicitly and leave the caller's current device unchanged.
//  - Failures other than "out of memory" are reported by throwing streamalloc::Error(kBackend, ...)
//    with a message that names the call and the runtime's error string.
#pragma once

#include <cstddef>
#include <string>

#include "streamalloc/types.hpp"

namespace streamalloc {

struct DeviceMemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
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
  // True when all work enqueued on `stream` so far has completed (cudaStreamQuery). Never blocks. Like
  // an event query, not allowed while a stream captures.
  virtual bool query_stream(int device, Stream stream) = 0;
  // Make all work enqueued on `stream` after this call wait for the last record of `event`.
  // The host does not wait.
  virtual void stream_wait_event(int device, Stream stream, Event event) = 0;

  // True while `stream` is capturing a CUDA graph (event queries are then not allowed).
  virtual bool is_capturing(int device, Stream stream) = 0;
  // Fill `bytes` at `ptr` with `value` in stream order on `stream` (used for poisoning).
  virtual void memset_async(int device, void* ptr, int value, std::size_t bytes, Stream stream) = 0;

  virtual DeviceMemoryInfo memory_info(int device) = 0;
  // The device `stream` belongs to, or -1 when the backend cannot tell (e.g. the legacy default
  // stream, which belongs to whichever device is current, or a stream capturing a graph, which CUDA
  // will not be asked about without invalidating the capture).
  virtual int stream_device(Stream stream) = 0;
};

}  // namespace streamalloc

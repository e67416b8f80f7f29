// DemoDevice: the few device operations the demo pipeline and the soak need beyond the allocator
// (streams, a fill standing in for the host-to-device copy, a consumer that checks every byte), on the
// GPU or the simulated device.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "streamalloc/backend.hpp"
#include "streamalloc/options.hpp"

namespace streamalloc {

class DemoDevice {
 public:
  virtual ~DemoDevice() = default;
  virtual std::shared_ptr<Backend> backend() = 0;
  virtual std::string description() = 0;
  virtual Stream create_stream() = 0;
  virtual void destroy_streams() = 0;
  // Enqueue on `stream`: set `bytes` bytes at `ptr` to `value`.
  virtual void fill(void* ptr, std::size_t bytes, unsigned char value, Stream stream) = 0;
  // Enqueue on `stream`: check every byte is `value`; on a mismatch set the flag at `out`.
  virtual void consume(const void* ptr, std::size_t bytes, unsigned char value, void* out, Stream stream) = 0;
  // Let the device make progress the way a real one would between iterations (the simulated device
  // runs the prefetch stream at once and lets the compute stream lag a little).
  virtual void step(Stream fast, Stream slow) = 0;
  virtual void synchronize() = 0;
  // Read and clear the `count` mismatch flags at `flags` (one byte per consume() given its own `out`);
  // returns how many were set. Call after synchronize(): the flags are read from the host.
  virtual std::size_t take_mismatches(void* flags, std::size_t count) = 0;
  // Read and clear the mismatch flag at `out`.
  bool read_mismatch(void* out) { return take_mismatches(out, 1) != 0; }
};

// The GPU when options.backend is cuda, or auto with a GPU present; else the simulated device.
std::unique_ptr<DemoDevice> make_demo_device(const Options& options);
// Defined only in CUDA builds (demo_device_cuda.cu); nullptr when no GPU is present.
std::unique_ptr<DemoDevice> make_cuda_demo_device();

}  // namespace streamalloc

// Shared pieces of the GPU tests: the skip-without-GPU fixture, RAII streams/events/buffers and the
// checks that turn a CUDA error into a test failure with the call that caused it.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "streamalloc/allocator.hpp"
#include "streamalloc/cuda_backend.hpp"
#include "streamalloc/options.hpp"
#include "streamalloc/stats.hpp"
#include "streamalloc/types.hpp"

namespace streamalloc::gpu_test {

// Throws (gtest reports it as a failure of the running test) when a CUDA call fails.
inline void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                           " failed: " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}
#define GPU_CHECK(call) ::streamalloc::gpu_test::check_cuda((call), #call, __FILE__, __LINE__)

// Every GPU test derives from this: without a device it is reported as skipped, never as passed.
// With one, it starts on device 0 and fails if the test left an asynchronous CUDA error behind.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    have_gpu_ = true;
    GPU_CHECK(cudaSetDevice(0));
  }
  void TearDown() override {
    if (!have_gpu_) return;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the test left an asynchronous CUDA error";
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the test left a CUDA error behind";
  }

 private:
  bool have_gpu_ = false;
};

// A stream of the current device. Non-blocking by default, so work on the legacy default stream
// (cudaMemcpy, cudaMemset) never serializes it against the other test streams.
class TestStream {
 public:
  enum class Kind { kNonBlocking, kBlocking };
  explicit TestStream(Kind kind = Kind::kNonBlocking) {
    GPU_CHECK(cudaStreamCreateWithFlags(&stream_, kind == Kind::kBlocking ? cudaStreamDefault : cudaStreamNonBlocking));
  }
  ~TestStream() {
    // Let queued work finish before the handle goes; errors are the test's to report, not ours.
    if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    if (cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;

  operator cudaStream_t() const { return stream_; }  // implicit: passed wherever a cudaStream_t goes
  Stream id() const { return reinterpret_cast<Stream>(stream_); }
  void synchronize() const { GPU_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

class TestEvent {
 public:
  TestEvent() { GPU_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~TestEvent() {
    if (cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
  }
  TestEvent(const TestEvent&) = delete;
  TestEvent& operator=(const TestEvent&) = delete;

  void record(cudaStream_t stream) { GPU_CHECK(cudaEventRecord(event_, stream)); }
  // Make `stream` wait on the GPU for the last record.
  void make_wait(cudaStream_t stream) const { GPU_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
  // True while the last record has not completed.
  bool pending() const {
    const cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return true;
    GPU_CHECK(err);
    return false;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// Device memory from cudaMalloc, outside any allocator under test (result slots, scratch buffers).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count) {
    GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
  }
  ~DeviceArray() {
    if (cudaFree(data_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() const { return data_; }
  // Copies the first `count` elements after the caller synchronized the streams writing them.
  std::vector<T> to_host(std::size_t count) const {
    std::vector<T> host(count);
    GPU_CHECK(cudaMemcpy(host.data(), data_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T at(std::size_t index) const {
    T value{};
    GPU_CHECK(cudaMemcpy(&value, data_ + index, sizeof(T), cudaMemcpyDeviceToHost));
    return value;
  }

 private:
  T* data_ = nullptr;
};

inline std::uint64_t expected_checksum(std::size_t words, std::uint32_t value) {
  return static_cast<std::uint64_t>(words) * value;
}

// The options of a test allocator under one cross-stream reuse policy ("never", "settled", "wait").
inline Options policy_options(const std::string& policy) { return Options::parse("cross_stream_reuse:" + policy); }

// Drive every fence of `allocator` to completion on the device, then let the allocator see it, the
// way time passing does in a real program: close open batches, wait for the device, poll.
inline void settle_all(Allocator& allocator) {
  allocator.process_fences();
  GPU_CHECK(cudaDeviceSynchronize());
  allocator.process_fences();
}

// Cap `device`'s reserved bytes at about `bytes` (plus a little, so a segment of exactly `bytes` fits
// despite floating-point rounding of the fraction).
inline void cap_reserved_bytes(Allocator& allocator, std::size_t bytes, int device = 0) {
  const DeviceMemoryInfo info = allocator.backend().memory_info(device);
  const double fraction = static_cast<double>(bytes + MiB) / static_cast<double>(info.total_bytes);
  allocator.set_memory_fraction(fraction, device);
}

inline std::uint32_t* as_words(void* ptr) { return static_cast<std::uint32_t*>(ptr); }

// One line with the counters that say how a run went, for the log of a GPU run.
inline void print_summary(const std::string& what, const DeviceStats& s) {
  std::printf(
      "[ streamalloc ] %s: fences_recorded=%lld fences_waited_gpu=%lld cross_stream_reuse_settled=%lld "
      "cross_stream_reuse_waited=%lld num_sync_all_streams=%lld num_device_alloc=%lld peak_reserved=%s\n",
      what.c_str(), static_cast<long long>(s.fences_recorded), static_cast<long long>(s.fences_waited_gpu),
      static_cast<long long>(s.cross_stream_reuse_settled), static_cast<long long>(s.cross_stream_reuse_waited),
      static_cast<long long>(s.num_sync_all_streams), static_cast<long long>(s.num_device_alloc),
      format_bytes(static_cast<std::size_t>(s.reserved_bytes[0].peak)).c_str());
}

}  // namespace streamalloc::gpu_test

// The CUDA backend on its own: each Backend call against what the CUDA runtime observably does.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>

#include "gpu/gpu_test_util.hpp"
#include "gpu/kernels.hpp"
#include "streamalloc/backend.hpp"
#include "streamalloc/cuda_backend.hpp"

namespace streamalloc::gpu_test {
namespace {

constexpr std::uint64_t kBusyUs = 200'000;  // long enough that the host's checks finish first

class GpuCudaBackend : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    backend_ = make_cuda_backend();
  }
  Backend& backend() { return *backend_; }

 private:
  std::shared_ptr<Backend> backend_;
};

int current_device() {
  int device = -1;
  GPU_CHECK(cudaGetDevice(&device));
  return device;
}

int device_of_pointer(const void* ptr) {
  cudaPointerAttributes attributes{};
  GPU_CHECK(cudaPointerGetAttributes(&attributes, ptr));
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  return attributes.device;
}

// Expects `call` to throw Error(kBackend) whose message names `cuda_call` and the device, and the
// runtime to be usable afterwards (the error was cleared, nothing sticky happened).
template <typename Call>
void expect_backend_error(Call call, const std::string& cuda_call, int device) {
  try {
    call();
    ADD_FAILURE() << cuda_call << ": expected Error(kBackend), nothing was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBackend) << e.what();
    const std::string message = e.what();
    EXPECT_NE(message.find(cuda_call + " failed on device " + std::to_string(device)), std::string::npos) << message;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the backend left the error set after " << cuda_call;
  spin(nullptr, 1);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the runtime is unusable after " << cuda_call;
}

TEST_F(GpuCudaBackend, ReportsItselfAndTheRuntimesDeviceCount) {
  int count = 0;
  GPU_CHECK(cudaGetDeviceCount(&count));
  EXPECT_EQ(backend().name(), "cuda");
  EXPECT_EQ(backend().device_count(), count);
  EXPECT_TRUE(cuda_device_available());
}

TEST_F(GpuCudaBackend, ReservedMemoryIsAlignedWritableAndReleased) {
  const DeviceMemoryInfo before = backend().memory_info(0);
  for (std::size_t bytes : {std::size_t{512}, MiB + 512, 2 * MiB, 20 * MiB, 1 * GiB}) {
    void* ptr = backend().reserve(0, bytes);
    ASSERT_NE(ptr, nullptr) << format_bytes(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(ptr) % 512, 0u) << "the Backend contract promises 512-byte alignment";
    EXPECT_EQ(device_of_pointer(ptr), 0);
    if (bytes == 1 * GiB) {
      // Slack for the runtime's own bookkeeping; a constant or wrong device's answer would not move.
      const auto drop =
          static_cast<std::int64_t>(before.free_bytes) - static_cast<std::int64_t>(backend().memory_info(0).free_bytes);
      EXPECT_GE(drop, static_cast<std::int64_t>(1 * GiB - 64 * MiB));
    }
    TestStream stream;
    DeviceArray<std::uint64_t> sum(1);
    fill_u32(as_words(ptr), bytes / 4, 3, stream);
    checksum_u32(as_words(ptr), bytes / 4, sum.data(), stream);
    stream.synchronize();
    EXPECT_EQ(sum.at(0), expected_checksum(bytes / 4, 3));
    backend().release(0, ptr, bytes);
  }
  EXPECT_GE(backend().memory_info(0).free_bytes + 64 * MiB, before.free_bytes) << "release gave the memory back";
}

TEST_F(GpuCudaBackend, OutOfMemoryIsNullptrAndLeavesTheRuntimeUsable) {
  const std::size_t absurd = std::size_t{1} << 50;  // 1 PiB: more than any device has
  EXPECT_EQ(backend().reserve(0, absurd), nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "reserve must clear cudaErrorMemoryAllocation";
  void* ptr = backend().reserve(0, 2 * MiB);
  ASSERT_NE(ptr, nullptr);
  TestStream stream;
  fill_u32(as_words(ptr), 2 * MiB / 4, 1, stream);
  stream.synchronize();
  backend().release(0, ptr, 2 * MiB);
}

TEST_F(GpuCudaBackend, EventCompletesOnlyWhenItsStreamPassesIt) {
  TestStream stream;
  Event event = backend().create_event(0);
  EXPECT_TRUE(backend().query_event(0, event)) << "a never-recorded event counts as completed";
  spin(stream, kBusyUs);
  backend().record_event(0, event, stream.id());
  EXPECT_FALSE(backend().query_event(0, event)) << "recorded behind a running spin";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorNotReady must not linger";
  backend().synchronize_event(0, event);
  EXPECT_TRUE(backend().query_event(0, event));
  backend().destroy_event(0, event);
}

TEST_F(GpuCudaBackend, StreamIsIdleOnlyWhenItsWorkHasCompleted) {
  TestStream stream;
  EXPECT_TRUE(backend().query_stream(0, stream.id()));
  spin(stream, kBusyUs);
  EXPECT_FALSE(backend().query_stream(0, stream.id())) << "a spin is running";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "cudaErrorNotReady must not linger";
  stream.synchronize();
  EXPECT_TRUE(backend().query_stream(0, stream.id()));
  EXPECT_TRUE(backend().query_stream(0, 0)) << "the legacy stream, idle";
}

// The queries go to the driver first, which needs a context current on the calling thread; a thread
// that has made no CUDA call has none, and must get the same answers (from the runtime, which binds it).
TEST_F(GpuCudaBackend, QueriesAnswerAlikeOnAThreadThatNeverCalledCuda) {
  TestStream stream;
  Event event = backend().create_event(0);
  spin(stream, kBusyUs);
  backend().record_event(0, event, stream.id());
  bool busy_stream = true, busy_event = true, capturing = true;
  cudaError_t left_behind = cudaErrorUnknown;
  std::thread fresh([&] {
    busy_stream = backend().query_stream(0, stream.id());
    busy_event = backend().query_event(0, event);
    capturing = backend().is_capturing(0, stream.id());
    left_behind = cudaGetLastError();
  });
  fresh.join();
  EXPECT_FALSE(busy_stream) << "a spin is running";
  EXPECT_FALSE(busy_event) << "recorded behind a running spin";
  EXPECT_FALSE(capturing);
  EXPECT_EQ(left_behind, cudaSuccess);
  stream.synchronize();
  bool idle_stream = false, idle_event = false;
  std::thread after([&] {
    idle_stream = backend().query_stream(0, stream.id());
    idle_event = backend().query_event(0, event);
  });
  after.join();
  EXPECT_TRUE(idle_stream);
  EXPECT_TRUE(idle_event);
  backend().destroy_event(0, event);
}

TEST_F(GpuCudaBackend, StreamWaitEventOrdersWorkAcrossStreams) {
  TestStream producer, consumer;
  const std::size_t words = 4 * MiB / 4;
  void* buffer = backend().reserve(0, words * 4);
  ASSERT_NE(buffer, nullptr);
  GPU_CHECK(cudaMemset(buffer, 0, words * 4));
  GPU_CHECK(cudaDeviceSynchronize());
  DeviceArray<std::uint64_t> sum(1);

  // Without the wait the consumer would sum zeros while the producer still spins.
  spin(producer, kBusyUs);
  fill_u32(as_words(buffer), words, 7, producer);
  Event ready = backend().create_event(0);
  backend().record_event(0, ready, producer.id());
  backend().stream_wait_event(0, consumer.id(), ready);
  checksum_u32(as_words(buffer), words, sum.data(), consumer);
  consumer.synchronize();
  EXPECT_EQ(sum.at(0), expected_checksum(words, 7));

  backend().destroy_event(0, ready);
  backend().release(0, buffer, words * 4);
}

TEST_F(GpuCudaBackend, IsCapturingFollowsStreamCapture) {
  TestStream capturing, other;
  EXPECT_FALSE(backend().is_capturing(0, capturing.id()));
  void* buffer = backend().reserve(0, 2 * MiB);
  ASSERT_NE(buffer, nullptr);

  GPU_CHECK(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeThreadLocal));
  fill_u32(as_words(buffer), 1024, 1, capturing);  // captured, not run
  EXPECT_TRUE(backend().is_capturing(0, capturing.id()));
  EXPECT_FALSE(backend().is_capturing(0, other.id()));
  cudaGraph_t graph = nullptr;
  GPU_CHECK(cudaStreamEndCapture(capturing, &graph));
  GPU_CHECK(cudaGraphDestroy(graph));
  EXPECT_FALSE(backend().is_capturing(0, capturing.id()));
  backend().release(0, buffer, 2 * MiB);
}

TEST_F(GpuCudaBackend, LegacyStreamCountsAsCapturingDuringABlockingStreamsCapture) {
  TestStream blocking(TestStream::Kind::kBlocking);
  GPU_CHECK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal));
  // The runtime answers cudaErrorStreamCaptureImplicit for the legacy stream here.
  const bool legacy_capturing = backend().is_capturing(0, 0);
  const bool legacy_handle_capturing = backend().is_capturing(0, reinterpret_cast<Stream>(cudaStreamLegacy));
  const cudaError_t left_behind = cudaGetLastError();
  cudaGraph_t graph = nullptr;
  GPU_CHECK(cudaStreamEndCapture(blocking, &graph));
  if (graph != nullptr) GPU_CHECK(cudaGraphDestroy(graph));

  EXPECT_TRUE(legacy_capturing);
  EXPECT_TRUE(legacy_handle_capturing);
  EXPECT_EQ(left_behind, cudaSuccess) << "is_capturing must clear cudaErrorStreamCaptureImplicit";
  EXPECT_FALSE(backend().is_capturing(0, 0));
}

TEST_F(GpuCudaBackend, MemsetAsyncRunsInStreamOrder) {
  TestStream stream;
  const std::size_t words = MiB / 4;
  void* buffer = backend().reserve(0, words * 4);
  ASSERT_NE(buffer, nullptr);
  DeviceArray<std::uint64_t> sum(1);
  fill_u32(as_words(buffer), words, 5, stream);
  spin(stream, 1000);
  backend().memset_async(0, buffer, 0x01, words * 4, stream.id());
  checksum_u32(as_words(buffer), words, sum.data(), stream);
  stream.synchronize();
  EXPECT_EQ(sum.at(0), expected_checksum(words, 0x01010101u));
  backend().release(0, buffer, words * 4);
}

TEST_F(GpuCudaBackend, MemoryInfoMatchesTheRuntime) {
  std::size_t free_bytes = 0, total_bytes = 0;
  GPU_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const DeviceMemoryInfo info = backend().memory_info(0);
  EXPECT_EQ(info.total_bytes, total_bytes);
  EXPECT_GT(info.free_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.total_bytes);
}

TEST_F(GpuCudaBackend, StreamDeviceNamesTheStreamsDevice) {
  EXPECT_EQ(backend().stream_device(0), -1) << "legacy default stream";
  EXPECT_EQ(backend().stream_device(reinterpret_cast<Stream>(cudaStreamLegacy)), -1);
  EXPECT_EQ(backend().stream_device(reinterpret_cast<Stream>(cudaStreamPerThread)), -1);
  for (int device = 0; device < backend().device_count(); ++device) {
    GPU_CHECK(cudaSetDevice(device));
    TestStream stream;
    GPU_CHECK(cudaSetDevice(0));
    EXPECT_EQ(backend().stream_device(stream.id()), device);
    GPU_CHECK(cudaSetDevice(device));  // the stream is destroyed on its own device
  }
  GPU_CHECK(cudaSetDevice(0));
}

// With one GPU this checks that calls leave the current device alone; with more it also checks that
// each call ran on the device it named while another one was current.
TEST_F(GpuCudaBackend, DeviceGuardRestoresTheCallersDevice) {
  const int count = backend().device_count();
  for (int device = 0; device < count; ++device) {
    const int callers = (device + 1) % count;
    GPU_CHECK(cudaSetDevice(callers));
    void* ptr = backend().reserve(device, 2 * MiB);
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(current_device(), callers);
    EXPECT_EQ(device_of_pointer(ptr), device);
    Event event = backend().create_event(device);
    backend().record_event(device, event, 0);
    backend().synchronize_event(device, event);
    EXPECT_TRUE(backend().query_event(device, event));
    backend().destroy_event(device, event);
    (void)backend().memory_info(device);
    backend().release(device, ptr, 2 * MiB);
    EXPECT_EQ(current_device(), callers);
  }
  GPU_CHECK(cudaSetDevice(0));
  // A failing guard leaves the current device alone too.
  expect_backend_error([&] { backend().reserve(count, MiB); }, "cudaSetDevice", count);
  EXPECT_EQ(current_device(), 0);
}

TEST_F(GpuCudaBackend, RuntimeErrorsBecomeBackendErrors) {
  // Handles the runtime rejects with an error code (it does not dereference them).
  expect_backend_error([&] { backend().destroy_event(0, nullptr); }, "cudaEventDestroy", 0);
  int host_variable = 0;
  expect_backend_error([&] { backend().release(0, &host_variable, sizeof host_variable); }, "cudaFree", 0);
  // The backend still works.
  void* ptr = backend().reserve(0, 2 * MiB);
  ASSERT_NE(ptr, nullptr);
  backend().release(0, ptr, 2 * MiB);
}

}  // namespace
}  // namespace streamalloc::gpu_test

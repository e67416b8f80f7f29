// Memory pools under a real CUDA graph capture in global mode, as PyTorch captures: allocations routed
// to the graph's pool (on the capturing stream and on a stream forked into the capture, both first
// seen by the allocator during the capture), record_stream and frees inside the capture, a pending
// block of an eager stream left from before the capture. The capture must not be invalidated, the
// graph must replay to the right values, and the captured memory must stay out of eager hands. And the
// fence path during a global-mode capture, on the capturing thread and on another.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "gpu/kernels.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/cuda_backend.hpp"

namespace streamalloc::gpu_test {
namespace {

constexpr std::size_t kWords = 4096;
constexpr PoolId kGraphPool{1, 0};

class GpuGraphPools : public GpuTest {};

bool capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusActive;
}

std::uint64_t checksum(const std::uint32_t* words, std::size_t n, cudaStream_t stream) {
  std::uint64_t* sum = nullptr;
  GPU_CHECK(cudaMalloc(reinterpret_cast<void**>(&sum), sizeof(std::uint64_t)));
  checksum_u32(words, n, sum, stream);
  std::uint64_t host = 0;
  GPU_CHECK(cudaMemcpyAsync(&host, sum, sizeof(host), cudaMemcpyDeviceToHost, stream));
  GPU_CHECK(cudaStreamSynchronize(stream));
  GPU_CHECK(cudaFree(sum));
  return host;
}

TEST_F(GpuGraphPools, AGlobalCaptureWithForkedStreamsAndRecordStreamReplaysAndStaysIsolated) {
  Allocator allocator(Options{}, make_cuda_backend());
  TestStream eager, capture, side;
  // An eager block pending on a busy stream while the graph is captured: nothing may be queried.
  auto* pending = static_cast<std::uint32_t*>(allocator.allocate(kWords * 4, 0, eager.id()));
  TestStream busy;
  spin(busy, 200'000);
  allocator.record_stream(pending, busy.id());
  allocator.deallocate(pending);

  allocator.begin_allocate_to_pool(0, kGraphPool, capturing);
  GPU_CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal));
  auto* a = static_cast<std::uint32_t*>(allocator.allocate(kWords * 4, 0, capture.id()));
  fill_u32(a, kWords, 3, capture);
  TestEvent fork;
  fork.record(capture);
  fork.make_wait(side);
  allocator.record_stream(a, side.id());
  auto* b = static_cast<std::uint32_t*>(allocator.allocate(kWords * 4, 0, side.id()));  // first sight of `side`
  fill_u32(b, kWords, 5, side);
  TestEvent join;
  join.record(side);
  join.make_wait(capture);
  auto* out = static_cast<std::uint32_t*>(allocator.allocate(kWords * 4, 0, capture.id()));
  fill_u32(out, kWords, 7, capture);
  allocator.deallocate(a);  // freed inside the capture, with a use on the forked stream
  allocator.deallocate(b);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(capture, &graph), cudaSuccess) << "the capture was invalidated";
  allocator.end_allocate_to_pool(0, kGraphPool);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  // Eager allocations after the capture never get the graph's blocks.
  std::vector<void*> eager_blocks;
  for (int i = 0; i < 4; ++i) {
    void* p = allocator.allocate(kWords * 4, 0, capture.id());
    EXPECT_NE(p, a);
    EXPECT_NE(p, b);
    EXPECT_NE(p, out);
    fill_u32(static_cast<std::uint32_t*>(p), kWords, 11, capture);
    eager_blocks.push_back(p);
  }
  for (int replay = 0; replay < 3; ++replay) GPU_CHECK(cudaGraphLaunch(exec, capture));
  EXPECT_EQ(checksum(out, kWords, capture), 7u * kWords);
  for (void* p : eager_blocks) {
    EXPECT_EQ(checksum(static_cast<std::uint32_t*>(p), kWords, capture), 11u * kWords)
        << "a replay wrote into an eager block";
  }
  allocator.validate();

  for (void* p : eager_blocks) allocator.deallocate(p);
  allocator.deallocate(out);
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  allocator.release_pool(0, kGraphPool);
  busy.synchronize();
  allocator.empty_cache();
  allocator.validate();
  EXPECT_EQ(allocator.stats(0).reserved_bytes[0].current, 0) << "the released pool's memory went back";
}

// The fence path runs in relaxed capture mode: during a global-mode capture, on this thread or another,
// it queries the fences of streams that do not capture (events recorded before the capture) and
// releases what they guarded, and the capture is not invalidated.
void fences_complete_during_a_capture(bool capture_on_another_thread) {
  Allocator allocator(Options{}, make_cuda_backend());
  TestStream eager, user, capture;
  auto* p = static_cast<std::uint32_t*>(allocator.allocate(kWords * 4, 0, eager.id()));
  spin(user, 1'000);
  allocator.record_stream(p, user.id());
  allocator.deallocate(p);  // pending on `user`, its fence recorded by the free
  ASSERT_EQ(allocator.stats(0).pending_blocks.current, 1);
  user.synchronize();  // the fence has completed; the cache has not looked yet
  // The capturing stream is known to the cache, with a free in its open batch: a poll during the
  // capture must not record that batch's fence on it (the event would be a node of the graph).
  allocator.deallocate(allocator.allocate(kWords * 4, 0, capture.id()));

  auto* out = static_cast<std::uint32_t*>(allocator.allocate(kWords * 4, 0, eager.id()));
  cudaGraph_t graph = nullptr;
  cudaError_t began = cudaErrorUnknown;
  cudaError_t ended = cudaErrorUnknown;
  const auto capture_one_fill = [&](const std::function<void()>& during) {
    began = cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal);
    fill_u32(out, kWords, 9, capture);
    during();
    ended = cudaStreamEndCapture(capture, &graph);
  };
  std::int64_t pending_during = -1;
  const auto poll_from_this_thread = [&] {
    allocator.process_fences();  // closes and polls every stream's batch: `user`'s fence has completed
    void* q = allocator.allocate(kWords * 4, 0, eager.id());
    allocator.deallocate(q);
    pending_during = allocator.stats(0).pending_blocks.current;
  };
  if (capture_on_another_thread) {
    std::mutex mutex;
    std::condition_variable changed;
    bool capture_open = false, polled = false;
    std::thread capturer([&] {
      capture_one_fill([&] {
        std::unique_lock<std::mutex> lock(mutex);
        capture_open = true;
        changed.notify_all();
        changed.wait(lock, [&] { return polled; });
      });
    });
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return capture_open; });
    }
    poll_from_this_thread();  // this thread is in global mode, as the capture is
    {
      std::lock_guard<std::mutex> lock(mutex);
      polled = true;
    }
    changed.notify_all();
    capturer.join();
  } else {
    capture_one_fill(poll_from_this_thread);
  }
  ASSERT_EQ(began, cudaSuccess);
  ASSERT_EQ(ended, cudaSuccess) << "the capture was invalidated";
  EXPECT_EQ(pending_during, 0) << "the fence of a stream that does not capture was polled during the capture";
  EXPECT_GT(allocator.stats(0).fences_polled, 0);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  GPU_CHECK(cudaGraphLaunch(exec, capture));
  EXPECT_EQ(checksum(out, kWords, capture), 9u * kWords);
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  allocator.deallocate(out);
  allocator.validate();
}

TEST_F(GpuGraphPools, FencesOfOtherStreamsCompleteDuringACaptureOnThisThread) {
  fences_complete_during_a_capture(/*capture_on_another_thread=*/false);
}

TEST_F(GpuGraphPools, FencesOfOtherStreamsCompleteDuringACaptureOnAnotherThread) {
  fences_complete_during_a_capture(/*capture_on_another_thread=*/true);
}

}  // namespace
}  // namespace streamalloc::gpu_test

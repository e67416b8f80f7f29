// A LibTorch program with streamalloc as its CUDA allocator: the fixed prefetch pipeline (the
// prefetch stream copies the next batch; the compute stream waits on an event, then record_stream
// tells the allocator the batch is used there), followed by streamalloc's stream statistics.
//
//   ./libtorch_pipeline [steps] [conf]      e.g.  ./libtorch_pipeline 200 audit:warn
#include <cstdio>
#include <cstdlib>
#include <string>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <streamalloc/torch.hpp>

namespace {

// Work enqueued on `waiter` from now on runs after the work enqueued on `producer` so far.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& producer) {
  c10::cuda::CUDAEvent event;
  event.record(producer);
  event.block(waiter);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help")) {
    std::printf(
        "usage: %s [steps] [conf]\n\n"
        "Runs the fixed prefetch pipeline for `steps` steps (default 200) with streamalloc as the CUDA\n"
        "allocator, configured by `conf` (\"key:value,...\", e.g. audit:warn; default: the defaults),\n"
        "then prints streamalloc's stream statistics. Without a CUDA device it installs streamalloc and exits.\n",
        argv[0]);
    return 0;
  }
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const std::string conf = argc > 2 ? argv[2] : "";
  try {
    // First, before anything touches CUDA.
    streamalloc::torch::install(conf);
  } catch (const streamalloc::Error& error) {
    std::fprintf(stderr, "%s\n", error.what());
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::printf("streamalloc installed; no CUDA device here, so there is nothing to run\n");
    return 0;
  }

  torch::manual_seed(0);
  const auto device = torch::Device(torch::kCUDA, 0);
  auto weight = torch::randn({1024, 1024}, device);
  auto host = torch::randn({steps, 256, 1024}).pin_memory();

  c10::cuda::CUDAStream prefetch = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStream compute = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAEvent prefetched;
  auto total = torch::zeros({}, device);
  wait_for(compute, c10::cuda::getCurrentCUDAStream(0));  // weight and total come from the default stream

  for (int step = 0; step < steps; ++step) {
    torch::Tensor batch;
    {
      c10::cuda::CUDAStreamGuard guard(prefetch);
      batch = host[step].to(device, /*non_blocking=*/true);
      prefetched.record(prefetch);
    }
    prefetched.block(compute);  // fix 1: the consumer waits for the producer
    {
      c10::cuda::CUDAStreamGuard guard(compute);
      total += torch::relu(batch.matmul(weight)).sum();
      batch.record_stream(compute);  // fix 2: the block stays reserved until compute is done with it
    }
  }
  wait_for(c10::cuda::getCurrentCUDAStream(0), compute);
  std::printf("steps %d, total %.6f\n", steps, total.item<double>());

  const auto torch_stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  std::printf("torch view:       allocated %lld B (peak %lld B), reserved %lld B\n",
              static_cast<long long>(torch_stats.allocated_bytes[0].current),
              static_cast<long long>(torch_stats.allocated_bytes[0].peak),
              static_cast<long long>(torch_stats.reserved_bytes[0].current));
  const streamalloc::DeviceStats stats = streamalloc::torch::allocator()->stats(0);
  std::printf("streamalloc view: %lld record_stream calls, %lld fences recorded, %lld blocks pending (peak %lld)\n",
              static_cast<long long>(stats.record_stream_calls), static_cast<long long>(stats.fences_recorded),
              static_cast<long long>(stats.pending_blocks.current), static_cast<long long>(stats.pending_blocks.peak));
  return 0;
}

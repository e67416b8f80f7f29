// What one CUDA runtime call, and the driver call under it, costs on this host, on idle streams and
// completed events: ns per call, the median of 21 batches of 20,000 calls. These are the calls the
// fence path makes (docs/design.md, "Fences: batching and pipelining"): a pass switches its thread to
// relaxed capture mode and back, asks each stream it would record on or query whether it captures, and
// a stream with pending blocks whether it is idle. The driver's entry points are asked of the runtime,
// as CudaBackend asks for them.
// Usage: nvcc -O2 bench/tools/cuda_call_cost.cpp -o /tmp/cuda_call_cost && /tmp/cuda_call_cost
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

template <class Call>
double ns_per_call(Call call) {
  constexpr int kBatches = 21, kCalls = 20000;
  std::vector<double> batches;
  for (int b = 0; b < kBatches; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) call();
    const auto end = std::chrono::steady_clock::now();
    batches.push_back(std::chrono::duration<double, std::nano>(end - start).count() / kCalls);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

template <class Fn>
Fn driver_entry(const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(address);
}

}  // namespace

int main() {
  if (cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "cuda_call_cost: no CUDA device\n");
    return 1;
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  int device = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  std::printf("cudaGetDevice                    %7.1f ns\n", ns_per_call([&] { cudaGetDevice(&device); }));
  std::printf("cudaStreamIsCapturing            %7.1f ns\n",
              ns_per_call([&] { cudaStreamIsCapturing(stream, &status); }));
  std::printf("cudaStreamQuery (idle)           %7.1f ns\n", ns_per_call([&] { cudaStreamQuery(stream); }));
  std::printf("cudaEventRecord                  %7.1f ns\n", ns_per_call([&] { cudaEventRecord(event, stream); }));
  cudaStreamSynchronize(stream);
  std::printf("cudaEventQuery (completed)       %7.1f ns\n", ns_per_call([&] { cudaEventQuery(event); }));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  std::printf("cudaThreadExchangeStreamCaptureMode %4.1f ns\n",
              ns_per_call([&] { cudaThreadExchangeStreamCaptureMode(&mode); }));
  auto is_capturing = driver_entry<PFN_cuStreamIsCapturing_v10000>("cuStreamIsCapturing");
  auto stream_query = driver_entry<PFN_cuStreamQuery_v2000>("cuStreamQuery");
  auto event_query = driver_entry<PFN_cuEventQuery_v2000>("cuEventQuery");
  auto exchange_mode = driver_entry<PFN_cuThreadExchangeStreamCaptureMode_v10010>("cuThreadExchangeStreamCaptureMode");
  if (is_capturing == nullptr || stream_query == nullptr || event_query == nullptr || exchange_mode == nullptr) {
    std::fprintf(stderr, "cuda_call_cost: the driver gave no stream or event query entry points\n");
    return 1;
  }
  CUstreamCaptureStatus driver_status = CU_STREAM_CAPTURE_STATUS_NONE;
  std::printf("cuStreamIsCapturing              %7.1f ns\n",
              ns_per_call([&] { is_capturing(reinterpret_cast<CUstream>(stream), &driver_status); }));
  std::printf("cuStreamQuery (idle)             %7.1f ns\n",
              ns_per_call([&] { stream_query(reinterpret_cast<CUstream>(stream)); }));
  std::printf("cuEventQuery (completed)         %7.1f ns\n",
              ns_per_call([&] { event_query(reinterpret_cast<CUevent>(event)); }));
  CUstreamCaptureMode driver_mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  std::printf("cuThreadExchangeStreamCaptureMode %6.1f ns\n", ns_per_call([&] { exchange_mode(&driver_mode); }));
  cudaEventDestroy(event);
  cudaStreamDestroy(stream);
  return 0;
}

// CudaBackend: the Backend seam on the CUDA runtime (the only file of allocator/ that includes CUDA).
//
// Every call names its device; a DeviceGuard makes that device current for the call and restores the
// caller's device afterwards. Errors never abort: "out of memory" from cudaMalloc is an expected
// outcome (nullptr); anything else becomes Error(kBackend) naming the call, the device and CUDA's
// error string, after clearing the runtime's (non-sticky) error state so the next call starts clean.
#include "streamalloc/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace streamalloc {
namespace {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, int device) {
  (void)cudaGetLastError();  // clear it, so it is not reported again by an unrelated later call
  throw Error(ErrorCode::kBackend, std::string(call) + " failed on device " + std::to_string(device) + ": " +
                                       cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

void check(cudaError_t err, const char* call, int device) {
  if (err != cudaSuccess) throw_cuda_error(err, call, device);
}

// Makes `device` current for one backend call and restores the caller's device, so the backend never
// changes which device the caller's later work goes to. cudaSetDevice is skipped when it would be a
// no-op, as it is on the hot path of a single-GPU process.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (previous_ != device) {
      check(cudaSetDevice(device), "cudaSetDevice", device);
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    // Restoring a device that was current a moment ago cannot reasonably fail; a destructor must not
    // throw, so a failure only clears the error state.
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Puts the calling thread in relaxed capture mode for a scope: a call the runtime counts as
// "potentially unsafe" then does not invalidate another stream's capture in global mode. Only for
// calls that are safe during a capture (reserving memory).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() {
    if (cudaThreadExchangeStreamCaptureMode(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      restore_ = false;
    }
  }
  ~RelaxedCaptureMode() {
    if (restore_ && cudaThreadExchangeStreamCaptureMode(&previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
  bool restore_ = true;
};

// The answer of a non-blocking query (cudaEventQuery, cudaStreamQuery): "not yet" is an answer, not an
// error; anything else but success is.
bool completed(cudaError_t err, const char* call, int device) {
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  check(err, call, device);
  return true;
}

cudaStream_t to_cuda(Stream stream) { return reinterpret_cast<cudaStream_t>(stream); }
cudaEvent_t to_cuda(Event event) { return static_cast<cudaEvent_t>(event); }

// The legacy default stream (0 or cudaStreamLegacy) and the per-thread default stream belong to
// whichever device is current when they are used, so they have no device of their own.
bool is_default_stream(Stream stream) {
  return stream == 0 || stream == reinterpret_cast<Stream>(cudaStreamLegacy) ||
         stream == reinterpret_cast<Stream>(cudaStreamPerThread);
}

// cudaGetDeviceCount, with the runtime's error state cleared on failure (no driver, no device).
cudaError_t probe_device_count(int* count) {
  *count = 0;
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *count = 0;
  }
  return err;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_count) : device_count_(device_count) {}

  std::string name() const override { return "cuda"; }
  int device_count() const override { return device_count_; }

  void* reserve(int device, std::size_t bytes) override {
    DeviceGuard guard(device);
    void* ptr = nullptr;
    // During a graph capture in global mode cudaMalloc is refused as "potentially unsafe"; reserving
    // memory is safe there as long as it is not freed before the capture ends (the cache never frees
    // during a capture), so the call runs in relaxed mode, as PyTorch's allocator does.
    RelaxedCaptureMode relaxed;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // an expected outcome: the caller flushes its cache or reports OOM
      return nullptr;
    }
    check(err, "cudaMalloc", device);
    return ptr;
  }

  void release(int device, void* ptr, std::size_t /*bytes*/) override {
    DeviceGuard guard(device);
    check(cudaFree(ptr), "cudaFree", device);
  }

  Event create_event(int device) override {
    DeviceGuard guard(device);
    cudaEvent_t event = nullptr;
    // Fences are never timed, and timing-disabled events are cheaper to record and query.
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags", device);
    return event;
  }

  void destroy_event(int device, Event event) override {
    DeviceGuard guard(device);
    check(cudaEventDestroy(to_cuda(event)), "cudaEventDestroy", device);
  }

  void record_event(int device, Event event, Stream stream) override {
    DeviceGuard guard(device);
    check(cudaEventRecord(to_cuda(event), to_cuda(stream)), "cudaEventRecord", device);
  }

  bool query_event(int device, Event event) override {
    DeviceGuard guard(device);
    return completed(cudaEventQuery(to_cuda(event)), "cudaEventQuery", device);
  }

  bool query_stream(int device, Stream stream) override {
    DeviceGuard guard(device);
    return completed(cudaStreamQuery(to_cuda(stream)), "cudaStreamQuery", device);
  }

  void synchronize_event(int device, Event event) override {
    DeviceGuard guard(device);
    check(cudaEventSynchronize(to_cuda(event)), "cudaEventSynchronize", device);
  }

  void stream_wait_event(int device, Stream stream, Event event) override {
    DeviceGuard guard(device);
    check(cudaStreamWaitEvent(to_cuda(stream), to_cuda(event), 0), "cudaStreamWaitEvent", device);
  }

  bool is_capturing(int device, Stream stream) override {
    DeviceGuard guard(device);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t err = cudaStreamIsCapturing(to_cuda(stream), &status);
    if (err == cudaErrorStreamCaptureImplicit) {
      // The legacy stream, queried while a blocking stream of the device captures: it is part of that
      // capture, so nothing may be queried or recorded on it now.
      (void)cudaGetLastError();
      return true;
    }
    check(err, "cudaStreamIsCapturing", device);
    // An invalidated capture has not ended yet either: event queries stay forbidden until it does.
    return status != cudaStreamCaptureStatusNone;
  }

  void memset_async(int device, void* ptr, int value, std::size_t bytes, Stream stream) override {
    DeviceGuard guard(device);
    check(cudaMemsetAsync(ptr, value, bytes, to_cuda(stream)), "cudaMemsetAsync", device);
  }

  DeviceMemoryInfo memory_info(int device) override {
    DeviceGuard guard(device);
    DeviceMemoryInfo info;
    check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo", device);
    return info;
  }

  int stream_device(Stream stream) override {
    if (is_default_stream(stream)) return -1;
    int device = -1;
    // The cache asks on its first sight of a stream, which can be an allocation inside a capture. On a
    // capturing stream cudaStreamGetDevice fails (cudaErrorStreamCaptureUnsupported) and invalidates the
    // capture, in every capture mode; cudaStreamIsCapturing is allowed. So a capturing stream's device
    // is "cannot tell".
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(to_cuda(stream), &capture) != cudaSuccess) {
      (void)cudaGetLastError();
      return -1;
    }
    if (capture != cudaStreamCaptureStatusNone) return -1;
    if (cudaStreamGetDevice(to_cuda(stream), &device) != cudaSuccess) {
      (void)cudaGetLastError();  // the contract says "cannot tell", not "fail"
      return -1;
    }
    return device;
  }

 private:
  const int device_count_;  // devices are fixed for the life of a process (CUDA_VISIBLE_DEVICES)
};

}  // namespace

bool cuda_device_available() {
  int count = 0;
  return probe_device_count(&count) == cudaSuccess && count > 0;
}

std::shared_ptr<Backend> make_cuda_backend() {
  int count = 0;
  const cudaError_t err = probe_device_count(&count);
  if (err != cudaSuccess || count == 0) {
    const std::string why = err != cudaSuccess ? std::string(cudaGetErrorString(err)) + " (" +
                                                     cudaGetErrorName(err) + ")"
                                               : std::string("no devices");
    throw Error(ErrorCode::kConfig,
                "streamalloc: the CUDA backend needs a CUDA device, but none is present (cudaGetDeviceCount: " +
                    why + "). Check the driver and CUDA_VISIBLE_DEVICES, or use backend:sim.");
  }
  return std::make_shared<CudaBackend>(count);
}

}  // namespace streamalloc

// CudaBackend: the Backend seam on the CUDA runtime (the only file of allocator/ that includes CUDA).
//
// Every call names its device; a DeviceGuard makes that device current for the call and restores the
// caller's device afterwards, except around the queries that act on a created stream's or an event's
// own device whichever is current (is_default_stream). Errors never abort: "out of memory" from
// cudaMalloc is an expected outcome (nullptr); anything else becomes Error(kBackend) naming the call,
// the device and CUDA's error string, after clearing the runtime's (non-sticky) error state so the
// next call starts clean.
//
// Virtual memory uses the driver API (cuMemAddressReserve, cuMemCreate, cuMemMap, ...), which the
// runtime does not wrap, and the fence path's stream and event queries ask the driver first (a
// runtime call's entry is a share of their cost; DriverQueries). Driver entry points are asked of the
// runtime once (cudaGetDriverEntryPoint), so the library still links only the runtime and a driver
// without them only means "not supported" (or "ask the runtime"), as PyTorch loads the driver API
// lazily. Each device keeps an AddressRanges: the ranges it reserved and
// the physical handle of every mapped page, which unmapping needs to release the memory, and the POSIX
// file descriptor a mapping was exported as (export_piece), closed when it is unmapped. Physical memory
// is created exportable as a POSIX file descriptor, as PyTorch's expandable segments are; a device whose
// driver refuses that gets memory that is not, and export_piece says so.
#include "streamalloc/cuda_backend.hpp"

#include <cuda.h>  // driver types only: the functions come through DriverVm
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "address_ranges.hpp"

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
//
// With `bind_context`, cudaSetDevice runs even then: it makes the device's primary context current on
// the calling thread, which the driver API calls need and a thread that never used the runtime lacks.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool bind_context = false) {
    check(cudaGetDevice(&previous_), "cudaGetDevice", device);
    if (previous_ != device || bind_context) {
      check(cudaSetDevice(device), "cudaSetDevice", device);
      switched_ = previous_ != device;
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
// whichever device is current when they are used, so they have no device of their own. A created
// stream acts on its own device whichever is current, and so does an event query or wait (CUDA
// Programming Guide, "Stream and Event Behavior"): queries of a created stream or of an event skip the
// DeviceGuard and its cudaGetDevice (bench/tools/cuda_call_cost.cpp measures it), and a miss that polls
// fences asks each stream it records on or queries whether it captures.
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

// ---- the driver's virtual-memory API ----

// A driver entry point, asked of the runtime as of CUDA 12.0 (kDriverAbi, whose versions of the
// functions the typedefs used here are); null when the driver does not have it.
constexpr unsigned int kDriverAbi = 12000;

void* find_driver_entry(const char* symbol) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &address, kDriverAbi, cudaEnableDefault, &found);
#else
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &address, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return address;
}

// The driver entry points virtual memory needs. Each pointer has the ABI of its typedef (kDriverAbi).
struct DriverVm {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 get_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  // Optional: without it mapped memory is not exported (export_piece says so), the rest works.
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  std::string missing;  // the first entry point the driver did not give; empty when it gave them all

  // Loaded on first use, once per process (thread-safe static initialization).
  static const DriverVm& get() {
    static const DriverVm driver = load();
    return driver;
  }

 private:
  static DriverVm load() {
    DriverVm d;
    d.find("cuGetErrorName", d.get_error_name);
    d.find("cuGetErrorString", d.get_error_string);
    d.find("cuDeviceGet", d.device_get);
    d.find("cuDeviceGetAttribute", d.device_get_attribute);
    d.find("cuMemGetAllocationGranularity", d.get_granularity);
    d.find("cuMemAddressReserve", d.address_reserve);
    d.find("cuMemAddressFree", d.address_free);
    d.find("cuMemCreate", d.create);
    d.find("cuMemRelease", d.release);
    d.find("cuMemMap", d.map);
    d.find("cuMemUnmap", d.unmap);
    d.find("cuMemSetAccess", d.set_access);
    d.export_handle =
        reinterpret_cast<PFN_cuMemExportToShareableHandle_v10020>(find_driver_entry("cuMemExportToShareableHandle"));
    return d;
  }

  template <typename Fn>
  void find(const char* symbol, Fn& fn) {
    void* address = find_driver_entry(symbol);
    if (address == nullptr) {
      if (missing.empty()) missing = symbol;
      return;
    }
    fn = reinterpret_cast<Fn>(address);
  }
};

// ---- the driver's stream and event queries ----

// The fence path's queries of a created stream or of an event, and its switch of capture mode,
// straight from the driver. A miss that polls asks each stream it records on or queries whether it
// captures, and a stream with pending blocks whether it is idle; through the runtime each call also
// pays its entry (bench/tools/cuda_call_cost.cpp measures both). Only the answers "yes", "no" and "not
// ready" are taken from the driver: any other result (no context current on this thread, a real error)
// asks the runtime again, which binds the context and reports errors in its own words. Default streams
// always go through the runtime (they belong to the current device).
struct DriverQueries {
  PFN_cuStreamIsCapturing_v10000 stream_is_capturing = nullptr;
  PFN_cuStreamQuery_v2000 stream_query = nullptr;
  PFN_cuEventQuery_v2000 event_query = nullptr;
  PFN_cuThreadExchangeStreamCaptureMode_v10010 exchange_capture_mode = nullptr;

  static const DriverQueries& get() {
    static const DriverQueries driver = load();
    return driver;
  }

 private:
  static DriverQueries load() {
    DriverQueries d;
    void* is_capturing = find_driver_entry("cuStreamIsCapturing");
    void* stream_query = find_driver_entry("cuStreamQuery");
    void* event_query = find_driver_entry("cuEventQuery");
    void* exchange_mode = find_driver_entry("cuThreadExchangeStreamCaptureMode");
    if (is_capturing == nullptr || stream_query == nullptr || event_query == nullptr || exchange_mode == nullptr) {
      return d;  // all or none
    }
    d.stream_is_capturing = reinterpret_cast<PFN_cuStreamIsCapturing_v10000>(is_capturing);
    d.stream_query = reinterpret_cast<PFN_cuStreamQuery_v2000>(stream_query);
    d.event_query = reinterpret_cast<PFN_cuEventQuery_v2000>(event_query);
    d.exchange_capture_mode = reinterpret_cast<PFN_cuThreadExchangeStreamCaptureMode_v10010>(exchange_mode);
    return d;
  }
};

// Swaps the calling thread's capture mode (a cudaStreamCaptureMode value) with `*mode`: through the
// driver first, as the queries above, since the runtime's call would first make a context current on a
// thread that has none; through the runtime when the driver's entry point is missing or fails. Returns
// the runtime's error, its state cleared, when neither could.
cudaError_t exchange_capture_mode(int* mode) {
  const DriverQueries& driver = DriverQueries::get();
  if (driver.exchange_capture_mode != nullptr) {
    auto driver_mode = static_cast<CUstreamCaptureMode>(*mode);
    if (driver.exchange_capture_mode(&driver_mode) == CUDA_SUCCESS) {
      *mode = static_cast<int>(driver_mode);
      return cudaSuccess;
    }
  }
  auto runtime_mode = static_cast<cudaStreamCaptureMode>(*mode);
  const cudaError_t err = cudaThreadExchangeStreamCaptureMode(&runtime_mode);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return err;
  }
  *mode = static_cast<int>(runtime_mode);
  return cudaSuccess;
}

// Puts the calling thread in relaxed capture mode for a scope: a call the runtime counts as
// "potentially unsafe" then does not invalidate another stream's capture in global mode. Only for
// calls that are safe during a capture (reserving memory).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { restore_ = exchange_capture_mode(&previous_) == cudaSuccess; }
  ~RelaxedCaptureMode() {
    if (restore_) (void)exchange_capture_mode(&previous_);
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  int previous_ = cudaStreamCaptureModeRelaxed;
  bool restore_ = false;
};

// The driver's text and name for `result`, as far as the driver gives them.
std::string driver_error_text(CUresult result) {
  const DriverVm& driver = DriverVm::get();
  const char* text = nullptr;
  const char* name = nullptr;
  if (driver.get_error_string == nullptr || driver.get_error_string(result, &text) != CUDA_SUCCESS) text = nullptr;
  if (driver.get_error_name == nullptr || driver.get_error_name(result, &name) != CUDA_SUCCESS) name = nullptr;
  return std::string(text != nullptr ? text : "unknown driver error") + " (" +
         (name != nullptr ? name : "CUresult " + std::to_string(static_cast<int>(result))) + ")";
}

[[noreturn]] void throw_driver_error(CUresult result, const char* call, int device) {
  throw Error(ErrorCode::kBackend,
              std::string(call) + " failed on device " + std::to_string(device) + ": " + driver_error_text(result));
}

void check_driver(CUresult result, const char* call, int device) {
  if (result != CUDA_SUCCESS) throw_driver_error(result, call, device);
}

// Physical memory of one device; `exportable`: it can be exported as a POSIX file descriptor
// (export_piece), as PyTorch's expandable segments' memory is.
CUmemAllocationProp device_memory(CUdevice device, bool exportable = false) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (exportable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// The physical allocation one map_pages call is making. Unless committed, its destructor unmaps it
// (once mapped) and releases it (once created), so a call that fails part way (out of memory, or an
// error) leaves nothing behind.
class MappingInFlight {
 public:
  MappingInFlight(const DriverVm& driver, CUdeviceptr at, std::size_t bytes)
      : driver_(driver), at_(at), bytes_(bytes) {}
  ~MappingInFlight() {
    if (committed_) return;
    // Undoing our own fresh mapping; a failure here has nothing better to do than go on.
    if (mapped_) (void)driver_.unmap(at_, bytes_);
    if (created_) (void)driver_.release(handle_);
  }
  MappingInFlight(const MappingInFlight&) = delete;
  MappingInFlight& operator=(const MappingInFlight&) = delete;

  void created(CUmemGenericAllocationHandle handle) {
    handle_ = handle;
    created_ = true;
  }
  void mapped() { mapped_ = true; }
  CUmemGenericAllocationHandle handle() const { return handle_; }
  void commit() { committed_ = true; }

 private:
  const DriverVm& driver_;
  CUdeviceptr at_;
  std::size_t bytes_;
  CUmemGenericAllocationHandle handle_ = 0;
  bool created_ = false;
  bool mapped_ = false;
  bool committed_ = false;
};

// One device's virtual memory: whether it has it, and its ranges and mappings.
struct DeviceVm {
  std::mutex mutex;  // every VM call of the device, driver calls included
  bool probed = false;
  bool supported = false;
  // Why cuMemCreate refused exportable memory on this device (then its memory is created without);
  // empty while it has not.
  std::string not_exportable;
  CUdevice cu_device = 0;
  std::optional<AddressRanges> ranges;  // with the device's granularity, once probed and supported
};

std::string vm_call(const char* call, int device, const void* ptr, std::size_t bytes) {
  std::string text = std::string("CudaBackend::") + call + "(device " + std::to_string(device) + ", ";
  if (ptr != nullptr) text += AddressRanges::hex(reinterpret_cast<std::uintptr_t>(ptr)) + ", ";
  return text + std::to_string(bytes) + " bytes)";
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_count)
      : device_count_(device_count), vm_(std::make_unique<DeviceVm[]>(static_cast<std::size_t>(device_count))) {}

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
    const DriverQueries& driver = DriverQueries::get();
    if (driver.event_query != nullptr) {
      const CUresult result = driver.event_query(static_cast<CUevent>(event));
      if (result == CUDA_SUCCESS || result == CUDA_ERROR_NOT_READY) return result == CUDA_SUCCESS;
    }
    return completed(cudaEventQuery(to_cuda(event)), "cudaEventQuery", device);
  }

  bool query_stream(int device, Stream stream) override {
    const DriverQueries& driver = DriverQueries::get();
    if (driver.stream_query != nullptr && !is_default_stream(stream)) {
      const CUresult result = driver.stream_query(reinterpret_cast<CUstream>(stream));
      if (result == CUDA_SUCCESS || result == CUDA_ERROR_NOT_READY) return result == CUDA_SUCCESS;
    }
    std::optional<DeviceGuard> guard;
    if (is_default_stream(stream)) guard.emplace(device);
    return completed(cudaStreamQuery(to_cuda(stream)), "cudaStreamQuery", device);
  }

  void synchronize_event(int device, Event event) override {
    check(cudaEventSynchronize(to_cuda(event)), "cudaEventSynchronize", device);
  }

  void stream_wait_event(int device, Stream stream, Event event) override {
    DeviceGuard guard(device);
    check(cudaStreamWaitEvent(to_cuda(stream), to_cuda(event), 0), "cudaStreamWaitEvent", device);
  }

  bool is_capturing(int device, Stream stream) override {
    const DriverQueries& driver = DriverQueries::get();
    if (driver.stream_is_capturing != nullptr && !is_default_stream(stream)) {
      CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
      if (driver.stream_is_capturing(reinterpret_cast<CUstream>(stream), &status) == CUDA_SUCCESS) {
        return status != CU_STREAM_CAPTURE_STATUS_NONE;  // an invalidated capture too, as below
      }
    }
    std::optional<DeviceGuard> guard;
    if (is_default_stream(stream)) guard.emplace(device);
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

  bool capture_info(int device, Stream stream, CaptureInfo* info) override {
    // The legacy stream cannot capture; asking about it while another stream captures would break
    // that capture (cudaErrorStreamCaptureImplicit).
    if (is_default_stream(stream)) return false;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    const cudaGraphNode_t* frontier = nullptr;
    std::size_t count = 0;
#if CUDART_VERSION >= 13000
    check(cudaStreamGetCaptureInfo(to_cuda(stream), &status, &id, nullptr, &frontier, nullptr, &count),
          "cudaStreamGetCaptureInfo", device);
#else
    check(cudaStreamGetCaptureInfo_v2(to_cuda(stream), &status, &id, nullptr, &frontier, &count),
          "cudaStreamGetCaptureInfo_v2", device);
#endif
    // An invalidated capture will fail at its end; nothing is reused inside it.
    if (status != cudaStreamCaptureStatusActive) return false;
    info->id = id;
    info->frontier.assign(count, 0);
    for (std::size_t i = 0; i < count; ++i) info->frontier[i] = reinterpret_cast<GraphNode>(frontier[i]);
    return true;
  }

  std::vector<GraphNode> graph_node_dependencies(int device, GraphNode node) override {
    auto* n = reinterpret_cast<cudaGraphNode_t>(node);
    std::size_t count = 0;
#if CUDART_VERSION >= 13000
    check(cudaGraphNodeGetDependencies(n, nullptr, nullptr, &count), "cudaGraphNodeGetDependencies", device);
    std::vector<cudaGraphNode_t> deps(count);
    std::vector<cudaGraphEdgeData> edges(count);
    if (count != 0) {
      check(cudaGraphNodeGetDependencies(n, deps.data(), edges.data(), &count), "cudaGraphNodeGetDependencies", device);
    }
#else
    check(cudaGraphNodeGetDependencies(n, nullptr, &count), "cudaGraphNodeGetDependencies", device);
    std::vector<cudaGraphNode_t> deps(count);
    if (count != 0) check(cudaGraphNodeGetDependencies(n, deps.data(), &count), "cudaGraphNodeGetDependencies", device);
#endif
    std::vector<GraphNode> out(count);
    for (std::size_t i = 0; i < count; ++i) out[i] = reinterpret_cast<GraphNode>(deps[i]);
    return out;
  }

  int relax_capture_mode() override {
    int mode = cudaStreamCaptureModeRelaxed;
    const cudaError_t err = exchange_capture_mode(&mode);
    if (err != cudaSuccess) {
      throw Error(ErrorCode::kBackend, std::string("cudaThreadExchangeStreamCaptureMode failed: ") +
                                           cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
    }
    return mode;
  }

  // Called from a scope's end, which must not throw: a failure only clears the error state.
  void restore_capture_mode(int previous) override { (void)exchange_capture_mode(&previous); }

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

  bool supports_virtual_memory(int device) override {
    DeviceVm& vm = vm_of(device, "supports_virtual_memory");
    std::lock_guard<std::mutex> lock(vm.mutex);
    probe(vm, device);
    return vm.supported;
  }

  std::size_t vm_granularity(int device) override {
    DeviceVm& vm = vm_of(device, "vm_granularity");
    std::lock_guard<std::mutex> lock(vm.mutex);
    return ranges_of(vm, device, "vm_granularity").page_bytes();
  }

  void* reserve_address_range(int device, std::size_t bytes) override {
    DeviceVm& vm = vm_of(device, "reserve_address_range");
    std::lock_guard<std::mutex> lock(vm.mutex);
    AddressRanges& ranges = ranges_of(vm, device, "reserve_address_range");
    ranges.check_size(bytes, vm_call("reserve_address_range", device, nullptr, bytes));
    DeviceGuard guard(device, true);
    RelaxedCaptureMode relaxed;  // no stream work: safe during a capture, as reserve() is
    CUdeviceptr base = 0;
    const CUresult result = DriverVm::get().address_reserve(&base, bytes, ranges.page_bytes(), 0, 0);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;  // no address space that large: expected
    check_driver(result, "cuMemAddressReserve", device);
    ranges.add_range(base, bytes);
    return reinterpret_cast<void*>(base);
  }

  bool map_pages(int device, void* at, std::size_t bytes) override {
    DeviceVm& vm = vm_of(device, "map_pages");
    std::lock_guard<std::mutex> lock(vm.mutex);
    AddressRanges& ranges = ranges_of(vm, device, "map_pages");
    const auto base = reinterpret_cast<CUdeviceptr>(at);
    ranges.check_map(base, bytes, vm_call("map_pages", device, at, bytes));
    DeviceGuard guard(device, true);
    RelaxedCaptureMode relaxed;  // no stream work: safe during a capture, as reserve() is
    // One physical allocation for the whole call: one create, one map, one access grant.
    return map_run(vm, device, base, bytes, bytes);
  }

  bool map_pieces(int device, void* at, std::size_t bytes, std::size_t piece_bytes) override {
    DeviceVm& vm = vm_of(device, "map_pieces");
    std::lock_guard<std::mutex> lock(vm.mutex);
    AddressRanges& ranges = ranges_of(vm, device, "map_pieces");
    const auto base = reinterpret_cast<CUdeviceptr>(at);
    const std::string call = vm_call("map_pieces", device, at, bytes);
    ranges.check_map(base, bytes, call);
    ranges.check_size(piece_bytes, call);
    if (bytes % piece_bytes != 0) {
      throw Error(ErrorCode::kBackend,
                  call + ": not a whole number of pieces of " + std::to_string(piece_bytes) + " bytes");
    }
    DeviceGuard guard(device, true);
    RelaxedCaptureMode relaxed;  // no stream work: safe during a capture, as reserve() is
    // One create and one map per piece, one access grant for the run.
    return map_run(vm, device, base, bytes, piece_bytes);
  }

  int export_piece(int device, void* piece) override {
    DeviceVm& vm = vm_of(device, "export_piece");
    std::lock_guard<std::mutex> lock(vm.mutex);
    AddressRanges& ranges = ranges_of(vm, device, "export_piece");
    const std::string call = "CudaBackend::export_piece(device " + std::to_string(device) + ", " +
                             AddressRanges::hex(reinterpret_cast<std::uintptr_t>(piece)) + ")";
    AddressRanges::Mapping* mapping = ranges.mapping_at(reinterpret_cast<std::uintptr_t>(piece));
    if (mapping == nullptr) {
      throw Error(ErrorCode::kBackend, call + ": no mapping starts there (pass a piece's first address)");
    }
    if (mapping->exported >= 0) return mapping->exported;
    const DriverVm& driver = DriverVm::get();
    if (!vm.not_exportable.empty() || driver.export_handle == nullptr) {
      throw Error(ErrorCode::kBackend,
                  call + ": this device's mapped memory cannot be shared with another process: " +
                      (driver.export_handle == nullptr
                           ? std::string("the driver has no cuMemExportToShareableHandle")
                           : "cuMemCreate refused memory exportable as a POSIX file descriptor: " + vm.not_exportable));
    }
    DeviceGuard guard(device, true);
    int fd = -1;
    check_driver(driver.export_handle(&fd, mapping->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 "cuMemExportToShareableHandle", device);
    mapping->exported = fd;
    return fd;
  }

  void unmap_pages(int device, void* at, std::size_t bytes) override { unmap(device, at, bytes, true); }
  void unmap_unused_pages(int device, void* at, std::size_t bytes) override { unmap(device, at, bytes, false); }

  void release_address_range(int device, void* base, std::size_t bytes) override {
    DeviceVm& vm = vm_of(device, "release_address_range");
    std::lock_guard<std::mutex> lock(vm.mutex);
    AddressRanges& ranges = ranges_of(vm, device, "release_address_range");
    const auto address = reinterpret_cast<CUdeviceptr>(base);
    ranges.check_release(address, bytes, vm_call("release_address_range", device, base, bytes));
    DeviceGuard guard(device, true);
    RelaxedCaptureMode relaxed;  // nothing is mapped, no stream work
    check_driver(DriverVm::get().address_free(address, bytes), "cuMemAddressFree", device);
    ranges.remove_range(address);
  }

 private:
  // Unmaps and releases each whole mapping of [at, at + bytes). `synchronize`: wait for the device
  // first, as cuMemUnmap and cuMemRelease do not wait for work still using the memory (PyTorch
  // synchronizes before them too); waiting, as cudaFree does, keeps release()'s contract: work enqueued
  // before the call still finds its memory. Memory no work has used needs no wait, and then the call is
  // no stream work and runs in relaxed capture mode, so it is allowed during a capture.
  void unmap(int device, void* at, std::size_t bytes, bool synchronize) {
    const char* call = synchronize ? "unmap_pages" : "unmap_unused_pages";
    DeviceVm& vm = vm_of(device, call);
    std::lock_guard<std::mutex> lock(vm.mutex);
    AddressRanges& ranges = ranges_of(vm, device, call);
    const auto base = reinterpret_cast<CUdeviceptr>(at);
    const std::size_t count = ranges.check_unmap(base, bytes, vm_call(call, device, at, bytes));
    DeviceGuard guard(device, true);
    if (synchronize) check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", device);
    RelaxedCaptureMode relaxed;
    struct Mapping {
      CUdeviceptr address;
      std::size_t bytes;
      CUmemGenericAllocationHandle handle;
    };
    std::vector<Mapping> mappings;
    mappings.reserve(count);
    ranges.for_each_mapping_in(base, bytes,
                               [&](std::uintptr_t address, std::size_t size, AddressRanges::Handle handle) {
                                 mappings.push_back({address, size, handle});
                               });
    const DriverVm& driver = DriverVm::get();
    for (const Mapping& mapping : mappings) {
      check_driver(driver.unmap(mapping.address, mapping.bytes), "cuMemUnmap", device);
      const int exported = ranges.remove_mapping(mapping.address).exported;
      if (exported >= 0) (void)close(exported);  // a consumer's import holds the memory on its own
      check_driver(driver.release(mapping.handle), "cuMemRelease", device);
    }
  }

  // One physical allocation of `bytes` on the device, exportable unless the device refused that: the
  // first refusal (anything but out of memory) is remembered and the memory made without. Returns the
  // driver's result for the allocation made or not.
  CUresult create_physical(DeviceVm& vm, std::size_t bytes, CUmemGenericAllocationHandle* handle) {
    const DriverVm& driver = DriverVm::get();
    if (vm.not_exportable.empty()) {
      const CUmemAllocationProp exportable = device_memory(vm.cu_device, true);
      const CUresult result = driver.create(handle, bytes, &exportable, 0);
      if (result == CUDA_SUCCESS || result == CUDA_ERROR_OUT_OF_MEMORY) return result;
      vm.not_exportable = driver_error_text(result);
    }
    const CUmemAllocationProp prop = device_memory(vm.cu_device);
    return driver.create(handle, bytes, &prop, 0);
  }

  // Maps [base, base + bytes) as pieces of `piece_bytes`, each its own physical allocation (created and
  // mapped one by one), then grants the device access to the whole run at once. Called with vm.mutex
  // held, the device current and the checks done. Out of memory: false; an error: thrown; either way
  // nothing stays created or mapped.
  bool map_run(DeviceVm& vm, int device, CUdeviceptr base, std::size_t bytes, std::size_t piece_bytes) {
    const DriverVm& driver = DriverVm::get();
    std::vector<std::unique_ptr<MappingInFlight>> pieces;
    pieces.reserve(bytes / piece_bytes);
    for (std::size_t offset = 0; offset < bytes; offset += piece_bytes) {
      // Undone in reverse order of making when this call does not commit.
      pieces.push_back(std::make_unique<MappingInFlight>(driver, base + offset, piece_bytes));
      MappingInFlight& piece = *pieces.back();
      CUmemGenericAllocationHandle handle = 0;
      CUresult result = create_physical(vm, piece_bytes, &handle);
      if (result == CUDA_ERROR_OUT_OF_MEMORY) return undo(pieces);
      if (result != CUDA_SUCCESS) {
        undo(pieces);
        throw_driver_error(result, "cuMemCreate", device);
      }
      piece.created(handle);
      result = driver.map(base + offset, piece_bytes, 0, handle, 0);
      if (result == CUDA_ERROR_OUT_OF_MEMORY) return undo(pieces);
      if (result != CUDA_SUCCESS) {
        undo(pieces);
        throw_driver_error(result, "cuMemMap", device);
      }
      piece.mapped();
    }
    CUmemAccessDesc access = {};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = vm.cu_device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const CUresult result = driver.set_access(base, bytes, &access, 1);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) return undo(pieces);
    if (result != CUDA_SUCCESS) {
      undo(pieces);
      throw_driver_error(result, "cuMemSetAccess", device);
    }
    AddressRanges& ranges = *vm.ranges;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      ranges.add_mapping(base + i * piece_bytes, piece_bytes, pieces[i]->handle());
      pieces[i]->commit();
    }
    return true;
  }

  // Unmaps and releases the pieces of a map_run that does not commit, newest first. Returns false (the
  // run's answer when the device is full).
  static bool undo(std::vector<std::unique_ptr<MappingInFlight>>& pieces) {
    while (!pieces.empty()) pieces.pop_back();
    return false;
  }

  DeviceVm& vm_of(int device, const char* call) {
    if (device < 0 || device >= device_count_) {
      throw Error(ErrorCode::kBackend, std::string("CudaBackend::") + call + ": device " + std::to_string(device) +
                                           " does not exist (" + std::to_string(device_count_) + " visible)");
    }
    return vm_[static_cast<std::size_t>(device)];
  }

  // Asks the driver once whether `device` has virtual memory management, and its granularity: the
  // minimum for pinned device memory, 2 MiB on current GPUs. Called with vm.mutex held; a failed probe
  // throws and is tried again by the next call.
  void probe(DeviceVm& vm, int device) {
    if (vm.probed) return;
    const DriverVm& driver = DriverVm::get();
    if (driver.missing.empty()) {
      DeviceGuard guard(device, true);
      check_driver(driver.device_get(&vm.cu_device, device), "cuDeviceGet", device);
      int supported = 0;
      check_driver(driver.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                               vm.cu_device),
                   "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", device);
      if (supported != 0) {
        const CUmemAllocationProp prop = device_memory(vm.cu_device);
        std::size_t granularity = 0;
        check_driver(driver.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     "cuMemGetAllocationGranularity", device);
        vm.ranges.emplace(granularity);
        vm.supported = true;
      }
    }
    vm.probed = true;
  }

  // The device's ranges, or the "not supported" error when it has no virtual memory.
  AddressRanges& ranges_of(DeviceVm& vm, int device, const char* call) {
    probe(vm, device);
    if (!vm.supported) unsupported(call, device);
    return *vm.ranges;
  }

  const int device_count_;          // devices are fixed for the life of a process (CUDA_VISIBLE_DEVICES)
  std::unique_ptr<DeviceVm[]> vm_;  // per device
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
    const std::string why = err != cudaSuccess
                                ? std::string(cudaGetErrorString(err)) + " (" + cudaGetErrorName(err) + ")"
                                : std::string("no devices");
    throw Error(ErrorCode::kConfig,
                "streamalloc: the CUDA backend needs a CUDA device, but none is present (cudaGetDeviceCount: " + why +
                    "). Check the driver and CUDA_VISIBLE_DEVICES, or use backend:sim.");
  }
  return std::make_shared<CudaBackend>(count);
}

}  // namespace streamalloc

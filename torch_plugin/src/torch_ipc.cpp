#include "torch_ipc.hpp"

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace streamalloc::torch {
namespace {

constexpr std::size_t kCudaIpcHandleBytes = sizeof(cudaIpcMemHandle_t);

// The header PyTorch writes before the descriptors of an 'e' handle (its ExpandableSegment::ShareHeader:
// a pid_t padded to 8 bytes, then two size_t).
struct ExpandableHeader {
  pid_t pid;
  std::size_t piece_bytes;
  std::size_t pieces;
};

// The driver calls an 'e' handle needs, asked of the runtime once (the plugin links the runtime only).
struct DriverCalls {
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
  bool complete = false;
};

template <typename Fn>
void find(const char* symbol, Fn& out) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found);
#else
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &address, cudaEnableDefault, &found);
#endif
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    address = nullptr;
  }
  out = reinterpret_cast<Fn>(address);
}

const DriverCalls& driver() {
  static const DriverCalls calls = [] {
    DriverCalls d;
    find("cuMemImportFromShareableHandle", d.import_handle);
    find("cuMemAddressReserve", d.address_reserve);
    find("cuMemAddressFree", d.address_free);
    find("cuMemMap", d.map);
    find("cuMemUnmap", d.unmap);
    find("cuMemSetAccess", d.set_access);
    find("cuMemRelease", d.release);
    find("cuMemGetAddressRange", d.address_range);
    d.complete =
        d.import_handle && d.address_reserve && d.address_free && d.map && d.unmap && d.set_access && d.release;
    return d;
  }();
  return calls;
}

void check_driver(CUresult result, const char* call) {
  TORCH_CHECK(result == CUDA_SUCCESS, "streamalloc: opening a CUDA tensor shared from an expandable segment: ", call,
              " failed with CUDA driver error ", static_cast<int>(result));
}

// The pieces of a producer's expandable segment, mapped side by side into a range of this process.
struct ImportedPieces {
  int device = 0;
  CUdeviceptr base = 0;
  std::size_t piece_bytes = 0;
  std::size_t range_bytes = 0;                        // reserved at base (0: none)
  std::vector<CUmemGenericAllocationHandle> handles;  // imported; mapped in order from base once it is set

  ~ImportedPieces() {
    const DriverCalls& d = driver();
    // As PyTorch's consumer: the producer may still write through its own mapping; the device's work
    // that read or wrote through this one must be done before the mapping goes.
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    (void)cudaDeviceSynchronize();
    for (std::size_t i = 0; i < handles.size(); ++i) {
      if (base != 0) (void)d.unmap(base + i * piece_bytes, piece_bytes);
      (void)d.release(handles[i]);
    }
    if (base != 0) (void)d.address_free(base, range_bytes);
  }
};

std::shared_ptr<ImportedPieces> import_expandable(const std::string& handle, int device) {
  const DriverCalls& d = driver();
  TORCH_CHECK(d.complete,
              "streamalloc: opening a CUDA tensor shared from an expandable segment needs the CUDA driver's virtual "
              "memory calls, which this driver does not have");
  ExpandableHeader header{};
  TORCH_CHECK(handle.size() >= 2 + sizeof(header), "streamalloc: an expandable-segment IPC handle of ", handle.size(),
              " bytes is too short");
  std::memcpy(&header, handle.data() + 2, sizeof(header));
  TORCH_CHECK(
      header.pieces > 0 && header.piece_bytes > 0 && handle.size() == 2 + sizeof(header) + header.pieces * sizeof(int),
      "streamalloc: malformed expandable-segment IPC handle (", header.pieces, " pieces in ", handle.size(), " bytes)");
  const long pidfd = syscall(SYS_pidfd_open, header.pid, 0);
  TORCH_CHECK(pidfd != -1, "streamalloc: opening a CUDA tensor shared from an expandable segment: pidfd_open(",
              header.pid, ") failed: ", std::strerror(errno),
              errno == ENOSYS ? " (this kernel lacks pidfd_open; the producer can set expandable_segments:False)" : "");
  auto pieces = std::make_shared<ImportedPieces>();
  pieces->device = device;
  pieces->piece_bytes = header.piece_bytes;
  pieces->handles.reserve(header.pieces);
  try {
    for (std::size_t i = 0; i < header.pieces; ++i) {
      int remote_fd = 0;
      std::memcpy(&remote_fd, handle.data() + 2 + sizeof(header) + i * sizeof(int), sizeof(int));
      const long fd = syscall(SYS_pidfd_getfd, pidfd, remote_fd, 0);
      TORCH_CHECK(fd != -1,
                  "streamalloc: opening a CUDA tensor shared from an expandable segment: pidfd_getfd "
                  "failed: ",
                  std::strerror(errno));
      CUmemGenericAllocationHandle imported = 0;
      const CUresult result = d.import_handle(&imported, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      close(static_cast<int>(fd));
      check_driver(result, "cuMemImportFromShareableHandle");
      pieces->handles.push_back(imported);
    }
    close(static_cast<int>(pidfd));
  } catch (...) {
    close(static_cast<int>(pidfd));
    throw;  // ~ImportedPieces releases what was imported
  }
  const std::size_t bytes = header.piece_bytes * header.pieces;
  CUdeviceptr base = 0;
  check_driver(d.address_reserve(&base, bytes, 0, 0, 0), "cuMemAddressReserve");
  pieces->base = base;
  pieces->range_bytes = bytes;
  std::vector<CUmemGenericAllocationHandle> to_map = std::move(pieces->handles);
  pieces->handles.clear();
  for (std::size_t i = 0; i < to_map.size(); ++i) {
    const CUresult mapped = d.map(pieces->base + i * header.piece_bytes, header.piece_bytes, 0, to_map[i], 0);
    if (mapped != CUDA_SUCCESS) {
      for (std::size_t j = i; j < to_map.size(); ++j) (void)d.release(to_map[j]);
      check_driver(mapped, "cuMemMap");
    }
    pieces->handles.push_back(to_map[i]);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check_driver(d.set_access(pieces->base, bytes, &access, 1), "cuMemSetAccess");
  return pieces;
}

}  // namespace

c10::cuda::CUDACachingAllocator::ShareableHandle share_cuda_malloc_segment(void* segment_base, std::ptrdiff_t offset) {
  // cudaIpcGetMemHandle shares the whole cudaMalloc allocation holding its pointer, and the consumer
  // opens that allocation's base: the offset must be from there. A segment streamalloc reserved is one
  // allocation; a segment a MemPool's own allocator handed out may lie inside a larger one.
  void* base = segment_base;
  const DriverCalls& d = driver();
  if (d.address_range != nullptr) {
    CUdeviceptr allocation = 0;
    std::size_t bytes = 0;
    if (d.address_range(&allocation, &bytes, reinterpret_cast<CUdeviceptr>(segment_base)) == CUDA_SUCCESS) {
      offset += static_cast<const char*>(segment_base) - reinterpret_cast<const char*>(allocation);
      base = reinterpret_cast<void*>(allocation);
    }
  }
  cudaIpcMemHandle_t handle;
  C10_CUDA_CHECK(cudaIpcGetMemHandle(&handle, base));
  std::string bytes;
  bytes.reserve(2 + kCudaIpcHandleBytes);
  bytes.push_back(kIpcHandleVersion);
  bytes.push_back(kIpcCudaMalloc);
  bytes.append(reinterpret_cast<const char*>(&handle), kCudaIpcHandleBytes);
  return {offset, std::move(bytes)};
}

c10::cuda::CUDACachingAllocator::ShareableHandle share_expandable_pieces(const streamalloc::SharedPieces& shared) {
  TORCH_CHECK(!shared.pieces.empty(), "streamalloc: sharing a block of an expandable segment: no pieces under it");
  const std::size_t piece_bytes = shared.pieces.front().bytes;
  for (std::size_t i = 0; i < shared.pieces.size(); ++i) {
    const streamalloc::SharedPieces::Piece& piece = shared.pieces[i];
    // PyTorch's format describes a run of equal pieces side by side; streamalloc maps every piece as
    // one page, so anything else is a broken invariant, not a case to encode.
    TORCH_CHECK(
        piece.bytes == piece_bytes && piece.address == shared.pieces.front().address + i * piece_bytes && piece.fd >= 0,
        "streamalloc: sharing a block of an expandable segment: its pieces are not a run of equal, exported "
        "pieces (piece ",
        i, ": ", piece.bytes, " bytes, descriptor ", piece.fd, ")");
  }
  // PyTorch's header, padding zeroed: the consumer caches what it opened by the handle's bytes.
  ExpandableHeader header;
  std::memset(&header, 0, sizeof header);
  header.pid = getpid();
  header.piece_bytes = piece_bytes;
  header.pieces = shared.pieces.size();
  std::string bytes;
  bytes.reserve(2 + sizeof header + shared.pieces.size() * sizeof(int));
  bytes.push_back(kIpcHandleVersion);
  bytes.push_back(kIpcExpandable);
  bytes.append(reinterpret_cast<const char*>(&header), sizeof header);
  for (const streamalloc::SharedPieces::Piece& piece : shared.pieces) {
    const int fd = piece.fd;
    bytes.append(reinterpret_cast<const char*>(&fd), sizeof fd);
  }
  return {static_cast<std::ptrdiff_t>(shared.offset), std::move(bytes)};
}

std::shared_ptr<void> IpcImports::open(const std::string& handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = opened_.find(handle);
  if (found != opened_.end()) {
    if (std::shared_ptr<void> alive = found->second.lock()) return alive;
    opened_.erase(found);  // its last user is closing it right now
  }
  char type = kIpcCudaMalloc;
  std::size_t payload = 0;
  if (handle.size() != kCudaIpcHandleBytes) {
    TORCH_CHECK(handle.size() >= 2, "streamalloc: a CUDA IPC handle of ", handle.size(), " bytes is not one");
    TORCH_CHECK(handle[0] >= 1 && handle[0] <= kIpcHandleVersion, "streamalloc: CUDA IPC handle of version ",
                static_cast<int>(handle[0]), " (this build reads PyTorch's versions up to ",
                static_cast<int>(kIpcHandleVersion), ")");
    type = handle[1];
    payload = 2;
  }
  const c10::DeviceIndex device = c10::cuda::current_device();
  std::shared_ptr<void> opened;
  if (type == kIpcCudaMalloc) {
    TORCH_CHECK(handle.size() == payload + kCudaIpcHandleBytes, "streamalloc: a cudaMalloc IPC handle of ",
                handle.size(), " bytes is malformed");
    cudaIpcMemHandle_t ipc;
    std::memcpy(&ipc, handle.data() + payload, kCudaIpcHandleBytes);
    void* base = nullptr;
    C10_CUDA_CHECK(cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess));
    opened = std::shared_ptr<void>(base, [this, handle, device](void* ptr) {
      {
        std::lock_guard<std::mutex> erase_lock(mutex_);
        auto it = opened_.find(handle);
        if (it != opened_.end() && it->second.expired()) opened_.erase(it);
      }
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK_WARN(cudaIpcCloseMemHandle(ptr));
    });
  } else if (type == kIpcExpandable) {
    std::shared_ptr<ImportedPieces> pieces = import_expandable(handle, device);
    void* base = reinterpret_cast<void*>(pieces->base);
    opened = std::shared_ptr<void>(base, [this, handle, pieces](void*) mutable {
      {
        std::lock_guard<std::mutex> erase_lock(mutex_);
        auto it = opened_.find(handle);
        if (it != opened_.end() && it->second.expired()) opened_.erase(it);
      }
      pieces.reset();  // unmaps, outside the lock: it synchronises the device
    });
  } else {
    TORCH_CHECK(false, "streamalloc: unknown CUDA IPC handle type '", type, "'");
  }
  opened_[handle] = opened;
  return opened;
}

}  // namespace streamalloc::torch

// CUDA IPC for PyTorch (torch.multiprocessing sharing CUDA tensors): the handles a producer sends and
// the consumer's cache of the memory it opened, in PyTorch's own handle format, so that a producer and
// a consumer can each run PyTorch's allocator or streamalloc (docs/pytorch.md, "CUDA tensors across
// processes").
//
// PyTorch's format: one version byte, one type byte, then the type's payload. 'c' (memory from
// cudaMalloc): the segment's 64-byte cudaIpcMemHandle_t, the block being at ShareableHandle::offset
// from the segment's base. 'e' (PyTorch's expandable segments): a header (pid, piece size, number of
// pieces) then one POSIX file descriptor number per piece, which the consumer duplicates from the
// producer with pidfd_getfd and maps in order. A bare 64-byte string is a 'c' handle of an older
// PyTorch.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include <c10/cuda/CUDACachingAllocator.h>

#include "streamalloc/blocks.hpp"

namespace streamalloc::torch {

// PyTorch's version byte and type bytes (c10/cuda/CUDACachingAllocator.cpp).
inline constexpr char kIpcHandleVersion = 2;
inline constexpr char kIpcCudaMalloc = 'c';
inline constexpr char kIpcExpandable = 'e';

// The 'c' handle of the cudaMalloc allocation holding `segment_base` (the current device's), for a block
// at `offset` from `segment_base`; the handle's offset is from the allocation's base.
c10::cuda::CUDACachingAllocator::ShareableHandle share_cuda_malloc_segment(void* segment_base, std::ptrdiff_t offset);

// The 'e' handle of a block in one of streamalloc's expandable segments, from the pieces under it
// (streamalloc::Allocator::share_pieces: equal, side by side, each exported as a POSIX file descriptor
// this process keeps open while the block is live): PyTorch's header (this process's id, the piece
// size, the number of pieces) then each piece's descriptor; the handle's offset is the block's from the
// first piece, where the consumer's mapping of the pieces starts.
c10::cuda::CUDACachingAllocator::ShareableHandle share_expandable_pieces(const streamalloc::SharedPieces& shared);

// The consumer side: each handle is opened once per process and closed when the last storage built on
// it dies, as PyTorch's allocator does (a cudaIpcMemHandle_t can be opened only once per process).
class IpcImports {
 public:
  // The base of the producer's segment (or mapped pieces) in this process, on the current device.
  // Throws c10::Error naming what is wrong for a handle it cannot open.
  std::shared_ptr<void> open(const std::string& handle);

 private:
  struct Opened;
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<void>> opened_;
};

}  // namespace streamalloc::torch

// DeviceCache: the read-only reports' calls (segments, blocks, cache info, pending history); the
// reports themselves are CacheReport's (cache_report.cpp).
#include <spdlog/fmt/fmt.h>

#include <utility>

#include "device_cache.hpp"

namespace streamalloc {

std::vector<SegmentInfo> DeviceCache::segments() const {
  DeviceLock lock(*this);
  shards_.lock_all();
  if (aids_ != nullptr)
    aids_->on_snapshot(static_cast<std::size_t>(ledger_.with_shards(shards_).active_bytes[0].current));
  return report_.segments(Clock::now());
}

std::size_t DeviceCache::requested_size_of(const void* ptr) const {
  DeviceLock lock(*this);
  const Block* block = const_cast<ShardSet&>(shards_).find_live(reinterpret_cast<std::uintptr_t>(ptr));
  return block == nullptr ? 0 : block->requested;
}

void DeviceCache::cache_info(std::size_t* largest_free_block, std::size_t* total_cached) const {
  DeviceLock lock(*this);
  report_.cache_info(largest_free_block, total_cached);
}

void* DeviceCache::segment_base(const void* ptr, std::size_t* size) const {
  DeviceLock lock(*this);
  const Segment* segment = segments_.containing(reinterpret_cast<std::uintptr_t>(ptr));
  if (segment == nullptr) return nullptr;
  if (segment->expandable()) {
    // The base serves sharing one allocation with another process (CUDA IPC); an expandable segment is
    // many (its pieces), which share_pieces describes.
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("streamalloc: {} is in an expandable segment, which is not one allocation with a base; "
                            "share_pieces gives the pieces of memory under a live block of it.",
                            ptr));
  }
  if (size) *size = segment->size;
  return reinterpret_cast<void*>(segment->address);
}

// Under the device lock, so the block cannot be freed and its pieces cannot be unmapped meanwhile; a
// live block's pieces are never unmapped (trim unmaps whole pieces inside free blocks only).
bool DeviceCache::share_pieces(const void* ptr, SharedPieces* out) {
  DeviceLock lock(*this);
  const Block* block = shards_.find_live(reinterpret_cast<std::uintptr_t>(ptr));
  if (block == nullptr) return false;
  SharedPieces shared;
  const Segment* segment = block->segment;
  if (segment->expandable()) {
    if (!options_.expandable_ipc) {
      // Its pieces vary in size, and PyTorch's format describes a run of equal ones.
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("streamalloc: {} is in an expandable segment, whose memory is mapped in pieces of "
                              "varying size and cannot be sent to another process; set expandable_ipc:true "
                              "(STREAMALLOC_CONF, or streamalloc.enable(expandable_ipc=True)) so that expandable "
                              "segments map one page per piece, allocate the memory to share in a MemPool (fixed "
                              "segments), or run without expandable_segments.",
                              ptr));
    }
    segment->pieces.for_each_holding(block->address, block->address + block->size,
                                     [&](std::uintptr_t address, std::size_t bytes) {
                                       shared.pieces.push_back({address, bytes, -1});
                                     });
    for (SharedPieces::Piece& piece : shared.pieces) {
      piece.fd = backend_.export_piece(device_, reinterpret_cast<void*>(piece.address));
    }
    shared.offset = block->address - shared.pieces.front().address;
  }
  *out = std::move(shared);
  return true;
}

PendingHistory DeviceCache::pending_history() const {
  DeviceLock lock(*this);
  PendingHistory history;
  if (aids_ != nullptr) aids_->pending_history(&history);
  return history;
}

}  // namespace streamalloc

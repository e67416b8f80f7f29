#include "segment_source.hpp"

#include <algorithm>
#include <utility>

#include "logging.hpp"
#include "memory_pool.hpp"

namespace streamalloc {

SegmentSource::~SegmentSource() {
  for (auto& [address, segment] : segments_) {
    for (Block* b = segment->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
  }
}

Segment* SegmentSource::add(std::uintptr_t address, std::size_t bytes, SizeClass pool, MemoryPool* owner,
                            Stream stream) {
  auto segment = std::make_unique<Segment>();
  segment->address = address;
  segment->size = bytes;
  segment->size_class = pool;
  segment->owner = owner;
  segment->stream = stream;
  auto* block = new Block;
  block->address = address;
  block->size = bytes;
  block->segment = segment.get();
  block->state = BlockState::kFree;
  block->settled = true;
  block->stream = stream;
  block->since = Clock::now();
  segment->head = block;
  segment->tail = block;
  Segment* out = segment.get();
  segments_.emplace(address, std::move(segment));
  reserved_ += bytes;
  return out;
}

Segment* SegmentSource::reserve(SizeClass pool, MemoryPool* owner, std::size_t bytes, Stream stream) {
  void* memory = nullptr;
  if (owner != nullptr && owner->segment_allocator) {
    // The pool's own allocator may allocate device memory during a capture, as the backend does.
    const int previous = backend_.relax_capture_mode();
    try {
      memory = owner->segment_allocator->reserve(device_, bytes);
    } catch (...) {
      backend_.restore_capture_mode(previous);
      throw;
    }
    backend_.restore_capture_mode(previous);
  } else {
    memory = backend_.reserve(device_, bytes);
  }
  if (memory == nullptr) return nullptr;
  return add(reinterpret_cast<std::uintptr_t>(memory), bytes, pool, owner, stream);
}

bool SegmentSource::map_pieces(std::uintptr_t at, std::size_t bytes, std::size_t piece_bytes, SegmentPieces* pieces) {
  // A run of equal pieces, then what remains as one piece; all or nothing (Backend::map_pieces): what a
  // refused or failed call mapped is taken back without a device sync, so this works while a stream
  // captures, as the maps themselves do.
  const std::size_t run = bytes / piece_bytes * piece_bytes;
  const std::size_t rest = bytes - run;
  if (run > 0 && !backend_.map_pieces(device_, reinterpret_cast<void*>(at), run, piece_bytes)) return false;
  if (rest > 0) {
    const auto take_back_run = [&] {
      if (run > 0) backend_.unmap_unused_pages(device_, reinterpret_cast<void*>(at), run);
    };
    bool mapped = false;
    try {
      mapped = backend_.map_pieces(device_, reinterpret_cast<void*>(at + run), rest, rest);
    } catch (...) {
      try {
        take_back_run();
      } catch (const Error& e) {  // keep the first error; the run stays mapped, unaccounted
        log().warn("device {}: {} bytes of a failed growth stay mapped: {}", device_, run, without_prefix(e.what()));
      }
      throw;
    }
    if (!mapped) {
      take_back_run();
      return false;
    }
  }
  for (std::size_t offset = 0; offset < run; offset += piece_bytes) pieces->add(at + offset, piece_bytes);
  if (rest > 0) pieces->add(at + run, rest);
  return true;
}

Segment* SegmentSource::reserve_expandable(SizeClass pool, MemoryPool* owner, std::size_t range_bytes,
                                           std::size_t bytes, std::size_t piece_bytes, Stream stream, Refusal* why) {
  void* range = backend_.reserve_address_range(device_, range_bytes);
  if (range == nullptr) {
    *why = Refusal::kNoAddressSpace;
    return nullptr;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(range);
  SegmentPieces pieces;
  bool mapped = false;
  try {
    mapped = map_pieces(base, bytes, piece_bytes, &pieces);
  } catch (...) {
    backend_.release_address_range(device_, range, range_bytes);
    throw;
  }
  if (!mapped) {
    backend_.release_address_range(device_, range, range_bytes);
    *why = Refusal::kNoMemory;
    return nullptr;
  }
  *why = Refusal::kNone;
  Segment* segment = add(base, bytes, pool, owner, stream);
  segment->address_range = range_bytes;
  segment->pieces = std::move(pieces);
  return segment;
}

Block* SegmentSource::grow(Segment* segment, std::size_t bytes, std::size_t piece_bytes) {
  const std::uintptr_t end = segment->address + segment->span();
  if (!map_pieces(end, bytes, piece_bytes, &segment->pieces)) return nullptr;
  auto* block = new Block;
  block->address = end;
  block->size = bytes;
  block->segment = segment;
  block->prev = segment->tail;
  segment->tail->next = block;
  segment->tail = block;
  block->state = BlockState::kFree;
  block->settled = true;  // fresh pages: no stream has touched them
  block->stream = segment->stream;
  block->since = Clock::now();
  segment->size += bytes;
  reserved_ += bytes;
  return block;
}

SegmentSource::Remains SegmentSource::unmap(Segment* segment, Block* block, SegmentPieces::Run run) {
  backend_.unmap_pages(device_, reinterpret_cast<void*>(run.address), run.bytes);
  segment->pieces.remove(run);
  segment->size -= run.bytes;
  reserved_ -= run.bytes;
  Remains remains;
  const std::uintptr_t end = block->address + block->size;
  if (run.address + run.bytes < end) {
    remains.after = split_block(block, run.address + run.bytes - block->address);  // the same state, linked after
  }
  if (run.address > block->address) {
    block->size = run.address - block->address;
    remains.before = block;
    return remains;
  }
  // Nothing stays before the run: the block goes.
  if (block->prev != nullptr) {
    block->prev->next = block->next;
  } else {
    segment->head = block->next;
  }
  if (block->next != nullptr) {
    block->next->prev = block->prev;
  } else {
    segment->tail = block->prev;
  }
  delete block;
  return remains;
}

void SegmentSource::release(Segment* segment) {
  const auto base = reinterpret_cast<void*>(segment->address);
  if (segment->expandable()) {
    // Its one block covers every piece, side by side: one call unmaps them all.
    backend_.unmap_pages(device_, reinterpret_cast<void*>(segment->head->address), segment->size);
    segment->pieces.remove({segment->head->address, segment->size});
    // The memory is back now; a range that cannot be released costs addresses only, so the segment
    // goes regardless (keeping it would claim pages that are no longer mapped).
    try {
      backend_.release_address_range(device_, base, segment->address_range);
    } catch (const Error& e) {
      log().warn("device {}: the address range of an expandable segment stays reserved: {}", device_,
                 without_prefix(e.what()));
    }
  } else if (segment->owner != nullptr && segment->owner->segment_allocator) {
    segment->owner->segment_allocator->release(device_, base, segment->size);
  } else {
    backend_.release(device_, base, segment->size);
  }
  reserved_ -= segment->size;
  delete segment->head;
  segments_.erase(segment->address);
}

const Segment* SegmentSource::containing(std::uintptr_t address) const {
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return nullptr;
  --it;
  return address < it->first + it->second->span() ? it->second.get() : nullptr;
}

std::vector<Segment*> SegmentSource::all() const {
  std::vector<Segment*> out;
  out.reserve(segments_.size());
  for (const auto& [address, segment] : segments_) out.push_back(segment.get());
  return out;
}

}  // namespace streamalloc

// ExpandableSegments: expandable segments (docs/design.md, "Expandable segments"), PyTorch's
// expandable_segments:True made stream-aware. With the option on, the default pool's memory comes from
// one segment per (stream, size class): a reserved address range whose blocks cover exactly its mapped
// pieces. When no cached block serves an allocation, the stream's segment grows after its last block by
// whole pages, mapped as one physical allocation (past half of the memory cap: in pieces of up to
// 20 MiB in the large class and of one page in the small one; with expandable_ipc, one page each, so
// that a block can be sent to another process): that block grows when the stream may
// take it, else the new pages are a block of their own. Blocks inside split, merge, settle and go
// pending exactly as in fixed segments. The whole pieces inside free blocks are unmapped by
// empty_cache(), the memory cap and the OOM path (release_free_segments), and a segment with nothing
// left mapped gives its range back.
#include "expandable_segments.hpp"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <string>
#include <vector>

#include "invariant.hpp"
#include "logging.hpp"
#include "size_policy.hpp"

namespace streamalloc {

void ExpandableSegments::set_up(bool option, Backend& backend, int device) {
  on_ = false;
  if (!option) return;
  if (!backend.supports_virtual_memory(device)) {
    static std::atomic<bool> told{false};
    if (!told.exchange(true)) {
      log().warn(
          "expandable_segments: the {} backend has no virtual memory on device {}; the cache uses fixed "
          "segments there (docs/options.md)",
          backend.name(), device);
    }
    return;
  }
  if (page_bytes_ == 0) page_bytes_ = backend.vm_granularity(device);
  on_ = true;
}

using size_policy::round_up;

namespace {
// The most one physical allocation of a growth of `bytes` maps (docs/design.md, "Expandable
// segments"). On a device the driver charges per allocation, not per byte, so while memory is
// plentiful a growth is one allocation. Past half of what the cache may map (the memory-fraction cap)
// it maps pieces of 20 MiB in the large class (PyTorch's kLargeBuffer handles) and of one page in the
// small one: a piece goes back only whole, and near the cap the OOM path must be able to give back
// the free parts of what is mapped. With expandable_ipc every piece is one page: PyTorch's format for
// sending memory to another process describes a run of equal pieces.
constexpr std::size_t kLargePieceBytes = 20 * MiB;
std::size_t piece_bytes(SizeClass kind, std::size_t page, std::size_t bytes, bool near_cap, bool page_pieces) {
  if (page_pieces) return page;
  if (!near_cap) return bytes;
  return kind == SizeClass::kLarge ? round_up(kLargePieceBytes, page) : page;
}

}  // namespace

Block* ExpandableSegments::grow(SizeClass kind, std::size_t size, Stream stream, std::size_t cap,
                                bool* no_address_space) {
  const std::size_t page = page_bytes_;
  const bool page_pieces = p_.options.expandable_ipc;
  // Past half of the cap a growth maps in pieces the OOM path can give back one by one.
  const auto near_cap = [&](std::size_t growth) { return p_.segments.reserved_bytes() + growth > cap / 2; };
  if (Segment* segment = growing(stream, kind)) {
    Block* tail = segment->tail;
    // The last block grows when this allocation may take it: free in the lists (not hot, held or
    // pending), and owned by this stream or settled where this stream may take settled blocks. Else
    // the new pages are a block of their own, handed out at once (the caller takes it), so they never
    // merge into a block of another stream.
    const bool extend =
        !tail->in_shard && tail->state == BlockState::kFree && !tail->held && !tail->hot &&
        (tail->settled ? p_.options.cross_stream_reuse != CrossStreamReuse::kNever || tail->stream == stream
                       : tail->stream == stream) &&
        tail->size < size;
    const std::size_t bytes = round_up(extend ? size - tail->size : size, page);
    if (segment->span() + bytes <= segment->address_range) {
      if (p_.segments.reserved_bytes() + bytes > cap) return nullptr;
      Block* added = p_.segments.grow(segment, bytes, piece_bytes(kind, page, bytes, near_cap(bytes), page_pieces));
      if (added == nullptr) return nullptr;
      if (p_.aids != nullptr) {
        p_.aids->on_segment_pages(TraceAction::kSegmentMap, *segment, added->address, bytes);
      }
      p_.ledger.count(&DeviceStats::num_device_alloc);
      p_.ledger.increase(&DeviceStats::reserved_bytes, kind, static_cast<std::int64_t>(bytes));
      if (!extend) {
        refresh_split(added->prev);  // a block alone in its segment is split from now on
        p_.free.insert(added);
        return added;
      }
      p_.free.remove(tail);
      Block* grown = FreeLists::merge(tail, added);
      p_.free.insert(grown);
      return grown;
    }
    // The range is full: a new segment takes over the growing; this one keeps its blocks and still
    // gives free pages back.
  }

  const std::size_t bytes = round_up(size, page);
  if (p_.segments.reserved_bytes() + bytes > cap) return nullptr;
  // As PyTorch's, a range can map the whole device, so one segment serves a stream's large blocks; the
  // small blocks' range is an eighth of it, and a full range is followed by a new one.
  const std::size_t share = kind == SizeClass::kLarge ? p_.device_total.load() : p_.device_total.load() / 8;
  const std::size_t range = std::max(bytes, round_up(share, page));
  SegmentSource::Refusal why = SegmentSource::Refusal::kNone;
  Segment* segment = p_.segments.reserve_expandable(
      kind, &p_.default_pool, range, bytes, piece_bytes(kind, page, bytes, near_cap(bytes), page_pieces), stream, &why);
  if (segment == nullptr) {
    // Without address space the memory may still be there: a fixed segment, as without the option.
    *no_address_space = why == SegmentSource::Refusal::kNoAddressSpace;
    return nullptr;
  }
  set_growing(stream, kind, segment);
  // As PyTorch's history: maps and unmaps, never segment_alloc/segment_free, for expandable segments.
  if (p_.aids != nullptr) {
    p_.aids->on_segment_pages(TraceAction::kSegmentMap, *segment, segment->address, bytes);
  }
  p_.default_pool.note_segment(+1);
  p_.ledger.count(&DeviceStats::num_device_alloc);
  p_.ledger.increase(&DeviceStats::segment, kind, 1);
  p_.ledger.increase(&DeviceStats::reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  p_.free.insert(segment->head);
  return segment->head;
}

// Unmapping synchronizes the device (the backend's contract), so the caller does it outside captures,
// for all segments at once (release_free_segments). Only free blocks that no stream can touch
// (settled, in the free lists) give memory back, and only the pieces that lie entirely inside one:
// a piece goes back whole or not at all (never split: docs/design.md, "Expandable segments"), so a
// piece that holds part of a live, pending, hot or held block stays mapped. Settled free neighbours
// always merge, so no piece lies across two free blocks that could both go. A backend error changes
// nothing.
std::size_t ExpandableSegments::trim(Segment* segment) {
  auto unmappable = [](const Block* b) {
    return !b->in_shard && b->state == BlockState::kFree && b->settled && !b->held;
  };
  // Gathered first: unmapping splits and deletes blocks, but only the one it unmaps from.
  std::vector<Block*> candidates;
  for (Block* b = segment->head; b != nullptr; b = b->next) {
    if (unmappable(b)) candidates.push_back(b);
  }
  const SizeClass kind = segment->size_class;
  std::size_t released = 0;
  for (Block* block : candidates) {
    if (block->prev == nullptr && block->next == nullptr) {  // all that is left (every piece): the segment goes
      released += release(segment);
      break;
    }
    const SegmentPieces::Run run = segment->pieces.whole_inside(block->address, block->address + block->size);
    if (run.bytes == 0) continue;
    Block* before = block->prev;
    Block* after = block->next;
    p_.free.remove(block);
    SegmentSource::Remains remains;
    try {
      remains = p_.segments.unmap(segment, block, run);
    } catch (...) {  // a backend error: nothing was unmapped
      p_.free.insert(block);
      throw;
    }
    p_.ledger.count(&DeviceStats::num_device_free);
    p_.ledger.decrease(&DeviceStats::reserved_bytes, kind, static_cast<std::int64_t>(run.bytes));
    if (p_.aids != nullptr) {
      p_.aids->on_segment_pages(TraceAction::kSegmentUnmap, *segment, run.address, run.bytes);
    }
    released += run.bytes;
    if (remains.before != nullptr) p_.free.insert(remains.before);
    if (remains.after != nullptr) p_.free.insert(remains.after);
    if (remains.before == nullptr) {  // the block went: its neighbours may be alone now
      if (before != nullptr) refresh_split(before);
      if (after != nullptr && after != remains.after) refresh_split(after);
    }
  }
  return released;
}

// A segment whose one block is free and settled: its pages are unmapped and its range released.
std::size_t ExpandableSegments::release(Segment* segment) {
  Block* only = segment->head;
  const std::size_t bytes = segment->size;
  const SizeClass kind = segment->size_class;
  MemoryPool* owner = segment->owner;
  const std::uintptr_t at = only->address;
  p_.free.remove(only);
  if (p_.aids != nullptr) {
    p_.aids->on_segment_pages(TraceAction::kSegmentUnmap, *segment, at, bytes);
  }
  try {
    p_.segments.release(segment);
  } catch (...) {  // a backend error: nothing was unmapped
    p_.free.insert(only);
    throw;
  }
  forget(segment);
  owner->note_segment(-1);
  p_.ledger.count(&DeviceStats::num_device_free);
  p_.ledger.decrease(&DeviceStats::segment, kind, 1);
  p_.ledger.decrease(&DeviceStats::reserved_bytes, kind, static_cast<std::int64_t>(bytes));
  return bytes;
}

// A block's neighbour came or went (its segment grew past it, or the block next to it was unmapped
// whole), so it may have been alone in its segment or may be now: its split state changed, and so must
// what depends on it. A block in its stream's shard keeps the flag the fast path reads (written under
// the shard's lock); a free block counts in inactive_split exactly while it is split.
void ExpandableSegments::refresh_split(Block* block) {
  if (block->in_shard) {
    p_.shards.get(block->stream);  // locks its shard for the rest of the call
    block->split_in_shard = block->is_split();
  }
  if (block->state != BlockState::kFree) return;
  if (block->is_split()) {
    p_.ledger.count_inactive_split(block);
  } else {
    p_.ledger.uncount_inactive_split(block);
  }
}

void ExpandableSegments::validate(const Segment* segment, int device) const {
  const std::size_t page = page_bytes_;
  auto broken = [device](const std::string& what) { invariant::broken(device, what); };
  if (!segment->expandable()) {
    if (!segment->pieces.empty()) broken("a fixed segment records mapped pieces");
    return;
  }
  if (page == 0 || segment->owner != &p_.default_pool) broken("an expandable segment outside the default pool");
  if (segment->address % page != 0 || segment->size == 0 || segment->size % page != 0 ||
      segment->address_range % page != 0 || segment->span() > segment->address_range ||
      (segment->head->address - segment->address) % page != 0 || segment->span() % page != 0) {
    broken("an expandable segment's blocks do not cover whole pages of its range");
  }
  // The pieces tile exactly each run of blocks side by side, and nothing else; each is whole pages (one
  // page with expandable_ipc).
  std::vector<SegmentPieces::Run> pieces;
  pieces.reserve(segment->pieces.count());
  segment->pieces.for_each([&](std::uintptr_t address, std::size_t bytes) { pieces.push_back({address, bytes}); });
  const std::string where = "expandable segment " + std::to_string(segment->address);
  std::size_t next = 0;
  for (const Block* b = segment->head; b != nullptr;) {
    const std::uintptr_t start = b->address;
    std::uintptr_t end = b->address + b->size;
    for (b = b->next; b != nullptr && b->address == end; b = b->next) end += b->size;
    for (std::uintptr_t at = start; at != end; at += pieces[next++].bytes) {
      if (next == pieces.size() || pieces[next].address != at || pieces[next].bytes > end - at) {
        broken("the mapped pieces of " + where + " do not tile its blocks at offset " +
               std::to_string(at - segment->address));
      }
      const std::size_t bytes = pieces[next].bytes;
      if (bytes == 0 || bytes % page != 0 || (p_.options.expandable_ipc && bytes != page)) {
        broken("a mapped piece of " + where + " has " + std::to_string(pieces[next].bytes) + " bytes");
      }
    }
  }
  if (next != pieces.size()) broken("a mapped piece of " + where + " lies outside its blocks");
  if (segment->pieces.bytes() != segment->size) broken("the mapped pieces of " + where + " do not sum to its size");
}

}  // namespace streamalloc

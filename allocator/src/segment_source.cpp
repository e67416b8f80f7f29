#include "segment_source.hpp"

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

Segment* SegmentSource::reserve(PoolKind pool, MemoryPool* owner, std::size_t bytes, Stream stream) {
  void* memory = backend_.reserve(device_, bytes);
  if (memory == nullptr) return nullptr;
  auto segment = std::make_unique<Segment>();
  segment->address = reinterpret_cast<std::uintptr_t>(memory);
  segment->size = bytes;
  segment->pool = pool;
  segment->owner = owner;
  segment->stream = stream;
  auto* block = new Block;
  block->address = segment->address;
  block->size = bytes;
  block->segment = segment.get();
  block->state = BlockState::kFree;
  block->settled = true;
  block->stream = stream;
  block->since = Clock::now();
  segment->head = block;
  Segment* out = segment.get();
  segments_.emplace(segment->address, std::move(segment));
  reserved_ += bytes;
  return out;
}

void SegmentSource::release(Segment* segment) {
  backend_.release(device_, reinterpret_cast<void*>(segment->address), segment->size);
  reserved_ -= segment->size;
  delete segment->head;
  segments_.erase(segment->address);
}

const Segment* SegmentSource::containing(std::uintptr_t address) const {
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return nullptr;
  --it;
  return address < it->first + it->second->size ? it->second.get() : nullptr;
}

std::vector<Segment*> SegmentSource::all() const {
  std::vector<Segment*> out;
  out.reserve(segments_.size());
  for (const auto& [address, segment] : segments_) out.push_back(segment.get());
  return out;
}

}  // namespace streamalloc

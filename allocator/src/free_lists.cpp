#include "free_lists.hpp"

#include <algorithm>

namespace streamalloc {

Block* FreeLists::merge(Block* a, Block* b) {
  Block* low = a->address < b->address ? a : b;
  Block* high = low == a ? b : a;
  if (low->settled != high->settled) {
    // The merged block keeps the owned block's state (stream, fence sequence) and settles with it.
    const Block* owner = low->settled ? high : low;
    low->stream = owner->stream;
    low->settle_seq = owner->settle_seq;
    low->settled = false;
    high->settle_seq = owner->settle_seq;
  }
  low->size += high->size;
  low->next = high->next;
  if (low->next) low->next->prev = low;
  // An owned merge settles only when the later of the two batches has been fenced.
  low->settle_seq = std::max(low->settle_seq, high->settle_seq);
  low->since = std::max(low->since, high->since);
  delete high;
  return low;
}

std::size_t FreeLists::owned_count() const {
  std::size_t n = 0;
  for (const FreeIndex& index : owned_) n += index.size();
  return n;
}

std::size_t FreeLists::settled_count() const {
  std::size_t n = 0;
  for (const FreeIndex& index : settled_) n += index.size();
  return n;
}

}  // namespace streamalloc

#include "shard.hpp"

namespace streamalloc {

void SettleList::insert(Block* block) {
  // Blocks almost always join with the newest sequence number, so search from the tail.
  Block* after = tail_;
  while (after != nullptr && after->settle_seq > block->settle_seq) after = after->settle_prev;
  block->settle_prev = after;
  block->settle_next = after ? after->settle_next : head_;
  if (block->settle_next) {
    block->settle_next->settle_prev = block;
  } else {
    tail_ = block;
  }
  if (after) {
    after->settle_next = block;
  } else {
    head_ = block;
  }
  block->in_settle_list = true;
}

void SettleList::remove(Block* block) {
  if (!block->in_settle_list) return;
  if (block->settle_prev) {
    block->settle_prev->settle_next = block->settle_next;
  } else {
    head_ = block->settle_next;
  }
  if (block->settle_next) {
    block->settle_next->settle_prev = block->settle_prev;
  } else {
    tail_ = block->settle_prev;
  }
  block->settle_prev = block->settle_next = nullptr;
  block->in_settle_list = false;
}

}  // namespace streamalloc

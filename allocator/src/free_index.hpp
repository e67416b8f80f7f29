// FreeIndex: free blocks ordered by (key, size, address) for O(log n) best fit within one key.
// The key is the owner stream for unsettled blocks, and one shared key for settled blocks (or the
// owner stream under cross_stream_reuse:never, where settled blocks still stay with their stream).
#pragma once

#include <cstddef>
#include <set>
#include <vector>

#include "block.hpp"

namespace streamalloc {

class FreeIndex {
 public:
  FreeIndex() { spare_.reserve(kSpareNodes); }

  // A free block enters and leaves the index at nearly every split, merge, free and reuse, and each
  // time the set would allocate or free a tree node through the heap, a large part of the device-locked
  // path's work. Nodes taken out are kept (up to kSpareNodes) for the next block.
  void insert(Block* block, Stream key) {
    block->index_key = key;
    if (spare_.empty()) {
      blocks_.insert(block);
      return;
    }
    Blocks::node_type node = std::move(spare_.back());
    spare_.pop_back();
    node.value() = block;
    blocks_.insert(std::move(node));
  }
  void erase(Block* block) {
    Blocks::node_type node = blocks_.extract(block);
    if (!node.empty() && spare_.size() < kSpareNodes) spare_.push_back(std::move(node));
  }

  // The smallest block of `key` with size >= `size`, or nullptr.
  Block* best_fit(Stream key, std::size_t size) const {
    auto it = first_fit(key, size);
    if (it == blocks_.end() || (*it)->index_key != key) return nullptr;
    return *it;
  }

  // Visits the blocks of `key` with size >= `size`, smallest first (then by address), until `visit`
  // returns false.
  template <typename F>
  void for_each_fit(Stream key, std::size_t size, F&& visit) const {
    for (auto it = first_fit(key, size); it != blocks_.end() && (*it)->index_key == key; ++it) {
      if (!visit(*it)) return;
    }
  }

  std::size_t size() const { return blocks_.size(); }
  bool contains(Block* block) const { return blocks_.count(block) != 0; }
  template <typename F>
  void for_each(F&& f) const {
    for (Block* b : blocks_) f(b);
  }

 private:
  struct Order {
    bool operator()(const Block* a, const Block* b) const {
      if (a->index_key != b->index_key) return a->index_key < b->index_key;
      if (a->size != b->size) return a->size < b->size;
      return a->address < b->address;
    }
  };
  using Blocks = std::set<Block*, Order>;
  // Where the blocks of `key` with size >= `size` begin (the next key's blocks, or end, when it has none).
  Blocks::const_iterator first_fit(Stream key, std::size_t size) const {
    Block probe;
    probe.index_key = key;
    probe.size = size;
    probe.address = 0;
    return blocks_.lower_bound(&probe);
  }
  static constexpr std::size_t kSpareNodes = 64;
  Blocks blocks_;
  std::vector<Blocks::node_type> spare_;  // empty tree nodes, reused by insert
};

}  // namespace streamalloc

// CaptureReuse: PyTorch's graph_capture_record_stream_reuse (docs/design.md, "Stream rules", rule 6).
//
// A block freed during a graph capture while other streams used it cannot be fenced then (an event
// recorded on a capturing stream is a node of the graph, not a fence the host can query), so it waits
// for the capture's end. With reuse on, the free instead keeps the graph nodes each of its streams
// had reached (its markers: the frontier of the allocation stream and of every used stream). Work
// captured later on a stream depends on that stream's frontier; once every marker is among the
// frontier's ancestors, all the block's uses come before anything the stream captures from then on,
// and the block is safe for that stream again: the graph's own order is its fence. This reads the
// graph only (no event query), so it is allowed during a capture. As in PyTorch, a block is given back
// only to its allocation stream, when that stream allocates.
//
// Every method runs under the device lock.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "block.hpp"
#include "streamalloc/backend.hpp"

namespace streamalloc {

class CaptureReuse {
 public:
  bool on() const { return on_; }
  void set(bool on) { on_ = on; }
  bool empty() const { return markers_.empty(); }
  bool holds(const Block* block) const { return markers_.count(const_cast<Block*>(block)) != 0; }
  std::size_t size() const { return markers_.size(); }

  // `block` was freed during a capture with the uses of `block->recorded_streams`: its markers are the
  // frontiers of its allocation stream and of each used stream. False (nothing kept) when one of them
  // does not capture or all frontiers are empty: the block waits for the capture's end then.
  bool add(Backend& backend, int device, Block* block) {
    std::set<GraphNode> markers;
    std::uint64_t capture = 0;
    auto reached = [&](Stream stream) {
      CaptureInfo info;
      if (!backend.capture_info(device, stream, &info)) return false;
      if (capture != 0 && info.id != capture) return false;  // streams of different captures
      capture = info.id;
      markers.insert(info.frontier.begin(), info.frontier.end());
      return true;
    };
    if (!reached(block->stream)) return false;
    for (const Stream used : block->recorded_streams) {
      if (!reached(used)) return false;
    }
    if (markers.empty()) return false;
    markers_[block] = Marked{capture, std::vector<GraphNode>(markers.begin(), markers.end())};
    return true;
  }

  // The kept blocks of `stream` whose markers all precede its frontier; they are forgotten. The
  // ancestors found are kept per (capture, stream): a graph only grows, so an ancestor stays one.
  std::vector<Block*> take_reusable(Backend& backend, int device, Stream stream) {
    std::vector<Block*> reusable;
    bool any = false;
    for (const auto& [block, marked] : markers_) any = any || block->stream == stream;
    if (!any) return reusable;
    CaptureInfo info;
    if (!backend.capture_info(device, stream, &info) || info.frontier.empty()) return reusable;
    std::unordered_set<GraphNode>& seen = ancestors_[std::make_pair(info.id, stream)];
    std::vector<GraphNode> stack(info.frontier.begin(), info.frontier.end());
    while (!stack.empty()) {
      const GraphNode node = stack.back();
      stack.pop_back();
      if (!seen.insert(node).second) continue;
      for (const GraphNode parent : backend.graph_node_dependencies(device, node)) stack.push_back(parent);
    }
    for (auto it = markers_.begin(); it != markers_.end();) {
      const Marked& marked = it->second;
      bool before = it->first->stream == stream && marked.capture == info.id;
      for (std::size_t i = 0; before && i < marked.nodes.size(); ++i) before = seen.count(marked.nodes[i]) != 0;
      if (before) {
        reusable.push_back(it->first);
        it = markers_.erase(it);
      } else {
        ++it;
      }
    }
    if (markers_.empty()) ancestors_.clear();
    return reusable;
  }

  template <typename Visit>
  void for_each_block(Visit&& visit) const {
    for (const auto& entry : markers_) visit(static_cast<const Block*>(entry.first));
  }

  // `block` leaves by another way (its capture ended and its uses were dropped).
  void forget(const Block* block) {
    markers_.erase(const_cast<Block*>(block));
    if (markers_.empty()) ancestors_.clear();
  }

 private:
  struct Marked {
    std::uint64_t capture = 0;
    std::vector<GraphNode> nodes;
  };
  struct PairHash {
    std::size_t operator()(const std::pair<std::uint64_t, Stream>& key) const {
      return std::hash<std::uint64_t>()(key.first) ^ (std::hash<Stream>()(key.second) * 31);
    }
  };
  bool on_ = false;
  std::map<Block*, Marked> markers_;
  std::unordered_map<std::pair<std::uint64_t, Stream>, std::unordered_set<GraphNode>, PairHash> ancestors_;
};

}  // namespace streamalloc

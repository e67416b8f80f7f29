#include "streamalloc_planner/torch_model.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>

namespace streamalloc::planner {
namespace {

constexpr std::size_t kMiB = 1024 * 1024;
constexpr std::size_t kMinBlock = 512;    // every size is a multiple of it
constexpr std::size_t kSmallSize = kMiB;  // largest request of the small size class
constexpr std::size_t kSmallBuffer = 2 * kMiB;
constexpr std::size_t kLargeBuffer = 20 * kMiB;
constexpr std::size_t kMinLargeAlloc = 10 * kMiB;
constexpr std::size_t kRoundLarge = 2 * kMiB;
constexpr std::uint64_t kExpandableRange = 1ull << 40;  // address space of one expandable segment

int floor_log2(std::size_t v) { return 63 - __builtin_clzll(v); }
bool is_pow2(std::size_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string trim(std::string_view s) {
  std::size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  std::size_t e = s.find_last_not_of(" \t");
  return std::string(s.substr(b, e - b + 1));
}

std::size_t parse_size(const std::string& key, const std::string& value) {
  try {
    std::size_t used = 0;
    unsigned long long v = std::stoull(value, &used);
    if (used != value.size()) throw std::invalid_argument(value);
    return static_cast<std::size_t>(v);
  } catch (const std::exception&) {
    throw std::invalid_argument("PyTorch option " + key + ": expected a non-negative integer, got '" + value + "'");
  }
}

std::size_t checked_divisions(const std::string& value) {
  std::size_t d = parse_size("roundup_power2_divisions", value);
  if (d != 0 && !is_pow2(d)) {
    throw std::invalid_argument("PyTorch option roundup_power2_divisions: " + value + " is not a power of two");
  }
  return d;
}

}  // namespace

// ------------------------------------------------------------------------------------------ config

TorchConfig TorchConfig::parse(std::string_view conf) {
  TorchConfig config;
  std::string text(conf);
  std::size_t pos = 0;
  while (pos < text.size()) {
    // Items are separated by commas outside brackets.
    std::size_t end = pos;
    int depth = 0;
    while (end < text.size() && !(text[end] == ',' && depth == 0)) {
      if (text[end] == '[') ++depth;
      if (text[end] == ']') --depth;
      ++end;
    }
    std::string item = trim(std::string_view(text).substr(pos, end - pos));
    pos = end + 1;
    if (item.empty()) continue;
    std::size_t colon = item.find(':');
    if (colon == std::string::npos) {
      throw std::invalid_argument("PyTorch option '" + item + "': expected key:value");
    }
    std::string key = trim(std::string_view(item).substr(0, colon));
    std::string value = trim(std::string_view(item).substr(colon + 1));
    if (key == "expandable_segments") {
      if (value == "True" || value == "true" || value == "1") {
        config.expandable_segments = true;
      } else if (value == "False" || value == "false" || value == "0") {
        config.expandable_segments = false;
      } else {
        throw std::invalid_argument("PyTorch option expandable_segments: expected True or False, got '" + value + "'");
      }
    } else if (key == "max_split_size_mb") {
      std::size_t mb = parse_size(key, value);
      // PyTorch raises values below the large segment size to it.
      config.max_split_size = std::max(mb, kLargeBuffer / kMiB) * kMiB;
    } else if (key == "max_non_split_rounding_mb") {
      std::size_t mb = parse_size(key, value);
      if (mb < kLargeBuffer / kMiB) {
        throw std::invalid_argument("PyTorch option max_non_split_rounding_mb: must be >= 20, got " + value);
      }
      config.max_non_split_rounding = mb * kMiB;
    } else if (key == "roundup_power2_divisions") {
      if (!value.empty() && value.front() == '[') {
        if (value.back() != ']') throw std::invalid_argument("PyTorch option roundup_power2_divisions: missing ']'");
        std::string list = value.substr(1, value.size() - 2);
        std::size_t last = 0;
        bool first = true;
        std::size_t p = 0;
        while (p <= list.size()) {
          std::size_t q = list.find(',', p);
          if (q == std::string::npos) q = list.size();
          std::string entry = trim(std::string_view(list).substr(p, q - p));
          p = q + 1;
          if (entry.empty()) continue;
          std::size_t c = entry.find(':');
          if (c == std::string::npos) {
            throw std::invalid_argument("PyTorch option roundup_power2_divisions: expected size_mb:divisions, got '" +
                                        entry + "'");
          }
          std::string size_key = trim(std::string_view(entry).substr(0, c));
          std::size_t divisions = checked_divisions(trim(std::string_view(entry).substr(c + 1)));
          auto& table = config.roundup_power2_divisions;
          if (size_key == ">") {
            std::fill(table.begin() + static_cast<long>(std::min(last + 1, table.size())), table.end(), divisions);
          } else {
            std::size_t mb = parse_size(key, size_key);
            if (mb == 0) throw std::invalid_argument("PyTorch option roundup_power2_divisions: size 0");
            if (!is_pow2(mb)) {
              throw std::invalid_argument("PyTorch option roundup_power2_divisions: size " + size_key +
                                          " is not a power of two");
            }
            std::size_t index = static_cast<std::size_t>(floor_log2(mb));
            if (first) {
              std::fill(table.begin(), table.begin() + static_cast<long>(std::min(index, table.size())), divisions);
              first = false;
            }
            if (index < table.size()) table[index] = divisions;
            last = index;
          }
        }
      } else {
        config.roundup_power2_divisions.fill(checked_divisions(value));
      }
    } else {
      throw std::invalid_argument("PyTorch option '" + key +
                                  "' is not modelled by the planner (modelled: expandable_segments, "
                                  "max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions)");
    }
  }
  return config;
}

std::size_t torch_round_size(std::size_t size, const TorchConfig& config) {
  if (size <= kMinBlock) return kMinBlock;
  int log_size = floor_log2(size);
  std::size_t index = log_size > 20 ? static_cast<std::size_t>(log_size - 20) : 0;
  index = std::min<std::size_t>(index, config.roundup_power2_divisions.size() - 1);
  std::size_t divisions = config.roundup_power2_divisions[index];
  if (divisions > 1 && size > kMinBlock * divisions) {
    if (is_pow2(size)) return size;
    std::size_t floor = std::size_t{1} << log_size;
    std::size_t step = floor >> floor_log2(divisions);
    if (step == 0) return floor << 1;
    std::size_t down = size & ~(step - 1);
    return down == size ? size : down + step;
  }
  return (size + kMinBlock - 1) / kMinBlock * kMinBlock;
}

std::size_t torch_segment_size(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

// ------------------------------------------------------------------------------------------ blocks

struct TorchModel::Block {
  std::uint64_t ptr = 0;
  std::size_t size = 0;
  std::uint32_t stream = 0;
  Pool* pool = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  bool allocated = false;
  bool pending = false;  // freed, waiting for the events of its stream uses
  bool used_elsewhere = false;
  bool mapped = true;
  bool expandable = false;
};

namespace {
struct ByStreamSizeAddress {
  bool operator()(const TorchModel::Block* a, const TorchModel::Block* b) const;
};
}  // namespace

struct TorchModel::Pool {
  bool small = false;
  std::set<Block*, ByStreamSizeAddress> blocks;    // free mapped blocks
  std::set<Block*, ByStreamSizeAddress> unmapped;  // unmapped ranges of expandable segments
};

namespace {
bool ByStreamSizeAddress::operator()(const TorchModel::Block* a, const TorchModel::Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}
}  // namespace

struct TorchModel::Params {
  std::uint32_t stream = 0;
  std::size_t size = 0;        // rounded request
  std::size_t alloc_size = 0;  // segment size without expandable segments
  Pool* pool = nullptr;
  Block* block = nullptr;
};

TorchModel::TorchModel(TorchConfig config, std::size_t cap, bool keep_segment_events)
    : config_(config), cap_(cap), keep_events_(keep_segment_events), small_(new Pool), large_(new Pool) {
  small_->small = true;
}

TorchModel::~TorchModel() {
  for (Block* b : all_) delete b;
  delete small_;
  delete large_;
}

TorchModel::Block* TorchModel::make_block(const Block& from) {
  Block* b = new Block(from);
  all_.insert(b);
  return b;
}

void TorchModel::drop(Block* b) {
  all_.erase(b);
  delete b;
}

void TorchModel::note(char action, std::size_t size, std::uint32_t stream) {
  if (keep_events_) segment_events_.push_back(SegmentEvent{event_index_, action, size, stream});
}

void TorchModel::grow_reserved(std::size_t bytes) {
  reserved_ += bytes;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++device_allocs_;
}

std::pair<std::uint64_t, std::size_t> TorchModel::block_of(std::uint32_t slot) const {
  if (slot >= slots_.size() || slots_[slot] == nullptr) return {0, 0};
  return {slots_[slot]->ptr, slots_[slot]->size};
}

std::size_t TorchModel::free_blocks(bool small) const { return (small ? small_ : large_)->blocks.size(); }

// ------------------------------------------------------------------------------------------ malloc

bool TorchModel::malloc(std::uint32_t slot, std::size_t size, std::uint32_t stream, bool complete_pending) {
  // PyTorch processes the events of pending blocks at every malloc; without recorded completion
  // points the replay takes them all as complete by then.
  if (complete_pending) complete_all_pending();
  Params p;
  p.stream = stream;
  p.size = torch_round_size(size, config_);
  p.pool = p.size <= kSmallSize ? small_ : large_;
  p.alloc_size = torch_segment_size(p.size);
  bool found = get_free_block(p) || alloc_block(p);
  if (!found) ++alloc_retries_;
  found = found || (release_available_cached_blocks(p) && alloc_block(p));
  if (!found) {
    release_cached_blocks();
    found = alloc_block(p);
  }
  if (!found) return false;

  Block* block = p.block;
  std::size_t remaining = block->size - p.size;
  bool split = block->pool->small || config_.expandable_segments
                   ? remaining >= kMinBlock
                   : (p.size < config_.max_split_size && remaining > kSmallSize);
  if (split) {
    Block* rest = make_block(*block);
    rest->ptr = block->ptr + p.size;
    rest->size = remaining;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = p.size;
    block->pool->blocks.insert(rest);
  }
  block->allocated = true;
  block->used_elsewhere = false;
  allocated_ += block->size;
  peak_allocated_ = std::max(peak_allocated_, allocated_);
  if (slot >= slots_.size()) slots_.resize(slot + 1, nullptr);
  slots_[slot] = block;
  return true;
}

bool TorchModel::get_free_block(Params& p) {
  Pool& pool = *p.pool;
  Block key;
  key.stream = p.stream;
  key.size = p.size;
  key.ptr = 0;
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
  if ((*it)->expandable && config_.expandable_segments) {
    // A block followed by unmapped address space counts with that space for the best fit.
    auto reach = [](const Block* b) { return b->size + (b->next && !b->next->mapped ? b->next->size : 0); };
    auto next = std::next(it);
    while ((*it)->expandable && next != pool.blocks.end() && (*next)->stream == p.stream && reach(*next) < reach(*it)) {
      it = next++;
    }
  }
  if (p.size < config_.max_split_size && (*it)->size >= config_.max_split_size) return false;
  if (p.size >= config_.max_split_size && (*it)->size >= p.size + config_.max_non_split_rounding) return false;
  p.block = *it;
  pool.blocks.erase(it);
  return true;
}

bool TorchModel::alloc_block(Params& p) {
  if (config_.expandable_segments) {
    p.block = try_allocate_expandable(p);
    return p.block != nullptr;
  }
  if (cap_ != 0 && reserved_ + p.alloc_size > cap_) return false;
  Block* block = make_block(Block{});
  block->ptr = place_segment(p.alloc_size);
  block->size = p.alloc_size;
  block->stream = p.stream;
  block->pool = p.pool;
  grow_reserved(p.alloc_size);
  note('a', p.alloc_size, p.stream);
  p.block = block;
  return true;
}

void TorchModel::follow_placements(std::vector<Placement> placements) {
  placements_ = std::move(placements);
  placement_taken_.assign(placements_.size(), false);
  first_open_placement_ = 0;
}

std::uint64_t TorchModel::place_segment(std::size_t size) {
  auto range_is_free = [&](std::uint64_t base) {
    auto after = segments_.lower_bound(base + size);
    return after == segments_.begin() || std::prev(after)->first + std::prev(after)->second <= base;
  };
  std::uint64_t base = 0;
  for (std::size_t i = first_open_placement_; i < placements_.size(); ++i) {
    const Placement& place = placements_[i];
    if (placement_taken_[i] || place.size != size || !range_is_free(place.address)) continue;
    placement_taken_[i] = true;
    base = place.address;
    break;
  }
  while (first_open_placement_ < placements_.size() && placement_taken_[first_open_placement_]) {
    ++first_open_placement_;
  }
  if (base == 0) {
    base = next_address_;
    next_address_ += (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
  }
  segments_.emplace(base, size);
  return base;
}

// ------------------------------------------------------------------------------------------ expandable

TorchModel::Block* TorchModel::find_expandable_block(Params& p) {
  Pool& pool = *p.pool;
  auto allocatable = [](const Block* b) { return b && !b->allocated && !b->pending; };
  auto has_room = [&](const Block* b) {
    std::size_t bytes = 0;
    while (bytes < p.size && allocatable(b)) {
      bytes += b->size;
      b = b->next;
    }
    return bytes >= p.size;
  };
  Block key;
  key.stream = p.stream;
  key.size = 0;
  key.ptr = 0;
  for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == p.stream; ++it) {
    Block* c = *it;
    if (allocatable(c->prev)) c = c->prev;
    if (has_room(c)) return c;
  }
  Block* range = make_block(Block{});
  range->ptr = next_address_;
  range->size = kExpandableRange;
  range->stream = p.stream;
  range->pool = p.pool;
  range->mapped = false;
  range->expandable = true;
  next_address_ += kExpandableRange;
  pool.unmapped.insert(range);
  return range;
}

bool TorchModel::map_block(Block* block, std::size_t size) {
  std::size_t page = block->pool->small ? kSmallBuffer : kLargeBuffer;
  std::size_t bytes = std::min(block->size, (size + page - 1) / page * page);
  if (cap_ != 0 && reserved_ + bytes > cap_) return false;
  Pool& pool = *block->pool;
  pool.unmapped.erase(block);
  block->mapped = true;
  if (bytes < block->size) {
    Block* rest = make_block(*block);
    rest->ptr = block->ptr + bytes;
    rest->size = block->size - bytes;
    rest->mapped = false;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = bytes;
    pool.unmapped.insert(rest);
  }
  try_merge(block, block->prev);
  try_merge(block, block->next);
  pool.blocks.insert(block);
  grow_reserved(bytes);
  note('m', bytes, block->stream);
  return true;
}

TorchModel::Block* TorchModel::try_allocate_expandable(Params& p) {
  Block* candidate = find_expandable_block(p);
  if (!candidate->mapped && !map_block(candidate, std::min(candidate->size, p.size))) return nullptr;
  while (candidate->size < p.size) {
    // A free mapped block followed by unmapped space: map more of it, which merges into one block.
    Block* next = candidate->next;
    if (!map_block(next, std::min(p.size - candidate->size, next->size))) return nullptr;
    candidate = next;
  }
  p.pool->blocks.erase(candidate);
  return candidate;
}

void TorchModel::unmap_block(Block* block) {
  std::size_t page = block->pool->small ? kSmallBuffer : kLargeBuffer;
  std::uint64_t begin = (block->ptr + page - 1) / page * page;
  std::uint64_t end = (block->ptr + block->size) / page * page;
  if (begin >= end) return;
  Pool& pool = *block->pool;
  pool.blocks.erase(block);
  if (begin > block->ptr) {
    Block* before = make_block(*block);
    before->size = begin - block->ptr;
    before->next = block;
    if (before->prev) before->prev->next = before;
    block->prev = before;
    block->ptr = begin;
    block->size -= before->size;
    pool.blocks.insert(before);
  }
  if (end < block->ptr + block->size) {
    Block* after = make_block(*block);
    after->ptr = end;
    after->size = block->ptr + block->size - end;
    after->prev = block;
    if (after->next) after->next->prev = after;
    block->next = after;
    block->size = end - block->ptr;
    pool.blocks.insert(after);
  }
  block->mapped = false;
  reserved_ -= block->size;
  ++device_frees_;
  note('u', block->size, block->stream);
  try_merge(block, block->prev);
  try_merge(block, block->next);
  pool.unmapped.insert(block);
}

// ------------------------------------------------------------------------------------------ release

void TorchModel::release_block(Block* block) {
  block->pool->blocks.erase(block);
  segments_.erase(block->ptr);
  reserved_ -= block->size;
  ++device_frees_;
  note('f', block->size, block->stream);
  drop(block);
}

bool TorchModel::release_available_cached_blocks(Params& p) {
  if (config_.max_split_size == TorchConfig::kUnlimited) return false;
  Pool& pool = *p.pool;
  Block key;
  key.stream = p.stream;
  key.size = std::max(p.size, config_.max_split_size);
  key.ptr = 0;
  auto whole = [](const Block* b) { return !b->expandable && !b->prev && !b->next; };
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream != p.stream || (*it)->expandable) {
    // No single oversize block is large enough: release the largest ones of the stream until enough.
    if (it == pool.blocks.begin()) return false;
    std::size_t released = 0;
    --it;
    while (released < key.size && (*it)->size >= config_.max_split_size && (*it)->stream == p.stream) {
      auto current = it;
      bool first = current == pool.blocks.begin();
      if (!first) --it;
      if (whole(*current)) {
        released += (*current)->size;
        release_block(*current);
      }
      if (first) break;
    }
    return released >= key.size;
  }
  if (!whole(*it)) return false;
  release_block(*it);
  return true;
}

void TorchModel::release_blocks(Pool& pool) {
  std::vector<Block*> to_unmap;
  std::vector<Block*> to_release;
  for (Block* b : pool.blocks) {
    if (b->expandable) {
      to_unmap.push_back(b);
    } else if (!b->prev && !b->next) {
      to_release.push_back(b);
    }
  }
  for (Block* b : to_release) release_block(b);
  for (Block* b : to_unmap) {
    unmap_block(b);
    // unmap_block may have merged b away into a neighbour; whole unmapped segments are dropped below.
  }
  std::vector<Block*> empty_ranges;
  for (Block* b : pool.unmapped) {
    if (!b->prev && !b->next) empty_ranges.push_back(b);
  }
  for (Block* b : empty_ranges) {
    pool.unmapped.erase(b);
    drop(b);
  }
}

void TorchModel::release_cached_blocks() {
  complete_all_pending();
  release_blocks(*large_);
  release_blocks(*small_);
}

// ------------------------------------------------------------------------------------------ free

void TorchModel::record_stream(std::uint32_t slot, std::uint32_t stream) {
  if (slot >= slots_.size() || slots_[slot] == nullptr) return;
  if (slots_[slot]->stream != stream) slots_[slot]->used_elsewhere = true;
}

void TorchModel::free(std::uint32_t slot) {
  if (slot >= slots_.size() || slots_[slot] == nullptr) return;  // its allocation failed under the cap
  Block* block = slots_[slot];
  slots_[slot] = nullptr;
  block->allocated = false;
  allocated_ -= block->size;
  if (block->used_elsewhere) {
    block->pending = true;
    pending_.push_back(block);
    pending_slot_.push_back(slot);
  } else {
    free_block(block);
  }
}

void TorchModel::complete(std::uint32_t slot) {
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (pending_slot_[i] != slot) continue;
    Block* block = pending_[i];
    pending_.erase(pending_.begin() + static_cast<long>(i));
    pending_slot_.erase(pending_slot_.begin() + static_cast<long>(i));
    block->pending = false;
    block->used_elsewhere = false;
    free_block(block);
    return;
  }
}

void TorchModel::complete_all_pending() {
  if (pending_.empty()) return;
  std::vector<Block*> done;
  done.swap(pending_);
  pending_slot_.clear();
  for (Block* block : done) {
    block->pending = false;
    block->used_elsewhere = false;
    free_block(block);
  }
}

std::size_t TorchModel::try_merge(Block* dst, Block* src) {
  if (!src || src->allocated || src->pending || src->mapped != dst->mapped) return 0;
  Pool& pool = *src->pool;
  if (src->mapped) {
    pool.blocks.erase(src);
  } else {
    pool.unmapped.erase(src);
  }
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  std::size_t size = src->size;
  dst->size += size;
  drop(src);
  return size;
}

void TorchModel::free_block(Block* block) {
  try_merge(block, block->prev);
  try_merge(block, block->next);
  block->pool->blocks.insert(block);
}

}  // namespace streamalloc::planner

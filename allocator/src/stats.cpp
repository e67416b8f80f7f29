// Serialization of DeviceStats. Field names come only from the X-macro lists in stats.hpp, so the
// struct, the flat torch.cuda.memory_stats() keys and the JSON can never disagree.
#include "streamalloc/stats.hpp"

#include <cstddef>

#include <nlohmann/json.hpp>

namespace streamalloc {
namespace {

// PyTorch's StatType order: kAggregate, kSmall, kLarge.
constexpr const char* kPoolNames[kSizeClasses] = {"all", "small_pool", "large_pool"};

void add_stat(std::map<std::string, std::int64_t>& out, const std::string& prefix, const Stat& stat) {
  out[prefix + ".current"] = stat.current;
  out[prefix + ".peak"] = stat.peak;
  out[prefix + ".allocated"] = stat.allocated;
  out[prefix + ".freed"] = stat.freed;
}

void add_pool_stat(std::map<std::string, std::int64_t>& out, const char* name, const StatArray& stats) {
  for (int pool = 0; pool < kSizeClasses; ++pool) {
    add_stat(out, std::string(name) + "." + kPoolNames[pool], stats[static_cast<std::size_t>(pool)]);
  }
}

nlohmann::json stat_json(const Stat& stat) {
  return {{"current", stat.current}, {"peak", stat.peak}, {"allocated", stat.allocated}, {"freed", stat.freed}};
}

}  // namespace

std::map<std::string, std::int64_t> DeviceStats::flat() const {
  std::map<std::string, std::int64_t> out;
#define STREAMALLOC_FLATTEN_POOL_STAT(name, kind, help) add_pool_stat(out, #name, name);
  STREAMALLOC_POOL_STATS(STREAMALLOC_FLATTEN_POOL_STAT)
#undef STREAMALLOC_FLATTEN_POOL_STAT
#define STREAMALLOC_FLATTEN_COUNT(name, help) out[#name] = name;
  STREAMALLOC_EVENT_COUNTS(STREAMALLOC_FLATTEN_COUNT)
#undef STREAMALLOC_FLATTEN_COUNT
  for (const auto& [name, stat] : {std::pair<const char*, const Stat&>{"oversize_allocations", oversize_allocations},
                                   std::pair<const char*, const Stat&>{"oversize_segments", oversize_segments}}) {
    const std::string prefix = std::string(name) + ".";
    out[prefix + "current"] = stat.current;
    out[prefix + "peak"] = stat.peak;
    out[prefix + "allocated"] = stat.allocated;
    out[prefix + "freed"] = stat.freed;
  }
  out["max_split_size"] = max_split_size;
  return out;
}

std::string DeviceStats::to_json(const std::vector<PoolInfo>& pools) const {
  nlohmann::json stream_stats = nlohmann::json::object();
#define STREAMALLOC_JSON_COUNT(name, help) stream_stats[#name] = name;
  STREAMALLOC_STREAM_COUNTS(STREAMALLOC_JSON_COUNT)
#undef STREAMALLOC_JSON_COUNT
  stream_stats["pending_blocks"] = stat_json(pending_blocks);
  stream_stats["pending_bytes"] = stat_json(pending_bytes);

  nlohmann::json histogram = nlohmann::json::array();
  for (std::size_t i = 0; i < kLatencyBucketUs.size(); ++i) {
    const bool last = i + 1 == kLatencyBucketUs.size();  // open-ended: "the rest"
    histogram.push_back({{"below_us", last ? nlohmann::json(nullptr) : nlohmann::json(kLatencyBucketUs[i])},
                         {"count", free_to_reusable_us[i]}});
  }
  stream_stats["free_to_reusable_us"] = std::move(histogram);

  // One entry per stream: its pending stats (where it had any) and its path counts.
  std::map<Stream, nlohmann::json> by_stream;
  for (const auto& [stream, pending] : per_stream) {
    nlohmann::json& entry = by_stream[stream];
    entry["pending_blocks"] = stat_json(pending.pending_blocks);
    entry["pending_bytes"] = stat_json(pending.pending_bytes);
  }
  for (const auto& [stream, counts] : per_stream_counts) {
    nlohmann::json& entry = by_stream[stream];
#define STREAMALLOC_JSON_SHARD_COUNT(name, help) entry[#name] = counts.name;
    STREAMALLOC_SHARD_COUNTS(STREAMALLOC_JSON_SHARD_COUNT)
#undef STREAMALLOC_JSON_SHARD_COUNT
  }
  nlohmann::json streams = nlohmann::json::array();
  for (auto& [stream, entry] : by_stream) {
    entry["stream"] = stream;
    if (!entry.contains("pending_blocks")) entry["pending_blocks"] = entry["pending_bytes"] = stat_json(Stat{});
    streams.push_back(std::move(entry));
  }
  stream_stats["per_stream"] = std::move(streams);

  nlohmann::json root = nlohmann::json::object();
  root["memory_stats"] = flat();
  root["stream_stats"] = std::move(stream_stats);
  nlohmann::json pool_list = nlohmann::json::array();
  for (const PoolInfo& pool : pools) {
    pool_list.push_back({{"id", {pool.id.first, pool.id.second}},
                         {"use_count", pool.use_count},
                         {"routed", pool.routed},
                         {"use_on_oom", pool.use_on_oom},
                         {"no_split", pool.no_split},
                         {"segments", pool.segments},
                         {"reserved_bytes", pool.reserved_bytes},
                         {"allocated_bytes", pool.allocated_bytes},
                         {"active_bytes", pool.active_bytes},
                         {"live_blocks", pool.live_blocks}});
  }
  root["pools"] = std::move(pool_list);
  return root.dump();
}

std::string PendingHistory::to_json(int device) const {
  nlohmann::json time_us = nlohmann::json::array(), stream = nlohmann::json::array(), bytes = nlohmann::json::array(),
                 blocks = nlohmann::json::array();
  for (const PendingSample& s : samples) {
    time_us.push_back(s.time_us);
    stream.push_back(s.stream);
    bytes.push_back(s.pending_bytes);
    blocks.push_back(s.pending_blocks);
  }
  return nlohmann::json{{"device", device},
                        {"capacity", capacity},
                        {"recorded", recorded},
                        {"time_us", std::move(time_us)},
                        {"stream", std::move(stream)},
                        {"pending_bytes", std::move(bytes)},
                        {"pending_blocks", std::move(blocks)}}
      .dump();
}

}  // namespace streamalloc

// streamalloc as a peer, twice: the C++ Allocator (one fresh instance per opened peer) and the C ABI
// (the process-wide allocator of libstreamalloc.so, exactly what PyTorch's CUDAPluggableAllocator calls).
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "peer_kinds.hpp"
#include "streamalloc/allocator.hpp"
#include "streamalloc/sim_backend.hpp"
#include "streamalloc/streamalloc.h"

namespace streamalloc::bench {
namespace {

std::string with_backend(const std::string& conf, bool cuda) {
  std::string out = conf;
  if (!out.empty()) out += ",";
  return out + (cuda ? "backend:cuda" : "backend:sim");
}

void synchronize_cuda_device() {
#ifdef STREAMALLOC_BENCH_CUDA
  cuda_synchronize_device();
#else
  throw std::logic_error("streamalloc peer: CUDA synchronize requested in a build without CUDA");
#endif
}

Stream cuda_stream(int k) {
#ifdef STREAMALLOC_BENCH_CUDA
  return cuda_pool_stream(k);
#else
  (void)k;
  throw std::logic_error("streamalloc peer: CUDA stream requested in a build without CUDA");
#endif
}

// The option both PyTorch and streamalloc call expandable_segments.
constexpr const char* kExpandableOption = "expandable_segments";

bool streamalloc_has_option(const std::string& key) {
  for (const auto& [name, help] : Options::keys()) {
    if (name == key) return true;
  }
  return false;
}

class StreamallocPeer final : public Peer {
 public:
  // `overrides` ("key:value,...") wins over the same keys in `conf`.
  StreamallocPeer(bool cuda, const std::string& conf, const std::string& overrides = "") : cuda_(cuda) {
    Options options = Options::parse(with_backend(conf, cuda));
    if (!overrides.empty()) options.update(overrides, "the peer's own options");
    backend_ = make_backend(options);
    sim_ = std::dynamic_pointer_cast<SimBackend>(backend_);
    allocator_ = std::make_unique<Allocator>(options, backend_);
  }

  ~StreamallocPeer() override {
    // Stream-ordered work must be done before the backend goes away with the allocator.
    try {
      synchronize();
    } catch (...) {
    }
  }

  void* alloc(std::size_t size, Stream stream) override { return allocator_->allocate(size, 0, stream); }
  void free(void* ptr, std::size_t size, Stream stream) override { allocator_->deallocate(ptr, size, 0, stream); }
  void record_stream(void* ptr, Stream stream) override { allocator_->record_stream(ptr, stream); }

  Stream stream(int k) override {
    if (cuda_) return cuda_stream(k);
    while (static_cast<int>(sim_streams_.size()) <= k) sim_streams_.push_back(sim_->create_stream(0));
    return sim_streams_[static_cast<std::size_t>(k)];
  }

  void synchronize() override {
    if (cuda_) {
      synchronize_cuda_device();
    } else {
      sim_->synchronize_all();
    }
  }

  void reset_memory() override {
    synchronize();
    allocator_->synchronize_fences();
    allocator_->empty_cache();
    allocator_->reset_peak_stats(0);
  }

  MemoryPeaks peaks() override {
    const DeviceStats stats = allocator_->stats(0);
    const auto all = static_cast<std::size_t>(PoolKind::kAggregate);
    return {stats.reserved_bytes[all].peak, stats.allocated_bytes[all].peak};
  }

  std::optional<FenceCounts> fence_counts() override {
    const DeviceStats stats = allocator_->stats(0);
    return FenceCounts{stats.fences_recorded, stats.fences_polled};
  }

  std::optional<PathCounts> path_counts() override {
    const DeviceStats s = allocator_->stats(0);
    return PathCounts{
        s.allocations_cached,       s.allocations_device_locked, s.frees_cached,        s.frees_device_locked,
        s.device_lock_acquisitions, s.device_lock_wait_ns,       s.device_lock_held_ns, s.headroom_gathers,
        s.hot_list_flushes,         s.fences_recorded,           s.fences_polled};
  }

 private:
  bool cuda_;
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<SimBackend> sim_;  // null on CUDA
  std::unique_ptr<Allocator> allocator_;
  std::vector<Stream> sim_streams_;
};

// The C ABI keeps one allocator per process; each opened peer is a view of it that empties its cache
// when closed, so benchmarks start from the same state. The hot path checks no error codes (PyTorch
// does not either): synchronize() fails the benchmark when the allocator counted a rejected free.
class CabiPeer final : public Peer {
 public:
  CabiPeer(bool cuda, const std::string& conf) : cuda_(cuda) {
    const std::string full = with_backend(conf, cuda);
    if (streamalloc_configure(full.c_str()) != 0) {
      throw std::runtime_error(std::string("streamalloc_configure(\"") + full + "\"): " + streamalloc_last_error());
    }
    streamalloc_init(1);
    if (streamalloc_last_error_code() != 0) {
      throw std::runtime_error(std::string("streamalloc_init(1): ") + streamalloc_last_error());
    }
    invalid_frees_at_open_ = stats()["stream_stats"]["invalid_frees"].get<std::int64_t>();
  }

  ~CabiPeer() override {
    try {
      reset_memory();
    } catch (...) {
    }
  }

  void* alloc(std::size_t size, Stream stream) override {
    void* ptr = streamalloc_malloc(size, 0, handle(stream));
    if (ptr == nullptr && size != 0) {
      throw std::runtime_error(std::string("streamalloc_malloc: ") + streamalloc_last_error());
    }
    return ptr;
  }
  void free(void* ptr, std::size_t size, Stream stream) override { streamalloc_free(ptr, size, 0, handle(stream)); }
  void record_stream(void* ptr, Stream stream) override { streamalloc_record_stream(ptr, handle(stream)); }

  Stream stream(int k) override {
    // On the simulated device any non-zero value is a stream: the C ABI's SimBackend adopts it on first use.
    return cuda_ ? cuda_stream(k) : static_cast<Stream>(k + 1);
  }

  void synchronize() override {
    if (cuda_) synchronize_cuda_device();
    const auto invalid = stats()["stream_stats"]["invalid_frees"].get<std::int64_t>();
    if (invalid != invalid_frees_at_open_) {
      throw std::runtime_error("streamalloc C ABI rejected " + std::to_string(invalid - invalid_frees_at_open_) +
                               " free call(s) during the benchmark (each is logged on stderr with its reason)");
    }
  }

  void reset_memory() override {
    synchronize();
    streamalloc_empty_cache();
    streamalloc_reset_peak_stats(0);
  }

  MemoryPeaks peaks() override {
    const nlohmann::json memory = stats()["memory_stats"];
    return {memory["reserved_bytes.all.peak"].get<std::int64_t>(),
            memory["allocated_bytes.all.peak"].get<std::int64_t>()};
  }

  std::optional<FenceCounts> fence_counts() override {
    const nlohmann::json counts = stats()["stream_stats"];
    return FenceCounts{counts["fences_recorded"].get<std::int64_t>(), counts["fences_polled"].get<std::int64_t>()};
  }

  std::optional<PathCounts> path_counts() override {
    const nlohmann::json c = stats()["stream_stats"];
    auto n = [&](const char* key) { return c[key].get<std::int64_t>(); };
    return PathCounts{n("allocations_cached"),
                      n("allocations_device_locked"),
                      n("frees_cached"),
                      n("frees_device_locked"),
                      n("device_lock_acquisitions"),
                      n("device_lock_wait_ns"),
                      n("device_lock_held_ns"),
                      n("headroom_gathers"),
                      n("hot_list_flushes"),
                      n("fences_recorded"),
                      n("fences_polled")};
  }

 private:
  static streamalloc_stream_t handle(Stream stream) { return reinterpret_cast<streamalloc_stream_t>(stream); }

  static nlohmann::json stats() {
    char* text = streamalloc_stats_json(0);
    if (text == nullptr) throw std::runtime_error(std::string("streamalloc_stats_json: ") + streamalloc_last_error());
    nlohmann::json parsed = nlohmann::json::parse(text);
    streamalloc_free_string(text);
    return parsed;
  }

  bool cuda_;
  std::int64_t invalid_frees_at_open_ = 0;
};

}  // namespace

PeerKind streamalloc_peer_kind(bool cuda, const std::string& conf) {
  return {"streamalloc", cuda ? "cuda" : "sim", [cuda, conf] { return std::make_unique<StreamallocPeer>(cuda, conf); }};
}

PeerKind streamalloc_expandable_peer_kind(bool cuda, const std::string& conf) {
  PeerKind kind{"streamalloc_expandable", cuda ? "cuda" : "sim", {}};
  if (!streamalloc_has_option(kExpandableOption)) {
    kind.not_run = "option not available in this build (streamalloc has no expandable_segments option)";
    return kind;
  }
  const std::string overrides = std::string(kExpandableOption) + ":true";
  kind.open = [cuda, conf, overrides] { return std::make_unique<StreamallocPeer>(cuda, conf, overrides); };
  return kind;
}

PeerKind streamalloc_cabi_peer_kind(bool cuda, const std::string& conf) {
  return {"streamalloc_cabi", cuda ? "cuda" : "sim", [cuda, conf] { return std::make_unique<CabiPeer>(cuda, conf); }};
}

}  // namespace streamalloc::bench

// threads_varied and threads_server: 1..16 host threads, each with its own stream, all on one shared
// allocator, with request sizes that vary, so that, unlike `threads`, a thread rarely asks for the size
// it freed last: the case of a server whose requests vary in size. Each thread draws its sizes from its
// own seeded generator, so every peer sees the same sequences. One item = one alloc+free pair;
// items_per_second is the aggregate over the threads (real time).
//
//  - threads_varied: each thread keeps kLive blocks live and replaces the oldest with a new one of a
//    size drawn from a real trace's size distribution (trace_sizes.hpp, from ResNet-50's allocations:
//    many sizes, mostly small, some above 1 MiB).
//  - threads_server: the tensors of an inference server's request (a three-layer MLP, 512 -> 2048 ->
//    2048 -> 512 features, as the small_mlp model of streamalloc_inference_server) for a batch of b rows,
//    b uniform in 1..64: an input of b * 2 KiB, four activations of b * 8 KiB and an output of b * 2 KiB,
//    two to four live at once, each freed as the layer after it has run.
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "scenario.hpp"
#include "trace_sizes.hpp"

namespace streamalloc::bench {
namespace {

constexpr int kMaxThreads = 16;
constexpr std::size_t kLive = 8;         // live blocks per thread
constexpr std::size_t kSequence = 4096;  // sizes drawn per thread, replayed in a cycle
constexpr std::uint64_t kSeed = 20261204;

// Thread `t`'s sizes: kSequence draws from the trace's distribution.
std::vector<std::size_t> size_sequence(int t) {
  std::vector<double> weights;
  for (const SizeWeight& w : kResnet50Sizes) weights.push_back(static_cast<double>(w.weight));
  std::discrete_distribution<std::size_t> pick(weights.begin(), weights.end());
  std::mt19937_64 rng(kSeed + static_cast<std::uint64_t>(t));
  std::vector<std::size_t> sizes(kSequence);
  for (std::size_t& s : sizes) s = kResnet50Sizes[pick(rng)].size;
  return sizes;
}

// threads_varied's thread: kLive slots, the oldest replaced by each step.
class ReplaceOldest {
 public:
  static constexpr const char* kName = "threads_varied";
  explicit ReplaceOldest(int t) : sizes_(size_sequence(t)) {}
  void fill(Peer& peer, Stream stream) {
    for (std::size_t k = 0; k < kLive; ++k) {
      live_size_[k] = sizes_[next_++];
      live_[k] = peer.alloc(live_size_[k], stream);
    }
  }
  // One alloc+free pair.
  std::int64_t step(Peer& peer, Stream stream) {
    const std::size_t slot = next_ % kLive;
    peer.free(live_[slot], live_size_[slot], stream);
    live_[slot] = nullptr;
    live_size_[slot] = sizes_[next_++ % kSequence];
    live_[slot] = peer.alloc(live_size_[slot], stream);
    benchmark::DoNotOptimize(live_[slot]);
    return 1;
  }
  void drain(Peer& peer, Stream stream) {
    for (std::size_t k = 0; k < kLive; ++k) {
      if (live_[k] != nullptr) peer.free(live_[k], live_size_[k], stream);
      live_[k] = nullptr;
    }
  }

 private:
  std::vector<std::size_t> sizes_;
  std::array<void*, kLive> live_{};
  std::array<std::size_t, kLive> live_size_{};
  std::size_t next_ = 0;  // into sizes_; the slot replaced is next_ % kLive
};

// threads_server's thread: one request per step, its batch size drawn from a cycle of kSequence draws.
class ServerRequests {
 public:
  static constexpr const char* kName = "threads_server";
  explicit ServerRequests(int t) : batches_(kSequence) {
    std::mt19937_64 rng(kSeed + static_cast<std::uint64_t>(t));
    std::uniform_int_distribution<std::size_t> batch(1, 64);
    for (std::size_t& b : batches_) b = batch(rng);
  }
  void fill(Peer&, Stream) {}
  // One request: six alloc+free pairs.
  std::int64_t step(Peer& peer, Stream stream) {
    const std::size_t b = batches_[next_++ % kSequence];
    const std::size_t narrow = b * 512 * 4, wide = b * 2048 * 4;  // float rows of 512 and 2048 features
    Held input = hold(peer, narrow, stream);
    Held layer1 = hold(peer, wide, stream);  // 512 -> 2048
    Held relu = hold(peer, wide, stream);
    release(peer, layer1, stream);
    Held layer2 = hold(peer, wide, stream);  // 2048 -> 2048
    release(peer, relu, stream);
    Held gelu = hold(peer, wide, stream);
    release(peer, layer2, stream);
    Held output = hold(peer, narrow, stream);  // 2048 -> 512
    release(peer, gelu, stream);
    release(peer, input, stream);
    release(peer, output, stream);  // after its copy to the host
    return 6;
  }
  void drain(Peer&, Stream) {}

 private:
  struct Held {
    void* ptr;
    std::size_t size;
  };
  static Held hold(Peer& peer, std::size_t size, Stream stream) {
    Held h{peer.alloc(size, stream), size};
    benchmark::DoNotOptimize(h.ptr);
    return h;
  }
  static void release(Peer& peer, const Held& h, Stream stream) { peer.free(h.ptr, h.size, stream); }

  std::vector<std::size_t> batches_;
  std::size_t next_ = 0;
};

// What thread 0 sets up for all threads of one benchmark run. Google Benchmark starts and ends the
// timed loop of every thread at a barrier; after it, each thread frees its live blocks and says so in
// `finished`, and thread 0 waits for all before it closes the peer.
struct Shared {
  std::unique_ptr<Peer> peer;
  std::vector<Stream> streams;
  std::optional<PathCounts> before;
  std::atomic<int> finished{0};
  std::string error;
};

template <typename Workload>
void run_threads(benchmark::State& state, const PeerKind& kind, Shared& shared) {
  const int t = state.thread_index();
  if (t == 0) {
    state.SetLabel(kind.device);
    try {
      shared.peer = kind.open();
      shared.streams.clear();
      for (int k = 0; k < state.threads(); ++k) shared.streams.push_back(shared.peer->stream(k));
      shared.before = shared.peer->path_counts();
    } catch (const std::exception& e) {
      shared.peer.reset();
      shared.error = e.what();
    }
  }
  Workload work(t);
  std::int64_t items = 0;
  Stream stream = 0;
  // A failing thread reports the error and idles through its remaining iterations instead of leaving
  // the loop early: leaving would skip the end barrier the other threads wait at.
  bool failed = false;
  for (auto _ : state) {
    if (failed) continue;
    if (shared.peer == nullptr) {
      state.SkipWithError(shared.error.c_str());
      failed = true;
      continue;
    }
    try {
      if (stream == 0) {  // the first iteration fills the slots (after the start barrier: the peer is open)
        stream = shared.streams[static_cast<std::size_t>(t)];
        work.fill(*shared.peer, stream);
      }
      items += work.step(*shared.peer, stream);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      failed = true;
    }
  }
  state.SetItemsProcessed(items);
  if (shared.peer != nullptr && stream != 0) {
    try {
      work.drain(*shared.peer, stream);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  }
  shared.finished.fetch_add(1);
  if (t != 0) return;
  while (shared.finished.load() < state.threads()) std::this_thread::yield();
  shared.finished.store(0);
  if (shared.peer != nullptr) {
    try {
      shared.peer->synchronize();
      report_path_counts(state, *shared.peer, shared.before);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
    shared.peer.reset();
  }
}

template <typename Workload>
void register_scenario(const std::vector<PeerKind>& peers, const RunConfig& run) {
  for (const PeerKind& kind : peers) {
    auto shared = std::make_shared<Shared>();
    auto* b = benchmark::RegisterBenchmark(
        (std::string(Workload::kName) + "/" + kind.id()).c_str(),
        [kind, shared](benchmark::State& state) { run_threads<Workload>(state, kind, *shared); });
    b->Unit(benchmark::kNanosecond)->UseRealTime();
    if (run.min_time > 0) b->MinTime(run.min_time);
    if (run.short_mode) {
      b->Threads(1)->Threads(8);
    } else {
      for (int n = 1; n <= kMaxThreads; n *= 2) b->Threads(n);
    }
  }
}

const Scenario kVaried("threads_varied", register_scenario<ReplaceOldest>);
const Scenario kServer("threads_server", register_scenario<ServerRequests>);

}  // namespace
}  // namespace streamalloc::bench

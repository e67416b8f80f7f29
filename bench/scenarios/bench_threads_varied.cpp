// threads_varied: 1..16 host threads, each with its own stream, all on one shared allocator, each
// keeping kLive blocks live and replacing the oldest with a new one of a size drawn from a real trace's
// size distribution (trace_sizes.hpp, from ResNet-50's allocations: many sizes, mostly small, some
// above 1 MiB). So, unlike `threads`, a thread rarely asks for the size it freed last: the case of a
// server whose requests vary in size. Each thread draws its sizes from its own seeded generator, so
// every peer sees the same sequences. One item = one alloc+free pair; items_per_second is the aggregate
// over the threads (real time).
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

void threads_varied(benchmark::State& state, const PeerKind& kind, Shared& shared) {
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
  const std::vector<std::size_t> sizes = size_sequence(t);
  std::array<void*, kLive> live{};
  std::array<std::size_t, kLive> live_size{};
  std::size_t next = 0;  // into `sizes`; the slot replaced is next % kLive
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
        for (std::size_t k = 0; k < kLive; ++k) {
          live_size[k] = sizes[next++];
          live[k] = shared.peer->alloc(live_size[k], stream);
        }
      }
      const std::size_t slot = next % kLive;
      shared.peer->free(live[slot], live_size[slot], stream);
      live[slot] = nullptr;
      live_size[slot] = sizes[next++ % kSequence];
      live[slot] = shared.peer->alloc(live_size[slot], stream);
      benchmark::DoNotOptimize(live[slot]);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      failed = true;
    }
  }
  state.SetItemsProcessed(state.iterations());
  if (shared.peer != nullptr) {
    try {
      for (std::size_t k = 0; k < kLive; ++k) {
        if (live[k] != nullptr) shared.peer->free(live[k], live_size[k], stream);
      }
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

void register_threads_varied(const std::vector<PeerKind>& peers, const RunConfig& run) {
  for (const PeerKind& kind : peers) {
    auto shared = std::make_shared<Shared>();
    auto* b =
        benchmark::RegisterBenchmark(("threads_varied/" + kind.id()).c_str(),
                                     [kind, shared](benchmark::State& state) { threads_varied(state, kind, *shared); });
    b->Unit(benchmark::kNanosecond)->UseRealTime();
    if (run.min_time > 0) b->MinTime(run.min_time);
    if (run.short_mode) {
      b->Threads(1)->Threads(8);
    } else {
      for (int n = 1; n <= kMaxThreads; n *= 2) b->Threads(n);
    }
  }
}

const Scenario kScenario("threads_varied", register_threads_varied);

}  // namespace
}  // namespace streamalloc::bench

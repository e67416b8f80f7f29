// threads: 1..16 host threads, each with its own stream, all on one shared allocator, each doing
// alloc+free pairs of a few sizes. Google Benchmark sums the items of all threads and, with real time,
// divides by wall time: items_per_second is the aggregate throughput. One item = one pair.
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "scenario.hpp"

namespace streamalloc::bench {
namespace {

constexpr std::array<std::size_t, 4> kSizes = {512, 4 * KiB, 64 * KiB, 1 * MiB};
constexpr int kMaxThreads = 16;

// What thread 0 sets up for all threads of one benchmark run. Google Benchmark starts and ends the
// timed loop of every thread at a barrier, so the others see it complete and it outlives their loops.
struct Shared {
  std::unique_ptr<Peer> peer;
  std::vector<Stream> streams;
  std::optional<PathCounts> before;  // the peer's path counts after the warm-up
  std::string error;
};

void threads(benchmark::State& state, const PeerKind& kind, Shared& shared) {
  if (state.thread_index() == 0) {
    state.SetLabel(kind.device);
    try {
      shared.peer = kind.open();
      shared.streams.clear();
      for (int k = 0; k < state.threads(); ++k) shared.streams.push_back(shared.peer->stream(k));
      for (const Stream stream : shared.streams) {  // warm-up: one segment per size class and stream
        for (const std::size_t size : kSizes) shared.peer->free(shared.peer->alloc(size, stream), size, stream);
      }
      shared.before = shared.peer->path_counts();
    } catch (const std::exception& e) {
      shared.peer.reset();
      shared.error = e.what();
    }
  }
  // A failing thread reports the error and idles through its remaining iterations instead of leaving
  // the loop early: leaving would skip the end barrier the other threads wait at.
  bool failed = false;
  std::size_t i = 0;
  for (auto _ : state) {
    if (failed) continue;
    if (shared.peer == nullptr) {
      state.SkipWithError(shared.error.c_str());
      failed = true;
      continue;
    }
    try {
      const std::size_t size = kSizes[i++ % kSizes.size()];
      const Stream stream = shared.streams[static_cast<std::size_t>(state.thread_index())];
      void* ptr = shared.peer->alloc(size, stream);
      benchmark::DoNotOptimize(ptr);
      shared.peer->free(ptr, size, stream);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      failed = true;
    }
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0 && shared.peer != nullptr) {
    try {
      shared.peer->synchronize();
      report_path_counts(state, *shared.peer, shared.before);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
    shared.peer.reset();
  }
}

void register_threads(const std::vector<PeerKind>& peers, const RunConfig& run) {
  for (const PeerKind& kind : peers) {
    auto shared = std::make_shared<Shared>();
    auto* b = benchmark::RegisterBenchmark(("threads/" + kind.id()).c_str(),
                                           [kind, shared](benchmark::State& state) { threads(state, kind, *shared); });
    b->Unit(benchmark::kNanosecond)->UseRealTime();
    if (run.min_time > 0) b->MinTime(run.min_time);
    if (run.short_mode) {
      b->Threads(1)->Threads(8);
    } else {
      for (int n = 1; n <= kMaxThreads; n *= 2) b->Threads(n);
    }
  }
}

const Scenario kScenario("threads", register_threads);

}  // namespace
}  // namespace streamalloc::bench

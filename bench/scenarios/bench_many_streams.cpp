// many_streams: streams taking turns. Each turn one stream allocates a working set (small and large
// blocks, ~48 MiB) and frees it; the next turn is the next stream's, round robin. Native PyTorch keeps
// freed blocks on the stream that freed them and never lends them to another stream before an OOM
// flush, so each stream ends up caching its own working set; streamalloc hands settled blocks to any
// stream. The benchmark reports time per alloc/free pair and, as counters, the peak reserved bytes of
// this run (`streams` streams) and of the same turns on one stream, and their ratio.
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "scenario.hpp"

namespace streamalloc::bench {
namespace {

// A step's tensors: activations of a few sizes, a workspace, one large buffer (own segment).
constexpr std::array<std::size_t, 22> kWorkingSet = {12 * MiB,  8 * MiB,   2 * MiB,   2 * MiB,   2 * MiB,   2 * MiB,
                                                     512 * KiB, 512 * KiB, 512 * KiB, 512 * KiB, 512 * KiB, 512 * KiB,
                                                     512 * KiB, 512 * KiB, 64 * KiB,  64 * KiB,  64 * KiB,  64 * KiB,
                                                     64 * KiB,  64 * KiB,  64 * KiB,  16 * MiB};
constexpr int kTurnsPerIteration = 32;

void run_turns(Peer& peer, const std::vector<Stream>& streams, std::array<void*, kWorkingSet.size()>& held) {
  for (int turn = 0; turn < kTurnsPerIteration; ++turn) {
    const Stream stream = streams[static_cast<std::size_t>(turn) % streams.size()];
    std::size_t count = 0;
    try {
      for (; count < kWorkingSet.size(); ++count) held[count] = peer.alloc(kWorkingSet[count], stream);
    } catch (...) {
      // Out of memory half-way: give back what is held, so that a process-wide peer (C ABI, native,
      // the default pool) is left as it was found for the benchmarks after this one.
      for (std::size_t i = 0; i < count; ++i) peer.free(held[i], kWorkingSet[i], stream);
      throw;
    }
    for (std::size_t i = 0; i < kWorkingSet.size(); ++i) peer.free(held[i], kWorkingSet[i], stream);
  }
}

void many_streams(benchmark::State& state, Peer& peer) {
  std::vector<Stream> streams;
  for (int k = 0; k < state.range(0); ++k) streams.push_back(peer.stream(k));
  std::array<void*, kWorkingSet.size()> held{};

  // Reference: the same turns on a single stream, from an empty cache.
  peer.reset_memory();
  run_turns(peer, {streams[0]}, held);
  peer.synchronize();
  const double single = static_cast<double>(peer.peaks().reserved);

  peer.reset_memory();
  run_turns(peer, streams, held);  // warm-up round: what is timed is the steady state
  for (auto _ : state) run_turns(peer, streams, held);
  state.SetItemsProcessed(state.iterations() * kTurnsPerIteration * static_cast<std::int64_t>(kWorkingSet.size()));
  peer.synchronize();
  report_peaks(state, peer);

  using benchmark::Counter;
  const double reserved = static_cast<double>(peer.peaks().reserved);
  if (single > 0 && reserved >= 0) {
    state.counters["single_stream_peak_reserved"] = Counter(single, Counter::kDefaults, Counter::kIs1024);
    state.counters["reserved_vs_single_stream"] = reserved / single;
  }
}

void register_many_streams(const std::vector<PeerKind>& peers, const RunConfig& run) {
  for (const PeerKind& kind : peers) {
    register_peer_benchmark("many_streams", kind, run, many_streams)->ArgName("streams")->Arg(1)->Arg(32);
  }
}

const Scenario kScenario("many_streams", register_many_streams);

}  // namespace
}  // namespace streamalloc::bench

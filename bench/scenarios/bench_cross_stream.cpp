// cross_stream: the prefetch pipeline's pattern. A block is allocated on stream A, used on stream B
// (record_stream), and freed: the allocator must keep it from reuse until B's work is done. Native
// PyTorch records one event per (block, stream) at free time and polls it on the next malloc;
// streamalloc batches one fence per stream. One item = alloc + record_stream + free.
//
// No kernels run, so fences complete as soon as they are recorded: this measures the allocator's own
// cost per op, not how long blocks stay pending (the trace replay and the multi-stream demo cover that).
// Peers that count their fences (streamalloc) also report fences_per_item (events recorded) and
// fence_queries_per_item (events and streams queried): 1 MiB blocks fill a 2 MiB small-pool segment
// two at a time, so every second allocation misses (docs/design.md, "Fences: batching and pipelining").
#include <cstddef>
#include <cstdint>
#include <optional>

#include "scenario.hpp"

namespace streamalloc::bench {
namespace {

void cross_stream(benchmark::State& state, Peer& peer) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const Stream producer = peer.stream(0);
  const Stream consumer = peer.stream(1);
  void* warm = peer.alloc(size, producer);
  peer.record_stream(warm, consumer);
  peer.free(warm, size, producer);
  peer.synchronize();
  const std::optional<FenceCounts> before = peer.fence_counts();
  for (auto _ : state) {
    void* ptr = peer.alloc(size, producer);
    benchmark::DoNotOptimize(ptr);
    peer.record_stream(ptr, consumer);
    peer.free(ptr, size, producer);
  }
  state.SetItemsProcessed(state.iterations());
  if (const std::optional<FenceCounts> after = peer.fence_counts(); before && after) {
    using benchmark::Counter;
    state.counters["fences_per_item"] =
        Counter(static_cast<double>(after->recorded - before->recorded), Counter::kAvgIterations);
    state.counters["fence_queries_per_item"] =
        Counter(static_cast<double>(after->polled - before->polled), Counter::kAvgIterations);
  }
  peer.synchronize();
  report_peaks(state, peer);
}

void register_cross_stream(const std::vector<PeerKind>& peers, const RunConfig& run) {
  for (const PeerKind& kind : peers) {
    register_peer_benchmark("cross_stream", kind, run, cross_stream)
        ->ArgName("bytes")
        ->Arg(4096)
        ->Arg(std::int64_t{1} << 20);
  }
}

const Scenario kScenario("cross_stream", register_cross_stream);

}  // namespace
}  // namespace streamalloc::bench

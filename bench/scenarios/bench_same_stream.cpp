// same_stream: an alloc+free pair on one stream, after a warm-up pair, so what is timed is the cached
// path every tensor of a training step takes (PyTorch's native allocator and streamalloc both serve it
// from a per-stream free list). One item = one pair.
#include <cstddef>
#include <cstdint>

#include "scenario.hpp"

namespace streamalloc::bench {
namespace {

void same_stream(benchmark::State& state, Peer& peer) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const Stream stream = peer.stream(0);
  peer.free(peer.alloc(size, stream), size, stream);  // warm-up: reserves the segment
  for (auto _ : state) {
    void* ptr = peer.alloc(size, stream);
    benchmark::DoNotOptimize(ptr);
    peer.free(ptr, size, stream);
  }
  state.SetItemsProcessed(state.iterations());
}

void register_same_stream(const std::vector<PeerKind>& peers, const RunConfig& run) {
  for (const PeerKind& kind : peers) {
    auto* b = register_peer_benchmark("same_stream", kind, run, same_stream)->ArgName("bytes");
    if (run.short_mode) {
      b->Arg(512)->Arg(std::int64_t{1} << 20)->Arg(std::int64_t{64} << 20);
    } else {
      b->RangeMultiplier(8)->Range(512, std::int64_t{64} << 20);  // 512 B, 4 KiB, ... 16 MiB, 64 MiB
    }
  }
}

const Scenario kScenario("same_stream", register_same_stream);

}  // namespace
}  // namespace streamalloc::bench

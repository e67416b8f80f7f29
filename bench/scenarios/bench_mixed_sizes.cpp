// mixed_sizes: random allocations and frees with many live blocks, in the style of RMM's
// random_allocations benchmark: each step allocates with probability 0.6, else frees a random live
// block (allocates when nothing is live, frees when `max_live` blocks are), sizes log-uniform in
// [1 KiB, 4 MiB], one stream, a fixed seed. RMM allocates with 0.53; the higher odds make a program of
// this length reach `max_live` and stay near it, which is the regime this scenario is about. The program is generated
// once; each iteration replays it and ends with nothing live, so every iteration does the same work. One item = one
// alloc or one free.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "scenario.hpp"

namespace streamalloc::bench {
namespace {

constexpr std::size_t kSteps = 8192;       // random steps, then the frees that empty the program
constexpr std::uint64_t kSeed = 20240611;  // fixed: every peer and every run replays the same program
constexpr double kMinSize = 1024.0;
constexpr double kMaxSize = 4.0 * 1024 * 1024;
constexpr double kAllocProbability = 0.6;

struct Op {
  std::uint32_t slot;
  bool alloc;
  std::size_t size;
};

struct Program {
  std::vector<Op> ops;
  std::size_t slots = 0;
};

Program make_program(std::size_t max_live) {
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<double> log_size(std::log(kMinSize), std::log(kMaxSize));
  std::bernoulli_distribution coin(kAllocProbability);
  Program program;
  program.slots = max_live;
  std::vector<std::uint32_t> live;  // slots holding a block
  std::vector<std::uint32_t> idle;  // free slots
  std::vector<std::size_t> sizes(max_live, 0);
  for (std::size_t s = max_live; s > 0; --s) idle.push_back(static_cast<std::uint32_t>(s - 1));
  auto free_one = [&](std::size_t index) {
    const std::uint32_t slot = live[index];
    live[index] = live.back();
    live.pop_back();
    idle.push_back(slot);
    program.ops.push_back({slot, false, sizes[slot]});
  };
  for (std::size_t step = 0; step < kSteps; ++step) {
    const bool allocate = live.empty() || (live.size() < max_live && coin(rng));
    if (allocate) {
      const std::uint32_t slot = idle.back();
      idle.pop_back();
      sizes[slot] = static_cast<std::size_t>(std::exp(log_size(rng)));
      live.push_back(slot);
      program.ops.push_back({slot, true, sizes[slot]});
    } else {
      free_one(std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
    }
  }
  while (!live.empty()) free_one(std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng));
  return program;
}

void mixed_sizes(benchmark::State& state, Peer& peer) {
  const Program program = make_program(static_cast<std::size_t>(state.range(0)));
  const Stream stream = peer.stream(0);
  std::vector<void*> slots(program.slots, nullptr);
  std::vector<std::size_t> sizes(program.slots, 0);
  auto replay = [&] {
    try {
      for (const Op& op : program.ops) {
        if (op.alloc) {
          slots[op.slot] = peer.alloc(op.size, stream);
          sizes[op.slot] = op.size;
        } else {
          peer.free(slots[op.slot], op.size, stream);
          slots[op.slot] = nullptr;
        }
      }
    } catch (...) {
      // An allocation failed (out of memory): give back what is held, so that a process-wide peer
      // (C ABI, native, the default pool) is left as it was found for the benchmarks after this one.
      for (std::size_t s = 0; s < slots.size(); ++s) {
        if (slots[s] != nullptr) peer.free(slots[s], sizes[s], stream);
      }
      throw;
    }
  };
  peer.reset_memory();
  replay();  // warm-up: fills the cache the way the timed replays will find it
  for (auto _ : state) replay();
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(program.ops.size()));
  report_peaks(state, peer);
  const MemoryPeaks peaks = peer.peaks();
  if (peaks.reserved > 0 && peaks.allocated > 0) {
    state.counters["reserved_per_allocated"] =
        static_cast<double>(peaks.reserved) / static_cast<double>(peaks.allocated);
  }
}

void register_mixed_sizes(const std::vector<PeerKind>& peers, const RunConfig& run) {
  for (const PeerKind& kind : peers) {
    auto* b = register_peer_benchmark("mixed_sizes", kind, run, mixed_sizes)->ArgName("max_live");
    b->Arg(64);
    if (!run.short_mode) b->Arg(512);
  }
}

const Scenario kScenario("mixed_sizes", register_mixed_sizes);

}  // namespace
}  // namespace streamalloc::bench

// Peers: the allocators the benchmarks and the trace replay compare, behind one small interface, so
// that each scenario is written once and registered once per peer.
//
// Peers (each only where it exists on the machine; docs/benchmarking.md):
//   streamalloc       streamalloc's C++ Allocator, on the CUDA backend with a GPU, else the simulated device
//   streamalloc_cabi  the same allocator through the C ABI (libstreamalloc.so), as PyTorch calls it
//   streamalloc_expandable  streamalloc's C++ Allocator with the run's options plus expandable_segments:true,
//                     on the same device as streamalloc; only with PeerSelection::expandable_peers
//   torch_native      PyTorch's CUDACachingAllocator through LibTorch (built with Torch, run with a GPU)
//   torch_expandable  the same under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, in a child process
//                     (PeerKind::child); only with PeerSelection::expandable_peers
//   cudaMallocAsync   the default memory pool with its release threshold at UINT64_MAX (GPU only)
//   cudaMalloc        no caching at all (GPU only)
//   rmm_pool, rmm_arena, rmm_binning   RMM's stream-ordered resources (built with RMM, run with a GPU)
//   sim_malloc        cudaMalloc-style on the simulated device (no cache, every free waits for the
//                     device); only where streamalloc runs on the simulated device, and only when named
//                     or asked for with PeerSelection::sim_baseline
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "streamalloc/types.hpp"

namespace streamalloc::bench {

// Peak memory of a peer since its last reset_memory(), in bytes; -1 where the peer cannot tell.
struct MemoryPeaks {
  std::int64_t reserved = -1;   // device memory the peer held (cached or in use)
  std::int64_t allocated = -1;  // memory handed to callers
};

// What a peer's stream-ordered frees cost in device calls, counted by the allocator since it opened.
struct FenceCounts {
  std::int64_t recorded = 0;  // events recorded
  std::int64_t polled = 0;    // event queries, and streams asked whether they are idle
};

// Which path an allocator's calls took, counted by the allocator since it opened (streamalloc's stats:
// docs/design.md, "Locking").
struct PathCounts {
  std::int64_t allocations_cached = 0;         // served by the stream's shard alone
  std::int64_t allocations_device_locked = 0;  // took the device lock
  std::int64_t frees_cached = 0;
  std::int64_t frees_device_locked = 0;
  std::int64_t device_lock_acquisitions = 0;  // every call that took it
  std::int64_t device_lock_wait_ns = 0;       // summed over threads
  std::int64_t device_lock_held_ns = 0;
  std::int64_t headroom_gathers = 0;
  std::int64_t hot_list_flushes = 0;
  std::int64_t fences_recorded = 0;  // events recorded (under the device lock)
  std::int64_t fences_polled = 0;    // event and stream queries
};

// One allocator under test. Calls may come from several threads at once (the threads scenario);
// every peer is as thread-safe as the allocator it wraps.
class Peer {
 public:
  virtual ~Peer() = default;

  // Memory for `size` bytes that is safe for work on `stream`. Throws std::exception on failure.
  virtual void* alloc(std::size_t size, Stream stream) = 0;
  // Free memory from alloc(); `size` and `stream` are the ones passed to alloc().
  virtual void free(void* ptr, std::size_t size, Stream stream) = 0;
  // Declare that `stream` uses the block at `ptr`, as Tensor.record_stream does. Peers without the
  // notion do what a careful user of that allocator would do instead (see each implementation).
  virtual void record_stream(void* ptr, Stream stream) = 0;

  // The k-th stream (k = 0, 1, ...) of this peer's device, created on first use: real non-blocking
  // CUDA streams on a GPU, SimBackend streams on the simulated device. Not thread-safe: create the
  // streams a benchmark needs before its threads start.
  virtual Stream stream(int k) = 0;

  // Wait until all device work of this peer is done (outside timed regions).
  virtual void synchronize() = 0;
  // Give cached memory back to the device and restart peak tracking.
  virtual void reset_memory() = 0;
  virtual MemoryPeaks peaks() = 0;
  // The allocator's own fence counts (streamalloc's stats); nullopt where the peer keeps none.
  virtual std::optional<FenceCounts> fence_counts() { return std::nullopt; }
  // The allocator's path counts (streamalloc's stats); nullopt where the peer keeps none.
  virtual std::optional<PathCounts> path_counts() { return std::nullopt; }
};

// How a peer that needs a process of its own runs: the program runs itself again with
// `variable`=`value` in its environment (appended to what the variable holds already) and only the peer
// `runs_as`, and reports that run's row under the peer's own name. PyTorch reads PYTORCH_CUDA_ALLOC_CONF
// once per process, so its allocator with other settings than this process's is such a peer.
struct ChildRun {
  std::string variable;
  std::string value;
  std::string runs_as;
};

// A peer that can be opened: name, device, and a factory.
struct PeerKind {
  std::string name;    // streamalloc | streamalloc_cabi | streamalloc_expandable | torch_native |
                       // torch_expandable | cudaMallocAsync | cudaMalloc | rmm_pool | rmm_arena |
                       // rmm_binning | sim_malloc
  std::string device;  // "sim" or "cuda": where the peer runs, shown in every result
  std::function<std::unique_ptr<Peer>()> open;  // empty when `child` is set or `not_run` is not empty
  // Set when the peer runs in a child process instead (only with PeerSelection::expandable_peers).
  std::optional<ChildRun> child = std::nullopt;
  // Why a peer the selection asked for cannot run in this build, for its row of the report ("" when it
  // runs): a row that says so, not a failure (streamalloc_expandable where streamalloc has no
  // expandable_segments option).
  std::string not_run = {};

  // "name@device", the peer's part of every benchmark name.
  std::string id() const { return name + "@" + device; }
};

// Which device streamalloc runs on.
enum class DeviceChoice { kAuto, kSim, kCuda };

struct PeerSelection {
  DeviceChoice device = DeviceChoice::kAuto;
  // Extra streamalloc options ("key:value,..."), applied to both streamalloc peers; the backend key
  // is set from `device`.
  std::string streamalloc_conf;
  // Peer names to keep; empty keeps all available ones (sim_malloc only with sim_baseline).
  std::vector<std::string> names;
  // Add sim_malloc when streamalloc runs on the simulated device: the one peer that runs there.
  bool sim_baseline = false;
  // Offer streamalloc_expandable and torch_expandable, in the default set too. Only a program that runs
  // PeerKind::child peers and reports PeerKind::not_run rows asks for them (streamalloc_replay).
  bool expandable_peers = false;
};

// The peers available in this build on this machine, in a fixed order (streamalloc peers first; each
// expandable variant right after its plain peer).
// Throws std::runtime_error when the selection asks for a device that is not there, names a peer that
// does not exist or is not available here (the message says which and why), or has bad streamalloc
// options (streamalloc::Error).
std::vector<PeerKind> available_peers(const PeerSelection& selection);

// Facts about the machine for reports: "gpu_name", "gpu_memory", "cuda_runtime", "torch", ...
std::vector<std::pair<std::string, std::string>> machine_context();

// Parse "sim" | "cuda" | "auto"; throws std::invalid_argument naming the accepted values.
DeviceChoice parse_device_choice(const std::string& text);

}  // namespace streamalloc::bench

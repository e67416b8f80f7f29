// available_peers(): which peers this build and this machine offer, decided once at start-up.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include "peer_kinds.hpp"
#include "streamalloc/allocator.hpp"

namespace streamalloc::bench {
namespace {

bool gpu_here() {
#ifdef STREAMALLOC_BENCH_CUDA
  return gpu_present();
#else
  return false;
#endif
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// Every peer name with the reason it is missing here, or "" when it is available.
std::vector<std::pair<std::string, std::string>> peer_names(bool gpu, bool streamalloc_on_cuda) {
#ifdef STREAMALLOC_BENCH_CUDA
  const char* no_gpu = "needs a GPU (none found)";
#else
  (void)gpu;  // no peer of a build without CUDA depends on a GPU
#endif
  std::string torch_reason;
#ifdef STREAMALLOC_BENCH_TORCH
  torch_reason = gpu ? "" : no_gpu;
#else
  torch_reason = "this build has no LibTorch (Torch was not found at configure time)";
#endif
#ifdef STREAMALLOC_BENCH_CUDA
  const std::string cuda_reason = gpu ? "" : no_gpu;
#else
  const std::string cuda_reason = "this build has no CUDA (the toolkit was not found at configure time)";
#endif
#ifdef STREAMALLOC_BENCH_RMM
  const std::string rmm_reason = gpu ? "" : no_gpu;
#else
  const std::string rmm_reason = "this build has no RMM (run bench/peers/fetch_rmm.sh, then configure again)";
#endif
  return {{"streamalloc", ""},
          {"streamalloc_cabi", ""},
          {"streamalloc_expandable", ""},
          {"torch_native", torch_reason},
          {"torch_expandable", torch_reason},
          {"cudaMallocAsync", cuda_reason},
          {"cudaMalloc", cuda_reason},
          {"rmm_pool", rmm_reason},
          {"rmm_arena", rmm_reason},
          {"rmm_binning", rmm_reason},
          {"sim_malloc", streamalloc_on_cuda ? "runs only beside streamalloc on the simulated device" : ""}};
}

// The peers only a program that asks for PeerSelection::expandable_peers gets.
bool is_expandable_variant(const std::string& name) {
  return name == "streamalloc_expandable" || name == "torch_expandable";
}

}  // namespace

DeviceChoice parse_device_choice(const std::string& text) {
  if (text == "auto") return DeviceChoice::kAuto;
  if (text == "sim") return DeviceChoice::kSim;
  if (text == "cuda") return DeviceChoice::kCuda;
  throw std::invalid_argument("unknown device '" + text + "': use sim, cuda or auto");
}

std::vector<PeerKind> available_peers(const PeerSelection& selection) {
  // A bad option is one error now, not the same error in every benchmark later.
  Options::parse(selection.streamalloc_conf);
  const bool gpu = gpu_here();
  bool streamalloc_on_cuda = gpu;
  if (selection.device == DeviceChoice::kSim) streamalloc_on_cuda = false;
  if (selection.device == DeviceChoice::kCuda) {
    if (!cuda_backend_built()) {
      throw std::runtime_error(
          "device cuda requested, but this build has no CUDA backend (the CUDA toolkit was "
          "not found at configure time); use sim");
    }
    if (!gpu) throw std::runtime_error("device cuda requested, but no GPU is present; use sim");
    streamalloc_on_cuda = true;
  }

  const auto names = peer_names(gpu, streamalloc_on_cuda);
  for (const std::string& wanted : selection.names) {
    auto it = std::find_if(names.begin(), names.end(), [&](const auto& n) { return n.first == wanted; });
    if (it == names.end()) {
      std::vector<std::string> known;
      for (const auto& n : names) known.push_back(n.first);
      throw std::runtime_error("unknown peer '" + wanted + "'; peers are: " + join(known));
    }
    if (!it->second.empty()) throw std::runtime_error("peer '" + wanted + "' is not available here: " + it->second);
    if (is_expandable_variant(wanted) && !selection.expandable_peers) {
      throw std::runtime_error("peer '" + wanted + "' is offered by streamalloc_replay only");
    }
  }
  auto wanted = [&](const std::string& name) {
    return selection.names.empty() ||
           std::find(selection.names.begin(), selection.names.end(), name) != selection.names.end();
  };

  std::vector<PeerKind> peers;
  if (wanted("streamalloc")) peers.push_back(streamalloc_peer_kind(streamalloc_on_cuda, selection.streamalloc_conf));
  if (wanted("streamalloc_cabi")) {
    peers.push_back(streamalloc_cabi_peer_kind(streamalloc_on_cuda, selection.streamalloc_conf));
  }
  if (selection.expandable_peers && wanted("streamalloc_expandable")) {
    peers.push_back(streamalloc_expandable_peer_kind(streamalloc_on_cuda, selection.streamalloc_conf));
  }
#ifdef STREAMALLOC_BENCH_TORCH
  if (gpu && wanted("torch_native")) peers.push_back(torch_native_peer_kind());
  if (gpu && selection.expandable_peers && wanted("torch_expandable")) peers.push_back(torch_expandable_peer_kind());
#endif
#ifdef STREAMALLOC_BENCH_CUDA
  if (gpu && wanted("cudaMallocAsync")) peers.push_back(cuda_malloc_async_peer_kind());
  if (gpu && wanted("cudaMalloc")) peers.push_back(cuda_malloc_peer_kind());
#endif
#ifdef STREAMALLOC_BENCH_RMM
  if (gpu && wanted("rmm_pool")) peers.push_back(rmm_pool_peer_kind());
  if (gpu && wanted("rmm_arena")) peers.push_back(rmm_arena_peer_kind());
  if (gpu && wanted("rmm_binning")) peers.push_back(rmm_binning_peer_kind());
#endif
  // Not in the default set: `make bench` and the trace replays compare streamalloc with real allocators.
  const bool named_sim =
      std::find(selection.names.begin(), selection.names.end(), "sim_malloc") != selection.names.end();
  if (!streamalloc_on_cuda && (selection.sim_baseline || named_sim)) peers.push_back(sim_malloc_peer_kind());
  return peers;
}

std::vector<std::pair<std::string, std::string>> machine_context() {
  std::vector<std::pair<std::string, std::string>> out;
  out.emplace_back("hardware_threads", std::to_string(std::thread::hardware_concurrency()));
  out.emplace_back("streamalloc_cuda_backend_built", cuda_backend_built() ? "yes" : "no");
  out.emplace_back("gpu_present", gpu_here() ? "yes" : "no");
#ifdef STREAMALLOC_BENCH_CUDA
  for (auto& item : cuda_context()) out.push_back(std::move(item));
#endif
#ifdef STREAMALLOC_BENCH_TORCH
  out.emplace_back("torch", torch_version());
  out.emplace_back("torch_expandable_segments", torch_expandable_segments() ? "yes" : "no");
#else
  out.emplace_back("torch", "not built");
#endif
#ifdef STREAMALLOC_BENCH_RMM
  out.emplace_back("rmm", rmm_version());
#else
  out.emplace_back("rmm", "not built");
#endif
  std::string missing;
  for (const auto& [name, reason] : peer_names(gpu_here(), gpu_here())) {
    if (name == "sim_malloc") continue;  // a stand-in, not a missing peer
    if (!reason.empty()) missing += (missing.empty() ? "" : "; ") + name + ": " + reason;
  }
  out.emplace_back("peers_missing", missing.empty() ? "none" : missing);
  return out;
}

}  // namespace streamalloc::bench

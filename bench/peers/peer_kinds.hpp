// The factories behind available_peers(), one per peer family and file, plus the CUDA helpers they
// share. Internal to bench/: scenarios only see peer.hpp.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "peer.hpp"

namespace streamalloc::bench {

// peer_streamalloc.cpp: the C++ Allocator and the C ABI, on the CUDA backend (`cuda`) or the
// simulated device.
PeerKind streamalloc_peer_kind(bool cuda, const std::string& conf);
PeerKind streamalloc_cabi_peer_kind(bool cuda, const std::string& conf);
// The C++ Allocator with `conf` plus expandable_segments:true; a not_run kind where streamalloc has no
// such option.
PeerKind streamalloc_expandable_peer_kind(bool cuda, const std::string& conf);

// peer_sim.cpp: cudaMalloc-style allocation (no cache, every free waits for the device) on the simulated
// device; beside streamalloc on the simulated device only, when asked for.
PeerKind sim_malloc_peer_kind();

#ifdef STREAMALLOC_BENCH_CUDA
// peer_cuda.cpp: the CUDA runtime's allocators and the process-wide stream pool.
bool gpu_present();
// The k-th of the process-wide non-blocking streams on device 0, created on first use and kept until
// exit, so every CUDA peer and every benchmark sees the same stream handles.
Stream cuda_pool_stream(int k);
void cuda_synchronize_device();
PeerKind cuda_malloc_async_peer_kind();
PeerKind cuda_malloc_peer_kind();
std::vector<std::pair<std::string, std::string>> cuda_context();
#endif

#ifdef STREAMALLOC_BENCH_TORCH
// peer_torch.cpp: PyTorch's native CUDACachingAllocator (needs a GPU at run time), in this process and,
// with expandable segments, in a child process.
PeerKind torch_native_peer_kind();
PeerKind torch_expandable_peer_kind();
std::string torch_version();
// Whether PyTorch's allocator in this process uses expandable segments (PYTORCH_CUDA_ALLOC_CONF).
bool torch_expandable_segments();
#endif

#ifdef STREAMALLOC_BENCH_RMM
// peer_rmm.cpp: RMM's pool, arena and binning resources (need a GPU at run time).
PeerKind rmm_pool_peer_kind();
PeerKind rmm_arena_peer_kind();
PeerKind rmm_binning_peer_kind();
std::string rmm_version();
#endif

}  // namespace streamalloc::bench

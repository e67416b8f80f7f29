// RMM's device memory resources as peers: the stream-ordered pools a RAPIDS user would pick. Built only
// when CMake found RMM (bench/peers/find_rmm.cmake; bench/peers/fetch_rmm.sh fetches it) and the CUDA toolkit, in a
// library of its own compiled as C++20 (RMM's headers need it); registered only when a GPU is present.
//
//   rmm_pool     pool_memory_resource over cuda_memory_resource: one coalescing best-fit pool with a
//                free list per stream behind one mutex. Starts empty (initial size 0), like the other
//                peers, and grows by max(request, current pool size).
//   rmm_arena    arena_memory_resource over cuda_memory_resource: a small arena per stream (per thread
//                for the per-thread default stream) that takes 1 MiB+ superblocks from a global arena,
//                so threads on their own streams share no lock on the common path: the multi-thread
//                anchor. The global arena is RMM's default size, half of the free device memory, taken
//                up front; blocks over 1 MiB come from the global arena under its mutex, and their free
//                synchronizes the freeing stream (RMM's design, not this wrapper's).
//   rmm_binning  binning_memory_resource over a pool_memory_resource: fixed-size bins of 256 KiB to
//                4 MiB (powers of two, as RMM's own benchmarks configure it), larger requests to the
//                pool. Each bin takes 128 blocks from the pool when it is created.
//
// record_stream: RMM has none. Its deallocate(stream, ptr) is stream-ordered: the block goes on
// `stream`'s free list with an event recorded on `stream`; `stream` reuses it at once (stream order
// protects the earlier work), another stream only after waiting on that event (the pool, the bins) or
// after `stream` is synchronized (the arena, for a block from another stream's arena). So work queued on
// `stream` before the free is protected, work on any other stream is not. What a careful RMM user does
// for a block another stream used is to make the freeing stream wait for that stream first, then
// deallocate on the allocation stream: StreamUses (peer_stream_uses.hpp) does exactly that, one event
// record and one stream wait per recorded stream at free time, as for cudaMallocAsync. (Deallocating on
// the using stream instead would need the same wait the other way round, and would move the block to
// the free list of a stream that does not allocate.)
//
// Peaks: "reserved" is what the resources hold from cudaMalloc, counted in their upstream (called only
// when a pool grows, an arena or a bin is created), so the count costs the allocation path nothing.
// "allocated" is not reported (-1): RMM counts it only through statistics_resource_adaptor, a lock on
// every call that would change what is measured.
#include <rmm/aligned.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/version_config.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "peer_atomic_peak.hpp"
#include "peer_kinds.hpp"
#include "peer_stream_uses.hpp"

namespace streamalloc::bench {
namespace {

constexpr int kDevice = 0;
constexpr std::size_t kAlignment = rmm::CUDA_ALLOCATION_ALIGNMENT;
// binning_memory_resource's bins: 2^18 = 256 KiB .. 2^22 = 4 MiB.
constexpr std::int8_t kSmallestBinExponent = 18;
constexpr std::int8_t kLargestBinExponent = 22;

cuda::stream_ref to_rmm(Stream stream) { return cuda::stream_ref{reinterpret_cast<cudaStream_t>(stream)}; }

// cuda_memory_resource that counts the bytes it holds into `held`: the peers' reserved memory.
class CountingCudaResource {
 public:
  explicit CountingCudaResource(AtomicPeak* held) : held_(held) {}

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment) {
    void* ptr = cuda_.allocate(stream, bytes, alignment);
    held_->add(static_cast<std::int64_t>(bytes));
    return ptr;
  }
  void deallocate(cuda::stream_ref stream, void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
    cuda_.deallocate(stream, ptr, bytes, alignment);
    held_->add(-static_cast<std::int64_t>(bytes));
  }
  void* allocate_sync(std::size_t bytes, std::size_t alignment) {
    void* ptr = cuda_.allocate_sync(bytes, alignment);
    held_->add(static_cast<std::int64_t>(bytes));
    return ptr;
  }
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept {
    cuda_.deallocate_sync(ptr, bytes, alignment);
    held_->add(-static_cast<std::int64_t>(bytes));
  }

  bool operator==(const CountingCudaResource& other) const noexcept { return held_ == other.held_; }
  bool operator!=(const CountingCudaResource& other) const noexcept { return !(*this == other); }
  friend void get_property(const CountingCudaResource&, cuda::mr::device_accessible) noexcept {}

 private:
  rmm::mr::cuda_memory_resource cuda_;
  AtomicPeak* held_;
};
static_assert(cuda::mr::resource_with<CountingCudaResource, cuda::mr::device_accessible>);

rmm::mr::pool_memory_resource make_pool(CountingCudaResource upstream) {
  return rmm::mr::pool_memory_resource(upstream, /*initial_pool_size=*/0);
}

rmm::mr::arena_memory_resource make_arena(CountingCudaResource upstream) {
  return rmm::mr::arena_memory_resource(upstream);
}

rmm::mr::binning_memory_resource make_binning(CountingCudaResource upstream) {
  return rmm::mr::binning_memory_resource(make_pool(upstream), kSmallestBinExponent, kLargestBinExponent);
}

// One RMM resource as a peer. `Resource` is one of RMM's shared-ownership resources; `make` builds it
// over the counting upstream, again at every reset_memory() (RMM gives a pool's memory back only when
// the resource is destroyed).
template <typename Resource>
class RmmPeer final : public Peer {
 public:
  using Make = Resource (*)(CountingCudaResource);

  explicit RmmPeer(Make make) : make_(make) {
    check(cudaSetDevice(kDevice), "cudaSetDevice");
    resource_.emplace(make_(CountingCudaResource(&reserved_)));
  }

  ~RmmPeer() override {
    try {
      synchronize();
    } catch (...) {
    }
  }

  void* alloc(std::size_t size, Stream stream) override {
    return resource_->allocate(to_rmm(stream), size, kAlignment);
  }

  void free(void* ptr, std::size_t size, Stream stream) override {
    uses_.wait_before_free(ptr, stream);
    resource_->deallocate(to_rmm(stream), ptr, size, kAlignment);
  }

  void record_stream(void* ptr, Stream stream) override { uses_.record(ptr, stream); }

  Stream stream(int k) override { return cuda_pool_stream(k); }
  void synchronize() override { cuda_synchronize_device(); }

  void reset_memory() override {
    synchronize();
    resource_.reset();
    reserved_.reset_peak();
    resource_.emplace(make_(CountingCudaResource(&reserved_)));
  }

  MemoryPeaks peaks() override { return {reserved_.peak(), -1}; }

 private:
  static void check(cudaError_t err, const char* call) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(err));
  }

  Make make_;
  AtomicPeak reserved_;  // declared before resource_: the resource's destructor still counts into it
  StreamUses uses_;
  std::optional<Resource> resource_;
};

template <typename Resource>
PeerKind rmm_peer_kind(const char* name, Resource (*make)(CountingCudaResource)) {
  return {name, "cuda", [make] { return std::make_unique<RmmPeer<Resource>>(make); }};
}

}  // namespace

PeerKind rmm_pool_peer_kind() { return rmm_peer_kind("rmm_pool", make_pool); }
PeerKind rmm_arena_peer_kind() { return rmm_peer_kind("rmm_arena", make_arena); }
PeerKind rmm_binning_peer_kind() { return rmm_peer_kind("rmm_binning", make_binning); }

std::string rmm_version() { return RMM_VERSION; }

}  // namespace streamalloc::bench

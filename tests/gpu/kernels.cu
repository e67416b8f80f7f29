// Kernels for the GPU tests: a timed spin, a fill and a checksum, launched through kernels.hpp.
#include "gpu/kernels.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace streamalloc::gpu_test {
namespace {

constexpr unsigned kThreads = 256;
// Grid-stride loops need no more blocks than keep an H200 (132 SMs) busy.
constexpr std::size_t kMaxBlocks = 1024;

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(kernel) + " launch failed: " + cudaGetErrorString(err) + " (" +
                             cudaGetErrorName(err) + ")");
  }
}

// Nanoseconds of the GPU's global timer: wall-clock time, unlike clock64 it does not depend on the
// SM's clock rate.
__device__ unsigned long long global_timer_ns() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = global_timer_ns();
  while (global_timer_ns() - start < ns) __nanosleep(1000);
}

__global__ void fill_kernel(std::uint32_t* ptr, std::size_t n, std::uint32_t value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    ptr[i] = value;
  }
}

__global__ void checksum_kernel(const std::uint32_t* ptr, std::size_t n, unsigned long long* out) {
  unsigned long long sum = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    sum += ptr[i];
  }
  // Reduce within the warp, then one atomic per warp.
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, sum);
}

}  // namespace

void spin(cudaStream_t stream, std::uint64_t microseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds) * 1000ull);
  check_launch("spin_kernel");
}

void fill_u32(std::uint32_t* ptr, std::size_t n, std::uint32_t value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ptr, n, value);
  check_launch("fill_kernel");
}

void checksum_u32(const std::uint32_t* ptr, std::size_t n, std::uint64_t* out, cudaStream_t stream) {
  static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long), "atomicAdd needs 64-bit words");
  auto* sum = reinterpret_cast<unsigned long long*>(out);
  const cudaError_t err = cudaMemsetAsync(sum, 0, sizeof *sum, stream);
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("cudaMemsetAsync of the checksum failed: ") + cudaGetErrorString(err));
  }
  if (n == 0) return;
  checksum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ptr, n, sum);
  check_launch("checksum_kernel");
}

}  // namespace streamalloc::gpu_test

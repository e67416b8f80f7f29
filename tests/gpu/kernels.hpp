// Kernels for the GPU tests, behind host-callable launchers so the tests stay plain C++.
// Every launcher enqueues on `stream` and throws std::runtime_error if the launch fails.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace streamalloc::gpu_test {

// Keep `stream` busy for about `microseconds` (one thread polling the GPU's global timer), so tests
// can hold a stream back while the host races ahead.
void spin(cudaStream_t stream, std::uint64_t microseconds);

// ptr[0..n) = value.
void fill_u32(std::uint32_t* ptr, std::size_t n, std::uint32_t value, cudaStream_t stream);

// *out = sum of ptr[0..n) as a 64-bit integer (zeroes *out first, in stream order). `out` is device
// memory. A fill of n words with v sums to n * v, which a stale or overwritten block cannot match.
void checksum_u32(const std::uint32_t* ptr, std::size_t n, std::uint64_t* out, cudaStream_t stream);

}  // namespace streamalloc::gpu_test

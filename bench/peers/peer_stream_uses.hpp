// record_stream for stream-ordered allocators that have no such call (cudaMallocAsync, RMM): what a
// careful user of them does instead. The streams a block was used on are remembered; when the block is
// freed, the freeing stream is made to wait for each of them (an event recorded on the user, waited on by
// the freeing stream), so the allocator's stream-ordered free cannot hand the block out again before
// that work is done. Thread-safe; frees of blocks never recorded skip the lock.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "streamalloc/types.hpp"

namespace streamalloc::bench {

class StreamUses {
 public:
  StreamUses() {
    const cudaError_t err = cudaEventCreateWithFlags(&event_, cudaEventDisableTiming);
    if (err != cudaSuccess)
      throw std::runtime_error(std::string("cudaEventCreateWithFlags failed: ") + cudaGetErrorName(err));
  }
  ~StreamUses() { cudaEventDestroy(event_); }
  StreamUses(const StreamUses&) = delete;
  StreamUses& operator=(const StreamUses&) = delete;

  // `stream` uses the block at `ptr`.
  void record(void* ptr, Stream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, inserted] = uses_.try_emplace(ptr);
    if (inserted) recorded_.fetch_add(1, std::memory_order_relaxed);
    it->second.push_back(stream);
  }

  // The block at `ptr` is about to be freed on `free_stream`: make that stream wait for every stream
  // recorded for it, and forget them.
  void wait_before_free(void* ptr, Stream free_stream) {
    if (recorded_.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = uses_.find(ptr);
    if (it == uses_.end()) return;
    for (Stream user : it->second) {
      check(cudaEventRecord(event_, reinterpret_cast<cudaStream_t>(user)), "cudaEventRecord");
      check(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(free_stream), event_, 0), "cudaStreamWaitEvent");
    }
    uses_.erase(it);
    recorded_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  static void check(cudaError_t err, const char* call) {
    if (err != cudaSuccess) {
      throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorName(err) + ": " +
                               cudaGetErrorString(err));
    }
  }

  cudaEvent_t event_ = nullptr;  // reused: each wait is enqueued before the next record
  std::mutex mutex_;
  std::unordered_map<void*, std::vector<Stream>> uses_;
  std::atomic<std::size_t> recorded_{0};  // entries in uses_
};

}  // namespace streamalloc::bench

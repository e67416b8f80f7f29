// SoakWorkload: the prefetch pipeline (docs/record-stream.md) with random sizes on several
// stream pairs, plus the traffic that stresses stream tracking: blocks kept alive across iterations and
// freed later (some on another stream than their allocation stream), consumers on a third stream,
// empty_cache() between iterations. Every consume checks every byte it reads; a byte another
// allocation wrote counts as a wrong check. streamalloc_soak (soak.cpp) runs it and reports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "demo_device.hpp"
#include "streamalloc/allocator.hpp"

namespace streamalloc {

struct SoakConfig {
  int pairs = 4;  // (prefetch, compute) stream pairs
  std::uint64_t seed = 1;
  std::size_t min_size = 512;
  std::size_t max_size = 64 * MiB;  // sizes are log-uniform in [min_size, max_size]
};

// What the soak counts itself, beside the allocator's stats. All COUNTs but bytes_requested (a SUM).
struct SoakCounts {
  std::uint64_t iterations = 0;
  std::uint64_t allocations = 0;
  std::uint64_t bytes_requested = 0;
  std::uint64_t kept_blocks = 0;                 // blocks kept alive across iterations
  std::uint64_t kept_freed_on_other_stream = 0;  // ... freed on a stream other than their allocation stream
  std::uint64_t third_stream_consumers = 0;      // batches also read (and record_stream'ed) on a third stream
  std::uint64_t empty_cache_calls = 0;
  std::uint64_t validate_calls = 0;
  std::uint64_t syncs = 0;         // host synchronizations that read the check flags
  std::uint64_t checks = 0;        // consumes whose flag was read back
  std::uint64_t checks_wrong = 0;  // ... that saw a byte other than their value
};

// The state after finish(): every block freed, fences processed, the cache emptied.
struct SoakEndState {
  std::int64_t allocated_bytes = 0;  // after freeing everything: anything left is a leak
  std::int64_t pending_bytes = 0;    // after the fences: anything left is stuck
  std::int64_t reserved_bytes = 0;   // after empty_cache(): anything left is a leak
  std::string validate_error;        // empty when validate() passed
  bool clean() const {
    return allocated_bytes == 0 && pending_bytes == 0 && reserved_bytes == 0 && validate_error.empty();
  }
};

class SoakWorkload {
 public:
  // Creates 2 * config.pairs streams on `device` and one event per stream. The allocator and the
  // device must outlive the workload.
  SoakWorkload(const SoakConfig& config, Allocator& allocator, DemoDevice& device);
  SoakWorkload(const SoakWorkload&) = delete;
  SoakWorkload& operator=(const SoakWorkload&) = delete;

  // One iteration: a batch through one random stream pair, kept blocks added and retired, and the
  // periodic device steps, fence processing, flag reads, validate() and empty_cache().
  void iterate();
  // Retire every kept block, read the last flags, free everything and empty the cache. Call once.
  SoakEndState finish();
  const SoakCounts& counts() const { return counts_; }

 private:
  struct Kept {
    void* ptr;
    std::size_t bytes;
    unsigned char value;
    std::size_t stream;  // index of the allocation stream
  };

  std::size_t random_size();
  std::size_t random_stream();
  bool chance(unsigned one_in);
  void* allocate(std::size_t bytes, std::size_t stream);
  void produce(void* ptr, std::size_t bytes, unsigned char value, std::size_t stream);
  void order_after(std::size_t producer, std::size_t consumer);
  void consume(const void* ptr, std::size_t bytes, unsigned char value, std::size_t producer, std::size_t consumer);
  void keep_one();
  void retire(std::size_t index);
  void step_all();
  void read_checks();

  SoakConfig config_;
  Allocator& allocator_;
  DemoDevice& device_;
  std::mt19937_64 rng_;
  std::vector<Stream> streams_;  // pair p: prefetch 2p, compute 2p + 1
  std::vector<Event> ready_;     // per stream, recorded after each fill on it
  std::vector<Kept> kept_;
  std::size_t kept_bytes_ = 0;
  std::size_t kept_target_ = 4;
  unsigned char* flags_ = nullptr;  // one mismatch flag per consume since the last read
  std::size_t flags_used_ = 0;
  SoakCounts counts_;
};

}  // namespace streamalloc

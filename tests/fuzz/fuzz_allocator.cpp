// libFuzzer target: the input bytes pick a configuration and then an operation sequence, decoded by
// the same code as the fixed-seed model test (tests/support/fuzz_ops.hpp), and every invariant is checked
// after every operation. A failing input prints what broke and the operations that led there, then
// aborts so libFuzzer saves it; replay with `streamalloc_fuzz crash-<hash>`.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz_ops.hpp"

namespace {

// Bounds the work per input so libFuzzer keeps a high execution rate; longer sequences come from
// the fixed-seed test.
constexpr std::uint64_t kMaxOpsPerInput = 4096;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace streamalloc;
  using namespace streamalloc::testing;

  ByteSource source(data, size);
  FuzzConfig config;
  constexpr CrossStreamReuse kPolicies[] = {CrossStreamReuse::kNever, CrossStreamReuse::kSettled,
                                            CrossStreamReuse::kWait};
  const auto setting = source.below(6);  // a policy, with or without expandable segments
  config.policy = kPolicies[setting % 3];
  config.expandable_segments = setting >= 3;
  config.streams = 2 + static_cast<int>(source.below(3));
  config.memory_limit = (std::size_t{64} << source.below(3)) * MiB;  // 64, 128 or 256 MiB

  // Inputs are short, so the expensive checks run after every operation.
  FuzzSchedule schedule;
  schedule.validate_every_op_until = kMaxOpsPerInput;
  OpRunner runner(config, schedule);
  while (!source.exhausted() && runner.ops() < kMaxOpsPerInput) {
    if (!runner.step(decode_op(source, config))) break;
  }
  runner.finish();
  if (!runner.failure().empty()) {
    std::fprintf(stderr,
                 "streamalloc_fuzz: cross_stream_reuse:%s, expandable_segments:%d, %d streams, %zu MiB: %s\nlast "
                 "operations:\n%s",
                 to_string(config.policy), config.expandable_segments ? 1 : 0, config.streams,
                 config.memory_limit / MiB, runner.failure().c_str(), runner.trace().c_str());
    std::abort();
  }
  return 0;
}

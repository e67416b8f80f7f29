// The small models the inference server serves, built with torch::nn and randomly initialised: what
// matters to the allocator is the pattern of tensors a forward pass creates, not what it computes.
//
//   mlp        1024 -> 4096 -> ReLU -> 4096 -> ReLU -> 1024 (three Linear layers)
//   conv       3x64x64 -> Conv 3x3 (32) -> ReLU -> Conv 3x3 stride 2 (64) -> ReLU -> Conv 3x3 stride 2 (128)
//              -> ReLU -> global average pool -> Linear (10)
//   small_mlp  512 -> 2048 -> ReLU -> 2048 -> GELU -> 512: layers so small that the GPU work of a request
//              takes about as long as its allocations, so the allocator bounds the throughput. Its
//              requests come as a server without pinned buffers makes them (RequestPath::kDevice).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace streamalloc::bench {

// How a request's input reaches the GPU and its result comes back.
enum class RequestPath {
  // The input copied from a pinned host buffer with non_blocking, the result into pinned memory with
  // non_blocking, then the stream synchronized.
  kPinned,
  // The input made on the GPU (torch::randn on the thread's stream), the result copied back with a
  // plain .to(kCPU): pageable memory, synchronous.
  kDevice,
};

struct InferenceModel {
  std::string name;
  torch::nn::Sequential net;
  std::vector<std::int64_t> sample_shape;  // one request row, without the batch dimension
  std::int64_t output_features = 0;        // numbers returned per request row
  RequestPath path = RequestPath::kPinned;
};

// The names make_model() takes, in a fixed order.
std::vector<std::string> inference_model_names();

// `name`'s network on `device`, in eval mode, weights from `seed`. Throws std::invalid_argument for an
// unknown name (naming the known ones).
InferenceModel make_model(const std::string& name, torch::Device device, std::uint64_t seed);

}  // namespace streamalloc::bench

// The small models the inference server serves, built with torch::nn and randomly initialised: what
// matters to the allocator is the pattern of tensors a forward pass creates, not what it computes.
//
//   mlp   1024 -> 4096 -> ReLU -> 4096 -> ReLU -> 1024 (three Linear layers)
//   conv  3x64x64 -> Conv 3x3 (32) -> ReLU -> Conv 3x3 stride 2 (64) -> ReLU -> Conv 3x3 stride 2 (128)
//         -> ReLU -> global average pool -> Linear (10)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace streamalloc::bench {

struct InferenceModel {
  std::string name;
  torch::nn::Sequential net;
  std::vector<std::int64_t> sample_shape;  // one request row, without the batch dimension
  std::int64_t output_features = 0;        // numbers returned per request row
};

// The names make_model() takes, in a fixed order.
std::vector<std::string> inference_model_names();

// `name`'s network on `device`, in eval mode, weights from `seed`. Throws std::invalid_argument for an
// unknown name (naming the known ones).
InferenceModel make_model(const std::string& name, torch::Device device, std::uint64_t seed);

}  // namespace streamalloc::bench

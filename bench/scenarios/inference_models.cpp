// The inference server's models (inference_models.hpp).
#include "inference_models.hpp"

#include <stdexcept>

namespace streamalloc::bench {
namespace {

namespace nn = torch::nn;

InferenceModel mlp() {
  return {
      "mlp",
      nn::Sequential(nn::Linear(1024, 4096), nn::ReLU(), nn::Linear(4096, 4096), nn::ReLU(), nn::Linear(4096, 1024)),
      {1024},
      1024};
}

InferenceModel conv() {
  auto conv3x3 = [](std::int64_t in, std::int64_t out, std::int64_t stride) {
    return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1));
  };
  return {"conv",
          nn::Sequential(conv3x3(3, 32, 1), nn::ReLU(), conv3x3(32, 64, 2), nn::ReLU(), conv3x3(64, 128, 2), nn::ReLU(),
                         nn::AdaptiveAvgPool2d(1), nn::Flatten(), nn::Linear(128, 10)),
          {3, 64, 64},
          10};
}

InferenceModel small_mlp() {
  return {"small_mlp",
          nn::Sequential(nn::Linear(512, 2048), nn::ReLU(), nn::Linear(2048, 2048), nn::GELU(), nn::Linear(2048, 512)),
          {512},
          512,
          RequestPath::kDevice};
}

}  // namespace

std::vector<std::string> inference_model_names() { return {"mlp", "conv", "small_mlp"}; }

InferenceModel make_model(const std::string& name, torch::Device device, std::uint64_t seed) {
  torch::manual_seed(seed);  // the CPU generator: weights are initialised on the host, then moved
  InferenceModel model;
  if (name == "mlp") {
    model = mlp();
  } else if (name == "conv") {
    model = conv();
  } else if (name == "small_mlp") {
    model = small_mlp();
  } else {
    throw std::invalid_argument("unknown model '" + name + "': use mlp, conv or small_mlp");
  }
  model.net->to(device);
  model.net->eval();
  return model;
}

}  // namespace streamalloc::bench

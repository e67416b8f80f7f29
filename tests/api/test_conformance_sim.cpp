// The conformance suite on the simulated device (eager mode: a device that keeps up).
#include "conformance_suite.hpp"
#include "streamalloc/sim_backend.hpp"

namespace streamalloc::testing {
namespace {

class SimEnv final : public ConformanceEnv {
 public:
  SimEnv() {
    SimBackend::Config config;
    config.memory_per_device = 1 * GiB;
    config.mode = SimBackend::Mode::kEager;
    sim_ = std::make_shared<SimBackend>(config);
  }
  std::shared_ptr<Backend> backend() override { return sim_; }
  Stream new_stream() override { return sim_->create_stream(0); }
  void synchronize() override { sim_->synchronize_all(); }

 private:
  std::shared_ptr<SimBackend> sim_;
};

INSTANTIATE_TEST_SUITE_P(Sim, Conformance,
                         ::testing::ValuesIn(conformance_params("sim", [] { return std::make_unique<SimEnv>(); })),
                         conformance_name);

}  // namespace
}  // namespace streamalloc::testing

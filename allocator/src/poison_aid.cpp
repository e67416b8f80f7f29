// poison:free|alloc|both as a debugging aid: fill blocks with 0xFF in stream order when they become
// truly free, when they are handed out, or both, so stale reads show.
#include "debug_aid.hpp"
#include "logging.hpp"

namespace streamalloc {
namespace {

class PoisonAid final : public DebugAid {
 public:
  PoisonAid(int device, PoisonMode mode, Backend& backend)
      : device_(device),
        on_alloc_(mode == PoisonMode::kAlloc || mode == PoisonMode::kBoth),
        on_free_(mode == PoisonMode::kFree || mode == PoisonMode::kBoth),
        backend_(backend) {}

  void on_allocate(Block& block) override {
    if (on_alloc_) fill(block);
  }
  // In the allocation stream's order, after every use: the block is truly free now.
  bool on_reusable(const Block& block) override {
    if (!on_free_) return false;
    fill(block);
    return true;
  }

 private:
  // A device error while filling a block is reported, never allowed to interrupt the bookkeeping
  // change around it.
  void fill(const Block& block) {
    try {
      backend_.memset_async(device_, reinterpret_cast<void*>(block.address), 0xFF, block.size, block.stream);
    } catch (const Error& e) {
      log().error("device {}: poisoning block {:#x} failed (the block is not poisoned): {}", device_, block.address,
                  e.what());
    }
  }

  const int device_;
  const bool on_alloc_;
  const bool on_free_;
  Backend& backend_;
};

}  // namespace

std::unique_ptr<DebugAid> make_poison_aid(int device, const Options& options, Backend& backend) {
  if (options.poison == PoisonMode::kOff) return nullptr;
  return std::make_unique<PoisonAid>(device, options.poison, backend);
}

}  // namespace streamalloc

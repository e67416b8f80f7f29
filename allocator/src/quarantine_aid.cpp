// quarantine_mb as a debugging aid: freed blocks wait in a FIFO of at most quarantine_bytes before
// they can be reused, so a use after free reads memory that no new allocation has taken yet.
#include <deque>

#include "debug_aid.hpp"

namespace streamalloc {
namespace {

class QuarantineAid final : public DebugAid {
 public:
  explicit QuarantineAid(std::size_t capacity) : capacity_(capacity) {}

  bool holds_blocks() const override { return true; }
  void hold(Block* block, std::vector<Block*>* released) override {
    fifo_.push_back(block);
    bytes_ += block->size;
    while (bytes_ > capacity_) release_oldest(released);
  }
  void release_all(std::vector<Block*>* released) override {
    while (!fifo_.empty()) release_oldest(released);
  }
  void validate(const AidCheck& check) const override {
    if (check.held_blocks != fifo_.size() || check.held_bytes != bytes_) {
      check.broken("the quarantine FIFO disagrees with the blocks marked held");
    }
  }

 private:
  void release_oldest(std::vector<Block*>* released) {
    Block* block = fifo_.front();
    fifo_.pop_front();
    bytes_ -= block->size;
    released->push_back(block);
  }

  const std::size_t capacity_;
  std::deque<Block*> fifo_;
  std::size_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<DebugAid> make_quarantine_aid(const Options& options) {
  if (options.quarantine_bytes == 0) return nullptr;
  return std::make_unique<QuarantineAid>(options.quarantine_bytes);
}

}  // namespace streamalloc

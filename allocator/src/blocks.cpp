#include "streamalloc/blocks.hpp"

namespace streamalloc {

const char* to_string(BlockInfo::State state) {
  switch (state) {
    case BlockInfo::State::kAllocated: return "active_allocated";
    case BlockInfo::State::kPendingFree: return "active_pending_free";
    case BlockInfo::State::kFree: return "inactive";
  }
  return "inactive";
}

}  // namespace streamalloc

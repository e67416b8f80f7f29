#include "free_lists.hpp"

namespace streamalloc {

std::size_t FreeLists::owned_count() const {
  std::size_t n = 0;
  for (const FreeIndex& index : owned_) n += index.size();
  return n;
}

std::size_t FreeLists::settled_count() const {
  std::size_t n = 0;
  for (const FreeIndex& index : settled_) n += index.size();
  return n;
}

}  // namespace streamalloc

// Storage for Block objects. Every device-locked allocation that cuts a block and every free that
// merges one makes or deletes a Block, and a Block is cache-line aligned (block.hpp), which glibc serves
// through memalign, whose cost rivals the rest of such an allocation's bookkeeping. So each thread
// keeps the memory of up to kSpareBlocks deleted Blocks for the next ones it makes; the heap sees only
// what exceeds that, and a thread's spares go back to it when the thread ends.
#include <cstddef>
#include <memory>
#include <new>

#include "block.hpp"

namespace streamalloc {
namespace {

// Under AddressSanitizer every Block goes back to the heap, so that a use after its delete is caught.
#if defined(__SANITIZE_ADDRESS__)
#define STREAMALLOC_BLOCK_SPARES 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define STREAMALLOC_BLOCK_SPARES 0
#endif
#endif
#ifndef STREAMALLOC_BLOCK_SPARES
#define STREAMALLOC_BLOCK_SPARES 256
#endif
constexpr std::size_t kSpareBlocks = STREAMALLOC_BLOCK_SPARES;
constexpr std::align_val_t kBlockAlignment{alignof(Block)};

struct Spares {
  std::size_t count = 0;
  void* slots[kSpareBlocks > 0 ? kSpareBlocks : 1];
  Spares() = default;
  Spares(const Spares&) = delete;
  Spares& operator=(const Spares&) = delete;
  ~Spares() {
    for (std::size_t i = 0; i < count; ++i) ::operator delete(slots[i], kBlockAlignment);
  }
};

// Read on every new and delete: two words of static TLS (the initial-exec model is one load, also in
// the shared library); the spares themselves are on the heap, made at the thread's first Block.
__attribute__((tls_model("initial-exec"))) thread_local Spares* t_spares = nullptr;
// Set when the thread's spares have been given back (thread exit; for the main thread, before static
// destructors, which may still delete Blocks): from then on new and delete go to the heap.
__attribute__((tls_model("initial-exec"))) thread_local bool t_spares_closed = false;

struct SparesOwner {
  std::unique_ptr<Spares> spares;
  ~SparesOwner() {
    t_spares = nullptr;
    t_spares_closed = true;
  }
};
thread_local SparesOwner t_owner;  // touched once per thread, when its spares are made

Spares* thread_spares() {
  if (t_spares == nullptr && !t_spares_closed) {
    t_owner.spares = std::make_unique<Spares>();
    t_spares = t_owner.spares.get();
  }
  return t_spares;
}

}  // namespace

std::size_t block_spares_per_thread() { return kSpareBlocks; }

void* Block::operator new(std::size_t size, std::align_val_t alignment) {
  Spares* spares = t_spares;
  if (spares != nullptr && spares->count > 0 && size == sizeof(Block) && alignment == kBlockAlignment) {
    return spares->slots[--spares->count];
  }
  return ::operator new(size, alignment);
}

void Block::operator delete(void* ptr, std::size_t size, std::align_val_t alignment) noexcept {
  if (ptr == nullptr) return;
  if (kSpareBlocks > 0 && size == sizeof(Block) && alignment == kBlockAlignment) {
    Spares* spares = nullptr;
    try {
      spares = thread_spares();
    } catch (const std::bad_alloc&) {
      // No memory for this thread's spares: the block goes back to the heap.
    }
    if (spares != nullptr && spares->count < kSpareBlocks) {
      spares->slots[spares->count++] = ptr;
      return;
    }
  }
  ::operator delete(ptr, alignment);
}

}  // namespace streamalloc

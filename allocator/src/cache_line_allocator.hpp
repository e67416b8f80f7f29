// CacheLineAllocator: a std::allocator for the containers one stream's fast path writes on every call
// (its live table, its hot list). Their storage starts on a cache line and fills whole lines, so it
// never shares a line with another stream's: a shared line would bounce between the cores of threads
// that share nothing else (docs/design.md, "Nothing shared is written on the fast path").
#pragma once

#include <cstddef>
#include <new>

namespace streamalloc {

inline constexpr std::size_t kCacheLine = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding, as std::allocator's

  T* allocate(std::size_t n) { return static_cast<T*>(::operator new (whole_lines(n), std::align_val_t{kCacheLine})); }
  void deallocate(T* p, std::size_t n) { ::operator delete (p, whole_lines(n), std::align_val_t{kCacheLine}); }

  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const {
    return false;
  }

 private:
  static std::size_t whole_lines(std::size_t n) { return (n * sizeof(T) + kCacheLine - 1) / kCacheLine * kCacheLine; }
};

}  // namespace streamalloc

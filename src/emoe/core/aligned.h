// Cache-line-aligned scratch storage for the CPU kernels (AMX tiles, AVX-512 rows).
//
// Why: operator new gives 16-byte alignment, so a kernel's packed operands started mid-line and
// every 64-byte row a tile or vector load read straddled two cache lines. On the AMX Xeon
// (2026-12-07) the dispatched experts' gather product ran at 0.9 TFLOP/s from such a buffer and at
// 1.8 from a 64-byte aligned one (compute only, BERT-base's shape).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

namespace emoe {

constexpr size_t kCacheLine = 64;

struct AlignedFree {
  void operator()(void* p) const noexcept { std::free(p); }
};

inline void* aligned_bytes(size_t bytes) {
  // aligned_alloc wants a size that is a multiple of the alignment
  void* p = std::aligned_alloc(
      kCacheLine, (std::max<size_t>(bytes, 1) + kCacheLine - 1) / kCacheLine * kCacheLine);
  if (!p) throw std::bad_alloc();
  return p;
}

// n elements of T (uninitialised), the first at a 64-byte boundary
template <class T>
using AlignedArray = std::unique_ptr<T[], AlignedFree>;

template <class T>
AlignedArray<T> aligned_array(int64_t n) {
  return AlignedArray<T>(
      static_cast<T*>(aligned_bytes(static_cast<size_t>(n < 1 ? 1 : n) * sizeof(T))));
}

// std::vector's allocator with the same alignment
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(aligned_bytes(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const noexcept {
    return false;
  }
};

template <class T>
using AlignedVector = std::vector<T, AlignedAllocator<T>>;

}  // namespace emoe

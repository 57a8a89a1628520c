// Page walks over mapped memory, for the SDK's sources; internal, no LibTorch.
#pragma once

#include <unistd.h>

#include <cstddef>

namespace launch_sdk::internal {

inline size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// Reads a byte of each page of [base, base + size) (never writes: another process may be writing
// there), so that the pages are present when next used.
inline void ReadEachPage(const void* base, size_t size) {
  unsigned sum = 0;
  for (size_t off = 0; off < size; off += PageSize()) sum += static_cast<const volatile unsigned char*>(base)[off];
  asm volatile("" : : "r"(sum));
}

// Writes a zero byte to each page of [base, base + size): for memory nobody reads.
inline void ZeroEachPage(void* base, size_t size) {
  for (size_t off = 0; off < size; off += PageSize()) static_cast<volatile char*>(base)[off] = 0;
}

}  // namespace launch_sdk::internal

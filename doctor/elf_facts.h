// What a shared library says about itself without being loaded: the libraries it needs (DT_NEEDED)
// and the GPU architectures its CUDA fat binaries hold kernels for (how `launch doctor` tells
// whether a CUDA LibTorch can run on a GPU without loading its gigabyte of code).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace launch {

// The file is read piecewise and every count and size in it is bounded before it sizes a read:
// a hostile or truncated file is an error, never a crash or a read of the whole file.
inline constexpr int kMaxElfSections = 4096;
inline constexpr int kMaxElfNeeded = 512;
inline constexpr size_t kMaxElfNameLength = 256;
inline constexpr int kMaxFatbinEntries = 1000000;

struct ElfFacts {
  std::vector<std::string> needed;  // DT_NEEDED, in file order
  bool has_fatbin = false;          // a .nv_fatbin section (CUDA device code) is there
  // "sm_80" for a kernel image (cubin) for that architecture, "compute_90" for PTX, sorted and
  // unique; empty without device code.
  std::vector<std::string> gpu_archs;
};

// Little-endian ELF64 only (x86-64, aarch64): anything else is InvalidArgument.
absl::StatusOr<ElfFacts> ReadElfFacts(const std::string& path);

}  // namespace launch

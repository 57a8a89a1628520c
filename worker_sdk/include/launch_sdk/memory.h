// Large CPU tensors with their pages present from the start. A page's first write costs a trap
// into the kernel (a page fault); a tensor of 16 MiB has 4096 of them, and a restarted worker
// meets them for everything it writes in its first steps, just when a restart is being timed. On the 2-core VM where this was measured a fault costs about 10 us, so 16 MiB
// first written page by page took 40-50 ms, made present in one madvise(MADV_POPULATE_WRITE)
// 2.5-3.5 ms. No LibTorch in this header.
#pragma once

#include <cstddef>

namespace launch_sdk {

struct PrefaultOptions {
  // CPU allocations of at least this many bytes are mapped whole and made present at once, each
  // a mapping of its own (Linux allows 65530 per process by default). 128 KiB takes in a batch's
  // activations, so that a worker started from its standby finds them in the cache the standby's
  // warm-up left (train_mlp's restart here: 0.089 s to its next step, 0.120 s with 1 MiB).
  size_t min_bytes = size_t{128} << 10;
  // Freed ones are kept, up to this many bytes in all, for the next allocation of the same
  // (page-rounded) size, so that a training loop's repeated tensors never fault again.
  size_t cache_bytes = size_t{512} << 20;
};

// Installs, for the rest of the process, a LibTorch CPU allocator (c10::SetCPUAllocator) that
// serves allocations of at least min_bytes as described above and hands smaller ones to the
// allocator it replaces. The first call installs it; later calls change nothing. A child forked
// after it (a data loader's worker process, say) starts with an empty cache: the cached pages would
// be shared with the parent, and every write to them a copy. Like LibTorch's own CPU allocator it
// reports each allocation and free to the profiler when that records memory (profile_memory),
// with the page-rounded size, the bytes it has handed out and those it holds (with its cache).
// Context::Init calls it unless LAUNCH_PREFAULT=0 or InitOptions::prefault is false.
void InstallPrefaultingCpuAllocator(const PrefaultOptions& opts = {});
bool PrefaultingCpuAllocatorInstalled();
// Bytes of freed allocations the cache holds now (0 when not installed).
size_t PrefaultingCpuAllocatorCachedBytes();
// Writes a byte of each page the cache holds, so that they stay present (a standby's keep-warm,
// launch_sdk/warm_start.h). Nothing when not installed.
void TouchPrefaultingCpuAllocatorCache();

// Makes the whole pages of [p, p + n) present and writable in one call (and, for pages shared
// copy-on-write with a parent, copies them in one call). Returns false where the kernel has no
// MADV_POPULATE_WRITE (before Linux 5.14); the pages then fault in one by one as before.
bool PrefaultForWrite(void* p, size_t n);

}  // namespace launch_sdk

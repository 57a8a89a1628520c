#include "launch_sdk/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

#include "pages.h"
#include "torch_compat.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace launch_sdk {
namespace {

using internal::PageSize;

class PrefaultingAllocator final : public c10::Allocator {
 public:
  PrefaultingAllocator(c10::Allocator* smaller, PrefaultOptions opts)
      : smaller_(smaller), smaller_raw_deleter_(smaller->raw_deleter()), opts_(opts) {}

#if LAUNCH_SDK_ALLOCATOR_NON_CONST
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    if (n < opts_.min_bytes) return smaller_->allocate(n);  // which reports to the profiler itself
    void* p = Map(n);
    return {p, p, &RawDelete, c10::Device(c10::DeviceType::CPU)};
  }

  // raw_allocate's callers free through this: either allocator's pointers.
  c10::DeleterFnPtr raw_deleter() const override { return &RawDelete; }

#if LAUNCH_SDK_ALLOCATOR_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#endif

  // After fork, in the child: what the cache holds is shared copy-on-write with the parent.
  size_t CachedBytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

  // The cached blocks are nobody's: a write changes nothing anyone reads.
  void TouchCache() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [len, p] : cached_) internal::ZeroEachPage(p, len);
  }
  // The fork was made with one thread (the standby's rule), so no lock is held.
  void DropCacheInChild() {
    for (auto& [len, p] : cached_) ::munmap(p, len);
    cached_.clear();
    cached_bytes_ = 0;
  }

 private:
  static void RawDelete(void* p);

  void* Map(size_t n) const {
    const size_t len = (n + PageSize() - 1) / PageSize() * PageSize();
    void* p = nullptr;
    size_t allocated = 0, reserved = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = cached_.find(len);
      if (it != cached_.end()) {
        p = it->second;
        cached_.erase(it);
        cached_bytes_ -= len;
        HandOut(p, len, &allocated, &reserved);
      }
    }
    if (!p) {
      p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      PrefaultForWrite(p, len);  // where the kernel cannot, the pages fault in as they are written
      std::lock_guard<std::mutex> lock(mu_);
      HandOut(p, len, &allocated, &reserved);
    }
    Report(p, static_cast<int64_t>(len), allocated, reserved);
    return p;
  }

  // Under mu_: p is live; the totals after it, for the profiler.
  void HandOut(void* p, size_t len, size_t* allocated, size_t* reserved) const {
    live_[p] = len;
    live_bytes_ += len;
    *allocated = live_bytes_;
    *reserved = live_bytes_ + cached_bytes_;
  }

  // False when p is not one of Map's.
  bool Unmap(void* p) const {
    size_t len = 0, allocated, reserved;
    bool cached = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(p);
      if (it == live_.end()) return false;
      len = it->second;
      live_.erase(it);
      live_bytes_ -= len;
      if (cached_bytes_ + len <= opts_.cache_bytes) {
        cached_.emplace(len, p);
        cached_bytes_ += len;
        cached = true;
      }
      allocated = live_bytes_;
      reserved = live_bytes_ + cached_bytes_;
    }
    if (!cached) ::munmap(p, len);
    Report(p, -static_cast<int64_t>(len), allocated, reserved);
    return true;
  }

  // To LibTorch's profiler when it records memory (profile_memory), as its own CPU allocator does:
  // the size allocated (< 0: freed), then what this allocator has handed out and what it holds.
  static void Report(void* p, int64_t size, size_t allocated, size_t reserved) {
    c10::reportMemoryUsageToProfiler(p, size, allocated, reserved, c10::Device(c10::DeviceType::CPU));
  }

  c10::Allocator* const smaller_;
  const c10::DeleterFnPtr smaller_raw_deleter_;
  const PrefaultOptions opts_;
  mutable std::mutex mu_;
  mutable std::unordered_map<void*, size_t> live_;
  mutable std::multimap<size_t, void*> cached_;
  mutable size_t cached_bytes_ = 0;
  mutable size_t live_bytes_ = 0;
};

// Never destroyed: tensors may outlive every static object.
PrefaultingAllocator* g_allocator = nullptr;
std::once_flag g_install;

void PrefaultingAllocator::RawDelete(void* p) {
  if (p && !g_allocator->Unmap(p) && g_allocator->smaller_raw_deleter_) g_allocator->smaller_raw_deleter_(p);
}

void ChildAfterFork() {
  if (g_allocator) g_allocator->DropCacheInChild();
}

}  // namespace

bool PrefaultForWrite(void* p, size_t n) {
  const auto begin = (reinterpret_cast<uintptr_t>(p) + PageSize() - 1) / PageSize() * PageSize();
  const auto end = (reinterpret_cast<uintptr_t>(p) + n) / PageSize() * PageSize();
  if (end <= begin) return true;
  return ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0;
}

void InstallPrefaultingCpuAllocator(const PrefaultOptions& opts) {
  std::call_once(g_install, [&] {
    g_allocator = new PrefaultingAllocator(c10::GetCPUAllocator(), opts);
    // Priority 1: above the default allocator's 0, so a later default registration keeps ours.
    c10::SetCPUAllocator(g_allocator, /*priority=*/1);
    ::pthread_atfork(nullptr, nullptr, &ChildAfterFork);
  });
}

void TouchPrefaultingCpuAllocatorCache() {
  if (g_allocator) g_allocator->TouchCache();
}

size_t PrefaultingCpuAllocatorCachedBytes() { return g_allocator ? g_allocator->CachedBytes() : 0; }

bool PrefaultingCpuAllocatorInstalled() { return g_allocator != nullptr && c10::GetCPUAllocator() == g_allocator; }

}  // namespace launch_sdk

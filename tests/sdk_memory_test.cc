// worker_sdk's prefaulting CPU allocator (launch_sdk/memory.h). ctest runs each test in a process
// of its own, so each installs the allocator with its own options.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "launch_sdk/memory.h"
#include "worker_sdk/src/library_pages.h"

namespace launch_sdk {
namespace {

constexpr int64_t kMiB = 1 << 20;

uintptr_t Addr(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

// What the allocator tells LibTorch's profiler, recorded as the profiler's memory reporter would
// (its totals are int64_t in LibTorch 1.x and size_t in 2.x: taken from the base class).
template <typename F>
struct ArgsOf;
template <typename C, typename R, typename... A>
struct ArgsOf<R (C::*)(A...)> {
  using Tuple = std::tuple<A...>;
};
using ReportedTotal =
    std::tuple_element_t<2, ArgsOf<decltype(&c10::MemoryReportingInfoBase::reportMemoryUsage)>::Tuple>;

struct Reported {
  void* ptr;
  int64_t size, allocated, reserved;
};

class MemoryRecorder final : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* ptr, int64_t size, ReportedTotal allocated, ReportedTotal reserved,
                         c10::Device device) override {
    if (device.is_cpu()) events.push_back({ptr, size, static_cast<int64_t>(allocated), static_cast<int64_t>(reserved)});
  }
  bool memoryProfilingEnabled() const override { return true; }
  std::vector<Reported> events;
};

TEST(PrefaultingAllocator, ReportsEachLargeAllocationAndFreeToTheProfiler) {
  InstallPrefaultingCpuAllocator();
  auto recorder = std::make_shared<MemoryRecorder>();
  void* first = nullptr;
  {
    c10::DebugInfoGuard profiling(c10::DebugInfoKind::PROFILER_STATE, recorder);
    at::Tensor big = at::empty({kMiB}, at::kFloat);  // 4 MiB, mapped
    first = big.data_ptr();
    big.reset();                                     // to the cache
    at::Tensor again = at::empty({kMiB}, at::kFloat);  // from the cache: an allocation all the same
    EXPECT_EQ(again.data_ptr(), first);
  }  // `again` is freed before the guard goes
  std::vector<Reported> mine;
  for (const Reported& e : recorder->events)
    if (e.ptr == first) mine.push_back(e);
  ASSERT_EQ(mine.size(), 4u);
  EXPECT_EQ(mine[0].size, 4 * kMiB);
  EXPECT_EQ(mine[1].size, -4 * kMiB);
  EXPECT_EQ(mine[2].size, 4 * kMiB);
  EXPECT_EQ(mine[3].size, -4 * kMiB);
  // Handed out: the tensor's bytes while it lives, not once freed; held: the cache's as well.
  EXPECT_GE(mine[0].allocated, 4 * kMiB);
  EXPECT_EQ(mine[1].allocated, mine[0].allocated - 4 * kMiB);
  EXPECT_GE(mine[1].reserved, mine[1].allocated + 4 * kMiB);
  EXPECT_EQ(mine[2].allocated, mine[0].allocated);
  EXPECT_EQ(mine[2].reserved, mine[1].reserved);  // taken from the cache: held already
  // Without a reporter nothing is said, and nothing breaks.
  const size_t before = recorder->events.size();
  at::Tensor quiet = at::ones({kMiB}, at::kFloat);
  EXPECT_EQ(quiet.sum().item<float>(), static_cast<float>(kMiB));
  quiet.reset();
  EXPECT_EQ(recorder->events.size(), before);
}

TEST(PrefaultingAllocator, LargeTensorsArePagesOfTheirOwnAndAFreedOneServesTheNextOfItsSize) {
  EXPECT_FALSE(PrefaultingCpuAllocatorInstalled());
  InstallPrefaultingCpuAllocator();
  ASSERT_TRUE(PrefaultingCpuAllocatorInstalled());
  at::Tensor big = at::empty({kMiB}, at::kFloat);  // 4 MiB
  EXPECT_EQ(Addr(big) % ::sysconf(_SC_PAGESIZE), 0u);
  const uintptr_t first = Addr(big);
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), 0u);
  big.reset();
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{4} * kMiB);
  at::Tensor again = at::empty({kMiB}, at::kFloat);
  EXPECT_EQ(Addr(again), first);
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), 0u);
  // Another size does not take it.
  again.reset();
  at::Tensor other = at::empty({kMiB + 4096}, at::kFloat);
  EXPECT_NE(Addr(other), first);
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{4} * kMiB);
}

TEST(PrefaultingAllocator, ArithmeticOnLargeAndSmallTensorsIsUnchanged) {
  InstallPrefaultingCpuAllocator();
  at::Tensor a = at::arange(3 * kMiB, at::kDouble);  // 24 MiB, ours
  at::Tensor b = at::ones({3 * kMiB}, at::kDouble);
  const double n = 3.0 * kMiB;
  EXPECT_DOUBLE_EQ((a + b).sum().item<double>(), n * (n - 1) / 2 + n);
  at::Tensor small = at::full({10}, 2.5);  // below min_bytes: the allocator it replaced
  EXPECT_DOUBLE_EQ(small.sum().item<double>(), 25.0);
  at::Tensor m = at::randn({1024, 1024});
  EXPECT_TRUE(at::allclose(m.matmul(at::eye(1024)), m));
}

TEST(PrefaultingAllocator, TheCacheKeepsNoMoreThanItsBound) {
  PrefaultOptions o;
  o.min_bytes = kMiB;
  o.cache_bytes = 5 * kMiB;
  InstallPrefaultingCpuAllocator(o);
  {
    std::vector<at::Tensor> three;
    for (int i = 0; i < 3; ++i) three.push_back(at::empty({3 * kMiB}, at::kByte));
  }  // 9 MiB freed; one 3 MiB block fits the 5 MiB bound
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{3} * kMiB);
  at::Tensor below = at::empty({kMiB - 1}, at::kByte);
  below.reset();
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{3} * kMiB);
}

TEST(PrefaultingAllocator, RawAllocationsOfEitherSizeAreFreedByTheRawDeleter) {
  InstallPrefaultingCpuAllocator();
  c10::Allocator* a = c10::GetCPUAllocator();
  ASSERT_NE(a->raw_deleter(), nullptr);
  for (size_t n : {size_t{100}, size_t{2 * kMiB}}) {
    void* p = a->raw_allocate(n);
    ASSERT_NE(p, nullptr);
    static_cast<char*>(p)[n - 1] = 1;
    a->raw_deallocate(p);
  }
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{2} * kMiB);
}

TEST(PrefaultingAllocator, AForkedChildStartsWithAnEmptyCache) {
  InstallPrefaultingCpuAllocator();
  at::empty({kMiB}, at::kFloat).reset();
  ASSERT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{4} * kMiB);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Exit codes: 0 right, 1 the cache was inherited, 2 a new tensor is wrong.
    if (PrefaultingCpuAllocatorCachedBytes() != 0) ::_exit(1);
    at::Tensor t = at::full({kMiB}, 3.0f);
    ::_exit(t.sum().item<double>() == 3.0 * kMiB ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{4} * kMiB);  // the parent's is whole
}

// How many of the pages of [p, p + n) are present (mincore).
size_t Present(void* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((n + page - 1) / page);
  if (::mincore(p, n, in.data()) != 0) return 0;
  size_t k = 0;
  for (unsigned char c : in) k += c & 1;
  return k;
}

// A standby's keep-warm (launch_sdk/warm_start.h) makes each page the cache holds present again.
TEST(PrefaultingAllocator, TouchingTheCacheMakesItsPagesPresent) {
  char probe[8192];
  if (!PrefaultForWrite(probe, sizeof probe)) GTEST_SKIP() << "no MADV_POPULATE_WRITE (Linux < 5.14)";
  InstallPrefaultingCpuAllocator();
  at::Tensor big = at::empty({kMiB}, at::kFloat);  // 4 MiB
  void* p = big.data_ptr();
  const size_t pages = size_t{4} * kMiB / static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  EXPECT_EQ(Present(p, 4 * kMiB), pages);
  big.reset();  // into the cache
  ASSERT_EQ(PrefaultingCpuAllocatorCachedBytes(), size_t{4} * kMiB);
  ASSERT_EQ(::madvise(p, 4 * kMiB, MADV_DONTNEED), 0);  // as if reclaimed
  EXPECT_EQ(Present(p, 4 * kMiB), 0u);
  TouchPrefaultingCpuAllocatorCache();
  EXPECT_EQ(Present(p, 4 * kMiB), pages);
}

TEST(PrefaultForWrite, PopulatesAnyRangeItsPagesCover) {
  std::vector<char> buf(3 * kMiB + 123);
  EXPECT_TRUE(PrefaultForWrite(buf.data() + 7, buf.size() - 7));
  EXPECT_TRUE(PrefaultForWrite(buf.data(), 0));
  EXPECT_TRUE(PrefaultForWrite(buf.data() + 1, 10));  // within one page: nothing to do
}

TEST(LibraryPages, OnlyReadOnlyPrivateMappingsOfSharedLibrariesQualify) {
  using internal::IsLibraryMapping;
  const std::string head = "7f3ce3920000-7f3ce5a55000 ";
  EXPECT_TRUE(IsLibraryMapping(head + "r-xp 00100000 fe:00 1234   /usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13.0"));
  EXPECT_TRUE(IsLibraryMapping(head + "r--p 00000000 fe:00 1234   /usr/lib/x86_64-linux-gnu/libc.so.6"));
  EXPECT_TRUE(IsLibraryMapping(head + "r--p 00000000 fe:00 1234   /opt/my libs/libx.so"));
  EXPECT_FALSE(IsLibraryMapping(head + "rw-p 00000000 fe:00 1234   /usr/lib/x86_64-linux-gnu/libc.so.6")) << "writable";
  EXPECT_FALSE(IsLibraryMapping(head + "r--s 00000000 fe:00 1234   /usr/lib/libshared.so")) << "shared";
  EXPECT_FALSE(IsLibraryMapping(head + "r--p 00000000 00:00 0 ")) << "anonymous";
  EXPECT_FALSE(IsLibraryMapping(head + "r--p 00000000 00:00 0      [vvar]"));
  EXPECT_FALSE(IsLibraryMapping(head + "r-xp 00000000 fe:00 1234   /usr/bin/python3.11")) << "a program";
  EXPECT_FALSE(IsLibraryMapping(head + "r--p 00000000 fe:00 1234   /usr/lib/libold.so.1 (deleted)"));
  EXPECT_FALSE(IsLibraryMapping(head + "r--p 00000000 00:05 1234   /dev/nvidiactl")) << "a device";
  EXPECT_FALSE(IsLibraryMapping("Rss:                 120 kB"));
}

// The resident kB of this process's mappings whose smaps header `takes`; -1 when it takes none.
long RssKb(const std::function<bool(const std::string& header)>& takes) {
  std::ifstream smaps("/proc/self/smaps");
  long kb = -1;
  bool taken = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.rfind("Rss:", 0) == 0) {
      if (taken) kb = std::max(kb, 0L) + std::stol(line.substr(4));
    } else if (line.find('-') < line.find(' ') && line.find(' ') < line.find(':')) {
      taken = takes(line);
    }
  }
  return kb;
}

long LibraryRssKb() { return RssKb(internal::IsLibraryMapping); }

TEST(LibraryPages, DroppedPagesLeaveTheProcessAndComeBackWhenUsed) {
  const at::Tensor before = at::arange(1000, at::kFloat).sum();
  const long rss = LibraryRssKb();
  ASSERT_GT(rss, 1024) << "LibTorch is loaded: more than 1 MB of its libraries is resident";
  EXPECT_GT(internal::DropLibraryPages(), 0u);
  EXPECT_LT(LibraryRssKb(), rss);
  // LibTorch's code comes back from the page cache.
  EXPECT_TRUE(at::equal(at::arange(1000, at::kFloat).sum(), before));
}

// The resident kB of the mapping that starts at `at` (-1: none).
long MappingRssKb(const void* at) {
  return RssKb([at](const std::string& header) {
    return std::stoul(header.substr(0, header.find('-')), nullptr, 16) == reinterpret_cast<uintptr_t>(at);
  });
}

// A page the process wrote in a mapping it then made read-only (as the loader relocates a
// library's RELRO part) is its own: dropping it would bring back the file's bytes.
TEST(LibraryPages, APageOfItsOwnInAReadOnlyLibraryMappingIsKept) {
  char dir[] = "/tmp/library_pages_test.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/libfake.so.1";
  {
    std::ofstream f(path, std::ios::binary);
    f << std::string(8192, 'a');
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);  // written back: smaps counts a dirty file page as the mapping's own
  auto* relocated = static_cast<char*>(::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0));
  auto* clean = static_cast<char*>(::mmap(nullptr, 8192, PROT_READ, MAP_PRIVATE, fd, 0));
  ::close(fd);
  ASSERT_NE(relocated, MAP_FAILED);
  ASSERT_NE(clean, MAP_FAILED);
  relocated[0] = 'Z';
  ASSERT_EQ(::mprotect(relocated, 8192, PROT_READ), 0);
  volatile char c = clean[0] + clean[4096];
  (void)c;
  ASSERT_EQ(MappingRssKb(clean), 8);
  internal::DropLibraryPages();
  EXPECT_EQ(relocated[0], 'Z');
  EXPECT_EQ(MappingRssKb(clean), 0) << "a clean mapping of the library is dropped";
  EXPECT_EQ(clean[0], 'a');
  ::munmap(relocated, 8192);
  ::munmap(clean, 8192);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace launch_sdk

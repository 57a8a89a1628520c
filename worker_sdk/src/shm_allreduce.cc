#include "launch_sdk/shm_allreduce.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "premap.h"

namespace launch_sdk {
namespace {

constexpr uint32_t kMagic = 0x4c534d31;  // "LSM1"

std::runtime_error SysError(const std::string& what, const std::string& name) {
  return std::runtime_error("shm allreduce: " + what + " " + name + ": " + std::strerror(errno));
}

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

struct ShmAllreduce::Control {
  uint32_t magic;
  uint32_t size;
  uint64_t slot_bytes;  // every rank's must match: the slots' places depend on it
  alignas(64) std::atomic<uint32_t> arrived;
  alignas(64) std::atomic<uint32_t> generation;
  std::atomic<uint32_t> waiters;
  // Set by a rank whose barrier failed: the segment's counts are stale, so every rank gives up
  // at once instead of waiting out its own timeout (or mismatching arrivals later).
  std::atomic<uint32_t> poisoned;
};

void ShmWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

ShmAllreduce::ShmAllreduce(const std::string& name, int rank, int size, std::chrono::milliseconds timeout,
                           size_t slot_bytes)
    : name_(name), owner_(false), rank_(rank), size_(size), timeout_(timeout), slot_bytes_(slot_bytes) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("shm allreduce: rank " + std::to_string(rank) + " of " + std::to_string(size));
  control_bytes_ = (sizeof(Control) + 4095) / 4096 * 4096;
  map_bytes_ = control_bytes_ + static_cast<size_t>(size + 1) * slot_bytes_;
}

ShmAllreduce::ShmAllreduce(const std::string& name, bool create, int rank, int size, std::chrono::milliseconds timeout,
                           size_t slot_bytes)
    : ShmAllreduce(name, rank, size, timeout, slot_bytes) {
  // From here on a throw runs the destructor, which unlinks only what owner_ says this made.
  int fd = create ? shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600) : shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw SysError(create ? "cannot create" : "cannot open", name);
  owner_ = create;
  if (create) {
    // Reserve the pages now: a full /dev/shm is an error here, not a SIGBUS mid-training.
    int rc = posix_fallocate(fd, 0, static_cast<off_t>(map_bytes_));
    if (rc != 0) {
      errno = rc;
      close(fd);
      throw SysError("cannot reserve " + std::to_string(map_bytes_) + " bytes for", name);
    }
  } else {
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != map_bytes_) {
      close(fd);
      throw std::runtime_error("shm allreduce: " + name + " has the wrong size for " + std::to_string(size) + " ranks");
    }
  }
  void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) throw SysError("cannot map", name);
  base_ = static_cast<char*>(p);
  mapped_bytes_ = map_bytes_;
  TakeControl(create);
  StartThread();
}

std::unique_ptr<ShmAllreduce> ShmAllreduce::InFile(const std::string& path, bool reset, int rank, int size,
                                                   std::chrono::milliseconds timeout, size_t slot_bytes) {
  std::unique_ptr<ShmAllreduce> s(new ShmAllreduce(path, rank, size, timeout, slot_bytes));
  s->in_file_ = true;
  s->MapFile(reset);
  s->StartThread();
  return s;
}

void ShmAllreduce::MapFile(bool reset) {
  int fd = -1;
  size_t file_bytes = 0;
  if (std::optional<internal::Premapped> m = internal::TakePremapped(name_)) {
    fd = m->fd;
    base_ = static_cast<char*>(m->base);
    mapped_bytes_ = file_bytes = m->size;
  } else {
    fd = open(name_.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) throw SysError("cannot open", name_);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      throw std::runtime_error("shm allreduce: " + name_ + " is not a regular file");
    }
    file_bytes = static_cast<size_t>(st.st_size);
  }
  // A throw from here on leaves base_ (when set) to the destructor.
  auto fail = [&](const std::string& what) {
    const int e = errno;
    close(fd);
    errno = e;
    return SysError(what, name_);
  };
  if (file_bytes < map_bytes_) {
    if (!reset) {
      close(fd);
      throw std::runtime_error("shm allreduce: " + name_ + " is too small for " + std::to_string(size_) + " ranks");
    }
    // Reserved now: a full memory is an error here, not a SIGBUS mid-training.
    const int rc = posix_fallocate(fd, 0, static_cast<off_t>(map_bytes_));
    if (rc != 0) {
      errno = rc;
      throw fail("cannot reserve " + std::to_string(map_bytes_) + " bytes for");
    }
    if (base_) munmap(base_, mapped_bytes_);  // of the smaller file
    base_ = nullptr;
    file_bytes = map_bytes_;
  }
  if (!base_) {
    void* p = mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) throw fail("cannot map");
    base_ = static_cast<char*>(p);
    mapped_bytes_ = file_bytes;
  }
  close(fd);
  // Reset: no rank of this group has opened it yet, and no process of an earlier one runs.
  TakeControl(reset);
}

void ShmAllreduce::TakeControl(bool fresh) {
  ctl_ = reinterpret_cast<Control*>(base_);
  if (fresh) {
    new (ctl_) Control();
    ctl_->size = static_cast<uint32_t>(size_);
    ctl_->slot_bytes = slot_bytes_;
    ctl_->magic = kMagic;
  } else if (ctl_->magic != kMagic || ctl_->size != static_cast<uint32_t>(size_) || ctl_->slot_bytes != slot_bytes_) {
    throw std::runtime_error("shm allreduce: " + name_ + " is not a segment for " + std::to_string(size_) + " ranks");
  }
}

void ShmAllreduce::StartThread() {
  thread_ = std::thread([this] { Loop(); });
}

ShmAllreduce::~ShmAllreduce() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();  // not after a constructor that threw
  if (owner_) Unlink();
  if (base_) munmap(base_, mapped_bytes_);
}

void ShmAllreduce::Unlink() {
  if (!owner_) return;
  shm_unlink(name_.c_str());  // an ENOENT means it is gone already
  owner_ = false;
}

std::shared_ptr<ShmWork> ShmAllreduce::Allreduce(at::Tensor t) {
  if (!t.is_contiguous() || !t.device().is_cpu())
    throw std::invalid_argument("shm allreduce: expected a contiguous CPU tensor");
  auto work = std::make_shared<ShmWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(t), work);
  }
  cv_.notify_one();
  return work;
}

void ShmAllreduce::Loop() {
  for (;;) {
    std::pair<at::Tensor, std::shared_ptr<ShmWork>> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left to run
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    if (!broken_.empty()) {
      error = std::make_exception_ptr(
          std::runtime_error("shm allreduce: unusable after an earlier failure (" + broken_ + ")"));
    } else {
      try {
        Run(item.first);
      } catch (const std::exception& e) {
        broken_ = e.what();
        error = std::current_exception();
      } catch (...) {
        broken_ = "unknown error";
        error = std::current_exception();
      }
    }
    ShmWork& w = *item.second;
    {
      std::lock_guard<std::mutex> lock(w.mu_);
      w.done_ = true;
      w.error_ = error;
    }
    w.cv_.notify_all();
  }
}

void ShmAllreduce::Run(at::Tensor& t) {
  at::NoGradGuard no_grad;
  at::Tensor flat = t.view({-1});
  const int64_t total = flat.numel();
  const int64_t per_chunk = static_cast<int64_t>(slot_bytes_ / t.element_size());
  const auto opts = t.options();
  for (int64_t off = 0; off < total; off += per_chunk) {
    const int64_t n = std::min(per_chunk, total - off);
    at::Tensor mine = flat.narrow(0, off, n);
    std::memcpy(Slot(rank_), mine.data_ptr(), static_cast<size_t>(n) * t.element_size());
    Barrier();  // every rank's chunk is in its slot
    const int64_t lo = n * rank_ / size_, hi = n * (rank_ + 1) / size_;
    if (hi > lo) {
      auto slice = [&](char* at) { return at::from_blob(at + lo * t.element_size(), {hi - lo}, opts); };
      at::Tensor out = slice(Result());
      if (size_ == 1) out.copy_(slice(Slot(0)));
      else at::add_out(out, slice(Slot(0)), slice(Slot(1)));
      for (int r = 2; r < size_; ++r) out.add_(slice(Slot(r)));
    }
    Barrier();  // every slice of the sums is in the result
    std::memcpy(mine.data_ptr(), Result(), static_cast<size_t>(n) * t.element_size());
    // The next chunk's first barrier keeps anyone from overwriting the result before all read it.
  }
}

void ShmAllreduce::Barrier() {
  Control& c = *ctl_;
  auto given_up = [&] {
    return std::runtime_error("shm allreduce: rank " + std::to_string(rank_) +
                              ": another local rank gave up on a collective");
  };
  if (c.poisoned.load(std::memory_order_acquire)) throw given_up();
  const uint32_t gen = c.generation.load(std::memory_order_acquire);
  if (c.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    c.arrived.store(0, std::memory_order_relaxed);
    c.generation.fetch_add(1, std::memory_order_seq_cst);
    if (c.waiters.load(std::memory_order_seq_cst) > 0) Futex(&c.generation, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  // Peers usually arrive within microseconds: spin briefly, then sleep on the futex.
  for (int i = 0; i < 4000; ++i) {
    if (c.generation.load(std::memory_order_acquire) != gen) return;
    if (c.poisoned.load(std::memory_order_relaxed)) throw given_up();
    CpuRelax();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  c.waiters.fetch_add(1, std::memory_order_seq_cst);
  while (c.generation.load(std::memory_order_seq_cst) == gen) {
    if (c.poisoned.load(std::memory_order_seq_cst)) {
      c.waiters.fetch_sub(1, std::memory_order_seq_cst);
      throw given_up();
    }
    auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds::zero()) {
      c.waiters.fetch_sub(1, std::memory_order_seq_cst);
      // Wake the others: they must not wait out their own timeouts on a barrier that cannot end.
      c.poisoned.store(1, std::memory_order_seq_cst);
      Futex(&c.generation, FUTEX_WAKE, INT_MAX, nullptr);
      throw std::runtime_error("shm allreduce: rank " + std::to_string(rank_) + " waited " +
                               std::to_string(timeout_.count()) + " ms for the other local ranks");
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    Futex(&c.generation, FUTEX_WAIT, gen, &ts);  // EAGAIN when it changed already
  }
  c.waiters.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace launch_sdk

// All-reduce (sum) through one shared-memory segment, for ranks that share a host. Gloo's TCP
// transport costs about 1.7 ms per 100 KB between two processes on one machine; this costs a copy
// in, a 1/N-th slice of the sums and a copy out, with two cross-process barriers per chunk.
//
// Collectives run on a thread of their own, in submission order, so they overlap the caller's
// work (backward) as c10d's do. Every rank must submit the same sequence of tensors (same sizes
// and types). Each element is summed in rank order by exactly one rank, so every rank gets
// bit-identical results.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <ATen/core/Tensor.h>

namespace launch_sdk {

class ShmWork {
 public:
  // Blocks until the collective ran; rethrows its error (a timeout waiting for a peer).
  void wait();

 private:
  friend class ShmAllreduce;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class ShmAllreduce {
 public:
  static constexpr size_t kDefaultSlotBytes = 2u << 20;

  // Rank `rank` of `size` ranks: the creator makes the segment `name` (a POSIX shm name, "/...")
  // and the others open it; throws std::runtime_error naming the segment and errno on failure.
  // The creator should Unlink() once every rank has opened it.
  ShmAllreduce(const std::string& name, bool create, int rank, int size,
               std::chrono::milliseconds timeout, size_t slot_bytes = kDefaultSlotBytes);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // Sums `t` (contiguous, CPU) over the ranks, in place, asynchronously.
  std::shared_ptr<ShmWork> Allreduce(at::Tensor t);
  void Unlink();
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct Control;
  void Loop();
  void Run(at::Tensor& t);
  void Barrier();
  char* Slot(int r) const { return base_ + control_bytes_ + static_cast<size_t>(r) * slot_bytes_; }
  char* Result() const { return Slot(size_); }

  std::string name_;
  bool owner_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  size_t slot_bytes_, control_bytes_, map_bytes_ = 0;
  char* base_ = nullptr;
  Control* ctl_ = nullptr;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<at::Tensor, std::shared_ptr<ShmWork>>> queue_;
  bool stop_ = false;
  // After a failed collective the arrival count is stale: every later one fails at once with this.
  std::string broken_;  // only the worker thread touches it
  std::thread thread_;
};

}  // namespace launch_sdk

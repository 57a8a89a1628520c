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
  ShmAllreduce(const std::string& name, bool create, int rank, int size, std::chrono::milliseconds timeout,
               size_t slot_bytes = kDefaultSlotBytes);
  // Rank `rank` of `size` ranks through the regular file at `path`, which outlives them and serves
  // one group after another (launch's, LAUNCH_SHM_ALLREDUCE_MEMORY): with `reset`, the file is
  // grown to the size this group needs (never shrunk: an earlier group's processes may still map
  // it) and its control words are set for this group; every other rank opens it after that. A
  // mapping a standby made of it (launch_sdk/warm_start.h) is used while the file keeps its size.
  // Nothing to unlink. Throws std::runtime_error naming the file (and errno) when it cannot be
  // used, std::invalid_argument for a rank outside 0..size-1.
  static std::unique_ptr<ShmAllreduce> InFile(const std::string& path, bool reset, int rank, int size,
                                              std::chrono::milliseconds timeout, size_t slot_bytes = kDefaultSlotBytes);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // Sums `t` (contiguous, CPU) over the ranks, in place, asynchronously.
  std::shared_ptr<ShmWork> Allreduce(at::Tensor t);
  void Unlink();
  int rank() const { return rank_; }
  // Whether it goes through a file that outlives the group (InFile), not a segment of its own.
  bool in_file() const { return in_file_; }
  int size() const { return size_; }

 private:
  struct Control;
  ShmAllreduce(const std::string& name, int rank, int size, std::chrono::milliseconds timeout, size_t slot_bytes);
  void MapFile(bool reset);
  // The control words at base_: set for this group (fresh), else checked to be for its size and
  // slot_bytes.
  void TakeControl(bool fresh);
  void StartThread();
  void Loop();
  void Run(at::Tensor& t);
  void Barrier();
  char* Slot(int r) const { return base_ + control_bytes_ + static_cast<size_t>(r) * slot_bytes_; }
  char* Result() const { return Slot(size_); }

  std::string name_;
  bool owner_;
  bool in_file_ = false;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  size_t slot_bytes_, control_bytes_, map_bytes_ = 0;
  size_t mapped_bytes_ = 0;  // map_bytes_, or more where a larger file was mapped whole
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

// Checkpoint/resume: model, optimizer, step, epoch, sampler position, RNG state and the loss scale,
// saved as a snapshot of the tensors' bytes with a checksum and written atomically (temp file,
// fsync, rename) by rank 0, which keeps the last K; every rank loads the newest valid one; a
// truncated or corrupt file is reported and skipped.
//
// Under launch (LAUNCH_CHECKPOINT_MEMORY) a Checkpointer made with the worker's Context keeps each
// rank's latest snapshots in memory the node agent owns, so that they outlive the worker: the
// training loop stalls only for the copy into that memory, rank 0 writes the file on a background
// thread, and a restart resumes from memory when the memory copy is at least as new as the newest
// file (the ranks agree on the step they resume from).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace launch_sdk {

class Context;

struct TrainState {
  int64_t step = 0;  // steps completed
  int64_t epoch = 0;
  int64_t sampler_position = 0;  // samples of this epoch already consumed (per rank)
  double loss_scale = 0;         // GradScaler's scale (0: no scaler)
  int64_t scaler_growth_tracker = 0;
};

struct CheckpointOptions {
  int keep_last = 3;  // files kept
  // Keep snapshots in the agent's memory (when launch gave some) and write files in the
  // background; false: every save is on disk before Save returns.
  bool in_memory = true;
};

class Checkpointer {
 public:
  // Files only, each written before Save returns; LoadLatest loads this process's newest.
  Checkpointer(std::string dir, int keep_last = 3);
  // With the ranks of `ctx`: every rank keeps its snapshots in the agent's memory when launch gave
  // some (one line on stderr says why not otherwise; one Checkpointer of a process at a time has
  // them), and LoadLatest agrees with the other ranks.
  Checkpointer(std::string dir, const Context& ctx, CheckpointOptions opts = {});
  // Waits for the file being written.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Snapshots the state; rank 0 writes ckpt-<step>.lck. Without memory only rank 0 does anything.
  // Throws on I/O errors (a background write's error at the next Save or Flush).
  void Save(const TrainState& state, torch::nn::Module& model, torch::optim::Optimizer& optim, int rank);
  // Loads the newest checkpoint that verifies (memory or file); corrupt ones are reported on stderr
  // and skipped. Made with a Context it is a collective: every rank calls it (as every rank calls
  // Save, so that each has its memory copy).
  std::optional<TrainState> LoadLatest(torch::nn::Module& model, torch::optim::Optimizer& optim);
  // Waits until the last save is on disk; rethrows its error.
  void Flush();
  // Paths of the checkpoint files, oldest first.
  std::vector<std::string> List() const;
  const std::string& dir() const { return dir_; }
  // Whether snapshots go to the agent's memory.
  bool in_memory() const { return !slots_.empty(); }
  // How long the training loop waited in the last Save, and where the last LoadLatest loaded from
  // ("memory", a file's path, or "" for nothing).
  double last_stall_seconds() const { return last_stall_seconds_; }
  const std::string& loaded_from() const { return loaded_from_; }

  class Slot;  // a snapshot's place: the agent's memory, or this process's

 private:
  struct Job {
    Slot* slot = nullptr;
    bool write_file = false;
    size_t reserve = 0;  // nonzero: only make room for a payload this large
  };
  void Complete(const Job& job);  // the checksum, and the slot marked complete (or the room made)
  void WriterLoop();              // completes each job in order, then hands its file to the file thread
  void FileLoop();                // writes the files: a slow disk never holds back the next save's completion
  void WaitIdle(std::unique_lock<std::mutex>& lock);
  void WaitFor(Slot* slot, std::unique_lock<std::mutex>& lock);  // until both threads are done with it
  void RethrowWriterError(std::unique_lock<std::mutex>& lock);
  void NoteWriterError(const Slot& slot, const std::exception& e);  // from a catch, without mu_
  bool Filing(const Slot* slot) const;                              // under mu_: its file is queued or being written
  void WriteFile(const Slot& slot);

  std::string dir_;
  int keep_last_;
  const Context* ctx_ = nullptr;
  std::vector<std::unique_ptr<Slot>> slots_;  // in the agent's memory: two, used in turn
  std::unique_ptr<Slot> local_;               // without memory
  bool owns_memory_ = false;                  // this one has the process's memory slots
  double last_stall_seconds_ = 0;
  std::string loaded_from_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;       // handed to the writer, in order
  Slot* busy_ = nullptr;       // the slot the writer works on
  std::deque<Slot*> files_;    // complete slots whose files are to be written, in order
  Slot* filing_ = nullptr;     // the slot whose file is being written
  Slot* last_slot_ = nullptr;  // of the last save
  bool stop_ = false;
  std::exception_ptr writer_error_;
  std::thread writer_, filer_;
};

// In a standby, before its go (Context::Init calls it): maps this rank's slots of the agent's
// memory (LAUNCH_CHECKPOINT_MEMORY) that hold a snapshot and reads a byte of each page, so that
// the worker it becomes resumes through mappings whose pages it has touched (the first pass over
// a new mapping cost 20-35 ms for 15 MB here, the next 1-2 ms). The worker's Checkpointer takes
// them while the files keep their size; a file that grew since is mapped again.
void PremapCheckpointMemory();
// Reads a byte of each page a standby mapped ahead and no worker took yet: PremapCheckpointMemory's,
// and launch's file for the all-reduce segment that Context::Init maps in a standby (a standby's
// keep-warm, launch_sdk/warm_start.h).
void TouchPremappedCheckpointMemory();

// 64-bit FNV-1a, the checksum of the first file format's payload.
uint64_t Fnv1a64(const void* data, size_t n);
// The checksum of snapshots (memory and files): four 64-bit multiply-rotate lanes over 8-byte
// words, several GB/s.
uint64_t Checksum64(const void* data, size_t n);

}  // namespace launch_sdk

// The agent's live view of its node: every --monitor-interval it samples each worker (steps,
// CPU, memory, threads), the GPUs and the node, appends the sample to metrics.jsonl, sends it to
// the coordinator and prints the straggler events the coordinator answers with.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <thread>
#include <vector>

#include "rendezvous/coordinator_client.h"
#include "agent/live_ranks.h"
#include "probes/nvml.h"
#include "common/clock.h"
#include "common/unique_fd.h"
#include "launch.pb.h"

namespace launch {

// A /proc file (small by nature; at most 64 KiB is read); nullopt if it cannot be opened.
std::optional<std::string> ReadProcFile(const std::string& path);
// /proc/<pid>/stat: CPU time (user + system, in clock ticks), threads and parent. The command name
// may hold spaces and parentheses: fields are counted after its last ')'.
struct ProcStat {
  uint64_t cpu_ticks = 0;
  int threads = 0;
  bool exited = false;  // a zombie (Z) or dead (X): it has exited and waits to be reaped
  int ppid = 0;
};
std::optional<ProcStat> ParseProcStat(absl::string_view text);
// /proc/<pid>/statm: resident pages (its second field).
std::optional<int64_t> ParseStatmResidentPages(absl::string_view text);
// /proc/meminfo: MemTotal and MemAvailable, in bytes.
struct MemInfo {
  int64_t total_bytes = 0;
  int64_t available_bytes = 0;
};
std::optional<MemInfo> ParseMeminfo(absl::string_view text);
// /proc/loadavg: the 1-minute load.
std::optional<double> ParseLoadavg(absl::string_view text);

// NVML's figures of one GPU as a sample carries them.
v1::GpuSample ToGpuSample(const GpuFigures& g);
// Samples the GPUs through `nvml` (shared: the monitor's thread calls it).
std::function<std::vector<v1::GpuSample>()> NvmlGpuSampler(std::shared_ptr<Nvml> nvml);

// A straggler event as the console shows it.
std::string DescribeStragglerEvent(const v1::StragglerEvent& e);

class Monitor {
 public:
  struct Options {
    std::chrono::milliseconds interval{5000};
    std::string run_id, node_id, hostname;
    // Each sample is appended here as one JSON line (empty: no file).
    std::string metrics_file;
    // Where samples go (nullptr: nowhere); the coordinator answers with straggler events.
    CoordinatorClient* coordinator = nullptr;
    // The GPUs' figures now (unset: no GPUs sampled).
    std::function<std::vector<v1::GpuSample>()> gpus;
    // Where /proc and /dev/shm are (tests point them at fixtures).
    std::string proc_dir = "/proc";
    std::string shm_dir = "/dev/shm";
  };
  Monitor(Options opts, LiveRanks* ranks, const Clock* clock);
  ~Monitor();  // Stop()
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  // The sampling thread: one sample every interval until Stop.
  void Start();
  void Stop();
  // The round the workers now run in (samples say it; the coordinator keeps only the newest).
  void SetRound(int64_t round);

  // One sample now, as the thread takes it: read, written to the file, sent, its events printed.
  v1::SampleRequest SampleOnce();
  // What one sample holds now (no file, no RPC).
  v1::SampleRequest Collect();

 private:
  void Loop();
  void Write(const v1::SampleRequest& s);
  void Send(const v1::SampleRequest& s);

  Options opts_;
  LiveRanks* ranks_;
  const Clock* clock_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;  // mu_
  int64_t round_ = 0;      // mu_
  std::thread thread_;
  // Sampling thread only.
  struct CpuMark {
    uint64_t ticks = 0;
    Clock::TimePoint at;
  };
  std::map<pid_t, CpuMark> cpu_marks_;
  uint64_t events_seen_ = 0;
  UniqueFd metrics_fd_;
  bool write_failed_ = false, send_failed_ = false;
};

}  // namespace launch

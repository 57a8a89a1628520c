// torchrun's file-based watchdog timer (torch.distributed.elastic.timer.FileTimerServer): a worker
// takes a deadline per scope through a FIFO, and one past its deadline gets the signal it named.
//
// The contract (torch's FileTimerClient, 1.13 to now): one JSON object a line, at most PIPE_BUF
// bytes, {"version":1,"pid":P,"scope_id":S,"expiration_time":T,"signal":N}; T is seconds since
// the epoch (time.time() + after), a negative T releases (pid, scope), a new T for a held scope
// replaces it. When any timer of a pid expires, the pid gets the signal of its earliest expired
// timer that has one (N <= 0: none, the timer just ends), and every timer of that pid is dropped.
// Unlike torch, only the current attempt's workers can be signalled (torch signals any pid a
// line names), and launch itself never is (newer torch also signals its own agent).
//
// Why a thread of its own rather than a descriptor in the worker group's loop: the timer belongs
// to the run, not to one attempt (the FIFO stays open, and so writable, between attempts, while
// the group loop exists only during one), and its one action, a signal, needs nothing from the
// loop: the killed worker's exit reaches the loop as any exit does. Signals go through a pidfd
// taken when the worker is added, so a worker reaped meanwhile (its pid reused) is never hit.
// A request from a pid the agent does not know yet is held until the attempt ends (at most
// kMaxHeldRequests): a worker forked from a warm standby (launch --warm-start) may write before
// the agent has read its pid from the standby, and its timer must not be lost.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/worker_env.h"
#include "common/unique_fd.h"

namespace launch {

inline constexpr char kEnableFileTimerEnv[] = "TORCHELASTIC_ENABLE_FILE_TIMER";
inline constexpr char kTimerFileEnv[] = "TORCHELASTIC_TIMER_FILE";

struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // seconds since the epoch; negative: release
  int signal = 0;              // 0: the timer ends without a signal
};

// One line of the FIFO (without its newline) as a request; InvalidArgument says what is wrong
// (not JSON, a field missing or of the wrong type, a value out of its bounds).
absl::StatusOr<TimerRequest> ParseTimerRequest(absl::string_view line);

// What became of the requests, for the summary at the end.
struct TimerCounts {
  int64_t set = 0, released = 0, expired = 0;
  // Ignored: a line over kMaxTimerRequestBytes, a line that is no valid request, a request from
  // a pid that is no worker of the attempt (counted when the attempt ends, or when
  // kMaxHeldRequests are held already), a new timer while kMaxLiveTimers are held.
  int64_t overlong = 0, invalid = 0, unknown_pid = 0, full = 0;
  int64_t ignored() const { return overlong + invalid + unknown_pid + full; }
  // Held now: requests from pids not known (yet) to be workers of this attempt.
  int64_t held = 0;
};

// A worker whose timer expired: the timer whose signal it gets (signal 0: none asked for).
struct TimerExpiry {
  pid_t pid = 0;
  int rank = 0;
  std::string scope_id;
  double expiration_time = 0;
  int signal = 0;
};

// The pure part: the FIFO's bytes in; the timers, and what has expired at a given time, out. No
// clock (times are arguments) and no I/O, so it is tested as a table.
class TimerTable {
 public:
  // A worker of the current attempt: only its requests are taken, those held from its pid before
  // now first, in the order they came. Returns the warnings to log, as Feed.
  std::vector<std::string> AddWorker(pid_t pid, int rank);
  // The attempt is over: its workers and their timers are forgotten, the requests still held
  // are ignored (one warning, returned, names how many), and the next attempt's first ignored
  // request is logged again.
  std::vector<std::string> ClearWorkers();
  // Bytes as read from the FIFO: each complete line is applied, a partial one kept for the next
  // call (a line that grows past kMaxTimerRequestBytes is dropped up to its newline). Returns the
  // warnings to log: the first ignored request of each kind in an attempt; the rest are counted.
  std::vector<std::string> Feed(absl::string_view bytes);
  // Every worker with a timer expired at `now` (seconds since the epoch), earliest first; each
  // such worker's timers are dropped.
  std::vector<TimerExpiry> TakeExpired(double now);
  // The earliest expiration held; nullopt when no timer is.
  std::optional<double> NextExpiration() const;
  size_t size() const { return timers_.size(); }
  const TimerCounts& counts() const { return counts_; }

 private:
  struct Timer {
    double expiration_time = 0;
    int signal = 0;
  };
  void Apply(absl::string_view line, std::vector<std::string>* warnings);
  // A request from a worker of this attempt.
  void Take(TimerRequest r, std::vector<std::string>* warnings);
  // A warning the first time `*warned` is false.
  static void WarnOnce(bool* warned, std::string text, std::vector<std::string>* warnings);

  std::map<pid_t, int> workers_;  // pid -> rank
  std::map<std::pair<pid_t, std::string>, Timer> timers_;
  std::deque<TimerRequest> held_;  // from pids not known yet, oldest first
  std::string partial_;            // a line not finished yet
  bool dropping_ = false;          // inside an overlong line, up to its newline
  bool warned_invalid_ = false, warned_unknown_ = false, warned_full_ = false;
  TimerCounts counts_;
};

class FileTimerServer {
 public:
  struct Options {
    std::string path;  // the FIFO, made by Start (mode 0600) and removed by Stop
    // The longest between two looks at the timers while any is held (torch's agent: 0.1 s); the
    // server also wakes at the next expiration.
    std::chrono::milliseconds reap_interval{100};
    // Seconds since the epoch, the clients' time.time() (empty: the system's).
    std::function<double()> now;
    // Called on the server's thread once an expired timer is handled (after the signal).
    std::function<void(const TimerExpiry&)> on_expired;
  };
  explicit FileTimerServer(Options opts);
  ~FileTimerServer() { Stop(); }
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  // Makes the FIFO and starts reading it. A path that exists is replaced only when it is a FIFO
  // of this user's (one an earlier run left, as torch replaces it); anything else there is an
  // error, as is a path whose directory does not take a FIFO.
  absl::Status Start();
  // Stops reading, removes the FIFO (if it is still the one Start made) and logs what was ignored.
  void Stop();
  const std::string& path() const { return opts_.path; }

  // A worker of the current attempt, just spawned (not reaped yet: its pidfd is taken now). Its
  // requests held until now are taken, and the server's thread woken to look at their timers.
  void AddWorker(pid_t pid, int rank);
  // The attempt is over: its workers, pidfds and timers are dropped.
  void ClearWorkers();
  TimerCounts counts() const;

 private:
  void Loop();
  void ReadRequests();
  void Reap();
  int WaitMs();

  Options opts_;
  UniqueFd read_, keep_open_, stop_, wake_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;  // guards table_ and pidfds_
  TimerTable table_;
  std::map<pid_t, UniqueFd> pidfds_;  // invalid where the kernel gave none (then kill(2))
};

// torchrun's switch: with TORCHELASTIC_ENABLE_FILE_TIMER=1 in `parent`, the FIFO's path (its
// TORCHELASTIC_TIMER_FILE, else <TMPDIR or /tmp>/watchdog_timer_<fresh_suffix>); else nullopt.
std::optional<std::string> FileTimerPath(const Env& parent, const std::string& fresh_suffix);

// The run's file timer, started, when `parent` asks for one; nullptr when it does not.
absl::StatusOr<std::unique_ptr<FileTimerServer>> StartFileTimer(const Env& parent);

}  // namespace launch

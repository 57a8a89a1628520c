#include "agent/file_timer.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "probes/process.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "launch.pb.h"
#include "spdlog/spdlog.h"
#include "common/thread_name.h"

namespace launch {

absl::StatusOr<TimerRequest> ParseTimerRequest(absl::string_view line) {
  v1::FileTimerRequest m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // what a newer torch may add
  auto st = google::protobuf::util::JsonStringToMessage(std::string(line), &m, options);
  if (!st.ok()) {
    // Its first line only, bounded and printable: protobuf's message may quote the input.
    std::string why = st.message().as_string();
    why = why.substr(0, std::min<size_t>(why.find('\n'), 200));
    for (char& c : why) {
      if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
    }
    return absl::InvalidArgumentError(absl::StrCat("not a timer request in JSON: ", why));
  }
  for (auto [has, name] : {std::pair{m.has_pid(), "pid"},
                           {m.has_scope_id(), "scope_id"},
                           {m.has_expiration_time(), "expiration_time"},
                           {m.has_signal(), "signal"}}) {
    if (!has) return absl::InvalidArgumentError(absl::StrCat("a timer request without \"", name, "\""));
  }
  if (m.pid() <= 0 || m.pid() > std::numeric_limits<pid_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("pid ", m.pid(), " is not a process id"));
  }
  if (m.scope_id().size() > kMaxTimerScopeLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("a scope_id of ", m.scope_id().size(), " bytes (at most ", kMaxTimerScopeLength, ")"));
  }
  if (!std::isfinite(m.expiration_time())) {
    return absl::InvalidArgumentError("expiration_time is not a finite number");
  }
  if (m.signal() > kMaxSignal) {
    return absl::InvalidArgumentError(
        absl::StrCat("signal ", m.signal(), " (expected 1..", kMaxSignal, ", or 0 or less for none)"));
  }
  TimerRequest r;
  r.pid = static_cast<pid_t>(m.pid());
  r.scope_id = m.scope_id();
  r.expiration_time = m.expiration_time();
  r.signal = std::max(m.signal(), 0);  // torch: "a negative or zero signal will not kill"
  return r;
}

std::vector<std::string> TimerTable::AddWorker(pid_t pid, int rank) {
  workers_[pid] = rank;
  std::vector<std::string> warnings;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->pid != pid) {
      ++it;
      continue;
    }
    Take(std::move(*it), &warnings);
    it = held_.erase(it);
  }
  counts_.held = static_cast<int64_t>(held_.size());
  return warnings;
}

std::vector<std::string> TimerTable::ClearWorkers() {
  std::vector<std::string> warnings;
  if (!held_.empty()) {
    std::set<pid_t> pids;
    for (const TimerRequest& r : held_) pids.insert(r.pid);
    warnings.push_back(absl::StrCat("ignored ", held_.size(), " request(s) from ", pids.size(),
                                    " pid(s) that were no worker of the attempt (the first: ", held_.front().pid, ")"));
    counts_.unknown_pid += static_cast<int64_t>(held_.size());
  }
  held_.clear();
  counts_.held = 0;
  workers_.clear();
  timers_.clear();
  warned_invalid_ = warned_unknown_ = warned_full_ = false;
  return warnings;
}

void TimerTable::WarnOnce(bool* warned, std::string text, std::vector<std::string>* warnings) {
  if (*warned) return;
  *warned = true;
  warnings->push_back(absl::StrCat(text, " (more like it in this attempt are only counted)"));
}

std::vector<std::string> TimerTable::Feed(absl::string_view bytes) {
  std::vector<std::string> warnings;
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const absl::string_view piece = bytes.substr(0, nl);
    if (!dropping_ && partial_.size() + piece.size() > kMaxTimerRequestBytes) {
      dropping_ = true;
      partial_.clear();
      ++counts_.overlong;
      WarnOnce(&warned_invalid_, absl::StrCat("ignored a line over ", kMaxTimerRequestBytes, " bytes"), &warnings);
    }
    if (!dropping_) partial_.append(piece.data(), piece.size());
    if (nl == absl::string_view::npos) break;
    if (!dropping_) Apply(partial_, &warnings);
    partial_.clear();
    dropping_ = false;
    bytes.remove_prefix(nl + 1);
  }
  return warnings;
}

void TimerTable::Apply(absl::string_view line, std::vector<std::string>* warnings) {
  if (absl::StripAsciiWhitespace(line).empty()) return;
  absl::StatusOr<TimerRequest> r = ParseTimerRequest(line);
  if (!r.ok()) {
    ++counts_.invalid;
    WarnOnce(&warned_invalid_, absl::StrCat("ignored a request: ", r.status().message()), warnings);
    return;
  }
  if (workers_.count(r->pid) == 0) {
    if (held_.size() < kMaxHeldRequests) {  // until the agent knows the pid, or the attempt ends
      held_.push_back(std::move(*r));
      counts_.held = static_cast<int64_t>(held_.size());
      return;
    }
    // Full: this request is lost, and so are the pid's held ones, so that what it gets later is
    // never a part of its requests (a timer set, its release lost, would kill a worker that
    // left its scope in time).
    const auto before = held_.size();
    held_.erase(std::remove_if(held_.begin(), held_.end(), [&](const TimerRequest& h) { return h.pid == r->pid; }),
                held_.end());
    counts_.unknown_pid += static_cast<int64_t>(before - held_.size()) + 1;
    counts_.held = static_cast<int64_t>(held_.size());
    WarnOnce(&warned_unknown_,
             absl::StrCat("ignored a request from pid ", r->pid, ", which is no worker of this attempt (",
                          kMaxHeldRequests, " such requests are held already), and the ", before - held_.size(),
                          " held from it"),
             warnings);
    return;
  }
  Take(std::move(*r), warnings);
}

void TimerTable::Take(TimerRequest r, std::vector<std::string>* warnings) {
  auto key = std::make_pair(r.pid, std::move(r.scope_id));
  if (r.expiration_time < 0) {
    counts_.released += static_cast<int64_t>(timers_.erase(key));
    return;
  }
  auto it = timers_.find(key);
  if (it == timers_.end()) {
    if (timers_.size() >= kMaxLiveTimers) {
      ++counts_.full;
      WarnOnce(&warned_full_,
               absl::StrCat("ignored a new timer of pid ", key.first, ": ", kMaxLiveTimers, " are held already"),
               warnings);
      return;
    }
    it = timers_.emplace(std::move(key), Timer{}).first;
  }
  it->second = Timer{r.expiration_time, r.signal};
  ++counts_.set;
}

std::vector<TimerExpiry> TimerTable::TakeExpired(double now) {
  std::map<pid_t, TimerExpiry> chosen;
  for (const auto& [key, t] : timers_) {
    if (t.expiration_time > now) continue;
    auto [it, fresh] = chosen.try_emplace(key.first);
    TimerExpiry& e = it->second;
    // torch's choice: the earliest expired timer that names a signal, else the earliest.
    const bool better = fresh ||
                        ((t.signal > 0) != (e.signal > 0) ? t.signal > 0 : t.expiration_time < e.expiration_time);
    if (!better) continue;
    e.pid = key.first;
    e.rank = workers_[key.first];
    e.scope_id = key.second;
    e.expiration_time = t.expiration_time;
    e.signal = t.signal;
  }
  for (auto it = timers_.begin(); it != timers_.end();) {
    it = chosen.count(it->first.first) ? timers_.erase(it) : std::next(it);
  }
  std::vector<TimerExpiry> out;
  for (auto& [pid, e] : chosen) out.push_back(std::move(e));
  std::stable_sort(out.begin(), out.end(),
                   [](const TimerExpiry& a, const TimerExpiry& b) { return a.expiration_time < b.expiration_time; });
  counts_.expired += static_cast<int64_t>(out.size());
  return out;
}

std::optional<double> TimerTable::NextExpiration() const {
  std::optional<double> next;
  for (const auto& [key, t] : timers_) {
    if (!next || t.expiration_time < *next) next = t.expiration_time;
  }
  return next;
}

namespace {

double SystemEpochSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Makes the FIFO at `path` (owner-only); one already there is replaced only when it is a FIFO
// of this user's, and what is there then is checked by the caller once it is open.
absl::Status MakeOwnFifo(const std::string& path) {
  if (::mkfifo(path.c_str(), 0600) == 0) return absl::OkStatus();
  if (errno != EEXIST) return ErrnoStatus(absl::StrCat("cannot make the FIFO ", path));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return ErrnoStatus(absl::StrCat("cannot look at ", path));
  if (!S_ISFIFO(st.st_mode) || st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a FIFO of this user's (uid ",
                                                      ::geteuid(), "); expected a path that does not exist"));
  }
  if (::unlink(path.c_str()) != 0 || ::mkfifo(path.c_str(), 0600) != 0) {
    return ErrnoStatus(absl::StrCat("cannot replace the FIFO ", path));
  }
  return absl::OkStatus();
}

// 0, or why `sig` could not be sent.
int SendSignal(const UniqueFd& pidfd, pid_t pid, int sig) {
#ifdef SYS_pidfd_send_signal
  if (pidfd.valid()) return ::syscall(SYS_pidfd_send_signal, pidfd.get(), sig, nullptr, 0) == 0 ? 0 : errno;
#endif
  return ::kill(pid, sig) == 0 ? 0 : errno;
}

}  // namespace

FileTimerServer::FileTimerServer(Options opts) : opts_(std::move(opts)) {
  if (!opts_.now) opts_.now = SystemEpochSeconds;
}

absl::Status FileTimerServer::Start() {
  RETURN_IF_ERROR(MakeOwnFifo(opts_.path));
  struct stat made {};
  if (::lstat(opts_.path.c_str(), &made) != 0 || !S_ISFIFO(made.st_mode) || made.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(opts_.path, " was replaced as it was made"));
  }
  dev_ = made.st_dev;  // from now on Stop removes the FIFO, if it is still this one
  ino_ = made.st_ino;
  read_.Reset(::open(opts_.path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  struct stat opened {};
  // A writer of our own keeps the read end from seeing end-of-file whenever the last client
  // closes (which would wake poll for ever).
  keep_open_.Reset(::open(opts_.path.c_str(), O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  struct stat written {};
  if (!read_.valid() || ::fstat(read_.get(), &opened) != 0 || !keep_open_.valid() ||
      ::fstat(keep_open_.get(), &written) != 0) {
    auto failed = ErrnoStatus(absl::StrCat("cannot open the FIFO ", opts_.path));
    Stop();
    return failed;
  }
  for (const struct stat& st : {opened, written}) {
    if (st.st_dev != dev_ || st.st_ino != ino_) {
      Stop();
      return absl::FailedPreconditionError(absl::StrCat(opts_.path, " was replaced as it was made"));
    }
  }
  stop_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  wake_.Reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!stop_.valid() || !wake_.valid()) {
    auto failed = ErrnoStatus("eventfd");
    Stop();
    return failed;
  }
  thread_ = std::thread([this] {
    NameThisThread("launch-filetime");
    Loop();
  });
  ::pthread_setname_np(thread_.native_handle(), "file-timer");
  return absl::OkStatus();
}

void FileTimerServer::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof one);
    thread_.join();
  }
  read_.Reset();
  keep_open_.Reset();
  stop_.Reset();
  wake_.Reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    pidfds_.clear();
  }
  if (ino_ == 0) return;
  struct stat st {};
  if (::lstat(opts_.path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(opts_.path.c_str());
  ino_ = 0;
  const TimerCounts c = counts();
  if (c.ignored() > 0) {
    std::vector<std::string> why;
    if (c.overlong) why.push_back(absl::StrCat(c.overlong, " over ", kMaxTimerRequestBytes, " bytes"));
    if (c.invalid) why.push_back(absl::StrCat(c.invalid, " not valid"));
    if (c.unknown_pid) why.push_back(absl::StrCat(c.unknown_pid, " from pids that were no worker"));
    if (c.full) why.push_back(absl::StrCat(c.full, " beyond ", kMaxLiveTimers, " timers held"));
    spdlog::warn("file timer: ignored {} request(s): {}", c.ignored(), absl::StrJoin(why, ", "));
  }
}

void FileTimerServer::AddWorker(pid_t pid, int rank) {
  UniqueFd pidfd;
#ifdef SYS_pidfd_open
  // None where the kernel (before 5.3) or a seccomp filter refuses: then kill(2), whose pid could
  // be another process's only if the worker was reaped and its pid reused before ClearWorkers.
  pidfd.Reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif
  std::vector<std::string> warnings;
  bool took_held = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t held = table_.counts().held;
    pidfds_[pid] = std::move(pidfd);  // before its held timers are taken: they may have expired
    warnings = table_.AddWorker(pid, rank);
    took_held = table_.counts().held != held;
  }
  for (const std::string& w : warnings) spdlog::warn("file timer: {}", w);
  if (took_held && wake_.valid()) {  // its thread may be waiting with no timer to expire
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof one);
  }
}

void FileTimerServer::ClearWorkers() {
  std::vector<std::string> warnings;
  {
    std::lock_guard<std::mutex> lock(mu_);
    warnings = table_.ClearWorkers();
    pidfds_.clear();
  }
  for (const std::string& w : warnings) spdlog::warn("file timer: {}", w);
}

TimerCounts FileTimerServer::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.counts();
}

int FileTimerServer::WaitMs() {
  std::optional<double> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = table_.NextExpiration();
  }
  if (!next) return -1;  // nothing to expire: only a request or Stop wakes the thread
  const double ms = std::ceil((*next - opts_.now()) * 1000);
  return static_cast<int>(std::clamp(ms, 0.0, static_cast<double>(opts_.reap_interval.count())));
}

void FileTimerServer::Loop() {
  for (;;) {
    pollfd p[3] = {{stop_.get(), POLLIN, 0}, {read_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(p, 3, WaitMs()) < 0 && errno != EINTR) {
      spdlog::error("file timer: poll: {}; timers no longer expire", std::strerror(errno));
      return;
    }
    if (p[0].revents != 0) return;
    if (p[2].revents & POLLIN) {
      uint64_t n;
      (void)!::read(wake_.get(), &n, sizeof n);
    }
    if (p[1].revents & POLLIN) ReadRequests();
    Reap();
  }
}

void FileTimerServer::ReadRequests() {
  char buf[16384];
  // At most a few pipefuls before the timers get a look.
  for (int round = 0; round < 16; ++round) {
    const ssize_t got = ::read(read_.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return;  // EAGAIN: all read (never end-of-file: keep_open_ is a writer)
    std::vector<std::string> warnings;
    {
      std::lock_guard<std::mutex> lock(mu_);
      warnings = table_.Feed(absl::string_view(buf, static_cast<size_t>(got)));
    }
    for (const std::string& w : warnings) spdlog::warn("file timer: {}", w);
    if (static_cast<size_t>(got) < sizeof buf) return;
  }
}

void FileTimerServer::Reap() {
  std::vector<std::pair<TimerExpiry, int>> handled;  // the expiry and why its signal failed (0: sent)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (TimerExpiry& e : table_.TakeExpired(opts_.now())) {
      auto pidfd = pidfds_.find(e.pid);  // there for every worker the table knows
      const int err = e.signal > 0 && pidfd != pidfds_.end() ? SendSignal(pidfd->second, e.pid, e.signal) : 0;
      handled.emplace_back(std::move(e), err);
    }
  }
  for (const auto& [e, err] : handled) {
    const std::string timer = absl::StrFormat("timer \"%s\" of pid %d (rank %d) expired", absl::CEscape(e.scope_id),
                                              e.pid, e.rank);
    if (e.signal <= 0) {
      spdlog::warn("{}; it names no signal: the worker goes on", timer);
    } else if (err == 0) {
      spdlog::warn("{}: sent {}", timer, SignalName(e.signal));
    } else if (err == ESRCH) {
      spdlog::info("{}: the worker had already ended", timer);
    } else {
      spdlog::warn("{}: cannot send {}: {}", timer, SignalName(e.signal), std::strerror(err));
    }
    if (opts_.on_expired) opts_.on_expired(e);
  }
}

std::optional<std::string> FileTimerPath(const Env& parent, const std::string& fresh_suffix) {
  auto get = [&parent](const char* key) {
    auto it = parent.find(key);
    return it == parent.end() ? std::string() : it->second;
  };
  if (get(kEnableFileTimerEnv) != "1") return std::nullopt;
  if (std::string path = get(kTimerFileEnv); !path.empty()) return path;
  std::string dir = get("TMPDIR");
  if (dir.empty()) dir = "/tmp";
  return absl::StrCat(dir, "/watchdog_timer_", fresh_suffix);
}

absl::StatusOr<std::unique_ptr<FileTimerServer>> StartFileTimer(const Env& parent) {
  std::random_device random;
  std::optional<std::string> path = FileTimerPath(parent, absl::StrFormat("%08x%08x", random(), random()));
  if (!path) return std::unique_ptr<FileTimerServer>();
  FileTimerServer::Options o;
  // Absolute, so a worker that changes directory still finds it.
  std::error_code ec;
  o.path = std::filesystem::absolute(*path, ec).string();
  if (ec) o.path = *path;
  auto server = std::make_unique<FileTimerServer>(std::move(o));
  if (absl::Status st = server->Start(); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat(kTimerFileEnv, ": ", st.message()));
  }
  spdlog::info("file timer: the workers' timers go through {} ({})", server->path(), kTimerFileEnv);
  return server;
}

}  // namespace launch

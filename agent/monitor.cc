#include "agent/monitor.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/tunables.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"
#include "common/thread_name.h"

namespace launch {

namespace {

// Bytes that fit the proto's int64 (a counter from /proc or statvfs is never near it).
int64_t Bytes(uint64_t v) { return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v); }

}  // namespace

std::optional<std::string> ReadProcFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  std::string out;
  char buf[4096];
  while (out.size() < 65536) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::optional<ProcStat> ParseProcStat(absl::string_view text) {
  const size_t close = text.rfind(')');
  if (close == absl::string_view::npos) return std::nullopt;
  // After the name: state(3) ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
  // utime(14) stime(15) cutime cstime priority nice num_threads(20).
  std::vector<absl::string_view> f = absl::StrSplit(text.substr(close + 1), ' ', absl::SkipEmpty());
  if (f.size() < 18) return std::nullopt;
  uint64_t utime, stime;
  int threads, ppid;
  if (!absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime) || !absl::SimpleAtoi(f[17], &threads) ||
      !absl::SimpleAtoi(f[1], &ppid)) {
    return std::nullopt;
  }
  return ProcStat{utime + stime, threads, f[0] == "Z" || f[0] == "X", ppid};
}

std::optional<int64_t> ParseStatmResidentPages(absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  int64_t pages;
  if (f.size() < 2 || !absl::SimpleAtoi(f[1], &pages) || pages < 0) return std::nullopt;
  return pages;
}

std::optional<MemInfo> ParseMeminfo(absl::string_view text) {
  MemInfo m;
  bool total = false, available = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib;
    if (f.size() < 2 || !absl::SimpleAtoi(f[1], &kib) || kib < 0 || kib > INT64_MAX / 1024) continue;
    if (f[0] == "MemTotal:") {
      m.total_bytes = kib * 1024;
      total = true;
    } else if (f[0] == "MemAvailable:") {
      m.available_bytes = kib * 1024;
      available = true;
    }
  }
  if (!total || !available) return std::nullopt;
  return m;
}

std::optional<double> ParseLoadavg(absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(text, ' ', absl::SkipEmpty());
  double load;
  if (f.empty() || !absl::SimpleAtod(f[0], &load) || !std::isfinite(load) || load < 0) return std::nullopt;
  return load;
}

v1::GpuSample ToGpuSample(const GpuFigures& g) {
  v1::GpuSample s;
  s.set_index(g.index);
  s.set_name(g.name);
  s.set_uuid(g.uuid);
  s.set_utilization_percent(g.utilization_percent);
  s.set_memory_used_bytes(g.memory_used_bytes);
  s.set_memory_total_bytes(g.memory_total_bytes);
  s.set_temperature_c(g.temperature_c);
  s.set_power_watts(g.power_watts);
  s.set_sm_clock_mhz(g.sm_clock_mhz);
  s.set_memory_clock_mhz(g.memory_clock_mhz);
  s.set_ecc_uncorrected_errors(g.ecc_uncorrected_errors);
  for (int x : g.xids) s.add_xids(x);
  return s;
}

std::function<std::vector<v1::GpuSample>()> NvmlGpuSampler(std::shared_ptr<Nvml> nvml) {
  return [nvml] {
    std::vector<v1::GpuSample> out;
    for (const GpuFigures& g : nvml->Sample()) {
      out.push_back(ToGpuSample(g));
      if (!g.xids.empty()) {
        spdlog::warn("GPU {} ({}) reported XID error(s) {}: see NVIDIA's XID table; the GPU may need a reset", g.index,
                     g.name, absl::StrJoin(g.xids, ", "));
      }
    }
    return out;
  };
}

std::string DescribeStragglerEvent(const v1::StragglerEvent& e) {
  const std::string where = absl::StrCat(e.hostname().empty() ? "" : absl::StrCat("on ", e.hostname()),
                                         e.gpu() >= 0 ? absl::StrCat(e.hostname().empty() ? "" : ", ", "GPU ", e.gpu())
                                                      : "");
  if (e.recovered()) {
    return absl::StrFormat("rank %d%s is no longer a straggler (%.2fx the job's median step work)", e.rank(),
                           where.empty() ? "" : absl::StrCat(" (", where, ")"), e.ratio());
  }
  return absl::StrFormat(
      "rank %d%s is a straggler: its own work per step takes %.2fx the job's median (%.1f ms against %.1f ms)",
      e.rank(), where.empty() ? "" : absl::StrCat(" (", where, ")"), e.ratio(), 1000 * e.busy_seconds(),
      1000 * e.median_seconds());
}

Monitor::Monitor(Options opts, LiveRanks* ranks, const Clock* clock)
    : opts_(std::move(opts)), ranks_(ranks), clock_(clock) {}

Monitor::~Monitor() { Stop(); }

void Monitor::Start() {
  if (!opts_.metrics_file.empty()) {
    metrics_fd_.Reset(::open(opts_.metrics_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!metrics_fd_.valid()) spdlog::warn("cannot write {}: {}", opts_.metrics_file, std::strerror(errno));
  }
  thread_ = std::thread([this] {
    NameThisThread("launch-monitor");
    Loop();
  });
}

void Monitor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Monitor::SetRound(int64_t round) {
  std::lock_guard<std::mutex> lock(mu_);
  round_ = round;
}

void Monitor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!clock_->WaitFor(lock, wake_, opts_.interval, [this] { return stopping_; })) {
    lock.unlock();
    SampleOnce();
    lock.lock();
  }
}

v1::SampleRequest Monitor::SampleOnce() {
  v1::SampleRequest s = Collect();
  Write(s);
  Send(s);
  return s;
}

v1::SampleRequest Monitor::Collect() {
  v1::SampleRequest s;
  s.set_run_id(opts_.run_id);
  s.set_node_id(opts_.node_id);
  s.set_hostname(opts_.hostname);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.set_round(round_);
  }
  s.set_unix_time(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  const Clock::TimePoint now = clock_->Now();
  static const long kTicks = ::sysconf(_SC_CLK_TCK);
  static const long kPage = ::sysconf(_SC_PAGESIZE);
  std::map<pid_t, CpuMark> marks;
  for (const RankFigures& f : ranks_->Snapshot()) {
    v1::RankSample* r = s.add_ranks();
    r->set_rank(f.rank);
    r->set_local_rank(f.local_rank);
    r->set_pid(f.pid);
    r->set_state(f.running ? "running" : f.exited ? "exited" : "starting");
    r->set_last_step(f.last_step);
    r->set_steps(f.steps);
    r->set_step_seconds(f.StepSeconds());
    r->set_busy_seconds(f.BusySeconds());
    r->set_seconds_since_step(f.last_progress ? SecondsBetween(*f.last_progress, now) : -1);
    r->set_gpu(f.gpu);
    if (!f.running || f.pid <= 0) continue;
    const std::string dir = absl::StrCat(opts_.proc_dir, "/", f.pid);
    // A worker caught between its exit and its reaping has no memory and no threads to show: it
    // is sampled as exited (a zombie; or exiting, its memory already released), not as a running
    // rank with nothing resident.
    auto stat_text = ReadProcFile(dir + "/stat");
    auto st = stat_text ? ParseProcStat(*stat_text) : std::nullopt;
    auto statm_text = ReadProcFile(dir + "/statm");
    auto pages = statm_text ? ParseStatmResidentPages(*statm_text) : std::nullopt;
    if ((st && st->exited) || (pages && *pages == 0)) {
      r->set_state("exited");
      continue;
    }
    if (st) {
      r->set_threads(st->threads);
      marks[f.pid] = {st->cpu_ticks, now};
      auto before = cpu_marks_.find(f.pid);
      if (before != cpu_marks_.end() && now > before->second.at && st->cpu_ticks >= before->second.ticks &&
          kTicks > 0) {
        const double cpu_s = static_cast<double>(st->cpu_ticks - before->second.ticks) / static_cast<double>(kTicks);
        r->set_cpu_percent(100 * cpu_s / SecondsBetween(before->second.at, now));
      }
    }
    if (pages) r->set_rss_bytes(Bytes(static_cast<uint64_t>(*pages) * kPage));
  }
  cpu_marks_ = std::move(marks);  // pids that are gone are forgotten
  if (opts_.gpus) {
    for (v1::GpuSample& g : opts_.gpus()) *s.add_gpus() = std::move(g);
  }
  v1::NodeSample* node = s.mutable_node();
  if (auto text = ReadProcFile(opts_.proc_dir + "/loadavg")) node->set_load1(ParseLoadavg(*text).value_or(0));
  if (auto text = ReadProcFile(opts_.proc_dir + "/meminfo")) {
    if (auto m = ParseMeminfo(*text)) {
      node->set_memory_total_bytes(m->total_bytes);
      node->set_memory_available_bytes(m->available_bytes);
    }
  }
  struct statvfs vfs;
  if (::statvfs(opts_.shm_dir.c_str(), &vfs) == 0) {
    node->set_shm_total_bytes(Bytes(static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize));
    node->set_shm_used_bytes(Bytes(static_cast<uint64_t>(vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize));
  }
  return s;
}

void Monitor::Write(const v1::SampleRequest& s) {
  if (!metrics_fd_.valid() || write_failed_) return;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string line;
  v1::SampleRequest shown = s;
  shown.clear_events_seen();  // the wire's bookkeeping, not a figure
  if (!google::protobuf::util::MessageToJsonString(shown, &line, o).ok()) return;
  line += '\n';
  // One write per line (O_APPEND): a reader never sees half a line unless the disk is full.
  if (::write(metrics_fd_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    write_failed_ = true;
    spdlog::warn("cannot write {} ({}): no more samples go there", opts_.metrics_file,
                 errno ? std::strerror(errno) : "short write");
  }
}

void Monitor::Send(const v1::SampleRequest& s) {
  if (!opts_.coordinator) return;
  v1::SampleRequest req = s;
  req.set_events_seen(events_seen_);
  auto resp = opts_.coordinator->Sample(req, std::min(opts_.interval, kMaxSampleDeadline));
  if (!resp.ok()) {
    // Best effort: the rendezvous does not depend on it. Said once, then at debug level.
    if (!send_failed_) spdlog::info("the coordinator did not take a sample: {}", std::string(resp.status().message()));
    send_failed_ = true;
    return;
  }
  send_failed_ = false;
  const uint64_t seen = events_seen_;
  for (const v1::StragglerEvent& e : resp->events()) {
    if (e.seq() <= seen) continue;  // told before
    events_seen_ = std::max(events_seen_, e.seq());
    if (e.round() != s.round()) continue;  // an episode of an earlier round: its workers are gone
    if (!e.recovered()) ranks_->NoteStraggler(e.rank());
    spdlog::warn("{}", DescribeStragglerEvent(e));
  }
}

}  // namespace launch

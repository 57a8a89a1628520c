// progress_bench: the cost of launch_sdk::ProgressReporter::Report (one non-blocking send of a
// 32-byte ProgressRecord on a datagram socket), which train_mlp calls once per step.
//
//   build/bin/progress_bench [--calls N] [--batches B]
//
// Cases, each timed as B batches of N/B calls (median, min and max ns/call over the batches):
//   reader   socketpair(AF_UNIX, SOCK_DGRAM|SOCK_NONBLOCK); a reader thread drains the other end
//            as the agent does (poll, then recv until EAGAIN). Some sends may find the buffer
//            full and be dropped, as Report intends; the counts are printed.
//   full     the same socket with nobody reading: after the buffer fills every send fails with
//            EAGAIN (the agent stalled); the drop path's cost.
//   fd -1    the reporter built with fd -1 (not run under launch): the no-op case.
// Then one batch of the reader case with every call timed on its own: p50/p99/p99.9/max, the
// tail a training step could see.
// Target: median < 5 us per call in the reader case. Exit status 1 only when the benchmark
// itself failed (bad arguments, socketpair, a reader that received nothing or garbage).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "launch_sdk/progress.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTargetNs = 5000.0;

std::string LoadAvg() {
  char buf[128] = {0};
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "?";
  double a = 0, b = 0, c = 0;
  int n = std::fscanf(f, "%lf %lf %lf", &a, &b, &c);
  std::fclose(f);
  if (n != 3) return "?";
  std::snprintf(buf, sizeof buf, "%.2f %.2f %.2f", a, b, c);
  return buf;
}

struct Stats {
  double median = 0, min = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  s.min = v.front();
  s.max = v.back();
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

// Times `batches` batches of `per_batch` Report calls; ns/call per batch.
std::vector<double> TimeBatches(launch_sdk::ProgressReporter& rep, long per_batch, int batches, long* step) {
  std::vector<double> ns;
  for (int b = 0; b < batches; ++b) {
    const auto t0 = Clock::now();
    for (long i = 0; i < per_batch; ++i) {
      ++*step;
      rep.Report(*step, 0.5, 0.001);
      asm volatile("" ::: "memory");  // keep the loop as written
    }
    const auto t1 = Clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / per_batch);
  }
  return ns;
}

struct Reader {
  int fd;
  int32_t want_rank;
  std::atomic<bool> stop{false};
  std::atomic<long> received{0};
  std::atomic<long> bad{0};
  std::thread thread;

  void Run() {
    launch_sdk::ProgressRecord r;
    while (true) {
      pollfd p{fd, POLLIN, 0};
      int pr = poll(&p, 1, 20);
      bool stopping = stop.load(std::memory_order_acquire);
      if (pr > 0) {
        while (true) {
          ssize_t n = recv(fd, &r, sizeof r, MSG_DONTWAIT);
          if (n < 0) break;  // EAGAIN: drained
          if (n != static_cast<ssize_t>(sizeof r) || r.magic != 0x4c50524fu || r.rank != want_rank) {
            bad.fetch_add(1, std::memory_order_relaxed);
          } else {
            received.fetch_add(1, std::memory_order_relaxed);
          }
        }
      }
      if (stopping && pr == 0) return;  // nothing more in flight
    }
  }
};

void PrintRow(const char* name, const Stats& s, long calls, const char* extra) {
  std::printf("%-28s %10.1f %10.1f %10.1f %10ld  %s\n", name, s.median, s.min, s.max, calls, extra);
}

bool ParseLong(const char* s, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!end || *end || v < 1) return false;
  *out = v;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long calls = 1000000, batches = 10;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    long* dst = a == "--calls" ? &calls : a == "--batches" ? &batches : nullptr;
    if (!dst || i + 1 >= argc || !ParseLong(argv[++i], dst)) {
      std::fprintf(stderr, "usage: %s [--calls N (default 1000000)] [--batches B (default 10)]\n", argv[0]);
      return 1;
    }
  }
  if (batches > calls) batches = calls;
  const long per_batch = calls / batches;
  calls = per_batch * batches;

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, sv) != 0) {
    std::perror("socketpair");
    return 1;
  }
  int sndbuf = 0;
  socklen_t len = sizeof sndbuf;
  getsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, &len);

  std::printf("progress_bench: ProgressReporter::Report, %ld calls as %ld batches of %ld; record %zu bytes, "
              "SO_SNDBUF %d; %u CPUs\n",
              calls, batches, per_batch, sizeof(launch_sdk::ProgressRecord), sndbuf,
              std::thread::hardware_concurrency());
  std::printf("load average before: %s\n\n", LoadAvg().c_str());
  std::printf("%-28s %10s %10s %10s %10s\n", "case", "median ns", "min ns", "max ns", "calls");
  std::printf("%s\n", std::string(74, '-').c_str());

  long step = 0;
  int rc = 0;

  // reader: the agent drains the socket.
  Stats reader_stats;
  {
    Reader rd;
    rd.fd = sv[1];
    rd.want_rank = 3;
    rd.thread = std::thread([&rd] { rd.Run(); });
    launch_sdk::ProgressReporter rep(sv[0], 3);
    TimeBatches(rep, std::max(1L, per_batch / 10), 1, &step);  // warm-up, not counted
    const long before = rd.received.load();
    const long first = step;
    reader_stats = Summarize(TimeBatches(rep, per_batch, static_cast<int>(batches), &step));
    const long sent = step - first;
    rd.stop.store(true, std::memory_order_release);
    rd.thread.join();
    const long got = rd.received.load() - before;
    char extra[160];
    std::snprintf(extra, sizeof extra, "received %ld (%.1f%%), dropped %ld (socket full)", got,
                  100.0 * got / sent, sent - got);
    PrintRow("reader thread draining", reader_stats, calls, extra);
    if (rd.received.load() == 0 || rd.bad.load() != 0) {
      std::fprintf(stderr, "progress_bench: reader got %ld good and %ld bad datagrams\n", rd.received.load(),
                   rd.bad.load());
      rc = 1;
    }
  }

  // full: nobody reads; fill the buffer first, then every send is EAGAIN.
  {
    launch_sdk::ProgressReporter rep(sv[0], 3);
    long queued = 0;
    launch_sdk::ProgressRecord r;
    while (send(sv[0], &r, sizeof r, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof r)) ++queued;
    Stats s = Summarize(TimeBatches(rep, per_batch, static_cast<int>(batches), &step));
    char extra[96];
    std::snprintf(extra, sizeof extra, "buffer full after %ld datagrams; all dropped", queued);
    PrintRow("no reader (socket full)", s, calls, extra);
    launch_sdk::ProgressRecord sink;
    while (recv(sv[1], &sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
  }

  // fd -1: the no-op.
  {
    launch_sdk::ProgressReporter rep(-1, 3);
    TimeBatches(rep, per_batch, 1, &step);
    Stats s = Summarize(TimeBatches(rep, per_batch, static_cast<int>(batches), &step));
    PrintRow("fd -1 (no-op)", s, calls, "");
  }
  std::printf("%s\n", std::string(74, '-').c_str());

  // Per-call latencies, reader case (each call timed alone; includes ~20-30 ns of clock reads).
  {
    Reader rd;
    rd.fd = sv[1];
    rd.want_rank = 3;
    rd.thread = std::thread([&rd] { rd.Run(); });
    launch_sdk::ProgressReporter rep(sv[0], 3);
    std::vector<double> lat(static_cast<size_t>(per_batch));
    for (long i = 0; i < per_batch; ++i) {
      const auto t0 = Clock::now();
      rep.Report(++step, 0.5, 0.001);
      const auto t1 = Clock::now();
      lat[static_cast<size_t>(i)] = std::chrono::duration<double, std::nano>(t1 - t0).count();
    }
    rd.stop.store(true, std::memory_order_release);
    rd.thread.join();
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double p) { return lat[std::min(lat.size() - 1, static_cast<size_t>(p * lat.size()))]; };
    long over = static_cast<long>(lat.end() - std::upper_bound(lat.begin(), lat.end(), kTargetNs));
    std::printf("per-call latency, reader case, %ld calls: p50 %.0f ns, p99 %.0f ns, p99.9 %.0f ns, max %.0f ns; "
                "%ld call(s) over %.0f ns\n",
                per_batch, pct(0.5), pct(0.99), pct(0.999), lat.back(), over, kTargetNs);
  }

  std::printf("\ntarget: Report() with a reader < %.0f ns per call (median of batches): %.1f ns -> %s\n", kTargetNs,
              reader_stats.median, reader_stats.median < kTargetNs ? "met" : "MISSED");
  std::printf("load average after: %s\n", LoadAvg().c_str());
  close(sv[0]);
  close(sv[1]);
  return rc;
}

// A scriptable worker for launch's integration tests and benchmarks. Actions run in argv order:
//   --print-env K1,K2     print K=V lines
//   --print-fds           print "fds 0 1 2 ..." (this process's open descriptors)
//   --print-ignored       print "ignored SIGHUP ..." (signals whose disposition is SIG_IGN)
//   --stamp FILE          append "<rank> <restart> <CLOCK_REALTIME ns>" (start-latency benches)
//   --pid-file FILE       append this process's pid
//   --grandchild FILE     fork a child that sleeps (same process group), append its pid
//   --ignore-sigterm      SIGTERM does nothing
//   --ignore SIG          signal SIG (a number) does nothing
//   --stderr TEXT         write TEXT and a newline to stderr
//   --partial TEXT        write TEXT to stdout in one-byte writes, then a newline
//   --spew BYTES          write 100-byte lines to stdout, BYTES in all (0: for ever)
//   --spew-unended BYTES  write BYTES of 'x' to stdout with no newline at all
//   --read-line PROMPT    write PROMPT (no newline), read a line from stdin, print "got LINE"
//                         ("got EOF" at its end)
//   --error-file MSG      write TORCHELASTIC_ERROR_FILE in torchelastic's JSON format
//   --sleep SECONDS       sleep (0 = forever)
//   --sleep-below-restart K SECONDS  sleep while TORCHELASTIC_RESTART_COUNT < K
//   --wait-lines FILE N   wait (up to 60 s) until FILE has N lines; "{restart}" in FILE: per attempt
//   --sleep-if-env K V SECONDS       sleep if the environment has K=V
//   --sleep-unless-env K V SECONDS   sleep unless the environment has K=V
//   --exit-if-env K V CODE           exit CODE if the environment has K=V
//   --exit-if-lines FILE N CODE      exit CODE if FILE has at least N lines
//   --stamp-on-term FILE  on SIGTERM: append a --stamp line to FILE, then exit 143
//   --fail-rank R CODE    exit CODE if RANK == R
//   --fail-below-restart K CODE   exit CODE while TORCHELASTIC_RESTART_COUNT < K
//   --kill-self SIG       raise SIG
//   --exit CODE           exit CODE
//   --progress N          report steps 1..N (loss 1/step) through worker_sdk's ProgressReporter
//   --hold-exit-notice    hold this rank's exit notice for launch (LAUNCH_EXIT_NOTICE; exit 98 if not)
//   --hold-exit-notice-in-thread  the same from a thread that then ends (the process goes on)
//   --touch MB            map MB MiB in 4 KiB pages and write every one (a process slow to tear down)
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "launch_sdk/exit_notice.h"
#include "launch_sdk/progress.h"

namespace {

int EnvInt(const char* k, int dflt) {
  const char* v = std::getenv(k);
  return v ? std::atoi(v) : dflt;
}

void Append(const char* path, const std::string& line) {
  FILE* f = std::fopen(path, "a");
  if (!f) {
    std::perror(path);
    std::exit(99);
  }
  std::fprintf(f, "%s\n", line.c_str());
  std::fclose(f);
}

// "{restart}" in a path becomes the restart count: a file per attempt.
std::string WithRestart(std::string path, int restart) {
  auto pos = path.find("{restart}");
  if (pos != std::string::npos) path.replace(pos, 9, std::to_string(restart));
  return path;
}

// --stamp-on-term: the file, opened before the signal can arrive (the handler only writes).
int g_term_fd = -1;
int g_term_rank = -1, g_term_restart = 0;

// Async-signal-safe: clock_gettime, write and _exit only; the digits are formatted by hand.
void StampAndExit(int) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char buf[96];
  int n = 0;
  auto put = [&](long long v) {
    char tmp[24];
    int k = 0;
    if (v < 0) {
      buf[n++] = '-';
      v = -v;
    }
    do {
      tmp[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v > 0);
    while (k > 0) buf[n++] = tmp[--k];
  };
  put(g_term_rank);
  buf[n++] = ' ';
  put(g_term_restart);
  buf[n++] = ' ';
  put(static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec);
  buf[n++] = '\n';
  ssize_t w = write(g_term_fd, buf, n);
  (void)w;
  _exit(143);
}

void SleepSeconds(double s) {
  if (s <= 0) {
    for (;;) pause();
  }
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<long>(s)) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = EnvInt("RANK", -1);
  const int restart = EnvInt("TORCHELASTIC_RESTART_COUNT", 0);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "test_worker: %s needs a value\n", a.c_str());
        std::exit(98);
      }
      return argv[++i];
    };
    if (a == "--print-fds") {
      std::string fds = "fds";
      DIR* d = opendir("/proc/self/fd");
      std::vector<int> open_fds;
      while (dirent* e = d ? readdir(d) : nullptr) {
        if (e->d_name[0] == '.') continue;
        const int fd = std::atoi(e->d_name);
        if (fd != dirfd(d)) open_fds.push_back(fd);
      }
      if (d) closedir(d);
      std::sort(open_fds.begin(), open_fds.end());
      for (int fd : open_fds) fds += " " + std::to_string(fd);
      std::printf("%s\n", fds.c_str());
      std::fflush(stdout);
    } else if (a == "--print-ignored") {
      std::string out = "ignored";
      for (int s = 1; s < NSIG; ++s) {
        struct sigaction cur {};
        if (sigaction(s, nullptr, &cur) == 0 && cur.sa_handler == SIG_IGN) out += std::string(" SIG") + sigabbrev_np(s);
      }
      std::printf("%s\n", out.c_str());
      std::fflush(stdout);
    } else if (a == "--print-env") {
      std::string keys = next();
      size_t start = 0;
      while (start <= keys.size()) {
        size_t comma = keys.find(',', start);
        std::string k = keys.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const char* v = std::getenv(k.c_str());
        std::printf("%s=%s\n", k.c_str(), v ? v : "<unset>");
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      std::fflush(stdout);
    } else if (a == "--stamp") {
      timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      long long ns = static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
      Append(next(), std::to_string(rank) + " " + std::to_string(restart) + " " + std::to_string(ns));
    } else if (a == "--pid-file") {
      Append(WithRestart(next(), restart).c_str(), std::to_string(getpid()));
    } else if (a == "--grandchild") {
      const char* path = next();
      pid_t pid = fork();
      if (pid == 0) {
        for (;;) pause();
      }
      Append(path, std::to_string(pid));
    } else if (a == "--ignore-sigterm") {
      signal(SIGTERM, SIG_IGN);
    } else if (a == "--wait-lines") {
      // Waits (polling, at most 60 s) until the file has N lines: other ranks got this far.
      const std::string path = WithRestart(next(), restart);
      const long want = std::atol(next());
      for (int tries = 0; tries < 60000; ++tries) {
        std::ifstream f(path);
        long lines = 0;
        for (std::string line; std::getline(f, line);) ++lines;
        if (lines >= want) break;
        usleep(1000);
      }
    } else if (a == "--ignore") {
      signal(std::atoi(next()), SIG_IGN);
    } else if (a == "--stderr") {
      std::fprintf(stderr, "%s\n", next());
      std::fflush(stderr);
    } else if (a == "--partial") {
      const char* text = next();
      for (const char* p = text; *p; ++p) {
        ssize_t n = write(1, p, 1);
        (void)n;
        usleep(1000);
      }
      ssize_t n = write(1, "\n", 1);
      (void)n;
    } else if (a == "--spew") {
      const long long total = std::atoll(next());
      const std::string line = std::string(99, 'x') + "\n";
      for (long long done = 0; total == 0 || done < total; done += static_cast<long long>(line.size())) {
        if (write(1, line.data(), line.size()) < 0) break;
      }
    } else if (a == "--spew-unended") {
      long long left = std::atoll(next());
      const std::string block(1 << 16, 'x');
      while (left > 0) {
        ssize_t n = write(1, block.data(), static_cast<size_t>(std::min<long long>(left, block.size())));
        if (n <= 0) break;
        left -= n;
      }
    } else if (a == "--read-line") {
      const char* prompt = next();
      ssize_t n = write(1, prompt, std::strlen(prompt));
      (void)n;
      char buf[256];
      if (std::fgets(buf, sizeof buf, stdin)) {
        buf[std::strcspn(buf, "\n")] = 0;
        std::printf("got %s\n", buf);
      } else {
        std::printf("got EOF\n");
      }
      std::fflush(stdout);
    } else if (a == "--error-file") {
      const char* msg = next();
      const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
      if (path) {
        FILE* f = std::fopen(path, "w");
        std::fprintf(f,
                     "{\"message\": {\"message\": \"%s\", \"extraInfo\": {\"py_callstack\": "
                     "\"Traceback: test\", \"timestamp\": \"%ld\"}}}",
                     msg, static_cast<long>(time(nullptr)));
        std::fclose(f);
      }
    } else if (a == "--sleep") {
      SleepSeconds(std::atof(next()));
    } else if (a == "--sleep-below-restart") {
      int k = std::atoi(next());
      double secs = std::atof(next());
      if (restart < k) SleepSeconds(secs);
    } else if (a == "--sleep-if-env") {
      std::string key = next(), value = next();
      double secs = std::atof(next());
      const char* v = std::getenv(key.c_str());
      if (v && value == v) SleepSeconds(secs);
    } else if (a == "--sleep-unless-env") {
      std::string key = next(), value = next();
      double secs = std::atof(next());
      const char* v = std::getenv(key.c_str());
      if (!v || value != v) SleepSeconds(secs);
    } else if (a == "--exit-if-env") {
      std::string key = next(), value = next();
      int code = std::atoi(next());
      const char* v = std::getenv(key.c_str());
      if (v && value == v) return code;
    } else if (a == "--exit-if-lines") {
      std::ifstream f(next());
      const long want = std::atol(next());
      const int code = std::atoi(next());
      long lines = 0;
      for (std::string line; std::getline(f, line);) ++lines;
      if (lines >= want) return code;
    } else if (a == "--stamp-on-term") {
      g_term_fd = open(next(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (g_term_fd < 0) {
        std::perror("--stamp-on-term");
        return 99;
      }
      g_term_rank = rank;
      g_term_restart = restart;
      struct sigaction sa {};
      sa.sa_handler = StampAndExit;
      sigaction(SIGTERM, &sa, nullptr);
    } else if (a == "--fail-rank") {
      int r = std::atoi(next());
      int code = std::atoi(next());
      if (rank == r) return code;
    } else if (a == "--fail-below-restart") {
      int k = std::atoi(next());
      int code = std::atoi(next());
      if (restart < k) return code;
    } else if (a == "--kill-self") {
      raise(std::atoi(next()));
    } else if (a == "--progress") {
      long n = std::atol(next());
      launch_sdk::ProgressReporter reporter = launch_sdk::ProgressReporter::FromEnv();
      for (long step = 1; step <= n; ++step) reporter.Report(step, 1.0 / step, 0.001);
    } else if (a == "--hold-exit-notice" || a == "--hold-exit-notice-in-thread") {
      std::string why;
      bool held = false;
      auto hold = [&] { held = launch_sdk::HoldExitNoticeFromEnv(&why); };
      if (a == "--hold-exit-notice") {
        hold();
      } else {
        std::thread(hold).join();
      }
      if (!held) {
        std::fprintf(stderr, "test_worker: no exit notice: %s\n", why.empty() ? "not under launch" : why.c_str());
        return 98;
      }
    } else if (a == "--touch") {
      // In 4 KiB pages even where transparent huge pages are always on: slow to free.
      const size_t bytes = static_cast<size_t>(std::atol(next())) << 20;
      void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) return 96;
      madvise(m, bytes, MADV_NOHUGEPAGE);
      char* p = static_cast<char*>(m);
      for (size_t i = 0; i < bytes; i += 4096) p[i] = 1;
    } else if (a == "--exit") {
      return std::atoi(next());
    } else {
      std::fprintf(stderr, "test_worker: unknown action %s\n", a.c_str());
      return 97;
    }
  }
  return 0;
}

// Worker output: each stream comes through a pipe, is written whole lines at a time to the console
// with a "[<rank>]:" prefix, to torchrun's log-dir files (the bytes as written), and keeps a tail
// for the failure summary. A '\r'-ended piece (a progress bar's update) goes to the console at
// once, prefixed and ending in '\r'; a line longer than kMaxLineBytes is shown in pieces of that
// size, so a worker that never writes a newline cannot grow launch's memory.
#pragma once

#include <deque>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace launch {

// torchrun's --redirects / --tee value: 0 none, 1 stdout, 2 stderr, 3 both; either one value for
// every local rank or a map "0:1,1:2".
struct StdSpec {
  int all = 0;
  std::map<int, int> per_rank;
  int For(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
  bool Stdout(int local_rank) const { return For(local_rank) & 1; }
  bool Stderr(int local_rank) const { return For(local_rank) & 2; }
};
absl::StatusOr<StdSpec> ParseStdSpec(const std::string& value, const std::string& flag);

// One worker stream.
class LineRelay {
 public:
  static constexpr size_t kMaxLineBytes = 64 * 1024;

 public:
  struct Options {
    std::string prefix;  // "[3]:"
    int console_fd = -1;  // -1: not shown on the console
    int file_fd = -1;     // -1: no log file
    size_t tail_lines = 0;
  };
  explicit LineRelay(Options opts) : opts_(std::move(opts)) {}

  void Feed(const char* data, size_t n);
  // Writes a last partial line, if any (at EOF).
  void Flush();
  const std::deque<std::string>& tail() const { return tail_; }
  size_t buffered() const { return partial_.size(); }

 private:
  // One piece of output ended by `end` ('\n' or '\r'): partial_ + [data, data + n).
  void Piece(const char* data, size_t n, char end, std::string* console);
  Options opts_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// Writes all of buf, retrying on EINTR and short writes.
void WriteAll(int fd, const char* buf, size_t n);

}  // namespace launch

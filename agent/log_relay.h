// Worker output: each stream comes through a pipe, is written whole lines at a time to the console
// with a "[<rank>]:" prefix, to torchrun's log-dir files (the bytes as written), and keeps a tail
// for the failure summary. A '\r'-ended piece (a progress bar's update) goes to the console at
// once, prefixed and ending in '\r'; a line longer than kMaxLineBytes is shown in pieces of that
// size, so a worker that never writes a newline cannot grow launch's memory; a line that stays
// unfinished and quiet for kPartialLineDelay (a prompt) is shown as far as it goes.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "probes/console.h"
#include "agent/job_spec.h"
#include "common/clock.h"
#include "common/unique_fd.h"

namespace launch {

// One worker stream.
class LineRelay {
 public:
  static constexpr size_t kMaxLineBytes = 64 * 1024;
  // A line without end is shown once the worker has written nothing more for this long (a prompt
  // such as pdb's "(Pdb) " or input()'s), and left open on the console for the rest of the line.
  // A line written slowly in pieces stays whole as long as its pieces keep coming.
  static constexpr std::chrono::milliseconds kPartialLineDelay{200};

 public:
  struct Options {
    std::string prefix;                // "[3]:"
    ConsoleStream* console = nullptr;  // nullptr: not shown on the console
    int file_fd = -1;                  // -1: no log file
    size_t tail_lines = 0;
    // torchrun's --duplicate-std{out,err}-filters: each whole line that contains any of these is
    // also appended, prefixed, to filtered_fd (one file for the attempt's workers). Not owned.
    const std::vector<std::string>* filters = nullptr;
    int filtered_fd = -1;
  };
  explicit LineRelay(Options opts) : opts_(std::move(opts)) {}

  void Feed(const char* data, size_t n, Clock::TimePoint now);
  // When the line not yet shown is due (nullopt: nothing waits); ShowPartial shows it, open.
  std::optional<Clock::TimePoint> partial_due() const;
  void ShowPartial();
  // Writes a last partial line, if any, ended (at EOF).
  void Flush();
  const std::deque<std::string>& tail() const { return tail_; }
  size_t buffered() const { return partial_.size(); }

 private:
  // Ends the current line with `end` ('\n' or '\r'): the bytes not yet shown plus `text`,
  // appended to `batch` (the first piece's prefix is the console's to add).
  void Piece(std::string_view text, char end, std::string* batch);
  void Send(std::string* batch, bool open);
  Options opts_;
  std::string partial_;  // the current line's bytes not yet shown
  std::string shown_;    // the current line's bytes already shown (open), for the tail; bounded
  std::optional<Clock::TimePoint> partial_since_;
  std::deque<std::string> tail_;
};

// Writes all of buf, retrying on EINTR and short writes.
void WriteAll(int fd, const char* buf, size_t n);

// torchrun's --log-line-prefix-template: "${role_name}", "${rank}", "${local_rank}" and
// "${hostname}" (also written "$rank", ...) replaced, "$$" a '$', as Python's Template does. Any
// other "${name}" is an error naming it, as is a template over kMaxLinePrefixTemplate bytes.
inline constexpr size_t kMaxLinePrefixTemplate = 256;
struct LinePrefixFields {
  std::string role_name = "default";
  int rank = 0;
  int local_rank = 0;
  std::string hostname;
};
absl::StatusOr<std::string> FormatLinePrefix(std::string_view tmpl, const LinePrefixFields& fields);
// The prefixes launch uses when no template is given: one node's ranks, and a multi-node job's,
// whose consoles (one srun, one kubectl logs) merge every node's lines.
inline constexpr char kSingleNodeLinePrefix[] = "[${rank}]:";
inline constexpr char kMultiNodeLinePrefix[] = "[${hostname}:${rank}]:";

// The margin DescriptorsNeeded() keeps for launch itself (gRPC, epoll, the signal and console
// descriptors) and for one spawn's pipes in flight.
constexpr long kOwnDescriptors = 64;

// What launch holds open while its workers run: per worker the read ends of its stdout and stderr
// pipes, and its two log files when there are any, plus a margin for launch itself.
long DescriptorsNeeded(int nproc, bool log_files);

}  // namespace launch

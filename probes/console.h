// launch's console: its stdout and its stderr are each written by a thread of their own, so a
// terminal or pipe that stops reading never blocks supervision (reaping, signal forwarding, the
// stop timer, restarts). Writing queues the bytes and returns at once. A queue past kHighWater
// is "backlogged": the worker group then stops reading the pipes of workers shown on that stream,
// so those workers wait in their own writes (as they would writing to the terminal themselves,
// as under torchrun) and nothing is dropped; reading resumes below kLowWater.
//
// Several writers share one stream: worker relays, launch's own log lines. A writer may leave a
// line open (a prompt without a newline); when another writer speaks, that line is ended first.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "common/unique_fd.h"

namespace launch {

class ConsoleStream {
 public:
  static constexpr size_t kHighWater = 1 << 20;
  static constexpr size_t kLowWater = 256 << 10;

  explicit ConsoleStream(int fd);
  ~ConsoleStream();  // Drain()s first
  ConsoleStream(const ConsoleStream&) = delete;
  ConsoleStream& operator=(const ConsoleStream&) = delete;

  // Queues `prefix` + `text` for `owner` (nullptr: launch itself). When another owner left the
  // line open, a newline ends it first; when `owner` left it open, `prefix` is not repeated.
  // `open`: the text does not end its line.
  void Write(const void* owner, std::string_view prefix, std::string_view text, bool open);
  void Write(std::string_view text) { Write(nullptr, {}, text, false); }

  // The open line was ended by something else (the terminal echoing what the user typed): the
  // next text starts a line of its own, with its prefix.
  void LineEndedElsewhere();

  bool backlogged() const;
  // Readable (an eventfd; read it to clear) each time a backlog has drained below kLowWater.
  int ready_fd() const { return ready_.get(); }
  size_t queued() const;
  // Waits until everything queued has been written (or the descriptor failed: a closed pipe).
  // Gives up when `interrupt_fd` is readable and `interrupted()` says so (launch's signal fd: a
  // terminating signal, not SIGCHLD). True if drained.
  bool Drain(int interrupt_fd = -1, const std::function<bool()>& interrupted = {});
  int fd() const { return fd_; }

 private:
  void WriterLoop();

  const int fd_;
  UniqueFd ready_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::string queue_;     // under mu_
  size_t in_flight_ = 0;  // bytes the writer has taken and not yet written; under mu_
  const void* open_owner_ = nullptr;
  bool open_ = false;        // the last text written left its line open
  bool backlogged_ = false;  // went over kHighWater and has not drained below kLowWater yet
  bool failed_ = false;      // the descriptor refused a write: later output is dropped
  bool closing_ = false;
  std::thread writer_;   // started with the first write
  UniqueFd idle_event_;  // readable while nothing is queued (for Drain with an interrupt)
};

// The process's two console streams (fds 1 and 2), made on first use and never destroyed (their
// threads may be blocked on a console that never reads again).
ConsoleStream& ConsoleOut();
ConsoleStream& ConsoleErr();

// A stdio stream whose writes go to ConsoleErr() (for spdlog's colour sink): each fflush is one
// Write, so a log line is never split by a worker's output.
FILE* ConsoleErrFile();

// Drains both (see ConsoleStream::Drain); launch calls this before it exits.
bool DrainConsole(int interrupt_fd = -1, const std::function<bool()>& interrupted = {});

}  // namespace launch

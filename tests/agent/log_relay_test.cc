#include "agent/log_relay.h"

#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace launch {
namespace {

std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  return out;
}

// A console on a pipe, read back whole once the relays are done with it.
class PipeConsole {
 public:
  PipeConsole() {
    EXPECT_TRUE(MakePipe(&pipe_));
    stream_ = std::make_unique<ConsoleStream>(pipe_.write.get());
  }
  ConsoleStream* stream() { return stream_.get(); }
  // Everything written so far, once the stream has drained (the pipe is then closed).
  std::string Finish() {
    std::string out;
    std::thread reader([&] { out = ReadAll(pipe_.read.get()); });
    stream_.reset();
    pipe_.write.Reset();
    reader.join();
    return out;
  }

 private:
  Pipe pipe_;
  std::unique_ptr<ConsoleStream> stream_;
};

const Clock::TimePoint kT0{};

TEST(LineRelay, PrefixesWholeLinesOnlyAndKeepsFileRaw) {
  PipeConsole console;
  Pipe file;
  ASSERT_TRUE(MakePipe(&file));
  {
    LineRelay relay({"[3]:", console.stream(), file.write.get(), 2});
    relay.Feed("hel", 3, kT0);
    relay.Feed("lo\nwor", 6, kT0);
    relay.Feed("ld\nline3\nno newline", 19, kT0);
    relay.Flush();
    EXPECT_EQ(relay.tail().size(), 2u);
    EXPECT_EQ(relay.tail().back(), "no newline");
  }
  file.write.Reset();
  EXPECT_EQ(console.Finish(), "[3]:hello\n[3]:world\n[3]:line3\n[3]:no newline\n");
  EXPECT_EQ(ReadAll(file.read.get()), "hello\nworld\nline3\nno newline");
}

TEST(LineRelay, EmptyLinesArePrefixedToo) {
  PipeConsole console;
  {
    LineRelay relay({"[0]:", console.stream(), -1, 0});
    relay.Feed("\n\nx\n", 4, kT0);
  }
  EXPECT_EQ(console.Finish(), "[0]:\n[0]:\n[0]:x\n");
}

// tqdm's updates end in '\r': they reached the console only at the final newline. Now each one
// is shown at once, prefixed; the file keeps the bytes; the tail keeps the finished line.
TEST(LineRelay, CarriageReturnUpdatesAreShownAtOnce) {
  PipeConsole console;
  Pipe file;
  ASSERT_TRUE(MakePipe(&file));
  {
    LineRelay relay({"[1]:", console.stream(), file.write.get(), 5});
    relay.Feed(" 10%\r", 5, kT0);
    const std::string rest = " 50%\r 100%\ndone\r\n";
    relay.Feed(rest.data(), rest.size(), kT0);
    EXPECT_EQ(relay.buffered(), 0u);
    EXPECT_EQ(relay.tail().size(), 2u);
    EXPECT_EQ(relay.tail().front(), " 100%");
    EXPECT_EQ(relay.tail().back(), "done");
  }
  file.write.Reset();
  EXPECT_EQ(console.Finish(), "[1]: 10%\r[1]: 50%\r[1]: 100%\n[1]:done\n");
  EXPECT_EQ(ReadAll(file.read.get()), " 10%\r 50%\r 100%\ndone\r\n");
}

// 200 MB without a newline took launch from 15 MB to 220 MB: the partial line is bounded now.
TEST(LineRelay, ALineWithoutEndIsShownInBoundedPieces) {
  PipeConsole console;
  const size_t kMax = LineRelay::kMaxLineBytes;
  const std::string chunk(10000, 'x');
  size_t fed = 0;
  std::string got;
  std::thread reader;
  {
    LineRelay relay({"[0]:", console.stream(), -1, 1});
    while (fed < 3 * kMax + 5) {
      relay.Feed(chunk.data(), chunk.size(), kT0);
      fed += chunk.size();
      EXPECT_LT(relay.buffered(), kMax);
    }
    relay.Flush();
    EXPECT_EQ(relay.tail().back().size(), fed % kMax);
  }
  const std::string piece = "[0]:" + std::string(kMax, 'x') + "\n";
  EXPECT_EQ(console.Finish(), piece + piece + piece + "[0]:" + std::string(fed % kMax, 'x') + "\n");
}

// A prompt ("(Pdb) ", input()'s) has no newline: it was never shown, so an interactive worker
// looked hung. Once the worker is quiet for kPartialLineDelay it is shown, left open, and the rest of the line follows
// without a second prefix; another writer's line in between ends it first.
TEST(LineRelay, AnUnfinishedLineIsShownAfterADelay) {
  PipeConsole console;
  {
    LineRelay relay({"[0]:", console.stream(), -1, 3});
    relay.Feed("(Pd", 3, kT0);
    relay.Feed("b) ", 3, kT0 + std::chrono::milliseconds(50));
    ASSERT_TRUE(relay.partial_due().has_value());  // quiet since the last piece
    EXPECT_EQ(*relay.partial_due(), kT0 + std::chrono::milliseconds(50) + LineRelay::kPartialLineDelay);
    relay.ShowPartial();
    EXPECT_FALSE(relay.partial_due().has_value());
    relay.Feed("p x\n", 4, kT0);
    relay.Feed("(Pdb) ", 6, kT0);
    relay.ShowPartial();
    console.stream()->Write("[launch] a line of launch's own\n");
    relay.Feed("c\n", 2, kT0);
    EXPECT_EQ(relay.tail().size(), 2u);
    EXPECT_EQ(relay.tail().front(), "(Pdb) p x");
    EXPECT_EQ(relay.tail().back(), "(Pdb) c");
  }
  EXPECT_EQ(console.Finish(),
            "[0]:(Pdb) p x\n[0]:(Pdb) \n[launch] a line of launch's own\n[0]:c\n");
}

// Console writes blocked the supervision loop: a terminal or pipe that stopped reading stalled
// reaping, signals and the kill timer. Writes now queue and return; past the high-water mark the
// stream says it is backlogged (the group stops reading workers), and once the reader catches up
// the ready descriptor wakes the group and nothing was lost.
TEST(ConsoleStream, AConsoleThatStopsReadingNeverBlocksTheWriter) {
  Pipe pipe;
  ASSERT_TRUE(MakePipe(&pipe));
  ConsoleStream stream(pipe.write.get());
  const std::string line(1000, 'y');
  size_t written = 0;
  while (!stream.backlogged()) {  // nobody reads the pipe: this would block without the queue
    stream.Write(line);
    written += line.size();
    ASSERT_LT(written, 2 * ConsoleStream::kHighWater);
  }
  EXPECT_GT(stream.queued(), ConsoleStream::kLowWater);
  std::string got;
  char buf[65536];
  // Read until the backlog clears. The writer clears it only after its last write returned, so
  // the pipe can be empty while the stream still says backlogged: wait on both (a blocking read
  // here hung under TSan, whose slower writer lost that race).
  while (stream.backlogged()) {
    pollfd p[2] = {{pipe.read.get(), POLLIN, 0}, {stream.ready_fd(), POLLIN, 0}};
    ASSERT_GT(::poll(p, 2, -1), 0);
    if (!(p[0].revents & POLLIN)) continue;
    ssize_t n = ::read(pipe.read.get(), buf, sizeof buf);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  pollfd ready{stream.ready_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&ready, 1, 0), 1);  // the group's epoll wakes on it
  std::thread reader([&] {
    for (ssize_t n; (n = ::read(pipe.read.get(), buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  });
  EXPECT_TRUE(stream.Drain());
  pipe.write.Reset();
  reader.join();
  EXPECT_EQ(got.size(), written);
}

// A console whose reader is gone (a closed pipe): its output is dropped, nothing blocks or dies.
TEST(ConsoleStream, AClosedConsoleDropsOutput) {
  Pipe pipe;
  ASSERT_TRUE(MakePipe(&pipe));
  pipe.read.Reset();
  ConsoleStream stream(pipe.write.get());
  stream.Write("lost\n");
  EXPECT_FALSE(stream.Drain());
  stream.Write("lost too\n");
  EXPECT_EQ(stream.queued(), 0u);
}

// Drain waits for a slow console, but gives up when told to (launch's signal fd at exit).
TEST(ConsoleStream, DrainGivesUpOnAnInterrupt) {
  Pipe pipe, interrupt;
  ASSERT_TRUE(MakePipe(&pipe) && MakePipe(&interrupt));
  ConsoleStream stream(pipe.write.get());
  stream.Write(std::string(ConsoleStream::kHighWater, 'z'));  // more than the pipe holds
  ASSERT_EQ(::write(interrupt.write.get(), "x", 1), 1);
  EXPECT_FALSE(stream.Drain(interrupt.read.get(), [] { return true; }));
  pipe.read.Reset();  // lets the writer thread finish (EPIPE) so the stream can be destroyed
}

TEST(StdSpec, ParsesTorchrunValues) {
  auto s = ParseStdSpec("2", "--redirects");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->Stderr(7) && !s->Stdout(7));
  s = ParseStdSpec("0:3, 2:1", "--tee");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->For(0), 3);
  EXPECT_EQ(s->For(1), 0);
  EXPECT_EQ(s->For(2), 1);
  for (const char* bad : {"9", "-1", "x", "0:4", "a:1", "0:1:2"}) {
    auto b = ParseStdSpec(bad, "--redirects");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(std::string(b.status().message()).find(std::string("--redirects=") + bad), std::string::npos);
  }
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

TEST(LinePrefix, TorchrunsTemplateFields) {
  const LinePrefixFields f{"trainer", 5, 1, "node07"};
  struct Row {
    std::string tmpl, out;
  };
  for (const Row& r : std::vector<Row>{
           {"[${rank}]:", "[5]:"},
           {kSingleNodeLinePrefix, "[5]:"},
           {kMultiNodeLinePrefix, "[node07:5]:"},
           {"${role_name}${local_rank}|", "trainer1|"},
           {"$hostname/$rank ", "node07/5 "},
           {"$$${rank}", "$5"},
           {"cost $5 $unknown $", "cost $5 $unknown $"},
           {"", ""},
       }) {
    auto out = FormatLinePrefix(r.tmpl, f);
    ASSERT_TRUE(out.ok()) << r.tmpl << ": " << out.status();
    EXPECT_EQ(*out, r.out) << r.tmpl;
  }
  auto unknown = FormatLinePrefix("${node}:", f);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().message(),
            "'${node}' is unknown; expected ${role_name}, ${rank}, ${local_rank} or ${hostname}");
  EXPECT_FALSE(FormatLinePrefix("${rank", f).ok());
  EXPECT_FALSE(FormatLinePrefix(std::string(kMaxLinePrefixTemplate + 1, 'x'), f).ok());
}

}  // namespace
}  // namespace launch

namespace launch {
namespace {

// torchrun's --duplicate-stdout-filters: whole lines with any filter, prefixed, in one file that
// two workers share; pieces of a line and progress-bar updates are judged as the line they make.
TEST(LineRelay, FiltersCopyMatchingLinesOfEveryWorker) {
  Pipe filtered;
  ASSERT_TRUE(MakePipe(&filtered));
  const std::vector<std::string> filters = {"loss", "a,b"};
  {
    LineRelay a({"[0]:", nullptr, -1, 0, &filters, filtered.write.get()});
    LineRelay b({"[1]:", nullptr, -1, 0, &filters, filtered.write.get()});
    a.Feed("step 1 lo", 9, kT0);
    b.Feed("nothing here\nx a,b y\n", 21, kT0);
    a.Feed("ss=2\nepoch 1\n", 13, kT0);
    b.Feed("10%\r50% loss\rdone\n", 18, kT0);
    a.Feed("last loss", 9, kT0);
    a.Flush();
  }
  filtered.write.Reset();
  EXPECT_EQ(ReadAll(filtered.read.get()), "[1]:x a,b y\n[0]:step 1 loss=2\n[0]:last loss\n");
  // No filters, or no file: nothing is copied and nothing breaks.
  const std::vector<std::string> none;
  LineRelay c({"[2]:", nullptr, -1, 1, &none, -1});
  c.Feed("loss\n", 5, kT0);
  EXPECT_EQ(c.tail().back(), "loss");
}

}  // namespace
}  // namespace launch

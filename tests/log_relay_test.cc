#include "agent/log_relay.h"

#include <unistd.h>

#include <cstdio>

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

TEST(LineRelay, PrefixesWholeLinesOnlyAndKeepsFileRaw) {
  Pipe console, file;
  ASSERT_TRUE(MakePipe(&console) && MakePipe(&file));
  {
    LineRelay relay({"[3]:", console.write.get(), file.write.get(), 2});
    relay.Feed("hel", 3);
    relay.Feed("lo\nwor", 6);
    relay.Feed("ld\nline3\nno newline", 19);
    relay.Flush();
    EXPECT_EQ(relay.tail().size(), 2u);
    EXPECT_EQ(relay.tail().back(), "no newline");
  }
  console.write.Reset();
  file.write.Reset();
  EXPECT_EQ(ReadAll(console.read.get()), "[3]:hello\n[3]:world\n[3]:line3\n[3]:no newline\n");
  EXPECT_EQ(ReadAll(file.read.get()), "hello\nworld\nline3\nno newline");
}

TEST(LineRelay, EmptyLinesArePrefixedToo) {
  Pipe console;
  ASSERT_TRUE(MakePipe(&console));
  {
    LineRelay relay({"[0]:", console.write.get(), -1, 0});
    relay.Feed("\n\nx\n", 4);
  }
  console.write.Reset();
  EXPECT_EQ(ReadAll(console.read.get()), "[0]:\n[0]:\n[0]:x\n");
}

// tqdm's updates end in '\r': they reached the console only at the final newline. Now each one
// is shown at once, prefixed; the file keeps the bytes; the tail keeps the finished line.
TEST(LineRelay, CarriageReturnUpdatesAreShownAtOnce) {
  Pipe console, file;
  ASSERT_TRUE(MakePipe(&console) && MakePipe(&file));
  {
    LineRelay relay({"[1]:", console.write.get(), file.write.get(), 5});
    relay.Feed(" 10%\r", 5);
    const std::string rest = " 50%\r 100%\ndone\r\n";
    relay.Feed(rest.data(), rest.size());
    EXPECT_EQ(relay.buffered(), 0u);
    EXPECT_EQ(relay.tail().size(), 2u);
    EXPECT_EQ(relay.tail().front(), " 100%");
    EXPECT_EQ(relay.tail().back(), "done");
  }
  console.write.Reset();
  file.write.Reset();
  EXPECT_EQ(ReadAll(console.read.get()), "[1]: 10%\r[1]: 50%\r[1]: 100%\n[1]:done\n");
  EXPECT_EQ(ReadAll(file.read.get()), " 10%\r 50%\r 100%\ndone\r\n");
}

// 200 MB without a newline took launch from 15 MB to 220 MB: the partial line is bounded now.
TEST(LineRelay, ALineWithoutEndIsShownInBoundedPieces) {
  // A file as the console: a pipe that nobody reads while the relay writes would block it.
  FILE* console = std::tmpfile();
  ASSERT_NE(console, nullptr);
  const size_t kMax = LineRelay::kMaxLineBytes;
  const std::string chunk(10000, 'x');
  size_t fed = 0;
  {
    LineRelay relay({"[0]:", ::fileno(console), -1, 1});
    while (fed < 3 * kMax + 5) {
      relay.Feed(chunk.data(), chunk.size());
      fed += chunk.size();
      EXPECT_LT(relay.buffered(), kMax);
    }
    relay.Flush();
    EXPECT_EQ(relay.tail().back().size(), fed % kMax);
  }
  std::rewind(console);
  std::string got;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, console)) > 0;) got.append(buf, n);
  std::fclose(console);
  const std::string piece = "[0]:" + std::string(kMax, 'x') + "\n";
  EXPECT_EQ(got, piece + piece + piece + "[0]:" + std::string(fed % kMax, 'x') + "\n");
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

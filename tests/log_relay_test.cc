#include "agent/log_relay.h"

#include <unistd.h>

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

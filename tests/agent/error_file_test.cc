#include "agent/error_file.h"

#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace launch {
namespace {

using ::testing::HasSubstr;

TEST(ErrorFile, TorchelasticRecordFormat) {
  // As written by torch.distributed.elastic's @record.
  auto info = ParseErrorJson(
      R"({"message": {"message": "ValueError: bad shape", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  ...", "timestamp": "1700000000"}}})");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->message, "ValueError: bad shape");
  EXPECT_EQ(info->timestamp, "1700000000");
  EXPECT_EQ(info->stack.rfind("Traceback", 0), 0u);
}

TEST(ErrorFile, PlainMessageAndNumericTimestamp) {
  auto info = ParseErrorJson(R"({"message": "it broke"})");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->message, "it broke");
  info = ParseErrorJson(R"({"message": {"message": "x", "extraInfo": {"timestamp": 1700000001}}})");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->timestamp, "1700000001");
}

TEST(ErrorFile, MalformedIsAnError) {
  EXPECT_FALSE(ParseErrorJson("{not json").ok());
  EXPECT_FALSE(ParseErrorJson(R"({"other": 1})").ok());
  EXPECT_FALSE(ParseErrorJson(R"({"message": 3})").ok());
  EXPECT_TRUE(absl::IsNotFound(ReadErrorFile("/nonexistent/error.json").status()));
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(LauncherErrorFile, CopiesTheWorkersOrDescribesTheExit) {
  const std::string dir = ::testing::TempDir();
  const std::string worker = dir + "/worker_error.json", own = dir + "/launch_error.json";
  const std::string record =
      R"({"message": {"message": "ValueError: bad \"x\"", "extraInfo": {"py_callstack": "tb", "timestamp": "1"}}})";
  std::ofstream(worker) << record;
  ASSERT_TRUE(WriteLauncherErrorFile(own, worker, "unused", 0, 5).ok());
  EXPECT_EQ(Slurp(own), record);
  // torchrun's agent adds the exit code the worker could not write (it lacked errorCode).
  ASSERT_TRUE(WriteLauncherErrorFile(own, worker, "unused", 3, 5).ok());
  EXPECT_THAT(Slurp(own), HasSubstr("\"errorCode\":3"));
  auto copied = ParseErrorJson(Slurp(own));
  ASSERT_TRUE(copied.ok()) << Slurp(own);
  EXPECT_EQ(copied->message, "ValueError: bad \"x\"");
  EXPECT_EQ(copied->stack, "tb");
  ASSERT_TRUE(WriteLauncherErrorFile(own, worker, "unused", -9, 5).ok());
  EXPECT_THAT(Slurp(own), HasSubstr("\"errorCode\":-9"));
  // A worker's file over the bound is not read: the exit is described instead.
  std::ofstream(worker) << R"({"message": ")" << std::string(kMaxErrorFileBytes, 'x') << R"("})";
  ASSERT_TRUE(WriteLauncherErrorFile(own, worker, "rank 0: exit 3", 3, 5).ok());
  EXPECT_EQ(ParseErrorJson(Slurp(own))->message, "rank 0: exit 3");
  EXPECT_FALSE(ReadErrorFile(worker).ok());

  // No file from the worker (or one that is not torchelastic's): a description of the exit.
  for (const std::string& w : {std::string(dir + "/missing.json"), std::string()}) {
    ASSERT_TRUE(WriteLauncherErrorFile(own, w, "rank 1 (local rank 1) on \"h\": exit 7", 7, 1700000000).ok());
    auto info = ParseErrorJson(Slurp(own));
    ASSERT_TRUE(info.ok()) << Slurp(own);
    EXPECT_EQ(info->message, "rank 1 (local rank 1) on \"h\": exit 7");
    EXPECT_EQ(info->timestamp, "1700000000");
    EXPECT_THAT(Slurp(own), HasSubstr("\"errorCode\":7"));
  }
  EXPECT_FALSE(WriteLauncherErrorFile(dir + "/no/such/dir/e.json", "", "x", 1, 1).ok());
}

}  // namespace
}  // namespace launch

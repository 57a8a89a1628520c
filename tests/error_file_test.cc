#include "agent/error_file.h"

#include "gtest/gtest.h"

namespace launch {
namespace {

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

}  // namespace
}  // namespace launch

#include "agent/error_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace launch {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

std::string ValueText(const Value& v) {
  switch (v.kind_case()) {
    case Value::kStringValue:
      return v.string_value();
    case Value::kNumberValue: {
      std::ostringstream s;
      s.precision(15);
      s << v.number_value();
      return s.str();
    }
    default:
      return "";
  }
}

const Value* Field(const Struct& s, const char* name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

}  // namespace

absl::StatusOr<ErrorFileInfo> ParseErrorJson(const std::string& json) {
  Struct root;
  auto st = google::protobuf::util::JsonStringToMessage(json, &root);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("not JSON: ", st.message().as_string()));
  const Value* msg = Field(root, "message");
  if (!msg) return absl::InvalidArgumentError("no \"message\" field");
  ErrorFileInfo info;
  if (msg->kind_case() == Value::kStringValue) {
    info.message = msg->string_value();
  } else if (msg->kind_case() == Value::kStructValue) {
    const Struct& m = msg->struct_value();
    if (const Value* text = Field(m, "message")) info.message = ValueText(*text);
    if (const Value* extra = Field(m, "extraInfo"); extra && extra->has_struct_value()) {
      const Struct& e = extra->struct_value();
      if (const Value* ts = Field(e, "timestamp")) info.timestamp = ValueText(*ts);
      if (const Value* cs = Field(e, "py_callstack")) info.stack = ValueText(*cs);
    }
  } else {
    return absl::InvalidArgumentError("\"message\" is neither text nor an object");
  }
  return info;
}

absl::Status WriteLauncherErrorFile(const std::string& path, const std::string& worker_error_file,
                                    const std::string& what_happened, int error_code, long timestamp) {
  std::string json;
  Struct root;
  bool copied = false;
  if (!worker_error_file.empty()) {
    auto text = ReadRegularFile(worker_error_file, kMaxErrorFileBytes, "torchelastic's error JSON");
    copied = text.ok() && ParseErrorJson(*text).ok() && google::protobuf::util::JsonStringToMessage(*text, &root).ok();
    if (copied) json = *text;
  }
  if (!copied) {
    root.Clear();
    Struct message, extra;
    (*extra.mutable_fields())["py_callstack"].set_string_value("");
    (*extra.mutable_fields())["timestamp"].set_string_value(std::to_string(timestamp));
    (*message.mutable_fields())["message"].set_string_value(what_happened);
    *(*message.mutable_fields())["extraInfo"].mutable_struct_value() = extra;
    *(*root.mutable_fields())["message"].mutable_struct_value() = message;
  }
  // As torchrun's agent: the exit code the worker could not write itself goes into the message
  // object (a message that is text stays as written).
  auto msg = root.mutable_fields()->find("message");
  if (error_code != 0 && msg != root.mutable_fields()->end() && msg->second.has_struct_value()) {
    (*msg->second.mutable_struct_value()->mutable_fields())["errorCode"].set_number_value(error_code);
    json.clear();
  }
  if (json.empty()) {
    auto st = google::protobuf::util::MessageToJsonString(root, &json);
    if (!st.ok()) return absl::InternalError(st.message().as_string());
  }
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << json;
    if (!out.flush()) {
      ::unlink(tmp.c_str());
      return absl::InvalidArgumentError(absl::StrCat("TORCHELASTIC_ERROR_FILE=", path, ": cannot write it"));
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InvalidArgumentError(absl::StrCat("TORCHELASTIC_ERROR_FILE=", path, ": cannot write it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ErrorFileInfo> ReadErrorFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, kMaxErrorFileBytes, "torchelastic's error JSON"));
  return ParseErrorJson(text);
}

}  // namespace launch

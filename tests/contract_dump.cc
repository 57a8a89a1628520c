// Prints launch_sdk/contract.h (and the progress datagrams of launch_sdk/progress.h) as JSON, for
// tests/contract_check.py to compare the Python modules with: one source for both languages.
#include <cstdio>
#include <string>

#include "launch_sdk/contract.h"
#include "launch_sdk/progress.h"

namespace {

std::string Quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

void Field(const char* name, const std::string& json, bool last = false) {
  std::printf("    %s: %s%s\n", Quoted(name).c_str(), json.c_str(), last ? "" : ",");
}
void Field(const char* name, long long n, bool last = false) {
  Field(name, std::to_string(n), last);
}
void Text(const char* name, const std::string& s, bool last = false) {
  Field(name, Quoted(s), last);
}

}  // namespace

int main() {
  using namespace launch_sdk;
  std::printf("{\n  \"version\": %u,\n  \"env\": {\n", kContractVersion);
  const size_t names = sizeof kContractEnvNames / sizeof kContractEnvNames[0];
  for (size_t i = 0; i < names; ++i)
    Text(kContractEnvNames[i].constant, kContractEnvNames[i].value, i + 1 == names);
  std::printf("  },\n  \"fds\": {\n");
  Field("kProgressFd", kProgressFd);
  Field("kStandbyControlFd", kStandbyControlFd, true);
  std::printf("  },\n  \"go\": {\n");
  Text("kGoMagic", kGoMagic);
  Text("kGoMagicV1", kGoMagicV1);
  Field("kGoVersionBytes", static_cast<long long>(kGoVersionBytes));
  Field("kGoHeaderBytes", static_cast<long long>(kGoHeaderBytes));
  Field("kMaxGoBody", kMaxGoBody);
  Field("kGoMinFds", static_cast<long long>(kGoMinFds));
  Field("kGoMaxFds", static_cast<long long>(kGoMaxFds));
  Text("kStandbyReady", std::string(1, kStandbyReady));
  Text("kStandbyFailed", std::string(1, kStandbyFailed));
  Text("kStandbyPid", std::string(1, kStandbyPid));
  Text("kStandbyForked", std::string(1, kStandbyForked));
  // A go as the agent encodes it of {"A=1", "B=x=y"}, for the Python standby's decoding to read.
  Text("example_hex", Hex(EncodeGo({"A=1", "B=x=y"})), true);
  std::printf("  },\n  \"exit_notice\": {\n");
  Field("kExitNoticeSlotBytes", static_cast<long long>(kExitNoticeSlotBytes));
  Field("kExitNoticeSeqOffset", static_cast<long long>(kExitNoticeSeqOffset));
  Field("kExitNoticePidOffset", static_cast<long long>(kExitNoticePidOffset));
  Field("kExitNoticeTidOffset", static_cast<long long>(kExitNoticeTidOffset));
  Field("kExitNoticeMutexOffset", static_cast<long long>(kExitNoticeMutexOffset));
  Field("kMaxLocalRanks", kMaxLocalRanks, true);
  std::printf("  },\n  \"progress\": {\n");
  Field("ProgressRecord.bytes", static_cast<long long>(sizeof(ProgressRecord)));
  Field("ProgressRecord.magic", ProgressRecord{}.magic);
  Field("kCountedProgressMagic", kCountedProgressMagic);
  Field("StackDumpRecord.bytes", static_cast<long long>(sizeof(StackDumpRecord)));
  Field("StackDumpRecord.magic", StackDumpRecord{}.magic, true);
  std::printf("  }\n}\n");
  return 0;
}

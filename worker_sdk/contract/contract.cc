#include "launch_sdk/contract.h"

#include <cstring>

namespace launch_sdk {
namespace {

void PutU32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string EncodeGo(const std::vector<std::string>& env, uint32_t version) {
  size_t n = 0;
  for (const std::string& kv : env) n += kv.size() + 1;
  std::string msg(kGoMagic, kGoMagicBytes);
  msg.reserve(kGoHeaderBytes + n);
  PutU32(version, &msg);
  PutU32(static_cast<uint32_t>(n == 0 ? 0 : n - 1), &msg);
  for (size_t i = 0; i < env.size(); ++i) {
    if (i > 0) msg.push_back('\0');
    msg += env[i];
  }
  return msg;
}

uint32_t GoVersion(const char* first_bytes) {
  if (std::memcmp(first_bytes, kGoMagicV1, kGoMagicBytes) == 0) return 1;
  if (std::memcmp(first_bytes, kGoMagic, kGoMagicBytes) != 0) return 0;
  return GetU32(first_bytes + kGoMagicBytes);
}

uint32_t GoBodyLength(const char* header) { return GetU32(header + kGoVersionBytes); }

std::vector<std::string> DecodeGoBody(const std::string& body) {
  std::vector<std::string> env;
  for (size_t start = 0; start < body.size();) {
    size_t end = body.find('\0', start);
    if (end == std::string::npos) end = body.size();
    if (end > start) env.push_back(body.substr(start, end - start));
    start = end + 1;
  }
  return env;
}

std::string VersionSkew(uint32_t launch_version, uint32_t standby_version, const std::string& standby) {
  return "launch speaks worker contract version " + std::to_string(launch_version) + ", this standby's " + standby +
         " version " + std::to_string(standby_version) +
         ": install launch and launch-sdk (or launch's Python modules) of one release";
}

}  // namespace launch_sdk

#include "agent/log_relay.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace launch {

absl::StatusOr<StdSpec> ParseStdSpec(const std::string& value, const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, "=", value, ": ", why,
                     "; expected 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or a map like 0:1,1:2"));
  };
  auto parse_level = [](absl::string_view s, int* out) {
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(s), out) && *out >= 0 && *out <= 3;
  };
  StdSpec spec;
  std::string v(absl::StripAsciiWhitespace(value));
  if (v.empty()) return spec;
  if (v.find(':') == std::string::npos) {
    if (!parse_level(v, &spec.all)) return bad(absl::StrCat("'", v, "' is not a level"));
    return spec;
  }
  for (absl::string_view item : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    int rank, level;
    if (kv.size() != 2 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(kv[0]), &rank) || rank < 0) {
      return bad(absl::StrCat("'", item, "' is not local_rank:level"));
    }
    if (!parse_level(kv[1], &level)) return bad(absl::StrCat("'", item, "' has no level 0-3"));
    spec.per_rank[rank] = level;
  }
  return spec;
}

void WriteAll(int fd, const char* buf, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, buf, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // a closed console must not stop the workers
    }
    buf += w;
    n -= static_cast<size_t>(w);
  }
}

void LineRelay::EmitLines(const char* data, size_t n) {
  if (opts_.file_fd >= 0) WriteAll(opts_.file_fd, data, n);
  std::string out;
  if (opts_.console_fd >= 0) out.reserve(n + 16);
  size_t start = 0;
  while (start < n) {
    size_t end = start;
    while (end < n && data[end] != '\n') ++end;
    const size_t len = end - start;
    if (opts_.console_fd >= 0) {
      out.append(opts_.prefix);
      out.append(data + start, len);
      out.push_back('\n');
    }
    if (opts_.tail_lines > 0) {
      tail_.emplace_back(data + start, len);
      if (tail_.size() > opts_.tail_lines) tail_.pop_front();
    }
    start = end + 1;
  }
  // One write for the whole batch of lines: lines from different workers never interleave.
  if (opts_.console_fd >= 0) WriteAll(opts_.console_fd, out.data(), out.size());
}

void LineRelay::Feed(const char* data, size_t n) {
  size_t last_nl = n;
  for (size_t i = n; i > 0; --i) {
    if (data[i - 1] == '\n') {
      last_nl = i - 1;
      break;
    }
  }
  if (last_nl == n) {  // no newline: keep buffering
    partial_.append(data, n);
    return;
  }
  if (partial_.empty()) {
    EmitLines(data, last_nl + 1);
  } else {
    partial_.append(data, last_nl + 1);
    EmitLines(partial_.data(), partial_.size());
    partial_.clear();
  }
  partial_.append(data + last_nl + 1, n - last_nl - 1);
}

void LineRelay::Flush() {
  if (partial_.empty()) return;
  partial_.push_back('\n');
  // The file gets the bytes as the worker wrote them: no newline was there.
  int file_fd = opts_.file_fd;
  if (file_fd >= 0) WriteAll(file_fd, partial_.data(), partial_.size() - 1);
  opts_.file_fd = -1;
  EmitLines(partial_.data(), partial_.size());
  opts_.file_fd = file_fd;
  partial_.clear();
}

}  // namespace launch

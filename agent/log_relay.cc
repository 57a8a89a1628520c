#include "agent/log_relay.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <optional>

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

void LineRelay::Piece(std::string_view text, char end, std::string* batch) {
  if (opts_.console) {
    if (!batch->empty()) batch->append(opts_.prefix);  // the first piece's prefix: Send's
    batch->append(partial_);
    batch->append(text);
    batch->push_back(end);
  }
  // A progress bar's updates are not lines: the tail keeps what ended with a newline.
  const bool filtering = opts_.filtered_fd >= 0 && opts_.filters != nullptr && !opts_.filters->empty();
  if (end == '\n' && (opts_.tail_lines > 0 || filtering)) {
    std::string line = std::move(shown_);
    line.append(partial_);
    line.append(text.substr(0, kMaxLineBytes - std::min(kMaxLineBytes, line.size())));
    if (filtering) {
      for (const std::string& f : *opts_.filters) {
        if (line.find(f) == std::string::npos) continue;
        std::string copy = opts_.prefix + line + "\n";
        WriteAll(opts_.filtered_fd, copy.data(), copy.size());
        break;
      }
    }
    if (opts_.tail_lines > 0) {
      tail_.push_back(std::move(line));
      if (tail_.size() > opts_.tail_lines) tail_.pop_front();
    }
  }
  shown_.clear();
  partial_.clear();
  partial_since_.reset();
}

void LineRelay::Send(std::string* batch, bool open) {
  if (opts_.console && !batch->empty()) opts_.console->Write(this, opts_.prefix, *batch, open);
  batch->clear();
}

void LineRelay::Feed(const char* data, size_t n, Clock::TimePoint now) {
  // The file gets the bytes as the worker wrote them.
  if (opts_.file_fd >= 0) WriteAll(opts_.file_fd, data, n);
  std::string batch;  // one console write for the whole read
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = data[i];
    if (c != '\n' && c != '\r') continue;
    if (c == '\r' && i + 1 < n && data[i + 1] == '\n') {  // "\r\n" ends a line once
      Piece(std::string_view(data + start, i - start), '\n', &batch);
      start = ++i + 1;
      continue;
    }
    Piece(std::string_view(data + start, i - start), c, &batch);
    start = i + 1;
  }
  if (start < n) partial_since_ = now;  // the line's latest byte
  partial_.append(data + start, n - start);
  // A line without end: shown in pieces of kMaxLineBytes, the buffer never grows past that.
  while (partial_.size() >= kMaxLineBytes) {
    std::string rest = partial_.substr(kMaxLineBytes);
    partial_.resize(kMaxLineBytes);
    Piece({}, '\n', &batch);
    partial_ = std::move(rest);
    if (!partial_.empty()) partial_since_ = now;
  }
  Send(&batch, false);
}

std::optional<Clock::TimePoint> LineRelay::partial_due() const {
  if (!partial_since_) return std::nullopt;
  return *partial_since_ + kPartialLineDelay;
}

void LineRelay::ShowPartial() {
  if (partial_.empty()) return;
  if (opts_.console) opts_.console->Write(this, opts_.prefix, partial_, true);
  if (shown_.size() < kMaxLineBytes) shown_.append(partial_.substr(0, kMaxLineBytes - shown_.size()));
  partial_.clear();
  partial_since_.reset();
}

void LineRelay::Flush() {
  if (partial_.empty() && shown_.empty()) return;
  std::string batch;
  Piece({}, '\n', &batch);
  Send(&batch, false);
}

absl::StatusOr<std::string> FormatLinePrefix(std::string_view tmpl, const LinePrefixFields& f) {
  if (tmpl.size() > kMaxLinePrefixTemplate) {
    return absl::InvalidArgumentError(
        absl::StrCat("a template of ", tmpl.size(), " bytes; expected at most ", kMaxLinePrefixTemplate));
  }
  auto value = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "role_name") return f.role_name;
    if (name == "rank") return std::to_string(f.rank);
    if (name == "local_rank") return std::to_string(f.local_rank);
    if (name == "hostname") return f.hostname;
    return std::nullopt;
  };
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] != '$' || i + 1 == tmpl.size()) {
      out.push_back(tmpl[i]);
      continue;
    }
    if (tmpl[i + 1] == '$') {
      out.push_back('$');
      ++i;
    } else if (tmpl[i + 1] == '{') {
      const size_t close = tmpl.find('}', i + 2);
      std::string_view name = close == std::string_view::npos ? tmpl.substr(i + 2) : tmpl.substr(i + 2, close - i - 2);
      auto v = value(name);
      if (close == std::string_view::npos || !v) {
        return absl::InvalidArgumentError(
            absl::StrCat("'${", std::string(name.substr(0, 32)),
                         close == std::string_view::npos ? "' is not closed" : "}' is unknown",
                         "; expected ${role_name}, ${rank}, ${local_rank} or ${hostname}"));
      }
      out += *v;
      i = close;
    } else {
      size_t end = i + 1;
      while (end < tmpl.size() && ident(tmpl[end])) ++end;
      auto v = value(tmpl.substr(i + 1, end - i - 1));
      if (!v) {  // as Template.safe_substitute: left as written
        out.push_back('$');
        continue;
      }
      out += *v;
      i = end - 1;
    }
  }
  return out;
}

long DescriptorsNeeded(int nproc, bool log_files) { return kOwnDescriptors + nproc * (log_files ? 4L : 2L); }

}  // namespace launch

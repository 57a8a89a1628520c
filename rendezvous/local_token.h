// A coordinator on loopback without a token would serve every local user (one could list its
// nodes and forge a ReportExit that fails the job): it takes a random token and publishes it in a
// file only its user can read, and that user's clients of a loopback endpoint read it there, so
// same-user runs on one host need no flag and other users are refused.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace launch {

// The user's own directory for these files: $XDG_RUNTIME_DIR/launch when XDG_RUNTIME_DIR is set,
// else /tmp/launch-<uid>; created 0700, and used only when it is the user's and no one else's.
std::string LocalTokenDir();
// "<dir>/coordinator-<port>.token".
std::string LocalTokenPath(int port);

// The token file of a coordinator on `port`, removed when destroyed (unless another coordinator
// has published its own there since).
class LocalTokenFile {
 public:
  // Writes `token` (mode 0600, replacing a stale file atomically). Errors name the path.
  static absl::StatusOr<std::unique_ptr<LocalTokenFile>> Publish(int port, const std::string& token);
  ~LocalTokenFile();
  const std::string& path() const { return path_; }

 private:
  LocalTokenFile(std::string path, std::string token) : path_(std::move(path)), token_(std::move(token)) {}
  std::string path_, token_;
};

// The token a coordinator of this user on `port` published; empty when there is none, or when
// the file or its directory is not this user's alone.
std::string ReadLocalToken(int port);

// Whether a coordinator on `listen_host` with these settings takes a local token: loopback, no
// token, no TLS, not --insecure.
bool TakesLocalToken(const std::string& listen_host, const std::string& token, bool tls, bool insecure);

}  // namespace launch

// The coordinator's protection: a shared token on every RPC (compared in constant time) and TLS
// or mutual TLS through gRPC's SSL credentials. Used by both ends: `launch coordinator`, an
// agent-hosted coordinator, and every agent's channel.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"
#include "rendezvous/grpc_wire.h"  // kTokenMetadataKey

namespace launch {

struct SecurityOptions {
  std::string token;          // empty: none
  std::string tls_cert_file;  // PEM; server: its certificate; client: its own (mutual TLS)
  std::string tls_key_file;
  std::string tls_ca_file;  // server: require client certificates signed by it; client: trust it
  bool insecure = false;    // allow a non-loopback listener without token or TLS

  bool tls() const { return !tls_cert_file.empty() || !tls_ca_file.empty(); }
};

// The token from --rdzv-token-file (first line, trimmed) or else LAUNCH_RDZV_TOKEN.
inline constexpr size_t kMaxTokenLength = 1024;
absl::StatusOr<std::string> LoadToken(const std::string& token_file, const char* env_value);

// The TLS files, checked before anything starts: a readable PEM certificate with its matching
// unencrypted key (one never without the other), a PEM CA. Errors name the flag and the file.
absl::Status CheckSecurityFiles(const SecurityOptions& s);

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const SecurityOptions& s);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const SecurityOptions& s);

// Refuses a listener reachable from other hosts that has neither a token nor TLS (unless
// --insecure): an open coordinator lets anyone join a job and run code in it.
absl::Status CheckListenerIsProtected(const std::string& listen_host, const SecurityOptions& s);

// Equal strings, in time that depends only on their lengths.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace launch

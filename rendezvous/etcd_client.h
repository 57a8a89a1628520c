// A small client of etcd's v3 API (gRPC) for the replicated coordinators: ranges, guarded
// transactions and leases, over several endpoints (a call that finds one unreachable goes on to
// the next). Everything read back is bounded: etcd is shared infrastructure, so its answers are
// wire input.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "launch.pb.h"

namespace launch {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // host:port, each an etcd member's client URL
  std::string prefix = "/launch";      // every key of launch's lives under it
  // TLS (https client URLs) when a CA is given; a client certificate when cert and key are.
  std::string ca_file, cert_file, key_file;
  std::chrono::milliseconds call_timeout{2000};
};

// "etcd://h1:2379,h2:2379/prefix" (etcds:// for TLS): the endpoints and the key prefix.
absl::StatusOr<EtcdOptions> ParseEtcdUrl(const std::string& url);

class EtcdClient {
 public:
  struct Kv {
    std::string key, value;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
    int64_t lease = 0;
  };
  // The outcome of claiming a key that may exist: whether this call made it, and who holds it.
  struct Claim {
    bool won = false;
    Kv holder;
  };
  struct Write {
    std::vector<std::pair<std::string, std::string>> puts;
    // Deletes the keys in [first, second) ("" second: just the key first).
    std::vector<std::pair<std::string, std::string>> deletes;
  };

  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdOptions& opts);
  ~EtcdClient();

  // At most `limit` keys with `key` as their prefix (or just `key`), each at most kMaxEtcdValue.
  absl::StatusOr<std::vector<Kv>> Range(const std::string& key, bool prefix, int64_t limit);
  absl::StatusOr<int64_t> GrantLease(std::chrono::seconds ttl);
  // Renews the lease once: the seconds it has left (NotFound: it expired).
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  absl::Status Revoke(int64_t lease);
  // Puts key=value bound to `lease` unless the key exists.
  absl::StatusOr<Claim> ClaimKey(const std::string& key, const std::string& value, int64_t lease);
  // Applies `w` in one transaction if `guard` still exists with create revision `guard_revision`
  // (a leader's key: a replica that no longer leads writes nothing); false: it does not.
  absl::StatusOr<bool> GuardedWrite(const std::string& guard, int64_t guard_revision, const Write& w);
  // Each endpoint's answer to a status request.
  std::vector<v1::EtcdEndpointHealth> Health();
  const EtcdOptions& options() const { return opts_; }
  // The first key after every key that starts with `prefix` (etcd's range end for a prefix).
  static std::string PrefixEnd(std::string prefix);

 private:
  struct Endpoint;
  explicit EtcdClient(EtcdOptions opts);
  // Runs `call` against the current endpoint, then the others while they are unreachable.
  template <typename F>
  absl::Status OnSomeEndpoint(const char* what, F&& call);

  EtcdOptions opts_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::mutex mu_;
  size_t current_ = 0;  // under mu_
};

// The largest value launch reads from etcd, and how many keys one range may bring.
inline constexpr size_t kMaxEtcdValue = 1 << 20;
inline constexpr int64_t kMaxEtcdRange = 100000;

}  // namespace launch

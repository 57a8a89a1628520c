#include "rendezvous/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/net.h"
#include "common/status_macros.h"
#include LAUNCH_ETCD_RPC_HEADER  // etcd 3.4 or 3.5 layout (proto/CMakeLists.txt)
#include "rendezvous/security.h"

namespace launch {

namespace pb = etcdserverpb;

namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

bool Unreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) || absl::IsUnknown(s);
}

}  // namespace

std::string EtcdClient::PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char last = static_cast<unsigned char>(prefix.back());
    if (last < 0xff) {
      prefix.back() = static_cast<char>(last + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

absl::StatusOr<EtcdClient::Kv> ToKv(const mvccpb::KeyValue& kv) {
  if (kv.value().size() > kMaxEtcdValue || kv.key().size() > kMaxEtcdValue) {
    return absl::DataLossError(absl::StrCat("etcd key '", kv.key().substr(0, 64), "' holds ", kv.value().size(),
                                            " bytes (at most ", kMaxEtcdValue, " are read)"));
  }
  return EtcdClient::Kv{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}

}  // namespace

absl::StatusOr<EtcdOptions> ParseEtcdUrl(const std::string& url) {
  EtcdOptions o;
  std::string rest;
  if (absl::StartsWith(url, "etcd://")) {
    rest = url.substr(7);
  } else if (absl::StartsWith(url, "etcds://")) {
    rest = url.substr(8);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--state ", url, ": expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX]"));
  }
  if (size_t slash = rest.find('/'); slash != std::string::npos) {
    o.prefix = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (o.prefix.size() > 1 && o.prefix.back() == '/') o.prefix.pop_back();
  }
  for (absl::string_view e : absl::StrSplit(rest, ',', absl::SkipEmpty())) {
    auto parsed = ParseHostPort(std::string(e), "endpoint");
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--state ", url, ": ", parsed.status().message()));
    const HostPort& hp = *parsed;
    if (hp.host.empty())
      return absl::InvalidArgumentError(absl::StrCat("--state ", url, ": an endpoint without a host"));
    o.endpoints.push_back(JoinHostPort(hp.host, hp.port.value_or(2379)));
  }
  if (o.endpoints.empty() || o.endpoints.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--state ", url, ": expected 1-64 etcd endpoints"));
  }
  if (o.prefix.size() > 512)
    return absl::InvalidArgumentError(absl::StrCat("--state ", url, ": a prefix over 512 bytes"));
  return o;
}

struct EtcdClient::Endpoint {
  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::unique_ptr<pb::Maintenance::Stub> maintenance;
};

EtcdClient::EtcdClient(EtcdOptions opts) : opts_(std::move(opts)) {}
EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const EtcdOptions& opts) {
  SecurityOptions tls;
  tls.tls_ca_file = opts.ca_file;
  tls.tls_cert_file = opts.cert_file;
  tls.tls_key_file = opts.key_file;
  ASSIGN_OR_RETURN(auto creds, MakeChannelCredentials(tls));
  std::unique_ptr<EtcdClient> c(new EtcdClient(opts));
  for (const std::string& target : opts.endpoints) {
    auto e = std::make_unique<Endpoint>();
    e->target = target;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(4 * kMaxEtcdValue + (1 << 20)));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    e->channel = grpc::CreateCustomChannel(target, creds, args);
    e->kv = pb::KV::NewStub(e->channel);
    e->lease = pb::Lease::NewStub(e->channel);
    e->maintenance = pb::Maintenance::NewStub(e->channel);
    c->endpoints_.push_back(std::move(e));
  }
  return c;
}

template <typename F>
absl::Status EtcdClient::OnSomeEndpoint(const char* what, F&& call) {
  size_t first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = current_;
  }
  absl::Status last;
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t at = (first + i) % endpoints_.size();
    Endpoint& e = *endpoints_[at];
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + opts_.call_timeout);
    last = FromGrpc(call(e, &ctx), absl::StrCat("etcd ", what, " at ", e.target));
    if (!Unreachable(last)) {
      if (at != first) {
        std::lock_guard<std::mutex> lock(mu_);
        current_ = at;
      }
      return last;
    }
  }
  return last;
}

absl::StatusOr<std::vector<EtcdClient::Kv>> EtcdClient::Range(const std::string& key, bool prefix, int64_t limit) {
  limit = std::min(limit, kMaxEtcdRange);
  pb::RangeRequest req;
  req.set_key(key);
  if (prefix) req.set_range_end(PrefixEnd(key));
  req.set_limit(limit);
  pb::RangeResponse resp;
  RETURN_IF_ERROR(OnSomeEndpoint("range", [&](Endpoint& e, grpc::ClientContext* ctx) {
    resp.Clear();
    return e.kv->Range(ctx, req, &resp);
  }));
  std::vector<Kv> out;
  for (const auto& kv : resp.kvs()) {
    if (static_cast<int64_t>(out.size()) >= limit) break;
    ASSIGN_OR_RETURN(Kv k, ToKv(kv));
    out.push_back(std::move(k));
  }
  return out;
}

absl::StatusOr<int64_t> EtcdClient::GrantLease(std::chrono::seconds ttl) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  pb::LeaseGrantResponse resp;
  RETURN_IF_ERROR(OnSomeEndpoint("lease grant", [&](Endpoint& e, grpc::ClientContext* ctx) {
    return e.lease->LeaseGrant(ctx, req, &resp);
  }));
  if (!resp.error().empty()) return absl::UnavailableError(absl::StrCat("etcd lease grant: ", resp.error()));
  return resp.id();
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  pb::LeaseKeepAliveResponse resp;
  bool got = false;
  RETURN_IF_ERROR(OnSomeEndpoint("lease keep-alive", [&](Endpoint& e, grpc::ClientContext* ctx) {
    auto stream = e.lease->LeaseKeepAlive(ctx);
    pb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    got = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    if (got) ctx->TryCancel();  // one renewal is all this call is for
    grpc::Status s = stream->Finish();
    return got ? grpc::Status::OK : s;
  }));
  if (!got) return absl::UnavailableError("etcd lease keep-alive: no answer");
  if (resp.ttl() <= 0) return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " has expired"));
  return resp.ttl();
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  return OnSomeEndpoint("lease revoke",
                        [&](Endpoint& e, grpc::ClientContext* ctx) { return e.lease->LeaseRevoke(ctx, req, &resp); });
}

absl::StatusOr<EtcdClient::Claim> EtcdClient::ClaimKey(const std::string& key, const std::string& value,
                                                       int64_t lease) {
  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_key(key);
  cmp->set_target(pb::Compare::CREATE);
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_create_revision(0);
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  txn.add_success()->mutable_request_range()->set_key(key);
  txn.add_failure()->mutable_request_range()->set_key(key);
  pb::TxnResponse resp;
  RETURN_IF_ERROR(OnSomeEndpoint("claim", [&](Endpoint& e, grpc::ClientContext* ctx) {
    resp.Clear();
    return e.kv->Txn(ctx, txn, &resp);
  }));
  Claim c;
  const int n = resp.responses_size();
  if (n == 0 || !resp.responses(n - 1).has_response_range() || resp.responses(n - 1).response_range().kvs_size() != 1) {
    return absl::UnavailableError(absl::StrCat("etcd claim of ", key, ": the key went away meanwhile"));
  }
  ASSIGN_OR_RETURN(c.holder, ToKv(resp.responses(n - 1).response_range().kvs(0)));
  // A retried claim that had been applied finds this replica's own value and lease.
  c.won = resp.succeeded() || (c.holder.value == value && c.holder.lease == lease);
  return c;
}

absl::StatusOr<bool> EtcdClient::GuardedWrite(const std::string& guard, int64_t guard_revision, const Write& w) {
  pb::TxnRequest txn;
  pb::Compare* cmp = txn.add_compare();
  cmp->set_key(guard);
  cmp->set_target(pb::Compare::CREATE);
  cmp->set_result(pb::Compare::EQUAL);
  cmp->set_create_revision(guard_revision);
  for (const auto& [k, v] : w.puts) {
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(k);
    put->set_value(v);
  }
  for (const auto& [from, to] : w.deletes) {
    pb::DeleteRangeRequest* del = txn.add_success()->mutable_request_delete_range();
    del->set_key(from);
    if (!to.empty()) del->set_range_end(to);
  }
  pb::TxnResponse resp;
  RETURN_IF_ERROR(
      OnSomeEndpoint("write", [&](Endpoint& e, grpc::ClientContext* ctx) { return e.kv->Txn(ctx, txn, &resp); }));
  return resp.succeeded();
}

std::vector<v1::EtcdEndpointHealth> EtcdClient::Health() {
  std::vector<v1::EtcdEndpointHealth> out;
  for (auto& e : endpoints_) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    pb::StatusRequest req;
    pb::StatusResponse resp;
    grpc::Status s = e->maintenance->Status(&ctx, req, &resp);
    v1::EtcdEndpointHealth h;
    h.set_endpoint(e->target);
    h.set_healthy(s.ok() && resp.leader() != 0);
    if (!s.ok()) h.set_error(s.error_message().substr(0, 200));
    else if (resp.leader() == 0) h.set_error("no etcd leader (no quorum)");
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace launch

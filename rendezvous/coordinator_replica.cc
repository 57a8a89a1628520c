#include "rendezvous/coordinator_replica.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/net.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "rendezvous/local_token.h"
#include "spdlog/spdlog.h"

namespace launch {

namespace {

// Runs a new leader carries on at most (anything more in etcd is not launch's doing).
constexpr int64_t kMaxKeptRuns = 10000;
// A record's members go into chunks of about this size (etcd refuses requests over 1.5 MiB).
constexpr size_t kChunkBytes = 512 * 1024;
constexpr int kMaxChunks = 1024;
// How often a standby looks for a leader, and the health of the etcd endpoints is taken.
constexpr std::chrono::milliseconds kStandbyPoll{250};
constexpr std::chrono::seconds kHealthEvery{5};

std::string Padded(uint64_t n, int width) { return absl::StrFormat("%0*d", width, n); }

double UnixNow() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

CoordinatorReplica::CoordinatorReplica(ReplicaOptions opts, CoordinatorService* service,
                                       std::unique_ptr<EtcdClient> etcd)
    : opts_(std::move(opts)), service_(service), etcd_(std::move(etcd)) {}

absl::StatusOr<std::unique_ptr<CoordinatorReplica>> CoordinatorReplica::Start(ReplicaOptions opts,
                                                                              CoordinatorService* service) {
  ASSIGN_OR_RETURN(auto etcd, EtcdClient::Connect(opts.etcd));
  std::string endpoints;
  for (const auto& e : opts.etcd.endpoints) absl::StrAppend(&endpoints, endpoints.empty() ? "" : ",", e);
  if (auto probe = etcd->Range(opts.etcd.prefix + "/leader", false, 1); !probe.ok()) {
    // A refused TLS handshake reads as a connection that failed: say where to look.
    const bool tls = !opts.etcd.ca_file.empty();
    return absl::UnavailableError(absl::StrCat(
        "cannot use etcd at ", endpoints, " for the coordinator's state: ", probe.status().message(),
        tls && absl::IsUnavailable(probe.status())
            ? " (over TLS: check that --etcd-cacert signed etcd's certificate and that etcd accepts --etcd-cert)"
            : ""));
  }
  std::unique_ptr<CoordinatorReplica> r(new CoordinatorReplica(std::move(opts), service, std::move(etcd)));
  service->set_store(r.get());
  r->thread_ = std::thread([raw = r.get()] {
    NameThisThread("launch-replica");
    raw->Loop();
  });
  spdlog::info("coordinator replica {}: state in etcd at {} (prefix {}), leader lease {} s", r->opts_.advertise,
               endpoints, r->opts_.etcd.prefix, r->opts_.lease_ttl.count());
  return r;
}

CoordinatorReplica::~CoordinatorReplica() { Stop(); }

void CoordinatorReplica::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  int64_t lease;
  bool leading;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = lease_;
    leading = leading_;
    lease_ = 0;
    leading_ = false;
  }
  if (leading) service_->StandBy("");
  // The leader key goes with the lease: a standby leads at once instead of after the lease's TTL.
  if (lease != 0) (void)etcd_->Revoke(lease);
}

void CoordinatorReplica::Loop() {
  auto health_due = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const bool leading = leading_;
    const bool stand_by = std::exchange(stand_by_, false);
    lock.unlock();
    if (stand_by) {
      spdlog::warn("coordinator replica {} no longer leads: another replica does", opts_.advertise);
      service_->StandBy("");
    }
    if (leading) Renew();
    else Campaign();
    if (std::chrono::steady_clock::now() >= health_due) {
      auto health = etcd_->Health();
      health_due = std::chrono::steady_clock::now() + kHealthEvery;
      lock.lock();
      health_ = std::move(health);
    } else {
      lock.lock();
    }
    const auto wait = leading_ ? std::chrono::duration_cast<std::chrono::milliseconds>(opts_.lease_ttl) / 3
                               : kStandbyPoll;
    wake_.wait_for(lock, wait, [&] { return stop_; });
  }
}

void CoordinatorReplica::Campaign() {
  auto held = etcd_->Range(LeaderKey(), false, 1);
  if (!held.ok()) return;  // etcd unreachable or without quorum: nobody can lead now
  int64_t lease;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = lease_;
  }
  if (!held->empty()) {
    const EtcdClient::Kv& k = held->front();
    if (k.lease != lease || lease == 0) {
      std::string leader = k.value.substr(0, 256);
      bool changed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        changed = leader != leader_;
        if (changed && !leader_.empty()) ++leaderships_seen_;
        leader_ = leader;
      }
      if (changed) {
        spdlog::info("coordinator replica {} stands by; the leader is at {}", opts_.advertise, leader);
        service_->StandBy(leader);
      }
      return;
    }
  }
  if (lease == 0) {
    auto granted = etcd_->GrantLease(opts_.lease_ttl);
    if (!granted.ok()) return;
    lease = *granted;
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = lease;
  }
  const auto asked = std::chrono::steady_clock::now();
  auto claim = etcd_->ClaimKey(LeaderKey(), opts_.advertise, lease);
  if (!claim.ok()) return;
  if (!claim->won) {  // taken meanwhile: by the holder
    const std::string leader = claim->holder.value.substr(0, 256);
    bool changed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      changed = leader != leader_;
      if (changed && !leader_.empty()) ++leaderships_seen_;
      leader_ = leader;
    }
    if (changed) {
      spdlog::info("coordinator replica {} stands by; the leader is at {}", opts_.advertise, leader);
      service_->StandBy(leader);
    }
    return;
  }
  auto runs = LoadRuns();
  if (!runs.ok()) {
    spdlog::warn("coordinator replica {} won the election but cannot read the runs from etcd ({}); giving it up",
                 opts_.advertise, std::string(runs.status().message()));
    (void)etcd_->Revoke(lease);
    std::lock_guard<std::mutex> lock(mu_);
    lease_ = 0;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    leading_ = true;
    leader_revision_ = claim->holder.create_revision;
    renewed_ = asked;
    if (!leader_.empty() && leader_ != opts_.advertise) ++leaderships_seen_;
    leader_ = opts_.advertise;
    leading_since_unix_ = UnixNow();
  }
  spdlog::info("coordinator replica {} leads ({} run(s) carried on from etcd)", opts_.advertise, runs->size());
  service_->Lead(*runs);
}

bool CoordinatorReplica::Renew() {
  int64_t lease;
  std::chrono::steady_clock::time_point renewed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = lease_;
    renewed = renewed_;
  }
  const auto asked = std::chrono::steady_clock::now();
  auto left = etcd_->KeepAlive(lease);
  if (left.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    renewed_ = asked;
    return true;
  }
  if (absl::IsNotFound(left.status())) {
    StepDown("its etcd lease expired");
    return false;
  }
  // etcd lets the lease expire a TTL after the last renewal it took: this replica stops leading
  // before another one can start.
  if (std::chrono::steady_clock::now() - renewed >= opts_.lease_ttl - opts_.lease_ttl / 6) {
    StepDown(absl::StrCat("it could not renew its etcd lease (", left.status().message(), ")"));
    return false;
  }
  return true;
}

void CoordinatorReplica::StepDown(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!leading_) return;
    leading_ = false;
    lease_ = 0;
    leader_.clear();
    leading_since_unix_ = 0;
  }
  spdlog::warn("coordinator replica {} no longer leads: {}", opts_.advertise, why);
  service_->StandBy("");
}

absl::Status CoordinatorReplica::Save(const std::vector<v1::RunRecord>& records,
                                      const std::vector<std::string>& removed) {
  int64_t revision;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!leading_) return absl::UnavailableError("this replica does not lead");
    revision = leader_revision_;
  }
  auto guarded = [&](const EtcdClient::Write& w) -> absl::Status {
    ASSIGN_OR_RETURN(bool applied, etcd_->GuardedWrite(LeaderKey(), revision, w));
    if (applied) return absl::OkStatus();
    {
      // The loop stands the service by (not here: the service's store lock is held).
      std::lock_guard<std::mutex> lock(mu_);
      leading_ = false;
      lease_ = 0;
      leader_.clear();
      leading_since_unix_ = 0;
      stand_by_ = true;
      wake_.notify_all();
    }
    return absl::UnavailableError("another replica leads now");
  };
  for (const v1::RunRecord& record : records) {
    v1::RunRecord head = record;
    head.clear_members();
    const std::string gen = MembersKey(record.run_id()) + Padded(record.version(), 20) + "/";
    v1::RunRecord chunk;
    size_t chunk_bytes = 0;  // an upper bound of chunk's size, kept as members are added
    int chunks = 0;
    auto flush = [&]() -> absl::Status {
      EtcdClient::Write w;
      w.puts.emplace_back(gen + Padded(chunks, 6), chunk.SerializeAsString());
      RETURN_IF_ERROR(guarded(w));
      ++chunks;
      chunk.Clear();
      chunk_bytes = 0;
      return absl::OkStatus();
    };
    for (const v1::MemberRecord& m : record.members()) {
      // The member's bytes plus its field's tag and length (at most 2 + 5 bytes); sizing the whole
      // chunk again for each member made a 16,384-node round's save take seconds of CPU.
      *chunk.add_members() = m;
      chunk_bytes += m.ByteSizeLong() + 7;
      if (chunk_bytes >= kChunkBytes) RETURN_IF_ERROR(flush());
    }
    if (chunk.members_size() > 0) RETURN_IF_ERROR(flush());
    head.set_member_chunks(chunks);
    EtcdClient::Write w;
    w.puts.emplace_back(RunKey(record.run_id()), head.SerializeAsString());
    w.deletes.emplace_back(MembersKey(record.run_id()), gen);  // the older generations
    RETURN_IF_ERROR(guarded(w));
  }
  for (const std::string& id : removed) {
    EtcdClient::Write w;
    w.deletes.emplace_back(RunKey(id), "");
    w.deletes.emplace_back(MembersKey(id), EtcdClient::PrefixEnd(MembersKey(id)));
    RETURN_IF_ERROR(guarded(w));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::RunRecord>> CoordinatorReplica::LoadRuns() {
  const std::string prefix = opts_.etcd.prefix + "/runs/";
  ASSIGN_OR_RETURN(auto heads, etcd_->Range(prefix, true, kMaxKeptRuns + 1));
  if (static_cast<int64_t>(heads.size()) > kMaxKeptRuns) {
    spdlog::warn("etcd holds more than {} runs under {}: carrying on the first {}", kMaxKeptRuns, prefix, kMaxKeptRuns);
    heads.resize(kMaxKeptRuns);
  }
  std::vector<v1::RunRecord> runs;
  for (const EtcdClient::Kv& head : heads) {
    auto run = LoadRun(head);
    if (run.ok()) {
      runs.push_back(std::move(*run));
    } else if (absl::IsUnavailable(run.status())) {
      return run.status();
    } else {
      spdlog::warn("left out a run kept in etcd: {}", std::string(run.status().message()));
    }
  }
  return runs;
}

absl::StatusOr<v1::RunRecord> CoordinatorReplica::LoadRun(const EtcdClient::Kv& head) {
  const std::string id = head.key.substr((opts_.etcd.prefix + "/runs/").size());
  v1::RunRecord r;
  if (!r.ParseFromString(head.value) || r.run_id() != id || r.members_size() != 0) {
    return absl::DataLossError(absl::StrCat("key ", head.key.substr(0, 200), " does not hold a run's record"));
  }
  if (r.member_chunks() < 0 || r.member_chunks() > kMaxChunks) {
    return absl::DataLossError(
        absl::StrCat("run '", id, "': ", r.member_chunks(), " member chunks (at most ", kMaxChunks, ")"));
  }
  const std::string gen = MembersKey(id) + Padded(r.version(), 20) + "/";
  ASSIGN_OR_RETURN(auto chunks, etcd_->Range(gen, true, r.member_chunks() + 1));
  if (static_cast<int>(chunks.size()) != r.member_chunks()) {
    return absl::DataLossError(
        absl::StrCat("run '", id, "': ", chunks.size(), " member chunks in etcd, its record says ", r.member_chunks()));
  }
  for (const EtcdClient::Kv& c : chunks) {  // in key order: the chunks' numbers are zero-padded
    v1::RunRecord part;
    if (!part.ParseFromString(c.value))
      return absl::DataLossError(absl::StrCat("run '", id, "': a damaged member chunk"));
    if (r.members_size() + part.members_size() > r.spec().max_nodes()) {
      return absl::DataLossError(
          absl::StrCat("run '", id, "': more members than its --nnodes max ", r.spec().max_nodes()));
    }
    for (auto& m : *part.mutable_members()) *r.add_members() = std::move(m);
  }
  r.set_member_chunks(0);
  return r;
}

v1::ReplicaStatus CoordinatorReplica::Describe() {
  std::lock_guard<std::mutex> lock(mu_);
  v1::ReplicaStatus s;
  s.set_replica(opts_.advertise);
  s.set_leader(leader_);
  s.set_leading(leading_);
  s.set_leader_since_unix(leading_ ? leading_since_unix_ : 0);
  s.set_failovers(leaderships_seen_);
  for (const auto& h : health_) *s.add_etcd() = h;
  return s;
}

void CoordinatorReplica::ForwardStatus(const v1::StatusRequest& req, v1::StatusResponse* resp,
                                       std::function<void(absl::Status)> done) {
  std::string leader;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader = leader_;
  }
  // Asked afresh: the leader may have changed since this standby last looked (it looks every
  // kStandbyPoll).
  if (auto held = etcd_->Range(LeaderKey(), false, 1); held.ok()) {
    leader = held->empty() ? "" : held->front().value.substr(0, 256);
    std::lock_guard<std::mutex> lock(mu_);
    if (!leading_ && !leader.empty() && leader != leader_) {
      if (!leader_.empty()) ++leaderships_seen_;
      leader_ = leader;  // what Describe says with the answer
    }
  }
  if (leader.empty() || leader == opts_.advertise) {
    done(absl::UnavailableError("no coordinator replica leads now (etcd unreachable or an election under way)"));
    return;
  }
  std::shared_ptr<v1::Rendezvous::Stub> stub;
  {
    std::lock_guard<std::mutex> lock(forward_mu_);
    if (forward_target_ != leader || !forward_stub_) {
      auto creds = MakeChannelCredentials(opts_.security);
      if (!creds.ok()) {
        done(creds.status());
        return;
      }
      forward_channel_ = grpc::CreateChannel(leader, *creds);
      forward_stub_ = v1::Rendezvous::NewStub(forward_channel_);  // calls in flight keep the old one
      forward_target_ = leader;
    }
    stub = forward_stub_;
  }
  struct Call {
    std::shared_ptr<v1::Rendezvous::Stub> stub;
    grpc::ClientContext ctx;
    v1::StatusRequest req;
    std::function<void(absl::Status)> done;
  };
  auto* call = new Call;
  call->stub = stub;
  call->req = req;
  call->done = std::move(done);
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::string token = opts_.security.token;
  if (auto hp = ParseHostPort(leader, "leader");
      hp.ok() && hp->port && TakesLocalToken(hp->host, token, opts_.security.tls(), opts_.security.insecure)) {
    token = ReadLocalToken(*hp->port);  // a leader on loopback without a token published its own
  }
  if (!token.empty()) call->ctx.AddMetadata(kTokenMetadataKey, token);
  stub->async()->Status(&call->ctx, &call->req, resp, [call, leader](grpc::Status s) {
    call->done(s.ok() ? absl::OkStatus()
                      : absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                     absl::StrCat("the leader at ", leader, ": ", s.error_message())));
    delete call;
  });
}

}  // namespace launch

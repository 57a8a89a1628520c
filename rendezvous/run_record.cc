// A run's record as a replicated coordinator keeps it in etcd, and the run rebuilt from it.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "rendezvous/coordinator_session.h"
#include "rendezvous/lease.h"
#include "rendezvous/rendezvous.h"

namespace launch {

namespace {

constexpr size_t kMaxRecordText = 4096;  // a reason or a lost node's line, as kept

bool Printable(const std::string& s, size_t max) {
  return !s.empty() && s.size() <= max && std::all_of(s.begin(), s.end(), [](char c) { return c > ' ' && c < 127; });
}

absl::Status Bad(const v1::RunRecord& r, const std::string& what) {
  return absl::DataLossError(absl::StrCat("the etcd record of run '", r.run_id().substr(0, 64), "': ", what));
}

absl::Status CheckMember(const v1::RunRecord& r, const RendezvousConfig& c, int rank, const v1::MemberRecord& m) {
  const v1::NodeIdentity& n = m.node();
  const std::string at = absl::StrCat("member ", rank, ": ");
  if (!Printable(n.node_id(), kMaxNodeIdLength)) return Bad(r, at + "node id missing, too long or not printable");
  if (n.local_world_size() < 1 || n.local_world_size() > kMaxWorkersPerNode) {
    return Bad(r, absl::StrCat(at, "local_world_size ", n.local_world_size(), " is not 1-", kMaxWorkersPerNode));
  }
  if (n.hostname().size() > kMaxHostLength || n.host_address().size() > kMaxHostLength) {
    return Bad(r, absl::StrCat(at, "host name or address over ", kMaxHostLength, " bytes"));
  }
  if (n.addresses_size() > kMaxNodeAddresses) {
    return Bad(r, absl::StrCat(at, n.addresses_size(), " addresses (at most ", kMaxNodeAddresses, ")"));
  }
  for (const std::string& a : n.addresses()) {
    if (!Printable(a, kMaxAddressLength)) return Bad(r, at + "an address missing, too long or not printable");
  }
  if (!m.lease_key().empty() && m.lease_key().size() != kLeaseKeyBytes) {
    return Bad(r, absl::StrCat(at, "a lease key of ", m.lease_key().size(), " bytes (expected ", kLeaseKeyBytes, ")"));
  }
  const v1::Assignment& a = m.assignment();
  if (absl::Status st = ValidateAssignment(a, n.local_world_size()); !st.ok())
    return Bad(r, at + std::string(st.message()));
  if (a.round() != r.round() || a.group_rank() != rank || a.group_world_size() != r.members_size() ||
      a.max_restarts() != c.max_restarts) {
    return Bad(r, absl::StrCat(at, "an assignment for round ", a.round(), ", group rank ", a.group_rank(), " of ",
                               a.group_world_size(), " (expected round ", r.round(), ", group rank ", rank, " of ",
                               r.members_size(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<RendezvousConfig> CheckRecord(const v1::RunRecord& r) {
  if (!Printable(r.run_id(), kMaxRunIdLength)) return Bad(r, "run id missing, too long or not printable");
  auto config = RendezvousConfig::FromSpec(r.spec());
  if (!config.ok()) return Bad(r, std::string(config.status().message()));
  const RendezvousConfig& c = *config;
  if (r.phase() < static_cast<int>(Rendezvous::Phase::kWaiting) ||
      r.phase() > static_cast<int>(Rendezvous::Phase::kFailed)) {
    return Bad(r, absl::StrCat("phase ", r.phase(), " (expected 0-3)"));
  }
  if (r.round() < 0 || r.round() > kMaxRound)
    return Bad(r, absl::StrCat("round ", r.round(), " (expected 0-", kMaxRound, ")"));
  if (r.restart_count() < 0 || r.restart_count() > c.max_restarts) {
    return Bad(r, absl::StrCat("restart count ", r.restart_count(), " (expected 0-", c.max_restarts, ")"));
  }
  if (r.lease_key().size() != kLeaseKeyBytes) {
    return Bad(r, absl::StrCat("a lease key of ", r.lease_key().size(), " bytes (expected ", kLeaseKeyBytes, ")"));
  }
  if (r.members_size() > c.max_nodes || (r.round() > 0) != (r.members_size() > 0)) {
    return Bad(r, absl::StrCat(r.members_size(), " members in round ", r.round(), " (expected 1-", c.max_nodes,
                               " once a round formed, none before)"));
  }
  if (r.reason().size() > kMaxRecordText || r.lost_size() > c.max_nodes)
    return Bad(r, "a reason or lost list too long");
  for (const std::string& l : r.lost())
    if (l.size() > kMaxRecordText) return Bad(r, "a lost node's line too long");
  absl::flat_hash_set<std::string> ids;
  for (int i = 0; i < r.members_size(); ++i) {
    RETURN_IF_ERROR(CheckMember(r, c, i, r.members(i)));
    if (!ids.insert(r.members(i).node().node_id()).second)
      return Bad(r, absl::StrCat("member ", i, ": a node id twice"));
  }
  if (r.has_first_failure() && r.first_failure().exit().error_message().size() > kMaxWireErrorMessage) {
    return Bad(r, "the first failure's message too long");
  }
  return c;
}

}  // namespace

v1::RunRecord Rendezvous::ToRecord() const {
  v1::RunRecord r;
  // A run rebuilt from re-registrations is kept once every rank is back (a partial round could
  // not be carried on).
  if (static_cast<int>(members_.size()) != group_world_size_) return r;
  r.set_run_id(run_id_);
  *r.mutable_spec() = config_.ToSpec();
  r.set_phase(static_cast<int>(phase_));
  r.set_round(round_);
  r.set_restart_count(restart_count_);
  r.set_version(version_);
  r.set_reason(reason_.substr(0, kMaxRecordText));
  if (first_failure_) *r.mutable_first_failure() = *first_failure_;
  r.set_stopped_for_hang(stopped_for_hang_);
  std::vector<const Member*> by_rank(members_.size(), nullptr);
  for (const Member& m : members_) {
    if (m.group_rank < 0 || m.group_rank >= group_world_size_ || by_rank[m.group_rank] != nullptr)
      return v1::RunRecord();
    by_rank[m.group_rank] = &m;
  }
  for (const Member* m : by_rank) {
    v1::MemberRecord* mr = r.add_members();
    auto id = identities_.find(m->id);
    if (id != identities_.end()) *mr->mutable_node() = id->second;
    *mr->mutable_assignment() = m->assignment;
    mr->set_succeeded(m->succeeded);
  }
  for (const std::string& l : lost_) r.add_lost(l.substr(0, kMaxRecordText));
  return r;
}

absl::StatusOr<std::unique_ptr<Rendezvous>> Rendezvous::FromRecord(const v1::RunRecord& record, const Clock* clock) {
  ASSIGN_OR_RETURN(RendezvousConfig config, CheckRecord(record));
  auto r = std::make_unique<Rendezvous>(record.run_id(), config, clock);
  const auto now = clock->Now();
  r->phase_ = static_cast<Phase>(record.phase());
  r->round_ = static_cast<long>(record.round());
  r->restart_count_ = record.restart_count();
  r->version_ = record.version();
  r->reason_ = record.reason();
  if (record.has_first_failure()) r->first_failure_ = record.first_failure();
  r->stopped_for_hang_ = record.stopped_for_hang();
  r->waiting_since_ = now;
  r->ended_at_ = now;
  for (int i = 0; i < record.members_size(); ++i) {
    const v1::MemberRecord& m = record.members(i);
    const std::string& id = m.node().node_id();
    r->members_.push_back(Member{id, i, now, m.succeeded(), 0, m.assignment()});
    r->member_index_[id] = static_cast<size_t>(i);
    r->ranks_taken_.insert(i);
    r->identities_[id] = m.node();
  }
  r->group_world_size_ = record.members_size();
  r->lost_count_ = static_cast<size_t>(record.lost_size());
  for (const std::string& l : record.lost()) {
    if (r->lost_.size() == kMaxListedItems) break;
    r->lost_.push_back(l);
  }
  return r;
}

}  // namespace launch

#include "rendezvous/rendezvous.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "common/strings.h"

namespace launch {

namespace {
using Ms = std::chrono::milliseconds;

double Secs(Ms d) { return static_cast<double>(d.count()) / 1000.0; }

absl::StatusOr<Ms> FromSecs(double s, const char* what, bool positive) {
  if (!std::isfinite(s) || s < 0 || (positive && s < kMinPositiveSeconds) || s > kMaxSeconds) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "=", s, ": expected a number of seconds", positive ? " > 0" : " >= 0"));
  }
  return SecondsToMs(s);
}
}  // namespace

absl::StatusOr<double> CheckStragglerFactor(double f) {
  if (f == 0 || (std::isfinite(f) && f >= 1 && f <= kMaxStragglerFactor)) return f;
  return absl::InvalidArgumentError(
      absl::StrCat("straggler factor ", f, ": expected 0 (off) or 1-", kMaxStragglerFactor));
}

const char* PhaseName(Rendezvous::Phase p) {
  switch (p) {
    case Rendezvous::Phase::kWaiting:
      return "waiting";
    case Rendezvous::Phase::kRunning:
      return "running";
    case Rendezvous::Phase::kSucceeded:
      return "succeeded";
    case Rendezvous::Phase::kFailed:
      return "failed";
  }
  return "?";
}

v1::RunSpec RendezvousConfig::ToSpec() const {
  v1::RunSpec s;
  s.set_min_nodes(min_nodes);
  s.set_max_nodes(max_nodes);
  s.set_max_restarts(max_restarts);
  s.set_join_timeout_s(Secs(join_timeout));
  s.set_last_call_timeout_s(Secs(last_call_timeout));
  s.set_close_timeout_s(Secs(close_timeout));
  s.set_heartbeat_timeout_s(Secs(heartbeat_timeout));
  s.set_straggler_factor(straggler_factor);
  return s;
}

absl::StatusOr<RendezvousConfig> RendezvousConfig::FromSpec(const v1::RunSpec& s) {
  RendezvousConfig c;
  if (s.min_nodes() < 1 || s.max_nodes() < s.min_nodes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nnodes ", s.min_nodes(), ":", s.max_nodes(), ": expected 1 <= MIN <= MAX"));
  }
  if (s.max_nodes() > kMaxNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nnodes ", s.min_nodes(), ":", s.max_nodes(), ": at most ", kMaxNodes, " nodes"));
  }
  if (s.max_restarts() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_restarts=", s.max_restarts(), ": expected >= 0"));
  }
  ASSIGN_OR_RETURN(c.straggler_factor, CheckStragglerFactor(s.straggler_factor()));
  c.min_nodes = s.min_nodes();
  c.max_nodes = s.max_nodes();
  c.max_restarts = s.max_restarts();
  auto jt = FromSecs(s.join_timeout_s(), "join_timeout", true);
  auto lc = FromSecs(s.last_call_timeout_s(), "last_call_timeout", false);
  auto ct = FromSecs(s.close_timeout_s(), "close_timeout", false);
  auto ht = FromSecs(s.heartbeat_timeout_s(), "heartbeat_timeout", true);
  for (const auto* st : {&jt, &lc, &ct, &ht})
    if (!st->ok()) return st->status();
  c.join_timeout = *jt;
  c.last_call_timeout = *lc;
  c.close_timeout = *ct;
  c.heartbeat_timeout = *ht;
  return c;
}

std::string DescribeSpec(const v1::RunSpec& s) {
  return absl::StrFormat(
      "--nnodes %d:%d, --max-restarts %d, join_timeout %gs, last_call_timeout %gs, close_timeout %gs, "
      "heartbeat_timeout %gs",
      s.min_nodes(), s.max_nodes(), s.max_restarts(), s.join_timeout_s(), s.last_call_timeout_s(), s.close_timeout_s(),
      s.heartbeat_timeout_s());
}

Rendezvous::Rendezvous(std::string run_id, RendezvousConfig config, const Clock* clock)
    : run_id_(std::move(run_id)), config_(config), clock_(clock), waiting_since_(clock->Now()) {}

std::string Rendezvous::NodeName(const std::string& id) const {
  auto it = identities_.find(id);
  if (it == identities_.end() || it->second.hostname().empty()) return Shown(id);
  return absl::StrCat(Shown(it->second.hostname()), " (", Shown(it->second.host_address()), ", node ", Shown(id), ")");
}

Rendezvous::Member* Rendezvous::FindMember(const std::string& id) {
  auto it = member_index_.find(id);
  if (it == member_index_.end()) return nullptr;
  LAUNCH_CHECK(it->second < members_.size())
      << "node " << id << " indexed as member " << it->second << " of " << members_.size();
  return &members_[it->second];
}
const Rendezvous::Member* Rendezvous::FindMember(const std::string& id) const {
  return const_cast<Rendezvous*>(this)->FindMember(id);
}

absl::Status Rendezvous::Join(const v1::JoinRequest& req) {
  const std::string& id = req.node().node_id();
  if (id.empty()) return absl::InvalidArgumentError("join without a node id");
  if (req.node().local_world_size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", Shown(id), " joined with local_world_size ", req.node().local_world_size()));
  }
  if (req.has_spec()) {
    v1::RunSpec mine = config_.ToSpec();
    if (req.spec().min_nodes() != mine.min_nodes() || req.spec().max_nodes() != mine.max_nodes() ||
        req.spec().max_restarts() != mine.max_restarts()) {
      return absl::FailedPreconditionError(absl::StrCat("run '", Shown(run_id_), "' has ", DescribeSpec(mine),
                                                        "; this node asks for ", DescribeSpec(req.spec())));
    }
  }
  if (ended()) {
    return absl::FailedPreconditionError(
        absl::StrCat("run '", Shown(run_id_), "' has ended (", PhaseName(phase_), ")"));
  }
  RETURN_IF_ERROR(RoomToKnow(id));
  const bool member = FindMember(id) != nullptr;
  if (phase_ == Phase::kRunning && !member && static_cast<int>(members_.size()) >= config_.max_nodes) {
    identities_[id] = req.node();
    refused_.erase(id);
    return AddSpare(req);
  }
  identities_[id] = req.node();
  refused_.erase(id);
  if (phase_ == Phase::kRunning) {
    // A node (new, or back after being cut off) asks in while a round runs: the next round takes
    // it; the running nodes learn of it at once. No restart budget is spent.
    OpenNextRound(absl::StrCat("node ", NodeName(id), " joined"));
  }
  if (waiting_ids_.contains(id)) {  // a retry: refresh what it offers
    for (auto& w : waiting_) {
      if (w.join.node().node_id() != id) continue;
      CountAddresses(w.join.node(), -1);
      absl::Status fits = AddressesFit(req.node());
      CountAddresses(fits.ok() ? req.node() : w.join.node(), +1);
      if (!fits.ok()) return fits;
      w.join = req;
    }
    return absl::OkStatus();
  }
  // Every place of the round being formed is taken (a spare took the place of a node that left or
  // was lost, and that node is back): it waits as a spare, a member of the last round too. (The
  // fuzzer found a member exempt here: the round formed with more than MAX nodes.)
  if (static_cast<int>(waiting_.size()) >= config_.max_nodes) return AddSpare(req);
  // A newcomer does not take the place of a live node of the last round that has yet to re-join.
  if (!member && static_cast<int>(waiting_.size()) + LiveMembersNotWaiting() >= config_.max_nodes) {
    return AddSpare(req);
  }
  RETURN_IF_ERROR(AddressesFit(req.node()));
  RemoveSpare(id);
  AddWaiting(req);
  if (ReadyToForm()) FormRound();
  return absl::OkStatus();
}

void Rendezvous::CountAddresses(const v1::NodeIdentity& n, int delta) {
  auto count = [&](const std::string& a) {
    if (a.empty()) return;
    int& refs = address_refs_[a];
    if (refs == 0) address_bytes_ += WireAddressBytes(a.size());
    refs += delta;
    if (refs == 0) {
      address_bytes_ -= WireAddressBytes(a.size());
      address_refs_.erase(a);
    }
  };
  absl::flat_hash_set<std::string> mine(n.addresses().begin(), n.addresses().end());
  mine.insert(n.host_address());
  for (const auto& a : mine) count(a);
}

absl::Status Rendezvous::AddressesFit(const v1::NodeIdentity& n) const {
  absl::flat_hash_set<std::string> mine(n.addresses().begin(), n.addresses().end());
  if (!n.host_address().empty()) mine.insert(n.host_address());
  size_t more = 0;
  for (const auto& a : mine) {
    if (!address_refs_.contains(a)) more += WireAddressBytes(a.size());
  }
  if (address_bytes_ + more <= kMaxMemberAddressBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "node %s brings %d address(es) that would make the %d-node round's address list %d bytes, over its limit of %d "
      "(the answer must fit in a rendezvous message): give it fewer interface addresses",
      Shown(n.node_id()), mine.size(), waiting_.size() + 1, address_bytes_ + more, kMaxMemberAddressBytes));
}

void Rendezvous::ClearWaiting() {
  waiting_.clear();
  waiting_ids_.clear();
  address_refs_.clear();
  address_bytes_ = 0;
}

void Rendezvous::AddWaiting(const v1::JoinRequest& req) {
  CountAddresses(req.node(), +1);
  waiting_.push_back({req, clock_->Now()});
  waiting_ids_.insert(req.node().node_id());
  if (static_cast<int>(waiting_.size()) >= config_.min_nodes && !last_call_deadline_) {
    last_call_deadline_ = clock_->Now() + config_.last_call_timeout;
  }
}

absl::Status Rendezvous::AddSpare(const v1::JoinRequest& req) {
  const std::string& id = req.node().node_id();
  if (auto it = spare_index_.find(id); it != spare_index_.end()) {  // a retry keeps its place in line
    it->second->join = req;
    return absl::OkStatus();
  }
  if (static_cast<int>(spares_.size()) >= kMaxSparesPerRun) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "run '%s' runs with its %d node(s) (--nnodes max) and has %d spare node(s) waiting, the limit: node %s is "
        "not taken",
        Shown(run_id_), config_.max_nodes, spares_.size(), Shown(id)));
  }
  spare_index_[id] = spares_.insert(spares_.end(), Waiting{req, clock_->Now()});
  return absl::OkStatus();
}

void Rendezvous::RemoveSpare(const std::string& node_id) {
  auto it = spare_index_.find(node_id);
  if (it == spare_index_.end()) return;
  spares_.erase(it->second);
  spare_index_.erase(it);
}

bool Rendezvous::IsSpare(const std::string& node_id) const { return spare_index_.contains(node_id); }

absl::Status Rendezvous::RoomToKnow(const std::string& id) {
  const size_t limit = static_cast<size_t>(KnownNodesLimit(config_.max_nodes));
  if (identities_.contains(id) || identities_.size() < limit) return absl::OkStatus();
  // Forget the nodes that hold no place: at most 2 * max_nodes + kMaxSparesPerRun do, half the
  // limit, so this frees at least half of it and runs at most once per that many new nodes.
  for (auto it = identities_.begin(); it != identities_.end();) {
    const std::string& known = it->first;
    if (FindMember(known) || waiting_ids_.contains(known) || spare_index_.contains(known)) {
      ++it;
      continue;
    }
    told_end_.erase(known);
    refused_.erase(known);
    identities_.erase(it++);
  }
  if (identities_.size() < limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrFormat("run '%s' holds %d node ids (the limit for --nnodes max %d): "
                      "node %s is not taken",
                      Shown(run_id_), identities_.size(), config_.max_nodes, Shown(id)));
}

std::optional<absl::Status> Rendezvous::TakeJoinRefusal(const std::string& node_id) {
  auto it = refused_.find(node_id);
  if (it == refused_.end()) return std::nullopt;
  absl::Status st = it->second;
  refused_.erase(it);
  return st;
}

void Rendezvous::PromoteSpares() {
  if (phase_ != Phase::kWaiting) return;
  while (!spares_.empty() && static_cast<int>(waiting_.size()) + LiveMembersNotWaiting() < config_.max_nodes) {
    if (absl::Status fits = AddressesFit(spares_.front().join.node()); !fits.ok()) {
      refused_[spares_.front().join.node().node_id()] = fits;
      ++version_;
    } else {
      AddWaiting(spares_.front().join);
    }
    spare_index_.erase(spares_.front().join.node().node_id());
    spares_.pop_front();
  }
}

std::optional<Clock::TimePoint> Rendezvous::ExpireSpares() {
  const auto now = clock_->Now();
  std::optional<Clock::TimePoint> next;
  for (auto it = spares_.begin(); it != spares_.end();) {
    // The node's own join timeout when it is shorter than the run's: it stops waiting then.
    Ms timeout = config_.join_timeout;
    if (it->join.has_spec() && it->join.spec().join_timeout_s() > 0) {
      timeout = std::min(timeout, SecondsToMs(it->join.spec().join_timeout_s()));
    }
    const auto deadline = it->since + timeout;
    if (now < deadline) {
      if (!next || deadline < *next) next = deadline;
      ++it;
      continue;
    }
    refused_[it->join.node().node_id()] = absl::ResourceExhaustedError(absl::StrFormat(
        "run '%s' kept its %d node(s) (--nnodes max) for all of join_timeout %g s while this node waited as a "
        "spare",
        Shown(run_id_), config_.max_nodes, Secs(timeout)));
    spare_index_.erase(it->join.node().node_id());
    it = spares_.erase(it);
    ++version_;
  }
  return next;
}

bool Rendezvous::ReadyToForm() const {
  const int n = static_cast<int>(waiting_.size());
  return n == config_.max_nodes || (n >= config_.min_nodes && round_ > 0 && LiveMembersNotWaiting() == 0);
}

int Rendezvous::LiveMembersNotWaiting() const {
  const auto now = clock_->Now();
  int n = 0;
  for (const auto& m : members_) {
    if (now - m.last_seen > config_.heartbeat_timeout) continue;
    n += waiting_ids_.contains(m.id) ? 0 : 1;
  }
  return n;
}

void Rendezvous::CancelJoin(const std::string& node_id) {
  RemoveSpare(node_id);
  if (phase_ != Phase::kWaiting) return;
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const Waiting& w) { return w.join.node().node_id() == node_id; });
  if (it == waiting_.end()) return;
  CountAddresses(it->join.node(), -1);
  waiting_.erase(it);
  waiting_ids_.erase(node_id);
  if (static_cast<int>(waiting_.size()) < config_.min_nodes) last_call_deadline_.reset();
  // Its lease is over too: a running round's member that gave up is not waited for.
  if (Member* m = FindMember(node_id)) m->last_seen = clock_->Now() - config_.heartbeat_timeout - Ms(1);
}

void Rendezvous::OpenNextRound(std::string why) {
  if (phase_ == Phase::kWaiting) return;
  phase_ = Phase::kWaiting;
  ClearWaiting();
  waiting_since_ = clock_->Now();
  last_call_deadline_.reset();
  reason_ = std::move(why);
  ++version_;
  PromoteSpares();
}

void Rendezvous::End(Phase phase, std::string reason) {
  spares_.clear();
  spare_index_.clear();  // their joins are answered with the run's end
  phase_ = phase;
  reason_ = std::move(reason);
  ended_at_ = clock_->Now();
  ++version_;
}

void Rendezvous::FormRound() {
  // Stable group ranks: survivors keep their order from the last round; newcomers follow.
  std::vector<const Waiting*> order;
  absl::flat_hash_map<std::string, const Waiting*> by_id;
  for (const auto& w : waiting_) by_id[w.join.node().node_id()] = &w;
  std::vector<const Member*> last;  // by group rank (a rebuilt run holds its members as they came back)
  for (const auto& m : members_) last.push_back(&m);
  std::sort(last.begin(), last.end(), [](const Member* a, const Member* b) { return a->group_rank < b->group_rank; });
  for (const Member* m : last) {
    auto it = by_id.find(m->id);
    if (it == by_id.end()) continue;
    order.push_back(it->second);
    by_id.erase(it);
  }
  // Newcomers in the order of the node ranks they were given (SLURM_NODEID, JOB_COMPLETION_INDEX),
  // so that group rank 0 is where the scheduler put node 0; those without one after, as they came.
  std::vector<const Waiting*> newcomers;
  for (const auto& w : waiting_) {
    if (by_id.contains(w.join.node().node_id())) newcomers.push_back(&w);
  }
  auto hint = [this](const Waiting* w) {
    const v1::NodeIdentity& n = w->join.node();
    return n.has_node_rank() && n.node_rank() >= 0 && n.node_rank() < config_.max_nodes ? n.node_rank()
                                                                                        : config_.max_nodes;
  };
  std::stable_sort(newcomers.begin(), newcomers.end(),
                   [&](const Waiting* a, const Waiting* b) { return hint(a) < hint(b); });
  order.insert(order.end(), newcomers.begin(), newcomers.end());
  ++round_;
  ++version_;
  std::vector<Member> members;
  member_index_.clear();
  ranks_taken_.clear();
  int world = 0;
  for (const auto* w : order) world += w->join.node().local_world_size();
  const v1::JoinRequest& host = order.front()->join;
  std::string coordinator_host;
  for (const auto& [id, node] : identities_) {
    if (node.hosts_coordinator()) coordinator_host = absl::StrCat(node.hostname(), " (", node.host_address(), ")");
  }
  // Whom the group-rank-0 agent's store lets in: every address of the round's nodes.
  std::set<std::string> addresses;
  for (const auto* w : order) {
    const v1::NodeIdentity& n = w->join.node();
    addresses.insert(n.addresses().begin(), n.addresses().end());
    if (!n.host_address().empty()) addresses.insert(n.host_address());
  }
  int offset = 0;
  const auto now = clock_->Now();
  for (size_t r = 0; r < order.size(); ++r) {
    const v1::JoinRequest& j = order[r]->join;
    v1::Assignment a;
    a.set_round(round_);
    a.set_group_rank(static_cast<int>(r));
    a.set_group_world_size(static_cast<int>(order.size()));
    a.set_world_size(world);
    a.set_rank_offset(offset);
    a.set_master_addr(host.proposed_master_addr());
    a.set_master_port(host.proposed_master_port());
    a.set_restart_count(restart_count_);
    a.set_max_restarts(config_.max_restarts);
    a.set_coordinator_host(coordinator_host);
    a.set_agent_store(host.agent_store());
    if (r == 0 && host.agent_store()) *a.mutable_member_addresses() = {addresses.begin(), addresses.end()};
    offset += j.node().local_world_size();
    members.push_back(Member{j.node().node_id(), static_cast<int>(r), now, false, 0, std::move(a)});
    member_index_[j.node().node_id()] = r;
    ranks_taken_.insert(static_cast<int>(r));
  }
  members_ = std::move(members);
  group_world_size_ = static_cast<int>(members_.size());
  ClearWaiting();
  last_call_deadline_.reset();
  phase_ = Phase::kRunning;
  stopped_for_hang_ = false;
}

std::optional<v1::Assignment> Rendezvous::AssignmentFor(const std::string& node_id, long last_round) const {
  if (phase_ != Phase::kRunning || round_ <= last_round) return std::nullopt;
  const Member* m = FindMember(node_id);
  if (m == nullptr) return std::nullopt;
  return m->assignment;
}

std::optional<Clock::TimePoint> Rendezvous::Tick() {
  const auto now = clock_->Now();
  std::optional<Clock::TimePoint> spare_deadline = ExpireSpares();
  auto earliest = [&](std::optional<Clock::TimePoint> t) {
    if (!spare_deadline) return t;
    if (!t) return spare_deadline;
    return std::optional<Clock::TimePoint>(std::min(*t, *spare_deadline));
  };
  if (phase_ == Phase::kRunning) {
    std::optional<Clock::TimePoint> next;
    std::vector<std::string> lost;
    for (const Member& m : members_) {
      if (m.succeeded) continue;  // done; it waits for the others without a lease to keep
      auto expiry = m.last_seen + config_.heartbeat_timeout;
      if (now > expiry) {
        lost.push_back(
            absl::StrFormat("%s (no heartbeat for %.1f s)", NodeName(m.id), SecondsBetween(m.last_seen, now)));
      } else if (!next || expiry < *next) {
        next = expiry;
      }
    }
    if (const int missing = group_world_size_ - static_cast<int>(members_.size()); missing > 0) {
      const auto expiry = reattached_at_ + config_.heartbeat_timeout;
      if (now > expiry) {
        // The first few by rank (a scan bounded by the run's spec, once per lost round).
        std::vector<std::string> ranks;
        for (int r = 0; r < group_world_size_ && ranks.size() < kMaxListedItems; ++r) {
          if (!ranks_taken_.contains(r)) ranks.push_back(absl::StrCat(r));
        }
        lost.push_back(absl::StrCat(missing == 1 ? "group rank " : "group ranks ", absl::StrJoin(ranks, ", "),
                                    missing > static_cast<int>(ranks.size())
                                        ? absl::StrCat(" and ", missing - static_cast<int>(ranks.size()), " more")
                                        : "",
                                    " (never re-registered after a coordinator restart)"));
      } else if (!next || expiry < *next) {
        next = expiry;
      }
    }
    if (lost.empty()) return earliest(next ? std::optional<Clock::TimePoint>(*next + Ms(1)) : std::nullopt);
    for (const auto& l : lost) NoteLost(l);
    // The reason names a bounded number of nodes, however many were lost.
    OpenNextRound(absl::StrCat("lost node ", JoinSome(lost)));
  }
  if (phase_ != Phase::kWaiting) return earliest(std::nullopt);
  PromoteSpares();
  const int n = static_cast<int>(waiting_.size());
  if (ReadyToForm()) {
    FormRound();
    return Tick();
  }
  if (last_call_deadline_ && now >= *last_call_deadline_) {
    FormRound();
    return Tick();
  }
  const auto join_deadline = waiting_since_ + config_.join_timeout;
  if (n < config_.min_nodes && now >= join_deadline) {
    std::string why =
        absl::StrFormat("round %d did not form within join_timeout %.0f s: %d of at least %d node(s) joined",
                        round_ + 1, Secs(config_.join_timeout), n, config_.min_nodes);
    if (!lost_.empty()) {
      absl::StrAppend(&why, "; lost: ", absl::StrJoin(lost_, ", "));
      if (lost_count_ > lost_.size()) absl::StrAppend(&why, " and ", lost_count_ - lost_.size(), " more");
    }
    End(Phase::kFailed, why);
    return earliest(std::nullopt);
  }
  auto next = n < config_.min_nodes ? join_deadline : *last_call_deadline_;
  // Members whose lease runs out change whether the round can form without them.
  for (const auto& m : members_) {
    auto expiry = m.last_seen + config_.heartbeat_timeout + Ms(1);
    if (expiry > now && expiry < next) next = expiry;
  }
  return earliest(next);
}

bool Rendezvous::Reattach(const v1::HeartbeatRequest& req) {
  // ConfigForReattach's checks, against this run's spec: nothing from the wire sizes anything.
  if (!CheckReattach(req, config_).ok()) return false;
  const v1::Assignment& a = req.assignment();
  if (round_ == 0 && phase_ == Phase::kWaiting && waiting_.empty()) {
    // A fresh run made from the first node that re-registers: its round, its restart count, its
    // size. Its members are added as they come back: a claim of a large round costs nothing.
    round_ = a.round();
    restart_count_ = a.restart_count();
    group_world_size_ = a.group_world_size();
    members_.clear();
    member_index_.clear();
    ranks_taken_.clear();
    reattached_at_ = clock_->Now();
    phase_ = Phase::kRunning;
    reattached_ = true;
  }
  if (phase_ != Phase::kRunning || a.round() != round_ || a.group_world_size() != group_world_size_ ||
      ranks_taken_.contains(a.group_rank())) {
    return false;
  }
  Member m{req.node_id(), a.group_rank(), clock_->Now(), false, 0, a};
  // Only group rank 0 uses the round's addresses; nobody's copy needs its key kept here.
  if (a.group_rank() != 0) m.assignment.clear_member_addresses();
  m.assignment.clear_lease_key();
  member_index_[m.id] = members_.size();
  ranks_taken_.insert(a.group_rank());
  members_.push_back(std::move(m));
  identities_[req.node_id()] = req.node();
  return true;
}

v1::HeartbeatResponse Rendezvous::HeartbeatAnswer(const v1::HeartbeatRequest& req) const {
  v1::HeartbeatResponse resp;
  const long current = phase_ == Phase::kWaiting ? round_ + 1 : round_;
  resp.set_current_round(current);
  if (!Knows(req.node_id())) {
    resp.set_unknown_node(true);
    return resp;
  }
  resp.set_job_succeeded(phase_ == Phase::kSucceeded);
  resp.set_job_failed(phase_ == Phase::kFailed);
  // Not a member of the round it says it runs (its slot went to another node): stop too.
  const bool stranger = phase_ == Phase::kRunning && req.round() == round_ && !FindMember(req.node_id());
  resp.set_stop_workers(phase_ == Phase::kFailed || current > req.round() || stranger);
  if (stranger) resp.set_reason("this node is not part of the running round");
  else if (resp.stop_workers()) resp.set_reason(reason_);
  resp.set_capture_stacks(resp.stop_workers() && !stranger && stopped_for_hang_ && req.round() == round_);
  return resp;
}

v1::HeartbeatResponse Rendezvous::Heartbeat(const v1::HeartbeatRequest& req) {
  if (!Knows(req.node_id()) && req.has_assignment() && req.has_node() && RoomToKnow(req.node_id()).ok()) {
    if (!Reattach(req)) {
      // Known now, told to stop below; a stranger's addresses are nobody's business.
      // (Copied, not moved: a cleared repeated field keeps its elements' memory.)
      v1::NodeIdentity known = req.node();
      known.clear_addresses();
      identities_[req.node_id()].CopyFrom(known);
    }
  }
  if (Member* m = FindMember(req.node_id()); m && req.round() == round_) m->last_seen = clock_->Now();
  return HeartbeatAnswer(req);
}

void Rendezvous::ForgivePause(Clock::TimePoint::duration d) {
  for (Member& m : members_) m.last_seen += d;
  // An ended run is kept close_timeout for its nodes' last reports: a node stopped with the
  // coordinator (Ctrl-Z of the launch that hosts it) reports once both run again.
  if (ended()) ended_at_ += d;
}

bool Rendezvous::RenewLease(const std::string& node_id, long round, uint64_t seq) {
  Member* m = FindMember(node_id);
  if (m == nullptr || round != round_ || seq <= m->lease_seq) return false;
  m->lease_seq = seq;
  m->last_seen = clock_->Now();
  return true;
}

v1::ReportExitResponse Rendezvous::ReportExit(const v1::ReportExitRequest& req) {
  Member* m = FindMember(req.node_id());
  // Ranks that wait for a hung peer stop reporting too, and their node may tell first: a hung rank
  // whose stacks are outside any collective, reported for the same round, is the root cause
  // instead of one that waits in a collective.
  if (first_failure_ && req.exits_size() > 0 && req.exits(0).hung() && !req.exits(0).in_collective() &&
      first_failure_->exit().hung() && first_failure_->exit().in_collective() &&
      first_failure_->round() == req.round() && first_failure_->node_id() != req.node_id()) {
    v1::Failure f = *first_failure_;
    f.set_node_id(req.node_id());
    auto id = identities_.find(req.node_id());
    f.set_hostname(id != identities_.end() ? id->second.hostname() : "");
    f.set_host_address(id != identities_.end() ? id->second.host_address() : "");
    *f.mutable_exit() = req.exits(0);
    first_failure_ = f;
  }
  auto identity = identities_.find(req.node_id());
  const bool hosts_coordinator = identity != identities_.end() && identity->second.hosts_coordinator();
  if (req.leaving() && m && hosts_coordinator && !ended()) {
    // The coordinator lives in that agent and goes with it: the job cannot go on. Said at once, so
    // that the other nodes stop now instead of finding it unreachable for close_timeout, and so
    // that the hosting agent, whose wait for every node's verdict counts a node that left as
    // gone, leaves at once when every node was stopped together (scancel, a pod's deletion).
    m->last_seen = clock_->Now() - config_.heartbeat_timeout - Ms(1);
    End(Phase::kFailed, absl::StrCat("node ", NodeName(req.node_id()), ", which hosts the coordinator, was stopped"));
  } else if (req.round() == round_ && phase_ == Phase::kRunning && m) {
    m->last_seen = clock_->Now();
    if (req.leaving()) {
      // Its agent was stopped: a membership change, like a lost node; no budget is spent.
      m->last_seen = clock_->Now() - config_.heartbeat_timeout - Ms(1);
      NoteLost(absl::StrCat(NodeName(req.node_id()), " (its agent was stopped)"));
      OpenNextRound(absl::StrCat("node ", NodeName(req.node_id()), " left"));
    } else if (req.group_succeeded()) {
      m->succeeded = true;
      ++version_;  // kept by a replicated coordinator: a new leader must not wait for this node again
      if (static_cast<int>(members_.size()) == group_world_size_ &&
          std::all_of(members_.begin(), members_.end(), [](const Member& x) { return x.succeeded; })) {
        End(Phase::kSucceeded, "");
      }
    } else if (req.exits_size() > 0) {  // no exits: the node only asks for the verdict
      if (!first_failure_) {
        v1::Failure f;
        f.set_node_id(req.node_id());
        auto id = identities_.find(req.node_id());
        if (id != identities_.end()) {
          f.set_hostname(id->second.hostname());
          f.set_host_address(id->second.host_address());
        }
        f.set_round(round_);
        *f.mutable_exit() = req.exits(0);
        first_failure_ = f;
      }
      const bool hung = req.exits(0).hung();
      const std::string who = absl::StrCat("rank ", req.exits(0).rank(), " on ", NodeName(req.node_id()),
                                           hung ? " hung" : " failed");
      stopped_for_hang_ = hung;
      if (restart_count_ < config_.max_restarts) {
        ++restart_count_;
        OpenNextRound(who);
      } else {
        End(Phase::kFailed, absl::StrCat(who, config_.max_restarts > 0 ? "; restart budget exhausted" : ""));
      }
    }
  } else if (req.leaving() && m) {
    m->last_seen = clock_->Now() - config_.heartbeat_timeout - Ms(1);  // gone, whatever the phase
  }
  v1::ReportExitResponse resp;
  // A node stopped because of another node's failure learns whether a new round is coming.
  resp.set_restart(phase_ == Phase::kWaiting || (phase_ == Phase::kRunning && round_ > req.round()));
  resp.set_restart_count(restart_count_);
  resp.set_job_failed(phase_ == Phase::kFailed);
  resp.set_job_succeeded(phase_ == Phase::kSucceeded);
  if (first_failure_) *resp.mutable_first_failure() = *first_failure_;
  resp.set_reason(reason_);
  return resp;
}

v1::StatusResponse Rendezvous::Status() const {
  v1::StatusResponse s;
  s.set_run_id(run_id_);
  s.set_round(round_);
  s.set_state(PhaseName(phase_));
  s.set_restart_count(restart_count_);
  s.set_max_restarts(config_.max_restarts);
  std::vector<const Member*> by_rank;
  for (const Member& m : members_) by_rank.push_back(&m);
  std::sort(by_rank.begin(), by_rank.end(),
            [](const Member* a, const Member* b) { return a->group_rank < b->group_rank; });
  for (const Member* m : by_rank) {
    auto* n = s.add_nodes();
    auto id = identities_.find(m->id);
    if (id != identities_.end()) *n->mutable_node() = id->second;
    n->set_group_rank(m->group_rank);
    n->set_seconds_since_heartbeat(SecondsBetween(m->last_seen, clock_->Now()));
  }
  if (first_failure_) *s.mutable_first_failure() = *first_failure_;
  s.set_reason(reason_);
  return s;
}

bool Rendezvous::EveryoneToldEnd() const {
  if (!ended()) return false;
  const auto now = clock_->Now();
  for (const auto& m : members_) {
    if (told_end_.contains(m.id)) continue;
    if (now - m.last_seen > config_.heartbeat_timeout) continue;  // gone; it will not ask
    return false;
  }
  return true;
}

absl::StatusOr<RendezvousConfig> Rendezvous::ConfigForReattach(const v1::HeartbeatRequest& req) {
  if (!req.has_spec() || !req.has_assignment() || !req.has_node()) {
    return absl::InvalidArgumentError("re-registration without node, assignment and run spec");
  }
  ASSIGN_OR_RETURN(RendezvousConfig c, RendezvousConfig::FromSpec(req.spec()));
  RETURN_IF_ERROR(CheckReattach(req, c));
  return c;
}

absl::Status CheckReattach(const v1::HeartbeatRequest& req, const RendezvousConfig& c) {
  // Everything that sizes the rebuilt run is bounded by the run's own spec.
  const v1::Assignment& a = req.assignment();
  if (a.group_world_size() < 1 || a.group_world_size() > c.max_nodes || a.group_rank() < 0 ||
      a.group_rank() >= a.group_world_size() || a.round() < 1 || a.round() > kMaxRound || a.restart_count() < 0 ||
      a.restart_count() > c.max_restarts || a.world_size() < a.group_world_size() ||
      a.world_size() > static_cast<int64_t>(c.max_nodes) * kMaxWorkersPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("re-registration with round ", a.round(), ", node ", a.group_rank(),
                                                   " of ", a.group_world_size(), ", world size ", a.world_size(),
                                                   ", restart ", a.restart_count(), ": expected a round >= 1 of 1-",
                                                   c.max_nodes, " nodes (the run's --nnodes max), rounds up to ",
                                                   kMaxRound, ", a restart count of 0-", c.max_restarts));
  }
  // The strings it keeps: as long as those a coordinator hands out.
  size_t address_bytes = 0;
  for (const auto& addr : a.member_addresses()) address_bytes += WireAddressBytes(addr.size());
  if (a.master_addr().size() > kMaxHostLength || a.coordinator_host().size() > 2 * kMaxHostLength + 4 ||
      address_bytes > kMaxMemberAddressBytes) {
    return absl::InvalidArgumentError(absl::StrCat("re-registration with a master address of ", a.master_addr().size(),
                                                   " bytes, a coordinator host of ", a.coordinator_host().size(),
                                                   " bytes and member addresses of ", address_bytes,
                                                   " bytes: expected at most ", kMaxHostLength, ", ",
                                                   2 * kMaxHostLength + 4, " and ", kMaxMemberAddressBytes));
  }
  return absl::OkStatus();
}

void Rendezvous::NoteLost(std::string why) {
  if (lost_.size() < kMaxListedItems) lost_.push_back(std::move(why));
  ++lost_count_;
}

}  // namespace launch

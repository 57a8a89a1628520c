// libFuzzer target: the rendezvous state machine driven by arbitrary sequences of joins,
// heartbeats, lease datagrams, exit reports, cancelled joins, pauses and clock ticks from six
// nodes. After every event the running round must be sound: group ranks unique and dense, its
// node count within MIN:MAX, rank offsets the sum of the nodes before, one world size, one master,
// a restart count within the budget. A broken invariant aborts (a finding).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "rendezvous/rendezvous.h"

namespace {

class Input {
 public:
  Input(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool more() const { return i_ < n_; }
  uint8_t next() { return i_ < n_ ? d_[i_++] : 0; }

 private:
  const uint8_t* d_;
  size_t n_, i_ = 0;
};

// A broken invariant: says which, with the round, then aborts (FUZZ_TRACE=1 prints every event).
#define Check(cond)                                                                \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "fuzz_rendezvous: invariant broken: %s (line %d); round %ld\n", #cond, \
                   __LINE__, r.round());                                          \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

void CheckRound(const launch::Rendezvous& r, const std::map<std::string, int>& local_sizes) {
  if (r.phase() != launch::Rendezvous::Phase::kRunning || r.reattached()) return;
  std::map<int, std::pair<std::string, launch::v1::Assignment>> by_rank;
  for (const auto& [id, local] : local_sizes) {
    if (!r.IsMember(id)) continue;
    auto a = r.AssignmentFor(id, 0);
    if (!a) continue;
    Check(a->round() == r.round());
    Check(by_rank.emplace(a->group_rank(), std::make_pair(id, *a)).second);  // unique
  }
  if (by_rank.empty()) return;
  const launch::v1::Assignment& first = by_rank.begin()->second.second;
  const int n = first.group_world_size();
  Check(n >= r.config().min_nodes && n <= r.config().max_nodes);
  Check(static_cast<int>(by_rank.size()) == n);  // every place is one of the six nodes
  int expect_rank = 0, offset = 0;
  for (const auto& [rank, member] : by_rank) {
    const auto& [id, a] = member;
    Check(rank == expect_rank++);  // dense
    Check(a.group_world_size() == n && a.world_size() == first.world_size());
    Check(a.master_addr() == first.master_addr() && a.master_port() == first.master_port());
    Check(a.restart_count() >= 0 && a.restart_count() <= r.config().max_restarts);
    Check(a.rank_offset() == offset);  // the sum of the nodes before
    offset += local_sizes.at(id);
  }
  Check(first.world_size() == offset);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  launch::RendezvousConfig cfg;
  cfg.min_nodes = 1 + in.next() % 3;
  cfg.max_nodes = cfg.min_nodes + in.next() % 3;
  cfg.max_restarts = in.next() % 3;
  cfg.last_call_timeout = std::chrono::milliseconds(200);
  cfg.join_timeout = std::chrono::milliseconds(2000);
  cfg.heartbeat_timeout = std::chrono::milliseconds(500);
  cfg.close_timeout = std::chrono::milliseconds(1000);
  launch::FakeClock clock;
  launch::Rendezvous r("job", cfg, &clock);
  std::map<std::string, int> local_sizes;  // what each node last joined with
  uint64_t seq = 0;
  static const bool trace = std::getenv("FUZZ_TRACE") != nullptr;
  while (in.more()) {
    const uint8_t op = in.next() % 7;
    const std::string id = std::string("node") + static_cast<char>('a' + in.next() % 6);
    const long round = (in.next() & 1) ? r.round() : r.round() + 1 - (in.next() % 3);
    switch (op) {
      case 0: {
        launch::v1::JoinRequest j;
        j.set_run_id("job");
        j.mutable_node()->set_node_id(id);
        const int local = 1 + in.next() % 4;
        j.mutable_node()->set_local_world_size(local);
        j.set_proposed_master_addr(id + ".host");
        j.set_proposed_master_port(1000 + in.next());
        j.set_last_round(round < 0 ? 0 : round);
        if (r.Join(j).ok()) local_sizes[id] = local;
        break;
      }
      case 1: {
        launch::v1::HeartbeatRequest hb;
        hb.set_run_id("job");
        hb.set_node_id(id);
        hb.set_round(round);
        (void)r.Heartbeat(hb);
        break;
      }
      case 2: {
        launch::v1::ReportExitRequest rep;
        rep.set_run_id("job");
        rep.set_node_id(id);
        rep.set_round(round);
        const uint8_t how = in.next() % 3;
        rep.set_group_succeeded(how == 0);
        rep.set_leaving(how == 2);
        if (how == 1) {
          auto* e = rep.add_exits();
          e->set_rank(in.next() % 8);
          e->set_exit_code(1 + in.next() % 3);
        }
        (void)r.ReportExit(rep);
        break;
      }
      case 3:
        r.CancelJoin(id);
        break;
      case 4:
        clock.Advance(std::chrono::milliseconds(50 * in.next()));
        (void)r.Tick();
        break;
      case 5:
        (void)r.RenewLease(id, round, (in.next() & 1) ? ++seq : seq / 2);
        break;
      case 6:
        clock.Advance(std::chrono::milliseconds(10 * in.next()));
        r.ForgivePause(std::chrono::milliseconds(10 * in.next()));
        (void)r.Tick();
        break;
    }
    if (trace) {
      std::fprintf(stderr, "op %d %s round %ld phase %d t=%lld\n", op, id.c_str(), r.round(), static_cast<int>(r.phase()),
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(clock.Now().time_since_epoch()).count()));
    }
    CheckRound(r, local_sizes);
    (void)r.Status();
  }
  return 0;
}

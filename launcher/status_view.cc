#include "launcher/status_view.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/limits.h"

namespace launch {

namespace {

std::string Seconds(double s) { return s < 0 ? "-" : absl::StrFormat("%.1f s", s); }
std::string Ms(double s) { return s > 0 ? absl::StrFormat("%.1f", 1000 * s) : "-"; }

std::string NodeName(const v1::NodeIdentity& n) {
  if (n.host_address().empty() || n.host_address() == n.hostname()) return n.hostname();
  return absl::StrCat(n.hostname(), " (", n.host_address(), ")");
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(std::max<int64_t>(bytes, 0));
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%d B", static_cast<int64_t>(v)) : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string RenderStatus(const v1::StatusResponse& s) {
  std::string out = absl::StrFormat("run %s  round %d  %s  restarts %d/%d", s.run_id(), s.round(), s.state(),
                                    s.restart_count(), s.max_restarts());
  if (s.straggler_factor() > 0) {
    absl::StrAppendFormat(&out, "  stragglers %d now, %d episodes (factor %.2f)", s.straggling_ranks_size(),
                          s.straggler_episodes(), s.straggler_factor());
  }
  absl::StrAppendFormat(&out, "  hung ranks %d\n", s.hung_ranks());
  if (s.has_replica()) {
    const v1::ReplicaStatus& r = s.replica();
    absl::StrAppend(&out, "coordinator: leader ", r.leader().empty() ? "none" : r.leader(), ", answered by ",
                    r.replica(), r.leading() ? " (the leader)" : " (a standby)", ", failovers seen ", r.failovers());
    std::vector<std::string> etcd;
    for (const v1::EtcdEndpointHealth& h : r.etcd())
      etcd.push_back(absl::StrCat(h.endpoint(), h.healthy() ? " ok" : absl::StrCat(" down (", h.error(), ")")));
    if (!etcd.empty()) absl::StrAppend(&out, "; etcd ", absl::StrJoin(etcd, ", "));
    absl::StrAppend(&out, "\n");
  }
  if (!s.reason().empty()) absl::StrAppend(&out, "reason: ", s.reason(), "\n");
  if (s.has_first_failure()) {
    const v1::Failure& f = s.first_failure();
    absl::StrAppendFormat(&out, "first failure: rank %d on %s (round %d)\n", f.exit().rank(), f.hostname(), f.round());
  }

  absl::StrAppendFormat(&out, "\n%-32s %5s %9s %7s %10s %10s %8s\n", "NODE", "GROUP", "HEARTBEAT", "LOAD", "MEM FREE",
                        "SHM USED", "SAMPLE");
  for (const v1::NodeStatus& n : s.nodes()) {
    const v1::NodeSample& ns = n.sample().node();
    const bool sampled = n.has_sample();
    absl::StrAppendFormat(&out, "%-32s %5d %9s %7s %10s %10s %8s\n", NodeName(n.node()).substr(0, 32), n.group_rank(),
                          Seconds(n.seconds_since_heartbeat()), sampled ? absl::StrFormat("%.2f", ns.load1()) : "-",
                          sampled ? HumanBytes(ns.memory_available_bytes()) : "-",
                          sampled ? HumanBytes(ns.shm_used_bytes()) : "-",
                          sampled ? Seconds(n.seconds_since_sample()) : "-");
  }
  if (s.nodes_omitted() > 0) {
    absl::StrAppendFormat(&out,
                          "(%d more node(s), of the highest group ranks, left out: the answer is kept under %d "
                          "MiB; the metrics port counts every node)\n",
                          s.nodes_omitted(), kMaxRendezvousMessageBytes >> 20);
  }

  const std::set<int> straggling(s.straggling_ranks().begin(), s.straggling_ranks().end());
  struct Row {
    const v1::RankSample* rank;
    const v1::NodeStatus* node;
  };
  std::vector<Row> rows;
  for (const v1::NodeStatus& n : s.nodes())
    for (const v1::RankSample& r : n.sample().ranks()) rows.push_back({&r, &n});
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.rank->rank() < b.rank->rank(); });
  if (!rows.empty()) {
    absl::StrAppendFormat(&out, "\n%-5s %-20s %-10s %8s %9s %8s %9s %6s %10s %4s %4s %6s %17s\n", "RANK", "NODE",
                          "STATE", "STEP", "STEP ms", "OWN ms", "LAST", "CPU%", "RSS", "THR", "GPU", "UTIL", "GPU MEM");
  }
  for (const Row& row : rows) {
    const v1::RankSample& r = *row.rank;
    const v1::GpuSample* gpu = nullptr;
    for (const v1::GpuSample& g : row.node->sample().gpus())
      if (g.index() == r.gpu()) gpu = &g;
    std::string state = r.state();
    if (straggling.count(r.rank())) state += " slow";
    absl::StrAppendFormat(
        &out, "%-5d %-20s %-10s %8s %9s %8s %9s %6s %10s %4d %4s %6s %17s\n", r.rank(),
        row.node->node().hostname().substr(0, 20), state, r.last_step() < 0 ? "-" : absl::StrCat(r.last_step()),
        Ms(r.step_seconds()), Ms(r.busy_seconds()), Seconds(r.seconds_since_step()),
        absl::StrFormat("%.0f", r.cpu_percent()), HumanBytes(r.rss_bytes()), r.threads(),
        r.gpu() < 0 ? "-" : absl::StrCat(r.gpu()),
        gpu && gpu->utilization_percent() >= 0 ? absl::StrCat(gpu->utilization_percent(), "%") : "-",
        gpu ? absl::StrCat(HumanBytes(gpu->memory_used_bytes()), "/", HumanBytes(gpu->memory_total_bytes())) : "-");
  }

  bool gpu_header = false;
  for (const v1::NodeStatus& n : s.nodes()) {
    for (const v1::GpuSample& g : n.sample().gpus()) {
      if (!gpu_header) {
        absl::StrAppendFormat(&out, "\n%-20s %3s %-28s %5s %17s %5s %7s %9s %s\n", "NODE", "GPU", "NAME", "UTIL",
                              "MEMORY", "TEMP", "POWER", "SM CLOCK", "ERRORS");
        gpu_header = true;
      }
      std::string errors;
      if (g.ecc_uncorrected_errors() > 0) errors = absl::StrCat("ECC ", g.ecc_uncorrected_errors());
      if (g.xids_size() > 0) absl::StrAppend(&errors, errors.empty() ? "" : ", ", "XID ", absl::StrJoin(g.xids(), " "));
      absl::StrAppendFormat(&out, "%-20s %3d %-28s %5s %17s %5s %7s %9s %s\n", n.node().hostname().substr(0, 20),
                            g.index(), g.name().substr(0, 28),
                            g.utilization_percent() >= 0 ? absl::StrCat(g.utilization_percent(), "%") : "-",
                            absl::StrCat(HumanBytes(g.memory_used_bytes()), "/", HumanBytes(g.memory_total_bytes())),
                            g.temperature_c() >= 0 ? absl::StrCat(g.temperature_c(), " C") : "-",
                            g.power_watts() >= 0 ? absl::StrFormat("%.0f W", g.power_watts()) : "-",
                            g.sm_clock_mhz() >= 0 ? absl::StrCat(g.sm_clock_mhz(), " MHz") : "-",
                            errors.empty() ? "-" : errors);
    }
  }
  return out;
}

}  // namespace launch

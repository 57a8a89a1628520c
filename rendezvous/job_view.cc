#include "rendezvous/job_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/limits.h"

namespace launch {

namespace {

// Every rank of every node of the largest job: ranks are bounded before they index anything.
constexpr int64_t kMaxRank = static_cast<int64_t>(kMaxNodes) * kMaxWorkersPerNode;
constexpr int kMaxGpusPerNode = 64;
constexpr int kMaxXidsPerGpu = 64;
constexpr size_t kMaxNameLength = 256;

bool Finite(double v) { return std::isfinite(v) && v >= -1 && v <= 1e15; }

// The median; of an even count the lower middle value, so that with two ranks a straggler does
// not pull the reference it is measured against towards itself.
double LowerMedian(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

absl::Status ValidateSample(const v1::SampleRequest& s) {
  if (s.ranks_size() > kMaxWorkersPerNode) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sample of ", s.ranks_size(), " ranks: at most ", kMaxWorkersPerNode, " per node"));
  }
  if (s.gpus_size() > kMaxGpusPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("a sample of ", s.gpus_size(), " GPUs: at most ", kMaxGpusPerNode));
  }
  if (s.hostname().size() > kMaxHostLength || s.round() < 0 || !Finite(s.unix_time())) {
    return absl::InvalidArgumentError("sample: hostname over its limit, or a negative round or time");
  }
  for (const v1::RankSample& r : s.ranks()) {
    if (r.rank() < 0 || r.rank() >= kMaxRank || r.local_rank() < 0 || r.local_rank() >= kMaxWorkersPerNode ||
        r.state().size() > 16 || r.gpu() < -1 || r.gpu() >= kMaxGpusPerNode) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample: rank ", r.rank(), " (local ", r.local_rank(), ", gpu ", r.gpu(), ") out of range"));
    }
    for (double v : {r.step_seconds(), r.busy_seconds(), r.seconds_since_step(), r.cpu_percent()}) {
      if (!Finite(v))
        return absl::InvalidArgumentError(absl::StrCat("sample: rank ", r.rank(), ": a figure out of range"));
    }
  }
  for (const v1::GpuSample& g : s.gpus()) {
    if (g.index() < 0 || g.index() >= kMaxGpusPerNode || g.name().size() > kMaxNameLength ||
        g.uuid().size() > kMaxNameLength || g.xids_size() > kMaxXidsPerGpu || !Finite(g.power_watts())) {
      return absl::InvalidArgumentError(absl::StrCat("sample: GPU ", g.index(), " out of range"));
    }
  }
  if (!Finite(s.node().load1())) return absl::InvalidArgumentError("sample: node load out of range");
  return absl::OkStatus();
}

void JobView::Update(const v1::SampleRequest& s, Clock::TimePoint now) {
  if (s.round() < round_) return;  // a late sample of a round that is over
  if (s.round() > round_) {
    // A new round restarted every worker: their figures start again, and so do episodes.
    round_ = s.round();
    straggling_.clear();
    slow_samples_.clear();
  }
  Kept& k = nodes_[s.node_id()];
  k.sample = s;
  k.at = now;
  FindStragglers(k.sample);
}

void JobView::FindStragglers(const v1::SampleRequest& fresh) {
  if (factor_ <= 0) return;
  auto comparable = [](const v1::RankSample& r) {
    return r.state() == "running" && r.steps() >= kMinSteps && r.busy_seconds() > 0;
  };
  std::vector<double> busy;
  for (const auto& [id, k] : nodes_) {
    if (k.sample.round() != round_) continue;
    for (const v1::RankSample& r : k.sample.ranks())
      if (comparable(r)) busy.push_back(r.busy_seconds());
  }
  if (busy.size() < 2) return;
  const double median = LowerMedian(std::move(busy));
  if (median <= 0) return;
  // Only the ranks of the node that just sent figures: another node's are not new.
  for (const v1::RankSample& r : fresh.ranks()) {
    if (!comparable(r)) continue;
    const double ratio = r.busy_seconds() / median;
    const bool was = straggling_.count(r.rank()) > 0;
    int& slow_samples = slow_samples_[r.rank()];
    slow_samples = ratio >= factor_ && r.busy_seconds() - median >= kMinGapSeconds ? slow_samples + 1 : 0;
    // An episode ends only when the rank is back below half the factor's margin: a rank near the
    // line is reported once, not at every sample.
    const bool slow = was ? ratio >= 1 + (factor_ - 1) / 2 : slow_samples >= kSlowSamples;
    if (slow == was) continue;
    if (slow) {
      straggling_.insert(r.rank());
      ++episodes_;
    } else {
      straggling_.erase(r.rank());
    }
    v1::StragglerEvent e;
    e.set_seq(next_seq_++);
    e.set_round(round_);
    e.set_rank(r.rank());
    e.set_hostname(fresh.hostname());
    e.set_gpu(r.gpu());
    e.set_ratio(ratio);
    e.set_busy_seconds(r.busy_seconds());
    e.set_median_seconds(median);
    e.set_recovered(!slow);
    events_.push_back(std::move(e));
    if (events_.size() > kMaxEvents) events_.pop_front();
  }
}

std::vector<v1::StragglerEvent> JobView::EventsAfter(uint64_t seen) const {
  std::vector<v1::StragglerEvent> out;
  for (const v1::StragglerEvent& e : events_)
    if (e.seq() > seen) out.push_back(e);
  return out;
}

void JobView::Fill(v1::StatusResponse* status, Clock::TimePoint now) const {
  for (v1::NodeStatus& n : *status->mutable_nodes()) {
    auto it = nodes_.find(n.node().node_id());
    if (it == nodes_.end() || it->second.sample.round() != round_) continue;
    *n.mutable_sample() = it->second.sample;
    n.set_seconds_since_sample(std::chrono::duration<double>(now - it->second.at).count());
  }
  for (int r : straggling_) status->add_straggling_ranks(r);
  status->set_straggler_episodes(episodes_);
  status->set_hung_ranks(static_cast<int32_t>(hung_.size()));
  status->set_straggler_factor(factor_);
}

}  // namespace launch

#include "controller/job_stats.h"

#include <algorithm>

#include "controller/planner/split_planner.h"

namespace tributary::controller {
namespace {

double Ratio(double num, double den) { return den > 0 ? num / den : 0; }

}  // namespace

void JobStatsBook::Record(const std::string& node_id, const tributary::v1::JobObservation& o,
                          common::Clock::TimePoint now) {
  std::deque<Sample>& samples = jobs_[o.job_id()][node_id];
  samples.push_back(Sample{.at = now,
                           .op_bytes = o.bytes(),
                           .wire_sent = o.wire_bytes_sent(),
                           .wire_received = o.wire_bytes_received(),
                           .collectives = o.collectives(),
                           .busy_seconds = std::max(0.0, o.busy_seconds()),
                           .iterations = o.iterations(),
                           .iteration_seconds = std::max(0.0, o.iteration_seconds()),
                           .iteration_max_seconds = std::max(0.0, o.iteration_max_seconds()),
                           .iteration_busy_seconds = std::max(0.0, o.iteration_busy_seconds())});
  while (samples.size() > kMaxSamplesPerNode) samples.pop_front();
  while (!samples.empty() && now - samples.front().at > window_) samples.pop_front();
}

void JobStatsBook::RemoveJob(const std::string& job_id) { jobs_.erase(job_id); }

void JobStatsBook::Expire(common::Clock::TimePoint now) {
  for (auto job = jobs_.begin(); job != jobs_.end();) {
    NodeSamples& nodes = job->second;
    for (auto node = nodes.begin(); node != nodes.end();) {
      std::deque<Sample>& samples = node->second;
      while (!samples.empty() && now - samples.front().at > window_) samples.pop_front();
      node = samples.empty() ? nodes.erase(node) : std::next(node);
    }
    job = nodes.empty() ? jobs_.erase(job) : std::next(job);
  }
}

bool JobStatsBook::HasData(const std::string& job_id, common::Clock::TimePoint now) const {
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return false;
  for (const auto& [node_id, samples] : job->second) {
    if (!samples.empty() && now - samples.back().at <= window_) return true;
  }
  return false;
}

void JobStatsBook::Summarize(const std::string& job_id, const std::set<std::string>& workers,
                             common::Clock::TimePoint now, tributary::v1::JobStats* stats) const {
  stats->set_window_seconds(std::chrono::duration<double>(window_).count());
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  uint32_t reporting = 0;
  uint64_t wire_bytes = 0, collectives = 0;
  // Over worker nodes.
  uint64_t w_wire = 0, w_op_bytes = 0, w_iterations = 0;
  double w_busy = 0, w_iteration_seconds = 0, w_iteration_busy = 0, w_iteration_max = 0;
  for (const auto& [node_id, samples] : job->second) {
    Sample sum;
    double max_iteration = 0;
    common::Clock::TimePoint latest{};
    bool any = false;
    for (const Sample& s : samples) {
      if (now - s.at > window_) continue;
      any = true;
      latest = std::max(latest, s.at);
      sum.op_bytes += s.op_bytes;
      sum.wire_sent += s.wire_sent;
      sum.wire_received += s.wire_received;
      sum.collectives += s.collectives;
      sum.busy_seconds += s.busy_seconds;
      sum.iterations += s.iterations;
      sum.iteration_seconds += s.iteration_seconds;
      sum.iteration_busy_seconds += s.iteration_busy_seconds;
      max_iteration = std::max(max_iteration, s.iteration_max_seconds);
    }
    if (!any) continue;
    ++reporting;
    const bool worker = workers.contains(node_id);
    const uint64_t moved = sum.wire_sent + sum.wire_received;
    tributary::v1::NodeJobStats* row = stats->add_nodes();
    row->set_node_id(node_id);
    row->set_worker(worker);
    row->set_wire_bytes_sent(sum.wire_sent);
    row->set_wire_bytes_received(sum.wire_received);
    row->set_collectives(sum.collectives);
    row->set_busy_seconds(sum.busy_seconds);
    row->set_achieved_bytes_per_s(Ratio(static_cast<double>(moved), sum.busy_seconds));
    row->set_iterations(sum.iterations);
    row->set_mean_iteration_seconds(
        sum.iterations > 0 ? sum.iteration_seconds / static_cast<double>(sum.iterations) : 0);
    row->set_max_iteration_seconds(max_iteration);
    row->set_comm_fraction(Ratio(sum.iteration_busy_seconds, sum.iteration_seconds));
    row->set_last_report_age_s(std::chrono::duration<double>(now - latest).count());
    wire_bytes += moved;
    collectives += sum.collectives;
    if (!worker) continue;
    w_wire += moved;
    w_op_bytes += sum.op_bytes;
    w_busy += sum.busy_seconds;
    w_iterations += sum.iterations;
    w_iteration_seconds += sum.iteration_seconds;
    w_iteration_busy += sum.iteration_busy_seconds;
    w_iteration_max = std::max(w_iteration_max, max_iteration);
  }
  stats->set_reporting_nodes(reporting);
  stats->set_wire_bytes(wire_bytes);
  stats->set_collectives(collectives);
  stats->set_achieved_bytes_per_s(Ratio(static_cast<double>(w_wire), w_busy));
  stats->set_iterations(w_iterations);
  stats->set_mean_iteration_seconds(
      w_iterations > 0 ? w_iteration_seconds / static_cast<double>(w_iterations) : 0);
  stats->set_max_iteration_seconds(w_iteration_max);
  stats->set_comm_fraction(Ratio(w_iteration_busy, w_iteration_seconds));
  stats->set_observed_seconds_per_byte(Ratio(w_busy, static_cast<double>(w_op_bytes)));
}

std::vector<tributary::v1::WhatIfPrediction> PredictWhatIf(
    const std::vector<std::pair<uint32_t, uint32_t>>& what_if, double nic_bytes_per_s,
    uint64_t model_bytes, uint32_t current_workers, uint32_t current_spares) {
  std::vector<tributary::v1::WhatIfPrediction> out;
  for (const auto& [n, k] : what_if) {
    tributary::v1::WhatIfPrediction& p = out.emplace_back();
    p.set_workers(n);
    p.set_spares(k);
    p.set_current(n == current_workers && k == current_spares);
    if (nic_bytes_per_s <= 0) continue;  // no NIC known: no prediction
    const double seconds_per_byte =
        UniformClosedForm(static_cast<int>(n), static_cast<int>(std::min<uint32_t>(k, n)),
                          nic_bytes_per_s)
            .seconds_per_byte;
    const double ring = n > 1 ? 2.0 * (n - 1) / (n * nic_bytes_per_s) : 0;
    p.set_seconds_per_byte(seconds_per_byte);
    p.set_allreduce_seconds(seconds_per_byte * static_cast<double>(model_bytes));
    p.set_speedup_vs_ring(seconds_per_byte > 0 ? ring / seconds_per_byte : 1);
  }
  return out;
}

std::vector<std::pair<uint32_t, uint32_t>> DefaultWhatIfGrid(uint32_t workers, uint32_t spares,
                                                             uint32_t spares_available) {
  constexpr uint32_t kMaxSpareRows = 9;
  std::vector<std::pair<uint32_t, uint32_t>> grid;
  const uint32_t top = std::min({spares_available, workers, kMaxSpareRows - 1});
  for (uint32_t k = 0; k <= top; ++k) grid.emplace_back(workers, k);
  if (spares > top) grid.emplace_back(workers, spares);
  if (workers / 2 >= 1 && workers / 2 != workers) grid.emplace_back(workers / 2, spares);
  grid.emplace_back(workers * 2, spares);
  return grid;
}

}  // namespace tributary::controller

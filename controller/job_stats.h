// Per-job communication statistics: what the agents' heartbeats report of each job
// (tributary.v1.JobObservation), kept over a sliding window and aggregated over the job's nodes,
// and the split planner's "what if n workers, k spares" predictions (GetJobStats).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::controller {

// The reports of every job's nodes within the last `window`. A node that stops reporting a job
// (it left the job, died, or the job went idle) drops out once its last report is older than the
// window. Not thread-safe: ClusterState calls it under its mutex.
class JobStatsBook {
 public:
  // Most reports kept per (job, node): bounds memory whatever the agents send (a heartbeat every
  // 10 ms for a 30 s window).
  static constexpr size_t kMaxSamplesPerNode = 4096;

  explicit JobStatsBook(std::chrono::milliseconds window) : window_(window) {}

  std::chrono::milliseconds window() const { return window_; }

  // One node's report of one job at `now` (the caller checks that the job exists).
  void Record(const std::string& node_id, const tributary::v1::JobObservation& o,
              common::Clock::TimePoint now);
  // Forgets a deleted job.
  void RemoveJob(const std::string& job_id);
  // Drops the reports older than the window (the liveness sweep calls it).
  void Expire(common::Clock::TimePoint now);
  // Whether the job has a report within the window.
  bool HasData(const std::string& job_id, common::Clock::TimePoint now) const;

  // Fills the observed part of `stats` from the reports within the window: window_seconds,
  // reporting_nodes, wire_bytes, collectives, achieved_bytes_per_s, iterations, mean / max
  // iteration, comm_fraction, observed_seconds_per_byte and one NodeJobStats per node (node id
  // order). Nodes in `workers` count as worker nodes (the achieved bandwidth, the iterations,
  // the comm fraction and the observed seconds per byte are over worker nodes only; a spare's
  // traffic is in wire_bytes and its own row).
  void Summarize(const std::string& job_id, const std::set<std::string>& workers,
                 common::Clock::TimePoint now, tributary::v1::JobStats* stats) const;

 private:
  struct Sample {
    common::Clock::TimePoint at;
    uint64_t op_bytes = 0;
    uint64_t wire_sent = 0;
    uint64_t wire_received = 0;
    uint64_t collectives = 0;
    double busy_seconds = 0;
    uint64_t iterations = 0;
    double iteration_seconds = 0;
    double iteration_max_seconds = 0;
    double iteration_busy_seconds = 0;
  };
  using NodeSamples = std::map<std::string, std::deque<Sample>>;  // by node id

  const std::chrono::milliseconds window_;
  std::map<std::string, NodeSamples> jobs_;  // by job id
};

// The split planner's prediction (DESIGN.md §1.1 closed form, UniformClosedForm) for each
// (workers, spares) pair, every NIC at `nic_bytes_per_s`, for `model_bytes` of gradient; a row
// is `current` when it equals (current_workers, current_spares).
std::vector<tributary::v1::WhatIfPrediction> PredictWhatIf(
    const std::vector<std::pair<uint32_t, uint32_t>>& what_if, double nic_bytes_per_s,
    uint64_t model_bytes, uint32_t current_workers, uint32_t current_spares);

// The default what-if grid: n workers with k = 0 .. min(spares_available, n) (at most 9 rows,
// always including `spares`), then n/2 and 2n workers with `spares`.
std::vector<std::pair<uint32_t, uint32_t>> DefaultWhatIfGrid(uint32_t workers, uint32_t spares,
                                                             uint32_t spares_available);

}  // namespace tributary::controller

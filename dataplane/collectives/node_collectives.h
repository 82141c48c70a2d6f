// Runs a node-level operation (the local processes' buffers of one tensor) with the job's
// algorithm: push/pull through summation servers, or ring / halving-doubling among the worker
// nodes after the local buffers are aggregated.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/allreduce_push_pull.h"
#include "dataplane/collectives/collective_engine.h"
#include "dataplane/collectives/dataplane_metrics.h"

namespace tributary::dataplane {

// How a job picks its algorithm. Values match tributary.v1.Algorithm.
enum class AlgorithmChoice : uint8_t {
  kAuto = 0,  // by size, from the selector's thresholds (push/pull only with spare servers)
  kPushPull = 1,
  kRing = 2,
  kHalvingDoubling = 3,
};

// Thread-safe. Owns neither the node nor the engine; attaches the engine to the node's message
// routing.
class NodeCollectives {
 public:
  NodeCollectives(PushPullNode* node, CollectiveEngine* engine, Reducer* reducer);

  // `view` as for PushPullNode; the engine's ranks are the worker nodes.
  void SetJob(const JobView& view, AlgorithmChoice choice);
  void RemoveJob(const std::string& job_id);

  // Starts `op`. Ring and halving-doubling first add the local buffers into the first one (or
  // take the root's for a broadcast), run among the worker nodes in place, then copy the result
  // to every local buffer. Errors as PushPullWorker::Start.
  absl::Status Start(const std::string& job_id, LocalOperation op);

  // This node cannot take part in (tensor, iteration): fail it for the other nodes now.
  void Abort(const std::string& job_id, const std::string& tensor_name, uint64_t iteration,
             const absl::Status& reason);

  // The cost model behind ALGORITHM_AUTO's size thresholds (ModelThresholds) for jobs set from
  // now on. The agent builds it from its NIC, its summation rate and --selector-alpha-us.
  void SetCostModel(const CostModel& model);
  // Thresholds measured by the benchmark suite replace the cost model's for jobs set from now on
  // (the agent's --selector-calibration).
  void SetMeasuredThresholds(const MeasuredThresholds& measured);

  // The algorithm `Start` would use for `bytes` in this job (for logs and tests).
  absl::StatusOr<Algorithm> AlgorithmFor(const std::string& job_id, uint64_t bytes) const;

  // Records operation counts, durations and pending ages into `metrics` from now on, timed by
  // `clock`; also attaches the per-peer counters to the node. Call before the first SetJob; both
  // must outlive this object.
  void SetMetrics(DataPlaneMetrics* metrics, const common::Clock* clock);
  // Refreshes the pending-operation gauges of every job (the agent's tick calls it).
  void UpdatePendingMetrics();
  // Bytes and summed seconds of the operations completed OK since the last call, per job (for
  // the controller's observed-vs-predicted comparison).
  struct Observation {
    uint64_t bytes = 0;
    double seconds = 0;
  };
  std::map<std::string, Observation> TakeObservations();

 private:
  absl::Status StartUninstrumented(const std::string& job_id, LocalOperation op);
  struct Pending {
    std::string job_id;
    common::Clock::TimePoint started;
  };

  struct JobEntry {
    AlgorithmChoice choice = AlgorithmChoice::kAuto;
    int num_workers = 0;
    SelectorThresholds thresholds;
    uint32_t world_size = 1;
  };

  PushPullNode* node_;
  CollectiveEngine* engine_;
  Reducer* reducer_;
  mutable std::mutex mu_;
  std::map<std::string, JobEntry> jobs_;
  CostModel cost_model_;                        // Guarded by mu_.
  std::optional<MeasuredThresholds> measured_;  // Guarded by mu_.
  DataPlaneMetrics* metrics_ = nullptr;
  const common::Clock* clock_ = nullptr;
  std::mutex pending_mu_;  // guards the three below
  std::map<uint64_t, Pending> pending_;
  uint64_t next_pending_ = 0;
  std::map<std::string, Observation> observations_;
};

}  // namespace tributary::dataplane

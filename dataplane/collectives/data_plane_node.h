// The data plane of one node: owns the transport's receive handler and routes every message to
// the algorithm it belongs to; picks the algorithm of each operation (the job's choice, or by
// size from the selector's thresholds) and falls back when the pick declines the input; counts
// operations into the metrics. Push/pull (PushPull) and ring / halving-doubling
// (CollectiveEngine) sit behind one interface, CollectiveAlgorithm.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/allreduce_push_pull.h"
#include "dataplane/collectives/collective_algorithm.h"
#include "dataplane/collectives/collective_engine.h"
#include "dataplane/collectives/dataplane_metrics.h"
#include "dataplane/collectives/job_view.h"
#include "dataplane/collectives/operation.h"
#include "dataplane/collectives/parameter_server.h"
#include "dataplane/reduce/reducer.h"
#include "dataplane/transport/transport.h"

namespace tributary::dataplane {

// Counters of the node's own work (routing and selection). Monotonic.
struct DataPlaneNodeStats {
  std::atomic<uint64_t> malformed_messages{0};  // dropped: the header did not parse
  std::atomic<uint64_t> fallbacks{0};           // an operation ran another algorithm than picked
};

// Ownership: borrows the transport, reducer and clock (they outlive the node; shut the transport
// down before destroying the node); owns both algorithms. Installs the transport's receive
// handler at construction.
// Threading: thread-safe. Messages are parsed once (ParseHeader) on the transport thread and
// handed to PushPull (algorithm push_pull) or CollectiveEngine (ring, halving_doubling).
class DataPlaneNode {
 public:
  DataPlaneNode(Transport* transport, Reducer* reducer, const common::Clock* clock);
  ~DataPlaneNode();
  DataPlaneNode(const DataPlaneNode&) = delete;
  DataPlaneNode& operator=(const DataPlaneNode&) = delete;

  // Adds or replaces a job's view with the job's algorithm (kAuto: by size from the selector's
  // thresholds, push/pull only with spare servers). Ring and halving-doubling run among the
  // worker nodes.
  void SetJob(const JobView& view, Algorithm algorithm = Algorithm::kAuto);
  // Forgets the job; its running operations fail with CANCELLED.
  void RemoveJob(const std::string& job_id);

  // Parameter-server operations (IsParameterServer(op.reduction)) go to ParameterServer as they
  // are (no selection, no fallback, not in the operation metrics).
  // Starts `op` with the algorithm AlgorithmFor picks; when that one declines the input
  // (CanServe), with the first of ring, halving-doubling, push/pull that accepts it (counted in
  // stats().fallbacks). Errors as CollectiveAlgorithm::Post; NOT_FOUND for an unknown job.
  //
  // An operation whose input is still being copied in (op.staged, StagedInput) runs at once when
  // push/pull sums or averages it (each chunk leaves as soon as its input is there); any other
  // waits, started but not posted, until the input is complete (StagedInputAdvanced), and an
  // error of that later post goes to its `done`.
  absl::Status Start(const std::string& job_id, Operation op);

  // The StagedInput of (tensor, iteration) of the job advanced: posts it if it waited for its
  // whole input, and lets push/pull send the chunks whose input is now there.
  void StagedInputAdvanced(const std::string& job_id, const std::string& tensor_name,
                           uint64_t iteration);

  // This node cannot take part in (tensor, iteration) of the job: fails it on every node now,
  // whatever the algorithm — push/pull through the tensor's home server, ring and
  // halving-doubling by an abort to every other rank (kAuto jobs: both). Every participant's
  // done, and this node's if it started the operation, gets `reason`'s code and message; one
  // that starts it later fails at once.
  void Abort(const std::string& job_id, const std::string& tensor_name, uint64_t iteration,
             const absl::Status& reason);

  // Fails operations past their deadline and forgets expired state, in every algorithm. Call
  // periodically (the agent's tick).
  void ExpireStale();

  // The cost model behind ALGORITHM_AUTO's size thresholds (ModelThresholds) for jobs set from
  // now on. The agent builds it from its NIC, its declared summation rate (--sum-gbps; never a
  // measured one, which differs between nodes) and --selector-alpha-us. A job whose view names
  // selector_nic_bytes_per_s (its plan's slowest NIC) is priced by that rate instead of this
  // node's NIC, so all its nodes compute the same thresholds.
  void SetCostModel(const CostModel& model);
  // The congestion control of this node's connections to the other workers of every job whose
  // collectives run among its workers alone: no spare servers, push/pull neither its algorithm
  // nor the selector's pick at any size, synchronous (ring, halving-doubling and recursive
  // doubling then carry all its bytes). Set through Transport::SetPeerCongestionControl as jobs
  // come and go, and taken back (the transport's default) from a connection no such job names or
  // that a job with spare servers or push/pull also uses: push/pull's many flows through shared
  // links keep the transport's default. Empty (the default): every connection keeps the
  // transport's. Applies to the current jobs too. Why (BENCHMARKS.md, session 34): a ring waits for
  // its slowest connection, and BBR's minimum-RTT probe holds each long-lived connection to 4
  // segments for 200 ms every 10 s.
  void SetWorkerCongestionControl(const std::string& name);

  // Thresholds measured by the benchmark suite replace the cost model's for jobs set from now on
  // (the agent's --selector-calibration).
  void SetMeasuredThresholds(const MeasuredThresholds& measured);

  // The algorithm `Start` picks for an all-reduce of `bytes` in this job (before any fallback).
  absl::StatusOr<Algorithm> AlgorithmFor(const std::string& job_id, uint64_t bytes) const;
  // The algorithm `Start` picks for `op` (before any fallback), and in *bytes the size of each
  // process's region (all-gather and reduce-scatter: world_size() blocks). All-gather and
  // reduce-scatter run among the worker nodes whatever the job's algorithm: halving-doubling
  // where it is picked, ring otherwise (push/pull included: spares take no part).
  absl::StatusOr<Algorithm> AlgorithmForOperation(const std::string& job_id, const Operation& op,
                                                  uint64_t* bytes) const;

  // Records operation counts, durations and pending ages into `metrics` from now on, timed by
  // `clock`, and attaches per-peer byte counters to the jobs set from now on. Call before the
  // first SetJob; both must outlive this node.
  void SetMetrics(DataPlaneMetrics* metrics, const common::Clock* clock);
  // Refreshes the pending-operation gauges of every job (the agent's tick calls it).
  void UpdatePendingMetrics();
  // What this node's operations of a job did since the last call (for the controller's
  // observed-vs-predicted comparison and its per-job statistics, GetJobStats). Jobs without new
  // data are left out.
  struct Observation {
    // Bytes and summed seconds of the operations completed OK.
    uint64_t bytes = 0;
    double seconds = 0;
    // Operations completed (OK or not).
    uint64_t collectives = 0;
    // Seconds with at least one operation of the job in flight (the union of their intervals).
    double busy_seconds = 0;
    // Iterations ended: the time between successive starts of the job's first tensor name (a
    // new iteration number of it; a retried iteration is not a new one), their summed and
    // longest durations, and the busy seconds inside them.
    uint64_t iterations = 0;
    double iteration_seconds = 0;
    double iteration_max_seconds = 0;
    double iteration_busy_seconds = 0;
  };
  std::map<std::string, Observation> TakeObservations();

  // Called (on the transport thread, without locks held) when a push arrives for a plan this
  // node does not have yet, so that the owner can fetch plans at once.
  void SetPlanMissingCallback(std::function<void()> cb) {
    push_pull_.server().SetPlanMissingCallback(std::move(cb));
  }

  const DataPlaneNodeStats& stats() const { return stats_; }
  // Messages dropped as malformed anywhere in this node (parse, push/pull, engine).
  uint64_t malformed_messages() const;
  PushPull& push_pull() { return push_pull_; }
  CollectiveEngine& engine() { return engine_; }
  ParameterServer& parameter_server() { return ps_; }
  const PushPull& push_pull() const { return push_pull_; }
  const CollectiveEngine& engine() const { return engine_; }
  Transport* transport() const { return transport_; }

 private:
  struct JobEntry {
    Algorithm algorithm = Algorithm::kAuto;
    int num_workers = 0;
    uint32_t procs_per_node = 1;
    SelectorThresholds thresholds;
    // Whether all its collectives run among its workers (SetWorkerCongestionControl), and the
    // addresses this node sends to in it: the other workers, or, otherwise, every other node.
    bool among_workers = false;
    std::vector<std::string> peers;
  };
  struct Pending {
    std::string job_id;
    common::Clock::TimePoint started;
  };
  // One job's activity on this node (busy intervals, iterations), updated on every start and
  // completion under pending_mu_; no allocation on the per-operation path once the job has an
  // entry.
  struct Activity {
    Observation taken;  // since the last TakeObservations
    int in_flight = 0;
    common::Clock::TimePoint busy_since;  // valid while in_flight > 0
    double busy_closed = 0;               // busy seconds of closed intervals, since creation
    double busy_at_take = 0;              // BusyAt() at the last TakeObservations
    std::string first_tensor;             // the name that marks iterations
    bool iteration_open = false;
    uint64_t iteration_number = 0;  // of first_tensor's latest start
    common::Clock::TimePoint iteration_start;
    double busy_at_iteration_start = 0;
    // When the first of the job's operations failed since the last one that succeeded.
    std::optional<common::Clock::TimePoint> failing_since;
    double BusyAt(common::Clock::TimePoint now) const {
      return busy_closed +
             (in_flight > 0 ? std::chrono::duration<double>(now - busy_since).count() : 0);
    }
  };
  // An operation of the job starts / ends at `now`. pending_mu_ held.
  void ActivityStartLocked(const std::string& job_id, const Operation& op,
                           common::Clock::TimePoint now);
  void ActivityEndLocked(const std::string& job_id, common::Clock::TimePoint now, bool completed);

  void OnMessage(std::span<const std::byte> header, std::span<const std::byte> payload);
  CollectiveAlgorithm& For(Algorithm algorithm);
  absl::Status StartUninstrumented(const std::string& job_id, Operation op);
  // Brings the connections' congestion controls in line with jobs_ (SetWorkerCongestionControl);
  // `renamed`: worker_congestion_ changed, so the connections that keep it get it again. mu_ held.
  void UpdateCongestionControlsLocked(bool renamed = false);

  Transport* transport_;
  DataPlaneNodeStats stats_;
  PushPull push_pull_;
  CollectiveEngine engine_;
  ParameterServer ps_;
  mutable std::mutex mu_;
  std::map<std::string, JobEntry> jobs_;           // Guarded by mu_.
  CostModel cost_model_;                           // Guarded by mu_.
  std::optional<MeasuredThresholds> measured_;     // Guarded by mu_.
  std::string worker_congestion_;                  // Guarded by mu_.
  std::set<std::string> worker_congestion_peers_;  // Guarded by mu_: those set to it now.
  DataPlaneMetrics* metrics_ = nullptr;
  const common::Clock* metrics_clock_ = nullptr;
  std::mutex pending_mu_;  // guards the three below
  std::map<uint64_t, Pending> pending_;
  uint64_t next_pending_ = 0;
  std::map<std::string, Activity> activity_;
  // Operations waiting for their whole StagedInput, by (job, tensor, iteration).
  struct StagedWaiting {
    Algorithm algorithm;
    Operation op;
  };
  std::mutex staged_mu_;
  std::map<std::tuple<std::string, std::string, uint64_t>, StagedWaiting>
      staged_waiting_;  // Guarded by staged_mu_.
};

}  // namespace tributary::dataplane

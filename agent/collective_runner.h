// What the agent needs from its node's data plane: jobs set and removed as plans change,
// node-level operations started and aborted, a periodic sweep, and the traffic and per-job
// observations its heartbeats report. The local gather and `Agent` talk to this interface
// only; `DataPlaneRunner` (data_plane_runner.h) is the production implementation,
// `FakeCollectiveRunner` (fake_collective_runner.h) the one tests use.
//
// The data-plane types (`JobView`, `Algorithm`, `Operation`) appear here, in the
// implementations, in local_gather.{h,cc}, in plan_view.{h,cc} and in Agent::ApplyPlans, nowhere
// else in agent/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "dataplane/collectives/algorithm_selector.h"
#include "dataplane/collectives/job_view.h"
#include "dataplane/collectives/operation.h"

namespace tributary::agent {

// What this node did for one job over an interval (tributary.v1.JobObservation's fields).
struct JobObservation {
  // Bytes and summed seconds of the operations completed OK.
  uint64_t bytes = 0;
  double seconds = 0;
  // Data-plane bytes of the job's messages sent and received (any role).
  uint64_t wire_bytes_sent = 0;
  uint64_t wire_bytes_received = 0;
  // Operations completed, and the seconds with at least one in flight.
  uint64_t collectives = 0;
  double busy_seconds = 0;
  // Iterations ended (successive starts of the job's first tensor name), their summed and
  // longest lengths and the busy seconds inside them.
  uint64_t iterations = 0;
  double iteration_seconds = 0;
  double iteration_max_seconds = 0;
  double iteration_busy_seconds = 0;
};

// Implementations are thread-safe: the controller-client thread sets jobs, gRPC threads start
// and abort operations, the tick thread sweeps.
class CollectiveRunner {
 public:
  virtual ~CollectiveRunner() = default;

  // Adds or replaces the job's view (its plan seen from this node), run with `algorithm`
  // (kAuto: by size).
  virtual void SetJob(const dataplane::JobView& view, dataplane::Algorithm algorithm) = 0;
  // Forgets the job; its running operations fail.
  virtual void RemoveJob(const std::string& job_id) = 0;

  // Starts a node-level operation of job `job_id`. On error `op.done` is never called; on OK
  // it is called exactly once, on a data-plane thread, with the operation's result.
  virtual absl::Status Start(const std::string& job_id, dataplane::Operation op) = 0;
  // The StagedInput (op.staged) of (tensor, iteration) advanced (DataPlaneNode::
  // StagedInputAdvanced).
  virtual void StagedInputAdvanced(const std::string& job_id, const std::string& tensor,
                                   uint64_t iteration) = 0;
  // This node cannot take part in (tensor, iteration): fail it for the other nodes now.
  virtual void Abort(const std::string& job_id, const std::string& tensor, uint64_t iteration,
                     const absl::Status& reason) = 0;

  // Fails operations past their deadline and refreshes the pending-operation gauges (the
  // agent's tick calls it).
  virtual void Tick() = 0;
  // Observations since the previous call, per job (for the heartbeat's NodeLoad.jobs).
  virtual std::map<std::string, JobObservation> TakeObservations() = 0;
  // Data-plane bytes sent and received since start.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;
  // `callback` runs (on a data-plane thread) when a peer names a job this node has no plan
  // for yet: the agent then fetches plans at once.
  virtual void SetPlanMissingCallback(std::function<void()> callback) = 0;
  // Stops the transport (before the agent's other parts go away).
  virtual void Shutdown() = 0;
};

}  // namespace tributary::agent

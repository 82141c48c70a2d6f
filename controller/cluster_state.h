// The controller's state: registered nodes with liveness (soft state, rebuilt from
// registrations), jobs and their plans (durable when a StateStore is given).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "controller/state_store.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::controller {

// Node registry, job lifecycle and plan versions. Every method is thread-safe and cheap, so gRPC
// handlers call it directly: the only I/O is one StateStore transaction per job change (create,
// delete, re-plan), written under the mutex before the change is visible or answered. A node is
// dead once it has missed heartbeats for `heartbeat_timeout`; CheckLiveness (called periodically,
// or by tests after moving a FakeClock) applies that. Any change to a job's plan bumps the job's
// plan version (its epoch: it never repeats, across restarts and across a delete and a create of
// the same id) and the global assignments version that agents poll through heartbeats.
//
// Restore: jobs read back from the store keep their stored plan, and their version, until every
// node of the plan has registered again (or `restore_grace` has passed; the missing nodes then
// count as dead); meanwhile the job is DEGRADED and its message names the nodes it waits for.
// Registrations within the grace are rejoins, not membership changes: they re-plan nothing
// (a node back at a new data-plane address re-plans its jobs once all their nodes are back).
class ClusterState {
 public:
  struct Options {
    std::chrono::milliseconds heartbeat_interval{500};
    std::chrono::milliseconds heartbeat_timeout{3000};
    // How long restored jobs wait for their nodes to register before re-planning without them.
    std::chrono::milliseconds restore_grace{10000};
  };

  // `registry` receives the controller's event metrics (dashboards/METRICS.md); null: one of its
  // own. `store` makes jobs durable; null: they live in memory only. Both must outlive this
  // object.
  ClusterState(const common::Clock* clock, Options options, uint64_t incarnation_seed,
               prometheus::Registry* registry = nullptr, StateStore* store = nullptr);

  // Reads the store's jobs back (call once, before serving): returns how many. Without a store:
  // 0. Errors (a corrupt row, a locked file) name the file; the controller must not start.
  absl::StatusOr<size_t> Restore();

  absl::Status RegisterNode(const tributary::v1::RegisterNodeRequest& req,
                            tributary::v1::RegisterNodeResponse* resp);
  absl::Status Heartbeat(const tributary::v1::HeartbeatRequest& req,
                         tributary::v1::HeartbeatResponse* resp);
  absl::Status GetAssignments(const tributary::v1::GetAssignmentsRequest& req,
                              tributary::v1::GetAssignmentsResponse* resp);
  void ListNodes(tributary::v1::ListNodesResponse* resp);

  absl::Status CreateJob(const tributary::v1::CreateJobRequest& req, tributary::v1::Job* job);
  absl::Status GetJob(const std::string& job_id, tributary::v1::Job* job);
  void ListJobs(tributary::v1::ListJobsResponse* resp);
  absl::Status DeleteJob(const std::string& job_id);

  // Marks nodes without a recent heartbeat dead and re-plans affected jobs.
  void CheckLiveness();

  uint64_t assignments_version() const;

  // Scrape-time metrics of the state: nodes and jobs by state, predicted seconds per byte.
  std::vector<prometheus::MetricFamily> CollectMetrics() const;
  // A collector calling CollectMetrics (this object must outlive its scrapes).
  std::shared_ptr<prometheus::Collectable> collector() const;

 private:
  struct NodeEntry {
    tributary::v1::NodeInventory inventory;
    tributary::v1::NodeLoad load;
    uint64_t incarnation = 0;
    common::Clock::TimePoint last_heartbeat;
    bool alive = false;
  };
  struct JobEntry {
    tributary::v1::Job job;
    // Restored jobs: nodes of the stored plan that have not registered since the restore. The
    // plan is not recomputed while this is non-empty.
    std::set<std::string> awaiting;
    // A node came back at another data-plane address than the restored plan has: re-plan once
    // `awaiting` is empty.
    bool stale = false;
  };

  // Recomputes every job's plan, bumps versions of those that changed and stores them, with the
  // removal of `deleted` (already gone from jobs_), in one transaction. When that write fails the
  // previous plans stay (a plan is never handed out before it is durable) and CheckLiveness tries
  // again. mu_ held.
  absl::Status ReplanAllLocked(const std::vector<std::string>& deleted = {});
  // One store transaction (no-op without a store); counts and logs failures. mu_ held.
  absl::Status PersistLocked(const std::vector<const tributary::v1::Job*>& put,
                             const std::vector<std::string>& deleted, uint64_t max_plan_version);
  // Times and counts ComputePlanLocked.
  absl::StatusOr<tributary::v1::JobPlan> PlanLocked(const std::string& job_id,
                                                    const tributary::v1::JobSpec& spec,
                                                    uint64_t version) const;
  absl::StatusOr<tributary::v1::JobPlan> ComputePlanLocked(const std::string& job_id,
                                                           const tributary::v1::JobSpec& spec,
                                                           uint64_t version) const;
  void RecordObservationsLocked(const tributary::v1::NodeLoad& load);
  void UpdateJobStateLocked(tributary::v1::Job& job,
                            const std::set<std::string>& awaiting = {}) const;

  const common::Clock* clock_;
  const Options options_;
  std::unique_ptr<prometheus::Registry> own_registry_;
  prometheus::Counter* plans_ok_;
  prometheus::Counter* plans_error_;
  prometheus::Histogram* plan_duration_;
  prometheus::Family<prometheus::Counter>* observed_bytes_;
  prometheus::Family<prometheus::Counter>* observed_seconds_;
  prometheus::Family<prometheus::Gauge>* observed_per_byte_;
  prometheus::Counter* restores_;
  prometheus::Gauge* restored_jobs_;
  prometheus::Counter* writes_ok_;
  prometheus::Counter* writes_error_;
  StateStore* const store_;
  mutable std::mutex mu_;
  uint64_t next_incarnation_;
  uint64_t assignments_version_ = 1;
  uint64_t max_plan_version_ = 0;  // highest plan version handed out, restored ones included
  common::Clock::TimePoint restored_at_;
  // Jobs were restored and the grace has not passed yet: registrations are rejoins.
  bool restoring_ = false;
  bool replan_pending_ = false;  // a re-plan could not be stored; CheckLiveness retries
  std::map<std::string, NodeEntry> nodes_;
  std::map<std::string, JobEntry> jobs_;
};

}  // namespace tributary::controller

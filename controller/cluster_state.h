// The controller's soft state: registered nodes with liveness, jobs and their plans.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "tributary/v1/controller.pb.h"

namespace tributary::controller {

// Node registry, job lifecycle and plan versions. Every method is thread-safe and cheap (no I/O),
// so gRPC handlers call it directly. A node is dead once it has missed heartbeats for
// `heartbeat_timeout`; CheckLiveness (called periodically, or by tests after moving a FakeClock)
// applies that. Any change to a job's plan bumps the job's plan version and the global
// assignments version that agents poll through heartbeats.
class ClusterState {
 public:
  struct Options {
    std::chrono::milliseconds heartbeat_interval{500};
    std::chrono::milliseconds heartbeat_timeout{3000};
  };

  // `registry` receives the controller's event metrics (dashboards/METRICS.md); null: one of its
  // own. It must outlive this object.
  ClusterState(const common::Clock* clock, Options options, uint64_t incarnation_seed,
               prometheus::Registry* registry = nullptr);

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
  };

  // Recomputes every job's plan; bumps versions of those that changed. mu_ held.
  void ReplanAllLocked();
  // Times and counts ComputePlanLocked.
  absl::StatusOr<tributary::v1::JobPlan> PlanLocked(const std::string& job_id,
                                                    const tributary::v1::JobSpec& spec,
                                                    uint64_t version) const;
  absl::StatusOr<tributary::v1::JobPlan> ComputePlanLocked(const std::string& job_id,
                                                           const tributary::v1::JobSpec& spec,
                                                           uint64_t version) const;
  void RecordObservationsLocked(const tributary::v1::NodeLoad& load);
  void UpdateJobStateLocked(tributary::v1::Job& job) const;

  const common::Clock* clock_;
  const Options options_;
  std::unique_ptr<prometheus::Registry> own_registry_;
  prometheus::Counter* plans_ok_;
  prometheus::Counter* plans_error_;
  prometheus::Histogram* plan_duration_;
  prometheus::Family<prometheus::Counter>* observed_bytes_;
  prometheus::Family<prometheus::Counter>* observed_seconds_;
  prometheus::Family<prometheus::Gauge>* observed_per_byte_;
  mutable std::mutex mu_;
  uint64_t next_incarnation_;
  uint64_t assignments_version_ = 1;
  std::map<std::string, NodeEntry> nodes_;
  std::map<std::string, JobEntry> jobs_;
};

}  // namespace tributary::controller

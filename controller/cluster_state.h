// The controller's soft state: registered nodes with liveness, jobs and their plans.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
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

  ClusterState(const common::Clock* clock, Options options, uint64_t incarnation_seed);

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
  absl::StatusOr<tributary::v1::JobPlan> PlanLocked(const std::string& job_id,
                                                    const tributary::v1::JobSpec& spec,
                                                    uint64_t version) const;
  void UpdateJobStateLocked(tributary::v1::Job& job) const;

  const common::Clock* clock_;
  const Options options_;
  mutable std::mutex mu_;
  uint64_t next_incarnation_;
  uint64_t assignments_version_ = 1;
  std::map<std::string, NodeEntry> nodes_;
  std::map<std::string, JobEntry> jobs_;
};

}  // namespace tributary::controller

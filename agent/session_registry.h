// The jobs this node works for and the sessions of its local training processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/op_handle.h"
#include "agent/shm_mapping.h"
#include "tributary/v1/topology.pb.h"

namespace tributary::agent {

// What the local service needs to know of a job this node works for.
struct LocalJob {
  std::string job_id;
  uint64_t plan_version = 0;
  uint32_t node_rank = 0;
  uint32_t num_nodes = 0;
  uint32_t procs_per_node = 1;
  std::chrono::milliseconds op_timeout{30000};
  // Worker nodes the plan marks down ("node-3 (rank 2)"): the job's collectives fail at once.
  std::vector<std::string> down_workers;
  // The plan's membership generation (JobPlan.generation): sessions bound to an older one must
  // Resync before their next collective.
  uint64_t generation = 0;
  // This node's intra-node plan for the job (JobPlan.intra_node), when the controller made one:
  // how the local processes' GPU tensors are summed (agent/gpu_aggregation.h).
  std::shared_ptr<const tributary::v1::IntraNodePlan> intra_node;

  // Rank among all processes of the job of local rank `local_rank` here, and their number.
  uint32_t GlobalRank(uint32_t local_rank) const { return node_rank * procs_per_node + local_rank; }
  uint32_t WorldSize() const { return num_nodes * procs_per_node; }
};

// One local process in one job: from JoinJob until LeaveJob, the end of its KeepAlive stream
// or the agent's shutdown.
struct Session {
  std::string id;
  std::string job_id;
  uint32_t local_rank = 0;
  uint32_t local_size = 0;
  std::map<uint64_t, std::shared_ptr<SharedMemoryMapping>> buffers;  // by buffer id
  // The uid whose process registered the session's first buffer: the only one that may add more.
  std::optional<uid_t> owner_uid;
  uint64_t next_buffer = 1;
  // The job's membership generation the session's iterations count in (LocalService::Resync).
  uint64_t generation = 0;
  // The plan version of the session's last Resync: retriable failures of operations that ran
  // under an older plan belong to the iterations before it and are not retried.
  uint64_t synced_plan_version = 0;
  // Per tensor name: the next iteration (hashed: a std::map compared the names' long common
  // prefixes, "encoder.layer.N.", at every submission).
  std::unordered_map<std::string, uint64_t> iterations;
  // Per tensor name: iterations that failed as retriable, with the epoch (plan version) they
  // failed under. The next submission of the name runs the lowest of them again instead of
  // taking a new iteration, so that every process of the job agrees on what a retry is.
  std::map<std::string, std::map<uint64_t, uint64_t>> failed;
  std::map<uint64_t, std::shared_ptr<OpHandle>> handles;  // by handle id, until reported
  uint64_t next_handle = 1;
  std::vector<std::function<void()>> on_end;  // run once when the session ends
};

// Not thread-safe: LocalService serializes every call under its mutex.
class SessionRegistry {
 public:
  // Replaces the set of jobs this node works for.
  void SetJobs(const std::vector<LocalJob>& jobs);
  // Null when the node has no plan for `job_id`.
  const LocalJob* FindJob(const std::string& job_id) const;

  // A new session for local rank `local_rank` of `local_size` in `job_id`. FAILED_PRECONDITION
  // when the node has no plan for the job, INVALID_ARGUMENT when local_size is not the job's
  // procs_per_node or local_rank is not below it, ALREADY_EXISTS when another session holds
  // the rank.
  absl::StatusOr<std::shared_ptr<Session>> Join(const std::string& job_id, uint32_t local_rank,
                                                uint32_t local_size);
  // The session holding local rank `local_rank` of `job_id`, or null.
  std::shared_ptr<Session> Holder(const std::string& job_id, uint32_t local_rank) const;
  // NOT_FOUND (telling the process to join first) when there is no such session.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& session_id) const;
  // Forgets the session and returns it; null when there is none.
  std::shared_ptr<Session> Remove(const std::string& session_id);

  const std::map<std::string, std::shared_ptr<Session>>& sessions() const { return sessions_; }
  size_t size() const { return sessions_.size(); }

 private:
  std::map<std::string, LocalJob> jobs_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
};

}  // namespace tributary::agent

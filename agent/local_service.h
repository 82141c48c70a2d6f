// The agent's local service: training processes on this node join jobs, register shared-memory
// buffers and submit collectives. The local processes' submissions of one (tensor, iteration) are
// gathered and handed to the data plane as one node-level operation.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "dataplane/collectives/data_plane_node.h"
#include "tributary/v1/agent.grpc.pb.h"

namespace tributary::agent {

// What the local service needs to know of a job this node works for.
struct LocalJob {
  std::string job_id;
  uint64_t plan_version = 0;
  uint32_t node_rank = 0;
  uint32_t num_nodes = 0;
  uint32_t procs_per_node = 1;
  std::chrono::milliseconds op_timeout{30000};
};

// Threading: handlers run on gRPC threads and never block (waits are parked reactors, finished
// later by the data plane's completion or by Tick). One mutex guards sessions and gathers; the
// data plane is called outside it.
class LocalService final : public tributary::v1::Agent::CallbackService {
 public:
  LocalService(dataplane::DataPlaneNode* collectives, const common::Clock* clock);
  ~LocalService() override;

  // Replaces the set of jobs this node works for.
  void SetJobs(const std::vector<LocalJob>& jobs);
  // Fails local gathers older than their job's timeout and ends Wait calls whose timeout passed.
  void Tick();
  // Ends every session and parked call (before the gRPC server shuts down).
  void Shutdown();

  size_t num_sessions() const;

  grpc::ServerUnaryReactor* JoinJob(grpc::CallbackServerContext* ctx,
                                    const tributary::v1::JoinJobRequest* req,
                                    tributary::v1::JoinJobResponse* resp) override;
  grpc::ServerWriteReactor<tributary::v1::KeepAliveEvent>* KeepAlive(
      grpc::CallbackServerContext* ctx, const tributary::v1::KeepAliveRequest* req) override;
  grpc::ServerUnaryReactor* LeaveJob(grpc::CallbackServerContext* ctx,
                                     const tributary::v1::LeaveJobRequest* req,
                                     tributary::v1::LeaveJobResponse* resp) override;
  grpc::ServerUnaryReactor* RegisterBuffer(grpc::CallbackServerContext* ctx,
                                           const tributary::v1::RegisterBufferRequest* req,
                                           tributary::v1::RegisterBufferResponse* resp) override;
  grpc::ServerUnaryReactor* UnregisterBuffer(
      grpc::CallbackServerContext* ctx, const tributary::v1::UnregisterBufferRequest* req,
      tributary::v1::UnregisterBufferResponse* resp) override;
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx,
                                   const tributary::v1::SubmitRequest* req,
                                   tributary::v1::SubmitResponse* resp) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx,
                                 const tributary::v1::WaitRequest* req,
                                 tributary::v1::WaitResponse* resp) override;

 private:
  class KeepAliveReactor;
  struct Mapping;
  struct OpHandle;
  struct Session;
  struct Submission;
  struct Gather;
  struct GatherKey {
    std::string job_id;
    std::string tensor;
    uint64_t iteration;
    friend auto operator<=>(const GatherKey&, const GatherKey&) = default;
  };

  absl::Status DoJoin(const tributary::v1::JoinJobRequest& req,
                      tributary::v1::JoinJobResponse* resp);
  absl::Status DoRegisterBuffer(const tributary::v1::RegisterBufferRequest& req,
                                tributary::v1::RegisterBufferResponse* resp);
  absl::Status DoSubmit(const tributary::v1::SubmitRequest& req,
                        tributary::v1::SubmitResponse* resp);
  // Ends a session; gathers still missing its rank fail with ABORTED. mu_ held.
  void EndSessionLocked(const std::string& session_id, const std::string& why,
                        std::vector<std::function<void()>>& after);
  // Fails every submission of a gather and tells the other nodes. mu_ held.
  void FailGatherLocked(const GatherKey& key, Gather& gather, const absl::Status& status,
                        std::vector<std::function<void()>>& after);
  absl::StatusOr<std::shared_ptr<Session>> FindSessionLocked(const std::string& id);
  // Answers a call about `handle_id` now if the operation is done (or timeout_ms is 0), else
  // parks it until the operation completes or timeout_ms passes; `set_done` fills the reply.
  grpc::ServerUnaryReactor* Park(grpc::CallbackServerContext* ctx, const std::string& session_id,
                                 uint64_t handle_id, uint32_t timeout_ms,
                                 std::function<void(bool)> set_done);

  dataplane::DataPlaneNode* collectives_;
  const common::Clock* clock_;
  mutable std::mutex mu_;
  std::map<std::string, LocalJob> jobs_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  std::map<GatherKey, std::unique_ptr<Gather>> gathers_;
  // Local ranks whose session ended, per job, with why: a gather missing one of them can never
  // complete. A new session for the rank clears it.
  std::map<std::string, std::map<uint32_t, std::string>> departed_;
  std::vector<KeepAliveReactor*> keepalives_;
  bool shut_down_ = false;
};

}  // namespace tributary::agent

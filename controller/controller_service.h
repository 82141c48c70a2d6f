// The tributary.v1.Controller gRPC service: a thin callback-API layer over ClusterState.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "controller/authz.h"
#include "controller/cluster_state.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::controller {

class WatchHub;
class WatchReactor;

// Handlers answer inline on the gRPC thread: ClusterState never blocks on I/O and never plans
// under its mutex. WatchAssignments is a raw (ByteBuffer) stream: ClusterState serializes each
// plan once and every node's message shares those bytes.
class ControllerService final
    : public tributary::v1::Controller::WithRawCallbackMethod_WatchAssignments<
          tributary::v1::Controller::CallbackService> {
 public:
  // `registry` receives tributary_controller_rpcs_total and _rpc_duration_seconds; null: one of
  // its own. `authz` decides who may call what (null: everyone, as without TLS). Both must
  // outlive this object.
  explicit ControllerService(ClusterState* state, prometheus::Registry* registry = nullptr,
                             const Authorizer* authz = nullptr);
  // Runs the queued CreateJob calls, then ends the planning thread.
  ~ControllerService() override;

  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx,
                                         const tributary::v1::RegisterNodeRequest* req,
                                         tributary::v1::RegisterNodeResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const tributary::v1::HeartbeatRequest* req,
                                      tributary::v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* GetAssignments(grpc::CallbackServerContext* ctx,
                                           const tributary::v1::GetAssignmentsRequest* req,
                                           tributary::v1::GetAssignmentsResponse* resp) override;
  // One stream per agent (a serialized WatchAssignmentsRequest in, WatchAssignmentsResponse
  // messages out); at most kMaxQueued messages wait per stream, beyond that only the newest (each
  // carries the full set).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchAssignments(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx,
                                      const tributary::v1::ListNodesRequest* req,
                                      tributary::v1::ListNodesResponse* resp) override;
  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* ctx,
                                      const tributary::v1::CreateJobRequest* req,
                                      tributary::v1::Job* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx,
                                   const tributary::v1::GetJobRequest* req,
                                   tributary::v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const tributary::v1::ListJobsRequest* req,
                                     tributary::v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const tributary::v1::DeleteJobRequest* req,
                                      tributary::v1::DeleteJobResponse* resp) override;
  // Authorised like GetJob (any verified certificate).
  grpc::ServerUnaryReactor* GetJobStats(grpc::CallbackServerContext* ctx,
                                        const tributary::v1::GetJobStatsRequest* req,
                                        tributary::v1::JobStats* resp) override;

 private:
  enum Method {
    kRegisterNode,
    kHeartbeat,
    kGetAssignments,
    kListNodes,
    kCreateJob,
    kGetJob,
    kListJobs,
    kDeleteJob,
    kWatchAssignments,
    kGetJobStats,
    kNumMethods
  };
  grpc::ServerUnaryReactor* Finish(Method method, std::chrono::steady_clock::time_point start,
                                   grpc::CallbackServerContext* ctx, const absl::Status& s);
  void Record(Method method, std::chrono::steady_clock::time_point start, const absl::Status& s);
  // CreateJob plans (hundreds of ms for a 1,024-worker job): on this thread, in order, never on
  // a gRPC thread that heartbeats need.
  void PlanningLoop();

  std::mutex planning_mu_;
  std::condition_variable planning_cv_;
  std::deque<std::function<void()>> planning_queue_;  // guarded by planning_mu_
  bool planning_stop_ = false;                        // guarded by planning_mu_
  std::thread planning_thread_;
  std::unique_ptr<WatchHub> hub_;  // starts the watch streams' writes

  ClusterState* state_;
  const Authorizer* authz_;
  std::unique_ptr<prometheus::Registry> own_registry_;
  prometheus::Family<prometheus::Counter>* rpcs_;
  prometheus::Histogram* duration_[kNumMethods];
};

}  // namespace tributary::controller

// The tributary.v1.Controller gRPC service: a thin callback-API layer over ClusterState.
#pragma once

#include <chrono>
#include <memory>

#include "controller/cluster_state.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::controller {

// Handlers answer inline on the gRPC thread: ClusterState never blocks on I/O and never plans
// under its mutex. WatchAssignments is a raw (ByteBuffer) stream: ClusterState serializes each
// plan once and every node's message shares those bytes.
class ControllerService final
    : public tributary::v1::Controller::WithRawCallbackMethod_WatchAssignments<
          tributary::v1::Controller::CallbackService> {
 public:
  // `registry` receives tributary_controller_rpcs_total and _rpc_duration_seconds; null: one of
  // its own. It must outlive this object.
  explicit ControllerService(ClusterState* state, prometheus::Registry* registry = nullptr);

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
    kNumMethods
  };
  grpc::ServerUnaryReactor* Finish(Method method, std::chrono::steady_clock::time_point start,
                                   grpc::CallbackServerContext* ctx, const absl::Status& s);

  ClusterState* state_;
  std::unique_ptr<prometheus::Registry> own_registry_;
  prometheus::Family<prometheus::Counter>* rpcs_;
  prometheus::Histogram* duration_[kNumMethods];
};

}  // namespace tributary::controller

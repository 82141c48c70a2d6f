// The tributary.v1.Controller gRPC service: a thin callback-API layer over ClusterState.
#pragma once

#include "controller/cluster_state.h"
#include "tributary/v1/controller.grpc.pb.h"

namespace tributary::controller {

// Handlers answer inline on the gRPC thread: ClusterState never blocks on I/O.
class ControllerService final : public tributary::v1::Controller::CallbackService {
 public:
  explicit ControllerService(ClusterState* state) : state_(state) {}

  grpc::ServerUnaryReactor* RegisterNode(grpc::CallbackServerContext* ctx,
                                         const tributary::v1::RegisterNodeRequest* req,
                                         tributary::v1::RegisterNodeResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const tributary::v1::HeartbeatRequest* req,
                                      tributary::v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* GetAssignments(grpc::CallbackServerContext* ctx,
                                           const tributary::v1::GetAssignmentsRequest* req,
                                           tributary::v1::GetAssignmentsResponse* resp) override;
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
  ClusterState* state_;
};

}  // namespace tributary::controller
